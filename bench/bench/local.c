/* SPDX-License-Identifier: MIT */
/*
 * local.c - the local scenario: pull and push of keys this node owns.
 *
 * For each value size and key count, T reader threads (each with its own
 * worker) pull or push random keys for a fixed time, with or without one
 * more thread pushing random keys meanwhile (the concurrent writer). Each
 * thread times batches of FB_LOCAL_BATCH operations; p50 / p99 are over the
 * batches' mean time per operation, ops/s over all threads.
 *
 * Baselines, run right after each cell with the same threads, keys and
 * bytes:
 *   randcopy  memcpy of the value out of a random entry of an array as large
 *             as the table's arena: one entry per key, with the slot's stride
 *             and the value at the slot's offset, so both touch the same
 *             cache lines and pages and differ only in what Ferry adds
 *   rand-add  the same entry updated in place (push is an add)
 *   memcpy    (the "pull-hot" row) memcpy of the same bytes from one buffer,
 *             against a pull of one key again and again: the fixed cost
 * The writer of a baseline cell copies into random entries of the array.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fb.h"

#define FB_LOCAL_BATCH 256
#define FB_LOCAL_MAX_SAMPLES (1 << 16)

enum local_op {
	LOCAL_PULL,
	LOCAL_PUSH,
	LOCAL_PULL_HOT,
};

struct local_run {
	struct fb_node *n;
	struct ferry_table *t;
	uint64_t key0, nkeys; /* rank 0's keys: key0 .. key0+nkeys-1 */
	uint32_t bytes;
	uint8_t *arr; /* the baseline array */
	size_t astride;
	enum local_op op;
	int ferry; /* 1: Ferry, 0: the baseline */
	int64_t deadline;
	atomic_int stop;
	atomic_int failed;
	pthread_barrier_t start;
};

struct local_thread {
	struct local_run *r;
	pthread_t th;
	int writer;
	uint64_t seed;
	long ops;
	int64_t t_begin, t_end;
	double *samples; /* ns per operation, per batch */
	size_t nsamples;
};

static void local_record(struct local_thread *lt, int64_t dt)
{
	if (lt->nsamples < FB_LOCAL_MAX_SAMPLES)
		lt->samples[lt->nsamples++] = (double)dt / FB_LOCAL_BATCH;
}

static void *local_thread_main(void *arg)
{
	struct local_thread *lt = arg;
	struct local_run *r = lt->r;
	uint32_t len = r->bytes / 4;
	float *buf = calloc(len, sizeof(float));
	struct ferry_worker *w = NULL;
	enum local_op op = lt->writer ? LOCAL_PUSH : r->op;
	uint64_t sink = 0;
	int rc = 0;

	if (!buf) {
		atomic_store(&r->failed, -ENOMEM);
		pthread_barrier_wait(&r->start);
		return NULL;
	}
	for (uint32_t i = 0; i < len; i++)
		buf[i] = 1e-7f;
	if (r->ferry) {
		rc = ferry_worker_create(r->n->fy, &w);
		if (rc)
			atomic_store(&r->failed, rc);
	}
	pthread_barrier_wait(&r->start);
	lt->t_begin = fb_now_ns();
	while (!rc && !atomic_load_explicit(&r->stop, memory_order_relaxed)) {
		int64_t t0 = fb_now_ns(), t1;

		for (int i = 0; i < FB_LOCAL_BATCH; i++) {
			uint64_t k = op == LOCAL_PULL_HOT ? 0 : fb_rand(&lt->seed) % r->nkeys;

			if (r->ferry) {
				uint64_t key = r->key0 + k;

				if (op == LOCAL_PUSH)
					rc = ferry_push(w, r->t, &key, 1, buf);
				else
					rc = ferry_pull(w, r->t, &key, 1, buf);
				if (rc)
					break;
			} else {
				float *e = (float *)(r->arr + k * r->astride + 32);

				if (lt->writer)
					memcpy(e, buf, r->bytes);
				else if (op == LOCAL_PUSH)
					for (uint32_t j = 0; j < len; j++)
						e[j] += buf[j];
				else
					memcpy(buf, e, r->bytes);
				__asm__ volatile("" ::"r"(buf), "r"(e) : "memory");
			}
			sink += (uint64_t)buf[0];
		}
		t1 = fb_now_ns();
		if (rc)
			break;
		lt->ops += FB_LOCAL_BATCH;
		if (!lt->writer)
			local_record(lt, t1 - t0);
		if (t1 >= r->deadline && !lt->writer)
			atomic_store(&r->stop, 1);
	}
	lt->t_end = fb_now_ns();
	if (rc) {
		atomic_store(&r->failed, rc);
		atomic_store(&r->stop, 1);
	}
	if (w)
		ferry_worker_destroy(w);
	if (sink == 42)
		fprintf(stderr, " ");
	free(buf);
	return NULL;
}

/* one cell: T readers (+ a writer), Ferry or the baseline */
static int local_cell(struct local_run *r, int threads, int writer, double cell_s, double *ops_p,
		      double *samples, size_t *nsamples_p)
{
	int nth = threads + (writer ? 1 : 0);
	struct local_thread *lt = calloc((size_t)nth, sizeof(*lt));
	double secs = 0;
	long ops = 0;
	size_t ns = 0;
	int rc = 0;

	if (!lt)
		return -ENOMEM;
	atomic_store(&r->stop, 0);
	atomic_store(&r->failed, 0);
	pthread_barrier_init(&r->start, NULL, (unsigned)nth + 1);
	for (int i = 0; i < nth; i++) {
		lt[i].r = r;
		lt[i].writer = i == threads;
		lt[i].seed = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) + (uint64_t)r->bytes;
		lt[i].samples = samples + (size_t)i * FB_LOCAL_MAX_SAMPLES;
		if (pthread_create(&lt[i].th, NULL, local_thread_main, &lt[i])) {
			/* the barrier counts every thread: give up on the whole cell */
			fprintf(stderr, "ferry-bench: cannot start a thread\n");
			abort();
		}
	}
	r->deadline = fb_now_ns() + (int64_t)(cell_s * 1e9);
	pthread_barrier_wait(&r->start);
	r->deadline = fb_now_ns() + (int64_t)(cell_s * 1e9);
	for (int i = 0; i < nth; i++)
		pthread_join(lt[i].th, NULL);
	pthread_barrier_destroy(&r->start);
	rc = atomic_load(&r->failed);
	for (int i = 0; i < threads; i++) {
		double s = (double)(lt[i].t_end - lt[i].t_begin) / 1e9;

		ops += lt[i].ops;
		if (s > secs)
			secs = s;
		/* compact the samples to the front */
		memmove(samples + ns, lt[i].samples, lt[i].nsamples * sizeof(double));
		ns += lt[i].nsamples;
	}
	*ops_p = secs > 0 ? (double)ops / secs : 0;
	*nsamples_p = ns;
	free(lt);
	return rc;
}

static const char *local_op_name(enum local_op op)
{
	return op == LOCAL_PUSH ? "push" : op == LOCAL_PULL ? "pull" : "pull-hot";
}

static int local_measure(struct local_run *r, enum local_op op, int threads, int writer,
			 double *samples)
{
	const struct fb_opts *o = r->n->o;
	struct fb_result res = { 0 };
	double f_ops = 0, b_ops = 0;
	size_t fn = 0, bn = 0;
	int rc;

	r->op = op;
	r->ferry = 1;
	rc = local_cell(r, threads, writer, o->cell_s, &f_ops, samples, &fn);
	if (rc) {
		fb_fail(r->n, "local: Ferry operation", rc);
		return -1;
	}
	fb_sort_d(samples, fn);
	fb_result_lat_d(&res, samples, fn);
	r->ferry = 0;
	rc = local_cell(r, threads, writer, o->cell_s, &b_ops, samples, &bn);
	if (rc) {
		fb_fail(r->n, "local: baseline", rc);
		return -1;
	}
	fb_sort_d(samples, bn);
	snprintf(res.scenario, sizeof(res.scenario), "local");
	snprintf(res.op, sizeof(res.op), "%s", local_op_name(op));
	snprintf(res.baseline, sizeof(res.baseline), "%s",
		 op == LOCAL_PULL_HOT ? "memcpy" :
		 op == LOCAL_PUSH     ? "rand-add" :
					"randcopy");
	res.value_bytes = r->bytes;
	res.threads = (uint32_t)threads;
	res.writer = writer;
	res.keys = r->nkeys;
	res.ops_per_s = f_ops;
	res.mb_per_s = f_ops * r->bytes / 1e6;
	{
		struct fb_result b = { 0 };

		fb_result_lat_d(&b, samples, bn);
		res.base_p50_us = b.p50_us;
		res.base_p99_us = b.p99_us;
		res.base_min_us = b.min_us;
		res.base_mean_us = b.mean_us;
		res.base_stdev_us = b.stdev_us;
	}
	res.base_ops_per_s = b_ops;
	fb_result_add(r->n->sh, &res);
	return 0;
}

static size_t local_stride(uint32_t bytes)
{
	/* the slot layout of lib/store.h: 32-byte header, value, 8-byte version */
	return (32 + (size_t)bytes + 8 + 63) & ~(size_t)63;
}

/* rank 0's keys of a range-placed table are one block */
static int local_find_keys(struct local_run *r, uint64_t total)
{
	uint64_t first = UINT64_MAX, count = 0;

	for (uint64_t k = 0; k < total; k++)
		if (ferry_table_home(r->t, k) == r->n->rank) {
			if (first == UINT64_MAX)
				first = k;
			count++;
		}
	if (!count || ferry_table_home(r->t, first + count - 1) != r->n->rank) {
		fb_failf(r->n->sh, "local: rank 0's keys are not one block (range placement)");
		return -1;
	}
	r->key0 = first;
	r->nkeys = count;
	return 0;
}

/*
 * Set every key once: a value never written is the kernel's zero page, which
 * reads from cache whatever the key; the baseline array is written by memset.
 */
static int local_touch(struct local_run *r)
{
	size_t batch = (1u << 20) / r->bytes;
	uint64_t *keys;
	float *vals;
	int rc = 0;

	if (!batch)
		batch = 1;
	keys = malloc(batch * sizeof(*keys));
	vals = malloc(batch * r->bytes);
	if (!keys || !vals) {
		free(keys);
		free(vals);
		return -ENOMEM;
	}
	for (size_t i = 0; i < batch * (r->bytes / 4); i++)
		vals[i] = 1.0f;
	for (uint64_t k = 0; k < r->nkeys && !rc; k += batch) {
		size_t m = r->nkeys - k < batch ? (size_t)(r->nkeys - k) : batch;

		for (size_t i = 0; i < m; i++)
			keys[i] = r->key0 + k + i;
		rc = ferry_set(r->n->w, r->t, keys, m, vals);
	}
	free(keys);
	free(vals);
	return rc;
}

static int local_one(struct fb_node *n, uint32_t bytes, uint64_t keys, double *samples)
{
	const struct fb_opts *o = n->o;
	struct local_run r = { .n = n, .bytes = bytes };
	uint64_t total = keys * (uint64_t)n->world;
	int rc = 0, bad = 0;

	if (fb_table_create(n, total, bytes, &r.t))
		return -1;
	if (n->rank == 0) {
		bad = local_find_keys(&r, total);
		if (!bad) {
			/* the same layout as the arena: slot stride, value at 32 */
			r.astride = local_stride(bytes);
			r.arr = aligned_alloc(64, r.nkeys * r.astride);
			if (!r.arr) {
				fb_failf(n->sh, "local: no memory for the baseline array");
				bad = 1;
			}
		}
		if (!bad) {
			memset(r.arr, 0, r.nkeys * r.astride);
			rc = local_touch(&r);
			if (rc) {
				fb_fail(n, "local: set of every key", rc);
				bad = 1;
			}
		}
		for (int ti = 0; ti < o->nthreads && !bad; ti++) {
			for (int wr = 0; wr <= 1 && !bad; wr++) {
				bad = local_measure(&r, LOCAL_PULL, o->threads[ti], wr, samples) ||
				      local_measure(&r, LOCAL_PUSH, o->threads[ti], wr, samples);
			}
		}
		if (!bad)
			bad = local_measure(&r, LOCAL_PULL_HOT, 1, 0, samples);
		free(r.arr);
	}
	if (fb_phase_end(n, 0))
		bad = 1;
	ferry_table_destroy(r.t);
	return bad ? -1 : 0;
}

static int local_node(struct fb_node *n)
{
	const struct fb_opts *o = n->o;
	double *samples = NULL;
	int bad = 0, maxth = 1;

	for (int i = 0; i < o->nthreads; i++)
		if (o->threads[i] > maxth)
			maxth = o->threads[i];
	if (n->rank == 0) {
		samples = malloc((size_t)(maxth + 1) * FB_LOCAL_MAX_SAMPLES * sizeof(double));
		if (!samples)
			fb_failf(n->sh, "local: out of memory");
	}
	/* every node takes every decision from the options alone: same tables */
	for (int ki = 0; ki < o->nkeys; ki++) {
		for (int si = 0; si < o->nsizes; si++) {
			uint32_t bytes = o->sizes[si];
			uint64_t keys = o->keys[ki];
			double need = (double)keys * 2.0 * (double)local_stride(bytes);

			if (need > (double)o->mem_mb * 1048576.0) {
				if (n->rank == 0) {
					printf("# local: %llu keys of %u bytes skipped: the table "
					       "and its baseline array need %.0f MiB, above "
					       "--mem-mb %zu\n",
					       (unsigned long long)keys, bytes, need / 1048576.0,
					       o->mem_mb);
					atomic_fetch_add(&n->sh->skipped, 1);
				}
				continue;
			}
			if (local_one(n, bytes, keys, samples))
				bad = 1;
		}
	}
	free(samples);
	return bad ? -1 : 0;
}

int fb_local(const struct fb_opts *o, struct fb_shared *sh)
{
	/* one node holds every key; an external cluster uses rank 0's share */
	return fb_cluster_run(o, sh, 1, local_node, NULL, "local");
}

/* SPDX-License-Identifier: MIT */
/*
 * ferry-ckpt - how long training stops for a checkpoint, against how long
 * the checkpoint takes (docs/checkpoints.md).
 *
 *   ferry-ckpt [--nodes N] [--keys K] [--len V] [--runs R] [--dir D]
 *
 * N nodes as threads of this process (tcp over loopback), one dense table
 * of K keys of V floats. Each run, every node calls
 * ferry_table_checkpoint_start() (the pause: barrier, copy of what it owns,
 * all-reduce), then ferry_checkpoint_wait() (shard written and fsynced,
 * manifest); then ferry_table_restore(). Same-run baselines: a bare
 * ferry_barrier() (the least a collective mark can cost) and the whole
 * checkpoint. Prints medians over the runs, rank 0's clock, and the ratios.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"

#define MAXN 8
#define MAXRUNS 64

struct bk {
	int n, runs;
	uint64_t keys;
	uint32_t len;
	const char *dir;
	struct ferry *fy[MAXN];
	struct ferry_table *t[MAXN];
	double barrier_ms[MAXRUNS], pause_ms[MAXRUNS], total_ms[MAXRUNS], restore_ms[MAXRUNS];
	int rc[MAXN];
};

struct bk_arg {
	struct bk *b;
	int rank;
};

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *bk_node(void *p)
{
	struct bk_arg *a = p;
	struct bk *b = a->b;
	int r = a->rank, rc;
	struct ferry_table_params tp;

	memset(&tp, 0, sizeof(tp));
	tp.num_keys = b->keys;
	tp.value_len = b->len;
	tp.init = FERRY_INIT_UNIFORM;
	tp.init_a = -1;
	tp.init_b = 1;
	tp.init_seed = 7;
	rc = ferry_table_create(b->fy[r], &tp, &b->t[r]);
	for (int i = 0; !rc && i < b->runs; i++) {
		struct ferry_checkpoint *ck;
		double t0, t1, t2, t3;

		rc = ferry_barrier(b->fy[r]);
		t0 = now_ms();
		if (!rc)
			rc = ferry_barrier(b->fy[r]);
		t1 = now_ms();
		if (!rc)
			rc = ferry_table_checkpoint_start(b->t[r], b->dir, &ck);
		t2 = now_ms();
		if (!rc)
			rc = ferry_checkpoint_wait(ck);
		t3 = now_ms();
		if (r == 0) {
			b->barrier_ms[i] = t1 - t0;
			b->pause_ms[i] = t2 - t1;
			b->total_ms[i] = t3 - t1;
		}
		if (!rc)
			rc = ferry_barrier(b->fy[r]);
		t0 = now_ms();
		if (!rc)
			rc = ferry_table_restore(b->t[r], b->dir);
		if (r == 0)
			b->restore_ms[i] = now_ms() - t0;
	}
	if (!rc)
		rc = ferry_barrier(b->fy[r]);
	b->rc[r] = rc;
	return NULL;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "nodes", 1, 0, 'n' }, { "keys", 1, 0, 'k' }, { "len", 1, 0, 'l' },
		{ "runs", 1, 0, 'r' },	{ "dir", 1, 0, 'd' },  { 0, 0, 0, 0 },
	};
	struct bk *b = calloc(1, sizeof(*b));
	struct bk_arg args[MAXN];
	pthread_t th[MAXN];
	char tmpl[] = "/tmp/ferry-ckpt-bench-XXXXXX", cmd[600];
	double mb, pause, total, bar, rest;
	int c, rc = 0, own_dir = 0;

	if (!b)
		return 1;
	b->n = 4;
	b->keys = 1u << 20;
	b->len = 16;
	b->runs = 5;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			b->n = atoi(optarg);
			break;
		case 'k':
			b->keys = strtoull(optarg, NULL, 0);
			break;
		case 'l':
			b->len = (uint32_t)atoi(optarg);
			break;
		case 'r':
			b->runs = atoi(optarg);
			break;
		case 'd':
			b->dir = optarg;
			break;
		default:
			fprintf(stderr,
				"usage: %s [--nodes N] [--keys K] [--len V] [--runs R] "
				"[--dir D]\n",
				argv[0]);
			return 2;
		}
	}
	if (b->n < 1 || b->n > MAXN || b->runs < 1 || b->runs > MAXRUNS || !b->keys || !b->len) {
		fprintf(stderr, "ferry-ckpt: nodes 1..%d, runs 1..%d, keys and len > 0\n", MAXN,
			MAXRUNS);
		return 2;
	}
	if (!b->dir) {
		if (!mkdtemp(tmpl)) {
			perror("mkdtemp");
			return 1;
		}
		b->dir = tmpl;
		own_dir = 1;
	}
	rc = ferry_local_cluster_open(b->n, NULL, b->fy);
	if (rc) {
		fprintf(stderr, "ferry-ckpt: cluster: %s\n", ferry_strerror(rc));
		return 1;
	}
	for (int i = 0; i < b->n; i++) {
		args[i] = (struct bk_arg){ .b = b, .rank = i };
		pthread_create(&th[i], NULL, bk_node, &args[i]);
	}
	for (int i = 0; i < b->n; i++) {
		pthread_join(th[i], NULL);
		if (b->rc[i] && !rc)
			rc = b->rc[i];
	}
	for (int i = 0; i < b->n; i++) {
		if (b->t[i])
			ferry_table_destroy(b->t[i]);
		ferry_close(b->fy[i]);
	}
	if (rc) {
		fprintf(stderr, "ferry-ckpt: %s\n", ferry_strerror(rc));
		return 1;
	}
	mb = (double)b->keys * (16 + 4.0 * b->len) / (1 << 20);
	bar = median(b->barrier_ms, b->runs);
	pause = median(b->pause_ms, b->runs);
	total = median(b->total_ms, b->runs);
	rest = median(b->restore_ms, b->runs);
	printf("ferry-ckpt: %d nodes (threads, tcp loopback), %llu keys x %u floats: %.1f MiB "
	       "of shards, %d runs, medians (rank 0)\n",
	       b->n, (unsigned long long)b->keys, b->len, mb, b->runs);
	printf("  barrier (baseline)        %9.3f ms\n", bar);
	printf("  checkpoint pause (start)  %9.3f ms   %.1fx a barrier\n", pause,
	       bar > 0 ? pause / bar : 0);
	printf("  checkpoint whole (+wait)  %9.3f ms   pause / whole = %.3f\n", total,
	       total > 0 ? pause / total : 0);
	printf("  restore                   %9.3f ms\n", rest);
	if (own_dir) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", b->dir);
		if (system(cmd))
			fprintf(stderr, "ferry-ckpt: could not remove %s\n", b->dir);
	}
	free(b);
	return 0;
}

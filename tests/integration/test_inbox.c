/* SPDX-License-Identifier: MIT */
/*
 * The landing inbox: least access for one-sided hand-overs. A table's arena
 * is registered for remote reads only; a one-sided hand-over writes into the
 * requester's landing inbox (registered for remote writes only), and the
 * requester copies the value into its slot. These cases run on the loop
 * transport: it emulates one-sided access in this process, checks every
 * access against the target's registrations as a NIC does, and can fail
 * writes on purpose (FERRY_LOOP_FAIL_WRITES). The one that needs none of
 * that (hand_overs_land_in_the_inbox_and_overflow_by_message) runs on rdma
 * when FERRY_TRANSPORT=rdma says so: CI runs it so in the SoftRoCE guest.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cluster.h"
#include "lib/core/core.h"
#include "lib/reloc/inbox.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_errors;
static char log_first[1024];

static void log_capture(enum ferry_log_level level, const char *msg, void *arg)
{
	pthread_mutex_lock(&log_lock);
	if (level == FERRY_LOG_ERROR && !log_errors++)
		snprintf(log_first, sizeof(log_first), "%s", msg);
	pthread_mutex_unlock(&log_lock);
}

static void setup(void)
{
	setenv("FERRY_TRANSPORT", "loop", 1);
	ferry_log_set(FERRY_LOG_WARN, log_capture, NULL);
}

/* loop, unless rdma is asked for (the SoftRoCE guest) */
static void setup_loop_or_rdma(void)
{
	const char *tr = getenv("FERRY_TRANSPORT");

	if (!tr || strcmp(tr, "rdma"))
		setenv("FERRY_TRANSPORT", "loop", 1);
	ferry_log_set(FERRY_LOG_WARN, log_capture, NULL);
}

/* each case picks its transport in its own .init (the suite's would run first) */
TestSuite(inbox, .timeout = 120);

/* ---- a peer of the cluster that posts one-sided operations by hand -------- */

struct probe {
	pthread_mutex_t lock;
	int done;
	int status;
};

static void probe_on_msg(void *core, uint32_t src, const void *buf, size_t len)
{
}

static void probe_on_rdma_done(void *core, void *ctx, int status)
{
	struct probe *p = core;

	pthread_mutex_lock(&p->lock);
	p->done++;
	p->status = status;
	pthread_mutex_unlock(&p->lock);
}

static const struct ferry_tp_handler probe_handler = {
	.on_msg = probe_on_msg,
	.on_rdma_done = probe_on_rdma_done,
};

/* one write or read of @len bytes at @raddr/@rkey of rank @dst; its status */
static int probe_rw(struct ferry_tp *tp, struct probe *p, int write, uint32_t dst, void *local,
		    struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey, size_t len)
{
	int rc, done;

	pthread_mutex_lock(&p->lock);
	p->done = 0;
	p->status = 1;
	pthread_mutex_unlock(&p->lock);
	if (write)
		rc = tp->ops->write(tp, dst, local, lmr, raddr, rkey, len, p);
	else
		rc = tp->ops->read(tp, dst, local, lmr, raddr, rkey, len, p);
	if (rc)
		return rc;
	/* loop completes inline */
	pthread_mutex_lock(&p->lock);
	done = p->done;
	rc = p->status;
	pthread_mutex_unlock(&p->lock);
	cr_assert_eq(done, 1, "the operation completed %d times", done);
	return rc;
}

/* the rkey of its inbox region that rank @from granted @t's node (a CHUNK
 * frame sent when the create succeeded), once it came */
static uint64_t grant_wait(struct ferry_table *t, uint32_t from)
{
	uint64_t k = 0;

	for (int i = 0; i < 500 && !k; i++) {
		k = __atomic_load_n(&t->inbox_grant[from], __ATOMIC_RELAXED);
		if (!k)
			usleep(10000);
	}
	cr_assert_neq(k, 0, "rank %u granted no inbox region", from);
	return k;
}

/*
 * Rank 1 of the cluster, as far as one-sided access goes: what rank 1 knows
 * of rank 0's memory is all a peer needs to reach it.
 */
Test(inbox, a_peer_cannot_write_into_an_arena, .init = setup)
{
	struct ferry_table_params tp = { .num_keys = 16, .value_len = 16 };
	struct ferry_tp_config cfg = { 0 };
	struct probe pr = { .lock = PTHREAD_MUTEX_INITIALIZER };
	const struct ferry_msg_arena *a0;
	struct ferry_table *t0;
	struct ferry_slot *s0;
	struct ferry_tp *ptp;
	struct ferry_tp_mr *lmr;
	struct ferry_worker *w;
	float buf[32], v[16];
	uint64_t key = 0; /* home: rank 0, slot 0 */
	uint64_t a0_rkey, in_rkey;
	uint32_t first, nslots;
	struct tc c;
	int rc;

	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	t0 = c.t[0];
	a0 = &c.t[1]->peer_arena[0];
	cr_assert(ferry__table_onesided(c.t[1]), "one-sided access is off on the loop transport");
	cr_assert_neq(a0->addr, 0);
	cr_assert_eq(a0->addr, (uint64_t)(uintptr_t)t0->arena.base);
	cr_assert_neq(a0->inbox_entries, 0, "rank 0 announced no landing inbox");
	cr_assert_eq(a0->inbox_addr, (uint64_t)(uintptr_t)t0->inbox.base);
	cr_assert_not_null(t0->chunk_mr[0], "rank 0 registered no chunk of its arena");
	cr_assert_eq(a0->inbox_rkey, 0, "an inbox key went to every rank");
	in_rkey = grant_wait(c.t[1], 0);
	cr_assert_neq(t0->chunk_mr[0]->rkey, in_rkey);

	cfg = (struct ferry_tp_config){ .rank = 1,
					.world = 2,
					.cluster_id = c.fy[0]->cluster_id,
					.bind_addr = "127.0.0.1",
					.timeout_ms = 5000,
					.handler = &probe_handler,
					.core = &pr };
	ptp = calloc(1, ferry__loop_ops.tp_size);
	lmr = calloc(1, ferry__loop_ops.mr_size);
	cr_assert(ptp && lmr);
	ptp->ops = &ferry__loop_ops;
	cr_assert_eq(ferry__loop_ops.init(ptp, &cfg), 0);
	cr_assert_eq(ferry__loop_ops.mem_reg(ptp, buf, sizeof(buf), 0, lmr), 0);
	for (int i = 0; i < 32; i++)
		buf[i] = 100.0f + (float)i;

	/* the arena is registered a chunk at a time: chunk 0's rkey and end */
	cr_assert_not_null(t0->chunk_mr[0]);
	a0_rkey = t0->chunk_mr[0]->rkey;
	ferry__arena_chunk_span(&t0->arena, 0, &first, &nslots);
	cr_assert_eq(first, 0);
	/* slot 0 holds key 0: its value may be read, never written */
	s0 = ferry__arena_slot(&t0->arena, 0);
	cr_assert_eq(s0->key, 0);
	rc = probe_rw(ptp, &pr, 1, 0, buf, lmr, a0->addr + FERRY_SLOT_HDR, a0_rkey,
		      16 * sizeof(float));
	cr_assert_eq(rc, -EACCES, "a write into the arena returned %s, want -EACCES",
		     ferry_strerror(rc));
	for (int i = 0; i < 16; i++)
		cr_assert_eq(s0->val[i], 0.0f, "the refused write changed the slot");
	/* the whole slot, header included, and the arena's last byte: refused too */
	cr_assert_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr, a0->addr, a0_rkey, 64), -EACCES);
	cr_assert_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr,
			      a0->addr + (uint64_t)nslots * t0->arena.stride - 1, a0_rkey, 1),
		     -EACCES);
	/* the chunk's key opens only the chunk: a read past its end is refused */
	if (nslots < t0->arena.capacity)
		cr_assert_eq(probe_rw(ptp, &pr, 0, 0, buf, lmr,
				      a0->addr + (uint64_t)nslots * t0->arena.stride, a0_rkey, 64),
			     -EACCES);
	/* the same key reads fine */
	cr_assert_eq(probe_rw(ptp, &pr, 0, 0, buf, lmr, a0->addr, a0_rkey, 64), 0);
	cr_assert_eq(((struct ferry_slot *)buf)->key, 0);

	/* the inbox takes writes, not reads; nothing outside it */
	for (int i = 0; i < 32; i++)
		buf[i] = 100.0f + (float)i;
	cr_assert_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr,
			      a0->inbox_addr + (uint64_t)(a0->inbox_entries - 1) * a0->inbox_stride,
			      in_rkey, a0->inbox_stride),
		     0);
	cr_assert_eq(memcmp(t0->inbox.base + (size_t)(a0->inbox_entries - 1) * a0->inbox_stride,
			    buf, a0->inbox_stride),
		     0, "the write into the inbox did not land");
	cr_assert_eq(probe_rw(ptp, &pr, 0, 0, buf, lmr, a0->inbox_addr, in_rkey, 64), -EACCES,
		     "the inbox can be read remotely");
	cr_assert_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr,
			      a0->inbox_addr + (uint64_t)a0->inbox_entries * a0->inbox_stride - 8,
			      in_rkey, 16),
		     -EACCES, "a write past the inbox's end was let through");
	/* the inbox key does not open the arena */
	cr_assert_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr, a0->addr, in_rkey, 64), -EACCES);
	/* rank 0's keys name rank 0's memory only */
	cr_assert_eq(probe_rw(ptp, &pr, 1, 1, buf, lmr, a0->inbox_addr, in_rkey, 64), -EACCES);

	/* and the node still works: pull key 0 from rank 1 */
	cr_assert_eq(ferry_worker_create(c.fy[1], &w), 0);
	cr_assert_eq(ferry_pull(w, c.t[1], &key, 1, v), 0);
	cr_assert_eq(v[0], 0.0f);
	ferry_worker_destroy(w);

	ferry__loop_ops.mem_dereg(ptp, lmr);
	ferry__loop_ops.fini(ptp);
	free(lmr);
	free(ptp);
	tc_close(&c);
	cr_assert_eq(log_errors, 0, "%d error lines, the first: %s", log_errors, log_first);
}

/* ---- hand-overs through the inbox --------------------------------------- */

#define NKEYS 3000u
#define MAXLEN 37u

static uint32_t key_len(uint64_t k)
{
	return 1 + (uint32_t)(k % MAXLEN);
}

/* the value set for key k, element j: exact in a float */
static float key_val(uint64_t k, uint32_t j)
{
	return (float)(k * 64 + j);
}

static uint32_t lens[NKEYS];
static uint64_t all_keys[NKEYS];

static void keys_init(struct ferry_table_params *tp)
{
	for (uint32_t k = 0; k < NKEYS; k++) {
		lens[k] = key_len(k);
		all_keys[k] = k;
	}
	/* room for every key plus the slots of keys that left and wait for a
	 * grace period: rank 1 takes every key back while others take them away */
	*tp = (struct ferry_table_params){ .num_keys = NKEYS,
					   .value_lens = lens,
					   .capacity = 2 * NKEYS };
}

/* a buffer for the values of every key */
static float *all_vals_alloc(void)
{
	size_t total = 0;
	float *vals;

	for (uint32_t k = 0; k < NKEYS; k++)
		total += lens[k];
	vals = malloc(total * sizeof(float));
	cr_assert_not_null(vals);
	return vals;
}

/* set every key from rank 0 */
static void set_all(struct tc *c)
{
	struct ferry_worker *w;
	float *vals = all_vals_alloc();
	size_t total = 0;

	for (uint32_t k = 0; k < NKEYS; k++)
		for (uint32_t j = 0; j < lens[k]; j++)
			vals[total++] = key_val(k, j);
	cr_assert_eq(ferry_worker_create(c->fy[0], &w), 0);
	cr_assert_eq(ferry_set(w, c->t[0], all_keys, NKEYS, vals), 0);
	ferry_worker_destroy(w);
	free(vals);
}

/* every key, pulled from rank @r, equals its set value plus @pushes */
static void check_all(struct tc *c, int r, uint32_t pushes)
{
	struct ferry_worker *w;
	float *vals = all_vals_alloc();
	size_t at = 0;
	long bad = 0;

	cr_assert_eq(ferry_worker_create(c->fy[r], &w), 0);
	cr_assert_eq(ferry_pull(w, c->t[r], all_keys, NKEYS, vals), 0);
	for (uint32_t k = 0; k < NKEYS; k++)
		for (uint32_t j = 0; j < lens[k]; j++, at++)
			if (vals[at] != key_val(k, j) + (float)pushes) {
				if (!bad)
					cr_log_error("key %u [%u]: %g, want %g", k, j, vals[at],
						     key_val(k, j) + (float)pushes);
				bad++;
			}
	ferry_worker_destroy(w);
	free(vals);
	cr_assert_eq(bad, 0, "%ld values wrong (of %zu floats)", bad, at);
}

/* every landing entry of every node is free again */
static void check_inboxes_free(struct tc *c)
{
	for (int r = 0; r < c->n; r++) {
		uint32_t n, nfree;

		ferry__reloc_inbox_usage(c->t[r], &n, &nfree);
		cr_assert_gt(n, 0, "rank %d has no landing inbox", r);
		cr_assert_eq(nfree, n, "rank %d: %u of %u landing entries free", r, nfree, n);
	}
}

static uint64_t inbox_onesided(struct tc *c)
{
	uint64_t s = 0;

	for (int r = 0; r < c->n; r++)
		s += atomic_load(&c->t[r]->inbox.onesided);
	return s;
}

static uint64_t inbox_fallbacks(struct tc *c)
{
	uint64_t s = 0;

	for (int r = 0; r < c->n; r++)
		s += atomic_load(&c->t[r]->inbox.write_fallbacks);
	return s;
}

/*
 * Least privilege (issue 16, item 3): rank 0's inbox has one region per
 * peer, each its own registration, and each peer got its own region's key
 * alone. With rank 1's key, a write lands in rank 1's region and nowhere
 * else: not in rank 2's region, not past the region's end; rank 2's key is
 * another; nobody got rank 0's keys in the broadcast. (The loop transport
 * checks accesses as a NIC does; the rxe check of the same bound is
 * test_transport's a_write_outside_its_registration_fails.)
 */
Test(inbox, a_peer_writes_only_its_own_region_of_an_inbox, .init = setup)
{
	struct ferry_table_params tp = { .num_keys = 30, .value_len = 16 };
	struct probe pr = { .lock = PTHREAD_MUTEX_INITIALIZER };
	const struct ferry_msg_arena *a0;
	struct ferry_tp_config cfg;
	struct ferry_table *t0;
	struct ferry_tp *ptp;
	struct ferry_tp_mr *lmr;
	uint64_t k1, k2, r1, r2;
	uint32_t k, stride;
	float buf[16];
	struct tc c;

	cr_assert_eq(tc_open(&c, 3, &tp, 20000), 0);
	t0 = c.t[0];
	a0 = &c.t[1]->peer_arena[0];
	cr_assert_eq(a0->inbox_rkey, 0, "an inbox key went to every rank");
	k1 = grant_wait(c.t[1], 0);
	k2 = grant_wait(c.t[2], 0);
	cr_assert_neq(k1, k2, "ranks 1 and 2 got the same key to rank 0's inbox");
	k = t0->inbox.k;
	stride = t0->inbox.stride;
	cr_assert_eq(t0->inbox.n, 2 * k, "rank 0's inbox is not two regions");
	cr_assert_eq(a0->inbox_entries, 2 * k);
	r1 = a0->inbox_addr;			    /* region of rank 1: entries 0 .. k-1 */
	r2 = a0->inbox_addr + (uint64_t)k * stride; /* of rank 2: k .. 2k-1 */

	cfg = (struct ferry_tp_config){ .rank = 1,
					.world = 3,
					.cluster_id = c.fy[0]->cluster_id,
					.bind_addr = "127.0.0.1",
					.timeout_ms = 5000,
					.handler = &probe_handler,
					.core = &pr };
	ptp = calloc(1, ferry__loop_ops.tp_size);
	lmr = calloc(1, ferry__loop_ops.mr_size);
	cr_assert(ptp && lmr);
	ptp->ops = &ferry__loop_ops;
	cr_assert_eq(ferry__loop_ops.init(ptp, &cfg), 0);
	cr_assert_eq(ferry__loop_ops.mem_reg(ptp, buf, sizeof(buf), 0, lmr), 0);
	for (int i = 0; i < 16; i++)
		buf[i] = 42.0f + (float)i;

	/* rank 1's key: its region, first and last entry */
	cr_expect_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr, r1, k1, 64), 0);
	cr_expect_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr, r1 + (uint64_t)(k - 1) * stride, k1, 64),
		     0);
	cr_expect_eq(memcmp(t0->inbox.base, buf, 64), 0, "the write into its region is lost");
	/* not rank 2's region, not across the boundary, not a read */
	memset(t0->inbox.base + (size_t)k * stride, 0, 64);
	cr_expect_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr, r2, k1, 64), -EACCES,
		     "rank 1's key wrote rank 2's region");
	cr_expect_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr, r2 - 32, k1, 64), -EACCES,
		     "rank 1's key wrote across into rank 2's region");
	cr_expect_eq(probe_rw(ptp, &pr, 0, 0, buf, lmr, r1, k1, 64), -EACCES,
		     "rank 1's key reads rank 0's inbox");
	for (int i = 0; i < 16; i++)
		cr_expect_eq(((float *)(t0->inbox.base + (size_t)k * stride))[i], 0.0f,
			     "a refused write changed rank 2's region");
	/* rank 2's key opens rank 2's region only */
	cr_expect_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr, r2, k2, 64), 0);
	cr_expect_eq(probe_rw(ptp, &pr, 1, 0, buf, lmr, r1, k2, 64), -EACCES);

	ferry__loop_ops.mem_dereg(ptp, lmr);
	ferry__loop_ops.fini(ptp);
	free(lmr);
	free(ptp);
	tc_close(&c);
}

/*
 * Range placement over 3 nodes: rank 1 is home of keys 1000 .. 1999. One
 * localize of every key moves the 2000 others; the first 1024 (the inbox's
 * size) land in the inbox, the rest go by message.
 */
Test(inbox, hand_overs_land_in_the_inbox_and_overflow_by_message, .init = setup_loop_or_rdma,
     .timeout = 300)
{
	struct ferry_table_params tp;
	struct ferry_worker *w;
	uint32_t n, nfree;
	struct tc c;

	keys_init(&tp);
	cr_assert_eq(tc_open(&c, 3, &tp, 20000), 0);
	set_all(&c);
	ferry__reloc_inbox_usage(c.t[1], &n, &nfree);
	cr_assert_eq(n, 1024, "inbox of %u entries, want 1024 (the cap)", n);
	cr_assert_eq(c.t[1]->inbox.stride, 192, "entries of %u bytes for 37 floats",
		     c.t[1]->inbox.stride);

	cr_assert_eq(ferry_worker_create(c.fy[1], &w), 0);
	cr_assert_eq(ferry_localize(w, c.t[1], all_keys, NKEYS), 0);
	cr_assert_eq(atomic_load(&c.t[1]->inbox.onesided), 1024,
		     "%llu values came through the inbox",
		     (unsigned long long)atomic_load(&c.t[1]->inbox.onesided));
	cr_assert_eq(inbox_fallbacks(&c), 0);
	ferry_worker_destroy(w);
	check_inboxes_free(&c);
	check_all(&c, 1, 0);
	check_all(&c, 2, 0);
	/* and back, key by key, all through the inbox: rank 2 pulls them first,
	 * so its hints name rank 1, in whose region of its inbox it reserves */
	cr_assert_eq(ferry_worker_create(c.fy[2], &w), 0);
	{
		float *tmp = malloc(200 * 37 * sizeof(float));

		cr_assert_not_null(tmp);
		cr_assert_eq(ferry_pull(w, c.t[2], all_keys, 200, tmp), 0);
		free(tmp);
	}
	for (uint32_t k = 0; k < 200; k++)
		cr_assert_eq(ferry_localize(w, c.t[2], &all_keys[k], 1), 0);
	cr_assert_eq(atomic_load(&c.t[2]->inbox.onesided), 200);
	ferry_worker_destroy(w);
	check_inboxes_free(&c);
	check_all(&c, 0, 0);
	tc_close(&c);
	cr_assert_eq(log_errors, 0, "%d error lines, the first: %s", log_errors, log_first);
}

/*
 * The old owner checks a landing index against the entries the requester
 * announced: here rank 0 believes rank 1 has one entry, so of 32 keys one
 * is written into entry 0 and 31 go by message, with one error line.
 */
Test(inbox, a_landing_index_beyond_the_inbox_goes_by_message, .init = setup)
{
	struct ferry_table_params tp = { .num_keys = 64, .value_len = 8 };
	uint64_t keys[32];
	float vals[32 * 8];
	struct ferry_worker *w;
	struct tc c;

	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_gt(c.t[1]->inbox.n, 32);
	for (int k = 0; k < 32; k++) {
		keys[k] = (uint64_t)k; /* home: rank 0 */
		for (int j = 0; j < 8; j++)
			vals[k * 8 + j] = (float)(k * 8 + j);
	}
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	cr_assert_eq(ferry_set(w, c.t[0], keys, 32, vals), 0);
	ferry_worker_destroy(w);
	/* before any hand-over: the progress thread reads it only for one */
	c.t[0]->peer_arena[1].inbox_entries = 1;

	cr_assert_eq(ferry_worker_create(c.fy[1], &w), 0);
	cr_assert_eq(ferry_localize(w, c.t[1], keys, 32), 0);
	memset(vals, 0, sizeof(vals));
	cr_assert_eq(ferry_pull(w, c.t[1], keys, 32, vals), 0);
	ferry_worker_destroy(w);
	for (int i = 0; i < 32 * 8; i++)
		cr_assert_eq(vals[i], (float)i, "key %d [%d]: %g", i / 8, i % 8, vals[i]);
	cr_assert_eq(atomic_load(&c.t[1]->inbox.onesided), 1, "%llu values through the inbox",
		     (unsigned long long)atomic_load(&c.t[1]->inbox.onesided));
	check_inboxes_free(&c);
	tc_close(&c);
	cr_assert_eq(log_errors, 1, "%d error lines, want 1", log_errors);
	cr_assert(strstr(log_first, "landing entry 1 of rank 1, which has 1"), "%s", log_first);
}

#define ROUNDS 8

/*
 * Every node keeps localizing keys (rank 0 one at a time, rank 1 all at once,
 * rank 2 in batches of 100) and pushing +1 to every key, while every 3rd
 * one-sided write fails halfway. The values of failed batches go by
 * message; no value and no push may be lost, and every landing entry must
 * be free at the end.
 */
static int storm(struct tc *c, int rank, void *arg)
{
	struct ferry_worker *w;
	size_t total = 0;
	float *ones;
	int rc;

	for (uint32_t k = 0; k < NKEYS; k++)
		total += lens[k];
	ones = malloc(total * sizeof(float));
	if (!ones)
		return -ENOMEM;
	for (size_t i = 0; i < total; i++)
		ones[i] = 1.0f;
	rc = ferry_worker_create(c->fy[rank], &w);
	if (rc) {
		free(ones);
		return rc;
	}
	for (int round = 0; round < ROUNDS && !rc; round++) {
		if (rank == 0) {
			for (uint32_t k = (uint32_t)round; k < NKEYS && !rc; k += 17)
				rc = ferry_localize(w, c->t[0], &all_keys[k], 1);
		} else if (rank == 1) {
			rc = ferry_localize(w, c->t[1], all_keys, NKEYS);
		} else {
			for (uint32_t k = 0; k < NKEYS && !rc; k += 100)
				rc = ferry_localize(w, c->t[2], &all_keys[k],
						    NKEYS - k < 100 ? NKEYS - k : 100);
		}
		if (!rc)
			rc = ferry_push(w, c->t[rank], all_keys, NKEYS, ones);
	}
	if (rc)
		cr_log_error("rank %d: %s", rank, ferry_strerror(rc));
	ferry_worker_destroy(w);
	free(ones);
	return rc;
}

Test(inbox, failed_one_sided_hand_overs_lose_no_value_or_update, .init = setup, .timeout = 300)
{
	struct ferry_table_params tp;
	struct tc c;
	int rc;

	setenv("FERRY_LOOP_FAIL_WRITES", "3", 1);
	keys_init(&tp);
	cr_assert_eq(tc_open(&c, 3, &tp, 60000), 0);
	set_all(&c);
	rc = tc_run(&c, storm, NULL);
	cr_assert_eq(rc, 0, "%s", ferry_strerror(rc));
	cr_log_info("%llu values through the inbox, %llu batches sent by message after a "
		    "failed write",
		    (unsigned long long)inbox_onesided(&c),
		    (unsigned long long)inbox_fallbacks(&c));
	cr_assert_gt(inbox_fallbacks(&c), 0, "no one-sided hand-over failed: the knob is off?");
	cr_assert_gt(inbox_onesided(&c), 0, "no value came through an inbox");
	check_inboxes_free(&c);
	for (int r = 0; r < 3; r++)
		check_all(&c, r, 3 * ROUNDS);
	tc_close(&c);
	cr_assert_eq(log_errors, 0, "%d error lines, the first: %s", log_errors, log_first);
}

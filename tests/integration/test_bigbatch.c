/* SPDX-License-Identifier: MIT */
/*
 * Integration: batches larger than one frame (FERRY_MSG_MAX, 64 MiB). A
 * localize, pull, push and set of 100 MiB between two nodes (threads of one
 * process) over FERRY_TRANSPORT (tcp by default; the ctest entry
 * test_bigbatch_loop runs it over loop): every call completes, and every
 * value is checked. Before frames were split, the localize timed out and its
 * keys were lost for good on both nodes.
 *
 * FERRY_BIGBATCH_MIB sets the size (default 100; 1024 for the 1 GiB run,
 * by hand: it needs about 3 GiB of memory and a minute).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"

#define VLEN 1024 /* floats: 4 KiB per key */

struct big {
	uint64_t nkeys; /* keys homed at rank 0: [0, nkeys) */
	uint64_t *keys;
	float *vals;
	int failures;
	char why[256];
};

static float big_val(uint64_t key, uint32_t j, int round)
{
	return (float)((key * 7 + j) % 1000) + (float)round * 1000.0f;
}

static int big_check(struct big *b, const char *what, int round)
{
	for (uint64_t i = 0; i < b->nkeys; i++)
		for (uint32_t j = 0; j < VLEN; j++)
			if (b->vals[i * VLEN + j] != big_val(b->keys[i], j, round)) {
				snprintf(b->why, sizeof(b->why),
					 "%s: key %llu float %u is %g, not %g", what,
					 (unsigned long long)b->keys[i], j,
					 (double)b->vals[i * VLEN + j],
					 (double)big_val(b->keys[i], j, round));
				b->failures++;
				return -EIO;
			}
	return 0;
}

static int big_fail(struct big *b, const char *what, int rc)
{
	snprintf(b->why, sizeof(b->why), "%s: %s", what, ferry_strerror(rc));
	b->failures++;
	return rc;
}

/* rank 0 sets every value (local), rank 1 localizes all of them (one call,
 * > 64 MiB of hand-over), pulls them locally, rank 0 pulls them remotely (a
 * reply > 64 MiB), pushes round 1 - round 0 to them remotely (an OP > 64
 * MiB), and rank 1 checks */
static int big_run(struct tc *c, int rank, void *arg)
{
	struct big *b = arg;
	struct ferry_worker *w;
	int rc;

	rc = ferry_worker_create(c->fy[rank], &w);
	if (rc)
		return big_fail(b, "worker", rc);
	if (rank == 0) {
		for (uint64_t i = 0; i < b->nkeys; i++)
			for (uint32_t j = 0; j < VLEN; j++)
				b->vals[i * VLEN + j] = big_val(b->keys[i], j, 0);
		rc = ferry_set(w, c->t[0], b->keys, b->nkeys, b->vals);
		if (rc)
			big_fail(b, "set at the home", rc);
	}
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	if (!rc && rank == 1) {
		rc = ferry_localize(w, c->t[1], b->keys, b->nkeys);
		if (rc)
			big_fail(b, "localize of the whole batch", rc);
		if (!rc) {
			memset(b->vals, 0, b->nkeys * VLEN * sizeof(float));
			rc = ferry_pull(w, c->t[1], b->keys, b->nkeys, b->vals);
			if (rc)
				big_fail(b, "local pull after the localize", rc);
		}
		if (!rc)
			rc = big_check(b, "rank 1 after localize", 0);
	}
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	if (!rc && rank == 0) {
		memset(b->vals, 0, b->nkeys * VLEN * sizeof(float));
		rc = ferry_pull(w, c->t[0], b->keys, b->nkeys, b->vals);
		if (rc)
			big_fail(b, "remote pull of the whole batch", rc);
		if (!rc)
			rc = big_check(b, "rank 0 remote pull", 0);
		if (!rc) {
			/* deltas that turn round 0 into round 1 */
			for (uint64_t i = 0; i < b->nkeys * VLEN; i++)
				b->vals[i] = 1000.0f;
			rc = ferry_push(w, c->t[0], b->keys, b->nkeys, b->vals);
			if (rc)
				big_fail(b, "remote push of the whole batch", rc);
		}
	}
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	if (!rc && rank == 1) {
		memset(b->vals, 0, b->nkeys * VLEN * sizeof(float));
		rc = ferry_pull(w, c->t[1], b->keys, b->nkeys, b->vals);
		if (rc)
			big_fail(b, "pull after the remote push", rc);
		if (!rc)
			rc = big_check(b, "rank 1 after the push", 1);
	}
	ferry_worker_destroy(w);
	return rc;
}

static void big_case(void)
{
	const char *mib_s = getenv("FERRY_BIGBATCH_MIB");
	uint64_t mib = mib_s && *mib_s ? strtoull(mib_s, NULL, 10) : 100;
	struct ferry_table_params tp = { .value_len = VLEN, .placement = FERRY_PLACEMENT_RANGE };
	struct big *b = calloc(1, sizeof(*b));
	struct tc c;
	int rc;

	cr_assert_not_null(b);
	b->nkeys = mib * 1024 * 1024 / (VLEN * sizeof(float));
	/* two nodes, range placement: rank 0 is home of the first half */
	tp.num_keys = 2 * b->nkeys;
	b->keys = malloc(b->nkeys * sizeof(*b->keys));
	b->vals = malloc(b->nkeys * VLEN * sizeof(float));
	cr_assert(b->keys && b->vals);
	for (uint64_t i = 0; i < b->nkeys; i++)
		b->keys[i] = i;
	rc = tc_open(&c, 2, &tp, 120000);
	cr_assert_eq(rc, 0, "cluster open: %s", ferry_strerror(rc));
	cr_assert_eq(ferry_table_home(c.t[0], 0), 0);
	cr_assert_eq(ferry_table_home(c.t[0], b->nkeys - 1), 0);
	rc = tc_run(&c, big_run, b);
	tc_close(&c);
	cr_assert_eq(b->failures, 0, "%s", b->why);
	cr_assert_eq(rc, 0, "%s", ferry_strerror(rc));
	free(b->keys);
	free(b->vals);
	free(b);
}

Test(bigbatch, localize_pull_push_of_100_mib_cross_the_frame_limit, .timeout = 300)
{
	big_case();
}

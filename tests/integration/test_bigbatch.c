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

/*
 * Values of mixed sizes in one localize: about one key in five holds 512 B
 * or more (sent from its slot, FERRY_RELOC_IOV_BYTES in lib/reloc/batch.h), the
 * others 4-508 B (copied into runs). 4000 keys of about 4 MB cross both of
 * a hand-over frame's bounds (1 MiB, 256 values sent from slots). Rank 1
 * localizes them all from rank 0, then rank 0 localizes them back (the
 * hand-over now leaves from installed slots); every value is checked after
 * each move.
 */
enum {
	MIX_KEYS = 4000
};

static uint32_t mix_lens[MIX_KEYS];

static float mix_val(uint64_t key, uint32_t j)
{
	return (float)(key * 131 + j * 7) + 0.25f;
}

struct mix {
	size_t total; /* floats */
	uint64_t keys[MIX_KEYS];
	float *vals;
	int failures;
	char why[256];
};

static int mix_check(struct mix *m, struct ferry_worker *w, struct ferry_table *t, const char *what)
{
	size_t off = 0;
	int rc;

	memset(m->vals, 0, m->total * sizeof(float));
	rc = ferry_pull(w, t, m->keys, MIX_KEYS, m->vals);
	if (rc) {
		snprintf(m->why, sizeof(m->why), "%s: pull: %s", what, ferry_strerror(rc));
		m->failures++;
		return rc;
	}
	for (uint64_t k = 0; k < MIX_KEYS; k++)
		for (uint32_t j = 0; j < mix_lens[k]; j++, off++)
			if (m->vals[off] != mix_val(k, j)) {
				snprintf(m->why, sizeof(m->why),
					 "%s: key %llu (%u floats) float %u is %g, not %g", what,
					 (unsigned long long)k, mix_lens[k], j,
					 (double)m->vals[off], (double)mix_val(k, j));
				m->failures++;
				return -EIO;
			}
	return 0;
}

static int mix_run(struct tc *c, int rank, void *arg)
{
	struct mix *m = arg;
	struct ferry_worker *w;
	int rc;

	rc = ferry_worker_create(c->fy[rank], &w);
	if (rc)
		return rc;
	if (rank == 0) {
		size_t off = 0;

		for (uint64_t k = 0; k < MIX_KEYS; k++)
			for (uint32_t j = 0; j < mix_lens[k]; j++)
				m->vals[off++] = mix_val(k, j);
		rc = ferry_set(w, c->t[0], m->keys, MIX_KEYS, m->vals);
		if (rc) {
			snprintf(m->why, sizeof(m->why), "set: %s", ferry_strerror(rc));
			m->failures++;
		}
	}
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	for (int round = 0; round < 2 && !rc; round++) {
		int mover = round ? 0 : 1;

		if (rank == mover) {
			rc = ferry_localize(w, c->t[rank], m->keys, MIX_KEYS);
			if (rc) {
				snprintf(m->why, sizeof(m->why), "localize to rank %d: %s", rank,
					 ferry_strerror(rc));
				m->failures++;
			}
			if (!rc)
				rc = mix_check(m, w, c->t[rank],
					       round ? "rank 0 after the move back" :
						       "rank 1 after the localize");
		}
		if (!rc)
			rc = ferry_barrier(c->fy[rank]);
	}
	ferry_worker_destroy(w);
	return rc;
}

Test(bigbatch, localize_of_mixed_value_sizes_in_many_frames, .timeout = 120)
{
	struct ferry_table_params tp = { .num_keys = 2 * MIX_KEYS,
					 .placement = FERRY_PLACEMENT_RANGE };
	static uint32_t lens[2 * MIX_KEYS];
	struct mix *m = calloc(1, sizeof(*m));
	size_t big = 0;
	struct tc c;
	int rc;

	cr_assert_not_null(m);
	for (uint64_t k = 0; k < 2 * MIX_KEYS; k++) {
		/* 128 floats is 512 B: the boundary itself is one of the sizes */
		lens[k] = k % 5 == 0 ? 128 + (uint32_t)(k * 37 % 1900) :
				       1 + (uint32_t)(k * 13 % 127);
		if (k < MIX_KEYS) {
			mix_lens[k] = lens[k];
			m->keys[k] = k;
			m->total += lens[k];
			big += lens[k] >= 128;
		}
	}
	tp.value_lens = lens;
	cr_assert_gt(big, 2 * 256, "the test needs values sent from slots in several frames");
	cr_assert_gt(m->total * sizeof(float), 3u << 20, "the test needs several 1 MiB frames");
	m->vals = malloc(m->total * sizeof(float));
	cr_assert_not_null(m->vals);
	rc = tc_open(&c, 2, &tp, 30000);
	cr_assert_eq(rc, 0, "cluster open: %s", ferry_strerror(rc));
	cr_assert_eq(ferry_table_home(c.t[0], MIX_KEYS - 1), 0);
	rc = tc_run(&c, mix_run, m);
	tc_close(&c);
	cr_assert_eq(m->failures, 0, "%s", m->why);
	cr_assert_eq(rc, 0, "%s", ferry_strerror(rc));
	free(m->vals);
	free(m);
}

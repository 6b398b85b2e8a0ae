/* SPDX-License-Identifier: MIT */
/*
 * Integration: compressed pushes (struct ferry_table_params.push_codec,
 * lib/ops/codec.c). 3 nodes as threads, classic placement, so every push
 * to another node's key goes on the wire. Checked, for BF16 and FP16:
 *
 * - after ferry_flush() and a barrier every key holds the exact sum of
 *   every node's deltas (float rounding of the sum aside). The deltas are
 *   1 + a small fraction, which both codes round the same way every time:
 *   without the residuals the sums would be off by a tenth and more;
 * - a worker that keeps residuals for at most 64 keys (codec_keys) flushes
 *   them as it goes, and still nothing is lost;
 * - the same pushes on a table without a codec send more bytes (values of
 *   32 B per key: 16 instead), with the default residual store (a store
 *   much smaller than the keys pushed sends its exact floats often);
 * - bad parameters and the started form are refused with an errno.
 *
 * FERRY_TRANSPORT=loop runs it over the loop transport (ctest test_compress_loop).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "ferry/ferry.h"
#include "lib/ops/codec.h"

#define NODES 3
#define KEYS 200
#define VLEN 8
#define ROUNDS 150
#define BATCH 24

struct run {
	enum ferry_push_codec codec;
	uint32_t codec_keys;
	struct ferry_table *plain[NODES]; /* the same pushes without a codec */
	uint64_t bytes_codec[NODES], bytes_plain[NODES];
	char why[256];
};

/* rank @r's batch @round: keys (duplicates allowed) and deltas */
static void batch_of(int r, int round, uint64_t *k, float *d)
{
	uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(r * 1000 + round + 1);

	for (int i = 0; i < BATCH; i++) {
		k[i] = tc_rand(&s) % KEYS;
		for (int j = 0; j < VLEN; j++)
			d[i * VLEN + j] = 1.0f + (float)(tc_rand(&s) % 1000 + 1) * 1e-6f;
	}
}

static int fail(struct run *run, const char *what, int rc)
{
	/* the first failure is the cause; the others' barriers time out after it */
	fprintf(stderr, "test_compress: %s: %s\n", what, ferry_strerror(rc));
	if (!run->why[0])
		snprintf(run->why, sizeof(run->why), "%s: %s", what, ferry_strerror(rc));
	return 1;
}

static uint64_t sent(struct ferry *fy)
{
	struct ferry_stats st;

	return ferry_stats(fy, &st) ? 0 : st.bytes_sent;
}

static int pushes(struct tc *c, int rank, struct ferry_worker *w, struct ferry_table *t,
		  uint64_t *bytes, struct run *run)
{
	uint64_t k[BATCH], b0;
	float d[BATCH * VLEN];
	int rc;

	if ((rc = ferry_barrier(c->fy[rank])))
		return fail(run, "barrier", rc);
	b0 = sent(c->fy[rank]);
	for (int round = 0; round < ROUNDS; round++) {
		batch_of(rank, round, k, d);
		if ((rc = ferry_push(w, t, k, BATCH, d)))
			return fail(run, "push", rc);
	}
	if ((rc = ferry_flush(w, t)))
		return fail(run, "flush", rc);
	/* after the barrier: this node's replies to every other node's
	 * pushes are counted too */
	if ((rc = ferry_barrier(c->fy[rank])))
		return fail(run, "barrier", rc);
	*bytes = sent(c->fy[rank]) - b0;
	return 0;
}

static int check(struct ferry_worker *w, struct ferry_table *t, struct run *run)
{
	/* one per node thread: they check at the same time */
	double(*ref)[VLEN] = calloc(KEYS, sizeof(*ref));
	uint64_t k[KEYS];
	float *v = malloc(sizeof(float) * KEYS * VLEN);
	int rc;

	if (!ref || !v) {
		free(ref);
		free(v);
		return fail(run, "malloc", -ENOMEM);
	}
	for (int r = 0; r < NODES; r++)
		for (int round = 0; round < ROUNDS; round++) {
			uint64_t bk[BATCH];
			float d[BATCH * VLEN];

			batch_of(r, round, bk, d);
			for (int i = 0; i < BATCH; i++)
				for (int j = 0; j < VLEN; j++)
					ref[bk[i]][j] += d[i * VLEN + j];
		}
	for (int i = 0; i < KEYS; i++)
		k[i] = (uint64_t)i;
	if ((rc = ferry_pull(w, t, k, KEYS, v))) {
		free(ref);
		free(v);
		return fail(run, "pull", rc);
	}
	for (int i = 0; i < KEYS; i++)
		for (int j = 0; j < VLEN; j++)
			if (fabs((double)v[i * VLEN + j] - ref[i][j]) > 1e-3 + 1e-5 * ref[i][j]) {
				snprintf(run->why, sizeof(run->why),
					 "key %d [%d]: %.7g, the deltas sum to %.7g", i, j,
					 (double)v[i * VLEN + j], ref[i][j]);
				free(ref);
				free(v);
				return 1;
			}
	free(ref);
	free(v);
	return 0;
}

static int node(struct tc *c, int rank, void *arg)
{
	struct run *run = arg;
	struct ferry_table_params tp = { .num_keys = KEYS,
					 .value_len = VLEN,
					 .mode = FERRY_MODE_CLASSIC };
	struct ferry_worker *w;
	int rc, bad = 0;

	if ((rc = ferry_worker_create(c->fy[rank], &w)))
		return fail(run, "worker", rc);
	if ((rc = ferry_table_create(c->fy[rank], &tp, &run->plain[rank])))
		bad = fail(run, "plain table", rc);
	if (!bad)
		bad = pushes(c, rank, w, c->t[rank], &run->bytes_codec[rank], run);
	if (!bad)
		bad = check(w, c->t[rank], run);
	if (!bad)
		bad = pushes(c, rank, w, run->plain[rank], &run->bytes_plain[rank], run);
	if (!bad)
		bad = check(w, run->plain[rank], run);
	ferry_worker_destroy(w);
	return bad;
}

static void one(enum ferry_push_codec codec, uint32_t codec_keys, int fewer_bytes)
{
	struct ferry_table_params tp = { .num_keys = KEYS,
					 .value_len = VLEN,
					 .mode = FERRY_MODE_CLASSIC,
					 .push_codec = codec,
					 .codec_keys = codec_keys };
	struct run run = { .codec = codec, .codec_keys = codec_keys };
	struct tc c;

	cr_assert_eq(tc_open(&c, NODES, &tp, 30000), 0);
	uint64_t coded = 0, plain = 0;

	cr_assert_eq(tc_run(&c, node, &run), 0, "%s", run.why);
	for (int r = 0; r < NODES; r++) {
		coded += run.bytes_codec[r];
		plain += run.bytes_plain[r];
		ferry_table_destroy(run.plain[r]);
	}
	fprintf(stderr,
		"test_compress: codec %d, %u residual keys: %llu bytes sent, %llu plain (%.2f)\n",
		(int)codec, codec_keys, (unsigned long long)coded, (unsigned long long)plain,
		(double)coded / (double)plain);
	/* per remote key 16 B of key and 16 B of codes against 32 B of
	 * floats, with the replies and the flush the same: about 0.75 (a
	 * store of 64 keys for 200 flushes exact floats all the time) */
	if (fewer_bytes)
		cr_assert_lt((double)coded, 0.9 * (double)plain,
			     "the nodes sent %llu bytes compressed, %llu plain",
			     (unsigned long long)coded, (unsigned long long)plain);
	tc_close(&c);
}

Test(codec, bf16_sums_are_exact_after_a_flush, .timeout = 120)
{
	one(FERRY_CODEC_BF16, 0, 1);
}

Test(codec, fp16_sums_are_exact_with_a_small_residual_store, .timeout = 120)
{
	one(FERRY_CODEC_FP16, 64, 0);
}

Test(codec, fp16_sends_fewer_bytes, .timeout = 120)
{
	one(FERRY_CODEC_FP16, 0, 1);
}

Test(codec, bad_parameters_and_the_started_form_are_refused, .timeout = 60)
{
	struct ferry_table_params tp = { .num_keys = 16,
					 .value_len = 2,
					 .push_codec = FERRY_CODEC_BF16 };
	struct ferry_params p;
	struct ferry *fy;
	struct ferry_table *t;
	struct ferry_worker *w;
	uint32_t lens[16];
	uint64_t key = 3, ticket = 0;
	float d[2] = { 1, 2 };

	for (int i = 0; i < 16; i++)
		lens[i] = 2;
	ferry_params_init(&p);
	p.transport = FERRY_TRANSPORT_LOOP;
	cr_assert_eq(ferry_local_cluster_open(1, &p, &fy), 0);
	tp.push_codec = (enum ferry_push_codec)9;
	cr_assert_eq(ferry_table_create(fy, &tp, &t), -EINVAL);
	tp.push_codec = FERRY_CODEC_FP16;
	tp.value_lens = lens;
	cr_assert_eq(ferry_table_create(fy, &tp, &t), -EINVAL);
	tp.value_lens = NULL;
	tp.consistency = FERRY_CONS_SSP;
	tp.staleness = 1;
	cr_assert_eq(ferry_table_create(fy, &tp, &t), -EINVAL);
	tp.consistency = FERRY_CONS_SEQUENTIAL;
	tp.staleness = 0;
	cr_assert_eq(ferry_table_create(fy, &tp, &t), 0);
	cr_assert_eq(ferry_worker_create(fy, &w), 0);
	cr_assert_eq(ferry_push_start(w, t, &key, 1, d, &ticket), -EOPNOTSUPP);
	cr_assert_eq(ferry_flush(NULL, t), -EINVAL);
	key = 16;
	cr_assert_eq(ferry_push(w, t, &key, 1, d), -ERANGE);
	key = 3;
	cr_assert_eq(ferry_push(w, t, &key, 1, d), 0);
	cr_assert_eq(ferry_flush(w, t), 0);
	cr_assert_eq(ferry_pull(w, t, &key, 1, d), 0);
	cr_assert_eq(d[0], 1.0f);
	cr_assert_eq(d[1], 2.0f);
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
}

/* a push that fails changes no residual: the keys it would have added are
 * gone again and the others hold what they held (codec.c's undo) */
Test(codec, a_failed_push_leaves_the_residuals_as_they_were, .timeout = 60)
{
	struct ferry_table_params tp = { .num_keys = 64,
					 .value_len = 2,
					 .mode = FERRY_MODE_CLASSIC,
					 .push_codec = FERRY_CODEC_BF16 };
	struct ferry_worker *w;
	struct tc c;
	uint64_t mine = 0, theirs = 0, both[2];
	float d[4] = { 1.0001f, 1.0001f, 1.0001f, 1.0001f }, v[2];
	int rc;

	cr_assert_eq(tc_open(&c, 2, &tp, 5000), 0);
	while (ferry_table_home(c.t[0], mine) != 0)
		mine++;
	while (ferry_table_home(c.t[0], theirs) != 1)
		theirs++;
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	/* a residual of 1e-4 for the key here: 1.0001 rounds to 1 */
	cr_assert_eq(ferry_push(w, c.t[0], &mine, 1, d), 0);
	cr_assert_eq(ferry__codec_count(c.t[0]), 1);
	/* rank 1 goes; a push of both keys fails on its key */
	ferry_table_destroy(c.t[1]);
	ferry_close(c.fy[1]);
	c.t[1] = NULL;
	c.fy[1] = NULL;
	both[0] = mine;
	both[1] = theirs;
	rc = ferry_push(w, c.t[0], both, 2, d);
	cr_assert_lt(rc, 0, "a push to a closed node's key succeeded");
	/* the failed push's new key is forgotten, the old residual unchanged */
	cr_assert_eq(ferry__codec_count(c.t[0]), 1);
	/* the key here took the rounded value of the failed push, as any
	 * failed batch may have applied part of itself; its residual is the
	 * first push's only, so a flush adds 1e-4, not 2e-4 */
	cr_assert_eq(ferry_pull(w, c.t[0], &mine, 1, v), 0);
	cr_assert_eq(v[0], 2.0f, "%a", (double)v[0]);
	cr_assert_eq(ferry_flush(w, c.t[0]), 0);
	cr_assert_eq(ferry_pull(w, c.t[0], &mine, 1, v), 0);
	cr_assert_float_eq(v[0], 2.0001f, 1e-6, "%.7f", (double)v[0]);
	ferry_worker_destroy(w);
	tc_close(&c);
}

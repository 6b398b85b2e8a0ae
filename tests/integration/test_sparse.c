/* SPDX-License-Identifier: MIT */
/*
 * Integration: sparse tables (any 64-bit key), their initial values, and a
 * directory that holds only what a node owns, homes away, or caches.
 * Nodes are threads of one process over tcp (or FERRY_TRANSPORT: loop
 * serves one-sided reads and hand-overs, rdma in the SoftRoCE VM).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cluster.h"
#include "ferry/ferry.h"
#include "lib/store/init.h"

#define NODES 4
#define VLEN 6
#define PER 1500 /* keys each node makes up */

/* rank r's keys: from the whole 64-bit space, distinct across ranks with
 * overwhelming probability (checked below) */
static void keys_of(int rank, uint64_t *k)
{
	uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 7);

	for (int i = 0; i < PER; i++)
		k[i] = tc_rand(&s);
}

static float val(uint64_t key, uint32_t j)
{
	return (float)(key % 9973) + 0.25f * (float)j;
}

struct sp {
	struct ferry_table_params tp;
	int failed_rank;
	char why[256];
	pthread_barrier_t bar;
};

static int sp_fail(struct sp *sp, int rank, const char *what, uint64_t key, int rc, float got,
		   float want)
{
	if (!sp->why[0])
		snprintf(sp->why, sizeof(sp->why),
			 "rank %d: %s (key %llu, rc %d: %s, got %g want %g)", rank, what,
			 (unsigned long long)key, rc, ferry_strerror(rc), (double)got,
			 (double)want);
	return 1;
}

static int node_main(struct tc *c, int rank, void *arg)
{
	struct sp *sp = arg;
	struct ferry_table *t = c->t[rank];
	struct ferry_init_spec spec = { .kind = sp->tp.init,
					.a = sp->tp.init_a,
					.b = sp->tp.init_b,
					.seed = sp->tp.init_seed };
	uint64_t mine[PER], next[PER];
	float *v = malloc(PER * VLEN * sizeof(float)), want[VLEN];
	struct ferry_worker *w;
	int rc, bad = 0;

	if (!v || ferry_worker_create(c->fy[rank], &w))
		return 1;
	keys_of(rank, mine);
	keys_of((rank + 1) % NODES, next);

	/* 1. never written: every node reads the initial value, computed from
	 * (seed, key) alone, for its own keys and for the next rank's */
	for (int pass = 0; pass < 2 && !bad; pass++) {
		const uint64_t *k = pass ? next : mine;

		rc = ferry_pull(w, t, k, PER, v);
		if (rc) {
			bad = sp_fail(sp, rank, "pull of unwritten keys", k[0], rc, 0, 0);
			break;
		}
		for (int i = 0; i < PER && !bad; i++) {
			ferry__init_value(&spec, k[i], 0, want, VLEN);
			for (int j = 0; j < VLEN; j++)
				if (v[i * VLEN + j] != want[j] || v[i * VLEN + j] < sp->tp.init_a ||
				    v[i * VLEN + j] >= sp->tp.init_b) {
					bad = sp_fail(sp, rank, "initial value", k[i], 0,
						      v[i * VLEN + j], want[j]);
					break;
				}
		}
	}
	pthread_barrier_wait(&sp->bar);
	/* 2. each node sets its keys; everyone reads the next rank's back */
	for (int i = 0; i < PER; i++)
		for (int j = 0; j < VLEN; j++)
			v[i * VLEN + j] = val(mine[i], (uint32_t)j);
	if (!bad && (rc = ferry_set(w, t, mine, PER, v)))
		bad = sp_fail(sp, rank, "set", mine[0], rc, 0, 0);
	pthread_barrier_wait(&sp->bar);
	/* 3. half of the next rank's keys move here, and get +1 here */
	if (!bad && (rc = ferry_localize(w, t, next, PER / 2)))
		bad = sp_fail(sp, rank, "localize", next[0], rc, 0, 0);
	for (int i = 0; i < PER / 2 * VLEN; i++)
		v[i] = 1.0f;
	if (!bad && (rc = ferry_push(w, t, next, PER / 2, v)))
		bad = sp_fail(sp, rank, "push", next[0], rc, 0, 0);
	pthread_barrier_wait(&sp->bar);
	/* 4. every node reads every key of every rank exactly */
	for (int r = 0; r < NODES && !bad; r++) {
		uint64_t k[PER];

		keys_of(r, k);
		rc = ferry_pull(w, t, k, PER, v);
		if (rc) {
			bad = sp_fail(sp, rank, "pull after the moves", k[0], rc, 0, 0);
			break;
		}
		for (int i = 0; i < PER && !bad; i++)
			for (int j = 0; j < VLEN; j++) {
				float e = val(k[i], (uint32_t)j) + (i < PER / 2 ? 1.0f : 0.0f);

				if (v[i * VLEN + j] != e) {
					bad = sp_fail(sp, rank, "value after the moves", k[i], 0,
						      v[i * VLEN + j], e);
					break;
				}
			}
	}
	pthread_barrier_wait(&sp->bar);
	ferry_worker_destroy(w);
	free(v);
	return bad;
}

Test(sparse, keys_from_the_whole_space_start_at_their_initial_value_and_move, .timeout = 300)
{
	struct sp sp = { .tp = { .sparse = 1,
				 .value_len = VLEN,
				 .placement = FERRY_PLACEMENT_HASH,
				 .init = FERRY_INIT_UNIFORM,
				 .init_a = -0.5f,
				 .init_b = 0.5f,
				 .init_seed = 20261123 } };
	struct ferry_table_stats st;
	uint64_t owned = 0, away = 0;
	struct tc c;

	/* the keys are distinct (the test's own premise) */
	{
		uint64_t *all = malloc(NODES * PER * sizeof(*all));

		cr_assert_not_null(all);
		for (int r = 0; r < NODES; r++)
			keys_of(r, all + r * PER);
		for (int i = 0; i < NODES * PER; i++)
			for (int j = i + 1; j < NODES * PER; j++)
				cr_assert_neq(all[i], all[j]);
		free(all);
	}
	pthread_barrier_init(&sp.bar, NULL, NODES);
	cr_assert_eq(tc_open(&c, NODES, &sp.tp, 20000), 0);
	cr_assert_eq(tc_run(&c, node_main, &sp), 0, "%s", sp.why);
	/* every key written lives on exactly one node; the nodes hold nothing
	 * for keys they never owned or homed away (the directory's maps hold
	 * what they count, the cache is fixed) */
	for (int r = 0; r < NODES; r++) {
		cr_assert_eq(ferry_table_stats(c.t[r], &st), 0);
		owned += st.keys_owned;
		away += st.keys_away;
		cr_assert_leq(st.keys_owned, (uint64_t)(PER * 3 / 2 + PER / 2),
			      "rank %d owns %llu keys", r, (unsigned long long)st.keys_owned);
		/* 16-byte buckets, a map shrinks once under 1/16 full: at most
		 * 256 B per key (owned or away; 32-64 after growth), each map
		 * 16 KiB at least, plus the 1 MiB location cache */
		cr_assert_leq(st.dir_bytes,
			      (st.keys_owned + st.keys_away) * 256 + 2 * 16448 + (1u << 20),
			      "rank %d: directory of %llu bytes for %llu keys", r,
			      (unsigned long long)st.dir_bytes,
			      (unsigned long long)(st.keys_owned + st.keys_away));
	}
	cr_assert_eq(owned, (uint64_t)(NODES * PER), "%llu keys live, %d written",
		     (unsigned long long)owned, NODES * PER);
	/* the slots of the keys that moved off a node come back for reuse once
	 * their grace period passed (call_rcu: poll, bounded), and never more
	 * of them than the arena has */
	for (int tries = 0;; tries++) {
		uint64_t free_slots = 0;

		for (int r = 0; r < NODES; r++) {
			cr_assert_eq(ferry_table_stats(c.t[r], &st), 0);
			cr_assert_leq(st.slots_free + st.keys_owned, st.slots, "rank %d", r);
			free_slots += st.slots_free;
		}
		if (free_slots)
			break;
		cr_assert_lt(tries, 500, "no slot came back in 5 s after %llu keys moved",
			     (unsigned long long)away);
		usleep(10000);
	}
	/* the transport's buffers follow what is in flight: with the traffic
	 * over, every node's go back within two trims of 100 ms
	 * (docs/transport-tcp.md, "Memory"; a transport that does not report
	 * them says 0); polled for 3 s, a heartbeat may come meanwhile */
	for (int r = 0; r < NODES; r++) {
		struct ferry_stats ns;
		int tries = 0;

		for (;; tries++) {
			cr_assert_eq(ferry_stats(c.fy[r], &ns), 0);
			if (!ns.tp_buffer_bytes || tries == 300)
				break;
			usleep(10000);
		}
		cr_expect_eq(ns.tp_buffer_bytes, 0,
			     "rank %d: the transport holds %llu bytes of buffers 3 s after the "
			     "traffic ended",
			     r, (unsigned long long)ns.tp_buffer_bytes);
	}
	/* keys moved off their home have a record there (a key moved to its
	 * own home has none) */
	cr_assert_leq(away, (uint64_t)(NODES * PER / 2));
	cr_assert_geq(away, (uint64_t)(NODES * PER / 2 / 2), "only %llu moved keys recorded",
		      (unsigned long long)away);
	tc_close(&c);
	pthread_barrier_destroy(&sp.bar);
}

/* the same seed gives the same values in another cluster (another run);
 * another seed does not; a normal initializer has about its mean and
 * standard deviation */
Test(sparse, initial_values_agree_across_runs_and_follow_their_law, .timeout = 120)
{
	struct ferry_table_params tp = { .sparse = 1,
					 .value_len = 64,
					 .init = FERRY_INIT_NORMAL,
					 .init_a = 1.0f,
					 .init_b = 2.0f,
					 .init_seed = 7 };
	uint64_t keys[64];
	float *a = malloc(64 * 64 * sizeof(float)), *b = malloc(64 * 64 * sizeof(float));
	double sum = 0, sq = 0;
	struct ferry_worker *w;
	struct tc c;

	cr_assert(a && b);
	for (int i = 0; i < 64; i++)
		keys[i] = 0xabcdef0123456789ull * (uint64_t)(i + 1);
	for (int run = 0; run < 3; run++) {
		float *out = run ? b : a;

		tp.init_seed = run == 2 ? 8 : 7;
		cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
		cr_assert_eq(ferry_worker_create(c.fy[run & 1], &w), 0);
		cr_assert_eq(ferry_pull(w, c.t[run & 1], keys, 64, out), 0);
		ferry_worker_destroy(w);
		tc_close(&c);
		if (run == 1)
			cr_assert_eq(memcmp(a, b, 64 * 64 * sizeof(float)), 0,
				     "two runs with one seed disagree");
	}
	cr_assert_neq(memcmp(a, b, 64 * 64 * sizeof(float)), 0, "another seed, the same values");
	for (int i = 0; i < 64 * 64; i++) {
		sum += a[i];
		sq += (double)a[i] * a[i];
	}
	sum /= 64 * 64;
	sq = sqrt(sq / (64 * 64) - sum * sum);
	cr_assert(fabs(sum - 1.0) < 0.15 && fabs(sq - 2.0) < 0.15, "mean %g, sd %g", sum, sq);
	free(a);
	free(b);
}

/* a node's capacity bounds the sparse keys it makes; the others go on */
Test(sparse, a_full_node_refuses_new_keys_and_keeps_what_it_has, .timeout = 120)
{
	struct ferry_table_params tp = {
		.sparse = 1, .value_len = 2, .placement = FERRY_PLACEMENT_RANGE, .capacity = 200
	};
	uint64_t keys[300];
	float v[600];
	struct ferry_worker *w;
	struct tc c;
	int rc;

	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	for (int i = 0; i < 300; i++) {
		keys[i] = (uint64_t)i * 1000003; /* all in rank 0's half of the space */
		v[2 * i] = (float)i;
		v[2 * i + 1] = -(float)i;
	}
	cr_assert_eq(ferry_table_home(c.t[0], keys[299]), 0);
	cr_assert_eq(ferry_set(w, c.t[0], keys, 200, v), 0);
	rc = ferry_set(w, c.t[0], keys + 200, 100, v + 400);
	cr_assert_eq(rc, -ENOSPC, "a set past the capacity gave %d", rc);
	cr_assert_eq(ferry_pull(w, c.t[0], keys, 200, v), 0);
	for (int i = 0; i < 200; i++)
		cr_assert(v[2 * i] == (float)i && v[2 * i + 1] == -(float)i, "key %d", i);
	/* a key of rank 1 still comes into being */
	keys[0] = UINT64_MAX;
	cr_assert_eq(ferry_table_home(c.t[0], keys[0]), 1);
	cr_assert_eq(ferry_set(w, c.t[0], keys, 1, v), 0);
	ferry_worker_destroy(w);
	tc_close(&c);
}

/* bad parameters: each a negative errno (and a log line naming the fix) */
Test(sparse, bad_parameters_are_refused)
{
	struct ferry_table_params tp = { .sparse = 1, .value_len = 4 };
	struct ferry_table *t;
	struct tc c;

	cr_assert_eq(tc_open(&c, 1, NULL, 5000), 0);
	tp.num_keys = 10;
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "sparse with num_keys");
	tp.num_keys = 0;
	tp.value_len = 0;
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "sparse with value_len 0");
	tp.value_len = 4;
	tp.init = (enum ferry_init)9;
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "initializer 9");
	tp.init = FERRY_INIT_UNIFORM;
	tp.init_a = 1.0f;
	tp.init_b = 0.0f;
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "uniform [1, 0)");
	tp.init = FERRY_INIT_NORMAL;
	tp.init_b = NAN;
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "normal with sd NaN");
	tp.init = FERRY_INIT_ZERO;
	tp.sparse = 2;
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "sparse = 2");
	tp.sparse = 0;
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "dense with no keys");
	tc_close(&c);
}

struct mismatch {
	struct ferry_table_params tp[2];
	int rc[2];
};

static int mismatch_node(struct tc *c, int rank, void *arg)
{
	struct mismatch *m = arg;
	struct ferry_table *t = NULL;

	m->rc[rank] = ferry_table_create(c->fy[rank], &m->tp[rank], &t);
	if (!m->rc[rank])
		ferry_table_destroy(t);
	return 0;
}

/* nodes that disagree on the seed (or on sparse) all fail the create */
Test(sparse, nodes_that_disagree_on_the_initializer_fail_the_create, .timeout = 120)
{
	struct mismatch m = { .tp = { { .sparse = 1, .value_len = 4, .init_seed = 1 },
				      { .sparse = 1, .value_len = 4, .init_seed = 2 } } };
	struct tc c;

	cr_assert_eq(tc_open(&c, 2, NULL, 10000), 0);
	cr_assert_eq(tc_run(&c, mismatch_node, &m), 0);
	cr_assert_eq(m.rc[0], -FERRY_E_MISMATCH, "rank 0: %d", m.rc[0]);
	cr_assert_eq(m.rc[1], -FERRY_E_MISMATCH, "rank 1: %d", m.rc[1]);
	m.tp[1] = (struct ferry_table_params){ .num_keys = 1000, .value_len = 4, .init_seed = 1 };
	cr_assert_eq(tc_run(&c, mismatch_node, &m), 0);
	cr_assert_eq(m.rc[0], -FERRY_E_MISMATCH, "rank 0: %d", m.rc[0]);
	cr_assert_eq(m.rc[1], -FERRY_E_MISMATCH, "rank 1: %d", m.rc[1]);
	tc_close(&c);
}

/*
 * The arena is registered a chunk (2 MiB of slots) at a time as keys come
 * into being, not for its whole capacity; peers learn each chunk's rkey
 * (CHUNK) before a hint into it, so pulls of keys in the newest chunk are
 * one-sided. Transports that register nothing (tcp) report 0 registered.
 */
Test(sparse, registered_memory_follows_the_slots_in_use, .timeout = 120)
{
	enum {
		N = 70000,
		B = 4096
	};
	struct ferry_table_params tp = {
		.sparse = 1, .value_len = 4, .placement = FERRY_PLACEMENT_HASH, .capacity = 1u << 20
	};
	struct ferry_table_stats s0, s1;
	struct ferry_stats n0, n1;
	uint64_t *keys = malloc(N * sizeof(*keys)), x = 0x2545f4914f6cdd1dull;
	float *v = calloc((size_t)B * 4, sizeof(float));
	struct ferry_worker *w0, *w1;
	uint64_t chunk;
	struct tc c;

	cr_assert(keys && v);
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	cr_assert_eq(ferry_table_stats(c.t[0], &s0), 0);
	cr_assert_eq(s0.slot_bytes, 64);
	chunk = (2u << 20) / s0.slot_bytes; /* slots per chunk */
	for (int i = 0; i < N;) {
		if (ferry_table_home(c.t[0], tc_rand(&x)) == 0)
			keys[i++] = x;
	}
	for (int i = 0; i < N; i += B)
		cr_assert_eq(ferry_set(w0, c.t[0], keys + i, N - i < B ? N - i : B, v), 0);
	cr_assert_eq(ferry_table_stats(c.t[0], &s1), 0);
	cr_assert_eq(s1.keys_owned, N);
	if (!s0.registered_bytes && !s1.registered_bytes) {
		cr_log_info("this transport registers no memory: nothing more to check");
	} else {
		uint64_t chunks = (N + chunk - 1) / chunk;

		cr_assert_eq(s1.registered_bytes - s0.registered_bytes, chunks * chunk * 64,
			     "registered %llu bytes more for %d keys (chunks of %llu slots)",
			     (unsigned long long)(s1.registered_bytes - s0.registered_bytes), N,
			     (unsigned long long)chunk);
		cr_assert_lt(s1.registered_bytes, s1.slots * s1.slot_bytes / 4,
			     "the whole capacity is registered");
		/* the last keys sit in the newest chunk: after one pull that teaches
		 * the hint, node 1 reads them one-sided */
		cr_assert_eq(ferry_pull(w1, c.t[1], keys + N - 100, 100, v), 0);
		ferry_stats(c.fy[1], &n0);
		for (int i = N - 100; i < N; i++) /* single pulls: big batches go by message */
			cr_assert_eq(ferry_pull(w1, c.t[1], keys + i, 1, v), 0);
		ferry_stats(c.fy[1], &n1);
		cr_assert_eq(n1.onesided_reads - n0.onesided_reads, 100,
			     "reads %llu fallbacks %llu msgs %llu",
			     (unsigned long long)(n1.onesided_reads - n0.onesided_reads),
			     (unsigned long long)(n1.onesided_fallbacks - n0.onesided_fallbacks),
			     (unsigned long long)(n1.msgs_sent - n0.msgs_sent));
		cr_assert_eq(n1.onesided_fallbacks, n0.onesided_fallbacks);
	}
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	tc_close(&c);
	free(keys);
	free(v);
}

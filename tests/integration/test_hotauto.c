/* SPDX-License-Identifier: MIT */
/*
 * Integration: hot_auto (lib/cons/hotauto.c, docs/consistency.md "Hot
 * keys"): hot keys chosen from what the nodes access, 4 nodes x 2 workers
 * as threads and as processes, over tcp (and loop: ctest's
 * test_hotauto_loop).
 *
 * Two phases, each ended by ferry_hot_update() on every node: in the first
 * most operations go to the keys of set A, in the second to those of set B.
 * After each update every node has exactly that set as its hot keys, and
 * after the second the keys of A are plain again. Every worker pushes +1 to
 * random keys (hot or not, alone and mixed in one call), pulls and
 * localizes; after each update, and at the end after a flush and a barrier,
 * every node reads exactly the pushes counted for every key: a value moved
 * between a slot and the replicas loses and doubles nothing.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cluster.h"
#include "lib/cons/cons.h"
#include "lib/core/core.h"

#define NODES 4
#define WPN 2
#define KEYS 256
#define VLEN 2
#define NAUTO 8
/* operations per worker and phase; FERRY_TEST_HOTAUTO_ITERS sets another
 * count (the SoftRoCE VM, which emulates its CPUs, runs fewer) */
static int iters(void)
{
	return tc_env_count("FERRY_TEST_HOTAUTO_ITERS", 1500);
}

/* sorted: what ferry_hot_keys() gives back */
static const uint64_t set_a[NAUTO] = { 5, 11, 77, 99, 130, 150, 200, 240 };
static const uint64_t set_b[NAUTO] = { 2, 40, 63, 101, 128, 177, 203, 255 };

static void auto_params(struct ferry_table_params *tp)
{
	memset(tp, 0, sizeof(*tp));
	tp->consistency = FERRY_CONS_SEQUENTIAL;
	tp->num_keys = KEYS;
	tp->value_len = VLEN;
	tp->placement = FERRY_PLACEMENT_HASH;
	tp->mode = FERRY_MODE_DYNAMIC;
	tp->hot_auto = NAUTO;
	tp->hot_sync_ms = 5;
}

struct au_run {
	/* every node's workers are done (process-shared): not ferry_barrier,
	 * which would flush an EVENTUAL table's buffered pushes itself, and
	 * the update must */
	pthread_barrier_t phase;
	_Atomic uint64_t pushed[KEYS];
	atomic_int errors;
	char why[256];
};

static void au_phase_init(struct au_run *run)
{
	pthread_barrierattr_t ba;

	pthread_barrierattr_init(&ba);
	pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
	cr_assert_eq(pthread_barrier_init(&run->phase, &ba, NODES), 0);
	pthread_barrierattr_destroy(&ba);
}

static void au_note(struct au_run *run, const char *what, int rc)
{
	if (atomic_fetch_add(&run->errors, 1) == 0)
		snprintf(run->why, sizeof(run->why), "%s: %s", what, ferry_strerror(rc));
}

struct au_arg {
	struct tc *c;
	struct au_run *run;
	const uint64_t *set;
	int rank, j, phase;
};

static void *au_worker(void *p)
{
	struct au_arg *a = p;
	struct au_run *run = a->run;
	struct ferry_table *t = a->c->t[a->rank];
	struct ferry_worker *w;
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(a->j + 1 + 100 * a->phase);
	int rc = ferry_worker_create(a->c->fy[a->rank], &w);

	if (rc) {
		au_note(run, "worker", rc);
		return NULL;
	}
	for (int it = 0, n = iters(); it < n; it++) {
		uint64_t r = tc_rand(&seed) % 16, k;
		float d[2 * VLEN] = { 1, 1, 1, 1 }, v[2 * VLEN];

		/* 3 of 4 operations on a key of the phase's set */
		k = tc_rand(&seed) % 4 ? a->set[tc_rand(&seed) % NAUTO] : tc_rand(&seed) % KEYS;
		if (r < 8) {
			rc = ferry_push(w, t, &k, 1, d);
			if (rc)
				au_note(run, "push", rc);
			atomic_fetch_add(&run->pushed[k], 1);
		} else if (r < 10) {
			uint64_t ks[2] = { k, tc_rand(&seed) % KEYS };

			if (ks[1] == ks[0])
				ks[1] = (ks[1] + 1) % KEYS;
			rc = ferry_push(w, t, ks, 2, d);
			if (rc)
				au_note(run, "mixed push", rc);
			for (int i = 0; i < 2; i++)
				atomic_fetch_add(&run->pushed[ks[i]], 1);
			rc = ferry_pull(w, t, ks, 2, v);
			if (rc)
				au_note(run, "mixed pull", rc);
		} else if (r < 14) {
			rc = ferry_pull(w, t, &k, 1, v);
			if (rc)
				au_note(run, "pull", rc);
		} else {
			rc = ferry_localize(w, t, &k, 1);
			if (rc)
				au_note(run, "localize", rc);
		}
	}
	ferry_worker_destroy(w);
	return NULL;
}

/* every key reads exactly what was pushed to it */
static int au_exact(struct tc *c, int rank, struct ferry_worker *w, struct au_run *run,
		    const char *when)
{
	uint64_t keys[KEYS];
	float vals[KEYS * VLEN];
	int rc;

	for (int k = 0; k < KEYS; k++)
		keys[k] = (uint64_t)k;
	rc = ferry_pull(w, c->t[rank], keys, KEYS, vals);
	if (rc) {
		au_note(run, "final pull", rc);
		return rc;
	}
	for (int k = 0; k < KEYS * VLEN; k++)
		if (vals[k] != (float)atomic_load(&run->pushed[k / VLEN])) {
			/* stderr: this may run in a forked node */
			fprintf(stderr, "rank %d, %s: key %d is %g, pushed %llu\n", rank, when,
				k / VLEN, (double)vals[k],
				(unsigned long long)atomic_load(&run->pushed[k / VLEN]));
			return -2;
		}
	return 0;
}

/* the node's hot keys are exactly @want (NULL: none) */
static int au_keys_are(struct tc *c, int rank, const uint64_t *want, const char *when)
{
	uint64_t got[NAUTO + 1];
	int n = ferry_hot_keys(c->t[rank], got, NAUTO + 1);

	if (n != (want ? NAUTO : 0) || (want && memcmp(got, want, sizeof(set_a)))) {
		fprintf(stderr, "rank %d, %s: %d hot keys", rank, when, n);
		for (int i = 0; i < n && i <= NAUTO; i++)
			fprintf(stderr, " %llu", (unsigned long long)got[i]);
		fprintf(stderr, "\n");
		return -3;
	}
	return 0;
}

/* one node: phase A, update, check; phase B, update, check; the end */
static int au_node(struct tc *c, int rank, void *arg)
{
	struct au_run *run = arg;
	const uint64_t *sets[2] = { set_a, set_b };
	struct ferry_worker *w;
	int rc = au_keys_are(c, rank, NULL, "at the start");

	if (rc)
		return rc;
	rc = ferry_worker_create(c->fy[rank], &w);
	if (rc)
		return rc;
	for (int ph = 0; ph < 2 && !rc; ph++) {
		struct au_arg a[WPN];
		pthread_t th[WPN];
		char when[64];

		for (int i = 0; i < WPN; i++) {
			a[i] = (struct au_arg){ .c = c,
						.run = run,
						.set = sets[ph],
						.rank = rank,
						.j = rank * WPN + i,
						.phase = ph };
			pthread_create(&th[i], NULL, au_worker, &a[i]);
		}
		for (int i = 0; i < WPN; i++)
			pthread_join(th[i], NULL);
		/* every node's workers are done before any node updates */
		pthread_barrier_wait(&run->phase);
		rc = ferry_hot_update(w, c->t[rank]);
		snprintf(when, sizeof(when), "after update %d", ph + 1);
		if (!rc)
			rc = au_keys_are(c, rank, sets[ph], when);
		/* every value read in place, before any node pushes again */
		if (!rc)
			rc = au_exact(c, rank, w, run, when);
		if (!rc)
			rc = ferry_barrier(c->fy[rank]);
	}
	if (!rc)
		rc = ferry_flush(w, c->t[rank]);
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	if (!rc)
		rc = au_exact(c, rank, w, run, "at the end");
	/* no node destroys the table while another still reads */
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	ferry_worker_destroy(w);
	return rc;
}

static void au_totals(struct au_run *run)
{
	uint64_t a = 0, b = 0;

	for (int i = 0; i < NAUTO; i++) {
		a += atomic_load(&run->pushed[set_a[i]]);
		b += atomic_load(&run->pushed[set_b[i]]);
	}
	/* a phase's set gets about 3/4 of its half of the pushes */
	cr_assert_gt(a, (uint64_t)NODES * WPN * (uint64_t)iters() / 4,
		     "too few pushes to set A: %llu", (unsigned long long)a);
	cr_assert_gt(b, (uint64_t)NODES * WPN * (uint64_t)iters() / 4,
		     "too few pushes to set B: %llu", (unsigned long long)b);
}

static void au_threads(enum ferry_consistency model)
{
	struct ferry_table_params tp;
	struct au_run *run = calloc(1, sizeof(*run));
	struct tc c;

	au_phase_init(run);
	auto_params(&tp);
	tp.consistency = model;
	cr_assert_eq(tc_open(&c, NODES, &tp, 20000), 0);
	cr_assert_eq(tc_run(&c, au_node, run), 0, "a node's hot keys or sums were wrong: %s",
		     run->why);
	cr_assert_eq(atomic_load(&run->errors), 0, "%s", run->why);
	au_totals(run);
	for (int r = 0; r < NODES; r++) {
		struct ferry_hot_stats st;

		cr_assert_eq(ferry__hot_stats(c.t[r], &st), 0);
		cr_assert_eq(st.updates, 2);
		cr_assert_eq(st.keys, NAUTO);
		cr_assert_gt(st.pushes, 0, "rank %d pushed nothing to a hot key", r);
	}
	tc_close(&c);
	pthread_barrier_destroy(&run->phase);
	free(run);
}

Test(hotauto, the_keys_used_most_become_hot_and_every_push_is_kept, .timeout = 180)
{
	au_threads(FERRY_CONS_SEQUENTIAL);
}

/* EVENTUAL: the plain keys' pushes are buffered; the update flushes them,
 * and its barrier drops the copies read before it */
Test(hotauto, the_same_on_an_eventual_table, .timeout = 180)
{
	au_threads(FERRY_CONS_EVENTUAL);
}

Test(hotauto, the_same_with_nodes_as_processes, .timeout = 180)
{
	struct au_run *run =
		mmap(NULL, sizeof(*run), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_table_params tp;

	cr_assert_neq(run, MAP_FAILED);
	memset(run, 0, sizeof(*run));
	au_phase_init(run);
	auto_params(&tp);
	tc_procs_run(NODES, &tp, 20000, au_node, run,
		     "a node's hot keys or sums were wrong, or it failed");
	cr_assert_eq(atomic_load(&run->errors), 0, "%s", run->why);
	au_totals(run);
	munmap(run, sizeof(*run));
}

/* ---- refused ---- */

static atomic_int bad_logged;

static void bad_log(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	if (level <= FERRY_LOG_ERROR && strstr(msg, "hot"))
		atomic_fetch_add(&bad_logged, 1);
}

static int mismatch_node(struct tc *c, int rank, void *arg)
{
	struct ferry_table_params tp;
	struct ferry_table *t = NULL;
	int rc;

	(void)arg;
	auto_params(&tp);
	if (rank == 1)
		tp.hot_auto = NAUTO + 1;
	rc = ferry_table_create(c->fy[rank], &tp, &t);
	if (t)
		ferry_table_destroy(t);
	return rc == -FERRY_E_MISMATCH ? 0 : -1;
}

Test(hotauto, bad_parameters_and_calls_are_refused_with_a_log_line, .timeout = 60)
{
	struct ferry_table_params tp;
	struct ferry_table *t;
	struct ferry_worker *w;
	uint64_t one = 3, k;
	struct tc c;

	cr_assert_eq(tc_open(&c, 2, NULL, 10000), 0);
	ferry_log_set(FERRY_LOG_WARN, bad_log, NULL);

#define REFUSED(mod)                                                                     \
	do {                                                                             \
		int before = atomic_load(&bad_logged);                                   \
		auto_params(&tp);                                                        \
		mod;                                                                     \
		cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "%s", #mod); \
		cr_assert_gt(atomic_load(&bad_logged), before, "no log line: %s", #mod); \
	} while (0)

	REFUSED(tp.hot_keys = &one; tp.hot_count = 1);
	REFUSED(tp.hot_auto = FERRY_HOT_MAX + 1);
	REFUSED(tp.consistency = FERRY_CONS_SSP; tp.staleness = 2);
	REFUSED(tp.consistency = FERRY_CONS_ESSP; tp.staleness = 2);
	REFUSED(tp.push_codec = FERRY_CODEC_BF16);
	REFUSED(tp.sparse = 1; tp.num_keys = 0);
	REFUSED(tp.hot_sync_ms = 60001);
#undef REFUSED
	/* every node must give the same hot_auto */
	cr_assert_eq(tc_run(&c, mismatch_node, NULL), 0);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	tc_close(&c);

	/* calls on a table without hot_auto, and a NULL buffer */
	auto_params(&tp);
	tp.hot_auto = 0;
	tp.hot_sync_ms = 0;
	cr_assert_eq(tc_open(&c, 2, &tp, 10000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	ferry_log_set(FERRY_LOG_WARN, bad_log, NULL);
	{
		int before = atomic_load(&bad_logged);

		cr_assert_eq(ferry_hot_update(w, c.t[0]), -EINVAL);
		cr_assert_eq(ferry_hot_update(w, NULL), -EINVAL);
		cr_assert_eq(ferry_hot_keys(NULL, &k, 1), -EINVAL);
		cr_assert_eq(ferry_hot_keys(c.t[0], NULL, 1), -EINVAL);
		cr_assert_gt(atomic_load(&bad_logged), before + 3, "a refusal without a log line");
	}
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	cr_assert_eq(ferry_hot_keys(c.t[0], NULL, 0), 0, "a table without hot keys has none");
	ferry_worker_destroy(w);
	tc_close(&c);

	/* a hot_auto table is not checkpointed (its replicas are not held) */
	auto_params(&tp);
	cr_assert_eq(tc_open(&c, 2, &tp, 10000), 0);
	cr_assert_eq(ferry_table_checkpoint(c.t[0], "/tmp/ferry-hotauto-ckpt"), -EOPNOTSUPP);
	tc_close(&c);
}

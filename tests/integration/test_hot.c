/* SPDX-License-Identifier: MIT */
/*
 * Integration: hot keys (lib/cons/hot.c, docs/consistency.md "Hot keys"),
 * 4 nodes x 2 workers as threads and as processes, over tcp (and loop:
 * ctest's test_hot_loop).
 *
 * Exact sums: every worker pushes +1 to random keys, hot and not, alone and
 * in calls that mix both, pulls (a read of a hot key holds at least the
 * node's own pushes) and localizes keys (hot ones too: a no-op); after each
 * node's ferry_flush and a barrier every node reads exactly the pushes
 * counted, for every key. Again with FERRY_CONS_FAULT_EVERY (frames lost
 * before and after they are applied): still exact, and frames were sent
 * again and refused a second application.
 *
 * Read bound: a delta pushed on one node is in another's replica within the
 * sync interval plus a margin.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "lib/cons/cons.h"
#include "lib/cons/hot.h"
#include "lib/core/core.h"

#define NODES 4
#define WPN 2
#define NW (NODES * WPN)
#define KEYS 64
#define NHOT 8
#define VLEN 2
/* operations per worker; FERRY_TEST_HOT_ITERS sets another count (the
 * SoftRoCE VM, which emulates its CPUs, runs fewer) */
static int iters(void)
{
	return tc_env_count("FERRY_TEST_HOT_ITERS", 2000);
}

static const uint64_t hot_keys[NHOT] = { 60, 3, 17, 9, 33, 41, 0, 50 };

static bool is_hot(uint64_t k)
{
	for (int i = 0; i < NHOT; i++)
		if (hot_keys[i] == k)
			return true;
	return false;
}

static void hot_params(struct ferry_table_params *tp, enum ferry_consistency m, uint32_t sync_ms)
{
	memset(tp, 0, sizeof(*tp));
	tp->num_keys = KEYS;
	tp->value_len = VLEN;
	tp->placement = FERRY_PLACEMENT_HASH;
	tp->mode = FERRY_MODE_DYNAMIC;
	tp->consistency = m;
	tp->hot_keys = hot_keys;
	tp->hot_count = NHOT;
	tp->hot_sync_ms = sync_ms;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- exact sums ---- */

struct ex_run {
	_Atomic uint64_t pushed[KEYS];
	atomic_int errors;
	atomic_int own_bad;
	atomic_int localized;
	char why[256];
};

struct ex_arg {
	struct tc *c;
	struct ex_run *run;
	int rank, j;
};

static void ex_note(struct ex_run *run, const char *what, int rc)
{
	if (atomic_fetch_add(&run->errors, 1) == 0)
		snprintf(run->why, sizeof(run->why), "%s: %s", what, ferry_strerror(rc));
}

static void *ex_worker(void *p)
{
	struct ex_arg *a = p;
	struct ex_run *run = a->run;
	struct ferry_table *t = a->c->t[a->rank];
	struct ferry_worker *w;
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(a->j + 1), own[KEYS] = { 0 };
	int rc;

	rc = ferry_worker_create(a->c->fy[a->rank], &w);
	if (rc) {
		ex_note(run, "worker", rc);
		return NULL;
	}
	for (int it = 0, n = iters(); it < n; it++) {
		uint64_t r = tc_rand(&seed) % 16, k;
		float d[2 * VLEN] = { 1, 1, 1, 1 }, v[2 * VLEN];

		/* half of the operations on a hot key */
		k = tc_rand(&seed) % 2 ? hot_keys[tc_rand(&seed) % NHOT] : tc_rand(&seed) % KEYS;
		if (r < 8) {
			rc = ferry_push(w, t, &k, 1, d);
			if (rc)
				ex_note(run, "push", rc);
			own[k]++;
			atomic_fetch_add(&run->pushed[k], 1);
		} else if (r < 10) {
			/* a hot and a plain key in one call */
			uint64_t ks[2] = { hot_keys[tc_rand(&seed) % NHOT], tc_rand(&seed) % KEYS };

			rc = ferry_push(w, t, ks, 2, d);
			if (rc)
				ex_note(run, "mixed push", rc);
			for (int i = 0; i < 2; i++) {
				own[ks[i]]++;
				atomic_fetch_add(&run->pushed[ks[i]], 1);
			}
			rc = ferry_pull(w, t, ks, 2, v);
			if (rc)
				ex_note(run, "mixed pull", rc);
			if (v[0] < (float)own[ks[0]] || v[1] != v[0] || v[3] != v[2])
				atomic_fetch_add(&run->own_bad, 1);
		} else if (r < 14) {
			rc = ferry_pull(w, t, &k, 1, v);
			if (rc)
				ex_note(run, "pull", rc);
			/* the node's replica holds its own pushes at once */
			if (is_hot(k) && v[0] < (float)own[k])
				atomic_fetch_add(&run->own_bad, 1);
		} else {
			rc = ferry_localize(w, t, &k, 1);
			if (rc)
				ex_note(run, "localize", rc);
			else
				atomic_fetch_add(&run->localized, 1);
		}
	}
	rc = ferry_flush(w, t);
	if (rc)
		ex_note(run, "flush", rc);
	ferry_worker_destroy(w);
	return NULL;
}

static int ex_node(struct tc *c, int rank, void *arg)
{
	struct ex_run *run = arg;
	struct ex_arg a[WPN];
	pthread_t th[WPN];

	for (int i = 0; i < WPN; i++) {
		a[i] = (struct ex_arg){ .c = c, .run = run, .rank = rank, .j = rank * WPN + i };
		pthread_create(&th[i], NULL, ex_worker, &a[i]);
	}
	for (int i = 0; i < WPN; i++)
		pthread_join(th[i], NULL);
	return ferry_barrier(c->fy[rank]);
}

static int ex_check(struct tc *c, int rank, void *arg)
{
	struct ex_run *run = arg;
	struct ferry_worker *w;
	uint64_t keys[KEYS];
	float vals[KEYS * VLEN];
	int rc;

	for (int k = 0; k < KEYS; k++)
		keys[k] = (uint64_t)k;
	if (ferry_worker_create(c->fy[rank], &w))
		return -1;
	rc = ferry_pull(w, c->t[rank], keys, KEYS, vals);
	for (int k = 0; k < KEYS * VLEN && !rc; k++)
		if (vals[k] != (float)atomic_load(&run->pushed[k / VLEN])) {
			/* stderr: this may run in a forked node */
			fprintf(stderr, "rank %d key %d%s: %g, pushed %llu\n", rank, k / VLEN,
				is_hot((uint64_t)k / VLEN) ? " (hot)" : "", (double)vals[k],
				(unsigned long long)atomic_load(&run->pushed[k / VLEN]));
			rc = -2;
		}
	ferry_worker_destroy(w);
	return rc ? rc : ferry_barrier(c->fy[rank]);
}

static void ex_totals(struct ex_run *run)
{
	uint64_t hot = 0, all = 0;

	for (int k = 0; k < KEYS; k++) {
		all += atomic_load(&run->pushed[k]);
		if (is_hot((uint64_t)k))
			hot += atomic_load(&run->pushed[k]);
	}
	cr_assert_gt(hot, (uint64_t)NW * (uint64_t)iters() / 4, "too few pushes of hot keys: %llu",
		     (unsigned long long)hot);
	cr_assert_gt(all - hot, (uint64_t)NW * (uint64_t)iters() / 8);
	cr_assert_gt(atomic_load(&run->localized), NW * iters() / 16);
}

static void ex_threads(enum ferry_consistency m, uint32_t sync_ms, const char *fault)
{
	struct ferry_table_params tp;
	struct ex_run *run = calloc(1, sizeof(*run));
	struct ferry_hot_stats sum = { 0 };
	struct tc c;

	if (fault)
		setenv("FERRY_CONS_FAULT_EVERY", fault, 1);
	hot_params(&tp, m, sync_ms);
	cr_assert_eq(tc_open(&c, NODES, &tp, 20000), 0);
	unsetenv("FERRY_CONS_FAULT_EVERY");
	cr_assert_eq(tc_run(&c, ex_node, run), 0);
	cr_assert_eq(atomic_load(&run->errors), 0, "%s", run->why);
	cr_assert_eq(atomic_load(&run->own_bad), 0, "a read lacked this node's own pushes");
	ex_totals(run);
	cr_assert_eq(tc_run(&c, ex_check, run), 0, "a node read other than the exact sum");
	for (int r = 0; r < NODES; r++) {
		struct ferry_hot_stats st;

		cr_assert_eq(ferry__hot_stats(c.t[r], &st), 0);
		cr_assert_eq(st.keys, NHOT);
		sum.pushes += st.pushes;
		sum.reads += st.reads;
		sum.batches += st.batches;
		sum.frames_sent += st.frames_sent;
		sum.frames_resent += st.frames_resent;
		sum.frames_applied += st.frames_applied;
		sum.frames_again += st.frames_again;
	}
	/* each frame went to the 3 others, and was applied once at each */
	cr_assert_eq(sum.frames_applied, (NODES - 1) * sum.frames_sent);
	if (fault) {
		cr_assert_gt(sum.frames_resent, 0, "no frame was sent again: no fault injected?");
		cr_assert_gt(sum.frames_again, 0, "no frame came again after its answer was lost");
	}
	cr_log_info("hot: %llu pushes, %llu reads of hot keys; %llu batches, %llu frames, %llu "
		    "sent again, %llu applied, %llu refused as applied before",
		    (unsigned long long)sum.pushes, (unsigned long long)sum.reads,
		    (unsigned long long)sum.batches, (unsigned long long)sum.frames_sent,
		    (unsigned long long)sum.frames_resent, (unsigned long long)sum.frames_applied,
		    (unsigned long long)sum.frames_again);
	tc_close(&c);
	free(run);
}

Test(hot, sums_are_exact_after_flush_and_barrier, .timeout = 120)
{
	ex_threads(FERRY_CONS_SEQUENTIAL, 5, NULL);
}

Test(hot, sums_are_exact_on_an_eventual_table, .timeout = 120)
{
	ex_threads(FERRY_CONS_EVENTUAL, 5, NULL);
}

static void quiet_log(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	if (level <= FERRY_LOG_ERROR && !strstr(msg, "fault injection"))
		fprintf(stderr, "%s\n", msg);
}

Test(hot, lost_frames_and_answers_lose_and_double_nothing, .timeout = 180)
{
	ferry_log_set(FERRY_LOG_WARN, quiet_log, NULL);
	ex_threads(FERRY_CONS_SEQUENTIAL, 2, "5");
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
}

/* one process's node: the storm, then its check */
static int ex_proc(struct tc *c, int rank, void *arg)
{
	struct ex_run *run = arg;
	int rc = ex_node(c, rank, run);

	if (!rc)
		rc = ex_check(c, rank, run);
	if (rc)
		fprintf(stderr, "node %d: %s\n", rank, run->why);
	return rc;
}

/* the same with every node a process of its own */
Test(hot, sums_are_exact_with_nodes_as_processes, .timeout = 180)
{
	struct ex_run *run =
		mmap(NULL, sizeof(*run), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_table_params tp;

	cr_assert_neq(run, MAP_FAILED);
	memset(run, 0, sizeof(*run));
	hot_params(&tp, FERRY_CONS_SEQUENTIAL, 5);
	tc_procs_run(NODES, &tp, 20000, ex_proc, run,
		     "a node read other than the exact sum, or failed");
	cr_assert_eq(atomic_load(&run->errors), 0, "%s", run->why);
	cr_assert_eq(atomic_load(&run->own_bad), 0, "a read lacked this node's own pushes");
	ex_totals(run);
	munmap(run, sizeof(*run));
}

/* ---- the read bound ---- */

#define RB_SYNC_MS 20
#define RB_MARGIN_MS 400 /* generous: CI runs it under sanitizers and load */
#define RB_ROUNDS 20

struct rb_run {
	_Atomic double pushed_at; /* 0: not yet */
	atomic_int round;
	double worst;
	double sum;
	int late, errors;
};

/* node 1 pushes +1 to a hot key, one round at a time; node 0 reads its
 * replica every 0.2 ms until it holds the delta */
static int rb_node(struct tc *c, int rank, void *arg)
{
	struct rb_run *run = arg;
	struct ferry_worker *w;
	uint64_t k = hot_keys[2];
	float d[VLEN] = { 1, 1 }, v[VLEN];
	int rc = ferry_worker_create(c->fy[rank], &w);

	for (int i = 0; i < RB_ROUNDS && !rc; i++) {
		if (rank == 1) {
			while (atomic_load(&run->round) != i)
				usleep(100);
			usleep(3000 + 1000 * (i % 7)); /* somewhere in the interval */
			atomic_store(&run->pushed_at, now_ms());
			rc = ferry_push(w, c->t[rank], &k, 1, d);
		} else if (rank == 0) {
			double t0, dt;

			rc = ferry_pull(w, c->t[rank], &k, 1, v);
			if (!rc && v[0] != (float)i) {
				run->errors++; /* a delta too early, or doubled */
				break;
			}
			atomic_store(&run->pushed_at, 0.0);
			atomic_store(&run->round, i);
			while ((t0 = atomic_load(&run->pushed_at)) == 0.0)
				usleep(50);
			for (;;) {
				rc = ferry_pull(w, c->t[rank], &k, 1, v);
				if (rc || v[0] >= (float)(i + 1))
					break;
				if (now_ms() - t0 > 5000)
					break;
				usleep(200);
			}
			dt = now_ms() - t0;
			run->sum += dt;
			if (dt > run->worst)
				run->worst = dt;
			if (dt > RB_SYNC_MS + RB_MARGIN_MS)
				run->late++;
		}
	}
	if (rank == 0)
		atomic_store(&run->round, RB_ROUNDS);
	if (w)
		ferry_worker_destroy(w);
	return rc;
}

Test(hot, a_remote_delta_is_read_within_the_interval_and_a_margin, .timeout = 60)
{
	struct ferry_table_params tp;
	struct rb_run *run = calloc(1, sizeof(*run));
	struct tc c;

	atomic_store(&run->round, -1);
	hot_params(&tp, FERRY_CONS_SEQUENTIAL, RB_SYNC_MS);
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_eq(tc_run(&c, rb_node, run), 0);
	cr_assert_eq(run->errors, 0, "the replica held other than the pushes made");
	cr_assert_eq(run->late, 0, "%d of %d deltas read later than %d ms (worst %.1f ms)",
		     run->late, RB_ROUNDS, RB_SYNC_MS + RB_MARGIN_MS, run->worst);
	cr_log_info("hot read bound: sync %d ms; a remote delta read after %.1f ms on average, "
		    "%.1f ms at worst, of %d",
		    RB_SYNC_MS, run->sum / RB_ROUNDS, run->worst, RB_ROUNDS);
	tc_close(&c);
	free(run);
}

/* ---- parameters and calls that are refused ---- */

static int mismatch_node(struct tc *c, int rank, void *arg)
{
	struct ferry_table_params tp;
	struct ferry_table *t = NULL;
	uint64_t other[NHOT];
	int rc;

	(void)arg;
	hot_params(&tp, FERRY_CONS_SEQUENTIAL, 0);
	memcpy(other, hot_keys, sizeof(other));
	if (rank == 1)
		other[3] = 10; /* one key differs */
	tp.hot_keys = other;
	rc = ferry_table_create(c->fy[rank], &tp, &t);
	if (t)
		ferry_table_destroy(t);
	return rc == -FERRY_E_MISMATCH ? 0 : -1;
}

static int order_node(struct tc *c, int rank, void *arg)
{
	struct ferry_table_params tp;
	struct ferry_table *t = NULL;
	uint64_t rev[NHOT];
	int rc;

	(void)arg;
	hot_params(&tp, FERRY_CONS_SEQUENTIAL, 0);
	for (int i = 0; i < NHOT; i++)
		rev[i] = hot_keys[rank % 2 ? NHOT - 1 - i : i];
	tp.hot_keys = rev;
	rc = ferry_table_create(c->fy[rank], &tp, &t);
	if (t)
		ferry_table_destroy(t);
	return rc;
}

static atomic_int bad_logged;

static void bad_log(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	if (level <= FERRY_LOG_ERROR && strstr(msg, "hot"))
		atomic_fetch_add(&bad_logged, 1);
}

Test(hot, bad_parameters_and_calls_are_refused_with_a_log_line, .timeout = 60)
{
	struct ferry_table_params tp;
	struct ferry_table *t;
	struct ferry_worker *w;
	uint64_t *many = calloc(FERRY_HOT_MAX + 1, sizeof(*many)), tk;
	uint64_t dup[3] = { 1, 5, 1 }, out[2] = { 1, KEYS };
	struct tc c;

	cr_assert_eq(tc_open(&c, 2, NULL, 10000), 0);
	ferry_log_set(FERRY_LOG_WARN, bad_log, NULL);

#define REFUSED(mod)                                                                     \
	do {                                                                             \
		int before = atomic_load(&bad_logged);                                   \
		hot_params(&tp, FERRY_CONS_SEQUENTIAL, 0);                               \
		mod;                                                                     \
		cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL, "%s", #mod); \
		cr_assert_gt(atomic_load(&bad_logged), before, "no log line: %s", #mod); \
	} while (0)

	for (uint64_t i = 0; i <= FERRY_HOT_MAX; i++)
		many[i] = i;
	REFUSED(tp.num_keys = FERRY_HOT_MAX + 2; tp.hot_keys = many;
		tp.hot_count = FERRY_HOT_MAX + 1);
	REFUSED(tp.hot_keys = dup; tp.hot_count = 3);
	REFUSED(tp.hot_keys = out; tp.hot_count = 2);
	REFUSED(tp.hot_keys = NULL);
	REFUSED(tp.hot_sync_ms = 60001);
	REFUSED(tp.hot_count = 0; tp.hot_sync_ms = 5);
	REFUSED(tp.push_codec = FERRY_CODEC_BF16);
	REFUSED(tp.sparse = 1; tp.num_keys = 0);
#undef REFUSED
	free(many);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	/* every node must name the same keys (in any order) */
	cr_assert_eq(tc_run(&c, mismatch_node, NULL), 0);
	cr_assert_eq(tc_run(&c, order_node, NULL), 0);
	tc_close(&c);

	/* calls: a set of a hot key, async calls, a checkpoint */
	hot_params(&tp, FERRY_CONS_SEQUENTIAL, 0);
	cr_assert_eq(tc_open(&c, 2, &tp, 10000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	{
		uint64_t k[2] = { 5, hot_keys[1] };
		float v[2 * VLEN] = { 7, 7, 8, 8 }, r[2 * VLEN];

		cr_assert_eq(ferry_set(w, c.t[0], k, 2, v), -EINVAL);
		cr_assert_eq(ferry_pull(w, c.t[0], k, 2, r), 0);
		cr_assert(r[0] == 0 && r[2] == 0, "a refused set changed a value");
		cr_assert_eq(ferry_set(w, c.t[0], k, 1, v), 0, "a set of a plain key");
		cr_assert_eq(ferry_pull(w, c.t[0], k, 1, r), 0);
		cr_assert(r[0] == 7);
		cr_assert_eq(ferry_push_start(w, c.t[0], k, 1, v, &tk), -EOPNOTSUPP);
		cr_assert_eq(ferry_pull_start(w, c.t[0], k + 1, 1, r, &tk), -EOPNOTSUPP);
		/* localize of a hot key: 0, and the replica reads as before */
		cr_assert_eq(ferry_push(w, c.t[0], k + 1, 1, v), 0);
		cr_assert_eq(ferry_localize(w, c.t[0], k + 1, 1), 0);
		cr_assert_eq(ferry_pull(w, c.t[0], k + 1, 1, r), 0);
		cr_assert(r[0] == 7 && r[1] == 7);
		k[0] = KEYS;
		cr_assert_eq(ferry_push(w, c.t[0], k, 1, v), -ERANGE);
		cr_assert_eq(ferry_table_checkpoint(c.t[0], "/tmp/ferry-hot-ckpt"), -EOPNOTSUPP);
		cr_assert_eq(ferry_flush(w, c.t[0]), 0);
	}
	ferry_worker_destroy(w);
	tc_close(&c);
}

/* a node closed with its hot table never destroyed: the sync thread stops
 * before the transport goes (ferry_close's cons_close hook), checked on the
 * table's state; the table is destroyed after the close */
Test(hot, nodes_closed_with_a_hot_table_stop_its_sync_first, .timeout = 60)
{
	struct ferry_table_params tp;
	struct ferry_worker *w;
	struct tc c;

	hot_params(&tp, FERRY_CONS_SEQUENTIAL, 1);
	cr_assert_eq(tc_open(&c, 2, &tp, 10000), 0);
	for (int r = 0; r < 2; r++) {
		float d[VLEN] = { 1, 1 };

		cr_assert_eq(ferry_worker_create(c.fy[r], &w), 0);
		for (int i = 0; i < 200; i++) {
			uint64_t k = hot_keys[i % NHOT];

			cr_assert_eq(ferry_push(w, c.t[r], &k, 1, d), 0);
		}
		ferry_worker_destroy(w);
	}
	/* close while frames are still going, tables not destroyed; they go
	 * after the close (a table holds its node until destroyed) */
	for (int r = 0; r < 2; r++) {
		struct ferry_hot *h = c.t[r]->hot;

		cr_assert(h->running);
		ferry_close(c.fy[r]);
		cr_assert(!h->running, "node %d's sync thread runs on after ferry_close", r);
	}
	for (int r = 0; r < 2; r++) {
		ferry_table_destroy(c.t[r]);
		c.t[r] = NULL;
		c.fy[r] = NULL;
	}
	tc_close(&c);
}

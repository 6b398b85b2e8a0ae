/* SPDX-License-Identifier: MIT */
/*
 * Integration: the consistency models (lib/cons/, docs/consistency.md
 * "Models"), 4 nodes x 2 workers as threads, over tcp (and loop: ctest's
 * test_cons_loop).
 *
 * SSP and ESSP: every value is a vector with one float per worker; worker j
 * adds 1 to its own float of every key once per clock, so a read's content
 * says which clocks of each worker it holds (worker i's float = how many of
 * i's clocks, a prefix, since one node's flushes apply in order). Each read is
 * checked against the bound as it happens (ssp_check): a reader at clock c
 * holds at least c - s clocks of every worker, exactly all of its own, and no
 * clock a worker has not reached. Some keys move meanwhile (localize).
 *
 * EVENTUAL: concurrent pushes, pulls and localizes; after a barrier every
 * node reads the exact sums.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "lib/cons/cons.h"
#include "lib/core/core.h"

#define NODES 4
#define WPN 2 /* workers per node */
#define NW (NODES * WPN)

static void cons_params(struct ferry_table_params *tp, enum ferry_consistency m, uint32_t s,
			uint64_t keys, uint32_t len)
{
	memset(tp, 0, sizeof(*tp));
	tp->num_keys = keys;
	tp->value_len = len;
	tp->placement = FERRY_PLACEMENT_HASH;
	tp->mode = FERRY_MODE_DYNAMIC;
	tp->consistency = m;
	tp->staleness = s;
}

/*
 * One read of a key by worker @me at clock @c under bound @s: @v has one
 * float per worker (how many of its clocks the value holds); @own is how many
 * clocks @me pushed so far; @reached[i] is the clock worker i has started
 * (its pushes can be in no more clocks than reached[i] + 1). Return: the
 * number of violations (0: the read keeps the bound), with the first
 * described in @why.
 */
static int ssp_check(const float *v, int nw, int me, uint64_t c, uint32_t s, uint64_t own,
		     const uint64_t *reached, char *why, size_t whylen)
{
	int bad = 0;

	for (int i = 0; i < nw; i++) {
		double got = v[i];
		double lo = c > s ? (double)(c - s) : 0;

		if (i == me && got != (double)own) {
			if (!bad++)
				snprintf(why, whylen,
					 "worker %d at clock %llu reads %g of its own %llu clocks",
					 me, (unsigned long long)c, got, (unsigned long long)own);
		} else if (i != me && got < lo) {
			if (!bad++)
				snprintf(why, whylen,
					 "worker %d at clock %llu (bound %u) reads %g clocks of "
					 "worker %d; at least %g are due",
					 me, (unsigned long long)c, s, got, i, lo);
		} else if (reached && got > (double)reached[i] + 1) {
			if (!bad++)
				snprintf(
					why, whylen,
					"worker %d reads %g clocks of worker %d, which reached %llu",
					me, got, i, (unsigned long long)reached[i]);
		}
	}
	return bad;
}

Test(cons, checker_rejects_stale_reads_and_lost_own_updates)
{
	float v[4] = { 5, 5, 5, 5 };
	uint64_t reached[4] = { 9, 9, 9, 9 };
	char why[256];

	/* reader 0 at clock 7, bound 2: needs >= 5 of every other, own = 5 */
	cr_assert_eq(ssp_check(v, 4, 0, 7, 2, 5, reached, why, sizeof(why)), 0);
	v[2] = 4; /* one clock too stale */
	cr_assert_eq(ssp_check(v, 4, 0, 7, 2, 5, reached, why, sizeof(why)), 1);
	v[2] = 5;
	v[0] = 4; /* an own update missing */
	cr_assert_eq(ssp_check(v, 4, 0, 7, 2, 5, reached, why, sizeof(why)), 1);
	v[0] = 5;
	v[3] = 11; /* a clock worker 3 never reached */
	cr_assert_eq(ssp_check(v, 4, 0, 7, 2, 5, reached, why, sizeof(why)), 1);
}

/* ---- SSP / ESSP: a recorded history checked against the bound ---- */

#define SSP_KEYS 24
#define SSP_ITERS 40

struct ssp_run {
	enum ferry_consistency model;
	uint32_t s;
	_Atomic uint64_t reached[NW]; /* clock each worker has started */
	atomic_int violations;
	atomic_long reads;
	atomic_long ahead_bad; /* a worker returned from ferry_clock too far ahead */
	atomic_int errors;
	char why[256];
	pthread_mutex_t why_lock;
	pthread_barrier_t start; /* every worker made before any ticks: all start at 0 */
	/* ESSP's owner pushes, summed over the nodes (ferry_stats) */
	_Atomic uint64_t essp_subscribed, essp_pushed, essp_taken, essp_refused;
};

struct ssp_worker_arg {
	struct tc *c;
	struct ssp_run *run;
	int rank, j; /* node, global worker index */
};

static void ssp_note(struct ssp_run *run, const char *why)
{
	pthread_mutex_lock(&run->why_lock);
	if (!run->why[0])
		snprintf(run->why, sizeof(run->why), "%s", why);
	pthread_mutex_unlock(&run->why_lock);
}

static void *ssp_worker(void *p)
{
	struct ssp_worker_arg *a = p;
	struct ssp_run *run = a->run;
	struct ferry *fy = a->c->fy[a->rank];
	struct ferry_table *t = a->c->t[a->rank];
	struct ferry_worker *w;
	uint64_t keys[SSP_KEYS], seed = 0x9e3779b97f4a7c15ull ^ (uint64_t)(a->j + 1);
	float *vals = calloc(SSP_KEYS * NW, sizeof(float));
	float *deltas = calloc(SSP_KEYS * NW, sizeof(float));
	uint64_t reached[NW];
	char why[256];

	if (ferry_worker_create(fy, &w)) {
		atomic_fetch_add(&run->errors, 1);
		pthread_barrier_wait(&run->start);
		return NULL;
	}
	pthread_barrier_wait(&run->start);
	if (ferry_clock_get(w) != 0) {
		ssp_note(run, "a worker made at the start is not at clock 0");
		atomic_fetch_add(&run->errors, 1);
	}
	for (int k = 0; k < SSP_KEYS; k++) {
		keys[k] = (uint64_t)k;
		deltas[k * NW + a->j] = 1;
	}
	for (uint64_t it = 0; it < SSP_ITERS; it++) {
		uint64_t c = ferry_clock_get(w);

		/* read everything, check against the bound (what the others
		 * reached is read after the pull, which may have waited) */
		if (ferry_pull(w, t, keys, SSP_KEYS, vals)) {
			atomic_fetch_add(&run->errors, 1);
			break;
		}
		for (int i = 0; i < NW; i++)
			reached[i] = atomic_load(&run->reached[i]);
		for (int k = 0; k < SSP_KEYS; k++) {
			atomic_fetch_add(&run->reads, 1);
			if (ssp_check(vals + k * NW, NW, a->j, c, run->s, it, reached, why,
				      sizeof(why))) {
				atomic_fetch_add(&run->violations, 1);
				ssp_note(run, why);
			}
		}
		/* this clock's update */
		if (ferry_push(w, t, keys, SSP_KEYS, deltas)) {
			atomic_fetch_add(&run->errors, 1);
			break;
		}
		/* own updates at once: read back one key */
		{
			uint64_t k = tc_rand(&seed) % SSP_KEYS;

			if (ferry_pull(w, t, &k, 1, vals)) {
				atomic_fetch_add(&run->errors, 1);
				break;
			}
			atomic_fetch_add(&run->reads, 1);
			if (ssp_check(vals, NW, a->j, c, run->s, it + 1, NULL, why, sizeof(why))) {
				atomic_fetch_add(&run->violations, 1);
				ssp_note(run, why);
			}
		}
		/* keys keep moving: relocation under the model */
		if (tc_rand(&seed) % 4 == 0) {
			uint64_t k = tc_rand(&seed) % SSP_KEYS;

			if (ferry_localize(w, t, &k, 1)) {
				atomic_fetch_add(&run->errors, 1);
				break;
			}
		}
		/* one slow worker makes the others wait for it */
		if (a->j == NW - 1)
			nanosleep(&(struct timespec){ .tv_nsec = 3000000 }, NULL);
		atomic_store(&run->reached[a->j], it + 1);
		if (ferry_clock(w)) {
			atomic_fetch_add(&run->errors, 1);
			break;
		}
		/* back from ferry_clock at clock c: no worker below c - s */
		c = ferry_clock_get(w);
		for (int i = 0; i < NW; i++)
			if (c > run->s && atomic_load(&run->reached[i]) < c - run->s)
				atomic_fetch_add(&run->ahead_bad, 1);
	}
	ferry_worker_destroy(w);
	free(vals);
	free(deltas);
	return NULL;
}

static int ssp_node(struct tc *c, int rank, void *arg)
{
	struct ssp_run *run = arg;
	struct ssp_worker_arg a[WPN];
	pthread_t th[WPN];
	struct ferry_worker *w;
	uint64_t keys[SSP_KEYS];
	float *vals;
	int rc = 0;

	for (int i = 0; i < WPN; i++) {
		a[i] = (struct ssp_worker_arg){
			.c = c, .run = run, .rank = rank, .j = rank * WPN + i
		};
		pthread_create(&th[i], NULL, ssp_worker, &a[i]);
	}
	for (int i = 0; i < WPN; i++)
		pthread_join(th[i], NULL);
	{
		struct ferry_stats st;

		if (!ferry_stats(c->fy[rank], &st)) {
			atomic_fetch_add(&run->essp_subscribed, st.essp_subscribed);
			atomic_fetch_add(&run->essp_pushed, st.essp_pushed);
			atomic_fetch_add(&run->essp_taken, st.essp_taken);
			atomic_fetch_add(&run->essp_refused, st.essp_refused);
		}
	}
	/* every update, on every node, after the barrier */
	if (ferry_barrier(c->fy[rank]))
		return -1;
	vals = calloc(SSP_KEYS * NW, sizeof(float));
	for (int k = 0; k < SSP_KEYS; k++)
		keys[k] = (uint64_t)k;
	if (ferry_worker_create(c->fy[rank], &w))
		return -1;
	if (ferry_pull(w, c->t[rank], keys, SSP_KEYS, vals))
		rc = -1;
	for (int k = 0; k < SSP_KEYS * NW && !rc; k++)
		if (vals[k] != SSP_ITERS) {
			ssp_note(run, "a value after the barrier lacks updates");
			rc = -2;
		}
	ferry_worker_destroy(w);
	free(vals);
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	return rc;
}

/* hot keys of the SSP runs that have them: every other key (lib/cons/hot.c) */
static const uint64_t ssp_hot[SSP_KEYS / 2] = { 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22 };

static void ssp_history_hot(enum ferry_consistency model, uint32_t s, bool hot)
{
	struct ferry_table_params tp;
	struct ssp_run *run = calloc(1, sizeof(*run));
	struct ferry_stats st;
	uint64_t hist = 0, stale = 0;
	struct tc c;

	run->model = model;
	run->s = s;
	pthread_mutex_init(&run->why_lock, NULL);
	pthread_barrier_init(&run->start, NULL, NW);
	cons_params(&tp, model, s, SSP_KEYS, NW);
	if (hot) {
		tp.hot_keys = ssp_hot;
		tp.hot_count = SSP_KEYS / 2;
		tp.hot_sync_ms = 50; /* longer than a clock: the clocks must flush them */
	}
	cr_assert_eq(tc_open(&c, NODES, &tp, 20000), 0);
	cr_assert_eq(tc_run(&c, ssp_node, run), 0, "%s", run->why);
	cr_assert_eq(atomic_load(&run->errors), 0);
	cr_assert_eq(atomic_load(&run->violations), 0, "%d of %ld reads break the bound: %s",
		     atomic_load(&run->violations), atomic_load(&run->reads), run->why);
	cr_assert_eq(atomic_load(&run->ahead_bad), 0, "a worker ran more than s ahead");
	for (int i = 0; i < NODES; i++) {
		cr_assert_eq(ferry_stats(c.fy[i], &st), 0);
		for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++) {
			hist += st.staleness[b];
			if (b)
				stale += st.staleness[b];
			cr_assert(b <= (int)s || st.staleness[b] == 0,
				  "a read %d clocks behind under bound %u", b, s);
		}
	}
	/* every key read of the workers and the final check is in the histogram */
	cr_assert_eq(hist, (uint64_t)atomic_load(&run->reads) + NODES * SSP_KEYS,
		     "histogram %llu reads, test %ld", (unsigned long long)hist,
		     atomic_load(&run->reads));
	/* the cache served reads that were behind: SSP was not sequential */
	if (s)
		cr_assert(stale > 0, "no read was ever behind: the cache is not used");
	/* ESSP: the owners pushed, and the readers took pushed values as
	 * their copies (every one checked above, as any read); SSP: nothing */
	cr_log_info("%s s=%u: %llu keys subscribed, %llu values pushed, %llu taken, %llu "
		    "refused",
		    model == FERRY_CONS_ESSP ? "essp" : "ssp", s,
		    (unsigned long long)run->essp_subscribed, (unsigned long long)run->essp_pushed,
		    (unsigned long long)run->essp_taken, (unsigned long long)run->essp_refused);
	if (model == FERRY_CONS_ESSP) {
		cr_assert_gt(run->essp_subscribed, 0, "no key was subscribed");
		cr_assert_gt(run->essp_taken, 0, "no pushed value was taken");
	} else {
		cr_assert_eq(run->essp_pushed + run->essp_subscribed, 0);
	}
	tc_close(&c);
	free(run);
}

static void ssp_history(enum ferry_consistency model, uint32_t s)
{
	ssp_history_hot(model, s, false);
}

/* half of the keys hot: each read mixes replicas and copies; the bound
 * holds for both (hot deltas are applied everywhere before each CLOCK) */
Test(cons, ssp_reads_of_hot_keys_keep_the_staleness_bound, .timeout = 120)
{
	ssp_history_hot(FERRY_CONS_SSP, 3, true);
}

Test(cons, ssp_with_bound_0_and_hot_keys_reads_every_earlier_clock, .timeout = 120)
{
	ssp_history_hot(FERRY_CONS_SSP, 0, true);
}

Test(cons, essp_reads_of_hot_keys_keep_the_staleness_bound, .timeout = 120)
{
	ssp_history_hot(FERRY_CONS_ESSP, 3, true);
}

Test(cons, ssp_reads_keep_the_staleness_bound, .timeout = 120)
{
	ssp_history(FERRY_CONS_SSP, 3);
}

Test(cons, ssp_with_bound_0_reads_every_earlier_clock, .timeout = 120)
{
	ssp_history(FERRY_CONS_SSP, 0);
}

Test(cons, essp_reads_keep_the_staleness_bound, .timeout = 120)
{
	ssp_history(FERRY_CONS_ESSP, 3);
}

/* the same history with every node a process of its own (the run's record
 * in a shared mapping, its lock and barrier process-shared) */
static void ssp_history_procs(enum ferry_consistency model, uint32_t s)
{
	struct ssp_run *run =
		mmap(NULL, sizeof(*run), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pthread_mutexattr_t ma;
	pthread_barrierattr_t ba;
	struct ferry_table_params tp;

	cr_assert_neq(run, MAP_FAILED);
	memset(run, 0, sizeof(*run));
	run->model = model;
	run->s = s;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutex_init(&run->why_lock, &ma);
	pthread_barrierattr_init(&ba);
	pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(&run->start, &ba, NW);
	cons_params(&tp, run->model, run->s, SSP_KEYS, NW);
	tc_procs_run(NODES, &tp, 20000, ssp_node, run, run->why);
	cr_assert_eq(atomic_load(&run->errors), 0, "%s", run->why);
	cr_assert_eq(atomic_load(&run->violations), 0, "%d of %ld reads break the bound: %s",
		     atomic_load(&run->violations), atomic_load(&run->reads), run->why);
	cr_assert_eq(atomic_load(&run->ahead_bad), 0, "a worker ran more than s ahead");
	cr_assert_gt(atomic_load(&run->reads), NW * SSP_ITERS * SSP_KEYS);
	if (model == FERRY_CONS_ESSP)
		cr_assert_gt(atomic_load(&run->essp_taken), 0, "no pushed value was taken");
	munmap(run, sizeof(*run));
}

Test(cons, ssp_history_with_nodes_as_processes, .timeout = 180)
{
	ssp_history_procs(FERRY_CONS_SSP, 2);
}

/* ESSP's owners push to readers in other processes, keys moving meanwhile */
Test(cons, essp_history_with_nodes_as_processes, .timeout = 180)
{
	ssp_history_procs(FERRY_CONS_ESSP, 2);
}

/* ---- EVENTUAL: exact sums after a flush and a barrier ---- */

#define EV_KEYS 64
#define EV_ITERS 3000

struct ev_run {
	bool flush_first; /* ferry_flush by each worker before the barrier */
	_Atomic uint64_t pushed[EV_KEYS];
	atomic_int errors;
	atomic_int own_bad;
};

struct ev_arg {
	struct tc *c;
	struct ev_run *run;
	int rank, j;
};

static void *ev_worker(void *p)
{
	struct ev_arg *a = p;
	struct ev_run *run = a->run;
	struct ferry_table *t = a->c->t[a->rank];
	struct ferry_worker *w;
	uint64_t seed = 0x2545f4914f6cdd1dull * (uint64_t)(a->j + 1), own[EV_KEYS] = { 0 };

	if (ferry_worker_create(a->c->fy[a->rank], &w)) {
		atomic_fetch_add(&run->errors, 1);
		return NULL;
	}
	for (int it = 0; it < EV_ITERS; it++) {
		uint64_t k = tc_rand(&seed) % EV_KEYS, r = tc_rand(&seed) % 16;
		float d = 1, v;

		if (r < 10) {
			if (ferry_push(w, t, &k, 1, &d))
				atomic_fetch_add(&run->errors, 1);
			own[k]++;
			atomic_fetch_add(&run->pushed[k], 1);
		} else if (r < 14) {
			if (ferry_pull(w, t, &k, 1, &v))
				atomic_fetch_add(&run->errors, 1);
			/* this node's pushes are in every read it makes */
			if (v < (float)own[k])
				atomic_fetch_add(&run->own_bad, 1);
		} else if (r < 15) {
			if (ferry_localize(w, t, &k, 1))
				atomic_fetch_add(&run->errors, 1);
		} else if (ferry_clock(w)) {
			atomic_fetch_add(&run->errors, 1);
		}
	}
	if (run->flush_first && ferry_flush(w, t))
		atomic_fetch_add(&run->errors, 1);
	ferry_worker_destroy(w);
	return NULL;
}

static int ev_node(struct tc *c, int rank, void *arg)
{
	struct ev_run *run = arg;
	struct ev_arg a[WPN];
	pthread_t th[WPN];

	for (int i = 0; i < WPN; i++) {
		a[i] = (struct ev_arg){ .c = c, .run = run, .rank = rank, .j = rank * WPN + i };
		pthread_create(&th[i], NULL, ev_worker, &a[i]);
	}
	for (int i = 0; i < WPN; i++)
		pthread_join(th[i], NULL);
	return ferry_barrier(c->fy[rank]);
}

static int ev_check(struct tc *c, int rank, void *arg)
{
	struct ev_run *run = arg;
	struct ferry_worker *w;
	uint64_t keys[EV_KEYS];
	float vals[EV_KEYS];
	int rc;

	for (int k = 0; k < EV_KEYS; k++)
		keys[k] = (uint64_t)k;
	if (ferry_worker_create(c->fy[rank], &w))
		return -1;
	rc = ferry_pull(w, c->t[rank], keys, EV_KEYS, vals);
	for (int k = 0; k < EV_KEYS && !rc; k++)
		if (vals[k] != (float)atomic_load(&run->pushed[k])) {
			/* stderr: this may run in a forked node, where Criterion's
			 * logging would wait for a runner that is not its parent */
			fprintf(stderr, "rank %d key %d: %g, pushed %llu\n", rank, k,
				(double)vals[k], (unsigned long long)atomic_load(&run->pushed[k]));
			rc = -2;
		}
	ferry_worker_destroy(w);
	return rc ? rc : ferry_barrier(c->fy[rank]);
}

static void ev_run(bool flush_first)
{
	struct ferry_table_params tp;
	struct ev_run *run = calloc(1, sizeof(*run));
	uint64_t total = 0;
	struct tc c;

	run->flush_first = flush_first;
	cons_params(&tp, FERRY_CONS_EVENTUAL, 0, EV_KEYS, 1);
	cr_assert_eq(tc_open(&c, NODES, &tp, 20000), 0);
	cr_assert_eq(tc_run(&c, ev_node, run), 0);
	cr_assert_eq(atomic_load(&run->errors), 0);
	cr_assert_eq(atomic_load(&run->own_bad), 0, "a read lacked this node's own pushes");
	for (int k = 0; k < EV_KEYS; k++)
		total += atomic_load(&run->pushed[k]);
	cr_assert_gt(total, NW * EV_ITERS / 2);
	cr_assert_eq(tc_run(&c, ev_check, run), 0, "a node read other than the exact sum");
	tc_close(&c);
	free(run);
}

Test(cons, eventual_sums_are_exact_after_flush_and_barrier, .timeout = 120)
{
	ev_run(true);
}

Test(cons, eventual_sums_are_exact_after_a_barrier_alone, .timeout = 120)
{
	ev_run(false);
}

/* the same with every node a process of its own; each checks after the
 * barrier, against the pushes all of them counted in a shared mapping */
static int ev_proc(struct tc *c, int rank, void *arg)
{
	int rc = ev_node(c, rank, arg);

	return rc ? rc : ev_check(c, rank, arg);
}

Test(cons, eventual_sums_are_exact_with_nodes_as_processes, .timeout = 180)
{
	struct ev_run *run =
		mmap(NULL, sizeof(*run), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_table_params tp;

	cr_assert_neq(run, MAP_FAILED);
	memset(run, 0, sizeof(*run));
	cons_params(&tp, FERRY_CONS_EVENTUAL, 0, EV_KEYS, 1);
	tc_procs_run(NODES, &tp, 20000, ev_proc, run,
		     "a node read other than the exact sum, or failed");
	cr_assert_eq(atomic_load(&run->errors), 0);
	cr_assert_eq(atomic_load(&run->own_bad), 0, "a read lacked this node's own pushes");
	munmap(run, sizeof(*run));
}

/* ---- flushes that fail midway lose and double nothing ---- */

/*
 * FERRY_CONS_FAULT_EVERY=5: of the push batch frames each node receives,
 * every 5th is lost before it is applied, every 5th (shifted) is applied and
 * its answer lost, and of those each sends, every 5th fails to send. Flushes
 * fail (-ETIMEDOUT after the 500 ms timeout, -EIO, ...) while workers push
 * +1 to random keys and localize some; each later flush sends the
 * unanswered keys again under the same batch number. After every worker's
 * last flush succeeded, every node must read exactly the pushes made: a
 * delta dropped or applied twice shows.
 */
#define FF_KEYS 48
#define FF_ROUNDS 8
#define FF_PUSHES 24

struct ff_run {
	int rounds;
	atomic_int nodes_done; /* processes: nodes whose workers finished */
	_Atomic uint64_t pushed[FF_KEYS];
	atomic_int errors;	   /* calls that must not fail */
	atomic_int flush_failed;   /* flushes that failed (injected faults) */
	atomic_int never_flushed;  /* a worker whose flushes kept failing */
	_Atomic uint64_t replayed; /* processes: keys answered from the record */
};

static void *ff_worker(void *p)
{
	struct ev_arg *a = p;
	struct ff_run *run = (struct ff_run *)a->run;
	struct ferry_table *t = a->c->t[a->rank];
	struct ferry_worker *w;
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(a->j + 3);
	int tries;

	if (ferry_worker_create(a->c->fy[a->rank], &w)) {
		atomic_fetch_add(&run->errors, 1);
		return NULL;
	}
	for (int r = 0; r < run->rounds; r++) {
		for (int i = 0; i < FF_PUSHES; i++) {
			uint64_t k = tc_rand(&seed) % FF_KEYS;
			float d = 1;

			if (ferry_push(w, t, &k, 1, &d)) {
				atomic_fetch_add(&run->errors, 1);
				continue;
			}
			atomic_fetch_add(&run->pushed[k], 1);
			if (tc_rand(&seed) % 8 == 0)
				(void)ferry_localize(w, t, &k, 1); /* may time out: no matter */
		}
		if (ferry_flush(w, t))
			atomic_fetch_add(&run->flush_failed, 1);
	}
	/* until a flush of this node's table sends everything, answered */
	for (tries = 0; tries < 60 && ferry_flush(w, t); tries++)
		atomic_fetch_add(&run->flush_failed, 1);
	if (tries == 60)
		atomic_fetch_add(&run->never_flushed, 1);
	ferry_worker_destroy(w);
	return NULL;
}

static int ff_node(struct tc *c, int rank, void *arg)
{
	struct ev_arg a[WPN];
	pthread_t th[WPN];

	for (int i = 0; i < WPN; i++) {
		a[i] = (struct ev_arg){ .c = c, .run = arg, .rank = rank, .j = rank * WPN + i };
		pthread_create(&th[i], NULL, ff_worker, &a[i]);
	}
	for (int i = 0; i < WPN; i++)
		pthread_join(th[i], NULL);
	return 0;
}

/* once every node's workers are done (the faults make some much slower
 * than others, past the 500 ms a barrier waits) */
static int ff_barrier(struct tc *c, int rank, void *arg)
{
	(void)arg;
	return ferry_barrier(c->fy[rank]);
}

static int ff_check(struct tc *c, int rank, void *arg)
{
	struct ff_run *run = arg;
	struct ferry_worker *w;
	uint64_t keys[FF_KEYS];
	float vals[FF_KEYS];
	int rc;

	for (int k = 0; k < FF_KEYS; k++)
		keys[k] = (uint64_t)k;
	if (ferry_worker_create(c->fy[rank], &w))
		return -1;
	rc = ferry_pull(w, c->t[rank], keys, FF_KEYS, vals);
	for (int k = 0; k < FF_KEYS && !rc; k++)
		if (vals[k] != (float)atomic_load(&run->pushed[k])) {
			fprintf(stderr, "rank %d key %d: %g, pushed %llu\n", rank, k,
				(double)vals[k], (unsigned long long)atomic_load(&run->pushed[k]));
			rc = -2;
		}
	ferry_worker_destroy(w);
	return rc ? rc : ferry_barrier(c->fy[rank]);
}

/* the faults' own lines, and the failed flushes' lines they cause, are
 * expected: only the others are shown */
static void ff_log(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	if (level <= FERRY_LOG_WARN && !strstr(msg, "fault injection") &&
	    !strstr(msg, "FERRY_CONS_FAULT_EVERY") && !strstr(msg, "buffered pushes"))
		fprintf(stderr, "ferry: %s\n", msg);
}

Test(cons, flushes_that_fail_midway_lose_and_double_nothing, .timeout = 180)
{
	struct ferry_table_params tp;
	struct ff_run *run = calloc(1, sizeof(*run));
	uint64_t total = 0, replayed = 0, frames = 0;
	struct tc c;

	ferry_log_set(FERRY_LOG_WARN, ff_log, NULL);
	setenv("FERRY_CONS_FAULT_EVERY", "5", 1);
	run->rounds = FF_ROUNDS;
	cons_params(&tp, FERRY_CONS_EVENTUAL, 0, FF_KEYS, 1);
	cr_assert_eq(tc_open(&c, NODES, &tp, 500), 0);
	unsetenv("FERRY_CONS_FAULT_EVERY");
	cr_assert_eq(tc_run(&c, ff_node, run), 0);
	cr_assert_eq(tc_run(&c, ff_barrier, NULL), 0);
	cr_assert_eq(atomic_load(&run->errors), 0);
	cr_assert_eq(atomic_load(&run->never_flushed), 0, "a worker's flushes kept failing");
	for (int k = 0; k < FF_KEYS; k++)
		total += atomic_load(&run->pushed[k]);
	cr_assert_eq(total, (uint64_t)NW * FF_ROUNDS * FF_PUSHES);
	cr_assert_eq(tc_run(&c, ff_check, run), 0, "a node read other than the exact sum");
	for (int r = 0; r < NODES; r++) {
		struct ferry_cons_node *cn = c.fy[r]->cons;

		replayed += atomic_load(&cn->replayed);
		frames += atomic_load(&cn->fault_rx);
	}
	/* the faults happened, and keys applied whose answer was lost came
	 * again and were answered from the record, not applied again */
	cr_assert_gt(atomic_load(&run->flush_failed), 0, "no flush failed: no fault injected?");
	cr_assert_gt(replayed, 0, "no key came again after its answer was lost");
	cr_log_info("%llu batch frames received, %d flushes failed, %llu keys answered from "
		    "the record",
		    (unsigned long long)frames, atomic_load(&run->flush_failed),
		    (unsigned long long)replayed);
	tc_close(&c);
	free(run);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
}

/* the same with every node a process of its own (5 rounds, 800 ms) */
Test(cons, flushes_that_fail_midway_lose_and_double_nothing_in_processes, .timeout = 180)
{
	struct ff_run *run =
		mmap(NULL, sizeof(*run), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_params p;
	pid_t pids[NODES];
	uint64_t total = 0;
	int rc;

	cr_assert_neq(run, MAP_FAILED);
	memset(run, 0, sizeof(*run));
	run->rounds = 5;
	ferry_log_set(FERRY_LOG_WARN, ff_log, NULL);
	ferry_params_init(&p);
	p.transport = getenv("FERRY_TRANSPORT") && strcmp(getenv("FERRY_TRANSPORT"), "loop") ?
			      FERRY_TRANSPORT_AUTO :
			      FERRY_TRANSPORT_TCP;
	p.timeout_ms = 800;
	setenv("FERRY_CONS_FAULT_EVERY", "5", 1);
	rc = ferry_local_cluster_fork(NODES, &p, pids);
	if (rc >= 0 && rc < NODES) {
		struct ferry_table_params tp;
		struct tc c = { .n = NODES };
		int me = rc;

		cons_params(&tp, FERRY_CONS_EVENTUAL, 0, FF_KEYS, 1);
		rc = ferry_open(&p, &c.fy[me]);
		if (!rc)
			rc = ferry_table_create(c.fy[me], &tp, &c.t[me]);
		if (!rc)
			rc = ff_node(&c, me, run);
		/* the barrier only once every node is done (see ff_barrier) */
		atomic_fetch_add(&run->nodes_done, 1);
		for (int i = 0; i < 120000 && atomic_load(&run->nodes_done) < NODES; i++)
			usleep(1000);
		if (!rc)
			rc = ff_barrier(&c, me, NULL);
		if (!rc)
			rc = ff_check(&c, me, run);
		if (c.fy[me])
			atomic_fetch_add(
				&run->replayed,
				atomic_load(&((struct ferry_cons_node *)c.fy[me]->cons)->replayed));
		ferry_table_destroy(c.t[me]);
		ferry_close(c.fy[me]);
		_exit(rc ? 1 : 0);
	}
	unsetenv("FERRY_CONS_FAULT_EVERY");
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	tc_wait_procs(pids, NODES, -1, "a node read other than the exact sum, or failed");
	cr_assert_eq(atomic_load(&run->errors), 0);
	cr_assert_eq(atomic_load(&run->never_flushed), 0, "a worker's flushes kept failing");
	for (int k = 0; k < FF_KEYS; k++)
		total += atomic_load(&run->pushed[k]);
	cr_assert_eq(total, (uint64_t)NW * 5 * FF_PUSHES);
	cr_assert_gt(atomic_load(&run->flush_failed), 0, "no flush failed: no fault injected?");
	cr_assert_gt(atomic_load(&run->replayed), 0, "no key came again after its answer was lost");
	cr_log_info("processes: %d flushes failed, %llu keys answered from the record",
		    atomic_load(&run->flush_failed),
		    (unsigned long long)atomic_load(&run->replayed));
	munmap(run, sizeof(*run));
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
}

/* ---- parameters ---- */

static int mismatch_node(struct tc *c, int rank, void *arg)
{
	struct ferry_table_params tp;
	struct ferry_table *t = NULL;
	int rc;

	(void)arg;
	cons_params(&tp, rank == 2 ? FERRY_CONS_SSP : FERRY_CONS_ESSP, 2, 16, 1);
	rc = ferry_table_create(c->fy[rank], &tp, &t);
	if (t)
		ferry_table_destroy(t);
	return rc == -FERRY_E_MISMATCH ? 0 : -1;
}

Test(cons, nodes_that_disagree_on_the_model_fail_the_create)
{
	struct ferry_table_params tp;
	struct ferry_table *t;
	struct ferry_worker *w;
	uint64_t tk = 0;
	struct tc c;

	cr_assert_eq(tc_open(&c, NODES, NULL, 10000), 0);
	cr_assert_eq(tc_run(&c, mismatch_node, NULL), 0);
	/* a bound on a model without one, an unknown model */
	cons_params(&tp, FERRY_CONS_EVENTUAL, 2, 16, 1);
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL);
	cons_params(&tp, (enum ferry_consistency)7, 0, 16, 1);
	cr_assert_eq(ferry_table_create(c.fy[0], &tp, &t), -EINVAL);
	/* async calls on a table with a model are refused, not half-kept */
	cons_params(&tp, FERRY_CONS_EVENTUAL, 0, 16, 1);
	tc_close(&c);
	cr_assert_eq(tc_open(&c, 2, &tp, 10000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	{
		float v = 1;
		uint64_t key = 3;

		cr_assert_eq(ferry_push_start(w, c.t[0], &key, 1, &v, &tk), -EOPNOTSUPP);
		cr_assert_eq(ferry_pull(w, c.t[0], &key, 1, &v), 0);
		key = 16;
		cr_assert_eq(ferry_push(w, c.t[0], &key, 1, &v), -ERANGE);
	}
	ferry_worker_destroy(w);
	tc_close(&c);
}

/* ---- the CLOCK frame: checked like every peer input ---- */

static atomic_int clk_errors;
static char clk_last[512];

static void clk_log(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	if (level == FERRY_LOG_ERROR && strstr(msg, "clock")) {
		snprintf(clk_last, sizeof(clk_last), "%s", msg);
		atomic_fetch_add(&clk_errors, 1);
	}
}

static int clk_send(struct ferry *from, uint32_t to, uint64_t clock)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_clock c;
	} m;

	memset(&m, 0, sizeof(m));
	ferry__proto_hdr_init(&m.h, FERRY_MSG_CLOCK, sizeof(m), (uint32_t)ferry_rank(from), 0);
	m.c.clock = clock;
	return ferry__send(from, to, &m, sizeof(m));
}

Test(cons, a_clock_that_goes_down_drops_its_sender_and_waits_on_it_end, .timeout = 60)
{
	struct ferry_table_params tp;
	struct ferry_worker *w;
	struct tc c;

	ferry_log_set(FERRY_LOG_WARN, clk_log, NULL);
	cons_params(&tp, FERRY_CONS_SSP, 0, 16, 1);
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_eq(clk_send(c.fy[1], 0, 3), 0);
	cr_assert_eq(clk_send(c.fy[1], 0, 2), 0);
	for (int i = 0; i < 500 && !atomic_load(&clk_errors); i++)
		usleep(10000);
	cr_assert_eq(atomic_load(&clk_errors), 1, "one error line");
	cr_assert(strstr(clk_last, "rank 1 sent clock 2 after clock 3"), "%s", clk_last);
	/* rank 0's worker (bound 0) passes clocks 1 .. 3, which rank 1
	 * announced; clock 4 needs it further, and it failed: the wait ends
	 * at once, not at the timeout */
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(ferry_clock(w), 0);
	atomic_store(&clk_errors, 0);
	cr_assert_eq(ferry_clock(w), -FERRY_E_PEER);
	cr_assert(strstr(clk_last, "rank 1") && strstr(clk_last, "failed"), "%s", clk_last);
	ferry_worker_destroy(w);
	tc_close(&c);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
}

/* ---- ESSP: who may push, and when a pushed value is taken ---- */

static atomic_int essp_errors;
static char essp_last[512];

static void essp_log(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	if (level == FERRY_LOG_ERROR && strstr(msg, "pushed values")) {
		snprintf(essp_last, sizeof(essp_last), "%s", msg);
		atomic_fetch_add(&essp_errors, 1);
	}
}

/* an ESSP_VAL of one key from @from to @to */
static int essp_send_val(struct ferry *from, uint32_t to, uint32_t table, uint64_t fresh,
			 uint64_t key, uint64_t tag, uint32_t id, float val)
{
	struct ferry_frame f;
	struct ferry_msg_essp_val *m;
	struct ferry_msg_essp_ent *e;
	float *v;
	int rc;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	e = ferry__frame_put(&f, sizeof(*e));
	v = ferry__frame_put(&f, sizeof(*v));
	cr_assert(m && e && v);
	m = (struct ferry_msg_essp_val *)(f.buf + sizeof(struct ferry_msg_hdr));
	e = (struct ferry_msg_essp_ent *)(m + 1);
	v = (float *)(e + 1);
	m->fresh = fresh;
	m->count = 1;
	*e = (struct ferry_msg_essp_ent){ .key = key, .tag = tag, .id = id, .len = 1 };
	*v = val;
	rc = ferry__frame_finish(&f, FERRY_MSG_ESSP_VAL, (uint32_t)ferry_rank(from), table);
	if (!rc)
		rc = ferry__send(from, to, f.buf, f.len);
	ferry__frame_free(&f);
	return rc;
}

/* wait up to 5 s for node @fy's counter essp_taken + essp_refused to reach @n */
static void essp_wait_seen(struct ferry *fy, uint64_t n)
{
	struct ferry_stats st;

	for (int i = 0; i < 500; i++) {
		cr_assert_eq(ferry_stats(fy, &st), 0);
		if (st.essp_taken + st.essp_refused >= n)
			return;
		usleep(10000);
	}
	cr_assert(0, "node never handled the pushed value");
}

/*
 * Node 1 pushes to key k (owned by node 0), flushes (batch 1, applied), and
 * reads k: a copy, subscribed at node 0 under some id, whose pushed values
 * must hold batch 1. Values are then pushed at node 1 by hand: one tagged
 * below batch 1 is refused (it may lack node 1's own delta), one tagged 1 is
 * taken, one from a rank the key is not subscribed at is refused, and a
 * value claiming a clock node 1 has not announced, or a batch it never
 * sent, drops its sender.
 */
Test(cons, pushed_values_are_taken_only_from_the_subscription_with_own_deltas, .timeout = 60)
{
	struct ferry_table_params tp;
	struct ferry_worker *w0, *w1;
	struct ferry_stats st;
	struct cons_table *ct;
	struct ferry_cons_ent *e;
	uint64_t k = 5, seen = 0;
	uint32_t sub_rank, sub_id, other;
	float one = 1, v = 0;
	struct tc c;

	ferry_log_set(FERRY_LOG_WARN, essp_log, NULL);
	cons_params(&tp, FERRY_CONS_ESSP, 8, 16, 1);
	cr_assert_eq(tc_open(&c, 3, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	cr_assert_eq(ferry_localize(w0, c.t[0], &k, 1), 0);
	cr_assert_eq(ferry_push(w1, c.t[1], &k, 1, &one), 0);
	cr_assert_eq(ferry_flush(w1, c.t[1]), 0);
	cr_assert_eq(ferry_pull(w1, c.t[1], &k, 1, &v), 0);
	cr_assert_eq(v, 1);
	ct = c.t[1]->cons;
	pthread_mutex_lock(&ct->lock);
	e = ferry__cons_map_find(&ct->m, k);
	cr_assert(e && e->have_val && e->sub_id, "the read did not subscribe");
	cr_assert_eq(e->sent_seq, 1, "the copy must hold batch 1");
	sub_rank = e->sub_rank;
	sub_id = e->sub_id;
	pthread_mutex_unlock(&ct->lock);
	cr_assert_lt(sub_rank, 3);
	other = sub_rank == 2 ? 0 : 2;
	/* node 1 announces clock 1 (it has one worker); nobody else ticks, so
	 * the global clock stays 0 and no owner pushes by itself */
	cr_assert_eq(ferry_clock(w1), 0);

	/* tagged 0: may lack batch 1 (an overtaken push): refused */
	cr_assert_eq(essp_send_val(c.fy[sub_rank], 1, c.t[1]->id, 1, k, 0, sub_id, 100), 0);
	essp_wait_seen(c.fy[1], ++seen);
	cr_assert_eq(ferry_pull(w1, c.t[1], &k, 1, &v), 0);
	cr_assert_eq(v, 1, "a value without this node's own delta was taken");
	/* from another rank, under the same id: refused */
	cr_assert_eq(essp_send_val(c.fy[other], 1, c.t[1]->id, 1, k, 1, sub_id, 300), 0);
	essp_wait_seen(c.fy[1], ++seen);
	cr_assert_eq(ferry_pull(w1, c.t[1], &k, 1, &v), 0);
	cr_assert_eq(v, 1, "a value from a rank the key is not subscribed at was taken");
	/* another id (an older subscription): refused */
	cr_assert_eq(essp_send_val(c.fy[sub_rank], 1, c.t[1]->id, 1, k, 1, sub_id + 7, 400), 0);
	essp_wait_seen(c.fy[1], ++seen);
	cr_assert_eq(ferry_pull(w1, c.t[1], &k, 1, &v), 0);
	cr_assert_eq(v, 1, "a value of another subscription was taken");
	/* tagged 1, fresh to 1: taken, and the reads are served from it */
	cr_assert_eq(essp_send_val(c.fy[sub_rank], 1, c.t[1]->id, 1, k, 1, sub_id, 200), 0);
	essp_wait_seen(c.fy[1], ++seen);
	cr_assert_eq(ferry_pull(w1, c.t[1], &k, 1, &v), 0);
	cr_assert_eq(v, 200, "a good pushed value was not taken");
	cr_assert_eq(ferry_stats(c.fy[1], &st), 0);
	cr_assert_eq(st.essp_taken, 1);
	cr_assert_eq(st.essp_refused, 3);
	cr_assert_eq(atomic_load(&essp_errors), 0, "%s", essp_last);

	/* a clock node 1 never announced: the sender is dropped */
	cr_assert_eq(essp_send_val(c.fy[sub_rank], 1, c.t[1]->id, 9, k, 1, sub_id, 500), 0);
	for (int i = 0; i < 500 && !atomic_load(&essp_errors); i++)
		usleep(10000);
	cr_assert_eq(atomic_load(&essp_errors), 1);
	cr_assert(strstr(essp_last, "not announced"), "%s", essp_last);
	/* a batch node 1 never sent (it sent 1): the other sender is dropped */
	cr_assert_eq(essp_send_val(c.fy[other], 1, c.t[1]->id, 1, k, 2, sub_id, 600), 0);
	for (int i = 0; i < 500 && atomic_load(&essp_errors) < 2; i++)
		usleep(10000);
	cr_assert_eq(atomic_load(&essp_errors), 2);
	cr_assert(strstr(essp_last, "never sent"), "%s", essp_last);
	cr_assert_eq(ferry_pull(w1, c.t[1], &k, 1, &v), 0);
	cr_assert_eq(v, 200);
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	tc_close(&c);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
}

/* node @fy's worker @w pulls @k until it reads @want (up to 3 s) */
static float essp_poll(struct ferry_worker *w, struct ferry_table *t, uint64_t k, float want)
{
	float v = -1;

	for (int i = 0; i < 300; i++) {
		cr_assert_eq(ferry_pull(w, t, &k, 1, &v), 0);
		if (v == want)
			break;
		usleep(10000);
	}
	return v;
}

/*
 * 3 nodes, one worker each, in lockstep: node 0 owns k and adds 1 to it in
 * every clock; node 1 read k once. With bound 4, SSP would serve node 1 its
 * first copy for 4 clocks; here node 0 pushes each clock's value, and node 1
 * reads it without asking: no miss, no re-read of its own. Then node 2
 * takes k over: node 0 stops pushing it, node 1's copy falls behind by a
 * clock, is re-read at a clock boundary from node 2 and subscribed there,
 * and node 2 pushes from then on. Every read keeps the bound.
 */
Test(cons, essp_owners_push_each_clock_and_subscriptions_follow_a_move, .timeout = 60)
{
	struct ferry_table_params tp;
	struct ferry_worker *w[3];
	struct ferry_stats a, b, d;
	uint64_t k = 5;
	float one = 1, v;
	struct tc c;
	int i;

	cons_params(&tp, FERRY_CONS_ESSP, 4, 16, 1);
	cr_assert_eq(tc_open(&c, 3, &tp, 20000), 0);
	for (i = 0; i < 3; i++)
		cr_assert_eq(ferry_worker_create(c.fy[i], &w[i]), 0);
	cr_assert_eq(ferry_localize(w[0], c.t[0], &k, 1), 0);
	cr_assert_eq(ferry_pull(w[1], c.t[1], &k, 1, &v), 0);
	cr_assert_eq(v, 0);
	cr_assert_eq(ferry_stats(c.fy[1], &a), 0);
	for (i = 0; i < 6; i++) {
		cr_assert_eq(ferry_push(w[0], c.t[0], &k, 1, &one), 0);
		for (int n = 0; n < 3; n++)
			cr_assert_eq(ferry_clock(w[n]), 0);
		v = essp_poll(w[1], c.t[1], k, (float)(i + 1));
		cr_assert_eq(v, (float)(i + 1), "clock %d: node 1 reads %g, not the pushed %d",
			     i + 1, (double)v, i + 1);
	}
	cr_assert_eq(ferry_stats(c.fy[1], &b), 0);
	cr_assert_eq(b.cons_misses, a.cons_misses, "node 1 pulled k from its owner again");
	cr_assert_eq(b.cons_refreshed, a.cons_refreshed, "node 1 re-read k itself");
	cr_assert_geq(b.essp_taken - a.essp_taken, 6);
	/* read before the clock's push came: 1 behind, never more (SSP: up to 4) */
	cr_assert_eq(b.staleness[0] + b.staleness[1] - a.staleness[0] - a.staleness[1],
		     b.cons_hits - a.cons_hits, "a read was more than a clock behind its reader");

	/* node 2 takes k over */
	cr_assert_eq(ferry_localize(w[2], c.t[2], &k, 1), 0);
	for (; i < 12; i++) {
		cr_assert_eq(ferry_push(w[0], c.t[0], &k, 1, &one), 0);
		for (int n = 0; n < 3; n++)
			cr_assert_eq(ferry_clock(w[n]), 0);
		cr_assert_eq(ferry_pull(w[1], c.t[1], &k, 1, &v), 0);
		/* at clock i + 1, bound 4: clocks 0 .. i - 4 at least */
		cr_assert(v >= (float)(i - 3) && v <= (float)(i + 1), "clock %d: %g", i + 1,
			  (double)v);
	}
	v = essp_poll(w[1], c.t[1], k, 12);
	cr_assert_eq(v, 12, "node 1 reads %g: node 2 does not push k to it", (double)v);
	cr_assert_eq(ferry_stats(c.fy[1], &d), 0);
	cr_assert_gt(d.cons_refreshed, b.cons_refreshed, "the copy was never re-read");
	cr_assert_leq(d.cons_refreshed - b.cons_refreshed, 3, "re-read at every clock");
	cr_assert_gt(d.essp_taken, b.essp_taken);
	cr_assert_eq(ferry_stats(c.fy[2], &d), 0);
	cr_assert_gt(d.essp_pushed, 0, "node 2 never pushed");
	for (i = 0; i < 3; i++)
		ferry_worker_destroy(w[i]);
	tc_close(&c);
}

static atomic_int essp_refusals;

static void essp_bound_log(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	if (level == FERRY_LOG_WARN && strstr(msg, "ESSP subscriptions of rank 1 refused"))
		atomic_fetch_add(&essp_refusals, 1);
}

/*
 * The owner's records stay within a quarter of cons_bytes: with cons_bytes
 * 32 KiB (8 KiB of records: 128 of 64 B each, a key and room for two
 * readers), node 1 reads 512 keys node 0 owns and keeps what its own 32 KiB
 * hold as copies; the subscriptions past the bound are refused (logged
 * once), node 0 pushes at most 128 keys per global clock, and node 1 still reads every update within the bound (the keys
 * not subscribed are re-read at its clock boundaries).
 */
Test(cons, essp_records_past_their_bound_are_refused_and_reads_keep_the_bound, .timeout = 60)
{
	struct ferry_table_params tp;
	struct ferry_worker *w0, *w1;
	struct ferry_stats a, b;
	uint64_t keys[512];
	float ones[512], v[512];
	struct tc c;

	ferry_log_set(FERRY_LOG_WARN, essp_bound_log, NULL);
	cons_params(&tp, FERRY_CONS_ESSP, 1, 512, 1);
	tp.cons_bytes = 32768;
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	for (int k = 0; k < 512; k++) {
		keys[k] = (uint64_t)k;
		ones[k] = 1;
	}
	cr_assert_eq(ferry_localize(w0, c.t[0], keys, 512), 0);
	cr_assert_eq(ferry_pull(w1, c.t[1], keys, 512, v), 0);
	for (int i = 0; i < 200 && !atomic_load(&essp_refusals); i++)
		usleep(10000);
	cr_assert_eq(ferry_stats(c.fy[1], &a), 0);
	cr_assert_gt(a.essp_subscribed, 128, "node 1 subscribed %llu keys",
		     (unsigned long long)a.essp_subscribed);
	cr_assert_eq(atomic_load(&essp_refusals), 1, "no refusal logged (or more than once)");
	for (int it = 0; it < 6; it++) {
		cr_assert_eq(ferry_stats(c.fy[0], &a), 0);
		cr_assert_eq(ferry_push(w0, c.t[0], keys, 512, ones), 0);
		cr_assert_eq(ferry_clock(w0), 0);
		cr_assert_eq(ferry_clock(w1), 0);
		usleep(50000);
		cr_assert_eq(ferry_stats(c.fy[0], &b), 0);
		cr_assert_leq(b.essp_pushed - a.essp_pushed, 128, "clock %d: %llu values pushed",
			      it + 1, (unsigned long long)(b.essp_pushed - a.essp_pushed));
		cr_assert_eq(ferry_pull(w1, c.t[1], keys, 512, v), 0);
		/* at clock it + 1, bound 1: clocks 0 .. it - 1 at least */
		for (int k = 0; k < 512; k++)
			cr_assert(v[k] >= (float)it && v[k] <= (float)(it + 1),
				  "clock %d key %d: %g", it + 1, k, (double)v[k]);
	}
	cr_assert_eq(ferry_stats(c.fy[0], &b), 0);
	cr_assert_gt(b.essp_pushed, 0, "node 0 pushed nothing");
	cr_assert_eq(atomic_load(&essp_refusals), 1, "the refusal logged more than once");
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	tc_close(&c);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
}

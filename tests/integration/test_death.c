/* SPDX-License-Identifier: MIT */
/*
 * Integration: a node dies (SIGKILL) while the others run. 3 nodes as
 * forked processes, range placement (rank r is home of keys [100 r, 100 r +
 * 100)); rank 1 owns a few keys homed at rank 0 and at rank 2 (localized
 * before). Rank 2 is stopped, rank 0 starts a push to a key rank 2 owns,
 * then rank 2 is killed. Checked, with a node timeout of 20 s:
 *
 * - the push in flight to rank 2 ends with -FERRY_E_PEER within 2 s of the
 *   kill, not after the timeout; so does rank 1's localize of a key homed at
 *   rank 2, and a second localize of that key fails at once;
 * - so does rank 0's push of FWD_KEY, homed at rank 1 but moved to rank 2
 *   before: it goes to rank 1, which forwards it to the stopped rank 2 and
 *   tells rank 0 so (OP_FWD); without that note rank 0 waited on rank 1
 *   alone, and out its whole timeout;
 * - every key homed and owned on a live node is read and written at once,
 *   with its value intact, from both live nodes; a key homed at rank 2 and
 *   owned by rank 1 stays usable at its owner;
 * - a new operation on a key rank 2 owned fails at once with -FERRY_E_PEER;
 * - ferry_barrier fails at once with -FERRY_E_PEER on both live nodes.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "ferry/ferry.h"

#define NODES 3
#define PER 100
#define VLEN 4
#define DEAD 2
#define FWD_KEY (1 * PER + 99) /* homed at rank 1, moved to rank 2 */

struct death {
	volatile int ready;	/* nodes past the first barrier */
	volatile int stopped;	/* the parent stopped rank 2 */
	volatile int inflight;	/* rank 0 started its push to a key of rank 2 */
	volatile int inflight1; /* rank 1 started its localize of a key homed at rank 2 */
	volatile int killed;	/* the parent killed rank 2 */
	volatile int64_t kill_ns;
	volatile int finished; /* live nodes done checking (the barrier is broken) */
	volatile int failures;
	char why[512];
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int fail(struct death *d, int rank, const char *what, int rc)
{
	if (!d->failures++)
		snprintf(d->why, sizeof(d->why), "rank %d: %s: %s", rank, what, ferry_strerror(rc));
	return 1;
}

static void wait_flag(volatile int *f)
{
	for (int64_t until = now_ns() + 30000000000ll; !*f && now_ns() < until;)
		usleep(1000);
}

static float val(uint64_t key, uint32_t j)
{
	return (float)(key * 10 + j);
}

/* every key homed on a live node (and the ones rank 1 moved from rank 2),
 * read from here: all values intact */
static int check_live_keys(struct death *d, int rank, struct ferry_worker *w, struct ferry_table *t)
{
	float v[VLEN];

	for (uint64_t key = 0; key < 2 * PER; key++) {
		int rc;

		if (key == FWD_KEY)
			continue; /* at the dead rank */
		rc = ferry_pull(w, t, &key, 1, v);

		if (rc)
			return fail(d, rank,
				    key < 100 ? "pull of a key homed at rank 0" :
						"pull of a key homed at rank 1",
				    rc);
		for (uint32_t j = 0; j < VLEN; j++)
			if (v[j] != val(key, j) + (key % 7 == 0 ? 1.0f : 0.0f)) {
				snprintf(d->why, sizeof(d->why), "rank %d: key %llu float %u is %g",
					 rank, (unsigned long long)key, j, (double)v[j]);
				d->failures++;
				return 1;
			}
	}
	return 0;
}

static int child(int rank, struct ferry_params *p, struct death *d)
{
	struct ferry_table_params tp = { .num_keys = NODES * PER,
					 .value_len = VLEN,
					 .placement = FERRY_PLACEMENT_RANGE };
	uint64_t moved[4] = { 5, 6, 2 * PER + 5, 2 * PER + 6 }; /* homed at 0 and at 2 */
	float v[NODES * PER * VLEN];
	struct ferry_worker *w;
	struct ferry_table *t;
	struct ferry *fy;
	uint64_t keys[NODES * PER];
	int64_t t0;
	int rc;

	if (ferry_open(p, &fy))
		return 10;
	if (ferry_table_create(fy, &tp, &t) || ferry_worker_create(fy, &w))
		return 11;
	if (rank == 0) {
		for (uint64_t k = 0; k < NODES * PER; k++) {
			keys[k] = k;
			for (uint32_t j = 0; j < VLEN; j++)
				v[k * VLEN + j] = val(k, j);
		}
		rc = ferry_set(w, t, keys, NODES * PER, v);
		if (rc)
			return fail(d, rank, "set", rc);
	}
	if ((rc = ferry_barrier(fy)))
		return fail(d, rank, "barrier", rc);
	if (rank == 1 && (rc = ferry_localize(w, t, moved, 4)))
		return fail(d, rank, "localize", rc);
	if (rank == DEAD) {
		uint64_t k = FWD_KEY;

		if ((rc = ferry_localize(w, t, &k, 1)))
			return fail(d, rank, "localize", rc);
	}
	if ((rc = ferry_barrier(fy)))
		return fail(d, rank, "barrier", rc);
	__atomic_fetch_add(&d->ready, 1, __ATOMIC_SEQ_CST);
	if (rank == DEAD) {
		for (;;)
			pause(); /* stopped, then killed, by the parent */
	}

	if (rank == 0) {
		uint64_t key = 2 * PER + 50; /* homed and owned at rank 2 */
		uint64_t ticket;

		wait_flag(&d->stopped);
		/* a push: it needs the owner's CPU on every transport (a pull may be
		 * one RDMA READ, which the stopped owner's NIC still serves) */
		for (uint32_t j = 0; j < VLEN; j++)
			v[j] = 1.0f;
		uint64_t fkey = FWD_KEY, fticket;

		rc = ferry_push_start(w, t, &key, 1, v, &ticket);
		if (rc)
			return fail(d, rank, "push_start", rc);
		/* no hint for it here: it goes to its home, rank 1 */
		rc = ferry_push_start(w, t, &fkey, 1, v, &fticket);
		if (rc)
			return fail(d, rank, "push_start", rc);
		d->inflight = 1;
		rc = ferry_wait(w, ticket);
		t0 = now_ns();
		if (rc != -FERRY_E_PEER)
			return fail(d, rank, "the push in flight to the dead rank should fail", rc);
		if (!d->killed || t0 - d->kill_ns > 2000000000ll) {
			snprintf(d->why, sizeof(d->why),
				 "rank 0: the push in flight ended %.0f ms after the kill",
				 (double)(t0 - d->kill_ns) / 1e6);
			d->failures++;
			return 1;
		}
		rc = ferry_wait(w, fticket);
		t0 = now_ns();
		if (rc != -FERRY_E_PEER)
			return fail(d, rank, "the push forwarded to the dead rank should fail", rc);
		if (t0 - d->kill_ns > 2000000000ll) {
			snprintf(
				d->why, sizeof(d->why),
				"rank 0: the push forwarded through rank 1 ended %.0f ms after the "
				"kill",
				(double)(t0 - d->kill_ns) / 1e6);
			d->failures++;
			return 1;
		}
	}
	if (rank == 1) {
		uint64_t key = 2 * PER + 70; /* homed and owned at rank 2 */
		uint64_t ticket;

		wait_flag(&d->stopped);
		rc = ferry_localize_start(w, t, &key, 1, &ticket);
		if (rc)
			return fail(d, rank, "localize_start", rc);
		d->inflight1 = 1;
		rc = ferry_wait(w, ticket);
		t0 = now_ns();
		if (rc != -FERRY_E_PEER)
			return fail(d, rank, "the localize whose home died should fail", rc);
		if (!d->killed || t0 - d->kill_ns > 2000000000ll) {
			snprintf(d->why, sizeof(d->why),
				 "rank 1: the localize ended %.0f ms after the kill",
				 (double)(t0 - d->kill_ns) / 1e6);
			d->failures++;
			return 1;
		}
		/* the move stays on record (a hand-over could still come), and a
		 * new localize of the key fails at once instead of queueing */
		t0 = now_ns();
		rc = ferry_localize(w, t, &key, 1);
		if (rc != -FERRY_E_PEER || now_ns() - t0 > 2000000000ll)
			return fail(d, rank, "a new localize of a stuck key should fail at once",
				    rc);
	}
	wait_flag(&d->killed);
	/* a few keys change, from both live nodes, after the death */
	for (uint64_t key = 7 * (uint64_t)rank; key < 2 * PER; key += 14) {
		float one[VLEN] = { 1, 1, 1, 1 };

		rc = ferry_push(w, t, &key, 1, one);
		if (rc)
			return fail(d, rank, "push to a key of a live node", rc);
	}
	/* both have pushed (rank 0 keys 0, 14, ...; rank 1 keys 7, 21, ...) before
	 * anyone checks: a shared flag, since the barrier is broken now */
	__atomic_fetch_add(&d->ready, 1, __ATOMIC_SEQ_CST);
	while (d->ready < NODES + 2)
		usleep(1000);
	if (check_live_keys(d, rank, w, t))
		return 1;
	if (rank == 1) {
		/* owned here although homed at the dead rank */
		rc = ferry_pull(w, t, &moved[2], 1, v);
		if (rc)
			return fail(d, rank, "pull of a key homed at the dead rank, owned here",
				    rc);
	}
	{
		uint64_t key = 2 * PER + 60 + rank;

		t0 = now_ns();
		rc = ferry_pull(w, t, &key, 1, v);
		if (rc != -FERRY_E_PEER || now_ns() - t0 > 2000000000ll)
			return fail(d, rank,
				    "a new pull of a key of the dead rank should fail at once", rc);
	}
	t0 = now_ns();
	rc = ferry_barrier(fy);
	if (rc != -FERRY_E_PEER || now_ns() - t0 > 2000000000ll)
		return fail(d, rank, "the barrier should fail at once", rc);
	/* keep serving until the other live node checked too */
	__atomic_fetch_add(&d->finished, 1, __ATOMIC_SEQ_CST);
	for (int64_t until = now_ns() + 30000000000ll; d->finished < NODES - 1 && now_ns() < until;)
		usleep(1000);
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	return 0;
}

Test(death, a_killed_node_fails_waits_at_once_and_live_keys_stay_usable, .timeout = 120)
{
	struct death *d =
		mmap(NULL, sizeof(*d), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_params p;
	pid_t pids[NODES];
	int rc;

	cr_assert_neq(d, MAP_FAILED);
	ferry_params_init(&p);
	p.transport = getenv("FERRY_TRANSPORT") ? FERRY_TRANSPORT_AUTO : FERRY_TRANSPORT_TCP;
	p.timeout_ms = 20000;
	/* the node is stopped before it is killed: only the kill may fail it */
	p.heartbeat_ms = -1;
	rc = ferry_local_cluster_fork(NODES, &p, pids);
	if (rc >= 0 && rc < NODES)
		_exit(child(rc, &p, d));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	wait_flag(&d->ready);
	for (int64_t until = now_ns() + 30000000000ll; d->ready < NODES && now_ns() < until;)
		usleep(1000);
	cr_assert_eq(d->ready, NODES, "the nodes did not start: %s", d->why);
	tc_stop_proc(pids[DEAD]);
	d->stopped = 1;
	wait_flag(&d->inflight);
	wait_flag(&d->inflight1);
	usleep(200000); /* the push and the localize are queued at the stopped node */
	d->kill_ns = now_ns();
	/* before the kill: a survivor may see the death (its port refuses at
	 * once) before kill() returns here */
	d->killed = 1;
	kill(pids[DEAD], SIGKILL);
	tc_wait_procs(pids, NODES, DEAD, d->why);
	cr_assert_eq(d->failures, 0, "%s", d->why);
	munmap(d, sizeof(*d));
}

/* ---- a death in the middle of a storm ------------------------------------ */

#define STORM_KEYS (2 * PER) /* the live nodes' keys: homed at ranks 0 and 1 */

struct storm {
	volatile int ready, finished, checked;
	volatile int64_t kill_ns;
	volatile long pushed[STORM_KEYS]; /* pushes of +1 that returned 0, per key */
	volatile long ops_after, slow_after;
	volatile int64_t worst_after_ns;
	volatile int failures;
	char why[512];
};

static int storm_fail(struct storm *st, int rank, const char *what, uint64_t key, int rc)
{
	if (!__atomic_fetch_add(&st->failures, 1, __ATOMIC_SEQ_CST))
		snprintf(st->why, sizeof(st->why), "rank %d: %s of key %llu: %s", rank, what,
			 (unsigned long long)key, ferry_strerror(rc));
	return 1;
}

/*
 * Ranks 0 and 1 push (+1), pull and localize keys homed at ranks 0 and 1 for
 * 3 s; rank 2 does the same on its own keys until the parent kills it, 1.5 s
 * in. Every operation of the live nodes succeeds, before and after the kill,
 * none waits past 2 s, and every key ends with exactly the pushes that
 * returned 0.
 */
static int storm_child(int rank, struct ferry_params *p, struct storm *st)
{
	struct ferry_table_params tp = { .num_keys = NODES * PER,
					 .value_len = VLEN,
					 .placement = FERRY_PLACEMENT_RANGE };
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
	const float one[VLEN] = { 1, 1, 1, 1 };
	struct ferry_worker *w;
	struct ferry_table *t;
	struct ferry *fy;
	float v[VLEN];
	int64_t end;
	int rc;

	if (ferry_open(p, &fy))
		return 10;
	if (ferry_table_create(fy, &tp, &t) || ferry_worker_create(fy, &w))
		return 11;
	if ((rc = ferry_barrier(fy)))
		return storm_fail(st, rank, "barrier", 0, rc);
	__atomic_fetch_add(&st->ready, 1, __ATOMIC_SEQ_CST);
	while (st->ready < NODES)
		usleep(100);
	end = now_ns() + 3000000000ll;
	while (rank == DEAD || now_ns() < end) {
		uint64_t key = rank == DEAD ? 2 * PER + tc_rand(&seed) % PER :
					      tc_rand(&seed) % STORM_KEYS;
		unsigned what = (unsigned)(tc_rand(&seed) % 10);
		int64_t t0 = now_ns(), dt;

		if (what < 6)
			rc = ferry_push(w, t, &key, 1, one);
		else if (what < 9)
			rc = ferry_pull(w, t, &key, 1, v);
		else
			rc = ferry_localize(w, t, &key, 1);
		if (rank == DEAD)
			continue;
		if (rc)
			return storm_fail(st, rank,
					  what < 6 ? "push" :
					  what < 9 ? "pull" :
						     "localize",
					  key, rc);
		if (what < 6)
			__atomic_fetch_add(&st->pushed[key], 1, __ATOMIC_SEQ_CST);
		dt = now_ns() - t0;
		if (st->kill_ns && t0 > st->kill_ns) {
			__atomic_fetch_add(&st->ops_after, 1, __ATOMIC_RELAXED);
			if (dt > st->worst_after_ns)
				st->worst_after_ns = dt;
			if (dt > 2000000000ll)
				__atomic_fetch_add(&st->slow_after, 1, __ATOMIC_RELAXED);
		}
	}
	/* both live nodes stopped pushing: check every value */
	__atomic_fetch_add(&st->finished, 1, __ATOMIC_SEQ_CST);
	while (st->finished < NODES - 1)
		usleep(1000);
	for (uint64_t key = 0; key < STORM_KEYS; key++) {
		rc = ferry_pull(w, t, &key, 1, v);
		if (rc)
			return storm_fail(st, rank, "final pull", key, rc);
		for (uint32_t j = 0; j < VLEN; j++)
			if (v[j] != (float)st->pushed[key]) {
				snprintf(st->why, sizeof(st->why),
					 "rank %d: key %llu float %u is %g after %ld pushes", rank,
					 (unsigned long long)key, j, (double)v[j], st->pushed[key]);
				st->failures++;
				return 1;
			}
	}
	__atomic_fetch_add(&st->checked, 1, __ATOMIC_SEQ_CST);
	while (st->checked < NODES - 1)
		usleep(1000);
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	return 0;
}

Test(death, a_node_killed_during_a_storm_leaves_the_live_keys_exact, .timeout = 120)
{
	struct storm *st =
		mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_params p;
	pid_t pids[NODES];
	int rc;

	cr_assert_neq(st, MAP_FAILED);
	ferry_params_init(&p);
	p.transport = getenv("FERRY_TRANSPORT") ? FERRY_TRANSPORT_AUTO : FERRY_TRANSPORT_TCP;
	p.timeout_ms = 20000;
	rc = ferry_local_cluster_fork(NODES, &p, pids);
	if (rc >= 0 && rc < NODES)
		_exit(storm_child(rc, &p, st));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	for (int64_t until = now_ns() + 30000000000ll; st->ready < NODES && now_ns() < until;)
		usleep(1000);
	cr_assert_eq(st->ready, NODES, "the nodes did not start: %s", st->why);
	usleep(1500 * 1000);
	st->kill_ns = now_ns();
	kill(pids[DEAD], SIGKILL);
	tc_wait_procs(pids, NODES, DEAD, st->why);
	cr_assert_eq(st->failures, 0, "%s", st->why);
	cr_log_info("%ld operations after the kill, the slowest %.1f ms", st->ops_after,
		    (double)st->worst_after_ns / 1e6);
	cr_assert_gt(st->ops_after, 100, "the storm did not go on after the kill");
	cr_assert_eq(st->slow_after, 0, "%ld operations waited past 2 s after the kill",
		     st->slow_after);
	munmap(st, sizeof(*st));
}

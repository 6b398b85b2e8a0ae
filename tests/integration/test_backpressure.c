/* SPDX-License-Identifier: MIT */
/*
 * Integration: a peer that stops reading while another floods it. Two
 * nodes as forked processes over tcp; rank 1 is stopped (SIGSTOP) and rank
 * 0 starts asynchronous pushes of 1 MiB values to keys rank 1 owns, as
 * fast as it can, for about three seconds. The send queue for rank 1 is
 * bounded (FERRY_TP_SENDQ_MAX, 128 MiB): once it is full, a push waits at
 * most the node timeout (1 s here) for room and then fails with -EAGAIN, so
 * rank 0's memory stays bounded. Before the bound, every push queued its
 * megabyte: about 1 GiB for the 1000 pushes started here.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "ferry/ferry.h"
#include "lib/core/core.h"

#define VLEN (256 * 1024) /* floats: 1 MiB */
#define PUSHES 1000
#define FLOOD_TIMEOUT_MS 1000

struct bp {
	volatile int ready;
	volatile int stopped;
	volatile int done;
	volatile long grow_mib; /* rank 0's resident growth during the flood */
	volatile int started, refused, failed_late, failures;
	char why[256];
};

static long rss_mib(void)
{
	long pages = 0, rss = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f) {
		if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
			rss = 0;
		fclose(f);
	}
	return rss * sysconf(_SC_PAGESIZE) / (1024 * 1024);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int child(int rank, struct ferry_params *p, struct bp *b)
{
	struct ferry_table_params tp = { .num_keys = 2 * PUSHES,
					 .value_len = VLEN,
					 .placement = FERRY_PLACEMENT_RANGE };
	static uint64_t tickets[PUSHES];
	struct ferry_worker *w;
	struct ferry_table *t;
	struct ferry *fy;
	static uint64_t keys[PUSHES]; /* homed and owned at rank 1, one per push (pushes
					* of one worker on one key would wait for each other) */
	float *v;
	long rss0;
	double t0;
	int n = 0, rc;

	if (ferry_open(p, &fy) || ferry_table_create(fy, &tp, &t) || ferry_worker_create(fy, &w))
		return 10;
	if (ferry_barrier(fy))
		return 11;
	if (rank == 0) {
		/* set up under a generous bound (a loaded machine may take more than a
		 * second to create the table); flood under the short one, the bound a
		 * push waits for room in the transport's queue */
		__atomic_store_n(&fy->timeout_ms, FLOOD_TIMEOUT_MS, __ATOMIC_RELAXED);
		__atomic_store_n(&fy->tp->cfg.timeout_ms, FLOOD_TIMEOUT_MS, __ATOMIC_RELAXED);
	}
	__atomic_fetch_add(&b->ready, 1, __ATOMIC_SEQ_CST);
	if (rank == 1) {
		while (!b->done)
			usleep(1000);
		goto out;
	}
	while (!b->stopped)
		usleep(1000);
	v = calloc(VLEN, sizeof(float));
	if (!v)
		return 12;
	for (int i = 0; i < VLEN; i++)
		v[i] = 1.0f;
	rss0 = rss_mib();
	t0 = now_s();
	for (; n < PUSHES && now_s() - t0 < 3.0; n++) {
		keys[n] = PUSHES + (uint64_t)n;
		rc = ferry_push_start(w, t, &keys[n], 1, v, &tickets[n]);
		if (rc) {
			snprintf(b->why, sizeof(b->why), "push_start %d: %s", n,
				 ferry_strerror(rc));
			b->failures++;
			break;
		}
	}
	b->grow_mib = rss_mib() - rss0;
	b->started = n;
	b->done = 1;
	/* the parent lets rank 1 go on: what was accepted completes, what was
	 * refused reports -EAGAIN; nothing is left hanging */
	for (int i = 0; i < n; i++) {
		rc = ferry_wait(w, tickets[i]);
		if (rc == -EAGAIN)
			b->refused++;
		else if (rc)
			b->failed_late++;
	}
	free(v);
out:
	ferry_worker_destroy(w);
	ferry_barrier(fy);
	ferry_table_destroy(t);
	ferry_close(fy);
	return 0;
}

Test(backpressure, a_peer_that_stops_reading_bounds_the_flooders_memory, .timeout = 120)
{
	struct bp *b =
		mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_params p;
	pid_t pids[2];
	int rc;

	cr_assert_neq(b, MAP_FAILED);
	ferry_params_init(&p);
	p.transport = FERRY_TRANSPORT_TCP;
	/* rank 1 must not give up on rank 0 while stopped; rank 0 lowers its
	 * own bound to FLOOD_TIMEOUT_MS once the table stands */
	p.timeout_ms = 30000;
	/* the stopped peer is the point: the failure detector would fail it
	 * after its timeout, and the pushes then with -FERRY_E_PEER */
	p.heartbeat_ms = -1;
	rc = ferry_local_cluster_fork(2, &p, pids);
	if (rc == 0 || rc == 1)
		_exit(child(rc, &p, b));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	for (int i = 0; i < 30000 && b->ready < 2; i++)
		usleep(1000);
	cr_assert_eq(b->ready, 2, "the nodes did not start");
	tc_stop_proc(pids[1]);
	b->stopped = 1;
	for (int i = 0; i < 60000 && !b->done; i++)
		usleep(1000);
	kill(pids[1], SIGCONT);
	tc_wait_procs(pids, 2, -1, b->why);
	cr_assert_eq(b->failures, 0, "%s", b->why);
	cr_log_info("started %d pushes of 1 MiB in 3 s; rank 0 grew by %ld MiB; %d refused",
		    b->started, b->grow_mib, b->refused);
	cr_assert_gt(b->started, 100, "the flood never filled the queue");
	cr_assert_lt(b->grow_mib, 400, "rank 0 grew by %ld MiB for a stopped peer", b->grow_mib);
	cr_assert_gt(b->refused, 0, "no push was refused although the peer was stopped");
	cr_assert_eq(b->failed_late, 0, "a push failed otherwise than with -EAGAIN");
	munmap(b, sizeof(*b));
}

/* SPDX-License-Identifier: MIT */
/*
 * One-sided pulls: a remote pull of a key whose slot is known is one read of
 * the slot, checked with its versions, key, epoch and state. Runs on the
 * transport FERRY_TRANSPORT names when it can read one-sided (rdma in the
 * SoftRoCE VM), else on the loop transport (one-sided access emulated in
 * this process, in address order, as a NIC does).
 */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"

#define VLEN 64

static void use_onesided_transport(void)
{
	const char *tr = getenv("FERRY_TRANSPORT");

	if (!tr || !strcmp(tr, "tcp"))
		setenv("FERRY_TRANSPORT", "loop", 1);
}

struct torn_arg {
	struct tc *c;
	volatile int stop;
	long writes;
	int rc;
};

/* the owner writes values that carry their own check: element i = c + i */
static void *writer_thread(void *p)
{
	struct torn_arg *a = p;
	struct ferry_worker *w;
	float v[VLEN];
	long c = 0;

	a->rc = ferry_worker_create(a->c->fy[0], &w);
	if (a->rc)
		return NULL;
	while (!a->stop) {
		uint64_t key = (uint64_t)(c % 4);

		c++;
		for (int i = 0; i < VLEN; i++) /* exact in a float: below 2^24 */
			v[i] = (float)(c % 1000000 + 1 + i);
		a->rc = ferry_set(w, a->c->t[0], &key, 1, v);
		if (a->rc)
			break;
	}
	a->writes = c;
	ferry_worker_destroy(w);
	return NULL;
}

Test(onesided, remote_pulls_never_see_a_torn_value, .timeout = 300)
{
	struct ferry_table_params tp = { .num_keys = 8, .value_len = VLEN };
	struct torn_arg a = { 0 };
	struct ferry_worker *w;
	struct ferry_stats before, after;
	const long reads = 100000;
	long torn = 0, seen_changes = 0, nreads = 0;
	float v[VLEN], last = -1;
	pthread_t th;
	struct tc c;
	int rc;

	use_onesided_transport();
	/* range placement: keys 0..3 live on node 0, the writer's */
	rc = tc_open(&c, 2, &tp, 20000);
	cr_assert_eq(rc, 0, "%s", ferry_strerror(rc));
	a.c = &c;
	cr_assert_eq(ferry_worker_create(c.fy[1], &w), 0);
	ferry_stats(c.fy[1], &before);
	cr_assert_eq(pthread_create(&th, NULL, writer_thread, &a), 0);
	/* values start at zero (all elements equal), then carry c + i */
	/* at least 10^5 reads, and on until the writer was seen at work (bounded) */
	for (long n = 0; n < reads || (seen_changes < 1000 && n < 50 * reads); n++) {
		uint64_t key = (uint64_t)(n % 4);

		if (n >= reads)
			sched_yield(); /* on a loaded machine, let the writer run */
		nreads = n + 1;

		rc = ferry_pull(w, c.t[1], &key, 1, v);
		cr_assert_eq(rc, 0, "pull: %s", ferry_strerror(rc));
		for (int i = 1; i < VLEN && (v[0] != 0 || v[VLEN - 1] != 0); i++)
			if (v[i] != v[0] + (float)i) {
				if (!torn)
					cr_log_info("torn: key %llu v[0]=%g v[%d]=%g v[63]=%g",
						    (unsigned long long)key, v[0], i, v[i], v[63]);
				torn++;
				break;
			}
		if (key == 0 && v[0] != last) {
			seen_changes++;
			last = v[0];
		}
	}
	a.stop = 1;
	pthread_join(th, NULL);
	cr_assert_eq(a.rc, 0, "writer: %s", ferry_strerror(a.rc));
	ferry_stats(c.fy[1], &after);
	cr_log_info("%ld reads, %ld writes, %llu one-sided reads, %llu retries, %llu fallbacks, "
		    "%ld changes seen",
		    nreads, a.writes,
		    (unsigned long long)(after.onesided_reads - before.onesided_reads),
		    (unsigned long long)(after.onesided_retries - before.onesided_retries),
		    (unsigned long long)(after.onesided_fallbacks - before.onesided_fallbacks),
		    seen_changes);
	cr_assert_eq(torn, 0, "%ld torn values in %ld reads", torn, nreads);
	cr_assert_geq(after.onesided_reads - before.onesided_reads, (unsigned long long)nreads,
		      "pulls did not go one-sided");
	cr_assert_geq(seen_changes, 1000, "the reader saw the writer's progress only %ld times",
		      seen_changes);
	ferry_worker_destroy(w);
	tc_close(&c);
}

Test(onesided, a_moved_key_falls_back_then_reads_one_sided_again, .timeout = 120)
{
	struct ferry_table_params tp = { .num_keys = 8, .value_len = VLEN };
	struct ferry_worker *w0, *w1, *w2;
	struct ferry_stats s0, s1;
	uint64_t key = 1; /* home: node 0 */
	float v[VLEN], one[VLEN];
	struct tc c;

	use_onesided_transport();
	cr_assert_eq(tc_open(&c, 3, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	cr_assert_eq(ferry_worker_create(c.fy[2], &w2), 0);
	for (int i = 0; i < VLEN; i++)
		one[i] = 1;
	cr_assert_eq(ferry_push(w0, c.t[0], &key, 1, one), 0);
	/* the initial slot is known everywhere: the first pull is one read */
	ferry_stats(c.fy[1], &s0);
	cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
	ferry_stats(c.fy[1], &s1);
	cr_assert_eq(v[0], 1.0f);
	cr_assert_eq(s1.onesided_reads - s0.onesided_reads, 1);
	cr_assert_eq(s1.msgs_sent, s0.msgs_sent, "a one-sided pull sent a message");
	/* move it to node 2: node 1's hint is stale, the read sees MOVED or a reused slot */
	cr_assert_eq(ferry_localize(w2, c.t[2], &key, 1), 0);
	cr_assert_eq(ferry_push(w2, c.t[2], &key, 1, one), 0);
	ferry_stats(c.fy[1], &s0);
	cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
	ferry_stats(c.fy[1], &s1);
	cr_assert_eq(v[0], 2.0f, "read %g after the move", v[0]);
	cr_assert_eq(s1.onesided_fallbacks - s0.onesided_fallbacks, 1);
	/* the reply taught node 1 the new slot: one read again */
	ferry_stats(c.fy[1], &s0);
	cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
	ferry_stats(c.fy[1], &s1);
	cr_assert_eq(v[0], 2.0f);
	cr_assert_eq(s1.onesided_reads - s0.onesided_reads, 1);
	cr_assert_eq(s1.msgs_sent, s0.msgs_sent);
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	ferry_worker_destroy(w2);
	tc_close(&c);
}

/*
 * While a worker polls the completion queue for its reads, the rdma transport
 * leaves that queue unarmed, so the progress thread is not woken per read.
 * Completions must still be taken once nobody polls: here node 0's worker
 * pulls one-sided (the queue goes unarmed), then idles, and node 1 localizes
 * node 0's keys. Node 0 hands them over by RDMA WRITE and sends HANDOVER_DONE
 * only once the writes completed, and nothing else reaches node 0: without
 * the progress thread re-arming the queue on its own, the localize hangs
 * until it times out. (On the loop transport completions are inline.)
 */
Test(onesided, a_hand_over_completes_after_the_readers_stopped_polling, .timeout = 120)
{
	struct ferry_table_params tp = { .num_keys = 8, .value_len = VLEN };
	uint64_t remote = 5, mine[4] = { 0, 1, 2, 3 }; /* range placement: 0..3 on node 0 */
	struct ferry_worker *w0, *w1;
	float v[4 * VLEN], one[4 * VLEN];
	struct ferry_stats s0, s1;
	struct tc c;

	use_onesided_transport();
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	for (int i = 0; i < 4 * VLEN; i++)
		one[i] = 1;
	cr_assert_eq(ferry_set(w0, c.t[0], mine, 4, one), 0);
	ferry_stats(c.fy[0], &s0);
	for (int i = 0; i < 1000; i++)
		cr_assert_eq(ferry_pull(w0, c.t[0], &remote, 1, v), 0);
	ferry_stats(c.fy[0], &s1);
	cr_assert_eq(s1.onesided_reads - s0.onesided_reads, 1000);
	/* node 0's worker is idle from here on */
	cr_assert_eq(ferry_localize(w1, c.t[1], mine, 4), 0,
		     "the hand-over never completed on the node whose readers stopped polling");
	cr_assert_eq(ferry_pull(w1, c.t[1], mine, 4, v), 0);
	for (int i = 0; i < 4 * VLEN; i++)
		cr_assert_eq(v[i], 1.0f, "value %d: %g after the move", i, v[i]);
	ferry_stats(c.fy[1], &s1);
	cr_assert_geq(s1.relocations_in, 4);
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	tc_close(&c);
}

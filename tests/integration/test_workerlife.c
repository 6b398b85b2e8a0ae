/* SPDX-License-Identifier: MIT */
/*
 * Integration: a worker destroyed while one of its one-sided reads is still
 * in flight. Two nodes as threads over the loop transport, whose reads
 * complete 400 ms late here (FERRY_LOOP_LATE_READS_MS), on a thread of their
 * own, as a NIC's completion may come after its poster gave up. The worker
 * starts a pull that goes as one READ and is destroyed at once: destroy waits
 * 100 ms for its reads, then leaves the landing pool to the late completion,
 * which must find nothing freed under it. The run under ASan (CI's
 * asan-ctest) is what checks it: the completion used to read the freed
 * worker.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "ferry/ferry.h"

static struct ferry_table_params tp = { .num_keys = 16, .value_len = 4 };

struct mk {
	struct ferry *fy;
	struct ferry_table *t;
	int rc;
};

static void *mk_thread(void *p)
{
	struct mk *m = p;

	m->rc = ferry_table_create(m->fy, &tp, &m->t);
	return NULL;
}

Test(workerlife, a_worker_destroyed_with_a_read_in_flight_leaves_nothing_dangling, .timeout = 60)
{
	struct ferry_stats before, after;
	struct ferry *fy[2];
	struct mk mk[2];
	pthread_t th[2];
	struct ferry_worker *w;
	struct ferry_params p;
	uint64_t key = 12, ticket; /* range placement: homed at rank 1 */
	float v[4];

	cr_assert_eq(setenv("FERRY_LOOP_LATE_READS_MS", "400", 1), 0);
	ferry_params_init(&p);
	p.transport = FERRY_TRANSPORT_LOOP;
	p.timeout_ms = 5000;
	cr_assert_eq(ferry_local_cluster_open(2, &p, fy), 0);
	for (int r = 0; r < 2; r++) {
		mk[r] = (struct mk){ .fy = fy[r] };
		cr_assert_eq(pthread_create(&th[r], NULL, mk_thread, &mk[r]), 0);
	}
	for (int r = 0; r < 2; r++) {
		pthread_join(th[r], NULL);
		cr_assert_eq(mk[r].rc, 0, "create on rank %d: %s", r, ferry_strerror(mk[r].rc));
	}
	cr_assert_eq(ferry_worker_create(fy[0], &w), 0);
	/* the first pull learns the slot (by message); the second is a READ,
	 * which completes late but is waited for */
	cr_assert_eq(ferry_pull(w, mk[0].t, &key, 1, v), 0);
	cr_assert_eq(ferry_stats(fy[0], &before), 0);
	cr_assert_eq(ferry_pull(w, mk[0].t, &key, 1, v), 0);
	cr_assert_eq(ferry_stats(fy[0], &after), 0);
	cr_assert_eq(after.onesided_reads, before.onesided_reads + 1, "the pull was no READ");

	/* a READ in flight, and the worker goes */
	cr_assert_eq(ferry_pull_start(w, mk[0].t, &key, 1, v, &ticket), 0);
	ferry_worker_destroy(w);
	usleep(700 * 1000); /* the late completion runs on its own thread */

	/* the node goes on: a new worker reads the key */
	cr_assert_eq(ferry_worker_create(fy[0], &w), 0);
	cr_assert_eq(ferry_pull(w, mk[0].t, &key, 1, v), 0);
	ferry_worker_destroy(w);
	for (int r = 0; r < 2; r++)
		ferry_table_destroy(mk[r].t);
	for (int r = 0; r < 2; r++)
		ferry_close(fy[r]);
	unsetenv("FERRY_LOOP_LATE_READS_MS");
}

/* SPDX-License-Identifier: MIT */
/*
 * Integration: a table's life across nodes. Destroy is fenced: a node that
 * destroyed a table keeps serving it (messages and one-sided access to its
 * registered arena) until every node destroyed it, then frees it, and the
 * id is reused by the next create on every node. Two nodes as threads over
 * the loop transport, which checks every one-sided access against the
 * target's registrations, as a NIC does.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>

#include "ferry/ferry.h"
#include "lib/core/core.h"

#define N 2

static struct ferry_table_params tp = { .num_keys = 16, .value_len = 4 };

struct life {
	struct ferry *fy[N];
	struct ferry_table *t[N];
	int rc[N];
};

struct life_arg {
	struct life *l;
	int rank;
};

static void *create_thread(void *p)
{
	struct life_arg *a = p;

	a->l->rc[a->rank] = ferry_table_create(a->l->fy[a->rank], &tp, &a->l->t[a->rank]);
	return NULL;
}

static void create_all(struct life *l)
{
	struct life_arg args[N];
	pthread_t th[N];

	for (int r = 0; r < N; r++) {
		args[r] = (struct life_arg){ .l = l, .rank = r };
		cr_assert_eq(pthread_create(&th[r], NULL, create_thread, &args[r]), 0);
	}
	for (int r = 0; r < N; r++) {
		pthread_join(th[r], NULL);
		cr_assert_eq(l->rc[r], 0, "rank %d: create: %s", r, ferry_strerror(l->rc[r]));
	}
}

Test(tablelife, a_table_destroyed_on_one_node_is_served_until_all_destroyed_it, .timeout = 60)
{
	struct ferry_params p;
	struct ferry_worker *w;
	struct ferry_stats before, after;
	struct life l = { 0 };
	uint64_t key = 12; /* range placement: homed at rank 1 */
	float v[4];

	ferry_params_init(&p);
	p.transport = FERRY_TRANSPORT_LOOP;
	p.timeout_ms = 5000;
	cr_assert_eq(ferry_local_cluster_open(N, &p, l.fy), 0);
	create_all(&l);
	cr_assert_eq(ferry_table_home(l.t[0], key), 1);
	cr_assert_eq(ferry_worker_create(l.fy[0], &w), 0);
	/* a first pull learns the slot; the next ones read it one-sided */
	cr_assert_eq(ferry_pull(w, l.t[0], &key, 1, v), 0);
	cr_assert_eq(ferry_pull(w, l.t[0], &key, 1, v), 0);
	cr_assert_eq(ferry_stats(l.fy[0], &before), 0);
	cr_assert_gt(before.onesided_reads, 0, "the loop transport reads one-sided");

	/* rank 1 is done with the table; rank 0 is not */
	ferry_table_destroy(l.t[1]);
	for (int i = 0; i < 100; i++)
		cr_assert_eq(ferry_pull(w, l.t[0], &key, 1, v), 0, "pull %d after rank 1's destroy",
			     i);
	cr_assert_eq(ferry_push(w, l.t[0], &key, 1, (float[4]){ 1, 2, 3, 4 }), 0);
	cr_assert_eq(ferry_stats(l.fy[0], &after), 0);
	/* every read found the arena still registered: none fell back */
	cr_assert_gt(after.onesided_reads, before.onesided_reads + 50);
	cr_assert_eq(after.onesided_fallbacks, before.onesided_fallbacks,
		     "a read met a deregistered arena");
	ferry_worker_destroy(w);
	ferry_table_destroy(l.t[0]);

	/* the id is free again on both nodes, and the new table works */
	create_all(&l);
	cr_assert_eq(l.t[0]->id, 0, "rank 0 did not reuse the id");
	cr_assert_eq(l.t[1]->id, 0, "rank 1 did not reuse the id");
	cr_assert_eq(ferry_worker_create(l.fy[1], &w), 0);
	cr_assert_eq(ferry_pull(w, l.t[1], &key, 1, v), 0);
	cr_assert_eq(v[0], 0.0f, "a new table starts at zero");
	ferry_worker_destroy(w);
	for (int r = 0; r < N; r++)
		ferry_table_destroy(l.t[r]);
	for (int r = 0; r < N; r++)
		ferry_close(l.fy[r]);
}

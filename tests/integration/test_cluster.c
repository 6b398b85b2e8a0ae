/* SPDX-License-Identifier: MIT */
/*
 * Integration: 4 nodes as threads of one process, over the transport that
 * FERRY_TRANSPORT names (tcp by default; rdma in the SoftRoCE VM).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "common/scenarios.h"

#define NODES 4

struct run_arg {
	struct sc_shared *sh;
	int which;
	int rounds;
};

static int run_one(struct tc *c, int rank, void *p)
{
	struct run_arg *a = p;

	switch (a->which) {
	case 0:
		return sc_semantics(c->fy[rank], c->t[rank], a->sh);
	case 1:
		return sc_localize_local(c->fy[rank], c->t[rank], a->sh);
	case 2:
		return sc_storm(c->fy[rank], c->t[rank], a->sh, a->rounds);
	default:
		return sc_async_order(c->fy[rank], c->t[rank], a->sh);
	}
}

static void run_scenario(int which, enum ferry_mode mode, int no_fast_path, int rounds)
{
	struct ferry_table_params tp;
	struct sc_shared *sh = calloc(1, sizeof(*sh));
	struct run_arg a = { .sh = sh, .which = which, .rounds = rounds };
	struct tc c;
	int rc;

	cr_assert_not_null(sh);
	sc_table_params(&tp, mode);
	tp.no_local_fast_path = no_fast_path;
	rc = tc_open(&c, NODES, &tp, 20000);
	cr_assert_eq(rc, 0, "cluster open: %s", ferry_strerror(rc));
	rc = tc_run(&c, run_one, &a);
	cr_assert_eq(rc, 0, "scenario failed: %s (%s)", ferry_strerror(rc), sh->why);
	cr_assert_eq(sh->failures, 0, "%s", sh->why);
	if (which == 2) {
		char why[512];

		cr_assert_eq(sc_check_history(sh, NODES, why, sizeof(why)), 0, "%s", why);
		if (mode == FERRY_MODE_DYNAMIC) {
			unsigned long long moved = 0;

			for (int i = 0; i < NODES; i++) {
				struct ferry_stats s;

				ferry_stats(c.fy[i], &s);
				moved += s.relocations_in;
			}
			cr_assert_gt(moved, 100, "only %llu relocations happened", moved);
		}
	}
	tc_close(&c);
	free(sh);
}

Test(cluster, pull_push_set_semantics)
{
	run_scenario(0, FERRY_MODE_DYNAMIC, 0, 0);
}

Test(cluster, localize_then_local_access_sends_no_message)
{
	run_scenario(1, FERRY_MODE_DYNAMIC, 0, 0);
}

Test(cluster, relocation_storm_loses_no_update_and_stays_consistent, .timeout = 240)
{
	run_scenario(2, FERRY_MODE_DYNAMIC, 0, 4000);
}

Test(cluster, async_ops_of_one_worker_apply_in_issue_order, .timeout = 120)
{
	run_scenario(3, FERRY_MODE_DYNAMIC, 0, 0);
}

Test(cluster, classic_mode_semantics)
{
	run_scenario(0, FERRY_MODE_CLASSIC, 0, 0);
}

Test(cluster, classic_mode_without_fast_path_is_consistent, .timeout = 240)
{
	run_scenario(2, FERRY_MODE_CLASSIC, 1, 2000);
}

Test(cluster, per_key_value_lengths_and_hash_placement)
{
	enum {
		KEYS = 100
	};
	static uint32_t lens[KEYS];
	struct ferry_table_params tp = { .num_keys = KEYS,
					 .value_lens = lens,
					 .placement = FERRY_PLACEMENT_HASH };
	struct ferry_worker *w;
	uint64_t keys[KEYS];
	size_t total = 0;
	float *vals, *back;
	struct tc c;
	int rc;

	for (int i = 0; i < KEYS; i++) {
		lens[i] = (uint32_t)(1 + i % 7);
		keys[i] = (uint64_t)i;
		total += lens[i];
	}
	rc = tc_open(&c, NODES, &tp, 20000);
	cr_assert_eq(rc, 0, "%s", ferry_strerror(rc));
	vals = calloc(total, sizeof(float));
	back = calloc(total, sizeof(float));
	for (size_t i = 0; i < total; i++)
		vals[i] = (float)i;
	cr_assert_eq(ferry_worker_create(c.fy[1], &w), 0);
	cr_assert_eq(ferry_set(w, c.t[1], keys, KEYS, vals), 0);
	cr_assert_eq(ferry_localize(w, c.t[1], keys, KEYS / 2), 0);
	cr_assert_eq(ferry_pull(w, c.t[1], keys, KEYS, back), 0);
	cr_assert_arr_eq(vals, back, total * sizeof(float));
	for (int i = 0; i < KEYS; i++)
		cr_assert_eq(ferry_table_value_len(c.t[1], (uint64_t)i), lens[i]);
	ferry_worker_destroy(w);
	free(vals);
	free(back);
	tc_close(&c);
}

Test(consistency, checker_rejects_a_lost_update_and_a_stale_read)
{
	struct sc_shared *sh = calloc(1, sizeof(*sh));
	char why[512];

	cr_assert_not_null(sh);
	/* push [0,10], push [20,30]; pull [40,50] reads 1: a completed push is missing */
	sh->count[0] = 3;
	sh->ev[0][0] = (struct sc_event){ .start_ns = 0, .end_ns = 10, .kind = 0 };
	sh->ev[0][1] = (struct sc_event){ .start_ns = 20, .end_ns = 30, .kind = 0 };
	sh->ev[0][2] = (struct sc_event){ .start_ns = 40, .end_ns = 50, .kind = 1, .value = 1 };
	sh->final[0] = 2;
	cr_assert_neq(sc_check_history(sh, 1, why, sizeof(why)), 0);
	cr_assert(strstr(why, "completed before the pull began"), "%s", why);
	/* the same with the right read passes */
	sh->ev[0][2].value = 2;
	cr_assert_eq(sc_check_history(sh, 1, why, sizeof(why)), 0, "%s", why);
	/* two reads in time order that go backwards */
	sh->count[1] = 2;
	sh->ev[1][0] =
		(struct sc_event){ .start_ns = 15, .end_ns = 16, .node = 1, .kind = 1, .value = 1 };
	sh->ev[1][1] =
		(struct sc_event){ .start_ns = 17, .end_ns = 35, .node = 1, .kind = 1, .value = 0 };
	cr_assert_neq(sc_check_history(sh, 2, why, sizeof(why)), 0);
	/* a final value that lost a push */
	sh->count[1] = 0;
	sh->final[0] = 1;
	cr_assert_neq(sc_check_history(sh, 1, why, sizeof(why)), 0);
	free(sh);
}

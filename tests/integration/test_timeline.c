/* SPDX-License-Identifier: MIT */
/*
 * The step stamps of ferry-bench --timeline (lib/core/timeline.h): a move
 * and a push stamp each step on the node that runs it, in protocol order,
 * and nothing while the timeline is off. On the loop transport, which
 * emulates one-sided writes, so the hand-over's WRITE is stamped too.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "lib/core/core.h"
#include "lib/core/timeline.h"

#define NKEYS 64

static void setup(void)
{
	setenv("FERRY_TRANSPORT", "loop", 1);
}

TestSuite(timeline, .init = setup, .timeout = 120);

static void params(struct ferry_table_params *tp)
{
	memset(tp, 0, sizeof(*tp));
	tp->num_keys = NKEYS;
	tp->value_len = 4;
}

/* a key whose home is @home */
static uint64_t key_homed(struct tc *c, int home, uint64_t from)
{
	for (uint64_t k = from; k < NKEYS; k++)
		if (ferry_table_home(c->t[0], k) == home)
			return k;
	cr_assert_fail("no key of %d keys is homed at rank %d", NKEYS, home);
	return 0;
}

/* the time of @step for @key on node @fy; -1 when not stamped; asserts at most one */
static int64_t stamp_of(struct ferry *fy, enum ferry_tl_step step, uint64_t key)
{
	const struct ferry_tl_ev *ev;
	uint64_t dropped;
	size_t n = ferry__tl_events(fy, &ev, &dropped);
	int64_t t = -1;

	cr_assert_eq(dropped, 0);
	for (size_t i = 0; i < n; i++) {
		if (ev[i].key != key || ev[i].step != (uint32_t)step)
			continue;
		cr_assert_eq(t, -1, "step %d of key %llu stamped twice", step,
			     (unsigned long long)key);
		t = ev[i].ns;
	}
	return t;
}

/* @steps happen on @fy for @key, each at or after the one before */
static void expect_order(struct ferry *fy, int rank, uint64_t key, const enum ferry_tl_step *steps,
			 int n)
{
	int64_t prev = 0;

	for (int i = 0; i < n; i++) {
		int64_t t = stamp_of(fy, steps[i], key);

		cr_assert_geq(t, 0, "rank %d: step %d of key %llu not stamped", rank, steps[i],
			      (unsigned long long)key);
		cr_assert_geq(t, prev, "rank %d: step %d of key %llu stamped before step %d", rank,
			      steps[i], (unsigned long long)key, steps[i ? i - 1 : 0]);
		prev = t;
	}
}

Test(timeline, a_move_and_a_push_stamp_every_step_in_order)
{
	static const enum ferry_tl_step req[] = { FERRY_TL_LOC_POST, FERRY_TL_LOC_NOTICE_RECV,
						  FERRY_TL_LOC_WAKE };
	static const enum ferry_tl_step home[] = { FERRY_TL_LOC_HOME_RECV, FERRY_TL_LOC_HOME_FWD };
	static const enum ferry_tl_step owner[] = { FERRY_TL_LOC_OWNER_RECV,
						    FERRY_TL_LOC_WRITE_POST,
						    FERRY_TL_LOC_WRITE_DONE,
						    FERRY_TL_LOC_NOTICE_SENT };
	static const enum ferry_tl_step pusher[] = { FERRY_TL_PUSH_POST, FERRY_TL_REPLY_RECV };
	static const enum ferry_tl_step served[] = { FERRY_TL_OP_RECV, FERRY_TL_OP_APPLIED,
						     FERRY_TL_REPLY_SENT };
	struct ferry_table_params tp;
	struct ferry_worker *w0, *w2;
	const struct ferry_tl_ev *ev;
	float one[4] = { 1, 1, 1, 1 };
	uint64_t moved, pushed, dropped;
	struct tc c;

	params(&tp);
	cr_assert_eq(tc_open(&c, 3, &tp, 20000), 0);
	moved = key_homed(&c, 1, 0);
	pushed = key_homed(&c, 1, moved + 1);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[2], &w2), 0);
	/* owner != home: rank 2 takes the key first, with the timeline off */
	cr_assert_eq(ferry_localize(w2, c.t[2], &moved, 1), 0);
	/* a pull teaches rank 0 the owner, so it reserves a landing entry in
	 * rank 2's region and the value comes by WRITE */
	cr_assert_eq(ferry_pull(w0, c.t[0], &moved, 1, one), 0);
	for (int r = 0; r < 3; r++) {
		cr_assert_eq(ferry__tl_events(c.fy[r], &ev, &dropped), 0, "off: nothing stamped");
		cr_assert_eq(ferry__tl_enable(c.fy[r], 1024), 0);
	}
	cr_assert_eq(ferry__tl_enable(c.fy[0], 1024), -EALREADY);

	cr_assert_eq(ferry_localize(w0, c.t[0], &moved, 1), 0);
	cr_assert_eq(ferry_push(w0, c.t[0], &pushed, 1, one), 0);
	expect_order(c.fy[0], 0, moved, req, 3);
	expect_order(c.fy[1], 1, moved, home, 2);
	expect_order(c.fy[2], 2, moved, owner, 4);
	expect_order(c.fy[0], 0, pushed, pusher, 2);
	expect_order(c.fy[1], 1, pushed, served, 3);
	/* each step on the node that runs it, and only there */
	cr_assert_eq(stamp_of(c.fy[1], FERRY_TL_LOC_POST, moved), -1);
	cr_assert_eq(stamp_of(c.fy[2], FERRY_TL_LOC_HOME_RECV, moved), -1);
	cr_assert_eq(stamp_of(c.fy[0], FERRY_TL_OP_RECV, pushed), -1);

	ferry__tl_reset(c.fy[0]);
	cr_assert_eq(ferry__tl_events(c.fy[0], &ev, &dropped), 0);
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w2);
	tc_close(&c);
}

Test(timeline, a_full_buffer_counts_what_it_drops)
{
	struct ferry_table_params tp;
	const struct ferry_tl_ev *ev;
	struct ferry_worker *w;
	uint64_t key, dropped;
	struct tc c;

	params(&tp);
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	key = key_homed(&c, 1, 0);
	cr_assert_eq(ferry__tl_enable(c.fy[0], 0), -EINVAL);
	cr_assert_eq(ferry__tl_enable(c.fy[0], 2), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	/* POST, NOTICE_RECV, WAKE: three stamps into two places */
	cr_assert_eq(ferry_localize(w, c.t[0], &key, 1), 0);
	cr_assert_eq(ferry__tl_events(c.fy[0], &ev, &dropped), 2);
	cr_assert_eq(dropped, 1);
	cr_assert_eq(ev[0].step, FERRY_TL_LOC_POST);
	cr_assert_eq(ev[0].key, key);
	ferry_worker_destroy(w);
	tc_close(&c);
}

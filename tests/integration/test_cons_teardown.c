/* SPDX-License-Identifier: MIT */
/*
 * Integration: a table with a consistency model destroyed while frames for
 * it keep arriving (lib/cons/cons.c, ferry__cons_table_fini). The table is
 * served on after ferry_table_destroy() until every node destroyed it, and
 * the progress thread's CONS_PUSH handler reads the table's consistency
 * state under RCU: the state is freed only after a grace period, and a
 * handler that comes later finds none and drops the frame.
 *
 * Node 1 sends CONS_PUSH frames by hand (the same batch again and again: a
 * copy, answered from the record, never a fault of the sender) as fast as it
 * can, while node 0 destroys the table at a random moment; 40 rounds. Under
 * AddressSanitizer (CI's asan stage) a handler that used freed state would
 * abort the test; the rounds must also go on (no node dropped, the next
 * table created).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cluster.h"
#include "lib/core/core.h"
#include "lib/core/proto.h"

#define ROUNDS 40

struct flood {
	struct ferry *from;
	uint32_t table;
	atomic_int stop;
	uint64_t sent;
};

/* batch 1 of one key's delta, from node 1 to node 0 */
static int flood_send(struct flood *fl, uint64_t key)
{
	struct ferry_frame f;
	struct ferry_msg_cons_push *m;
	struct ferry_msg_cons_key *k;
	float *v;
	int rc;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	k = ferry__frame_put(&f, sizeof(*k));
	v = ferry__frame_put(&f, sizeof(*v));
	if (!m || !k || !v) {
		ferry__frame_free(&f);
		return -ENOMEM;
	}
	m = (struct ferry_msg_cons_push *)(f.buf + sizeof(struct ferry_msg_hdr));
	k = (struct ferry_msg_cons_key *)(m + 1);
	v = (float *)(k + 1);
	*m = (struct ferry_msg_cons_push){ .seq = 1, .total = 1, .count = 1 };
	*k = (struct ferry_msg_cons_key){ .key = key, .idx = 0, .len = 1 };
	*v = 1;
	rc = ferry__frame_finish(&f, FERRY_MSG_CONS_PUSH, 1, fl->table);
	if (!rc)
		rc = ferry__send(fl->from, 0, f.buf, f.len);
	ferry__frame_free(&f);
	return rc;
}

static void *flood_main(void *p)
{
	struct flood *fl = p;

	while (!atomic_load(&fl->stop))
		if (flood_send(fl, fl->sent++ % 16))
			usleep(100); /* the link is full: let it drain */
	return NULL;
}

static int create_node(struct tc *c, int rank, void *arg)
{
	struct ferry_table_params tp;

	(void)arg;
	memset(&tp, 0, sizeof(tp));
	tp.num_keys = 16;
	tp.value_len = 1;
	tp.placement = FERRY_PLACEMENT_RANGE; /* keys 0 .. 7 live at node 0 */
	tp.consistency = FERRY_CONS_EVENTUAL;
	return ferry_table_create(c->fy[rank], &tp, &c->t[rank]);
}

static void quiet(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)level;
	(void)msg;
	(void)arg;
}

Test(cons_teardown, frames_that_arrive_while_a_table_is_destroyed_touch_nothing_freed,
     .timeout = 180)
{
	uint64_t seed = 7, sent = 0;
	struct tc c;

	cr_assert_eq(tc_open(&c, 2, NULL, 10000), 0);
	/* dropped frames of a destroyed table are logged as warnings: many */
	ferry_log_set(FERRY_LOG_ERROR, quiet, NULL);
	for (int r = 0; r < ROUNDS; r++) {
		struct flood fl = { .from = c.fy[1] };
		pthread_t th;

		cr_assert_eq(tc_run(&c, create_node, NULL), 0, "round %d: create", r);
		fl.table = c.t[1]->id;
		cr_assert_eq(pthread_create(&th, NULL, flood_main, &fl), 0);
		usleep(500 + (useconds_t)(tc_rand(&seed) % 3000));
		ferry_table_destroy(c.t[0]);
		c.t[0] = NULL;
		usleep((useconds_t)(tc_rand(&seed) % 2000));
		atomic_store(&fl.stop, 1);
		pthread_join(th, NULL);
		ferry_table_destroy(c.t[1]);
		c.t[1] = NULL;
		sent += fl.sent;
		for (int n = 0; n < 2; n++)
			cr_assert(!atomic_load(&c.fy[1 - n]->failed[n]),
				  "round %d: rank %d dropped", r, n);
	}
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	cr_assert_gt(sent, (uint64_t)ROUNDS, "too few frames were sent to test anything");
	cr_log_info("cons_teardown: %llu frames sent over %d rounds", (unsigned long long)sent,
		    ROUNDS);
	tc_close(&c);
}

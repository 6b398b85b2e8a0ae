/* SPDX-License-Identifier: MIT */
/*
 * Bad input: every case is answered with a negative errno and one clear log
 * line, never a crash or an unbounded wait, and the other nodes keep serving.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "lib/core/bootstrap.h"
#include "lib/core/core.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_errors;
static char log_last[1024];

static void log_capture(enum ferry_log_level level, const char *msg, void *arg)
{
	pthread_mutex_lock(&log_lock);
	if (level == FERRY_LOG_ERROR) {
		log_errors++;
		snprintf(log_last, sizeof(log_last), "%s", msg);
	}
	pthread_mutex_unlock(&log_lock);
}

static void log_reset(void)
{
	pthread_mutex_lock(&log_lock);
	log_errors = 0;
	log_last[0] = '\0';
	pthread_mutex_unlock(&log_lock);
}

static void setup(void)
{
	ferry_log_set(FERRY_LOG_WARN, log_capture, NULL);
}

TestSuite(badinput, .init = setup, .timeout = 60);

static struct ferry_table_params small = { .num_keys = 32, .value_len = 4 };

Test(badinput, key_out_of_range_null_buffers_and_wrong_lengths)
{
	struct ferry_worker *w;
	struct tc c;
	uint64_t key = 32, ok = 3;
	float v[8];
	uint64_t t_;

	cr_assert_eq(tc_open(&c, 2, &small, 5000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);

	log_reset();
	cr_assert_eq(ferry_pull(w, c.t[0], &key, 1, v), -ERANGE);
	cr_assert_eq(log_errors, 1, "one line per error, got %d", log_errors);
	cr_assert(strstr(log_last, "key 32 is out of range"), "%s", log_last);
	cr_assert_eq(ferry_push_start(w, c.t[0], &key, 1, v, &t_), -ERANGE);
	cr_assert_eq(ferry_localize(w, c.t[0], &key, 1), -ERANGE);

	log_reset();
	cr_assert_eq(ferry_pull(w, c.t[0], &ok, 1, NULL), -EINVAL);
	cr_assert_eq(ferry_push(w, c.t[0], NULL, 1, v), -EINVAL);
	cr_assert_eq(ferry_pull(NULL, c.t[0], &ok, 1, v), -EINVAL);
	cr_assert_eq(ferry_pull(w, NULL, &ok, 1, v), -EINVAL);
	cr_assert_eq(ferry_pull_start(w, c.t[0], &ok, 1, v, NULL), -EINVAL);
	cr_assert_eq(ferry_wait(w, 12345), -ENOENT);
	cr_assert_eq(log_errors, 6, "got %d error lines", log_errors);
	/* n == 0 is a valid empty batch */
	cr_assert_eq(ferry_pull(w, c.t[0], NULL, 0, NULL), 0);

	/* the node still works */
	cr_assert_eq(ferry_pull(w, c.t[0], &ok, 1, v), 0);
	ferry_worker_destroy(w);
	tc_close(&c);
}

static int create_bad(struct tc *c, int rank, void *arg)
{
	struct ferry_table_params p = small;
	struct ferry_table *t;
	int rc;

	if (rank == 1)
		p.value_len = 8; /* differs from the others */
	rc = ferry_table_create(c->fy[rank], &p, &t);
	if (!rc) {
		ferry_table_destroy(t);
		return -1000; /* must not succeed */
	}
	return rc == -FERRY_E_MISMATCH ? 0 : rc;
}

Test(badinput, tables_with_different_parameters_are_refused_everywhere)
{
	struct ferry_table_params bad = small;
	struct ferry_table *t;
	struct tc c;

	cr_assert_eq(tc_open(&c, 3, NULL, 5000), 0);
	log_reset();
	cr_assert_eq(tc_run(&c, create_bad, NULL), 0);
	cr_assert(strstr(log_last, "value_len"), "the log names the field: %s", log_last);
	/* invalid parameters are refused before anything is sent */
	bad.value_len = 0;
	cr_assert_eq(ferry_table_create(c.fy[0], &bad, &t), -EINVAL);
	bad = small;
	bad.num_keys = 0;
	cr_assert_eq(ferry_table_create(c.fy[0], &bad, &t), -EINVAL);
	bad = small;
	bad.placement = 7;
	cr_assert_eq(ferry_table_create(c.fy[0], &bad, &t), -EINVAL);
	tc_close(&c);
}

/* rank 2 creates the table only after the others gave up waiting for it */
static int create_late(struct tc *c, int rank, void *arg)
{
	int *results = arg;
	struct ferry_table *t;
	int rc;

	if (rank == 2)
		usleep(2500 * 1000); /* 2.5 timeouts */
	rc = ferry_table_create(c->fy[rank], &small, &t);
	results[rank] = rc;
	if (!rc)
		ferry_table_destroy(t);
	return 0;
}

Test(badinput, a_table_create_that_times_out_anywhere_fails_everywhere, .timeout = 60)
{
	int results[3] = { 1, 1, 1 };
	struct tc c;

	cr_assert_eq(tc_open(&c, 3, NULL, 1000), 0);
	log_reset();
	cr_assert_eq(tc_run(&c, create_late, results), 0);
	/* before: ranks 0 and 1 failed, and rank 2, arriving last, completed
	 * the handshake and served a table nobody else had */
	for (int r = 0; r < 3; r++)
		cr_assert_eq(results[r], -ETIMEDOUT, "rank %d: %s", r, ferry_strerror(results[r]));
	tc_close(&c);
}

Test(badinput, use_after_close)
{
	struct ferry_worker *w;
	struct tc c;
	uint64_t key = 1, tk;
	float v[4];

	cr_assert_eq(tc_open(&c, 1, &small, 5000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	ferry_close(c.fy[0]);
	cr_assert_eq(ferry_pull(w, c.t[0], &key, 1, v), -FERRY_E_CLOSED);
	cr_assert_eq(ferry_push_start(w, c.t[0], &key, 1, v, &tk), -FERRY_E_CLOSED);
	cr_assert_eq(ferry_localize(w, c.t[0], &key, 1), -FERRY_E_CLOSED);
	ferry_worker_destroy(w);
	ferry_table_destroy(c.t[0]);
}

/* a peer that sends a frame the transport accepts but the core must refuse */
Test(badinput, a_peer_that_sends_garbage_is_dropped_and_the_others_keep_serving)
{
	struct ferry_worker *w0, *w2;
	struct ferry_frame f;
	struct ferry_msg_op *op;
	struct ferry_msg_key *k;
	struct tc c;
	uint64_t key0 = 0, key1 = 12;
	float v[4];

	cr_assert_eq(tc_open(&c, 3, &small, 3000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[2], &w2), 0);

	/* rank 1 sends rank 0 an OP for key 999 of a 32-key table */
	ferry__frame_begin(&f);
	op = ferry__frame_put(&f, sizeof(*op));
	op->origin = 1;
	op->op = FERRY_OP_PULL;
	op->count = 1;
	k = ferry__frame_put(&f, sizeof(*k));
	k->key = 999;
	k->len = 4;
	cr_assert_eq(ferry__frame_finish(&f, FERRY_MSG_OP, 1, c.t[1]->id), 0);
	log_reset();
	cr_assert_eq(ferry__send(c.fy[1], 0, f.buf, f.len), 0);
	ferry__frame_free(&f);
	for (int i = 0; i < 200 && !log_errors; i++)
		usleep(10000);
	cr_assert_eq(log_errors, 1, "one error line, got %d", log_errors);
	cr_assert(strstr(log_last, "rank 1"), "%s", log_last);
	cr_assert(strstr(log_last, "key out of range"), "%s", log_last);

	/* rank 2 and rank 0 keep talking */
	cr_assert_eq(ferry_pull(w2, c.t[2], &key0, 1, v), 0);
	cr_assert_eq(ferry_push(w0, c.t[0], &key0, 1, (float[4]){ 1, 1, 1, 1 }), 0);
	/* rank 0 no longer talks to rank 1: keys homed there fail, bounded */
	cr_assert_eq(ferry_pull(w0, c.t[0], &key1, 1, v), -FERRY_E_PEER);
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w2);
	tc_close(&c);
}

Test(badinput, a_peer_that_disconnects_fails_its_keys_not_the_node)
{
	struct ferry_worker *w0;
	struct tc c;
	uint64_t key0 = 0, key1 = 12, key2 = 25;
	float v[4];
	int rc;

	cr_assert_eq(tc_open(&c, 3, &small, 1500), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	ferry_table_destroy(c.t[1]);
	c.t[1] = NULL;
	ferry_close(c.fy[1]);
	c.fy[1] = NULL;
	usleep(100000);
	rc = ferry_pull(w0, c.t[0], &key1, 1, v);
	cr_assert(rc == -FERRY_E_PEER || rc == -ETIMEDOUT, "got %s", ferry_strerror(rc));
	cr_assert_eq(ferry_pull(w0, c.t[0], &key0, 1, v), 0);
	cr_assert_eq(ferry_pull(w0, c.t[0], &key2, 1, v), 0);
	ferry_worker_destroy(w0);
	ferry_table_destroy(c.t[0]);
	ferry_table_destroy(c.t[2]);
	ferry_close(c.fy[0]);
	ferry_close(c.fy[2]);
}

struct join_arg {
	struct ferry_params p;
	int rc;
};

static void *join_thread(void *p)
{
	struct join_arg *a = p;
	struct ferry *fy;

	a->rc = ferry_open(&a->p, &fy);
	if (!a->rc)
		ferry_close(fy);
	return NULL;
}

Test(badinput, a_rank_that_never_joins_is_named_and_the_wait_is_bounded)
{
	struct join_arg a[2];
	pthread_t th[2];
	char rdv[64];
	int lfd = ferry__listen_tcp("127.0.0.1", 0, 16);

	cr_assert_geq(lfd, 0);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", ferry__socket_port(lfd));
	log_reset();
	for (int i = 0; i < 2; i++) {
		ferry_params_init(&a[i].p);
		a[i].p.rank = i;
		a[i].p.world = 3; /* rank 2 never comes */
		a[i].p.rendezvous = rdv;
		a[i].p.rendezvous_fd = i == 0 ? lfd : -1;
		a[i].p.bind_addr = "127.0.0.1";
		a[i].p.transport = FERRY_TRANSPORT_TCP;
		a[i].p.timeout_ms = 800;
		pthread_create(&th[i], NULL, join_thread, &a[i]);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(a[0].rc, -FERRY_E_NOJOIN, "rank 0: %s", ferry_strerror(a[0].rc));
	cr_assert_eq(a[1].rc, -FERRY_E_NOJOIN, "rank 1: %s", ferry_strerror(a[1].rc));
	cr_assert(strstr(log_last, "2 never joined") || strstr(log_last, "rank 2 of 3"), "%s",
		  log_last);
	close(lfd);
}

Test(badinput, a_frame_that_speaks_for_another_node_drops_its_sender_and_the_drop_is_mutual)
{
	struct ferry_worker *w0, *w1, *w2;
	struct ferry_frame f;
	struct ferry_msg_op *op;
	struct ferry_msg_key *k;
	struct tc c;
	uint64_t key0 = 0, key2 = 30;
	float v[4];
	int i;

	cr_assert_eq(tc_open(&c, 3, &small, 3000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	cr_assert_eq(ferry_worker_create(c.fy[2], &w2), 0);

	/* rank 1 sends rank 0 a first-hand pull whose reply would go to rank 2 */
	ferry__frame_begin(&f);
	op = ferry__frame_put(&f, sizeof(*op));
	op->origin = 2;
	op->worker = 0;
	op->req = 77;
	op->op = FERRY_OP_PULL;
	op->count = 1;
	k = ferry__frame_put(&f, sizeof(*k));
	k->key = key0;
	k->len = 4;
	cr_assert_eq(ferry__frame_finish(&f, FERRY_MSG_OP, 1, c.t[1]->id), 0);
	log_reset();
	cr_assert_eq(ferry__send(c.fy[1], 0, f.buf, f.len), 0);
	ferry__frame_free(&f);
	for (i = 0; i < 200 && !log_errors; i++)
		usleep(10000);
	cr_assert_eq(log_errors, 1, "one error line, got %d", log_errors);
	cr_assert(strstr(log_last, "worker 0 of rank 2"), "%s", log_last);
	cr_assert(strstr(log_last, "dropping rank 1"), "%s", log_last);

	/* rank 1 learns it too (the connection was closed), within a moment */
	for (i = 0; i < 200 && !atomic_load(&c.fy[1]->failed[0]); i++)
		usleep(10000);
	cr_assert(atomic_load(&c.fy[1]->failed[0]), "rank 1 still thinks rank 0 is alive");
	cr_assert_eq(ferry_pull(w1, c.t[1], &key0, 1, v), -FERRY_E_PEER);
	/* ranks 0 and 2 keep talking, both ways */
	cr_assert_eq(ferry_pull(w2, c.t[2], &key0, 1, v), 0);
	cr_assert_eq(ferry_pull(w0, c.t[0], &key2, 1, v), 0);
	cr_assert(!atomic_load(&c.fy[2]->failed[0]) && !atomic_load(&c.fy[0]->failed[2]));
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	ferry_worker_destroy(w2);
	tc_close(&c);
}

Test(badinput, a_header_that_names_another_sender_drops_the_connection)
{
	struct ferry_worker *w2;
	struct ferry_msg_hdr *h;
	struct ferry_frame f;
	struct ferry_msg_barrier *b;
	struct tc c;
	uint64_t key0 = 0;
	float v[4];
	int i;

	cr_assert_eq(tc_open(&c, 3, &small, 3000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[2], &w2), 0);
	/* a well-formed barrier frame from rank 1 whose header says rank 2 */
	ferry__frame_begin(&f);
	b = ferry__frame_put(&f, sizeof(*b));
	b->gen = 0;
	cr_assert_eq(ferry__frame_finish(&f, FERRY_MSG_BARRIER, 1, 0), 0);
	h = (struct ferry_msg_hdr *)f.buf;
	h->src = 2;
	log_reset();
	cr_assert_eq(c.fy[1]->tp->ops->send(c.fy[1]->tp, 0, &(struct iovec){ f.buf, f.len }, 1), 0);
	ferry__frame_free(&f);
	/* the transport checks the header against the connection */
	for (i = 0; i < 200 && !atomic_load(&c.fy[0]->failed[1]); i++)
		usleep(10000);
	cr_assert(atomic_load(&c.fy[0]->failed[1]), "rank 1 was not dropped");
	cr_assert(!atomic_load(&c.fy[0]->failed[2]));
	cr_assert_eq(ferry_pull(w2, c.t[2], &key0, 1, v), 0);
	ferry_worker_destroy(w2);
	tc_close(&c);
}

Test(badinput, a_ticket_the_worker_never_handed_out_is_enoent_and_harms_nothing)
{
	struct ferry_worker *w;
	struct tc c;
	uint64_t key = 1, t;
	float v[4];

	cr_assert_eq(tc_open(&c, 1, &small, 3000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	/* what a zeroed ticket variable holds after a failed start, on a fresh worker */
	cr_assert_eq(ferry_wait(w, 0), -ENOENT);
	cr_assert_eq(ferry_test(w, 0), -ENOENT);
	cr_assert_eq(ferry_wait(w, 12345), -ENOENT);
	cr_assert_eq(ferry_pull_start(w, c.t[0], &key, 1, v, &t), 0);
	cr_assert_eq(ferry_wait(w, t), 0);
	/* on a used worker: still -ENOENT, and no slot is freed twice */
	cr_assert_eq(ferry_wait(w, 0), -ENOENT);
	cr_assert_eq(ferry_test(w, 0), -ENOENT);
	cr_assert_eq(ferry_wait(w, t), -ENOENT, "a collected ticket is unknown");
	/* more tickets than the worker's table holds, one after another: a
	 * corrupted free list would answer -EBUSY or hand out a slot twice */
	for (int i = 0; i < 3 * 1024; i++) {
		cr_assert_eq(ferry_push_start(w, c.t[0], &key, 1, (float[4]){ 1, 0, 0, 0 }, &t), 0,
			     "start %d", i);
		cr_assert_eq(ferry_wait(w, t), 0, "wait %d", i);
	}
	cr_assert_eq(ferry_pull(w, c.t[0], &key, 1, v), 0);
	cr_assert_eq(v[0], 3 * 1024.0f);
	ferry_worker_destroy(w);
	tc_close(&c);
}

Test(badinput, a_batch_with_a_bad_key_applies_none_of_it)
{
	struct ferry_worker *w;
	struct tc c;
	uint64_t keys[3] = { 1, 2, 32 }; /* the last is out of range */
	float ones[12], v[8];

	for (int i = 0; i < 12; i++)
		ones[i] = 1;
	cr_assert_eq(tc_open(&c, 2, &small, 3000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w), 0);
	cr_assert_eq(ferry_push(w, c.t[0], keys, 3, ones), -ERANGE);
	cr_assert_eq(ferry_set(w, c.t[0], keys, 3, ones), -ERANGE);
	cr_assert_eq(ferry_pull(w, c.t[0], keys, 2, v), 0);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(v[i], 0.0f, "value %d was applied from a refused batch", i);
	ferry_worker_destroy(w);
	tc_close(&c);
}

Test(badinput, an_unknown_enum_in_the_node_parameters_is_einval)
{
	struct ferry_params p;
	struct ferry *fy = NULL;

	ferry_params_init(&p);
	p.transport = (enum ferry_transport_kind)42;
	log_reset();
	cr_assert_eq(ferry_open(&p, &fy), -EINVAL);
	cr_assert(strstr(log_last, "transport 42"), "%s", log_last);
	ferry_params_init(&p);
	p.busy_poll = 5;
	log_reset();
	cr_assert_eq(ferry_open(&p, &fy), -EINVAL);
	cr_assert(strstr(log_last, "busy_poll 5"), "%s", log_last);
	cr_assert_null(fy);
}

/*
 * A rejoin's bad parameters are refused before the node listens or dials,
 * and a rejoin where no cluster runs at once, each with a line that says
 * what to do (test_rejoin: the verdicts of a running cluster's rank 0).
 */
Test(badinput, a_rejoin_is_refused_at_once_with_what_to_do_instead)
{
	struct ferry_params p;
	struct ferry *fy = NULL;
	struct timespec t0, t1;
	double ms;

	ferry_params_init(&p);
	p.rank = 0;
	p.world = 1;
	p.rejoin = 1;
	log_reset();
	cr_assert_eq(ferry_open(&p, &fy), -EINVAL);
	cr_assert(strstr(log_last, "no cluster to rejoin"), "%s", log_last);

	p.world = 4;
	p.rendezvous = "127.0.0.1:1";
	log_reset();
	cr_assert_eq(ferry_open(&p, &fy), -EINVAL);
	cr_assert(strstr(log_last, "replace rank 0") && strstr(log_last, "ferry_restore"), "%s",
		  log_last);

	p.rank = 3;
	p.timeout_ms = 20000;
	log_reset();
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(ferry_open(&p, &fy), -FERRY_E_NOJOIN);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	cr_assert_lt(ms, 2000.0, "the refusal took %.0f ms", ms);
	cr_assert(strstr(log_last, "rank 3 found no cluster at 127.0.0.1:1"), "%s", log_last);

	p.rejoin = 2;
	log_reset();
	cr_assert_eq(ferry_open(&p, &fy), -EINVAL);
	cr_assert(strstr(log_last, "rejoin 2"), "%s", log_last);

	/* the variable, when the parameter is not set */
	p.rejoin = 0;
	setenv("FERRY_REJOIN", "yes", 1);
	log_reset();
	cr_assert_eq(ferry_open(&p, &fy), -EINVAL);
	cr_assert(strstr(log_last, "FERRY_REJOIN=yes"), "%s", log_last);
	setenv("FERRY_REJOIN", "1", 1);
	log_reset();
	cr_assert_eq(ferry_open(&p, &fy), -FERRY_E_NOJOIN);
	cr_assert(strstr(log_last, "rank 3 found no cluster"), "%s", log_last);
	cr_assert_null(fy);

	/* -1 overrides the variable: a world of 1 opens */
	ferry_params_init(&p);
	p.rank = 0;
	p.world = 1;
	p.rejoin = -1;
	cr_assert_eq(ferry_open(&p, &fy), 0);
	ferry_close(fy);
	unsetenv("FERRY_REJOIN");
}

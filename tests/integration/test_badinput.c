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

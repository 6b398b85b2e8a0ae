/* SPDX-License-Identifier: MIT */
/*
 * Protocol roles (issue 16, item 2): a frame that only one node may send at
 * a point of a protocol, sent by another member, is logged and dropped with
 * no change of state. Three nodes (threads); node 1 plays the forger and
 * sends, through its real connection (ferry__send), what the protocol
 * reserves to others:
 *
 *   - a HANDOVER and a HANDOVER_DONE of a key node 0 is localizing from
 *     node 2, naming node 0's real slot and landing entry (the worst case: a
 *     forger that guessed both) but not the move's ticket, which only the
 *     home and the old owner learn. Node 0 keeps waiting for the real value,
 *     which then arrives; the forged value is nowhere;
 *   - a barrier release (rank 0's to send) for a barrier node 1 has not
 *     entered, and a barrier entry far ahead of its turn;
 *   - rank 0's word that a table was destroyed everywhere, to a node that
 *     has not destroyed it.
 *
 * To hold the move open while the forgeries arrive, the test holds node 2's
 * pend lock, which node 2's hand-over handler needs.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <urcu/urcu-memb.h>

#include "common/cluster.h"
#include "lib/core/core.h"

#define NODES 3
#define NKEYS 30 /* range placement: 0-9 on node 0, 10-19 on 1, 20-29 on 2 */
#define VLEN 4
#define KEY 25 /* home and owner: node 2 */

static const struct ferry_table_params tparams = { .num_keys = NKEYS, .value_len = VLEN };

/* ---- the log, kept ------------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_lines[256][512];
static int log_n;

static void log_cb(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)level;
	(void)arg;
	pthread_mutex_lock(&log_lock);
	if (log_n < 256)
		snprintf(log_lines[log_n++], sizeof(log_lines[0]), "%s", msg);
	pthread_mutex_unlock(&log_lock);
}

static void log_capture(void)
{
	ferry_log_set(FERRY_LOG_WARN, log_cb, NULL);
}

/* the count of lines with @a and @b once it reached @n, or after 5 s */
static int log_wait(const char *a, const char *b, int n)
{
	for (int tries = 0; tries < 500; tries++) {
		int got = 0;

		pthread_mutex_lock(&log_lock);
		for (int i = 0; i < log_n; i++)
			if (strstr(log_lines[i], a) && (!b || strstr(log_lines[i], b)))
				got++;
		pthread_mutex_unlock(&log_lock);
		if (got >= n)
			return got;
		usleep(10000);
	}
	return 0;
}

TestSuite(roles, .init = log_capture, .timeout = 60);

/* ---- forged hand-overs ----------------------------------------------------- */

/* what node 0 waits for: its move of KEY, copied under the pend lock */
struct pend_seen {
	int found;
	uint32_t slot, landing, ticket;
};

static struct pend_seen pend_look(struct ferry_table *t)
{
	struct pend_seen s = { 0 };
	struct ferry_pend *e;

	urcu_memb_read_lock();
	pthread_mutex_lock(&t->pend.lock);
	e = ferry__pend_find(&t->pend, KEY);
	if (e)
		s = (struct pend_seen){ 1, e->slot, e->landing, e->ticket };
	pthread_mutex_unlock(&t->pend.lock);
	urcu_memb_read_unlock();
	return s;
}

/* node 1 sends node 0 a move frame of @type for KEY, as if it held the key */
static void forge_move(struct tc *c, uint8_t type, const struct pend_seen *p, uint32_t ticket,
		       float v)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_move m;
		struct ferry_msg_mv mv;
		float vals[VLEN];
	} f;
	size_t len = type == FERRY_MSG_HANDOVER ? sizeof(f) : sizeof(f) - sizeof(f.vals);

	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, type, (uint32_t)len, 1, c->t[0]->id);
	f.m.requester = 0;
	f.m.count = 1;
	f.mv.key = KEY;
	f.mv.slot = p->slot;
	f.mv.len = type == FERRY_MSG_HANDOVER ? VLEN : 0;
	f.mv.landing = type == FERRY_MSG_HANDOVER ? FERRY_LANDING_NONE : p->landing;
	f.mv.ticket = ticket;
	for (int i = 0; i < VLEN; i++)
		f.vals[i] = v;
	cr_assert_eq(ferry__send(c->fy[1], 0, &f, len), 0, "the forger could not send");
}

static void forged_handover_case(void)
{
	const uint64_t key = KEY;
	float val[VLEN] = { 1.5f, 2.5f, 3.5f, 4.5f }, got[VLEN];
	struct ferry_worker *w0, *w2;
	struct pend_seen p = { 0 };
	struct tc c;
	uint64_t ticket;
	int forged = 0;

	cr_assert_eq(tc_open(&c, NODES, &tparams, 5000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[2], &w2), 0);
	cr_assert_eq(ferry_set(w2, c.t[2], &key, 1, val), 0);

	/* node 2 cannot hand KEY over while the test holds its pend lock */
	pthread_mutex_lock(&c.t[2]->pend.lock);
	cr_assert_eq(ferry_localize_start(w0, c.t[0], &key, 1, &ticket), 0);
	for (int tries = 0; tries < 500 && !p.found; tries++) {
		p = pend_look(c.t[0]);
		usleep(1000);
	}
	cr_assert(p.found, "node 0 does not wait for key %d", KEY);

	/* the right slot and landing entry, another ticket: dropped */
	forge_move(&c, FERRY_MSG_HANDOVER, &p, p.ticket ^ 0x5a5a5a5a, 666.0f);
	forged++;
	if (p.landing != FERRY_LANDING_NONE) {
		forge_move(&c, FERRY_MSG_HANDOVER_DONE, &p, p.ticket + 1, 0);
		forged++;
	}
	cr_expect_eq(log_wait("rank 1 handed over key 25", "a forgery", forged), forged,
		     "node 0 did not refuse the forged hand-overs");
	{
		struct pend_seen q = pend_look(c.t[0]);

		cr_expect(q.found && q.slot == p.slot && q.landing == p.landing &&
				  q.ticket == p.ticket,
			  "a forged hand-over changed node 0's move");
	}
	cr_expect_null(ferry__own(c.t[0], KEY), "node 0 serves a forged value");
	cr_expect_eq(ferry_test(w0, ticket), -EAGAIN, "node 0's localize ended on a forgery");

	/* the real hand-over: the move ends with the real value */
	pthread_mutex_unlock(&c.t[2]->pend.lock);
	cr_expect_eq(ferry_wait(w0, ticket), 0);
	cr_assert_eq(ferry_pull(w0, c.t[0], &key, 1, got), 0);
	for (int i = 0; i < VLEN; i++)
		cr_expect_eq(got[i], val[i], "value %d of key %d: %f", i, KEY, got[i]);
	cr_expect_not_null(ferry__own(c.t[0], KEY), "the real hand-over did not land");
	cr_expect(!atomic_load(&c.fy[0]->failed[1]),
		  "node 0 dropped the forger: the refusal is quiet");
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w2);
	tc_close(&c);
}

Test(roles, a_forged_handover_is_dropped_and_the_move_goes_on)
{
	forged_handover_case();
}

/* the loop transport writes one-sided: the move has a landing entry, and a
 * forged HANDOVER_DONE must not free it while node 2's write may come */
Test(roles, a_forged_handover_done_keeps_the_landing_entry)
{
	setenv("FERRY_TRANSPORT", "loop", 1);
	forged_handover_case();
}

/* ---- forged barrier frames ------------------------------------------------- */

struct barrier_arg {
	struct ferry *fy;
	int rc;
};

static void *barrier_main(void *arg)
{
	struct barrier_arg *a = arg;

	a->rc = ferry_barrier(a->fy);
	return NULL;
}

static void send_barrier(struct ferry *from, uint32_t to, uint8_t type, uint64_t gen)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_barrier b;
	} f;

	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, type, sizeof(f), from->rank, 0);
	f.b.gen = gen;
	cr_assert_eq(ferry__send(from, to, &f, sizeof(f)), 0);
}

Test(roles, a_release_of_a_barrier_not_entered_is_ignored)
{
	struct tc c;

	cr_assert_eq(tc_open(&c, NODES, NULL, 1500), 0);
	/* rank 0 (the only one that may release) releases node 1's next barrier early */
	send_barrier(c.fy[0], 1, FERRY_MSG_BARRIER_REL, 0);
	cr_expect_eq(log_wait("released barrier 0, which this node has not entered", NULL, 1), 1);
	/* alone in it, node 1's barrier must wait out its timeout */
	cr_expect_eq(ferry_barrier(c.fy[1]), -ETIMEDOUT,
		     "node 1 passed a barrier nobody else "
		     "entered");
	for (int i = 0; i < NODES; i++)
		ferry_close(c.fy[i]);
}

Test(roles, a_barrier_entry_out_of_turn_is_ignored)
{
	struct barrier_arg a[2];
	pthread_t th[2];
	struct tc c;

	cr_assert_eq(tc_open(&c, NODES, NULL, 1500), 0);
	/* node 1 claims to have entered barrier 0 .. 1000: only 0 is its turn */
	send_barrier(c.fy[1], 0, FERRY_MSG_BARRIER, 1000);
	cr_expect_eq(log_wait("rank 1 entered barrier 1000, but its next is 0", NULL, 1), 1);
	/* nodes 0 and 2 enter barrier 0 without node 1: it must not release */
	a[0] = (struct barrier_arg){ .fy = c.fy[0] };
	a[1] = (struct barrier_arg){ .fy = c.fy[2] };
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, barrier_main, &a[i]);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		cr_expect_eq(a[i].rc, -ETIMEDOUT, "barrier released without node 1: %s",
			     ferry_strerror(a[i].rc));
	}
	for (int i = 0; i < NODES; i++)
		ferry_close(c.fy[i]);
}

/* ---- a forged end of a table's life --------------------------------------- */

Test(roles, a_table_release_for_a_table_not_destroyed_is_ignored)
{
	const uint64_t key = 3;
	float val[VLEN] = { 7, 7, 7, 7 }, got[VLEN];
	struct ferry_worker *w1;
	struct tc c;
	uint32_t id;
	int verdict, freed;

	cr_assert_eq(tc_open(&c, NODES, &tparams, 5000), 0);
	id = c.t[1]->id;
	/* rank 0 (the only one that may) tells node 1 that every node destroyed it */
	{
		/* the header's table id names the table */
		struct {
			struct ferry_msg_hdr h;
			struct ferry_msg_barrier b;
		} f;

		memset(&f, 0, sizeof(f));
		ferry__proto_hdr_init(&f.h, FERRY_MSG_TABLE_FREE_ACK, sizeof(f), 0, id);
		cr_assert_eq(ferry__send(c.fy[0], 1, &f, sizeof(f)), 0);
	}
	cr_expect_geq(log_wait("has not destroyed it; ignored", NULL, 1), 1);
	pthread_mutex_lock(&c.fy[1]->lock);
	verdict = c.fy[1]->table_verdict[id];
	freed = c.fy[1]->table_freed[id];
	pthread_mutex_unlock(&c.fy[1]->lock);
	cr_expect(verdict && !freed, "node 1's table %u state changed (verdict %d, freed %d)", id,
		  verdict, freed);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	cr_expect_eq(ferry_set(w1, c.t[1], &key, 1, val), 0);
	cr_expect_eq(ferry_pull(w1, c.t[1], &key, 1, got), 0);
	cr_expect_eq(got[0], 7.0f);
	ferry_worker_destroy(w1);
	tc_close(&c);
}

/* ---- an operation that cannot be routed ------------------------------------ */

/* node 1 sends node 0 a pull of KEY that has been forwarded FERRY_MAX_HOPS
 * times already, for a worker node 1 does not have (its reply is dropped) */
static void send_hopped_pull(struct tc *c)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_op op;
		struct ferry_msg_key k;
	} f;

	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, FERRY_MSG_OP, sizeof(f), 1, c->t[0]->id);
	f.op.origin = 1;
	f.op.worker = FERRY_MAX_WORKERS - 1;
	f.op.req = 1;
	f.op.op = FERRY_OP_PULL;
	f.op.hops = FERRY_MAX_HOPS;
	f.op.count = 1;
	f.k.key = KEY;
	f.k.len = VLEN;
	cr_assert_eq(ferry__send(c->fy[1], 0, &f, sizeof(f)), 0, "the forger could not send");
}

/*
 * Node 0 is not KEY's home, so it would forward the pull once more; past
 * FERRY_MAX_HOPS it fails it instead: -EIO while no node failed (a broken
 * directory), -FERRY_E_PEER once a failure is on record, the error every
 * operation a failure cuts gets (docs/faults.md; a key lost with its owner
 * and backups used to fail with -EIO). The failure is only counted here
 * (white-box): no node is failed for real.
 */
Test(roles, an_operation_past_its_hops_fails_with_eio_or_after_a_failure_with_peer)
{
	struct tc c;

	cr_assert_eq(tc_open(&c, NODES, &tparams, 5000), 0);
	send_hopped_pull(&c);
	cr_expect_eq(log_wait("cannot be routed (it was forwarded too often)", "with -EIO", 1), 1);
	atomic_fetch_add(&c.fy[0]->failures, 1);
	send_hopped_pull(&c);
	cr_expect_eq(log_wait("cannot be routed (it was forwarded too often)", "with -FERRY_E_PEER",
			      1),
		     1);
	atomic_fetch_sub(&c.fy[0]->failures, 1);
	tc_close(&c);
}

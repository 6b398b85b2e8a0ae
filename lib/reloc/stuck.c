/* SPDX-License-Identifier: MIT */
/*
 * stuck.c - moves to this node that a failed home leaves without an end
 * (the peer-failure listener of lib/reloc/), and, with replicas, the moves
 * of a failed home's keys asked of their new home (lib/ops/failover.c ends
 * them). Progress thread.
 *
 * A move whose LOCALIZE could not even be sent to its failed home keeps its
 * entry (reloc_unstart): the failure marks it stuck here, and the key's new
 * home, told of the move by its WANT, ends it with the backup or drops it;
 * deleted, a backup sent to it would find nothing, and the key no owner.
 */
#include <stdlib.h>
#include <time.h>

#include "lib/ops/ops.h"
#include "lib/reloc/reloc.h"

/*
 * A peer failed: moves to this node whose home it was cannot be known to
 * end (the home may have asked the old owner before it died, and then the
 * value still comes). Their waiters fail at once, the operations queued
 * behind them are answered with -FERRY_E_PEER, and no more queue there; the
 * entry keeps its slot and landing entry, so a hand-over that still comes is
 * installed (the key becomes live here, nothing lost). Progress thread.
 */
struct reloc_stuck {
	struct ferry *fy;
	struct ferry_table *t;
	uint32_t rank;
	struct ferry_pend_item *ops;	   /* unlinked, to answer outside the lock */
	struct ferry_pend_waiter *waiters; /* likewise, to fail */
};

static void reloc_mark_stuck(void *arg, struct ferry_pend *e)
{
	struct reloc_stuck *st = arg;
	struct ferry_pend_item **pp = &e->head, *it, *last = NULL;

	if (e->stuck || ferry__home_as(st->t, e->key, st->rank) != st->rank)
		return;
	e->stuck = -FERRY_E_PEER;
	ferry_dbg("move: table %u: the move of key %llu to here is stuck: its home rank %u "
		  "failed",
		  st->t->id, (unsigned long long)e->key, st->rank);
	while ((it = *pp)) {
		if (it->kind != FERRY_PEND_OP) {
			last = it;
			pp = &it->next;
			continue;
		}
		*pp = it->next;
		it->next = st->ops;
		st->ops = it;
		e->nqueued--;
	}
	e->tail = last;
	while (e->waiters) {
		struct ferry_pend_waiter *wt = e->waiters;

		e->waiters = wt->next;
		wt->next = st->waiters;
		st->waiters = wt;
	}
}

void ferry__reloc_on_peer_failed(struct ferry *fy, uint32_t rank)
{
	uint32_t nstuck = 0;

	urcu_memb_read_lock();
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t = rcu_dereference(fy->tables[id]);
		struct reloc_stuck st = { .fy = fy, .t = t, .rank = rank };

		if (!t || t->params.mode == FERRY_MODE_CLASSIC)
			continue;
		pthread_mutex_lock(&t->pend.lock);
		ferry__pend_for_each(&t->pend, reloc_mark_stuck, &st);
		pthread_mutex_unlock(&t->pend.lock);
		while (st.ops) {
			struct ferry_pend_item *it = st.ops;

			st.ops = it->next;
			ferry__ops_send_reply(fy, t, &it->op, -FERRY_E_PEER, &it->key.idx, 1, NULL,
					      0);
			free(it);
		}
		while (st.waiters) {
			struct ferry_pend_waiter *wt = st.waiters;

			st.waiters = wt->next;
			ferry__ops_complete(fy, wt->worker, wt->ticket, &wt->idx, 1, -FERRY_E_PEER,
					    NULL, 0);
			free(wt);
			nstuck++;
		}
	}
	urcu_memb_read_unlock();
	if (nstuck)
		ferry_err("reloc: rank %u failed while it was the home of %u keys moving to rank "
			  "%u; those localizes fail (a hand-over already under way still lands)",
			  rank, nstuck, fy->rank);
}

/*
 * Replicas: a LOCALIZE of @key from @src reached this home, which records
 * itself as the owner (no record) and holds no value, and no move of the key
 * to here is under way (or @src is this home): only a failed home's key
 * looks like this, before its takeover or in a move the failure cut. The
 * requester is recorded and the takeover ends the move, or, over, ends it
 * now (ferry__repl_want). Return: true when handled so.
 */
bool ferry__reloc_failed_home_move(struct ferry_table *t, uint64_t key, uint32_t src)
{
	struct ferry *fy = t->fy;
	bool lacks;

	pthread_mutex_lock(&t->pend.lock);
	lacks = !ferry__own(t, key) && (src == fy->rank || !ferry__pend_find(&t->pend, key));
	pthread_mutex_unlock(&t->pend.lock);
	if (!lacks)
		return false;
	if (src != fy->rank && ferry__dir_owner_set(&t->dir, key, src))
		ferry_err("localize: out of memory recording rank %u as owner of key %llu of "
			  "table %u; its localize waits out the timeout",
			  src, (unsigned long long)key, t->id);
	else
		ferry__reloc_failed_home_want(t, key, src);
	return true;
}

void ferry__reloc_failed_home_want(struct ferry_table *t, uint64_t key, uint32_t requester)
{
	if (ferry__repl_want_head(t, key, requester))
		ferry_err("reloc: out of memory noting rank %u's move of key %llu of table %u at "
			  "its new home; the move waits out the timeout",
			  requester, (unsigned long long)key, t->id);
}

/*
 * A move the key's home dropped (lib/ops/failover.c: a later requester,
 * or a live owner, takes the key) keeps its entry, slot and landing entry
 * for a grace period: a live old owner asked for the key before the failure
 * may still be handing it over, and its value must land, not be dropped on
 * arrival as unexpected. Meanwhile the entry is stuck (localizes and
 * operations of the key here fail at once with -FERRY_E_PEER); a hand-over
 * that comes is installed and the key's home learns it (ferry__repl_adopt);
 * otherwise the heartbeat's tick removes the entry after the grace. What
 * queued behind the move goes on at once: operations through the home, and
 * the moves of other requesters back to the home (ferry__repl_want_pass),
 * as does what queues later, when the entry goes. Memory: the entries of
 * the moves dropped within one grace period. pend.lock held. Return: the
 * localize waiters, to wake with -FERRY_E_PEER outside the lock
 * (ferry__reloc_wake_list).
 */
static void reloc_drop_queue(struct ferry *fy, struct ferry_table *t, struct ferry_pend *e)
{
	struct ferry_pend_item *it;

	while ((it = e->head)) {
		e->head = it->next;
		if (it->kind == FERRY_PEND_OP)
			ferry__ops_forward_one(fy, t, &it->op, &it->key, it->vals);
		else /* its requester waits for us: the home decides */
			(void)ferry__repl_want_pass(t, e->key, it->requester);
		free(it);
	}
	e->tail = NULL;
	e->nqueued = 0;
}

static int64_t reloc_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct ferry_pend_waiter *ferry__reloc_drop(struct ferry_table *t, struct ferry_pend *e)
{
	struct ferry_pend_waiter *wt = e->waiters;

	reloc_drop_queue(t->fy, t, e);
	e->waiters = NULL;
	e->stuck = -FERRY_E_PEER;
	if (!e->dropped_ns)
		e->dropped_ns = reloc_now_ns();
	return wt;
}

void ferry__reloc_wake_list(struct ferry *fy, struct ferry_pend_waiter *wt, int status)
{
	while (wt) {
		struct ferry_pend_waiter *next = wt->next;

		ferry__ops_complete(fy, wt->worker, wt->ticket, &wt->idx, 1, status, NULL, 0);
		free(wt);
		wt = next;
	}
}

/* the grace of a dropped move: two heartbeat timeouts, at least 1 s */
static int64_t reloc_drop_grace_ns(const struct ferry *fy)
{
	int64_t ms = fy->heartbeat_ms > 500 ? 2 * (int64_t)fy->heartbeat_ms : 1000;

	return ms * 1000000;
}

struct reloc_expire {
	struct ferry *fy;
	struct ferry_table *t;
	int64_t before;
	uint32_t n;
};

static void reloc_drop_end(struct ferry_table *t, struct ferry_pend *e)
{
	ferry__pend_del(&t->pend, e);
	ferry__arena_free(&t->arena, e->slot); /* never published */
	ferry__inbox_put(t, e->landing);
	e->landing = FERRY_LANDING_NONE;
	ferry__pend_free(&t->pend, e);
}

static void reloc_expire_one(void *arg, struct ferry_pend *e)
{
	struct reloc_expire *x = arg;

	if (!e->dropped_ns || e->dropped_ns > x->before)
		return;
	reloc_drop_queue(x->fy, x->t, e); /* hand-over requests that queued since */
	reloc_drop_end(x->t, e);
	x->n++;
}

bool ferry__reloc_drop_expired(struct ferry_table *t, struct ferry_pend *e)
{
	if (!e->dropped_ns || e->head ||
	    reloc_now_ns() - e->dropped_ns < reloc_drop_grace_ns(t->fy))
		return false;
	reloc_drop_end(t, e);
	return true;
}

/* the heartbeat's tick (progress thread): dropped moves past their grace */
void ferry__reloc_on_tick(struct ferry *fy)
{
	int64_t before = reloc_now_ns() - reloc_drop_grace_ns(fy);

	urcu_memb_read_lock();
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t = rcu_dereference(fy->tables[id]);
		struct reloc_expire x = { .fy = fy, .t = t, .before = before };

		if (!t || !t->repl)
			continue;
		pthread_mutex_lock(&t->pend.lock);
		ferry__pend_for_each(&t->pend, reloc_expire_one, &x);
		pthread_mutex_unlock(&t->pend.lock);
		if (x.n)
			ferry_dbg("move: table %u: %u dropped moves had no hand-over within the "
				  "grace; their entries are gone",
				  t->id, x.n);
	}
	urcu_memb_read_unlock();
}

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

/* SPDX-License-Identifier: MIT */
/*
 * reloc.c - localize: Lapse's relocation protocol, with the requester
 * preparing the slot the value lands in.
 *
 *  requester B            home H                    old owner C
 *  -----------            ------                    -----------
 *  reserve slot (and a
 *  landing entry L, if
 *  one is free), mark
 *  key "pending"
 *  LOCALIZE {key,slot,L} -> owner[key] := B
 *                          (serializes moves)
 *                          HANDOVER_REQ {key,slot,L,B} -> lock slot, state
 *                                                      MOVED, unlock;
 *                                                      unpublish own[key];
 *                                                      hint := B
 *  <-------------------------------------------------- HANDOVER {key,slot,L,value}
 *     or, with L and a transport that writes one-sided:
 *  B's inbox entry L <======== RDMA WRITE of the value ==
 *  <-------------------------------------------------- HANDOVER_DONE {key,slot,L}
 *                                                      (after every write of
 *                                                      the batch completed)
 *                                                      C frees its slot after
 *                                                      a grace period
 *  copy the value into the slot (from the message or from entry L), free L,
 *  replay in arrival order what reached B early (operations; a hand-over
 *  request moves it on), publish own[key], wake the localize waiters
 *
 * Exactly one live copy exists at any time: C stops serving the key (MOVED,
 * under the slot's write lock, so no local update is lost) before the value
 * leaves, and B serves it only after it arrived. An operation that reaches a
 * node that neither owns nor expects the key goes to the key's home, and the
 * home sends it to the owner it recorded last; if that owner is still
 * waiting for the value it queues the operation and replays it in order.
 * A hand-over request that reaches a node still waiting is queued the same
 * way, so moves of one key happen in the order the home recorded them.
 *
 * Least access: the arena is registered for remote reads only; no peer can
 * write a slot. A one-sided hand-over lands in the requester's landing inbox
 * (inbox.c: one region per peer, whose key only that peer has), and the
 * requester copies it into the slot itself. Entry L, in the region of the
 * node B expects to hand the key over, is B's from the LOCALIZE until the
 * key is installed or the home answers LOC_ACK; another old owner finds L
 * outside its region and sends the value by message. Every frame of a move
 * carries B's ticket for it, and B takes only frames with it. C sends
 * HANDOVER_DONE only after every write of its batch completed, so no write
 * lands in L after B freed it; a failed write makes C send the values by
 * message (B frees L all the same). A move that never ends (the home or C
 * failed) keeps its slot and L until the table is destroyed. With no free
 * entry, B sends L = FERRY_LANDING_NONE and C hands over by message; an
 * index B never announced also makes C use the message, logged once.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "lib/ops/ops.h"
#include "lib/reloc/batch.h"
#include "lib/reloc/inbox.h"
#include "lib/reloc/reloc.h"

/* ---- requester: start ------------------------------------------------- */

static void reloc_restore(struct ferry *fy, struct ferry_table *t, struct ferry_slot *s,
			  uint64_t key, uint32_t requester);
static void reloc_unstart(struct ferry *fy, struct ferry_table *t, uint64_t key, uint32_t slot,
			  int status);

/* move batches (batch.c); a frame that cannot go is undone with these */
static const struct ferry_reloc_undo reloc_undo = { .restore = reloc_restore,
						    .unstart = reloc_unstart };

static void reloc_batch_init(struct ferry_reloc_batch *b, uint8_t type, uint32_t dst,
			     uint32_t requester)
{
	ferry__reloc_batch_init(b, type, dst, requester, &reloc_undo);
}

#define reloc_batch_add ferry__reloc_batch_add
#define reloc_batch_end ferry__reloc_batch_end

/* keys: how far ahead a batch's loop loads the directory bucket of a key
 * (a cache miss on nearly every key of a large batch otherwise); what the
 * fast path does for its batches (lib/ops/request.c, OPS_AHEAD) */
#define RELOC_AHEAD 8

int ferry__reloc_start(struct ferry_worker *w, struct ferry_table *t, struct ferry_req *r,
		       uint64_t ticket)
{
	struct ferry *fy = w->fy;
	struct ferry_reloc_batch *to = calloc(fy->world, sizeof(*to));
	uint32_t *done_idx = malloc((r->n ? r->n : 1) * sizeof(uint32_t));
	struct ferry_reloc_item *moves = malloc((r->n ? r->n : 1) * sizeof(*moves));
	uint32_t *lands = malloc((r->n ? r->n : 1) * sizeof(*lands));
	uint32_t ndone = 0, nfail = 0, nmoves = 0;
	bool inbox;
	int rc = 0;

	if (!to || !done_idx || !moves || !lands) {
		free(to);
		free(done_idx);
		free(moves);
		free(lands);
		ferry_err("localize: out of memory starting a move of %zu keys", r->n);
		pthread_mutex_lock(&w->lock);
		r->status = -ENOMEM;
		__atomic_store_n(&r->remaining, 0, __ATOMIC_RELEASE);
		pthread_mutex_unlock(&w->lock);
		return -ENOMEM;
	}
	/* keys that left recently hold slots until a grace period passes */
	if (ferry__arena_avail(&t->arena) < r->n)
		ferry__arena_reclaim(&t->arena);
	/* a landing entry helps only where peers know the inbox (create done) */
	inbox = t->inbox.n && ferry__table_onesided(t);
	urcu_memb_read_lock();
	pthread_mutex_lock(&t->pend.lock);
	for (size_t i = 0; i < r->n && i < RELOC_AHEAD; i++)
		ferry__dir_own_prefetch(&t->dir, r->keys[i]);
	for (size_t i = 0; i < r->n; i++) {
		uint64_t key = r->keys[i];
		struct ferry_pend_waiter *wt;
		struct ferry_pend *e;
		uint32_t slot;

		/* the look-up below missed the cache on nearly every key of a
		 * batch of fresh keys (82% of this function's samples, 1000
		 * keys of 8 B): the bucket of the key RELOC_AHEAD on loads
		 * meanwhile */
		if (i + RELOC_AHEAD < r->n)
			ferry__dir_own_prefetch(&t->dir, r->keys[i + RELOC_AHEAD]);

		/* own[] is published under pend.lock: either it is here, or pending */
		if (ferry__own(t, key)) {
			done_idx[ndone++] = (uint32_t)i;
			continue;
		}
		wt = malloc(sizeof(*wt));
		e = ferry__pend_find(&t->pend, key);
		if (e && e->stuck && ferry__reloc_drop_expired(t, e))
			e = NULL; /* a dropped move's grace is over */
		if (e && e->stuck) {
			/* a move whose home failed: it cannot be known to end */
			free(wt);
			rc = e->stuck;
			done_idx[ndone++] = (uint32_t)i;
			continue;
		}
		if (!e && wt) {
			int arc = ferry__arena_alloc(&t->arena, &slot);

			if (arc) {
				/* -ENOMEM: the node's budget, logged by the arena */
				if (arc == -ENOSPC && !nfail++)
					ferry_err(
						"localize: table %u is full on rank %u (capacity "
						"%u slots); key %llu stays where it is; raise the "
						"table's capacity",
						t->id, fy->rank, t->arena.capacity,
						(unsigned long long)key);
				free(wt);
				wt = NULL;
				rc = arc;
			} else {
				/* in the region of the node expected to hand it over */
				uint32_t land =
					inbox ? ferry__inbox_get(t, ferry__loc_get(t, key)) :
						FERRY_LANDING_NONE;

				/* the ticket: only the home and the old owner learn it */
				e = ferry__pend_add(
					&t->pend, key, slot, land,
					ferry__auth_tag32(fy->move_key,
							  atomic_fetch_add(&fy->move_seq, 1)));
				if (!e) {
					ferry__inbox_put(t, land);
					ferry__arena_free(&t->arena, slot);
				} else {
					lands[nmoves] = land;
					moves[nmoves++] = (struct ferry_reloc_item){
						.key = key, .slot = slot, .ticket = e->ticket
					};
				}
			}
		}
		if (!e || !wt) {
			free(wt);
			if (rc != -ENOSPC)
				rc = -ENOMEM;
			done_idx[ndone++] = (uint32_t)i;
			continue;
		}
		wt->worker = w->id;
		wt->ticket = ticket;
		wt->idx = (uint32_t)i;
		wt->next = e->waiters;
		e->waiters = wt;
	}
	pthread_mutex_unlock(&t->pend.lock);

	if (ndone)
		ferry__ops_complete(fy, w->id, ticket, done_idx, ndone, rc, NULL, 0);
	__atomic_store_n(&w->local_ops, w->local_ops + ndone, __ATOMIC_RELAXED);
	/* outside pend.lock: a frame that cannot go undoes its moves, which
	 * takes the lock (reloc_unstart) */
	for (uint32_t d = 0; d < fy->world; d++)
		reloc_batch_init(&to[d], FERRY_MSG_LOCALIZE, d, fy->rank);
	for (uint32_t i = 0; i < nmoves; i++) {
		uint32_t home = ferry__home(t, moves[i].key);

		/* the wait ends at once if the home fails (the old owner is the
		 * home's to know: a move whose old owner fails waits out the
		 * timeout) */
		ferry__ops_req_dst(r, home);
		reloc_batch_add(fy, t, &to[home], moves[i].key, moves[i].slot, lands[i],
				moves[i].ticket, NULL, 0);
	}
	for (uint32_t d = 0; d < fy->world; d++)
		reloc_batch_end(fy, t, &to[d]);
	urcu_memb_read_unlock();
	free(to);
	free(done_idx);
	free(moves);
	free(lands);
	return rc;
}

static void reloc_wake(struct ferry *fy, struct ferry_pend *e, int status);

/*
 * A LOCALIZE that could not be sent: the home never heard of the move, so
 * nobody else knows of the reserved slot and entry. Give them back, answer
 * what queued (nothing can have, as the home never pointed anyone here), and
 * fail the waiters with @status. Context: rcu_read_lock held, pend.lock not.
 */
static void reloc_unstart(struct ferry *fy, struct ferry_table *t, uint64_t key, uint32_t slot,
			  int status)
{
	struct ferry_pend *e;

	pthread_mutex_lock(&t->pend.lock);
	e = ferry__pend_find(&t->pend, key);
	if (!e || e->slot != slot) {
		pthread_mutex_unlock(&t->pend.lock);
		return;
	}
	if (t->repl && status == -FERRY_E_PEER) { /* its home failed: lib/reloc/stuck.c */
		pthread_mutex_unlock(&t->pend.lock);
		return;
	}
	ferry__pend_del(&t->pend, e);
	ferry__inbox_put(t, e->landing);
	e->landing = FERRY_LANDING_NONE;
	pthread_mutex_unlock(&t->pend.lock);
	ferry__arena_free(&t->arena, slot);
	for (struct ferry_pend_item *it = e->head; it; it = it->next)
		if (it->kind == FERRY_PEND_OP)
			ferry__ops_send_reply(fy, t, &it->op, status, &it->key.idx, 1, NULL, 0);
	reloc_wake(fy, e, status);
	ferry__pend_free(&t->pend, e);
}

/* ---- home: record the new owner, ask the old one ------------------------ */

static void reloc_on_localize(struct ferry *fy, struct ferry_table *t, uint32_t src,
			      const struct ferry_proto_view *v)
{
	const struct ferry_msg_move *m = v->body;
	struct ferry_reloc_batch *to = calloc(fy->world, sizeof(*to));
	struct ferry_reloc_batch ack;

	if (!to) {
		ferry_err("localize: out of memory at the home of %u keys", v->count);
		return;
	}
	if (m->requester != src) {
		ferry_err("proto: rank %u asked to localize keys for rank %u; dropping rank %u",
			  src, m->requester, src);
		ferry__node_peer_failed(fy, src);
		free(to);
		return;
	}
	reloc_batch_init(&ack, FERRY_MSG_LOC_ACK, src, src);
	for (uint32_t d = 0; d < fy->world; d++)
		reloc_batch_init(&to[d], FERRY_MSG_HANDOVER_REQ, d, src);
	for (uint32_t i = 0; i < v->count && i < RELOC_AHEAD; i++)
		ferry__dir_owner_prefetch(&t->dir, v->mvs[i].key);
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_mv *mv = &v->mvs[i];
		uint32_t cur;

		/* the owner records are a map over every key that left: a
		 * lookup missed the cache on nearly every key (92% of this
		 * handler's samples on one load, 1000 keys of 8 B), so the
		 * bucket of the key RELOC_AHEAD on is on its way meanwhile */
		if (i + RELOC_AHEAD < v->count)
			ferry__dir_owner_prefetch(&t->dir, v->mvs[i + RELOC_AHEAD].key);

		if (ferry__home(t, mv->key) != fy->rank) {
			ferry_err("proto: rank %u sent localize of key %llu to rank %u, which is "
				  "not its home; ignored",
				  src, (unsigned long long)mv->key, fy->rank);
			continue;
		}
		cur = ferry__owner(t, mv->key);
		ferry_dbg("move: table %u: rank %u asks for key %llu; the record names rank %u",
			  t->id, src, (unsigned long long)mv->key, cur);
		if (cur == fy->rank && t->repl && ferry__reloc_failed_home_move(t, mv->key, src))
			continue; /* a failed home's key: lib/reloc/stuck.c */
		if (cur == src) {
			reloc_batch_add(fy, t, &ack, mv->key, mv->slot, mv->landing, mv->ticket,
					NULL, 0);
			continue;
		}
		if (ferry__dir_owner_set(&t->dir, mv->key, src)) {
			/* the record could not grow: the key stays where it is, and
			 * the requester's wait ends with its timeout */
			ferry_err("localize: out of memory recording rank %u as owner of key %llu "
				  "of table %u; the key stays at rank %u",
				  src, (unsigned long long)mv->key, t->id, cur);
			continue;
		}
		reloc_batch_add(fy, t, &to[cur], mv->key, mv->slot, mv->landing, mv->ticket, NULL,
				0);
	}
	reloc_batch_end(fy, t, &ack);
	for (uint32_t d = 0; d < fy->world; d++)
		reloc_batch_end(fy, t, &to[d]);
	free(to);
}

/* make @s the live slot of @key here. On -ENOMEM (the directory could not
 * grow, with its last free buckets used up) the value stays in its slot,
 * but no lookup finds it: logged as the loss of access it is */
static void reloc_publish(struct ferry_table *t, uint64_t key, struct ferry_slot *s)
{
	if (ferry__dir_own_set(&t->dir, key, s))
		ferry_err("reloc: out of memory publishing key %llu of table %u on rank %u; "
			  "its value is kept but not reachable: free memory on this node",
			  (unsigned long long)key, t->id, t->fy->rank);
}

/* ---- old owner: hand the value over ----------------------------------- */

/*
 * Take a live slot out of service; progress thread. Under the write lock:
 * every local update so far is in the value, and every later one sees MOVED
 * and takes the slow path, so the value no longer changes.
 */
static void reloc_take(struct ferry *fy, struct ferry_table *t, struct ferry_slot *s, uint64_t key,
		       uint32_t new_owner, int published)
{
	uint64_t ver = ferry__slot_lock(&t->arena, s);

	ferry__slot_set_state(s, FERRY_SLOT_MOVED);
	ferry__slot_unlock(&t->arena, s, ver);
	if (published)
		ferry__dir_own_set(&t->dir, key, NULL);
	ferry__loc_set(t, key, new_owner);
	atomic_fetch_add_explicit(&fy->reloc_out, 1, memory_order_relaxed);
}

/* take a live slot out of service and hand its value over by message: the
 * slot is freed, or put back into service, once the frame's send is known */
static void reloc_give(struct ferry *fy, struct ferry_table *t, struct ferry_slot *s, uint64_t key,
		       uint32_t slot, uint32_t landing, uint32_t ticket, int published,
		       struct ferry_reloc_batch *b)
{
	reloc_take(fy, t, s, key, b->requester, published);
	reloc_batch_add(fy, t, b, key, slot, landing, ticket, s, 1);
}

/*
 * A hand-over that could not be sent: the key goes back into service here,
 * with the value it had (the slot was not freed). The home has recorded the
 * requester as owner; operations that reach the requester are forwarded
 * through the home, and a later localize moves the key on from here.
 * Progress thread, rcu_read_lock held.
 */
static void reloc_restore(struct ferry *fy, struct ferry_table *t, struct ferry_slot *s,
			  uint64_t key, uint32_t requester)
{
	uint64_t ver;

	if (t->repl && atomic_load_explicit(&fy->failed[requester], memory_order_relaxed)) {
		/*
		 * replicas: the requester failed, and its backup (the key's
		 * home) takes the key over from the copy it holds (ours, sent
		 * before each update was acknowledged): serving it here too
		 * would make two owners (lib/ops/repl.c)
		 */
		ferry__arena_free_deferred(&t->arena, ferry__arena_idx(&t->arena, s));
		atomic_fetch_sub_explicit(&fy->reloc_out, 1, memory_order_relaxed);
		return;
	}
	ver = ferry__slot_lock(&t->arena, s);

	ferry__slot_set_state(s, FERRY_SLOT_LIVE);
	ferry__slot_unlock(&t->arena, s, ver);
	reloc_publish(t, key, s);
	ferry__loc_set(t, key, fy->rank);
	atomic_fetch_sub_explicit(&fy->reloc_out, 1, memory_order_relaxed);
}

/*
 * One-sided hand-over: the values go by RDMA WRITE into the landing entries
 * the requester reserved (never into its arena, which peers may only read);
 * once every write completed here (so the data sits in the requester's
 * memory ahead of anything sent after it), one HANDOVER_DONE names the keys
 * and their entries. A failed write sends the values of the whole batch by
 * message instead: they are still in this node's slots, which are freed
 * only then; the requester frees the entries when the message arrives.
 */
struct reloc_wentry {
	struct ferry_msg_mv mv; /* as the requester sent it: its slot, entry, ticket */
	struct ferry_slot *s;
};

struct reloc_wbatch {
	struct ferry_rdma_ctx ctx; /* done: reloc_on_write_done */
	struct ferry_table *t;
	uint32_t requester;
	uint32_t n;
	int pending; /* writes not completed, plus one while posting */
	int failed;
	struct reloc_wentry e[];
};

static void reloc_wbatch_put(struct ferry *fy, struct reloc_wbatch *wb)
{
	struct ferry_table *t = wb->t;
	struct ferry_reloc_batch b;

	if (__atomic_sub_fetch(&wb->pending, 1, __ATOMIC_ACQ_REL))
		return;
	reloc_batch_init(&b, wb->failed ? FERRY_MSG_HANDOVER : FERRY_MSG_HANDOVER_DONE,
			 wb->requester, wb->requester);
	/* the slots are freed (or restored) once the frame's send is known */
	for (uint32_t i = 0; i < wb->n; i++) {
		const struct reloc_wentry *e = &wb->e[i];

		reloc_batch_add(fy, t, &b, e->mv.key, e->mv.slot, e->mv.landing, e->mv.ticket, e->s,
				wb->failed);
	}
	if (wb->failed) {
		atomic_fetch_add_explicit(&t->inbox.write_fallbacks, 1, memory_order_relaxed);
		ferry_warn("reloc: a one-sided hand-over to rank %u failed; sending the %u "
			   "values by message",
			   wb->requester, wb->n);
	}
	reloc_batch_end(fy, t, &b);
	free(wb);
}

static void reloc_on_write_done(struct ferry *fy, void *ctx, int status)
{
	struct reloc_wbatch *wb = ctx;

	ferry__tl_stamp_keys(fy, FERRY_TL_LOC_WRITE_DONE, &wb->e[0].mv.key, sizeof(wb->e[0]),
			     wb->n);
	if (status)
		__atomic_store_n(&wb->failed, 1, __ATOMIC_RELAXED);
	reloc_wbatch_put(fy, wb);
}

static void reloc_wbatch_post(struct ferry *fy, struct reloc_wbatch *wb)
{
	struct ferry_table *t = wb->t;
	const struct ferry_msg_arena *ar = &t->peer_arena[wb->requester];

	wb->pending = (int)wb->n + 1;
	for (uint32_t i = 0; i < wb->n; i++) {
		struct reloc_wentry *e = &wb->e[i];
		uint32_t len = ferry__value_len(t, e->mv.key);
		int rc;

		/* every write completes with the batch as its context */
		ferry__tl_stamp(fy, FERRY_TL_LOC_WRITE_POST, e->mv.key);
		rc = fy->tp->ops->write(fy->tp, wb->requester, e->s->val,
					ferry__ops_chunk_mr(t, ferry__arena_idx(&t->arena, e->s)),
					ar->inbox_addr + (uint64_t)e->mv.landing * ar->inbox_stride,
					t->inbox_grant[wb->requester], len * sizeof(float), wb);
		if (rc) {
			__atomic_store_n(&wb->failed, 1, __ATOMIC_RELAXED);
			reloc_wbatch_put(fy, wb);
		}
	}
	reloc_wbatch_put(fy, wb);
}

static void reloc_on_handover_req(struct ferry *fy, struct ferry_table *t, uint32_t src,
				  const struct ferry_proto_view *v)
{
	const struct ferry_msg_move *m = v->body;
	struct reloc_wbatch *wb = NULL;
	struct ferry_reloc_batch b;
	uint32_t nland = 0;

	if (m->requester >= fy->world) {
		ferry_err("proto: rank %u named rank %u as a requester in a world of %u; dropping "
			  "rank %u",
			  src, m->requester, fy->world, src);
		ferry__node_peer_failed(fy, src);
		return;
	}
	reloc_batch_init(&b, FERRY_MSG_HANDOVER, m->requester, m->requester);

	/* only into our region of its inbox, once it granted it (inbox.c) */
	if (ferry__table_onesided(t) && fy->tp->ops->write && m->requester != fy->rank &&
	    t->inbox_grant[m->requester])
		nland = t->peer_arena[m->requester].inbox_entries;
	if (nland) {
		wb = calloc(1, sizeof(*wb) + v->count * sizeof(wb->e[0]));
		if (wb) {
			wb->ctx.done = reloc_on_write_done;
			wb->t = t;
			wb->requester = m->requester;
		}
	}

	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_mv *mv = &v->mvs[i];
		bool onesided = wb && mv->landing != FERRY_LANDING_NONE;
		struct ferry_slot *s;

		if (ferry__home(t, mv->key) != src) {
			ferry_err("proto: rank %u asked for key %llu but is not its home; ignored",
				  src, (unsigned long long)mv->key);
			continue;
		}
		if (onesided && mv->landing < nland &&
		    !ferry__reloc_inbox_writable(t, m->requester, nland, mv->landing)) {
			/* reserved for another node (the requester expected the key
			 * elsewhere): ours is only our region */
			onesided = false;
		} else if (onesided && mv->landing >= nland) {
			/* a bad index costs the speed of this hand-over, never a value */
			if (!atomic_exchange(&t->inbox.bad_index_logged, true))
				ferry_err("reloc: table %u: rank %u named landing entry %u of rank "
					  "%u, which has %u; handing key %llu over by message",
					  t->id, src, mv->landing, m->requester, nland,
					  (unsigned long long)mv->key);
			onesided = false;
		}
		pthread_mutex_lock(&t->pend.lock);
		s = ferry__own(t, mv->key);
		if (!s && src == fy->rank) {
			/* a sparse key this home never made: made now, then handed
			 * over like any other (-ENOSPC: logged; the requester's
			 * wait ends with the timeout, as for a lost peer) */
			(void)ferry__ops_materialize_locked(t, mv->key, &s);
		}
		if (s) {
			pthread_mutex_unlock(&t->pend.lock);
			/* replicas: the requester's backup has the value first */
			ferry__repl_handoff(t, mv->key, s, m->requester);
			if (onesided) {
				reloc_take(fy, t, s, mv->key, m->requester, 1);
				wb->e[wb->n++] = (struct reloc_wentry){ .mv = *mv, .s = s };
			} else {
				reloc_give(fy, t, s, mv->key, mv->slot, mv->landing, mv->ticket, 1,
					   &b);
			}
			continue;
		}
		{
			struct ferry_pend *e = ferry__pend_find(&t->pend, mv->key);
			struct ferry_pend_item *it;
			bool want = false;

			if (e && (it = calloc(1, sizeof(*it)))) {
				it->kind = FERRY_PEND_HANDOVER;
				it->requester = m->requester;
				it->slot = mv->slot;
				it->landing = mv->landing;
				it->ticket = mv->ticket;
				ferry__pend_append(e, it);
				ferry_dbg("move: table %u: key %llu for rank %u waits behind "
					  "the move to here",
					  t->id, (unsigned long long)mv->key, m->requester);
			} else if (!e && src == fy->rank && t->repl) {
				want = true; /* a failed home's key: lib/reloc/stuck.c */
			} else {
				ferry_err(
					"reloc: rank %u asked rank %u to hand key %llu over, but it "
					"neither holds nor expects it; the move is lost",
					src, fy->rank, (unsigned long long)mv->key);
			}
			pthread_mutex_unlock(&t->pend.lock);
			if (want) /* outside the lock: it may end a move to here */
				ferry__reloc_failed_home_want(t, mv->key, m->requester);
		}
	}
	reloc_batch_end(fy, t, &b);
	if (wb && wb->n)
		reloc_wbatch_post(fy, wb);
	else
		free(wb);
}

/* ---- requester: the value arrives ------------------------------------- */

/* a hand-over or acknowledgement must name this node as the requester; a
 * peer that sends one for another breaks the protocol and is dropped */
static bool reloc_not_for_me(struct ferry *fy, uint32_t src, const struct ferry_msg_move *m,
			     const char *what)
{
	if (m->requester == fy->rank)
		return false;
	ferry_err("proto: rank %u %s keys for rank %u to rank %u; dropping rank %u", src, what,
		  m->requester, fy->rank, src);
	ferry__node_peer_failed(fy, src);
	return true;
}

static void reloc_wake(struct ferry *fy, struct ferry_pend *e, int status)
{
	for (struct ferry_pend_waiter *wt = e->waiters; wt; wt = wt->next)
		ferry__ops_complete(fy, wt->worker, wt->ticket, &wt->idx, 1, status, NULL, 0);
}

/* install one arrived value (from a message or a landing entry; NULL: a
 * sparse key's initial value) and replay what queued; pend_lock held. The slot is written only under its lock
 * (ferry__slot_install, ferry__slot_update), so every change bumps its
 * version and seal: a one-sided reader with an old hint may read it now. */
static void reloc_install(struct ferry *fy, struct ferry_table *t, struct ferry_pend *e,
			  const float *val, uint32_t len)
{
	struct ferry_slot *s = ferry__arena_slot(&t->arena, e->slot);
	struct ferry_pend_item *it;
	int owned = 1;

	if (val)
		ferry__slot_install(&t->arena, s, e->key, val, len);
	else
		ferry__slot_install_init(&t->arena, s, e->key, &t->init, len);
	atomic_fetch_add_explicit(&fy->reloc_in, 1, memory_order_relaxed);

	while ((it = e->head)) {
		e->head = it->next;
		if (!owned && it->kind == FERRY_PEND_OP) {
			ferry__ops_forward_one(fy, t, &it->op, &it->key, it->vals);
		} else if (it->kind == FERRY_PEND_OP && t->repl && it->op.op != FERRY_OP_PULL) {
			/* replicas: an update is served by the OP handler, which
			 * backs it up before it answers; the frame to ourselves
			 * arrives after the key is published below */
			ferry__ops_send_to(fy, t, &it->op, &it->key, it->vals, fy->rank);
		} else if (it->kind == FERRY_PEND_OP) {
			float *out = NULL;
			int rc;

			if (it->op.op == FERRY_OP_PULL)
				out = malloc(len * sizeof(float));
			if (it->op.op == FERRY_OP_PULL && !out) {
				rc = -ENOMEM;
			} else if (it->op.op == FERRY_OP_PULL) {
				/* a seqlock read: a local writer may hold the slot */
				rc = ferry__slot_read(s, e->key, out, len);
			} else {
				/* under the slot's lock, as every write */
				rc = ferry__slot_update(&t->arena, s, e->key, it->vals, len,
							it->op.op == FERRY_OP_PUSH);
			}
			ferry__ops_send_reply(fy, t, &it->op, rc, &it->key.idx, 1, out,
					      out ? len : 0);
			atomic_fetch_add_explicit(&fy->served_ops, 1, memory_order_relaxed);
			free(out);
		} else {
			/* moved on before anyone here saw it; a hand-over that
			 * cannot go leaves the key live here (reloc_restore) */
			struct ferry_reloc_batch b;

			reloc_batch_init(&b, FERRY_MSG_HANDOVER, it->requester, it->requester);
			ferry__repl_handoff(t, e->key, s, it->requester);
			reloc_give(fy, t, s, e->key, it->slot, it->landing, it->ticket, 0, &b);
			if (!reloc_batch_end(fy, t, &b))
				owned = 0;
		}
		free(it);
	}
	e->tail = NULL;
	if (owned) {
		ferry__loc_set(t, e->key, fy->rank);
		reloc_publish(t, e->key, s);
		/* a move whose home failed meanwhile: the new home has no record
		 * of it (replicas: tell it, with the backup) */
		if (e->stuck)
			ferry__repl_adopt(t, e->key, s);
	}
}

/*
 * A move of @key to this node waits for an old owner that failed
 * (lib/ops/repl.c, through fy->move_fill). @keep: this node is the last
 * requester: the move ends with @val, the backup's copy. Else the move is
 * dropped (ferry__reloc_drop: its localize waiters get -FERRY_E_PEER, what
 * queued behind it goes on through the home, and the entry waits a grace
 * period for a hand-over still in flight). Progress thread. Return: 0, or -ENOENT when no
 * move of @key waits here.
 */
static int reloc_move_fill(struct ferry_table *t, uint64_t key, const float *val, uint32_t len,
			   bool keep)
{
	struct ferry *fy = t->fy;
	struct ferry_pend_item *it;
	struct ferry_pend *e;

	pthread_mutex_lock(&t->pend.lock);
	e = ferry__pend_find(&t->pend, key);
	ferry_dbg("move: table %u: the home ends the move of key %llu to here (%s): %s", t->id,
		  (unsigned long long)key, keep ? "with the backup" : "dropped",
		  e ? "it waited" : "none waits");
	if (!e) {
		pthread_mutex_unlock(&t->pend.lock);
		return -ENOENT;
	}
	if (!keep) {
		struct ferry_pend_waiter *wt = ferry__reloc_drop(t, e);

		pthread_mutex_unlock(&t->pend.lock);
		ferry__reloc_wake_list(fy, wt, -FERRY_E_PEER);
		return 0;
	}
	ferry__pend_del(&t->pend, e);
	{
		/*
		 * The key stays here, and the home records this node: a
		 * hand-over queued behind the move would carry it on where the
		 * home does not know (it knows only the last of a chain a
		 * failure cut, and that one may have failed). Each requester
		 * that queued is passed on to the home instead, which drops
		 * its move (a failed one's is dropped here).
		 */
		for (struct ferry_pend_item **pp = &e->head; (it = *pp);) {
			if (it->kind != FERRY_PEND_OP) {
				if (!atomic_load_explicit(&fy->failed[it->requester],
							  memory_order_relaxed))
					(void)ferry__repl_want_pass(t, key, it->requester);
				*pp = it->next;
				e->nqueued--;
				free(it);
			} else {
				e->tail = it;
				pp = &it->next;
			}
		}
		if (!e->head)
			e->tail = NULL;
		reloc_install(fy, t, e, val, len);
	}
	/* the failed old owner writes no more: the entry is free */
	ferry__inbox_put(t, e->landing);
	e->landing = FERRY_LANDING_NONE;
	pthread_mutex_unlock(&t->pend.lock);
	reloc_wake(fy, e, 0);
	ferry__pend_free(&t->pend, e);
	return 0;
}

static void reloc_on_handover(struct ferry *fy, struct ferry_table *t, uint32_t src,
			      const struct ferry_proto_view *v)
{
	const bool done = v->hdr->type == FERRY_MSG_HANDOVER_DONE;
	const struct ferry_msg_move *m = v->body;
	const float *val = v->vals;

	if (reloc_not_for_me(fy, src, m, "handed over"))
		return;
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_mv *mv = &v->mvs[i];
		struct ferry_pend *e;

		pthread_mutex_lock(&t->pend.lock);
		e = ferry__pend_find(&t->pend, mv->key);
		if (!e || e->slot != mv->slot || e->ticket != mv->ticket) {
			pthread_mutex_unlock(&t->pend.lock);
			ferry_err("reloc: rank %u handed over key %llu, which this node does not "
				  "expect (slot %u, ticket %#x: a forgery, or a stale move); value "
				  "dropped",
				  src, (unsigned long long)mv->key, mv->slot, mv->ticket);
			val += mv->len;
			continue;
		}
		if (done && (e->landing == FERRY_LANDING_NONE || e->landing != mv->landing)) {
			pthread_mutex_unlock(&t->pend.lock);
			ferry_err(
				"reloc: rank %u wrote key %llu into landing entry %u, but this node "
				"reserved %d for it; value dropped",
				src, (unsigned long long)mv->key, mv->landing,
				e->landing == FERRY_LANDING_NONE ? -1 : (int)e->landing);
			continue;
		}
		ferry__pend_del(&t->pend, e);
		if (e->dropped_ns && ferry__own(t, mv->key)) {
			/* a dropped move's late hand-over, but the key's home
			 * installed the key here from its backup meanwhile
			 * (lib/ops/failover.c, repl_end_here): that copy rules */
			ferry__inbox_put(t, e->landing);
			pthread_mutex_unlock(&t->pend.lock);
			ferry_err("reloc: rank %u handed over key %llu after its home had "
				  "installed it here from the backup; value dropped",
				  src, (unsigned long long)mv->key);
			ferry__arena_free(&t->arena, e->slot);
			ferry__pend_free(&t->pend, e);
			val += mv->len;
			continue;
		}
		if (done)
			atomic_fetch_add_explicit(&t->inbox.onesided, 1, memory_order_relaxed);
		reloc_install(fy, t, e, done ? ferry__inbox_entry(t, e->landing) : val,
			      ferry__value_len(t, mv->key));
		/* every write into it completed before the message was sent */
		ferry__inbox_put(t, e->landing);
		e->landing = FERRY_LANDING_NONE;
		pthread_mutex_unlock(&t->pend.lock);
		ferry__tl_stamp(fy, FERRY_TL_LOC_WAKE, mv->key);
		reloc_wake(fy, e, 0);
		ferry__pend_free(&t->pend, e);
		val += mv->len;
	}
}

static void reloc_on_ack(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v)
{
	if (reloc_not_for_me(fy, src, v->body, "acknowledged"))
		return;
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_mv *mv = &v->mvs[i];
		struct ferry_pend *e;

		if (ferry__home(t, mv->key) != src) {
			ferry_err(
				"proto: rank %u acknowledged a move of key %llu, whose home it is "
				"not; ignored",
				src, (unsigned long long)mv->key);
			continue;
		}

		pthread_mutex_lock(&t->pend.lock);
		e = ferry__pend_find(&t->pend, mv->key);
		if (e && e->slot == mv->slot && e->ticket != mv->ticket)
			ferry_err("reloc: rank %u acknowledged a move of key %llu with another "
				  "ticket; ignored",
				  src, (unsigned long long)mv->key);
		if (e && e->slot == mv->slot && e->ticket == mv->ticket) {
			ferry__pend_del(&t->pend, e);
			/* nobody was asked to write it */
			ferry__inbox_put(t, e->landing);
			e->landing = FERRY_LANDING_NONE;
			if (!ferry__own(t, mv->key) && t->params.sparse && src == fy->rank) {
				/* the home localized a sparse key it never made: the
				 * reserved slot takes its initial value */
				reloc_install(fy, t, e, NULL, ferry__value_len(t, mv->key));
				pthread_mutex_unlock(&t->pend.lock);
				reloc_wake(fy, e, 0);
				ferry__pend_free(&t->pend, e);
				continue;
			}
		} else {
			e = NULL;
		}
		pthread_mutex_unlock(&t->pend.lock);
		if (!e)
			continue;
		/* the home says it is ours already: the reserved slot was never used */
		ferry__arena_free(&t->arena, e->slot);
		reloc_wake(fy, e, 0);
		ferry__pend_free(&t->pend, e);
	}
}

/* ---- the module ----------------------------------------------------------- */

int ferry__reloc_attach(struct ferry *fy)
{
	static const struct {
		uint8_t type;
		ferry_msg_fn fn;
	} h[] = {
		{ FERRY_MSG_LOCALIZE, reloc_on_localize },
		{ FERRY_MSG_HANDOVER_REQ, reloc_on_handover_req },
		{ FERRY_MSG_HANDOVER, reloc_on_handover },
		{ FERRY_MSG_HANDOVER_DONE, reloc_on_handover },
		{ FERRY_MSG_LOC_ACK, reloc_on_ack },
	};
	int rc = 0;

	for (size_t i = 0; i < sizeof(h) / sizeof(h[0]) && !rc; i++)
		rc = ferry__dispatch_register(fy, h[i].type, FERRY_DISPATCH_TABLE, h[i].fn);
	fy->move_fill = reloc_move_fill;
	if (!rc)
		rc = ferry__heartbeat_on_tick(fy, ferry__reloc_on_tick);
	return rc ? rc : ferry__node_on_peer_failed(fy, ferry__reloc_on_peer_failed);
}

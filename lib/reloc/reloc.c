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
 * Least access: the arena is registered for remote reads only (one-sided
 * pulls); no peer can write a slot. A one-sided hand-over lands in the
 * requester's landing inbox instead, a separate registration for remote
 * writes only, and the requester copies it into the slot itself. Entry L is
 * B's from the LOCALIZE until the key is installed (HANDOVER or
 * HANDOVER_DONE) or the home answers LOC_ACK: C sends either message only
 * after every write of its batch completed, so no write lands in L after B
 * freed it. A failed write makes C send the values by HANDOVER message; B
 * frees L all the same. A move that never ends (the home or C failed) keeps
 * its slot and L until the table is destroyed: B cannot tell whether a live
 * peer may still write L. With no free entry, B sends L = FERRY_LANDING_NONE
 * and C hands over by message; an index B never announced (L at or above
 * B's entry count) also makes C use the message, logged once.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "lib/ops/ops.h"
#include "lib/reloc/inbox.h"
#include "lib/reloc/reloc.h"

/* ---- requester: start ------------------------------------------------- */

struct reloc_batch {
	struct ferry_frame f;
	uint32_t count;
};

/* @with_value: a HANDOVER entry, whose value the caller stages separately;
 * @landing: the requester's landing entry, or FERRY_LANDING_NONE */
static void reloc_batch_add(struct reloc_batch *b, uint64_t key, uint32_t slot, uint32_t len,
			    int with_value, uint32_t requester, uint32_t landing)
{
	struct ferry_msg_mv *mv;

	if (!b->f.buf) {
		struct ferry_msg_move *m;

		ferry__frame_begin(&b->f);
		m = ferry__frame_put(&b->f, sizeof(*m));
		if (m)
			m->requester = requester;
		b->count = 0;
	}
	mv = ferry__frame_put(&b->f, sizeof(*mv));
	if (mv) {
		mv->key = key;
		mv->slot = slot;
		mv->len = with_value ? len : 0;
		mv->landing = landing;
	}
	b->count++;
}

/* finish and send one batch frame (values, if any, were staged in @vals) */
static int reloc_batch_send(struct ferry *fy, struct ferry_table *t, struct reloc_batch *b,
			    uint8_t type, uint32_t dst, struct ferry_frame *vals)
{
	struct ferry_msg_move *m;
	int rc;

	if (!b->f.buf)
		return 0;
	if (vals && vals->len) {
		void *p = vals->len == SIZE_MAX ? NULL : ferry__frame_put(&b->f, vals->len);

		if (p)
			memcpy(p, vals->buf, vals->len);
		else
			b->f.len = SIZE_MAX;
	}
	rc = ferry__frame_finish(&b->f, type, fy->rank, t->id);
	if (!rc) {
		m = (struct ferry_msg_move *)(b->f.buf + sizeof(struct ferry_msg_hdr));
		m->count = b->count;
		rc = ferry__send(fy, dst, b->f.buf, b->f.len);
	}
	ferry__frame_free(&b->f);
	b->count = 0;
	return rc;
}

static int reloc_start(struct ferry_worker *w, struct ferry_table *t, struct ferry_req *r,
		       uint64_t ticket)
{
	struct ferry *fy = w->fy;
	struct reloc_batch *to = calloc(fy->world, sizeof(*to));
	uint32_t *done_idx = malloc((r->n ? r->n : 1) * sizeof(uint32_t));
	uint32_t ndone = 0, nfail = 0;
	bool inbox;
	int rc = 0;

	if (!to || !done_idx) {
		free(to);
		free(done_idx);
		ferry__ops_complete(fy, w->id, ticket, NULL, 0, 0, NULL, 0);
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
	for (size_t i = 0; i < r->n; i++) {
		uint64_t key = r->keys[i];
		struct ferry_pend_waiter *wt;
		struct ferry_pend *e;
		uint32_t slot;

		/* own[] is published under pend_lock: either it is here, or pending */
		if (rcu_dereference(t->dir.own[key])) {
			done_idx[ndone++] = (uint32_t)i;
			continue;
		}
		wt = malloc(sizeof(*wt));
		e = ferry__pend_find(&t->pend, key);
		if (!e && wt) {
			if (ferry__arena_alloc(&t->arena, &slot)) {
				if (!nfail++)
					ferry_err(
						"localize: table %u is full on rank %u (capacity "
						"%u slots); key %llu stays where it is; raise the "
						"table's capacity",
						t->id, fy->rank, t->arena.capacity,
						(unsigned long long)key);
				free(wt);
				wt = NULL;
				rc = -ENOSPC;
			} else {
				uint32_t land = inbox ? ferry__inbox_get(t) : FERRY_LANDING_NONE;

				e = ferry__pend_add(&t->pend, key, slot, land);
				if (!e) {
					ferry__inbox_put(t, land);
					ferry__arena_free(&t->arena, slot);
				} else {
					reloc_batch_add(&to[ferry__home(t, key)], key, slot, 0, 0,
							fy->rank, land);
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
	urcu_memb_read_unlock();

	if (ndone)
		ferry__ops_complete(fy, w->id, ticket, done_idx, ndone, rc, NULL, 0);
	__atomic_store_n(&w->local_ops, w->local_ops + ndone, __ATOMIC_RELAXED);
	for (uint32_t d = 0; d < fy->world; d++) {
		int src = reloc_batch_send(fy, t, &to[d], FERRY_MSG_LOCALIZE, d, NULL);

		if (src)
			ferry_err("localize: cannot reach home rank %u: %s", d,
				  ferry_strerror(src));
		/* the waiters of those keys time out; the log said why */
	}
	free(to);
	free(done_idx);
	return rc;
}

/* ---- home: record the new owner, ask the old one ------------------------ */

static void reloc_on_localize(struct ferry *fy, struct ferry_table *t, uint32_t src,
			      const struct ferry_proto_view *v)
{
	const struct ferry_msg_move *m = v->body;
	struct reloc_batch *to = calloc(fy->world, sizeof(*to));
	struct reloc_batch ack = { 0 };

	if (!to) {
		ferry_err("localize: out of memory at the home of %u keys", v->count);
		return;
	}
	if (m->requester != src) {
		ferry_err("proto: rank %u asked to localize keys for rank %u; dropping rank %u",
			  src, m->requester, src);
		atomic_store(&fy->failed[src], true);
		free(to);
		return;
	}
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_mv *mv = &v->mvs[i];
		uint32_t cur;

		if (ferry__home(t, mv->key) != fy->rank) {
			ferry_err("proto: rank %u sent localize of key %llu to rank %u, which is "
				  "not its home; ignored",
				  src, (unsigned long long)mv->key, fy->rank);
			continue;
		}
		cur = t->dir.owner[mv->key];
		if (cur == src) {
			reloc_batch_add(&ack, mv->key, mv->slot, 0, 0, src, mv->landing);
			continue;
		}
		t->dir.owner[mv->key] = src;
		reloc_batch_add(&to[cur], mv->key, mv->slot, 0, 0, src, mv->landing);
	}
	reloc_batch_send(fy, t, &ack, FERRY_MSG_LOC_ACK, src, NULL);
	for (uint32_t d = 0; d < fy->world; d++)
		reloc_batch_send(fy, t, &to[d], FERRY_MSG_HANDOVER_REQ, d, NULL);
	free(to);
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
		rcu_assign_pointer(t->dir.own[key], NULL);
	ferry__loc_set(t, key, new_owner);
	atomic_fetch_add_explicit(&fy->reloc_out, 1, memory_order_relaxed);
}

/* stage a taken slot's value for a HANDOVER message, then free the slot;
 * @landing: the requester's entry, echoed (it frees it on arrival) */
static void reloc_stage(struct ferry_table *t, struct ferry_slot *s, uint64_t key,
			uint32_t new_owner, uint32_t slot, uint32_t landing, struct reloc_batch *b,
			struct ferry_frame *vals)
{
	uint32_t len = ferry__value_len(t, key);
	float *dst = ferry__frame_put(vals, len * sizeof(float));

	if (dst)
		memcpy(dst, s->val, len * sizeof(float));
	ferry__arena_free_deferred(&t->arena, ferry__arena_idx(&t->arena, s));
	reloc_batch_add(b, key, slot, len, 1, new_owner, landing);
}

/* take a live slot out of service and hand its value over by message */
static void reloc_give(struct ferry *fy, struct ferry_table *t, struct ferry_slot *s, uint64_t key,
		       uint32_t new_owner, uint32_t slot, uint32_t landing, int published,
		       struct reloc_batch *b, struct ferry_frame *vals)
{
	reloc_take(fy, t, s, key, new_owner, published);
	reloc_stage(t, s, key, new_owner, slot, landing, b, vals);
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
	uint64_t key;
	uint32_t rslot;	  /* the requester's slot */
	uint32_t landing; /* and landing entry */
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
	struct reloc_batch b = { 0 };
	struct ferry_frame vals = { 0 };

	if (__atomic_sub_fetch(&wb->pending, 1, __ATOMIC_ACQ_REL))
		return;
	for (uint32_t i = 0; i < wb->n; i++) {
		const struct reloc_wentry *e = &wb->e[i];

		if (wb->failed) {
			reloc_stage(t, e->s, e->key, wb->requester, e->rslot, e->landing, &b,
				    &vals);
		} else {
			reloc_batch_add(&b, e->key, e->rslot, 0, 0, wb->requester, e->landing);
			ferry__arena_free_deferred(&t->arena, ferry__arena_idx(&t->arena, e->s));
		}
	}
	if (wb->failed) {
		atomic_fetch_add_explicit(&t->inbox.write_fallbacks, 1, memory_order_relaxed);
		ferry_warn("reloc: a one-sided hand-over to rank %u failed; sending the %u "
			   "values by message",
			   wb->requester, wb->n);
	}
	reloc_batch_send(fy, t, &b, wb->failed ? FERRY_MSG_HANDOVER : FERRY_MSG_HANDOVER_DONE,
			 wb->requester, wb->failed ? &vals : NULL);
	ferry__frame_free(&vals);
	free(wb);
}

static void reloc_on_write_done(struct ferry *fy, void *ctx, int status)
{
	struct reloc_wbatch *wb = ctx;

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
		uint32_t len = ferry__value_len(t, e->key);
		int rc;

		/* every write completes with the batch as its context */
		rc = fy->tp->ops->write(fy->tp, wb->requester, e->s->val, t->arena.mr,
					ar->inbox_addr + (uint64_t)e->landing * ar->inbox_stride,
					ar->inbox_rkey, len * sizeof(float), wb);
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
	struct reloc_batch b = { 0 };
	struct ferry_frame vals = { 0 };
	struct reloc_wbatch *wb = NULL;
	uint32_t nland = 0;

	if (ferry__table_onesided(t) && fy->tp->ops->write && m->requester != fy->rank)
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
		if (onesided && mv->landing >= nland) {
			/* a bad index costs the speed of this hand-over, never a value */
			if (!atomic_exchange(&t->inbox.bad_index_logged, true))
				ferry_err("reloc: table %u: rank %u named landing entry %u of rank "
					  "%u, which has %u; handing key %llu over by message",
					  t->id, src, mv->landing, m->requester, nland,
					  (unsigned long long)mv->key);
			onesided = false;
		}
		pthread_mutex_lock(&t->pend.lock);
		s = rcu_dereference(t->dir.own[mv->key]);
		if (s) {
			pthread_mutex_unlock(&t->pend.lock);
			if (onesided) {
				reloc_take(fy, t, s, mv->key, m->requester, 1);
				wb->e[wb->n++] = (struct reloc_wentry){ .key = mv->key,
									.rslot = mv->slot,
									.landing = mv->landing,
									.s = s };
			} else {
				reloc_give(fy, t, s, mv->key, m->requester, mv->slot, mv->landing,
					   1, &b, &vals);
			}
			continue;
		}
		{
			struct ferry_pend *e = ferry__pend_find(&t->pend, mv->key);
			struct ferry_pend_item *it;

			if (e && (it = calloc(1, sizeof(*it)))) {
				it->kind = FERRY_PEND_HANDOVER;
				it->requester = m->requester;
				it->slot = mv->slot;
				it->landing = mv->landing;
				ferry__pend_append(e, it);
			} else {
				ferry_err(
					"reloc: rank %u asked rank %u to hand key %llu over, but it "
					"neither holds nor expects it; the move is lost",
					src, fy->rank, (unsigned long long)mv->key);
			}
		}
		pthread_mutex_unlock(&t->pend.lock);
	}
	if (b.f.buf)
		reloc_batch_send(fy, t, &b, FERRY_MSG_HANDOVER, m->requester, &vals);
	ferry__frame_free(&vals);
	if (wb && wb->n)
		reloc_wbatch_post(fy, wb);
	else
		free(wb);
}

/* ---- requester: the value arrives ------------------------------------- */

static void reloc_wake(struct ferry *fy, struct ferry_pend *e, int status)
{
	for (struct ferry_pend_waiter *wt = e->waiters; wt; wt = wt->next)
		ferry__ops_complete(fy, wt->worker, wt->ticket, &wt->idx, 1, status, NULL, 0);
}

/* install one arrived value (from a message or a landing entry) and replay
 * what queued; pend_lock held. The slot is written only under its lock
 * (ferry__slot_install, ferry__slot_update), so every change bumps its
 * version and seal: a one-sided reader with an old hint may read it now. */
static void reloc_install(struct ferry *fy, struct ferry_table *t, struct ferry_pend *e,
			  const float *val, uint32_t len)
{
	struct ferry_slot *s = ferry__arena_slot(&t->arena, e->slot);
	struct ferry_pend_item *it;
	int owned = 1;

	ferry__slot_install(&t->arena, s, e->key, val, len);
	atomic_fetch_add_explicit(&fy->reloc_in, 1, memory_order_relaxed);

	while ((it = e->head)) {
		e->head = it->next;
		if (!owned && it->kind == FERRY_PEND_OP) {
			ferry__ops_forward_one(fy, t, &it->op, &it->key, it->vals);
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
			/* moved on before anyone here saw it */
			struct reloc_batch b = { 0 };
			struct ferry_frame vals = { 0 };

			reloc_give(fy, t, s, e->key, it->requester, it->slot, it->landing, 0, &b,
				   &vals);
			reloc_batch_send(fy, t, &b, FERRY_MSG_HANDOVER, it->requester, &vals);
			ferry__frame_free(&vals);
			owned = 0;
		}
		free(it);
	}
	e->tail = NULL;
	if (owned) {
		ferry__loc_set(t, e->key, fy->rank);
		rcu_assign_pointer(t->dir.own[e->key], s);
	}
}

static void reloc_on_handover(struct ferry *fy, struct ferry_table *t, uint32_t src,
			      const struct ferry_proto_view *v)
{
	const bool done = v->hdr->type == FERRY_MSG_HANDOVER_DONE;
	const float *val = v->vals;

	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_mv *mv = &v->mvs[i];
		struct ferry_pend *e;

		pthread_mutex_lock(&t->pend.lock);
		e = ferry__pend_find(&t->pend, mv->key);
		if (!e || e->slot != mv->slot) {
			pthread_mutex_unlock(&t->pend.lock);
			ferry_err("reloc: rank %u handed over key %llu, which this node does not "
				  "expect (slot %u); value dropped",
				  src, (unsigned long long)mv->key, mv->slot);
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
		if (done)
			atomic_fetch_add_explicit(&t->inbox.onesided, 1, memory_order_relaxed);
		reloc_install(fy, t, e, done ? ferry__inbox_entry(t, e->landing) : val,
			      ferry__value_len(t, mv->key));
		/* every write into it completed before the message was sent */
		ferry__inbox_put(t, e->landing);
		e->landing = FERRY_LANDING_NONE;
		pthread_mutex_unlock(&t->pend.lock);
		reloc_wake(fy, e, 0);
		ferry__pend_free(e);
		val += mv->len;
	}
}

static void reloc_on_ack(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v)
{
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_mv *mv = &v->mvs[i];
		struct ferry_pend *e;

		pthread_mutex_lock(&t->pend.lock);
		e = ferry__pend_find(&t->pend, mv->key);
		if (e && e->slot == mv->slot) {
			ferry__pend_del(&t->pend, e);
			/* nobody was asked to write it */
			ferry__inbox_put(t, e->landing);
			e->landing = FERRY_LANDING_NONE;
		} else {
			e = NULL;
		}
		pthread_mutex_unlock(&t->pend.lock);
		if (!e)
			continue;
		/* the home says it is ours already: the reserved slot was never used */
		ferry__arena_free(&t->arena, e->slot);
		reloc_wake(fy, e, 0);
		ferry__pend_free(e);
	}
}

/* ---- the module ----------------------------------------------------------- */

int ferry_localize(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n)
{
	return ferry__ops_sync(w, t, FERRY_REQ_LOCALIZE, keys, n, NULL, NULL, reloc_start);
}

int ferry_localize_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			 size_t n, uint64_t *ticket_p)
{
	return ferry__ops_async(w, t, FERRY_REQ_LOCALIZE, keys, n, NULL, NULL, reloc_start,
				ticket_p);
}

/* moves that never ended: their landing entries go back (the inbox goes next) */
static void reloc_pend_drop(void *arg, struct ferry_pend *e)
{
	ferry__inbox_put(arg, e->landing);
}

void ferry__reloc_table_fini(struct ferry_table *t)
{
	ferry__pend_fini(&t->pend, reloc_pend_drop, t);
}

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
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * serve.c - serving key operations: apply one to a live slot, complete a
 * request's keys, send replies, build OP frames and forward keys toward
 * their owner; the OP and REPLY handlers (progress thread).
 *
 *   origin                  owner (progress thread)
 *   ------                  -----------------------
 *   OP {keys} ------------> live here: apply, REPLY {idx, values, slots}
 *                           on its way here: queue (lib/dir/pend.c), replay
 *                           later; else forward to the home, the home to the
 *                           owner it recorded (at most FERRY_MAX_HOPS)
 *   REPLY <---------------- copy values, update location hints, count down
 *                           the request under worker.lock
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "lib/ops/internal.h"

/* ---- applying operations to slots -------------------------------------- */

int ferry__ops_apply(struct ferry_table *t, uint8_t op, uint64_t key, const float *in, float *out)
{
	return ferry__ops_apply_slot(t, op, key, in, out, NULL);
}

int ferry__ops_apply_slot(struct ferry_table *t, uint8_t op, uint64_t key, const float *in,
			  float *out, uint64_t *hint)
{
	struct ferry_slot *s = rcu_dereference(t->dir.own[key]);
	uint32_t len = ferry__value_len(t, key);

	if (!s)
		return -EAGAIN;
	if (hint)
		*hint = (uint64_t)ferry__arena_idx(&t->arena, s) << 32 |
			__atomic_load_n(&s->epoch, __ATOMIC_RELAXED);
	if (op == FERRY_OP_PULL)
		return ferry__slot_read(s, key, out, len);
	return ferry__slot_update(&t->arena, s, key, in, len, op == FERRY_OP_PUSH);
}

/* ---- completion (progress thread) ------------------------------------- */

/* offsets of each key's value inside a request's buffer */
static size_t ops_req_off(const struct ferry_table *t, const struct ferry_req *r, size_t i)
{
	size_t off = 0;

	if (!t->value_offs)
		return i * t->params.value_len;
	for (size_t j = 0; j < i; j++)
		off += t->value_lens[r->keys[j]];
	return off;
}

static void ops_mark_done(struct ferry_worker *w, struct ferry_req *r, uint32_t i, int status)
{
	r->done[i / 8] |= (uint8_t)(1u << (i % 8));
	if (status && !r->status)
		r->status = status;
	/* written under worker.lock, read without it by the waiter: the release
	 * publishes the values copied before it */
	__atomic_store_n(&r->remaining, r->remaining - 1, __ATOMIC_RELEASE);
	if (!r->remaining && w->sleeping)
		pthread_cond_broadcast(&w->cond);
}

static int ops_complete_locked(struct ferry_table *t, struct ferry_worker *w, struct ferry_req *r,
			       const uint32_t *idx, uint32_t count, int status, const float *vals,
			       size_t nvals, uint32_t owner, const uint64_t *slots)
{
	size_t need = 0;

	/* check every index before touching anything */
	for (uint32_t c = 0; c < count; c++) {
		if (idx[c] >= r->n || (r->done[idx[c] / 8] & (1u << (idx[c] % 8))))
			return -FERRY_E_PROTO;
		if (r->op == FERRY_OP_PULL && !status)
			need += ferry__value_len(t, r->keys[idx[c]]);
	}
	if (vals && (nvals < need || nvals - need >= FERRY_MSG_ALIGN / sizeof(float)))
		return -FERRY_E_PROTO;
	for (uint32_t c = 0; c < count; c++) {
		uint32_t i = idx[c];
		uint64_t key = r->keys[i];

		if (r->op == FERRY_OP_PULL && !status && vals) {
			uint32_t len = ferry__value_len(t, key);

			memcpy(r->out + ops_req_off(t, r, i), vals, len * sizeof(float));
			vals += len;
		}
		if (owner != t->fy->rank && owner < t->fy->world && !status) {
			if (slots)
				ferry__loc_set_slot(t, key, owner, (uint32_t)(slots[c] >> 32),
						    (uint32_t)slots[c]);
			else
				ferry__loc_set(t, key, owner);
		}
		ops_mark_done(w, r, i, status);
	}
	return 0;
}

void ferry__ops_complete(struct ferry *fy, uint32_t worker, uint64_t ticket, const uint32_t *idx,
			 uint32_t count, int status, const float *vals, size_t nvals)
{
	struct ferry_worker *w;
	struct ferry_req *r;

	if (worker >= FERRY_MAX_WORKERS)
		return;
	w = rcu_dereference(fy->workers[worker]);
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	r = ferry__ops_req_find(w, ticket);
	if (r)
		ops_complete_locked(r->t, w, r, idx, count, status, vals, nvals, fy->rank, NULL);
	pthread_mutex_unlock(&w->lock);
}

static void ops_on_reply(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v)
{
	const struct ferry_msg_reply *rep = v->body;
	struct ferry_worker *w;
	struct ferry_req *r;
	int rc = 0;

	if (rep->worker >= FERRY_MAX_WORKERS)
		goto bad;
	w = rcu_dereference(fy->workers[rep->worker]);
	if (!w)
		return; /* destroyed meanwhile */
	pthread_mutex_lock(&w->lock);
	r = ferry__ops_req_find(w, rep->req);
	/* a stale ticket (timed out, collected) is dropped, not an error */
	if (r && r->t == t && r->op == rep->op)
		rc = ops_complete_locked(t, w, r, v->idx, v->count, rep->status,
					 rep->op == FERRY_OP_PULL ? v->vals : NULL, v->nvals,
					 rep->owner, v->slots);
	pthread_mutex_unlock(&w->lock);
	if (!rc)
		return;
bad:
	ferry_err("proto: rank %u sent a reply that does not match any request of this node "
		  "(worker %u); dropping rank %u",
		  src, rep->worker, src);
	ferry__node_drop_peer(fy, src);
}

/* ---- sending operations, replies and forwards ------------------------- */

void ferry__ops_send_reply(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			   int status, const uint32_t *idx, uint32_t count, const float *vals,
			   size_t nvals)
{
	ferry__ops_send_reply_slots(fy, t, op, status, idx, count, NULL, vals, nvals);
}

/* @slots: per key (slot << 32 | epoch) for one-sided origins, or NULL */
void ferry__ops_send_reply_slots(struct ferry *fy, struct ferry_table *t,
				 const struct ferry_msg_op *op, int status, const uint32_t *idx,
				 uint32_t count, const uint64_t *slots, const float *vals,
				 size_t nvals)
{
	struct ferry_frame f;
	struct ferry_msg_reply *rep;
	void *p;

	if (op->origin == fy->rank) {
		/* our own operation: no message needed */
		ferry__ops_complete(fy, op->worker, op->req, idx, count, status,
				    status ? NULL : vals, nvals);
		return;
	}
	ferry__frame_begin(&f);
	rep = ferry__frame_put(&f, sizeof(*rep));
	if (rep) {
		rep->req = op->req;
		rep->worker = op->worker;
		rep->count = count;
		rep->status = status;
		rep->owner = fy->rank;
		rep->op = op->op;
		rep->flags = slots && !status ? FERRY_REPLY_F_SLOTS : 0;
	}
	p = ferry__frame_put(&f, count * sizeof(uint32_t));
	if (p)
		memcpy(p, idx, count * sizeof(uint32_t));
	if (slots && !status) {
		if (count & 1)
			ferry__frame_put(&f, sizeof(uint32_t)); /* keep the hints aligned */
		p = ferry__frame_put(&f, count * sizeof(uint64_t));
		if (p)
			memcpy(p, slots, count * sizeof(uint64_t));
	}
	if (nvals && !status) {
		p = ferry__frame_put(&f, nvals * sizeof(float));
		if (p)
			memcpy(p, vals, nvals * sizeof(float));
	}
	if (!ferry__frame_finish(&f, FERRY_MSG_REPLY, fy->rank, t->id))
		ferry__send(fy, op->origin, f.buf, f.len);
	else
		ferry_err("ops: cannot build a reply of %u keys for rank %u (out of memory)", count,
			  op->origin);
	ferry__frame_free(&f);
}

/* start an OP frame to a destination */
static struct ferry_msg_op *ops_frame_start(struct ops_dest *d, const struct ferry_msg_op *tmpl)
{
	struct ferry_msg_op *op;

	ferry__frame_begin(&d->f);
	op = ferry__frame_put(&d->f, sizeof(*op));
	if (op)
		*op = *tmpl;
	d->count = 0;
	return op;
}

static void ops_frame_send(struct ferry *fy, struct ferry_table *t, struct ops_dest *d)
{
	struct ferry_msg_op *op;
	int rc;

	if (!d->count || d->f.len == SIZE_MAX) {
		ferry__frame_free(&d->f);
		return;
	}
	op = (struct ferry_msg_op *)(d->f.buf + sizeof(struct ferry_msg_hdr));
	op->count = d->count;
	rc = ferry__frame_finish(&d->f, FERRY_MSG_OP, fy->rank, t->id);
	if (!rc)
		rc = ferry__send(fy, d->dst, d->f.buf, d->f.len);
	if (rc) {
		/* answer the origin so it does not wait for nothing */
		const struct ferry_msg_key *k = (const void *)(op + 1);
		uint32_t *idx = malloc(d->count * sizeof(uint32_t));

		if (idx) {
			for (uint32_t i = 0; i < d->count; i++)
				idx[i] = k[i].idx;
			ferry__ops_send_reply(fy, t, op, rc, idx, d->count, NULL, 0);
			free(idx);
		}
	}
	ferry__frame_free(&d->f);
}

void ferry__ops_out_add(struct ops_out *o, const struct ferry_msg_op *tmpl, uint32_t dst,
			const struct ferry_msg_key *k, const float *in)
{
	struct ferry_msg_key *kk;

	if (!o->used) {
		ops_frame_start(&o->d, tmpl);
		o->d.dst = dst;
		o->vals.buf = NULL;
		o->vals.len = o->vals.cap = 0;
		o->used = 1;
	}
	kk = ferry__frame_put(&o->d.f, sizeof(*kk));
	if (kk)
		*kk = *k;
	if (in) {
		float *v = ferry__frame_put(&o->vals, k->len * sizeof(float));

		if (v)
			memcpy(v, in, k->len * sizeof(float));
	}
	o->d.count++;
}

void ferry__ops_out_flush(struct ferry *fy, struct ferry_table *t, struct ops_out *o)
{
	if (!o->used)
		return;
	if (o->vals.len) {
		void *p = o->vals.len == SIZE_MAX ? NULL : ferry__frame_put(&o->d.f, o->vals.len);

		if (p)
			memcpy(p, o->vals.buf, o->vals.len);
		else
			o->d.f.len = SIZE_MAX;
	}
	ferry__frame_free(&o->vals);
	ops_frame_send(fy, t, &o->d);
	o->used = 0;
}

/* forward one key operation toward its owner; progress thread */
void ferry__ops_forward_one(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			    const struct ferry_msg_key *k, const float *in)
{
	struct ferry_msg_op tmpl = *op;
	uint32_t home = ferry__home(t, k->key), dst;
	struct ops_out o = { .used = 0 };

	dst = home == fy->rank ? t->dir.owner[k->key] : home;
	if (op->hops >= FERRY_MAX_HOPS || dst == fy->rank) {
		ferry_err("ops: key %llu of table %u cannot be routed (%s); failing the operation",
			  (unsigned long long)k->key, t->id,
			  dst == fy->rank ? "this home records itself as owner but holds no value" :
					    "it was forwarded too often");
		ferry__ops_send_reply(fy, t, op, -EIO, &k->idx, 1, NULL, 0);
		return;
	}
	tmpl.hops++;
	tmpl.count = 0;
	ferry__ops_out_add(&o, &tmpl, dst, k, op->op == FERRY_OP_PULL ? NULL : in);
	ferry__ops_out_flush(fy, t, &o);
	atomic_fetch_add_explicit(&fy->forwards, 1, memory_order_relaxed);
}

/* an OP frame arrived: apply what lives here, queue what is on its way,
 * forward the rest. Progress thread, rcu_read_lock held. */
static void ops_on_op(struct ferry *fy, struct ferry_table *t, uint32_t src,
		      const struct ferry_proto_view *v)
{
	const struct ferry_msg_op *op = v->body;
	const float *in = v->vals;
	uint32_t *idx = malloc(v->count * sizeof(uint32_t));
	uint64_t *slots = ferry__table_onesided(t) && op->origin != fy->rank ?
				  malloc(v->count * sizeof(uint64_t)) :
				  NULL;
	float *out = NULL;
	size_t nout = 0, nserved = 0, out_cap = 0;
	struct ops_out *fwd = NULL;
	struct ferry_msg_op tmpl = *op;
	int queued;

	if (op->op == FERRY_OP_PULL) {
		for (uint32_t i = 0; i < v->count; i++)
			out_cap += v->keys[i].len;
		out = malloc(out_cap * sizeof(float) + 1);
	}
	fwd = calloc(fy->world, sizeof(*fwd));
	if (!idx || (op->op == FERRY_OP_PULL && !out) || !fwd) {
		ferry_err("ops: out of memory serving %u keys for rank %u", v->count, src);
		goto out;
	}
	tmpl.hops++;
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_key *k = &v->keys[i];
		const float *kin = op->op == FERRY_OP_PULL ? NULL : in;
		uint32_t home, dst;

		if (!ferry__ops_apply_slot(t, op->op, k->key, kin, out ? out + nout : NULL,
					   slots ? &slots[nserved] : NULL)) {
			idx[nserved++] = k->idx;
			if (out)
				nout += k->len;
		} else if ((queued = ferry__pend_queue_op(&t->pend, op, k, kin)) < 0) {
			ferry_err("ops: out of memory queueing an operation on key %llu",
				  (unsigned long long)k->key);
			ferry__ops_send_reply(fy, t, op, -ENOMEM, &k->idx, 1, NULL, 0);
		} else if (!queued) {
			home = ferry__home(t, k->key);
			dst = home == fy->rank ? t->dir.owner[k->key] : home;
			if (op->hops >= FERRY_MAX_HOPS || dst == fy->rank) {
				ferry__ops_forward_one(fy, t, op, k, kin); /* fails it, logged */
			} else {
				ferry__ops_out_add(&fwd[dst], &tmpl, dst, k, kin);
				atomic_fetch_add_explicit(&fy->forwards, 1, memory_order_relaxed);
			}
		}
		if (kin)
			in += k->len;
	}
	if (nserved) {
		atomic_fetch_add_explicit(&fy->served_ops, nserved, memory_order_relaxed);
		ferry__ops_send_reply_slots(fy, t, op, 0, idx, (uint32_t)nserved, slots, out, nout);
	}
	for (uint32_t r = 0; r < fy->world; r++)
		ferry__ops_out_flush(fy, t, &fwd[r]);
out:
	free(fwd);
	free(idx);
	free(slots);
	free(out);
}

int ferry__ops_attach(struct ferry *fy)
{
	int rc = ferry__dispatch_register(fy, FERRY_MSG_OP, FERRY_DISPATCH_TABLE, ops_on_op);

	return rc ? rc :
		    ferry__dispatch_register(fy, FERRY_MSG_REPLY, FERRY_DISPATCH_TABLE,
					     ops_on_reply);
}

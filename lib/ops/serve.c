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

#include "lib/ops/codec.h"
#include "lib/ops/internal.h"

/* ---- applying operations to slots -------------------------------------- */

int ferry__ops_apply(struct ferry_table *t, uint8_t op, uint64_t key, const float *in, float *out)
{
	return ferry__ops_apply_slot(t, op, key, in, out, NULL);
}

int ferry__ops_apply_slot(struct ferry_table *t, uint8_t op, uint64_t key, const float *in,
			  float *out, uint64_t *hint)
{
	struct ferry_slot *s = ferry__own(t, key);
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
	if (r && r->t == t && r->op == rep->op && ferry__tl_of(fy))
		for (uint32_t i = 0; i < v->count; i++)
			if (v->idx[i] < r->n)
				ferry__tl_stamp(fy, FERRY_TL_REPLY_RECV, r->keys[v->idx[i]]);
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
	ferry__node_peer_failed(fy, src);
}

/* ---- replies ---------------------------------------------------------- */

/*
 * A reply builder: the keys served for one OP frame, sent in REPLY frames of
 * at most FERRY_MSG_MAX bytes. A REPLY is its header, count indices, (for
 * one-sided origins) count slot hints, then the values, so the three parts
 * grow in buffers of their own and are spliced at each flush. Memory: one
 * frame's worth, however many keys the OP asked for (a pull of many large
 * values no longer allocates all of them at once).
 */
struct ops_reply {
	const struct ferry_msg_op *op;
	int status;
	bool with_slots;
	struct ferry_repl_batch *repl;	     /* replicas: the updates' copies, reply held */
	struct ferry_frame idx, slots, vals; /* raw buffers, no header */
	uint32_t count;
};

static void ops_reply_init(struct ops_reply *rb, const struct ferry_msg_op *op, int status,
			   bool with_slots)
{
	memset(rb, 0, sizeof(*rb));
	rb->op = op;
	rb->status = status;
	rb->with_slots = with_slots && !status;
}

static size_t ops_reply_bytes(const struct ops_reply *rb, size_t more_keys, size_t more_vals)
{
	size_t n = rb->count + more_keys;

	return sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_reply) +
	       n * sizeof(uint32_t) +
	       (rb->with_slots ? sizeof(uint32_t) + n * sizeof(uint64_t) : 0) + rb->vals.len +
	       more_vals * sizeof(float) + FERRY_MSG_ALIGN;
}

static void ops_reply_flush(struct ferry *fy, struct ferry_table *t, struct ops_reply *rb)
{
	const struct ferry_msg_op *op = rb->op;
	struct ferry_msg_reply *rep;
	struct ferry_frame f;
	bool hold;
	void *p;
	int rc;

	if (!rb->count)
		goto out; /* every key added was dropped again: only the buffers go */
	if (rb->idx.len == SIZE_MAX) {
		/* not even the indices: the origin's wait is bounded by its timeout */
		ferry_err("ops: out of memory building a reply of %u keys for rank %u; its "
			  "operation times out",
			  rb->count, op->origin);
		goto out;
	}
	if (rb->slots.len == SIZE_MAX || rb->vals.len == SIZE_MAX) {
		/* no room for values or hints: the same keys answered with an error,
		 * which needs the indices only */
		ferry_err("ops: out of memory building a reply of %u keys for rank %u; they "
			  "fail with -ENOMEM",
			  rb->count, op->origin);
		ferry__frame_free(&rb->slots);
		ferry__frame_free(&rb->vals);
		rb->status = -ENOMEM;
		rb->with_slots = false;
	}
	hold = ferry__repl_batch_any(rb->repl);
	/* fencing: an update of a table with replicas is acknowledged only
	 * under the lease (a held one when its backups answered: repl.c) */
	if (t->repl && op->op != FERRY_OP_PULL && !hold && !rb->status &&
	    ferry__lease_check(fy, "an update"))
		rb->status = -FERRY_E_PEER;
	if (rb->with_slots && op->origin != fy->rank)
		ferry__ops_chunks_announce(fy, t); /* before any hint into a new chunk */
	if (op->origin == fy->rank && !hold) {
		/* our own operation: no message needed */
		ferry__ops_complete(fy, op->worker, op->req, (const uint32_t *)rb->idx.buf,
				    rb->count, rb->status,
				    rb->status ? NULL : (float *)rb->vals.buf,
				    rb->vals.len / sizeof(float));
		goto out;
	}
	ferry__frame_begin(&f);
	rep = ferry__frame_put(&f, sizeof(*rep));
	if (rep) {
		rep->req = op->req;
		rep->worker = op->worker;
		rep->count = rb->count;
		rep->status = rb->status;
		rep->owner = fy->rank;
		rep->op = op->op;
		rep->flags = rb->with_slots ? FERRY_REPLY_F_SLOTS : 0;
	}
	p = ferry__frame_put(&f, rb->idx.len);
	if (p)
		memcpy(p, rb->idx.buf, rb->idx.len);
	if (rb->with_slots) {
		if (rb->count & 1)
			ferry__frame_put(&f, sizeof(uint32_t)); /* keep the hints aligned */
		p = ferry__frame_put(&f, rb->slots.len);
		if (p)
			memcpy(p, rb->slots.buf, rb->slots.len);
	}
	if (rb->vals.len) {
		p = ferry__frame_put(&f, rb->vals.len);
		if (p)
			memcpy(p, rb->vals.buf, rb->vals.len);
	}
	rc = ferry__frame_finish(&f, FERRY_MSG_REPLY, fy->rank, t->id);
	if (!rc && hold && (rc = ferry__repl_batch_hold(t, rb->repl, op->origin, &f))) {
		/* the copies could not be made: applied here only, which the
		 * origin learns as the rule for -FERRY_E_PEER says */
		((struct ferry_msg_reply *)(f.buf + sizeof(struct ferry_msg_hdr)))->status =
			-FERRY_E_PEER;
		rc = 0;
	}
	if (!rc && f.buf)
		rc = ferry__send(fy, op->origin, f.buf, f.len);
	ferry__frame_free(&f);
	if (rc)
		ferry_err("ops: cannot send a reply of %u keys to rank %u: %s", rb->count,
			  op->origin, ferry_strerror(rc));
out:
	ferry__frame_free(&rb->idx);
	ferry__frame_free(&rb->slots);
	ferry__frame_free(&rb->vals);
	rb->count = 0;
}

/*
 * Add key @idx to a reply; @len floats of its value are written by the
 * caller at the returned address (NULL: none, or out of memory, which the
 * flush reports as an error for the whole frame).
 */
static float *ops_reply_add(struct ferry *fy, struct ferry_table *t, struct ops_reply *rb,
			    uint32_t idx, uint64_t slot, uint32_t len)
{
	uint32_t *pi;
	float *pv = NULL;

	if (rb->count && ops_reply_bytes(rb, 1, len) > FERRY_MSG_MAX)
		ops_reply_flush(fy, t, rb);
	pi = ferry__frame_put(&rb->idx, sizeof(uint32_t));
	if (pi)
		*pi = idx;
	if (rb->with_slots) {
		uint64_t *ps = ferry__frame_put(&rb->slots, sizeof(uint64_t));

		if (ps)
			*ps = slot;
	}
	if (len)
		pv = ferry__frame_put(&rb->vals, (size_t)len * sizeof(float));
	rb->count++;
	return pv;
}

/* take back the key just added (it was not served after all) */
static void ops_reply_drop(struct ops_reply *rb, uint32_t len)
{
	rb->count--;
	if (rb->idx.len != SIZE_MAX)
		rb->idx.len -= sizeof(uint32_t);
	if (rb->with_slots && rb->slots.len != SIZE_MAX)
		rb->slots.len -= sizeof(uint64_t);
	if (len && rb->vals.len != SIZE_MAX)
		rb->vals.len -= (size_t)len * sizeof(float);
}

void ferry__ops_send_reply(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			   int status, const uint32_t *idx, uint32_t count, const float *vals,
			   size_t nvals)
{
	struct ops_reply rb;

	ops_reply_init(&rb, op, status, false);
	for (uint32_t i = 0; i < count; i++) {
		/* values come with a single key (a replayed pull) */
		uint32_t len = count == 1 && !status ? (uint32_t)nvals : 0;
		float *pv = ops_reply_add(fy, t, &rb, idx[i], 0, len);

		if (pv)
			memcpy(pv, vals, (size_t)len * sizeof(float));
	}
	ops_reply_flush(fy, t, &rb);
}

/* ---- OP frames ---------------------------------------------------------- */

/* answer the keys of an OP frame that could not go with @status */
static void ops_frame_fail(struct ferry *fy, struct ferry_table *t, struct ops_dest *d,
			   const struct ferry_msg_op *tmpl, int status)
{
	const struct ferry_msg_key *k =
		(const void *)(d->f.buf + sizeof(struct ferry_msg_hdr) + sizeof(*tmpl));
	struct ops_reply rb;

	ops_reply_init(&rb, tmpl, status, false);
	for (uint32_t i = 0; i < d->count; i++)
		ops_reply_add(fy, t, &rb, k[i].idx, 0, 0);
	ops_reply_flush(fy, t, &rb);
}

/*
 * The origin of a request keys of which this node forwarded to @dst learns
 * it (OP_FWD), so that its wait also ends when @dst fails: @dst answers for
 * those keys now, and a frame queued toward a node that then fails is
 * dropped with its connection, by this node and by every other (docs/
 * faults.md, "A push forwarded toward a dying node"). Progress thread,
 * rcu_read_lock held; one frame per forwarded OP frame.
 */
static void ops_fwd_note(struct ferry *fy, struct ferry_table *t, uint32_t worker, uint64_t req,
			 uint32_t dst)
{
	struct ferry_worker *w = rcu_dereference(fy->workers[worker]);
	struct ferry_req *r;

	if (!w)
		return; /* destroyed meanwhile */
	pthread_mutex_lock(&w->lock);
	r = ferry__ops_req_find(w, req);
	/* a stale ticket (answered, collected) is nothing to note */
	if (r && r->t == t) {
		uint8_t i = 0;

		while (i < r->nfwds && r->fwds[i] != dst)
			i++;
		if (i == r->nfwds) {
			if (r->nfwds < sizeof(r->fwds) / sizeof(r->fwds[0]))
				r->fwds[r->nfwds++] = dst;
			else
				r->fwds_many = true;
		}
		atomic_store_explicit(&r->fwds_new, true, memory_order_release);
	}
	pthread_mutex_unlock(&w->lock);
}

static void ops_fwd_notice(struct ferry *fy, struct ferry_table *t, uint32_t origin,
			   uint32_t worker, uint64_t req, uint32_t dst)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_op_fwd m;
	} f;

	if (dst == origin || worker >= FERRY_MAX_WORKERS)
		return; /* the origin serves them itself */
	if (origin == fy->rank) {
		ops_fwd_note(fy, t, worker, req, dst);
		return;
	}
	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, FERRY_MSG_OP_FWD, sizeof(f), fy->rank, t->id);
	f.m.worker = worker;
	f.m.dst = dst;
	f.m.req = req;
	/* a lost notice costs only the wait's length, as before it existed */
	(void)ferry__send(fy, origin, &f, sizeof(f));
}

static void ops_on_op_fwd(struct ferry *fy, struct ferry_table *t, uint32_t src,
			  const struct ferry_proto_view *v)
{
	const struct ferry_msg_op_fwd *m = v->body;

	(void)src; /* any node may forward (a home, an old owner) */
	if (m->worker >= FERRY_MAX_WORKERS) {
		ferry_err("proto: rank %u sent a forward notice for worker %u, out of range; "
			  "dropping rank %u",
			  src, m->worker, src);
		ferry__node_peer_failed(fy, src);
		return;
	}
	if (m->dst != fy->rank)
		ops_fwd_note(fy, t, m->worker, m->req, m->dst);
}

void ferry__ops_out_flush(struct ferry *fy, struct ferry_table *t, struct ops_out *o)
{
	struct ferry_msg_op *op;
	uint32_t origin = 0, worker = 0;
	uint64_t req = 0;
	uint8_t hops = 0;
	int rc = -ENOMEM;

	if (!o->used)
		return;
	o->used = 0;
	if (!o->d.count || o->d.f.len == SIZE_MAX)
		goto fail;
	if (o->vals.len) {
		void *p = o->vals.len == SIZE_MAX ? NULL : ferry__frame_put(&o->d.f, o->vals.len);

		if (!p)
			goto fail;
		memcpy(p, o->vals.buf, o->vals.len);
	}
	op = (struct ferry_msg_op *)(o->d.f.buf + sizeof(struct ferry_msg_hdr));
	op->count = o->d.count;
	rc = ferry__frame_finish(&o->d.f, FERRY_MSG_OP, fy->rank, t->id);
	if (!rc) {
		/* the buffer is ours until the next frame: read it now */
		op = (struct ferry_msg_op *)(o->d.f.buf + sizeof(struct ferry_msg_hdr));
		origin = op->origin;
		worker = op->worker;
		req = op->req;
		hops = op->hops;
		rc = ferry__send(fy, o->d.dst, o->d.f.buf, o->d.f.len);
	}
	if (!rc) {
		if (hops)
			ops_fwd_notice(fy, t, origin, worker, req, o->d.dst);
		goto out;
	}
	/* a failed send: the next try goes through the home, not the old hint
	 * (the buffer may have moved in frame_finish: find the keys anew) */
	{
		const struct ferry_msg_key *k =
			(const void *)(o->d.f.buf + sizeof(struct ferry_msg_hdr) +
				       sizeof(struct ferry_msg_op));

		for (uint32_t i = 0; i < o->d.count; i++)
			if (ferry__loc_get(t, k[i].key) == o->d.dst)
				ferry__loc_set(t, k[i].key, ferry__home(t, k[i].key));
	}
fail:
	/* answer the origin so it does not wait for nothing; the keys written
	 * before an allocation failure are intact in the buffer */
	if (o->d.count && o->d.f.buf)
		ops_frame_fail(fy, t, &o->d, &o->tmpl, rc);
out:
	ferry__frame_free(&o->vals);
	ferry__frame_free(&o->d.f);
	o->d.count = 0;
}

void ferry__ops_out_add(struct ferry *fy, struct ferry_table *t, struct ops_out *o,
			const struct ferry_msg_op *tmpl, uint32_t dst,
			const struct ferry_msg_key *k, const float *in)
{
	/* a compressed push's values go as 16-bit codes (lib/ops/codec.c) */
	size_t vsize = tmpl->flags ? sizeof(uint16_t) : sizeof(float);
	size_t need = sizeof(*k) + (in ? (size_t)k->len * vsize : 0);
	struct ferry_msg_key *kk;

	/* a full frame goes now: an OP of any size leaves in pieces */
	if (o->used && o->d.f.len != SIZE_MAX && o->vals.len != SIZE_MAX &&
	    o->d.f.len + o->vals.len + need + FERRY_MSG_ALIGN > FERRY_MSG_MAX)
		ferry__ops_out_flush(fy, t, o);
	if (!o->used) {
		struct ferry_msg_op *op;

		ferry__frame_begin(&o->d.f);
		op = ferry__frame_put(&o->d.f, sizeof(*op));
		if (op)
			*op = *tmpl;
		o->tmpl = *tmpl;
		o->d.count = 0;
		o->d.dst = dst;
		o->vals.buf = NULL;
		o->vals.len = o->vals.cap = 0;
		o->used = 1;
	}
	kk = ferry__frame_put(&o->d.f, sizeof(*kk));
	if (!kk) {
		/* not in the frame: answer it alone */
		ferry_err("ops: out of memory sending key %llu to rank %u",
			  (unsigned long long)k->key, dst);
		ferry__ops_send_reply(fy, t, tmpl, -ENOMEM, &k->idx, 1, NULL, 0);
		return;
	}
	*kk = *k;
	if (in && tmpl->flags) {
		uint16_t *c = ferry__frame_put(&o->vals, k->len * sizeof(uint16_t));

		if (c)
			ferry__codec_encode(tmpl->flags, in, c, k->len);
	} else if (in) {
		float *v = ferry__frame_put(&o->vals, k->len * sizeof(float));

		if (v)
			memcpy(v, in, k->len * sizeof(float));
	}
	o->d.count++;
}

/* forward one key operation toward its owner; progress thread */
void ferry__ops_forward_one(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			    const struct ferry_msg_key *k, const float *in)
{
	struct ferry_msg_op tmpl = *op;
	uint32_t home = ferry__home(t, k->key), dst;
	struct ops_out o = { .used = 0 };

	dst = home == fy->rank ? ferry__owner(t, k->key) : home;
	if (dst == fy->rank && t->repl) {
		/* a failed home's key, here at its new home before the takeover
		 * (lib/ops/repl.c): the origin retries */
		ferry_dbg("ops: key %llu of table %u waits for its takeover on rank %u",
			  (unsigned long long)k->key, t->id, fy->rank);
		ferry__ops_send_reply(fy, t, op, -FERRY_E_PEER, &k->idx, 1, NULL, 0);
		return;
	}
	if (op->hops >= FERRY_MAX_HOPS || dst == fy->rank) {
		/* after a failure this is what a lost key looks like (its owner
		 * and its backups failed together, more failures than replicas)
		 * or one whose route has not settled yet: -FERRY_E_PEER, as
		 * every operation a failure cuts (docs/faults.md); it was not
		 * applied here. With no failure on record, a broken directory */
		bool failed = atomic_load_explicit(&fy->failures, memory_order_relaxed) != 0;

		ferry_err("ops: key %llu of table %u cannot be routed (%s); failing the operation "
			  "with %s",
			  (unsigned long long)k->key, t->id,
			  dst == fy->rank ? "this home records itself as owner but holds no value" :
					    "it was forwarded too often",
			  failed ? "-FERRY_E_PEER: a node failed, and the key's owner and its "
				   "backups may have failed together; retry, or restore it" :
				   "-EIO");
		ferry__ops_send_reply(fy, t, op, failed ? -FERRY_E_PEER : -EIO, &k->idx, 1, NULL,
				      0);
		return;
	}
	tmpl.hops++;
	tmpl.count = 0;
	ferry__ops_out_add(fy, t, &o, &tmpl, dst, k, op->op == FERRY_OP_PULL ? NULL : in);
	ferry__ops_out_flush(fy, t, &o);
	atomic_fetch_add_explicit(&fy->forwards, 1, memory_order_relaxed);
}

void ferry__ops_send_to(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			const struct ferry_msg_key *k, const float *in, uint32_t dst)
{
	struct ferry_msg_op tmpl = *op;
	struct ops_out o = { .used = 0 };

	tmpl.hops++;
	tmpl.count = 0;
	ferry__ops_out_add(fy, t, &o, &tmpl, dst, k, op->op == FERRY_OP_PULL ? NULL : in);
	ferry__ops_out_flush(fy, t, &o);
}

/* an OP frame arrived: apply what lives here, queue what is on its way,
 * forward the rest. Progress thread, rcu_read_lock held. Memory: one reply
 * frame and one forward frame per destination, at most FERRY_MSG_MAX each. */
static void ops_on_op(struct ferry *fy, struct ferry_table *t, uint32_t src,
		      const struct ferry_proto_view *v)
{
	const struct ferry_msg_op *op = v->body;
	const float *in = v->vals;
	struct ops_out *fwd = calloc(fy->world, sizeof(*fwd));
	struct ferry_msg_op tmpl = *op;
	struct ops_reply rb;
	size_t nserved = 0;
	float *decoded = NULL;
	int queued;

	if (op->worker >= FERRY_MAX_WORKERS || (!op->hops && op->origin != src)) {
		/* the reply would go to a node or worker that never asked */
		ferry_err("proto: rank %u sent an operation for worker %u of rank %u (hops %u); "
			  "dropping rank %u",
			  src, op->worker, op->origin, op->hops, src);
		ferry__node_peer_failed(fy, src);
		free(fwd);
		return;
	}
	if (v->codes) {
		/* a compressed push: the same floats the origin rounded to; a
		 * forward or a queued replay encodes them again without loss */
		decoded = malloc((v->nvals ? v->nvals : 1) * sizeof(float));
		if (decoded)
			ferry__codec_decode(op->flags, v->codes, decoded, v->nvals);
		in = decoded;
	}
	if (!fwd || (v->codes && !decoded)) {
		ferry_err("ops: out of memory serving %u keys for rank %u", v->count, src);
		/* answered, so the origin does not wait out its timeout */
		for (uint32_t i = 0; i < v->count; i++)
			ferry__ops_send_reply(fy, t, op, -ENOMEM, &v->keys[i].idx, 1, NULL, 0);
		free(fwd);
		free(decoded);
		return;
	}
	if (t->repl && atomic_load_explicit(&fy->fenced, memory_order_relaxed)) {
		/* fencing: this node stopped serving for good (logged once) */
		ops_reply_init(&rb, op, -FERRY_E_PEER, false);
		for (uint32_t i = 0; i < v->count; i++)
			ops_reply_add(fy, t, &rb, v->keys[i].idx, 0, 0);
		ops_reply_flush(fy, t, &rb);
		free(fwd);
		free(decoded);
		return;
	}
	ops_reply_init(&rb, op, 0, ferry__table_onesided(t) && op->origin != fy->rank);
	if (op->op != FERRY_OP_PULL)
		rb.repl = ferry__repl_batch_new(t);
	tmpl.hops++;
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_key *k = &v->keys[i];
		const float *kin = op->op == FERRY_OP_PULL ? NULL : in;
		uint32_t vlen = op->op == FERRY_OP_PULL ? k->len : 0;
		uint32_t home, dst;
		uint64_t hint = 0;
		float *out = ops_reply_add(fy, t, &rb, k->idx, 0, vlen);

		if (kin)
			in += k->len;
		if (vlen && !out) {
			/* no room for the value: the reply frame is poisoned and
			 * its flush answers every key of it with -ENOMEM */
			continue;
		}
		if (!ferry__ops_apply_slot(t, op->op, k->key, kin, out, &hint)) {
			ferry__tl_stamp(fy, FERRY_TL_OP_APPLIED, k->key);
			if (rb.with_slots && rb.slots.len != SIZE_MAX)
				((uint64_t *)rb.slots.buf)[rb.count - 1] = hint;
			if (rb.repl)
				(void)ferry__repl_batch_add(t, rb.repl, k->key);
			nserved++;
			continue;
		}
		ops_reply_drop(&rb, vlen);
		if ((queued = ferry__pend_queue_op(&t->pend, op, k, kin)) < 0) {
			if (queued == -ENOMEM)
				ferry_err("ops: out of memory queueing an operation on key %llu",
					  (unsigned long long)k->key);
			ferry__ops_send_reply(fy, t, op, queued, &k->idx, 1, NULL, 0);
		} else if (!queued) {
			struct ferry_slot *s;
			int rc;

			home = ferry__home(t, k->key);
			dst = home == fy->rank ? ferry__owner(t, k->key) : home;
			if (dst == fy->rank &&
			    (rc = ferry__ops_materialize(t, k->key, &s)) != -EAGAIN) {
				/* a sparse key's first use, here at its home */
				float *o = rc || !vlen ? NULL :
							 malloc((size_t)vlen * sizeof(float));

				if (!rc && vlen && !o)
					rc = -ENOMEM;
				if (!rc)
					rc = ferry__ops_apply(t, op->op, k->key, kin, o);
				ferry__ops_send_reply(fy, t, op, rc, &k->idx, 1, rc ? NULL : o,
						      rc || !o ? 0 : vlen);
				free(o);
				nserved += !rc;
			} else if (op->hops >= FERRY_MAX_HOPS || dst == fy->rank) {
				ferry__ops_forward_one(fy, t, op, k, kin); /* fails it, logged */
			} else {
				ferry__ops_out_add(fy, t, &fwd[dst], &tmpl, dst, k, kin);
				atomic_fetch_add_explicit(&fy->forwards, 1, memory_order_relaxed);
			}
		}
	}
	if (nserved)
		atomic_fetch_add_explicit(&fy->served_ops, nserved, memory_order_relaxed);
	/* before the send: the origin may run before this thread returns */
	if (ferry__tl_of(fy))
		for (uint32_t i = 0; i < v->count; i++)
			ferry__tl_stamp(fy, FERRY_TL_REPLY_SENT, v->keys[i].key);
	ops_reply_flush(fy, t, &rb);
	ferry__repl_batch_free(t, rb.repl);
	for (uint32_t r = 0; r < fy->world; r++)
		ferry__ops_out_flush(fy, t, &fwd[r]);
	free(fwd);
	free(decoded);
}

int ferry__ops_attach(struct ferry *fy)
{
	int rc = ferry__dispatch_register(fy, FERRY_MSG_OP, FERRY_DISPATCH_TABLE, ops_on_op);

	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_OP_FWD, FERRY_DISPATCH_TABLE,
					      ops_on_op_fwd);
	if (!rc)
		rc = ferry__ops_chunks_attach(fy);
	if (!rc)
		rc = ferry__repl_attach(fy);

	return rc ? rc :
		    ferry__dispatch_register(fy, FERRY_MSG_REPLY, FERRY_DISPATCH_TABLE,
					     ops_on_reply);
}

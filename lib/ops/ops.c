/* SPDX-License-Identifier: MIT */
/*
 * ops.c - workers and key operations (pull, push, set).
 *
 *   worker thread                          progress threads
 *   -------------                          ----------------
 *   key live here? (own[] under RCU) --yes-> seqlock read / locked update,
 *        | no                                 in the calling thread, no message
 *        v
 *   group by location hint, one OP frame per destination
 *        ...................................> owner: apply, REPLY to origin
 *                                             not owner: queue if the key is
 *                                             on its way here, else forward
 *                                             (to the home; the home to the
 *                                             owner it recorded)
 *   wait: spin, then sleep on the worker's <- REPLY: copy values, count down
 *   condvar (bounded by the node timeout)      under worker.lock
 *
 * Operations of one worker on one key take effect in the order started: a
 * request that touches a key on which the same worker still has a remote
 * operation in flight is held back until that one completes.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/core/core.h"

static __thread int ops_rcu_regs; /* workers of this thread: register once */

/* ---- in-flight key set (open addressing, worker thread only) ----------- */

static uint32_t inflight_slot(const struct ferry_worker *w, uint64_t key)
{
	uint32_t mask = w->inflight_cap - 1, i = (uint32_t)ferry__hash64(key) & mask;

	while (w->inflight_cnt[i] && w->inflight_keys[i] != key)
		i = (i + 1) & mask;
	return i;
}

static int inflight_has(const struct ferry_worker *w, uint64_t key)
{
	return w->inflight_n && w->inflight_cnt[inflight_slot(w, key)];
}

static int inflight_grow(struct ferry_worker *w)
{
	uint32_t old_cap = w->inflight_cap, cap = old_cap ? old_cap * 2 : 256;
	uint64_t *old_keys = w->inflight_keys;
	uint32_t *old_cnt = w->inflight_cnt;

	w->inflight_keys = calloc(cap, sizeof(uint64_t));
	w->inflight_cnt = calloc(cap, sizeof(uint32_t));
	if (!w->inflight_keys || !w->inflight_cnt) {
		free(w->inflight_keys);
		free(w->inflight_cnt);
		w->inflight_keys = old_keys;
		w->inflight_cnt = old_cnt;
		return -ENOMEM;
	}
	w->inflight_cap = cap;
	for (uint32_t i = 0; i < old_cap; i++)
		if (old_cnt[i]) {
			uint32_t j = inflight_slot(w, old_keys[i]);

			w->inflight_keys[j] = old_keys[i];
			w->inflight_cnt[j] = old_cnt[i];
		}
	free(old_keys);
	free(old_cnt);
	return 0;
}

static int inflight_add(struct ferry_worker *w, uint64_t key)
{
	uint32_t i;

	if ((w->inflight_n + 1) * 2 > w->inflight_cap && inflight_grow(w))
		return -ENOMEM;
	i = inflight_slot(w, key);
	if (!w->inflight_cnt[i]) {
		w->inflight_keys[i] = key;
		w->inflight_n++;
	}
	w->inflight_cnt[i]++;
	return 0;
}

/* deletion with backward shift keeps probe chains whole */
static void inflight_del(struct ferry_worker *w, uint64_t key)
{
	uint32_t mask = w->inflight_cap - 1, i = inflight_slot(w, key), j;

	if (!w->inflight_cnt[i] || --w->inflight_cnt[i])
		return;
	w->inflight_n--;
	j = i;
	for (;;) {
		uint32_t home;

		j = (j + 1) & mask;
		if (!w->inflight_cnt[j])
			break;
		home = (uint32_t)ferry__hash64(w->inflight_keys[j]) & mask;
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			w->inflight_keys[i] = w->inflight_keys[j];
			w->inflight_cnt[i] = w->inflight_cnt[j];
			w->inflight_cnt[j] = 0;
			i = j;
		}
	}
}

/* counters: written by the worker's thread only, read by ferry_stats() */
static inline void ops_count(uint64_t *c, uint64_t n)
{
	__atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}

/* ---- workers ---------------------------------------------------------- */

int ferry_worker_create(struct ferry *fy, struct ferry_worker **worker_p)
{
	struct ferry_worker *w;
	pthread_condattr_t ca;
	int id = -1;

	if (!fy || !worker_p)
		return -EINVAL;
	if (atomic_load(&fy->closed))
		return -FERRY_E_CLOSED;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_lock(&fy->lock);
	for (int i = 0; i < FERRY_MAX_WORKERS; i++)
		if (!fy->workers[i]) {
			id = i;
			break;
		}
	if (id < 0) {
		pthread_mutex_unlock(&fy->lock);
		free(w);
		ferry_err("worker: this node has %d workers, the limit; destroy unused ones",
			  FERRY_MAX_WORKERS);
		return -ENOSPC;
	}
	w->fy = fy;
	w->id = (uint32_t)id;
	pthread_mutex_init(&w->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->cond, &ca);
	pthread_condattr_destroy(&ca);
	for (uint32_t i = 0; i < FERRY_MAX_INFLIGHT; i++)
		w->free_idx[i] = FERRY_MAX_INFLIGHT - 1 - i;
	w->nfree = FERRY_MAX_INFLIGHT;
	w->gen = 1;
	rcu_assign_pointer(fy->workers[id], w);
	atomic_fetch_add(&fy->refs, 1);
	pthread_mutex_unlock(&fy->lock);
	if (ops_rcu_regs++ == 0)
		urcu_memb_register_thread();
	*worker_p = w;
	return 0;
}

static void ops_req_free(struct ferry_worker *w, struct ferry_req *r);

void ferry_worker_destroy(struct ferry_worker *w)
{
	struct ferry *fy;

	if (!w)
		return;
	fy = w->fy;
	pthread_mutex_lock(&fy->lock);
	rcu_assign_pointer(fy->workers[w->id], NULL);
	pthread_mutex_unlock(&fy->lock);
	/* after this no progress thread can be inside the worker */
	urcu_memb_synchronize_rcu();
	for (uint32_t i = 0; i < FERRY_MAX_INFLIGHT; i++)
		if (w->reqs[i].ticket)
			ops_req_free(w, &w->reqs[i]);
	ferry__ops_rd_fini(w);
	atomic_fetch_add(&fy->gone_local_ops, w->local_ops);
	atomic_fetch_add(&fy->gone_remote_ops, w->remote_ops);
	if (--ops_rcu_regs == 0)
		urcu_memb_unregister_thread();
	free(w->inflight_keys);
	free(w->inflight_cnt);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	free(w);
	ferry__node_put(fy);
}

/* ---- applying operations to slots -------------------------------------- */

static int ops_apply_slot(struct ferry_table *t, uint8_t op, uint64_t key, const float *in,
			  float *out, uint64_t *hint);

int ferry__ops_apply(struct ferry_table *t, uint8_t op, uint64_t key, const float *in, float *out)
{
	return ops_apply_slot(t, op, key, in, out, NULL);
}

static int ops_apply_slot(struct ferry_table *t, uint8_t op, uint64_t key, const float *in,
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

static struct ferry_req *ops_req_find(struct ferry_worker *w, uint64_t ticket)
{
	uint32_t idx = (uint32_t)ticket;

	if (idx >= FERRY_MAX_INFLIGHT || w->reqs[idx].ticket != ticket)
		return NULL;
	return &w->reqs[idx];
}

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
	r = ops_req_find(w, ticket);
	if (r)
		ops_complete_locked(r->t, w, r, idx, count, status, vals, nvals, fy->rank, NULL);
	pthread_mutex_unlock(&w->lock);
}

void ferry__ops_on_reply(struct ferry *fy, struct ferry_table *t, uint32_t src,
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
	r = ops_req_find(w, rep->req);
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
	atomic_store(&fy->failed[src], true);
}

/* ---- sending operations, replies and forwards ------------------------- */

static void ops_send_reply_slots(struct ferry *fy, struct ferry_table *t,
				 const struct ferry_msg_op *op, int status, const uint32_t *idx,
				 uint32_t count, const uint64_t *slots, const float *vals,
				 size_t nvals);

struct ops_dest {
	struct ferry_frame f;
	uint32_t count;
	uint32_t dst;
};

void ferry__ops_send_reply(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			   int status, const uint32_t *idx, uint32_t count, const float *vals,
			   size_t nvals)
{
	ops_send_reply_slots(fy, t, op, status, idx, count, NULL, vals, nvals);
}

/* @slots: per key (slot << 32 | epoch) for one-sided origins, or NULL */
static void ops_send_reply_slots(struct ferry *fy, struct ferry_table *t,
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

/*
 * An OP frame is keys first, then values; for a frame we build key by key we
 * keep values in a second buffer and splice them at the end.
 */
struct ops_out {
	struct ops_dest d;
	struct ferry_frame vals;
	int used;
};

static void ops_out_add(struct ops_out *o, const struct ferry_msg_op *tmpl, uint32_t dst,
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

static void ops_out_flush(struct ferry *fy, struct ferry_table *t, struct ops_out *o)
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
	ops_out_add(&o, &tmpl, dst, k, op->op == FERRY_OP_PULL ? NULL : in);
	ops_out_flush(fy, t, &o);
	atomic_fetch_add_explicit(&fy->forwards, 1, memory_order_relaxed);
}

/* an OP frame arrived: apply what lives here, queue what is on its way,
 * forward the rest. Progress thread, rcu_read_lock held. */
void ferry__ops_on_op(struct ferry *fy, struct ferry_table *t, uint32_t src,
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

		if (!ops_apply_slot(t, op->op, k->key, kin, out ? out + nout : NULL,
				    slots ? &slots[nserved] : NULL)) {
			idx[nserved++] = k->idx;
			if (out)
				nout += k->len;
		} else if (!ferry__reloc_queue_op(t, op, k, kin)) {
			home = ferry__home(t, k->key);
			dst = home == fy->rank ? t->dir.owner[k->key] : home;
			if (op->hops >= FERRY_MAX_HOPS || dst == fy->rank) {
				ferry__ops_forward_one(fy, t, op, k, kin); /* fails it, logged */
			} else {
				ops_out_add(&fwd[dst], &tmpl, dst, k, kin);
				atomic_fetch_add_explicit(&fy->forwards, 1, memory_order_relaxed);
			}
		}
		if (kin)
			in += k->len;
	}
	if (nserved) {
		atomic_fetch_add_explicit(&fy->served_ops, nserved, memory_order_relaxed);
		ops_send_reply_slots(fy, t, op, 0, idx, (uint32_t)nserved, slots, out, nout);
	}
	for (uint32_t r = 0; r < fy->world; r++)
		ops_out_flush(fy, t, &fwd[r]);
out:
	free(fwd);
	free(idx);
	free(slots);
	free(out);
}

/* ---- one-sided pulls ----------------------------------------------------- */

/*
 * A pull of a key whose owner and slot the hint names is one READ of the
 * whole slot into a landing area of the worker's. The image is accepted when
 * head and tail versions are equal and even and key, epoch and state match;
 * a torn image (a write overlapped) is read again, a few times; a slot that
 * moved or was reused sends the pull by message, through the home.
 */
#define OPS_RD_POOL 64
#define OPS_RD_TRIES 16
#define OPS_RD_BATCH 16 /* pulls of more keys go by message */

struct ferry_rd {
	struct ferry_rdma_ctx ctx; /* FERRY_RDMA_CTX_READ */
	struct ferry_rd_pool *pool;
	uint64_t ticket;
	uint64_t key;
	uint32_t idx, owner, slot, epoch16, tries;
	uint8_t *buf;
};

struct ferry_rd_pool {
	struct ferry_worker *w;
	struct ferry_table *t;
	struct ferry_tp_mr *mr;
	uint8_t *mem;
	size_t stride;
	pthread_mutex_t lock; /* free list: worker takes, completions give back */
	uint32_t nfree;
	uint32_t inflight;
	uint32_t free[OPS_RD_POOL];
	struct ferry_rd rd[OPS_RD_POOL];
};

static struct ferry_rd_pool *ops_rd_pool(struct ferry_worker *w, struct ferry_table *t)
{
	struct ferry_tp *tp = w->fy->tp;
	struct ferry_rd_pool *p = w->rd_pools[t->id];
	size_t bytes;

	if (p && p->t == t)
		return p;
	if (p)
		return NULL; /* an old table's pool still has reads in flight */
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->w = w;
	p->t = t;
	p->stride = t->arena.stride;
	bytes = p->stride * OPS_RD_POOL;
	p->mr = calloc(1, tp->ops->mr_size);
	if (!p->mr || posix_memalign((void **)&p->mem, 64, bytes)) {
		free(p->mr);
		free(p);
		return NULL;
	}
	if (tp->ops->mem_reg(tp, p->mem, bytes, 0, p->mr)) {
		ferry_warn("ops: cannot register %zu bytes for one-sided reads; pulls go by "
			   "message",
			   bytes);
		free(p->mem);
		free(p->mr);
		free(p);
		return NULL;
	}
	pthread_mutex_init(&p->lock, NULL);
	for (uint32_t i = 0; i < OPS_RD_POOL; i++) {
		p->rd[i].ctx.kind = FERRY_RDMA_CTX_READ;
		p->rd[i].pool = p;
		p->rd[i].buf = p->mem + i * p->stride;
		p->free[i] = i;
	}
	p->nfree = OPS_RD_POOL;
	w->rd_pools[t->id] = p;
	return p;
}

static void ops_rd_put(struct ferry_rd *rd)
{
	struct ferry_rd_pool *p = rd->pool;

	pthread_mutex_lock(&p->lock);
	p->free[p->nfree++] = (uint32_t)(rd - p->rd);
	p->inflight--;
	pthread_mutex_unlock(&p->lock);
}

static int ops_rd_post(struct ferry *fy, struct ferry_rd *rd)
{
	struct ferry_rd_pool *p = rd->pool;
	const struct ferry_msg_arena *ar = &p->t->peer_arena[rd->owner];

	atomic_fetch_add_explicit(&fy->onesided_reads, 1, memory_order_relaxed);
	return fy->tp->ops->read(fy->tp, rd->owner, rd->buf, p->mr,
				 ar->addr + (uint64_t)rd->slot * p->stride, ar->rkey, p->stride,
				 rd);
}

/* a landing area for key @i of @r when its slot is known; posted later */
static struct ferry_rd *ops_rd_prepare(struct ferry_worker *w, struct ferry_req *r, uint64_t ticket,
				       size_t i)
{
	struct ferry *fy = w->fy;
	struct ferry_table *t = r->t;
	uint32_t owner, slot, epoch16;
	struct ferry_rd_pool *p;
	struct ferry_rd *rd;

	if (!ferry__loc_slot(t, r->keys[i], &owner, &slot, &epoch16) || owner == fy->rank ||
	    owner >= fy->world || slot >= t->arena.capacity ||
	    atomic_load_explicit(&fy->failed[owner], memory_order_relaxed))
		return NULL;
	p = ops_rd_pool(w, t);
	if (!p)
		return NULL;
	pthread_mutex_lock(&p->lock);
	if (!p->nfree) {
		pthread_mutex_unlock(&p->lock);
		return NULL;
	}
	rd = &p->rd[p->free[--p->nfree]];
	p->inflight++;
	pthread_mutex_unlock(&p->lock);
	rd->ticket = ticket;
	rd->key = r->keys[i];
	rd->idx = (uint32_t)i;
	rd->owner = owner;
	rd->slot = slot;
	rd->epoch16 = epoch16;
	rd->tries = 0;
	return rd;
}

void ferry__ops_on_rdma_done(struct ferry *fy, void *ctx, int status)
{
	struct ferry_rd *rd = ctx;
	struct ferry_rd_pool *p;
	struct ferry_table *t;
	const struct ferry_slot *img;
	struct ferry_msg_op tmpl;
	struct ferry_msg_key k;

	if (((struct ferry_rdma_ctx *)ctx)->kind == FERRY_RDMA_CTX_WRITE) {
		ferry__reloc_on_write_done(fy, ctx, status);
		return;
	}
	p = rd->pool;
	t = p->t;
	img = (const void *)rd->buf;
	tmpl = (struct ferry_msg_op){
		.origin = fy->rank, .worker = p->w->id, .req = rd->ticket, .op = FERRY_OP_PULL
	};
	k = (struct ferry_msg_key){ .key = rd->key,
				    .idx = rd->idx,
				    .len = ferry__value_len(t, rd->key) };
	if (!status) {
		uint64_t head = img->version;
		uint64_t tail = *(const uint64_t *)(rd->buf + p->stride - sizeof(uint64_t));

		if ((head & 1) || head != tail) {
			/* a write overlapped the read: read again */
			if (rd->tries++ < OPS_RD_TRIES && !ops_rd_post(fy, rd)) {
				atomic_fetch_add_explicit(&fy->onesided_retries, 1,
							  memory_order_relaxed);
				return;
			}
		} else if (img->key == rd->key && img->state == FERRY_SLOT_LIVE &&
			   (img->epoch & 0xffff) == rd->epoch16 && img->len == k.len) {
			ferry__ops_complete(fy, p->w->id, rd->ticket, &rd->idx, 1, 0, img->val,
					    k.len);
			ops_rd_put(rd);
			return;
		} else {
			/* moved away or reused: the home knows where it went */
			ferry__loc_set(t, rd->key, ferry__home(t, rd->key));
		}
	}
	atomic_fetch_add_explicit(&fy->onesided_fallbacks, 1, memory_order_relaxed);
	{
		struct ops_out o = { .used = 0 };
		uint32_t dst = ferry__loc_get(t, rd->key);

		ops_out_add(&o, &tmpl, dst < fy->world ? dst : ferry__home(t, rd->key), &k, NULL);
		ops_out_flush(fy, t, &o);
	}
	ops_rd_put(rd);
}

/* the transport refused a read: the fallback sends it by message */
static void ops_rd_refused(struct ferry *fy, struct ferry_rd *rd)
{
	urcu_memb_read_lock();
	ferry__ops_on_rdma_done(fy, rd, -EIO);
	urcu_memb_read_unlock();
}

/*
 * Post a request's reads: with read_v, grouped by owner, so the reads to one
 * owner leave under one doorbell with one signaled completion.
 */
static void ops_rd_post_all(struct ferry *fy, struct ferry_rd **reads, size_t n)
{
	struct ferry_tp_rd rds[OPS_RD_POOL];

	if (!fy->tp->ops->read_v || n < 2) {
		for (size_t i = 0; i < n; i++)
			if (ops_rd_post(fy, reads[i]))
				ops_rd_refused(fy, reads[i]);
		return;
	}
	/* insertion sort by owner: n is at most OPS_RD_POOL */
	for (size_t i = 1; i < n; i++) {
		struct ferry_rd *x = reads[i];
		size_t j = i;

		for (; j && reads[j - 1]->owner > x->owner; j--)
			reads[j] = reads[j - 1];
		reads[j] = x;
	}
	for (size_t i = 0; i < n; i++) {
		struct ferry_rd *rd = reads[i];
		struct ferry_rd_pool *p = rd->pool;
		const struct ferry_msg_arena *ar = &p->t->peer_arena[rd->owner];

		rds[i] = (struct ferry_tp_rd){
			.dst = rd->owner,
			.local = rd->buf,
			.lmr = p->mr,
			.raddr = ar->addr + (uint64_t)rd->slot * p->stride,
			.rkey = ar->rkey,
			.len = p->stride,
			.ctx = rd,
		};
	}
	atomic_fetch_add_explicit(&fy->onesided_reads, n, memory_order_relaxed);
	if (!fy->tp->ops->read_v(fy->tp, rds, n))
		return;
	for (size_t i = 0; i < n; i++)
		if (rds[i].status)
			ops_rd_refused(fy, reads[i]);
}

static int64_t ops_now_ns(void);

void ferry__ops_rd_fini(struct ferry_worker *w)
{
	for (int i = 0; i < FERRY_MAX_TABLES; i++) {
		struct ferry_rd_pool *p = w->rd_pools[i];

		if (!p)
			continue;
		/* reads of a timed-out or abandoned pull: give them a moment to land */
		for (int64_t until = ops_now_ns() + 100000000;
		     __atomic_load_n(&p->inflight, __ATOMIC_ACQUIRE) && ops_now_ns() < until;)
			if (!ferry__node_poll(w->fy, 0))
				sched_yield();
		if (__atomic_load_n(&p->inflight, __ATOMIC_ACQUIRE)) {
			/* a timed-out read may still land here: keep the memory */
			ferry_warn("worker %u: %u one-sided reads still in flight; their landing "
				   "area is kept",
				   w->id, p->inflight);
			continue;
		}
		if (w->fy->tp && w->fy->tp->ops->mem_dereg)
			w->fy->tp->ops->mem_dereg(w->fy->tp, p->mr);
		pthread_mutex_destroy(&p->lock);
		free(p->mem);
		free(p->mr);
		free(p);
	}
}

/* ---- requests (worker thread) ------------------------------------------ */

/* forget the in-flight marks of a request's remote keys */
static void ops_untrack(struct ferry_worker *w, struct ferry_req *r)
{
	const uint8_t *remote = r->done + (r->n + 7) / 8;

	if (!r->tracked)
		return;
	for (size_t i = 0; i < r->n; i++)
		if (remote[i / 8] & (1u << (i % 8)))
			inflight_del(w, r->keys[i]);
	r->tracked = false;
}

static void ops_req_free(struct ferry_worker *w, struct ferry_req *r)
{
	uint32_t idx = (uint32_t)r->ticket;

	ops_untrack(w, r);
	pthread_mutex_lock(&w->lock);
	r->ticket = 0;
	pthread_mutex_unlock(&w->lock);
	free(r->done);
	r->done = NULL;
	w->free_idx[w->nfree++] = idx;
}

static int ops_check(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		     const void *vals, int need_vals, const char *what)
{
	if (!w || !t) {
		ferry_err("%s: NULL worker or table", what);
		return -EINVAL;
	}
	if (atomic_load_explicit(&w->fy->closed, memory_order_relaxed))
		return -FERRY_E_CLOSED;
	if (t->fy != w->fy) {
		ferry_err("%s: the table belongs to another node than the worker", what);
		return -EINVAL;
	}
	if (n && (!keys || (need_vals && !vals))) {
		ferry_err("%s: NULL %s buffer for %zu keys", what, keys ? "value" : "key", n);
		return -EINVAL;
	}
	if (n > (1u << 26)) {
		ferry_err("%s: %zu keys in one call; the limit is 2^26", what, n);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		if (keys[i] >= t->params.num_keys) {
			ferry_err("%s: key %llu is out of range (table %u has %llu keys)", what,
				  (unsigned long long)keys[i], t->id,
				  (unsigned long long)t->params.num_keys);
			return -ERANGE;
		}
	return 0;
}

/* send the keys of @r that are not done yet, one frame per destination */
static void ops_send_remote(struct ferry_worker *w, struct ferry_req *r, uint64_t ticket)
{
	struct ferry *fy = w->fy;
	struct ferry_table *t = r->t;
	struct ferry_msg_op tmpl = {
		.origin = fy->rank, .worker = w->id, .req = ticket, .op = r->op
	};
	struct ops_out one = { .used = 0 }, *outs = &one;
	struct ferry_rd *reads[OPS_RD_POOL];
	/* small pulls go one-sided; a big batch is one message per owner, one
	 * round trip for all, where N reads cost N (until doorbell batching) */
	bool onesided = r->op == FERRY_OP_PULL && r->n <= OPS_RD_BATCH && ferry__table_onesided(t);
	uint32_t first_dst = UINT32_MAX;
	size_t off = 0, nremote = 0, nreads = 0;

	for (size_t i = 0; i < r->n; i++) {
		uint64_t key = r->keys[i];
		uint32_t len = ferry__value_len(t, key);
		struct ferry_msg_key k = { .key = key, .idx = (uint32_t)i, .len = len };
		uint32_t dst;
		const float *in = r->op == FERRY_OP_PULL ? NULL : r->in + off;

		off += len;
		if (r->done[i / 8] & (1u << (i % 8)))
			continue;
		if (onesided && nreads < OPS_RD_POOL &&
		    (reads[nreads] = ops_rd_prepare(w, r, ticket, i))) {
			nreads++;
			nremote++;
			if (r->tracked && !inflight_add(w, key))
				r->done[(r->n + 7) / 8 + i / 8] |= (uint8_t)(1u << (i % 8));
			continue;
		}
		dst = ferry__loc_get(t, key);
		if (dst >= fy->world)
			dst = ferry__home(t, key);
		if (first_dst == UINT32_MAX) {
			first_dst = dst;
		} else if (dst != first_dst && outs == &one) {
			/* more than one destination: one builder per rank */
			outs = calloc(fy->world, sizeof(*outs));
			if (!outs) {
				outs = &one;
				dst = first_dst; /* correct, only slower: it is forwarded */
			} else {
				outs[first_dst] = one;
			}
		}
		ops_out_add(outs == &one ? &one : &outs[dst], &tmpl, dst, &k, in);
		nremote++;
		if (r->tracked && !inflight_add(w, key))
			r->done[(r->n + 7) / 8 + i / 8] |= (uint8_t)(1u << (i % 8));
	}
	ops_count(&w->remote_ops, nremote);
	/* completions may start now: the loop above no longer reads r->done */
	ops_rd_post_all(fy, reads, nreads);
	if (outs == &one) {
		ops_out_flush(fy, t, &one);
		return;
	}
	for (uint32_t d = 0; d < fy->world; d++)
		ops_out_flush(fy, t, &outs[d]);
	free(outs);
}

/* serve local keys in place, send the rest */
static void ops_dispatch(struct ferry_worker *w, struct ferry_req *r)
{
	struct ferry_table *t = r->t;
	uint64_t ticket = r->ticket;
	size_t off = 0, nlocal = 0;
	int all_local = 1;

	r->held = false;
	if (r->op == FERRY_REQ_LOCALIZE) {
		ferry__reloc_start(w, t, r, ticket);
		return;
	}
	if (!t->params.no_local_fast_path) {
		urcu_memb_read_lock();
		for (size_t i = 0; i < r->n; i++) {
			uint64_t key = r->keys[i];
			uint32_t len = ferry__value_len(t, key);
			int rc;

			if (r->done[i / 8] & (1u << (i % 8))) {
				off += len;
				continue;
			}
			rc = ferry__ops_apply(t, r->op, key, r->in ? r->in + off : NULL,
					      r->out ? r->out + off : NULL);
			off += len;
			if (rc) {
				all_local = 0;
				continue;
			}
			r->done[i / 8] |= (uint8_t)(1u << (i % 8));
			nlocal++;
		}
		urcu_memb_read_unlock();
		ops_count(&w->local_ops, nlocal);
		/* nothing remote yet: the progress thread cannot race on r */
		__atomic_store_n(&r->remaining, r->remaining - nlocal, __ATOMIC_RELEASE);
		if (all_local)
			return;
	}
	ops_send_remote(w, r, ticket);
}

/* collect finished tracked requests' keys, then release held ones in order */
static void ops_progress(struct ferry_worker *w)
{
	while (w->held_head) {
		struct ferry_req *r = w->held_head;
		int blocked = 0;

		for (size_t i = 0; i < r->n && !blocked; i++)
			blocked = inflight_has(w, r->keys[i]);
		if (blocked) {
			/* an earlier request still runs: release what has finished */
			int released = 0;

			for (uint32_t i = 0; i < FERRY_MAX_INFLIGHT; i++) {
				struct ferry_req *q = &w->reqs[i];

				if (q->ticket && q->tracked &&
				    !__atomic_load_n(&q->remaining, __ATOMIC_ACQUIRE)) {
					ops_untrack(w, q);
					released = 1;
				}
			}
			if (!released)
				return;
			continue;
		}
		w->held_head = r->next_held;
		if (!w->held_head)
			w->held_tail = NULL;
		ops_dispatch(w, r);
	}
}

static int ops_start(struct ferry_worker *w, struct ferry_table *t, uint8_t op,
		     const uint64_t *keys, size_t n, const float *in, float *out, int async,
		     uint64_t *ticket_p, size_t ndone)
{
	static const char *const names[] = {
		[FERRY_OP_PULL] = "pull", [FERRY_OP_PUSH] = "push", [FERRY_OP_SET] = "set"
	};
	const char *what = op == FERRY_REQ_LOCALIZE ? "localize" : names[op];
	struct ferry_req *r;
	uint32_t idx;
	int rc, hold = 0;

	if (!ndone) {
		rc = ops_check(w, t, keys, n,
			       op == FERRY_OP_PULL ? (const void *)out : (const void *)in,
			       op != FERRY_REQ_LOCALIZE, what);
		if (rc)
			return rc;
	}
	if (!ticket_p && async)
		return -EINVAL;
	if (!w->nfree) {
		ferry_err("%s: worker %u has %d operations in flight, the limit; wait for some",
			  what, w->id, FERRY_MAX_INFLIGHT);
		return -EBUSY;
	}
	idx = w->free_idx[--w->nfree];
	r = &w->reqs[idx];
	memset(r, 0, sizeof(*r));
	/* done bits, then remote bits (keys sent away, for the in-flight set) */
	r->done = calloc(2 * ((n + 7) / 8) + 1, 1);
	if (!r->done) {
		w->free_idx[w->nfree++] = idx;
		return -ENOMEM;
	}
	r->op = op;
	r->t = t;
	r->keys = keys;
	r->n = n;
	r->in = in;
	r->out = out;
	/* the fast path already served the first ndone keys */
	for (size_t i = 0; i < ndone; i++)
		r->done[i / 8] |= (uint8_t)(1u << (i % 8));
	r->remaining = n - ndone;
	if (op == FERRY_REQ_LOCALIZE && t->params.mode == FERRY_MODE_CLASSIC)
		r->remaining = 0; /* static placement: nothing moves */
	if (++w->gen == 0)
		w->gen = 1;
	pthread_mutex_lock(&w->lock);
	r->ticket = (uint64_t)w->gen << 32 | idx;
	pthread_mutex_unlock(&w->lock);

	if (r->remaining) {
		if (w->held_head) {
			hold = 1;
		} else if (w->inflight_n) {
			ops_progress(w);
			for (size_t i = 0; i < n && !hold; i++)
				hold = inflight_has(w, keys[i]);
		}
		/* only asynchronous requests can be overtaken by a later one */
		r->tracked = async && op != FERRY_REQ_LOCALIZE;
		if (hold) {
			r->held = true;
			if (w->held_tail)
				w->held_tail->next_held = r;
			else
				w->held_head = r;
			w->held_tail = r;
		} else {
			ops_dispatch(w, r);
		}
	}
	if (ticket_p)
		*ticket_p = r->ticket;
	return (int)idx;
}

static int64_t ops_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const char *ops_name(uint8_t op)
{
	switch (op) {
	case FERRY_OP_PULL:
		return "pull";
	case FERRY_OP_PUSH:
		return "push";
	case FERRY_OP_SET:
		return "set";
	default:
		return "localize";
	}
}

/* wait for a request; collect it. @block 0: poll once (-EAGAIN) */
static int ops_wait_req(struct ferry_worker *w, struct ferry_req *r, int block)
{
	struct ferry *fy = w->fy;
	/* a one-sided read takes a few µs on hardware and tens under rxe: spin
	 * longer for it, since this thread completes it (ferry__node_poll) */
	int64_t spin = fy->busy_poll ? INT64_MAX / 2 : ferry__table_onesided(r->t) ? 200000 : 50000;
	int64_t deadline = 0, spin_until = 0;
	int rc = 0;

	if (!r->held && !__atomic_load_n(&r->remaining, __ATOMIC_ACQUIRE) && !w->held_head)
		goto collect; /* served in place: no clock needed */

	for (unsigned iter = 0;; iter++) {
		/* take our reads' completions here, not through the progress thread */
		ferry__node_poll(fy, 0);
		if (w->held_head)
			ops_progress(w);
		if (!r->held && !__atomic_load_n(&r->remaining, __ATOMIC_ACQUIRE))
			break;
		if (atomic_load_explicit(&fy->closed, memory_order_relaxed)) {
			rc = -FERRY_E_CLOSED;
			break;
		}
		if (!block)
			return -EAGAIN;
		/*
		 * The clock is read only once the wait has lasted 64 rounds, and
		 * then every 64: a short wait reads it never. (In a VM whose
		 * clock source is an emulated HPET each read is a system call and
		 * a device access, microseconds under emulation.) The deadline
		 * counts from the first read: later by 63 rounds, a few µs.
		 */
		if ((iter & 63) == 63) {
			int64_t now = ops_now_ns();

			if (!deadline) {
				deadline = now + (int64_t)fy->timeout_ms * 1000000;
				spin_until = now + spin;
			}
			if (now >= deadline) {
				rc = -ETIMEDOUT;
				break;
			}
			if (now >= spin_until && !r->held) {
				int64_t until = now + 1000000; /* re-check every ms */
				struct timespec ts;

				/* the progress thread takes our completions while we sleep */
				ferry__node_poll(fy, FERRY_TP_POLL_LAST);

				if (until > deadline)
					until = deadline;
				ts.tv_sec = until / 1000000000;
				ts.tv_nsec = until % 1000000000;
				pthread_mutex_lock(&w->lock);
				w->sleeping = 1;
				if (r->remaining)
					pthread_cond_timedwait(&w->cond, &w->lock, &ts);
				w->sleeping = 0;
				pthread_mutex_unlock(&w->lock);
				continue;
			}
		}
		/* on a machine with few cores the progress threads need the CPU we
		 * would burn: spin briefly, then yield while still polling */
		if (iter < 256)
			__builtin_ia32_pause();
		else
			sched_yield();
	}
	if (rc == -ETIMEDOUT) {
		uint64_t key = 0;

		for (size_t i = 0; i < r->n; i++)
			if (!(r->done[i / 8] & (1u << (i % 8)))) {
				key = r->keys[i];
				break;
			}
		ferry_err("%s of %zu keys on table %u timed out after %d ms; key %llu (home rank "
			  "%u) never answered; check that every node is alive",
			  ops_name(r->op), r->n, r->t->id, fy->timeout_ms, (unsigned long long)key,
			  ferry__home(r->t, key));
		if (r->held) {
			/* take it out of the held queue */
			struct ferry_req **pp = &w->held_head, *prev = NULL;

			while (*pp && *pp != r) {
				prev = *pp;
				pp = &(*pp)->next_held;
			}
			if (*pp)
				*pp = r->next_held;
			if (w->held_tail == r)
				w->held_tail = prev;
		}
	} else if (!rc) {
collect:
		pthread_mutex_lock(&w->lock);
		rc = r->status;
		pthread_mutex_unlock(&w->lock);
	}
	ops_req_free(w, r);
	return rc;
}

/*
 * The fast path of a synchronous operation: serve keys that live here in
 * place, with no request, ticket or allocation, for as long as they do.
 *
 * It takes no RCU read-side section (that cost half of a local pull: two
 * calls into liburcu with a TLS lookup each). It needs none, for the reason
 * a one-sided reader needs none: a slot's memory lives as long as the
 * table's arena, and every access is validated inside the slot. A reader
 * with a stale own[] pointer finds the slot MOVED (the value left), FREE, or
 * holding another key, and goes the slow way; if the slot was reused for the
 * same key, it is that key's live copy. State LIVE is stored after the value
 * when a key arrives, and MOVED under the write lock before it leaves.
 *
 * Return: how many leading keys were served; the caller hands the rest to
 * the request path. Context: the worker's thread.
 */
static size_t ops_fast(struct ferry_worker *w, struct ferry_table *t, uint8_t op,
		       const uint64_t *keys, size_t n, const float *in, float *out)
{
	uint64_t num_keys = t->params.num_keys;
	struct ferry_slot *s;
	size_t i, off = 0;

	if (t->params.no_local_fast_path || w->held_head || w->inflight_n ||
	    (op == FERRY_OP_PULL ? !out : !in))
		return 0;
	for (i = 0; i < n; i++) {
		uint64_t key = keys[i];
		uint32_t len;

		if (key >= num_keys)
			break; /* the request path reports it */
		len = ferry__value_len(t, key);
		s = rcu_dereference(t->dir.own[key]);
		if (!s)
			break;
		if (op == FERRY_OP_PULL) {
			if (ferry__slot_read(s, key, out + off, len))
				break;
		} else if (ferry__slot_update(&t->arena, s, key, in + off, len,
					      op == FERRY_OP_PUSH)) {
			break;
		}
		off += len;
	}
	ops_count(&w->local_ops, i);
	return i;
}

static int ops_sync(struct ferry_worker *w, struct ferry_table *t, uint8_t op, const uint64_t *keys,
		    size_t n, const float *in, float *out)
{
	size_t done;
	int idx;

	done = 0;
	if (op != FERRY_REQ_LOCALIZE && w && t && keys && t->fy == w->fy &&
	    !atomic_load_explicit(&w->fy->closed, memory_order_relaxed))
		done = ops_fast(w, t, op, keys, n, in, out);
	if (done == n)
		return 0;
	if (done) {
		/* check the rest as the request path would have checked all */
		int rc = ops_check(w, t, keys + done, n - done,
				   op == FERRY_OP_PULL ? (const void *)out : (const void *)in, 1,
				   ops_name(op));

		if (rc)
			return rc;
	}
	idx = ops_start(w, t, op, keys, n, in, out, 0, NULL, done);

	if (idx < 0)
		return idx;
	return ops_wait_req(w, &w->reqs[idx], 1);
}

static int ops_async(struct ferry_worker *w, struct ferry_table *t, uint8_t op,
		     const uint64_t *keys, size_t n, const float *in, float *out,
		     uint64_t *ticket_p)
{
	uint64_t ticket;
	int idx;

	if (!ticket_p) {
		ferry_err("%s_start: NULL ticket pointer", ops_name(op));
		return -EINVAL;
	}
	idx = ops_start(w, t, op, keys, n, in, out, 1, &ticket, 0);
	if (idx < 0)
		return idx;
	*ticket_p = ticket;
	return 0;
}

int ferry_pull(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
	       float *vals)
{
	return ops_sync(w, t, FERRY_OP_PULL, keys, n, NULL, vals);
}

int ferry_push(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
	       const float *deltas)
{
	return ops_sync(w, t, FERRY_OP_PUSH, keys, n, deltas, NULL);
}

int ferry_set(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
	      const float *vals)
{
	return ops_sync(w, t, FERRY_OP_SET, keys, n, vals, NULL);
}

int ferry_localize(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n)
{
	return ops_sync(w, t, FERRY_REQ_LOCALIZE, keys, n, NULL, NULL);
}

int ferry_pull_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		     float *vals, uint64_t *ticket_p)
{
	return ops_async(w, t, FERRY_OP_PULL, keys, n, NULL, vals, ticket_p);
}

int ferry_push_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		     const float *deltas, uint64_t *ticket_p)
{
	return ops_async(w, t, FERRY_OP_PUSH, keys, n, deltas, NULL, ticket_p);
}

int ferry_set_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		    const float *vals, uint64_t *ticket_p)
{
	return ops_async(w, t, FERRY_OP_SET, keys, n, vals, NULL, ticket_p);
}

int ferry_localize_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			 size_t n, uint64_t *ticket_p)
{
	return ops_async(w, t, FERRY_REQ_LOCALIZE, keys, n, NULL, NULL, ticket_p);
}

static int ops_ticket(struct ferry_worker *w, uint64_t ticket, int block)
{
	struct ferry_req *r;

	if (!w)
		return -EINVAL;
	r = ops_req_find(w, ticket);
	if (!r) {
		ferry_err("wait: ticket %#llx is unknown to worker %u or already collected",
			  (unsigned long long)ticket, w->id);
		return -ENOENT;
	}
	return ops_wait_req(w, r, block);
}

int ferry_wait(struct ferry_worker *w, uint64_t ticket)
{
	return ops_ticket(w, ticket, 1);
}

int ferry_test(struct ferry_worker *w, uint64_t ticket)
{
	return ops_ticket(w, ticket, 0);
}

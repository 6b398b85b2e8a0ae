/* SPDX-License-Identifier: MIT */
/*
 * onesided.c - one-sided pulls.
 *
 * A pull of a key whose owner and slot the hint names is one READ of the
 * whole slot into a landing area of the worker's. A READ may fetch the
 * slot's bytes in any order, so the image is accepted only when its seal
 * matches its own header and value (ferry__slot_check, lib/store/store.h
 * says why that rejects every mix of before and after a write) and key,
 * epoch and state match; a torn image (a write overlapped) is read again, a
 * few times; a slot that moved or was reused sends the pull by message,
 * through the home.
 *
 * Context: the worker posts; completions run on the progress thread or on
 * the worker inside ferry__node_poll(), rcu_read_lock held.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "lib/ops/internal.h"

static void ops_rd_done(struct ferry *fy, void *ctx, int status);

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
	p->fy = w->fy;
	p->worker = w->id;
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
		p->rd[i].ctx.done = ops_rd_done;
		p->rd[i].pool = p;
		p->rd[i].buf = p->mem + i * p->stride;
		p->free[i] = i;
	}
	p->nfree = OPS_RD_POOL;
	w->rd_pools[t->id] = p;
	return p;
}

static void ops_rd_pool_free(struct ferry_rd_pool *p)
{
	struct ferry_tp *tp = p->fy->tp;

	if (tp && tp->ops->mem_dereg)
		tp->ops->mem_dereg(tp, p->mr);
	pthread_mutex_destroy(&p->lock);
	free(p->mem);
	free(p->mr);
	free(p);
}

/* give a landing area back; the last one of an orphaned pool frees it */
static void ops_rd_put(struct ferry_rd *rd)
{
	struct ferry_rd_pool *p = rd->pool;
	bool last;

	pthread_mutex_lock(&p->lock);
	p->free[p->nfree++] = (uint32_t)(rd - p->rd);
	last = !--p->inflight && p->orphan;
	pthread_mutex_unlock(&p->lock);
	if (last)
		ops_rd_pool_free(p);
}

/* the completion path reads the flag without the pool's lock: it is set once,
 * under the lock, before the worker goes, and a stale "no" is harmless (the
 * pool lives until its last completion either way) */
static bool ops_rd_orphan(struct ferry_rd_pool *p)
{
	return __atomic_load_n(&p->orphan, __ATOMIC_ACQUIRE);
}
static int ops_rd_post(struct ferry *fy, struct ferry_rd *rd)
{
	struct ferry_rd_pool *p = rd->pool;
	const struct ferry_msg_arena *ar = &p->t->peer_arena[rd->owner];

	atomic_fetch_add_explicit(&fy->onesided_reads, 1, memory_order_relaxed);
	return fy->tp->ops->read(fy->tp, rd->owner, rd->buf, p->mr,
				 ar->addr + (uint64_t)rd->slot * p->stride, rd->rkey, p->stride,
				 rd);
}

/* a landing area for key @i of @r when its slot is known; posted later */
struct ferry_rd *ferry__ops_rd_prepare(struct ferry_worker *w, struct ferry_req *r, uint64_t ticket,
				       size_t i)
{
	struct ferry *fy = w->fy;
	struct ferry_table *t = r->t;
	uint32_t owner, slot, epoch16;
	struct ferry_rd_pool *p;
	struct ferry_rd *rd;
	uint64_t rkey;

	if (!ferry__loc_slot(t, r->keys[i], &owner, &slot, &epoch16) || owner == fy->rank ||
	    owner >= fy->world || slot >= t->arena.capacity ||
	    atomic_load_explicit(&fy->failed[owner], memory_order_relaxed) ||
	    !ferry__ops_peer_rkey(t, owner, slot, &rkey))
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
	rd->rkey = rkey;
	rd->epoch16 = epoch16;
	rd->tries = 0;
	return rd;
}

static void ops_rd_done(struct ferry *fy, void *ctx, int status)
{
	struct ferry_rd *rd = ctx;
	struct ferry_rd_pool *p;
	struct ferry_table *t;
	const struct ferry_slot *img;
	struct ferry_msg_op tmpl;
	struct ferry_msg_key k;

	p = rd->pool;
	if (ops_rd_orphan(p)) {
		/* its worker (and maybe its table) is gone: nobody waits for it */
		ops_rd_put(rd);
		return;
	}
	t = p->t;
	img = (const void *)rd->buf;
	tmpl = (struct ferry_msg_op){
		.origin = fy->rank, .worker = p->worker, .req = rd->ticket, .op = FERRY_OP_PULL
	};
	k = (struct ferry_msg_key){ .key = rd->key,
				    .idx = rd->idx,
				    .len = ferry__value_len(t, rd->key) };
	if (!status) {
		/* the READ's bytes may have come in any order: the seal decides */
		int rc = ferry__slot_check(img, img->val, t->arena.max_len,
					   *ferry__slot_seal_p(img, p->stride), FERRY_SLOT_BY_SEAL,
					   rd->key, rd->epoch16, k.len);

		if (rc == -EBUSY) {
			/* a write overlapped the read: read again */
			if (rd->tries++ < OPS_RD_TRIES && !ops_rd_post(fy, rd)) {
				atomic_fetch_add_explicit(&fy->onesided_retries, 1,
							  memory_order_relaxed);
				return;
			}
		} else if (!rc) {
			ferry__ops_complete(fy, p->worker, rd->ticket, &rd->idx, 1, 0, img->val,
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

		ferry__ops_out_add(fy, t, &o, &tmpl,
				   dst < fy->world ? dst : ferry__home(t, rd->key), &k, NULL);
		ferry__ops_out_flush(fy, t, &o);
	}
	ops_rd_put(rd);
}

/* the transport refused a read: the fallback sends it by message */
static void ops_rd_refused(struct ferry *fy, struct ferry_rd *rd)
{
	urcu_memb_read_lock();
	ops_rd_done(fy, rd, -EIO);
	urcu_memb_read_unlock();
}

/*
 * Post a request's reads: with read_v, grouped by owner, so the reads to one
 * owner leave under one doorbell with one signaled completion.
 */
void ferry__ops_rd_post_all(struct ferry *fy, struct ferry_rd **reads, size_t n)
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
			.rkey = rd->rkey,
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

void ferry__ops_rd_fini(struct ferry_worker *w)
{
	for (int i = 0; i < FERRY_MAX_TABLES; i++) {
		struct ferry_rd_pool *p = w->rd_pools[i];

		if (!p)
			continue;
		/* reads of a timed-out or abandoned pull: give them a moment to land */
		for (int64_t until = ferry__ops_now_ns() + 100000000;
		     __atomic_load_n(&p->inflight, __ATOMIC_ACQUIRE) &&
		     ferry__ops_now_ns() < until;)
			if (!ferry__node_poll(w->fy, 0))
				sched_yield();
		pthread_mutex_lock(&p->lock);
		if (p->inflight) {
			/* a late completion may still come (a retry, a shutdown): it
			 * frees the pool, which names the worker by index only */
			__atomic_store_n(&p->orphan, true, __ATOMIC_RELEASE);
			ferry_warn("worker %u: %u one-sided reads still in flight; their landing "
				   "area is freed when the last completes",
				   w->id, p->inflight);
			pthread_mutex_unlock(&p->lock);
			w->rd_pools[i] = NULL;
			continue;
		}
		pthread_mutex_unlock(&p->lock);
		w->rd_pools[i] = NULL;
		ops_rd_pool_free(p);
	}
}

/* SPDX-License-Identifier: MIT */
/*
 * rma.c - one-sided operations: read(), read_v() (a chain of READs per
 * peer, one doorbell), write(), the same on our own memory (served by
 * memcpy against our registrations), and poll(), with which a worker takes
 * its own READ completions.
 *
 * Context: any thread; poll() not on the progress thread nor inside a
 * handler. Completions come back through cq.c (or progress.c's self queue)
 * as on_rdma_done(), once for every call that returned 0.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rdma/rdma.h"

/* an op on our own memory: served by memcpy, completed through the self queue */
static int rdma_self_rw(struct rdma_tp *t, int write, void *local, uint64_t raddr, uint32_t rkey,
			size_t len, void *ctx)
{
	int need = write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	struct rdma_selfmsg *m = calloc(1, sizeof(*m));
	struct rdma_mr *mr;
	void *remote = NULL;

	if (!m)
		return -ENOMEM;
	pthread_mutex_lock(&t->mr_lock);
	for (mr = t->mrs; mr && !remote; mr = mr->next) {
		uintptr_t a = (uintptr_t)mr->base.addr;

		if (mr->mr->rkey == rkey && raddr >= a && raddr - a <= mr->base.len &&
		    len <= mr->base.len - (raddr - a) && (mr->access & need))
			remote = (void *)(uintptr_t)raddr;
	}
	if (remote) {
		if (write)
			memmove(remote, local, len);
		else
			memmove(local, remote, len);
	}
	pthread_mutex_unlock(&t->mr_lock);
	if (!remote) {
		free(m);
		return -EACCES;
	}
	m->done = 1;
	m->ctx = ctx;
	ferry__rdma_self_push(t, m);
	return 0;
}

/* check one read()/write() and make its op; NULL with *@ret_p set when refused */
struct rdma_op *ferry__rdma_op_new(struct rdma_tp *t, int write, uint32_t dst, void *local,
				   struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey,
				   size_t len, void *ctx, int *ret_p)
{
	const struct ferry_tp *tp = &t->base;
	struct rdma_mr *m;
	struct rdma_op *op;

	*ret_p = -EINVAL;
	if (dst >= tp->cfg.world || !lmr || !local || !len || len > t->max_msg ||
	    rkey > UINT32_MAX || !tp->cfg.handler->on_rdma_done)
		return NULL;
	m = to_rdma_mr(lmr);
	if (!m->mr || (uintptr_t)local < (uintptr_t)lmr->addr ||
	    (uintptr_t)local - (uintptr_t)lmr->addr > lmr->len ||
	    len > lmr->len - ((uintptr_t)local - (uintptr_t)lmr->addr))
		return NULL;
	*ret_p = -ENOMEM;
	op = malloc(sizeof(*op));
	if (!op)
		return NULL;
	*op = (struct rdma_op){
		.ctx = ctx,
		.local = local,
		.lkey = m->mr->lkey,
		.rkey = (uint32_t)rkey,
		.raddr = raddr,
		.len = (uint32_t)len,
		.write = write,
	};
	*ret_p = 0;
	return op;
}

/* queue @op behind what the out queue holds; p->lock held */
int ferry__rdma_op_queue(struct rdma_peer *p, struct rdma_op *op)
{
	struct rdma_qent *e = calloc(1, sizeof(*e));

	if (!e)
		return -ENOMEM;
	e->op = op;
	ferry__rdma_q_push(p, e);
	return 0;
}

static int rdma_rw(struct ferry_tp *tp, int write, uint32_t dst, void *local,
		   struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_peer *p;
	struct rdma_op *op;
	int ret, wake = 0;

	if (dst == tp->cfg.rank) {
		/* the same argument checks, without the op */
		op = ferry__rdma_op_new(t, write, dst, local, lmr, raddr, rkey, len, ctx, &ret);
		free(op);
		return ret ? ret : rdma_self_rw(t, write, local, raddr, (uint32_t)rkey, len, ctx);
	}
	op = ferry__rdma_op_new(t, write, dst, local, lmr, raddr, rkey, len, ctx, &ret);
	if (!op)
		return ret;
	if (t->spin_ns && pthread_equal(pthread_self(), t->thread)) {
		/* a handler's op (a hand-over WRITE): the thread spins for it */
		op->spin = 1;
		__atomic_add_fetch(&t->spin_ops, 1, __ATOMIC_RELAXED);
		t->spin_until = rdma_now_ns() + t->spin_ns;
	}
	p = &t->peers[dst];
	pthread_mutex_lock(&p->lock);
	if (p->state != RDMA_PEER_UP) {
		ret = p->state == RDMA_PEER_IDLE ? -ENOTCONN : -FERRY_E_PEER;
	} else if (!p->q_head && rdma_sq_room(t, p)) {
		ret = ferry__rdma_post_op(t, p, op);
		if (ret) {
			ferry__rdma_peer_break(t, p, -ret);
			wake = 1;
			ret = -FERRY_E_PEER;
		}
	} else {
		/* behind queued frames, or the send queue is full: in order, later */
		ret = ferry__rdma_op_queue(p, op);
	}
	pthread_mutex_unlock(&p->lock);
	if (ret && op->spin)
		__atomic_sub_fetch(&t->spin_ops, 1, __ATOMIC_RELAXED);
	if (ret)
		free(op);
	if (wake)
		ferry__rdma_wake(t);
	return ret;
}

/*
 * rdma_post_chain - post @n READs to @p as one chain, one doorbell: only the
 * last is signaled, and its completion completes them all (an RC send queue
 * completes in order; a failed one among them fails the queue pair, and the
 * flushed signaled one then fails the chain)
 *
 * Call with p->lock held, the peer UP and room for @n work requests.
 * Return: 0, or the negative errno of ibv_post_send (nothing posted).
 */
static int rdma_post_chain(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op **ops, size_t n)
{
	struct ibv_sge sge[RDMA_CHAIN_MAX];
	struct ibv_send_wr wr[RDMA_CHAIN_MAX], *bad;
	int ret;

	for (size_t i = 0; i < n; i++) {
		int last = i + 1 == n;

		sge[i] = (struct ibv_sge){
			.addr = (uintptr_t)ops[i]->local,
			.length = ops[i]->len,
			.lkey = ops[i]->lkey,
		};
		wr[i] = (struct ibv_send_wr){
			.wr_id = rdma_wr_id(last ? RDMA_WR_SIG : RDMA_WR_UNSIG, p->rank, p->gen, 0),
			.next = last ? NULL : &wr[i + 1],
			.sg_list = &sge[i],
			.num_sge = 1,
			.opcode = IBV_WR_RDMA_READ,
			.send_flags = last ? IBV_SEND_SIGNALED : 0,
			.wr.rdma = { .remote_addr = ops[i]->raddr, .rkey = ops[i]->rkey },
		};
		ops[i]->next = last ? NULL : ops[i + 1];
	}
	ret = ibv_post_send(p->qp, wr, &bad);
	if (ret) {
		for (size_t i = 0; i < n; i++)
			ops[i]->next = NULL;
		return -ret;
	}
	p->sq_posted += n;
	/* the record names the first op; the chain hangs off it */
	ferry__rdma_sig_push(t, p, ops[0]);
	return 0;
}

/* read_v() for @n reads to one peer; sets each rds[i].status */
static void rdma_read_run(struct rdma_tp *t, struct ferry_tp_rd *rds, size_t n)
{
	struct rdma_op *ops[RDMA_CHAIN_MAX];
	struct ferry_tp_rd *idx[RDMA_CHAIN_MAX];
	uint32_t dst = rds[0].dst;
	struct rdma_peer *p;
	size_t k = 0, i;
	int ret = 0, wake = 0;

	for (i = 0; i < n; i++) {
		struct ferry_tp_rd *d = &rds[i];

		if (dst == t->base.cfg.rank) {
			d->status = rdma_rw(&t->base, 0, dst, d->local, d->lmr, d->raddr, d->rkey,
					    d->len, d->ctx);
			continue;
		}
		ops[k] = ferry__rdma_op_new(t, 0, dst, d->local, d->lmr, d->raddr, d->rkey, d->len,
					    d->ctx, &d->status);
		if (ops[k])
			idx[k++] = d;
	}
	if (!k)
		return;
	p = &t->peers[dst];
	pthread_mutex_lock(&p->lock);
	if (p->state != RDMA_PEER_UP) {
		ret = p->state == RDMA_PEER_IDLE ? -ENOTCONN : -FERRY_E_PEER;
		i = 0;
	} else {
		size_t room = t->sq_depth - (size_t)(p->sq_posted - p->sq_done);
		size_t now = p->q_head ? 0 : k < room ? k : room;

		ret = now ? rdma_post_chain(t, p, ops, now) : 0;
		if (ret) {
			ferry__rdma_peer_break(t, p, -ret);
			wake = 1;
			ret = -FERRY_E_PEER;
			i = 0;
		} else {
			/* what did not fit waits in the out queue, in order */
			for (i = now; i < k; i++)
				if (ferry__rdma_op_queue(p, ops[i]))
					break;
			if (i < k)
				ret = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&p->lock);
	/* ops[i..k) were not posted (i = 0: none was) */
	for (; i < k; i++) {
		idx[i]->status = ret;
		free(ops[i]);
	}
	if (wake)
		ferry__rdma_wake(t);
}

/*
 * ferry__rdma_read_v - post a batch of READs: each run of entries to one
 * destination (at most RDMA_CHAIN_MAX at a time) is one chain of work
 * requests, one ibv_post_send, one signaled completion
 *
 * Context: any thread. Return: 0, or the first entry's error (rds[i].status
 * says which were posted; those complete through on_rdma_done, once).
 */
int ferry__rdma_read_v(struct ferry_tp *tp, struct ferry_tp_rd *rds, size_t n)
{
	struct rdma_tp *t = to_rdma(tp);
	size_t i = 0, j;
	int ret = 0;

	while (i < n) {
		for (j = i + 1; j < n && j - i < RDMA_CHAIN_MAX && rds[j].dst == rds[i].dst; j++)
			;
		if (rds[i].dst >= tp->cfg.world) {
			for (; i < j; i++)
				rds[i].status = -EINVAL;
			continue;
		}
		rdma_read_run(t, rds + i, j - i);
		i = j;
	}
	for (i = 0; i < n && !ret; i++)
		ret = rds[i].status;
	return ret;
}

/*
 * ferry__rdma_poll - handle the send CQ's completions on the calling thread
 *
 * A worker that waits for its READs calls it instead of waiting for the
 * progress thread to take the completion and wake it: a READ's
 * on_rdma_done() runs right here. Another poller (the progress thread, or
 * another worker) busy: returns 0 at once. Context: any thread but the
 * progress thread, not inside a handler, never after fini() began.
 * Return: completions handled.
 */
int ferry__rdma_poll(struct ferry_tp *tp, unsigned flags)
{
	struct rdma_tp *t = to_rdma(tp);
	int total = 0;

	if (pthread_mutex_trylock(&t->cq_lock))
		return 0;
	__atomic_add_fetch(&t->polls, 1, __ATOMIC_RELAXED);
	if (!__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
		total = ferry__rdma_scq_drain(t, 1);
	pthread_mutex_unlock(&t->cq_lock);
	if ((flags & FERRY_TP_POLL_LAST) && __atomic_load_n(&t->scq_off, __ATOMIC_RELAXED)) {
		/* the progress thread must take completions again, now */
		__atomic_store_n(&t->scq_rearm, 1, __ATOMIC_RELEASE);
		ferry__rdma_wake(t);
	}
	return total;
}

/*
 * ferry__rdma_read - post one RDMA READ of @len bytes at @raddr/@rkey of @dst into
 * @local, which lies inside @lmr
 *
 * Context: any thread. Completion: on_rdma_done(@ctx, 0 or a negative errno)
 * on the progress thread, exactly once, unless this returns an error.
 * Return: 0; -EINVAL (bad arguments, or no on_rdma_done handler);
 * -ENOTCONN, -FERRY_E_PEER, -ENOMEM; -EACCES for our own rank when no
 * registration of ours matches @raddr/@rkey.
 */
int ferry__rdma_read(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		     uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	return rdma_rw(tp, 0, dst, local, lmr, raddr, rkey, len, ctx);
}

/* ferry__rdma_write - the same for an RDMA WRITE of @local to @raddr/@rkey of @dst */
int ferry__rdma_write(struct ferry_tp *tp, uint32_t dst, const void *local, struct ferry_tp_mr *lmr,
		      uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	return rdma_rw(tp, 1, dst, (void *)local, lmr, raddr, rkey, len, ctx);
}

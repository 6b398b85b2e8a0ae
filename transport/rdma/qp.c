/* SPDX-License-Identifier: MIT */
/*
 * qp.c - a peer's queue pair and its send side: the out queue, posting
 * chunks, credit-only messages and one-sided ops, flushing the out queue as
 * far as credits, send buffers and send-queue slots allow, giving a
 * connection its queue pair with the receive buffers posted, and failing a
 * peer. The chunk format and the flow control are described in rdma.h.
 *
 * Context: senders (send(), read(), read_v(), write() on any thread, and a
 * worker in poll() flushing after a completion) post under the peer's lock;
 * the progress thread flushes under it too. Only the progress thread fails
 * a peer: a sender whose post fails marks it BROKEN (ferry__rdma_peer_break()) and
 * wakes it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rdma/rdma.h"

/* ---- out queue ---------------------------------------------------------- */

void ferry__rdma_cursor_copy(struct rdma_cursor *c, unsigned char *dst, size_t n)
{
	while (n) {
		const struct iovec *v = &c->iov[c->i];
		size_t take = v->iov_len - c->off;

		if (!take) {
			c->i++;
			c->off = 0;
			continue;
		}
		if (take > n)
			take = n;
		memcpy(dst, (const unsigned char *)v->iov_base + c->off, take);
		dst += take;
		n -= take;
		c->off += take;
	}
}

void ferry__rdma_q_push(struct rdma_peer *p, struct rdma_qent *e)
{
	e->next = NULL;
	if (p->q_tail)
		p->q_tail->next = e;
	else
		p->q_head = e;
	p->q_tail = e;
}

static void rdma_q_pop(struct rdma_peer *p)
{
	p->q_head = p->q_head->next;
	if (!p->q_head)
		p->q_tail = NULL;
}

/*
 * ferry__rdma_q_append - queue the next @n bytes of a frame from @c
 *
 * All or nothing: on -ENOMEM the queue is unchanged. Call with p->lock held.
 */
int ferry__rdma_q_append(struct rdma_peer *p, struct rdma_cursor *c, size_t n)
{
	struct rdma_qent *tail = p->q_tail, *fresh = NULL;
	size_t room = tail && !tail->op ? tail->cap - tail->len : 0, fill;

	if (n > room) {
		size_t cap = n - room < RDMA_QCHUNK ? RDMA_QCHUNK : n - room;

		fresh = malloc(sizeof(*fresh) + cap);
		if (!fresh)
			return -ENOMEM;
		memset(fresh, 0, sizeof(*fresh));
		fresh->cap = cap;
	}
	fill = n < room ? n : room;
	if (fill) {
		ferry__rdma_cursor_copy(c, tail->data + tail->len, fill);
		tail->len += fill;
		n -= fill;
	}
	if (fresh) {
		ferry__rdma_cursor_copy(c, fresh->data, n);
		fresh->len = n;
		ferry__rdma_q_push(p, fresh);
	}
	p->q_bytes += fill + (fresh ? fresh->len : 0);
	return 0;
}

/* ---- posting (call with p->lock held) ------------------------------------ */

void ferry__rdma_sig_push(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op *op)
{
	uint32_t i = (p->sig_head + p->sig_n) % t->sq_depth;

	p->sig[i] = (struct rdma_sig){ .sq_after = p->sq_posted, .s_after = p->s_posted, .op = op };
	p->sig_n++;
}

/*
 * ferry__rdma_post_data - post data chunk @seq of the stream, whose @n bytes
 * are in its send buffer: a new chunk, or one sent again after a lost link
 * (session.c). Its immediate carries its number modulo 128 and the credits
 * owed. Call with p->lock held. Return: 0 or the negative errno of the post.
 */
int ferry__rdma_post_data(struct rdma_tp *t, struct rdma_peer *p, uint64_t seq, size_t n, bool sig)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)rdma_sbuf(p, seq),
		.length = (uint32_t)n,
		.lkey = t->region_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = rdma_wr_id(sig ? RDMA_WR_SIG : RDMA_WR_UNSIG, p->rank, p->gen, 0),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_IMM,
		/* inline: the provider copies the bytes at the post, no fetch later */
		.send_flags = (sig ? IBV_SEND_SIGNALED : 0) |
			      (n <= p->max_inline ? IBV_SEND_INLINE : 0),
		.imm_data = htonl(rdma_imm_data(seq, p->owed)),
	};
	struct ibv_send_wr *bad;
	int ret;

	ret = ibv_post_send(p->qp, &wr, &bad);
	if (ret)
		return -ret;
	p->owed = 0;
	p->imm_owed = 0;
	p->sq_posted++;
	if (sig) {
		uint32_t i = (p->sig_head + p->sig_n) % t->sq_depth;

		p->sig[i] = (struct rdma_sig){ .sq_after = p->sq_posted, .s_after = seq + 1 };
		p->sig_n++;
	}
	return 0;
}

/*
 * post the @n bytes in the next send buffer. When the post fails and lost
 * links are re-established, the chunk still counts as sent: it is kept in
 * its buffer and goes again once the link is back (session.c).
 */
int ferry__rdma_post_chunk(struct rdma_tp *t, struct rdma_peer *p, size_t n)
{
	bool sig = p->s_posted % RDMA_SIGNAL_EVERY == RDMA_SIGNAL_EVERY - 1;
	int ret;

	p->slen[p->s_posted % RDMA_SBUFS] = (uint32_t)n;
	p->sop[p->s_posted % RDMA_SBUFS] = NULL;
	ret = ferry__rdma_post_data(t, p, p->s_posted, n, sig);
	if (ret && !t->reconnect_ms)
		return ret;
	p->credits--;
	p->s_posted++;
	return ret;
}

/* a credit-only message: no data, no credit of its own, always signaled */
int ferry__rdma_post_credit(struct rdma_tp *t, struct rdma_peer *p)
{
	struct ibv_send_wr wr = {
		.wr_id = rdma_wr_id(RDMA_WR_SIG, p->rank, p->gen, 0),
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(RDMA_IMM_TAG << 24 | RDMA_IMM_CREDIT_ONLY | p->owed),
	};
	struct ibv_send_wr *bad;
	int ret;

	ret = ibv_post_send(p->qp, &wr, &bad);
	if (ret)
		return -ret;
	p->owed = 0;
	p->imm_owed = 0;
	p->sq_posted++;
	ferry__rdma_sig_push(t, p, NULL);
	return 0;
}

int ferry__rdma_post_op(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op *op)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)op->local,
		.length = op->len,
		.lkey = op->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = rdma_wr_id(RDMA_WR_SIG, p->rank, p->gen, 0),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op->write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = op->raddr, .rkey = op->rkey },
	};
	struct ibv_send_wr *bad;
	int ret;

	ret = ibv_post_send(p->qp, &wr, &bad);
	if (ret)
		return -ret;
	p->sq_posted++;
	ferry__rdma_sig_push(t, p, op);
	return 0;
}

/*
 * ferry__rdma_flush_locked - post what the out queue holds, as far as credits, send
 * buffers and send-queue slots allow, then return owed credits if they are
 * many and rode on no chunk
 *
 * Call with p->lock held and the peer UP. Return: 0, or the negative errno of
 * a failed post (the caller fails the peer).
 */
/*
 * Back-pressure (transport.h, FERRY_TP_SENDQ_MAX): a sender other than the
 * progress thread waits while the peer's queue is full, until it drained to
 * half, bounded by the node's timeout. Call with p->lock held; returns with
 * it held. Return: 0, -EAGAIN (the peer took nothing in time) or
 * -FERRY_E_PEER (it failed meanwhile).
 */
int ferry__rdma_wait_room(struct rdma_tp *t, struct rdma_peer *p)
{
	struct timespec ts;
	int timeout_ms = ferry__tp_deadline(&t->base, &ts);

	while ((p->state == RDMA_PEER_UP || p->state == RDMA_PEER_LOST) &&
	       p->q_bytes > FERRY_TP_SENDQ_MAX / 2)
		if (pthread_cond_timedwait(&p->q_drained, &p->lock, &ts) == ETIMEDOUT &&
		    p->q_bytes > FERRY_TP_SENDQ_MAX / 2) {
			ferry_err("rdma: rank %u: rank %u has not taken the %zu bytes queued for "
				  "it within %d ms; the send fails with -EAGAIN (a stopped or slow "
				  "peer: check it, or retry later)",
				  t->base.cfg.rank, p->rank, p->q_bytes, timeout_ms);
			return -EAGAIN;
		}
	return p->state == RDMA_PEER_UP || p->state == RDMA_PEER_LOST ? 0 : -FERRY_E_PEER;
}

int ferry__rdma_flush_locked(struct rdma_tp *t, struct rdma_peer *p)
{
	struct rdma_qent *e;
	int ret;

	while ((e = p->q_head)) {
		unsigned char *buf;
		size_t n = 0;

		if (e->op && e->op->imm) {
			/* a chunk of the stream: a credit and a send buffer's number */
			if (!rdma_can_post_data(t, p))
				break;
			ret = ferry__rdma_post_imm(t, p, e->op);
			rdma_q_pop(p);
			free(e);
			if (ret)
				return ret;
			continue;
		}
		if (e->op) {
			if (!rdma_sq_room(t, p))
				break;
			ret = ferry__rdma_post_op(t, p, e->op);
			if (ret)
				return ret;
			rdma_q_pop(p);
			free(e);
			continue;
		}
		if (!rdma_can_post_data(t, p))
			break;
		buf = rdma_sbuf(p, p->s_posted);
		while (n < RDMA_CHUNK && (e = p->q_head) && !e->op) {
			size_t take = e->len - e->off;

			if (take > RDMA_CHUNK - n)
				take = RDMA_CHUNK - n;
			memcpy(buf + n, e->data + e->off, take);
			e->off += take;
			n += take;
			p->q_bytes -= take < p->q_bytes ? take : p->q_bytes;
			if (e->off == e->len) {
				rdma_q_pop(p);
				free(e);
			}
		}
		ret = ferry__rdma_post_chunk(t, p, n);
		if (ret)
			return ret;
		if (p->q_bytes < FERRY_TP_SENDQ_MAX / 2)
			pthread_cond_broadcast(&p->q_drained);
	}
	/*
	 * A writer waits for a write_imm's acknowledgement (its credit), and
	 * may send us nothing else: return the credits of one at once, in a
	 * credit-only message that may carry fewer than RDMA_CREDIT_BATCH
	 * (imm.c has the bound)
	 */
	if ((p->owed >= RDMA_CREDIT_BATCH || (p->owed && p->imm_owed)) && rdma_sq_room(t, p))
		return ferry__rdma_post_credit(t, p);
	return 0;
}

/* ---- receive buffers and queue pairs (progress thread) -------------------- */

int ferry__rdma_post_recv(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(p->rbuf + (size_t)idx * RDMA_CHUNK),
		.length = RDMA_CHUNK,
		.lkey = t->region_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = rdma_wr_id(RDMA_WR_RECV, p->rank, p->gen, idx),
		.sg_list = &sge,
		.num_sge = 1,
	};
	struct ibv_recv_wr *bad;

	return -ibv_post_recv(p->qp, &wr, &bad);
}

/*
 * ferry__rdma_conn_attach - give connection @c a queue pair for rank @r, with @r's
 * receive buffers posted on it
 *
 * A previous attempt that held @r's buffers is destroyed first.
 * Return: 0 or a negative errno (logged); the caller destroys @c.
 */
int ferry__rdma_conn_attach(struct rdma_tp *t, struct rdma_conn *c, uint32_t r)
{
	struct rdma_peer *p = &t->peers[r];
	struct ibv_qp_init_attr qa = {
		.send_cq = t->scq,
		.recv_cq = t->rcq,
		.qp_type = IBV_QPT_RC,
		.cap = {
			.max_send_wr = t->sq_depth,
			.max_recv_wr = RDMA_RECVS,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = t->inline_want,
		},
	};
	int ret, made;

	if (p->conn && p->conn != c)
		ferry__rdma_conn_destroy(t, p->conn);
	c->rank = r;
	made = !RDMA_TIMED(t, r, "rdma_create_qp", rdma_create_qp(c->id, t->pd, &qa));
	if (!made && t->inline_want) {
		/* a device that takes less inline data: none (sends then fetch) */
		ferry_dbg("rdma: rank %u: no queue pair with %u bytes of inline data (%s); "
			  "trying without",
			  t->base.cfg.rank, t->inline_want, strerror(errno));
		qa.cap.max_inline_data = 0;
		made = !RDMA_TIMED(t, r, "rdma_create_qp", rdma_create_qp(c->id, t->pd, &qa));
	}
	if (!made) {
		ret = -errno;
		ferry_err("rdma: rank %u: cannot create a queue pair for rank %u: %s",
			  t->base.cfg.rank, r, strerror(errno));
		return ret;
	}
	pthread_mutex_lock(&p->lock);
	/* what the device granted (rdma_create_qp writes the caps back into qa) */
	p->max_inline = t->inline_want ? qa.cap.max_inline_data : 0;
	p->qp = c->id->qp;
	p->gen++;
	/*
	 * The stream (s_posted, tx_acked, the kept chunks) goes on from the
	 * last queue pair: nothing is sent on this one before the RESUMEs
	 * (session.c), which set the credits.
	 */
	p->credits = 0;
	p->owed = 0;
	p->s_done = p->s_posted;
	p->sq_posted = p->sq_done = 0;
	p->sig_head = p->sig_n = 0;
	p->rsm_sent = p->rsm_got = 0;
	pthread_mutex_unlock(&p->lock);
	p->conn = c;
	p->draining = 0;
	if (!p->ever_up)
		p->asm_have = p->asm_need = 0;
	p->rx_out = 0;
	for (uint32_t i = 0; i < RDMA_RECVS; i++) {
		ret = ferry__rdma_post_recv(t, p, i);
		if (ret) {
			ferry_err("rdma: rank %u: cannot post receive buffers for rank %u: %s",
				  t->base.cfg.rank, r, strerror(-ret));
			return ret;
		}
		p->rx_out++;
	}
	p->rx_ok = 1;
	return 0;
}

/* ---- failures ----------------------------------------------------------- */

/*
 * ferry__rdma_op_done - complete an op and the rest of its read_v() chain
 *
 * @worker: called inside poll() on a worker's thread. A read completes right
 * there; a write's handler belongs to the progress thread (the core's
 * relocation code runs on it), so it is handed over through the self queue.
 */
void ferry__rdma_op_done(struct rdma_tp *t, struct rdma_op *op, int status, int worker)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct rdma_op *next;

	for (; op; op = next) {
		next = op->next;
		if (op->spin)
			__atomic_sub_fetch(&t->spin_ops, 1, __ATOMIC_RELAXED);
		if (worker && op->write) {
			struct rdma_selfmsg *m = calloc(1, sizeof(*m));

			if (m) {
				m->done = 1;
				m->ctx = op->ctx;
				m->status = status;
				ferry__rdma_self_push(t, m);
				free(op);
				continue;
			}
			/* no memory to hand it over: complete it here, late beats never */
		}
		if (h->on_rdma_done)
			h->on_rdma_done(t->base.cfg.core, op->ctx, status);
		free(op);
	}
}

/* free a detached out queue; its ops complete with @status. Progress thread. */
void ferry__rdma_q_cancel(struct rdma_tp *t, struct rdma_qent *e, int status)
{
	struct rdma_qent *next;

	for (; e; e = next) {
		next = e->next;
		if (e->op)
			ferry__rdma_op_done(t, e->op, status, 0);
		free(e);
	}
}

/*
 * ferry__rdma_peer_fail - mark a peer failed and report it, once
 *
 * The caller has logged the cause. Moves the queue pair to the error state
 * (rdma_disconnect: the peer sees DISCONNECTED); posted one-sided ops then
 * complete with -FERRY_E_PEER as they are flushed, queued ones here.
 * Context: progress thread.
 */
void ferry__rdma_peer_fail(struct rdma_tp *t, struct rdma_peer *p, int err)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct rdma_qent *q;

	pthread_mutex_lock(&p->lock);
	p->state = RDMA_PEER_FAILED;
	q = p->q_head;
	p->q_head = p->q_tail = NULL;
	p->q_bytes = 0;
	pthread_cond_broadcast(&p->q_drained);
	ferry__rdma_imm_fail_locked(p, -FERRY_E_PEER);
	pthread_mutex_unlock(&p->lock);
	ferry__rdma_imm_run(t, p);

	p->live = 0;
	p->rx_ok = 0;
	free(p->asm_buf);
	p->asm_buf = NULL;
	p->asm_cap = p->asm_have = p->asm_need = 0;
	if (p->conn && !p->conn->disconnected) {
		p->conn->disconnected = 1;
		RDMA_TIMED(t, p->rank, "rdma_disconnect", rdma_disconnect(p->conn->id));
	}
	if (!p->reported) {
		p->reported = 1;
		if (h->on_peer_failed)
			h->on_peer_failed(t->base.cfg.core, p->rank, err);
	}
	ferry__rdma_q_cancel(t, q, -FERRY_E_PEER);
}

/* Context: progress thread, after a sender flagged fail_pending. */
void ferry__rdma_fail_broken(struct rdma_tp *t)
{
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct rdma_peer *p = &t->peers[r];
		int err;

		pthread_mutex_lock(&p->lock);
		err = p->state == RDMA_PEER_BROKEN ? p->send_err : 0;
		pthread_mutex_unlock(&p->lock);
		if (!err)
			continue;
		if (t->reconnect_ms && !p->reported && err != ENOMEM && err != ECONNABORTED &&
		    err != EACCES) {
			char why[160];

			snprintf(why, sizeof(why), "rank %u: %s to rank %u failed (%s)",
				 t->base.cfg.rank, err == EIO ? "a work request" : "posting", r,
				 strerror(err));
			ferry__rdma_peer_lost(t, p, why);
			continue;
		}
		if (!p->break_logged && err == EACCES)
			ferry_warn(
				"rdma: rank %u: rank %u refused a WRITE with immediate (remote "
				"access error): it names memory rank %u does not offer; it cannot "
				"be posted again, so rank %u is marked failed",
				t->base.cfg.rank, r, r, r);
		else if (!p->break_logged)
			ferry_warn(
				"rdma: rank %u: posting to rank %u failed (%s); marking it failed",
				t->base.cfg.rank, r, strerror(err));
		ferry__rdma_peer_fail(t, p, -FERRY_E_PEER);
	}
}

/*
 * a sender could not post: the progress thread fails the peer, or takes the
 * link for lost (session.c). Call with p->lock held.
 */
void ferry__rdma_peer_break(struct rdma_tp *t, struct rdma_peer *p, int err)
{
	if (p->state != RDMA_PEER_UP && !(p->state == RDMA_PEER_LOST && err == ECONNABORTED))
		return;
	p->state = RDMA_PEER_BROKEN;
	p->send_err = err > 0 ? err : EIO;
	__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
}

/*
 * The core dropped @dst: break the peer as a failed post does, so the
 * progress thread fails it (disconnecting, so the peer sees it) after the
 * completion being handled. The core knows already: no on_peer_failed for
 * it. Progress thread.
 */
void ferry__rdma_drop(struct ferry_tp *tp, uint32_t dst)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_peer *p;

	if (dst >= t->base.cfg.world || dst == t->base.cfg.rank)
		return;
	p = &t->peers[dst];
	pthread_mutex_lock(&p->lock);
	p->reported = 1;
	p->break_logged = 1;
	ferry__rdma_peer_break(t, p, ECONNABORTED);
	pthread_mutex_unlock(&p->lock);
	ferry__rdma_wake(t);
}

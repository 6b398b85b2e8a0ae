/* SPDX-License-Identifier: MIT */
/*
 * imm.c - WRITE with immediate (write_imm, FERRY_TP_CAP_WRITE_IMM; the
 * contract is transport.h's): one IBV_WR_RDMA_WRITE_WITH_IMM that is a
 * chunk of the peer's stream.
 *
 *   writer                                          receiver
 *   write_imm: behind queued frames, a credit and
 *   the next chunk number k (its send buffer's
 *   slot keeps the op: sop[k % 32])
 *   WRITE_WITH_IMM {bytes -> raddr, imm} ----------> the bytes land, then the receive
 *                                                    completion IBV_WC_RECV_RDMA_WITH_IMM
 *                                                    consumes a posted receive: the layout
 *                                                    and number k checked, rx_seq++,
 *                                                    on_write_imm(src, tag), the buffer
 *                                                    reposted, a credit owed
 *   credits summed (tx_acked) pass k <------------- the credit back at once (a credit-only
 *   on_rdma_done(ctx, 0)                             message if no chunk carries it)
 *
 * The immediate (32 bits; a data chunk's is told apart by the opcode):
 *
 *     31        25 24 23                            0
 *     +-----------+--+------------------------------+
 *     | number    |0 | tag (the core's 24 bits)     |   number: k modulo 128
 *     +-----------+--+------------------------------+
 *
 * A peer whose immediate has bit 24 set, or a number other than the next
 * chunk's, or that writes before its RESUME or past its credits, fails with
 * -FERRY_E_PROTO and one log line, as a chunk with a bad header does.
 *
 * Across a lost link (session.c) it is a chunk like the others: the RESUME
 * says whether the peer has it; if not, the same WRITE_WITH_IMM is posted
 * again on the new queue pair, from the caller's memory (the op keeps
 * local, lkey, raddr, rkey, len and tag), so the data always comes with its
 * notice and a WRITE that the lost queue pair placed in part is overwritten.
 * That is why the op completes only when acknowledged (a credit, or a
 * RESUME that covers it), never on the writer's work completion, and why
 * the caller's buffer is held until then. A failed peer or fini completes
 * every op not acknowledged with -FERRY_E_PEER / -FERRY_E_CLOSED.
 *
 * One that the peer's NIC refuses (a remote access error: memory it does
 * not offer, or no longer) fails the peer for good instead of losing the
 * link: posted again on the next queue pair it would be refused again, and
 * the session would reconnect without end (cq.c, rdma_send_done; its wr_id
 * carries RDMA_WR_IDX_IMM).
 *
 * Bound: what is kept is the op (struct rdma_op, 80 bytes) in its send
 * buffer's slot, at most RDMA_CREDITS per peer; more wait in the out queue
 * as one entry each (the caller bounds how many it posts: a collective, its
 * segments). A receiver returns the credit of a write_imm at once, even
 * alone (the writer may send it nothing else): such credit-only messages
 * can number up to RDMA_CREDITS in flight instead of RDMA_CREDITS /
 * RDMA_CREDIT_BATCH, more than the RDMA_RECV_EXTRA spare receives; one that
 * finds no receive is retried by the sender's NIC (rnr_retry 7: without
 * end) until the progress thread reposted one, a delay and not a loss.
 *
 * Context: ferry__rdma_write_imm on any thread; the rest as rdma.h says.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>

#include "transport/rdma/rdma.h"

#define RDMA_WIMM_SEQ_SHIFT 25
#define RDMA_WIMM_RESERVED (1u << 24)

_Static_assert(FERRY_TP_IMM_TAG_BITS == 24, "the tag fills the immediate's low 24 bits");

/* post the WRITE_WITH_IMM of chunk @seq, whose op is in its slot; p->lock held */
int ferry__rdma_post_imm_wr(struct rdma_tp *t, struct rdma_peer *p, uint64_t seq, bool sig)
{
	const struct rdma_op *op = p->sop[seq % RDMA_SBUFS];
	struct ibv_sge sge = {
		.addr = (uintptr_t)op->local,
		.length = op->len,
		.lkey = op->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = rdma_wr_id(sig ? RDMA_WR_SIG : RDMA_WR_UNSIG, p->rank, p->gen,
				    RDMA_WR_IDX_IMM),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = sig ? IBV_SEND_SIGNALED : 0,
		.imm_data =
			htonl((uint32_t)(seq & RDMA_IMM_SEQ_MASK) << RDMA_WIMM_SEQ_SHIFT | op->tag),
		.wr.rdma = { .remote_addr = op->raddr, .rkey = op->rkey },
	};
	struct ibv_send_wr *bad;
	int ret;

	ret = ibv_post_send(p->qp, &wr, &bad);
	if (ret)
		return -ret;
	p->sq_posted++;
	if (sig) {
		uint32_t i = (p->sig_head + p->sig_n) % t->sq_depth;

		/* retires the send buffers before it; the op completes on its ack */
		p->sig[i] = (struct rdma_sig){ .sq_after = p->sq_posted, .s_after = seq + 1 };
		p->sig_n++;
	}
	return 0;
}

/*
 * post @op as the next chunk of the stream. Like a data chunk it counts as
 * sent even when the post fails: it is kept in its slot, and goes again once
 * the link is back, or completes with the peer's failure. p->lock held, the
 * caller checked rdma_can_post_data(). Return: 0 or the post's error.
 */
int ferry__rdma_post_imm(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op *op)
{
	bool sig = p->s_posted % RDMA_SIGNAL_EVERY == RDMA_SIGNAL_EVERY - 1;
	uint64_t seq = p->s_posted;
	int ret;

	p->slen[seq % RDMA_SBUFS] = 0;
	p->sop[seq % RDMA_SBUFS] = op;
	ret = ferry__rdma_post_imm_wr(t, p, seq, sig);
	p->credits--;
	p->s_posted++;
	return ret;
}

/*
 * detach the ops of the chunks acknowledged now: from @from, the count
 * acknowledged before, to tx_acked (a slot past it may hold a later
 * chunk's op already); p->lock held
 */
void ferry__rdma_imm_acked_locked(struct rdma_peer *p, uint64_t from)
{
	for (uint64_t k = from; k < p->tx_acked && k < p->s_posted; k++) {
		struct rdma_op *op = p->sop[k % RDMA_SBUFS];

		if (!op)
			continue;
		p->sop[k % RDMA_SBUFS] = NULL;
		op->status = 0;
		op->next = p->imm_done;
		p->imm_done = op;
	}
}

/* detach every op not acknowledged, to complete with @status; p->lock held */
void ferry__rdma_imm_fail_locked(struct rdma_peer *p, int status)
{
	for (uint32_t i = 0; i < RDMA_SBUFS; i++) {
		struct rdma_op *op = p->sop[i];

		if (!op)
			continue;
		p->sop[i] = NULL;
		op->status = status;
		op->next = p->imm_done;
		p->imm_done = op;
	}
}

/* run on_rdma_done of the detached ops, without the lock. Progress thread. */
void ferry__rdma_imm_run(struct rdma_tp *t, struct rdma_peer *p)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct rdma_op *op, *rev = NULL;

	pthread_mutex_lock(&p->lock);
	op = p->imm_done;
	p->imm_done = NULL;
	pthread_mutex_unlock(&p->lock);
	/* detached newest first: complete in the order posted */
	while (op) {
		struct rdma_op *next = op->next;

		op->next = rev;
		rev = op;
		op = next;
	}
	for (op = rev; op;) {
		struct rdma_op *next = op->next;

		h->on_rdma_done(t->base.cfg.core, op->ctx, op->status);
		free(op);
		op = next;
	}
}

int ferry__rdma_write_imm(struct ferry_tp *tp, uint32_t dst, const void *local,
			  struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey, size_t len,
			  uint32_t tag, void *ctx)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_peer *p;
	struct rdma_op *op;
	int ret, wake = 0;

	/* a chunk of a peer's stream: there is no stream to ourselves */
	if (dst == tp->cfg.rank || tag > FERRY_TP_IMM_TAG_MASK || !tp->cfg.handler->on_rdma_done)
		return -EINVAL;
	op = ferry__rdma_op_new(t, 1, dst, (void *)local, lmr, raddr, rkey, len, ctx, &ret);
	if (!op)
		return ret;
	op->imm = 1;
	op->tag = tag;
	p = &t->peers[dst];
	pthread_mutex_lock(&p->lock);
	if (p->state == RDMA_PEER_IDLE) {
		ret = -ENOTCONN;
	} else if (p->state != RDMA_PEER_UP && p->state != RDMA_PEER_LOST &&
		   !(p->state == RDMA_PEER_BROKEN && t->reconnect_ms && !p->reported)) {
		/* failed; a broken link that will be redialed queues, as send() does */
		ret = -FERRY_E_PEER;
	} else if (p->state == RDMA_PEER_UP && !p->q_head && rdma_can_post_data(t, p)) {
		ret = ferry__rdma_post_imm(t, p, op);
		if (ret) {
			/* kept: it goes again on the next link, or fails with the peer */
			ferry__rdma_peer_break(t, p, -ret);
			wake = 1;
			ret = 0;
		}
	} else {
		/* behind queued frames, out of credits, or the link is lost: in order, later */
		ret = ferry__rdma_op_queue(p, op);
	}
	pthread_mutex_unlock(&p->lock);
	if (ret)
		free(op);
	if (wake)
		ferry__rdma_wake(t);
	return ret;
}

/*
 * ferry__rdma_rx_imm - a WRITE_WITH_IMM from @p landed; it took receive
 * buffer @idx (no bytes in it). Checked like a data chunk, counted in the
 * stream, handed to on_write_imm, its buffer reposted and a credit owed.
 * Progress thread.
 */
void ferry__rdma_rx_imm(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx,
			const struct ibv_wc *wc)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	uint32_t imm = ntohl(wc->imm_data);
	const char *why = NULL;

	if (!(wc->wc_flags & IBV_WC_WITH_IMM))
		why = "a WRITE with immediate carries no immediate";
	else if (imm & RDMA_WIMM_RESERVED)
		why = "a WRITE with immediate's reserved bit is set";
	else if ((imm >> RDMA_WIMM_SEQ_SHIFT) != (p->rx_seq & RDMA_IMM_SEQ_MASK))
		why = "a WRITE with immediate's number is not the next one (a chunk lost or "
		      "repeated)";
	else if (!h->on_write_imm)
		why = "a WRITE with immediate, which this node's core does not take";
	pthread_mutex_lock(&p->lock);
	if (!why && !p->rsm_got)
		why = "it wrote with immediate before its RESUME";
	else if (!why && p->owed >= RDMA_CREDITS)
		why = "it sent more chunks than it had credits";
	pthread_mutex_unlock(&p->lock);
	if (why) {
		ferry__rdma_bad_chunk(t, p, why);
		return;
	}
	h->on_write_imm(t->base.cfg.core, p->rank, imm & FERRY_TP_IMM_TAG_MASK);
	p->rx_seq++;
	pthread_mutex_lock(&p->lock);
	p->imm_owed = 1;
	pthread_mutex_unlock(&p->lock);
	ferry__rdma_rx_repost(t, p, idx, false);
}

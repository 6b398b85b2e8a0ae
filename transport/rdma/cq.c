/* SPDX-License-Identifier: MIT */
/*
 * cq.c - completions: the receive path (a chunk's immediate header checked,
 * its credits taken, its frames handed to on_msg() in place or reassembled
 * across chunks, its buffer reposted and a credit owed), send-queue
 * completions (each signaled one retires the sig ring's oldest record and
 * completes its one-sided ops), flushing the peers they touched, and arming
 * the CQs. The chunk format and the flow control are described in rdma.h.
 *
 * Context: the progress thread. ferry__rdma_scq_drain() also runs on a worker
 * inside poll() (rma.c); cq_lock, which both take, keeps send completions
 * in the order polled.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rdma/rdma.h"

void ferry__rdma_bad_chunk(struct rdma_tp *t, struct rdma_peer *p, const char *why)
{
	ferry_warn("rdma: rank %u sent rank %u a chunk with a bad header (%s); dropping its "
		   "connection and marking it failed",
		   p->rank, t->base.cfg.rank, why);
	ferry__rdma_peer_fail(t, p, -FERRY_E_PROTO);
}

/* ---- receiving (progress thread) ----------------------------------------- */

static int rdma_asm_reserve(struct rdma_peer *p, size_t need)
{
	unsigned char *buf;
	size_t cap;

	if (p->asm_cap >= need)
		return 0;
	cap = need < RDMA_ASM_MIN ? RDMA_ASM_MIN : need;
	buf = realloc(p->asm_buf, cap);
	if (!buf)
		return -ENOMEM;
	p->asm_buf = buf;
	p->asm_cap = cap;
	return 0;
}

/* check a frame header from @p; Return: its length, or 0 after failing the peer */
static uint32_t rdma_rx_hdr(struct rdma_tp *t, struct rdma_peer *p, const void *at)
{
	struct ferry_msg_hdr hdr;
	const char *why = "invalid header";

	memcpy(&hdr, at, sizeof(hdr));
	if (ferry__proto_check_hdr(&hdr, t->base.cfg.world, &why)) {
		ferry_warn("rdma: rank %u sent rank %u a frame with a bad header (%s); dropping "
			   "its connection and marking it failed",
			   p->rank, t->base.cfg.rank, why);
		ferry__rdma_peer_fail(t, p, -FERRY_E_PROTO);
		return 0;
	}
	if (hdr.src != p->rank) {
		ferry_warn("rdma: rank %u sent rank %u a frame that claims to come from rank %u; "
			   "dropping its connection and marking it failed",
			   p->rank, t->base.cfg.rank, hdr.src);
		ferry__rdma_peer_fail(t, p, -FERRY_E_PROTO);
		return 0;
	}
	return hdr.len;
}

static int rdma_rx_nomem(struct rdma_tp *t, struct rdma_peer *p, size_t len)
{
	ferry_err("rdma: rank %u: no memory for a %zu-byte frame from rank %u; dropping its "
		  "connection",
		  t->base.cfg.rank, len, p->rank);
	ferry__rdma_peer_fail(t, p, -ENOMEM);
	return -1;
}

/*
 * rdma_rx_stream - deliver the frames in @n bytes of @p's stream at @d
 *
 * Frames inside the chunk go to on_msg() in place; a frame that spans chunks
 * is gathered in asm_buf first. Return: 0, or -1 when the peer failed.
 */
static int rdma_rx_stream(struct rdma_tp *t, struct rdma_peer *p, const unsigned char *d, size_t n)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	void *core = t->base.cfg.core;

	while (n) {
		size_t take;

		if (!p->asm_have && n >= RDMA_HDR_LEN) {
			uint32_t len = rdma_rx_hdr(t, p, d);

			if (!len)
				return -1;
			if (len <= n) {
				/* d is 8-byte aligned: buffers are, and so is every frame length */
				if (((const struct ferry_msg_hdr *)d)->type == FERRY_MSG_BYE)
					p->bye =
						1; /* the transport's own: the core never sees it */
				else
					h->on_msg(core, p->rank, d, len);
				d += len;
				n -= len;
				continue;
			}
			if (rdma_asm_reserve(p, len))
				return rdma_rx_nomem(t, p, len);
			memcpy(p->asm_buf, d, n);
			p->asm_have = n;
			p->asm_need = len;
			return 0;
		}
		if (p->asm_have < RDMA_HDR_LEN) {
			/* a header cut by the end of a chunk */
			if (rdma_asm_reserve(p, RDMA_ASM_MIN))
				return rdma_rx_nomem(t, p, RDMA_ASM_MIN);
			take = RDMA_HDR_LEN - p->asm_have;
			if (take > n)
				take = n;
			memcpy(p->asm_buf + p->asm_have, d, take);
			p->asm_have += take;
			d += take;
			n -= take;
			if (p->asm_have < RDMA_HDR_LEN)
				return 0;
			p->asm_need = rdma_rx_hdr(t, p, p->asm_buf);
			if (!p->asm_need)
				return -1;
			if (rdma_asm_reserve(p, p->asm_need))
				return rdma_rx_nomem(t, p, p->asm_need);
		}
		take = p->asm_need - p->asm_have;
		if (take > n)
			take = n;
		memcpy(p->asm_buf + p->asm_have, d, take);
		p->asm_have += take;
		d += take;
		n -= take;
		if (p->asm_have == p->asm_need) {
			size_t len = p->asm_need;

			p->asm_have = p->asm_need = 0;
			if (((const struct ferry_msg_hdr *)p->asm_buf)->type == FERRY_MSG_BYE)
				p->bye = 1;
			else
				h->on_msg(core, p->rank, p->asm_buf, len);
			if (p->asm_cap > RDMA_ASM_KEEP) {
				free(p->asm_buf);
				p->asm_buf = NULL;
				p->asm_cap = 0;
			}
		}
	}
	return 0;
}

void ferry__rdma_mark_dirty(struct rdma_tp *t, struct rdma_peer *p)
{
	if (!p->dirty) {
		p->dirty = 1;
		t->dirty[t->ndirty++] = p->rank;
	}
}

/*
 * one chunk arrived in receive buffer @idx of @p. While the link is lost
 * (the old queue pair drains) its frames are still delivered, but the
 * buffer is not reposted and no credit owed: a new queue pair starts afresh.
 */
static void rdma_rx_chunk(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx,
			  const struct ibv_wc *wc)
{
	const char *why = NULL;
	uint32_t imm = 0, credits = 0, len = wc->byte_len, seq = 0;
	bool credit_only = false, resume = false;

	if (!(wc->wc_flags & IBV_WC_WITH_IMM)) {
		why = "it carries no immediate header";
	} else {
		imm = ntohl(wc->imm_data);
		credits = imm & 0xffff;
		credit_only = imm & RDMA_IMM_CREDIT_ONLY;
		resume = credit_only && (imm & RDMA_IMM_RESUME);
		seq = imm >> RDMA_IMM_SEQ_SHIFT & RDMA_IMM_SEQ_MASK;
		if (imm >> 24 != RDMA_IMM_TAG ||
		    (credit_only && (imm & 0x7f0000 & ~RDMA_IMM_RESUME)))
			why = "its immediate header is not ours";
		else if (credit_only && len)
			why = "a credit-only chunk carries data";
		else if (!credit_only && !len)
			why = "a data chunk is empty";
		else if (len % FERRY_MSG_ALIGN)
			why = "its length is not a multiple of 8";
		else if (!credit_only && seq != (p->rx_seq & RDMA_IMM_SEQ_MASK))
			why = "its number is not the next one (a chunk lost or repeated)";
	}
	if (!why && resume) {
		if (ferry__rdma_resume_got(t, p, credits, &why) < 0)
			return; /* the peer failed or was lost */
		if (!why)
			goto repost;
	}
	pthread_mutex_lock(&p->lock);
	if (!why && !p->rsm_got)
		why = "it sent a chunk before its RESUME";
	else if (!why && p->credits + credits > RDMA_CREDITS)
		why = "it returns more credits than it was given";
	else if (!why && !credit_only && p->owed >= RDMA_CREDITS)
		why = "it sent more chunks than it had credits";
	if (!why) {
		p->credits += credits;
		p->tx_acked += credits; /* a credit comes back only for a delivered chunk */
		ferry__rdma_imm_acked_locked(p, p->tx_acked - credits);
	}
	pthread_mutex_unlock(&p->lock);
	ferry__rdma_imm_run(t, p);
	if (why) {
		ferry__rdma_bad_chunk(t, p, why);
		return;
	}
	if (credits)
		ferry__rdma_mark_dirty(t, p);
	if (!credit_only) {
		if (rdma_rx_stream(t, p, p->rbuf + (size_t)idx * RDMA_CHUNK, len))
			return;
		p->rx_seq++;
	}
repost:
	ferry__rdma_rx_repost(t, p, idx, credit_only);
}

void ferry__rdma_rx_repost(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx, bool credit_only)
{
	int ret;

	if (p->draining)
		return; /* the old queue pair of a lost link */
	ret = ferry__rdma_post_recv(t, p, idx);
	if (ret) {
		char msg[160];

		snprintf(msg, sizeof(msg),
			 "rank %u: reposting a receive buffer for rank %u failed (%s)",
			 t->base.cfg.rank, p->rank, strerror(-ret));
		ferry__rdma_peer_lost(t, p, msg);
		return;
	}
	p->rx_out++;
	if (!credit_only) {
		pthread_mutex_lock(&p->lock);
		p->owed++;
		pthread_mutex_unlock(&p->lock);
		ferry__rdma_mark_dirty(t, p);
	}
}

static struct rdma_peer *rdma_wc_peer(struct rdma_tp *t, uint64_t wr_id)
{
	uint32_t rank = (uint32_t)(wr_id >> 32);
	struct rdma_peer *p;

	if (rank >= t->base.cfg.world || rank == t->base.cfg.rank)
		return NULL;
	p = &t->peers[rank];
	/* a completion of an earlier queue pair of this peer */
	if ((uint8_t)(wr_id >> 8) != p->gen)
		return NULL;
	return p;
}

static void rdma_recv_done(struct rdma_tp *t, const struct ibv_wc *wc)
{
	struct rdma_peer *p = rdma_wc_peer(t, wc->wr_id);

	/*
	 * Not only once live: an accepted peer may send as soon as its own
	 * ESTABLISHED came, before ours is read; its HELLO passed already.
	 */
	if (!p || !p->rx_ok)
		return;
	if (p->rx_out)
		p->rx_out--;
	if (wc->status != IBV_WC_SUCCESS && !p->live)
		return; /* an attempt that fails before it stood (the cm events tell), or
			 * the flushed receives of a lost link's queue pair */
	if (wc->status == IBV_WC_WR_FLUSH_ERR) {
		/* the queue pair went to the error state for a cause seen elsewhere, if at all */
		char why[160];

		snprintf(why, sizeof(why),
			 "rank %u: the queue pair to rank %u went to the error state (its "
			 "receives were flushed)",
			 t->base.cfg.rank, p->rank);
		ferry__rdma_peer_lost(t, p, why);
		return;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		char why[160];

		snprintf(why, sizeof(why), "rank %u: a receive from rank %u failed (%s)",
			 t->base.cfg.rank, p->rank, ibv_wc_status_str(wc->status));
		ferry__rdma_peer_lost(t, p, why);
		return;
	}
	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
		ferry__rdma_rx_imm(t, p, (uint32_t)(wc->wr_id >> 16) & 0xffff, wc);
		return;
	}
	if (wc->opcode != IBV_WC_RECV) {
		ferry_warn("rdma: rank %u sent rank %u a chunk with a bad header (opcode %d, not a "
			   "send); dropping its connection and marking it failed",
			   p->rank, t->base.cfg.rank, wc->opcode);
		ferry__rdma_peer_fail(t, p, -FERRY_E_PROTO);
		return;
	}
	rdma_rx_chunk(t, p, (uint32_t)(wc->wr_id >> 16) & 0xffff, wc);
}

/* ---- send completions ---------------------------------------------------- */

static int rdma_wc_errno(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_REM_ACCESS_ERR:
		return -EACCES;
	case IBV_WC_LOC_PROT_ERR:
	case IBV_WC_LOC_ACCESS_ERR:
		return -EFAULT;
	case IBV_WC_WR_FLUSH_ERR:
		return -FERRY_E_PEER;
	default:
		return -EIO;
	}
}

/*
 * rdma_send_done - account one send-queue completion and complete its ops
 *
 * @worker: polled by a worker in poll(), not by the progress thread. Then the
 * peer's progress-thread state (live, the dirty list) is not touched: the
 * out queue is flushed here, under the peer's lock as senders do, and a
 * failure breaks the peer for the progress thread to fail. Call with
 * t->cq_lock held.
 */
static void rdma_send_done(struct rdma_tp *t, const struct ibv_wc *wc, int worker)
{
	uint32_t rank = (uint32_t)(wc->wr_id >> 32);
	struct rdma_sig rec = { 0 };
	const char *what = "a send";
	struct rdma_peer *p;
	int ret = 0, report = 0;
	/* a WRITE with immediate into memory the peer does not offer: posted
	 * again after a reconnection it would fail again, without end (imm.c) */
	bool imm_refused = (wc->wr_id >> 16 & 0xffff) == RDMA_WR_IDX_IMM &&
			   wc->status == IBV_WC_REM_ACCESS_ERR;

	if (rank >= t->base.cfg.world || rank == t->base.cfg.rank)
		return;
	p = &t->peers[rank];
	pthread_mutex_lock(&p->lock);
	if ((uint8_t)(wc->wr_id >> 8) != p->gen) {
		/* a completion of an earlier queue pair of this peer */
		pthread_mutex_unlock(&p->lock);
		return;
	}
	if ((wc->wr_id & 0xff) == RDMA_WR_SIG && p->sig_n) {
		rec = p->sig[p->sig_head];
		p->sig_head = (p->sig_head + 1) % t->sq_depth;
		p->sig_n--;
		if (wc->status == IBV_WC_SUCCESS) {
			p->sq_done = rec.sq_after;
			if (rec.s_after > p->s_done)
				p->s_done = rec.s_after;
		}
	}
	if (worker && p->state == RDMA_PEER_UP) {
		if (imm_refused) {
			/* the progress thread fails it (EACCES: not a lost link) */
			ferry__rdma_peer_break(t, p, EACCES);
		} else if (wc->status != IBV_WC_SUCCESS) {
			/* with reconnection the progress thread logs the lost link */
			report = !t->reconnect_ms;
			p->break_logged = report;
			ferry__rdma_peer_break(t, p, EIO);
		} else if (p->q_head || p->owed >= RDMA_CREDIT_BATCH || (p->owed && p->imm_owed)) {
			ret = ferry__rdma_flush_locked(t, p);
			if (ret)
				ferry__rdma_peer_break(t, p, -ret);
		}
	}
	pthread_mutex_unlock(&p->lock);
	if (rec.op)
		what = rec.op->write ? "an RDMA WRITE" : "an RDMA READ";
	if (report)
		ferry_warn("rdma: rank %u: %s to rank %u failed (%s); marking it failed",
			   t->base.cfg.rank, what, p->rank, ibv_wc_status_str(wc->status));
	ferry__rdma_op_done(t, rec.op, rdma_wc_errno(wc->status), worker);
	if (worker) {
		if (report || ret)
			ferry__rdma_wake(t);
		return;
	}
	if (wc->status == IBV_WC_SUCCESS) {
		if (p->live)
			ferry__rdma_mark_dirty(t, p);
		return;
	}
	if (imm_refused && !p->reported) {
		ferry_warn("rdma: rank %u: rank %u refused a WRITE with immediate (remote access "
			   "error): it names memory rank %u does not offer; it cannot be posted "
			   "again, so rank %u is marked failed",
			   t->base.cfg.rank, p->rank, p->rank, p->rank);
		ferry__rdma_peer_fail(t, p, -FERRY_E_PEER);
		return;
	}
	if (p->live) {
		char why[160];

		snprintf(why, sizeof(why), "rank %u: %s to rank %u failed (%s)", t->base.cfg.rank,
			 what, p->rank, ibv_wc_status_str(wc->status));
		/*
		 * the queue pair is in the error state, whatever the cause (an
		 * access error too: the op has its status); the session goes on
		 * over a new one (session.c)
		 */
		ferry__rdma_peer_lost(t, p, why);
	}
}

/* flush the peers that completions or credits touched */
void ferry__rdma_flush_dirty(struct rdma_tp *t)
{
	for (uint32_t i = 0; i < t->ndirty; i++) {
		struct rdma_peer *p = &t->peers[t->dirty[i]];
		int ret = 0;

		p->dirty = 0;
		if (!p->live)
			continue;
		pthread_mutex_lock(&p->lock);
		if (p->state == RDMA_PEER_UP)
			ret = ferry__rdma_flush_locked(t, p);
		pthread_mutex_unlock(&p->lock);
		if (ret) {
			char why[160];

			snprintf(why, sizeof(why), "rank %u: posting to rank %u failed (%s)",
				 t->base.cfg.rank, p->rank, strerror(-ret));
			ferry__rdma_peer_lost(t, p, why);
		}
	}
	t->ndirty = 0;
}

/* ---- polling and arming the CQs ------------------------------------------ */

/* poll the send CQ empty; t->cq_lock held. Return: completions seen. */
int ferry__rdma_scq_drain(struct rdma_tp *t, int worker)
{
	struct ibv_wc wc[RDMA_POLL_BATCH];
	int n, total = 0;

	do {
		n = ibv_poll_cq(t->scq, RDMA_POLL_BATCH, wc);
		for (int i = 0; i < n; i++)
			rdma_send_done(t, &wc[i], worker);
		total += n > 0 ? n : 0;
	} while (n == RDMA_POLL_BATCH);
	return total;
}

/*
 * ferry__rdma_poll_cqs - poll both CQs empty
 *
 * The send CQ first: when a send or a one-sided op fails, its queue pair's
 * receives are flushed right after, and the failure should be reported with
 * its cause, not as a flushed receive. (A worker in poll() may have taken
 * some send completions already.) Return: completions seen. Progress
 * thread.
 */
int ferry__rdma_poll_cqs(struct rdma_tp *t)
{
	struct ibv_wc wc[RDMA_POLL_BATCH];
	int n, total, rx = 0;

	pthread_mutex_lock(&t->cq_lock);
	total = ferry__rdma_scq_drain(t, 0);
	pthread_mutex_unlock(&t->cq_lock);
	do {
		n = ibv_poll_cq(t->rcq, RDMA_POLL_BATCH, wc);
		for (int i = 0; i < n; i++)
			rdma_recv_done(t, &wc[i]);
		total += n > 0 ? n : 0;
		rx += n > 0 ? n : 0;
	} while (n == RDMA_POLL_BATCH);
	if (n < 0)
		ferry_err("rdma: rank %u: ibv_poll_cq failed", t->base.cfg.rank);
	if (rx && t->rx_spin_ns) {
		/* a spin under way caught this one: spin longer next time */
		if (t->rx_spin_until) {
			t->rx_spin_cur *= 2;
			if (t->rx_spin_cur > t->rx_spin_ns)
				t->rx_spin_cur = t->rx_spin_ns;
		}
		t->rx_spin_until = rdma_now_ns() + t->rx_spin_cur;
	}
	ferry__rdma_flush_dirty(t);
	return total;
}

/* did a worker poll the send CQ since we last looked? Progress thread. */
static int rdma_workers_poll(struct rdma_tp *t)
{
	uint64_t n = __atomic_load_n(&t->polls, __ATOMIC_RELAXED);
	int active = n != t->polls_seen;

	t->polls_seen = n;
	return active;
}

/*
 * ferry__rdma_cq_input - the completion channel is readable: take one event, ack
 * it, re-arm that CQ, poll both
 *
 * One event per wakeup (level-triggered epoll reports the next), and one
 * re-arm: each is a system call on some providers (rxe). A completion that
 * comes after the poll raises the re-armed CQ's next event; the other CQ's
 * event, if any, is still pending in the channel.
 *
 * While workers poll the send CQ themselves (poll(), waiting for READs) it is
 * not re-armed: an event per READ would wake this thread for nothing, and
 * on a small machine take the CPU the waiting worker and the device need.
 * ferry__rdma_scq_check() re-arms it once RDMA_SCQ_CHECK_MS pass without a poll(),
 * or at once when a worker's last poll() before it sleeps asks for it.
 * Progress thread.
 */
void ferry__rdma_cq_input(struct rdma_tp *t)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	if (!ibv_get_cq_event(t->cc, &cq, &cq_ctx)) {
		ibv_ack_cq_events(cq, 1);
		if (cq == t->scq && rdma_workers_poll(t)) {
			__atomic_store_n(&t->scq_off, 1, __ATOMIC_RELAXED);
			t->scq_check_ms = rdma_now_ms() + RDMA_SCQ_CHECK_MS;
		} else if (t->spin_ns || t->rx_spin_ns) {
			/* armed again when the spin ends (ferry__rdma_cq_arm) */
			*(cq == t->scq ? &t->scq_unarmed : &t->rcq_unarmed) = 1;
		} else {
			ibv_req_notify_cq(cq, 0);
		}
	}
	ferry__rdma_poll_cqs(t);
}

/*
 * ferry__rdma_cq_arm - the spin ended: arm the CQs whose event was taken,
 * then poll once, so that a completion that came before the arm is not left
 * without an event. Return: completions seen (then the caller spins on).
 * Progress thread.
 */
int ferry__rdma_cq_arm(struct rdma_tp *t)
{
	if (!t->scq_unarmed && !t->rcq_unarmed)
		return 0;
	if (t->scq_unarmed)
		ibv_req_notify_cq(t->scq, 0);
	if (t->rcq_unarmed)
		ibv_req_notify_cq(t->rcq, 0);
	t->scq_unarmed = t->rcq_unarmed = 0;
	return ferry__rdma_poll_cqs(t);
}

/* the send CQ is not armed: arm it again once no worker polled for a while */
void ferry__rdma_scq_check(struct rdma_tp *t)
{
	if (!t->scq_off)
		return;
	if (!__atomic_exchange_n(&t->scq_rearm, 0, __ATOMIC_ACQ_REL)) {
		if (rdma_now_ms() < t->scq_check_ms)
			return;
		if (rdma_workers_poll(t)) {
			t->scq_check_ms = rdma_now_ms() + RDMA_SCQ_CHECK_MS;
			return;
		}
	}
	__atomic_store_n(&t->scq_off, 0, __ATOMIC_RELAXED);
	ibv_req_notify_cq(t->scq, 0);
	ferry__rdma_poll_cqs(t); /* what came while it was not armed */
}

/* SPDX-License-Identifier: MIT */
/*
 * session.c - a peer's session: the stream of data chunks outlives the
 * queue pair that carries it. A link lost while both processes live
 * (rdma_cm DISCONNECTED, a flushed queue pair, a failed post) is
 * re-established, and not one frame is lost or delivered twice; the core
 * does not notice (no on_peer_failed, no error from send).
 *
 *     rank j (lower)                                  rank i (higher)
 *     link lost: qp to ERROR, rdma_disconnect         link lost: the same
 *     take the old qp's completions (deliver what     take the old qp's completions;
 *       arrived; no repost) until none is left          once none is left: redial
 *     listener (kept) <-- REQ{HELLO i, incarnation} -- rdma_connect, as at setup
 *     same incarnation? old qp drained? else REJ      (REJ AGAIN: dial again after 10 ms;
 *     new qp on the same PD, rdma_accept ---- REP -->  REJ FAILED or nobody listening:
 *                                                      fail it now)
 *     ESTABLISHED: RESUME{rx_seq} -------------------> checks it, sends again from it
 *                  <------------------- RESUME{rx_seq}  (ESTABLISHED)
 *     sends again the chunks after the peer's count, from the send buffers that
 *     kept them, then the out queue: what was sent meanwhile
 *
 * Numbering and acknowledgement are the chunk stream's (rdma.h, "Messages"):
 * data chunks are numbered for the transport's life, a returned credit
 * acknowledges one delivered chunk, and a send buffer is reused only once
 * the chunk it held was acknowledged, so the chunks kept for sending again
 * are the RDMA_SBUFS send buffers (2 MiB per peer), nothing more. The
 * RESUME, a credit-only message with its own flag, carries the receiver's
 * count modulo 2^16; the sender has at most RDMA_CREDITS chunks
 * unacknowledged, so the count is unambiguous.
 *
 * One-sided operations posted on the lost queue pair complete with the
 * flush (-FERRY_E_PEER, the core falls back to messages); new ones fail
 * with -FERRY_E_PEER until the link is back; queued ones wait. A lost link
 * is failed for good (on_peer_failed) when it stays away past
 * FERRY_RECONNECT_MS (default 1000; 0: no reconnection), when the peer's
 * listener is gone (its process died: the redial is refused by the kernel),
 * when a redial comes from another incarnation (a restarted process), when
 * the peer said BYE, or when the core dropped it (a redial is refused).
 *
 * The lower rank probes (hello.c, ferry__rdma_probe_tick): a lost link to a higher
 * rank that sent no request for rdma_probe_ms() (FERRY_RECONNECT_MS / 4,
 * within 100-250 ms) gets a connection request with our HELLO at its
 * listener, on a queue pair of the probe's own. A live peer refuses it
 * (RDMA_REJ_REDIAL), takes its own link for lost if it still stood, and
 * redials at once; the kernel of a dead one answers that nobody listens
 * (IB_CM_REJ_INVALID_SERVICE_ID), and the peer is failed then, not when the
 * grace ends.
 *
 * A redial (or probe) in flight is bounded (FERRY_RECONNECT_MS / 2 and the
 * probe interval): a REQ, REP or REJ lost on the way is sent again by the
 * kernel's CM only after seconds.
 *
 * FERRY_RDMA_FAULT_BREAK_MS=N (tests only; the log warns when it is set):
 * every N ms the progress thread breaks one established link, in turn, with
 * rdma_disconnect() (both queue pairs go to the error state and drop what
 * they held both ways).
 *
 * Context: the progress thread, but ferry__rdma_session_init() (init()).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "transport/base/session.h"
#include "transport/rdma/rdma.h"

/* read FERRY_RECONNECT_MS and FERRY_RDMA_FAULT_BREAK_MS, draw the incarnation. init(). */
int ferry__rdma_session_init(struct rdma_tp *t)
{
	if (ferry__tp_env_ms("rdma", "FERRY_RECONNECT_MS", RDMA_RECONNECT_MS, &t->reconnect_ms) ||
	    ferry__tp_env_ms("rdma", "FERRY_RDMA_FAULT_BREAK_MS", 0, &t->fault_ms))
		return -EINVAL;
	/* never 0: 0 is "not known yet" */
	t->incarnation = (uint32_t)ferry__tp_incarnation(t) | 1;
	t->fault_rr = t->base.cfg.rank + 1;
	if (t->fault_ms) {
		t->fault_next_ms = rdma_now_ms() + t->fault_ms;
		ferry_warn("rdma: rank %u: a link is broken on purpose every %d ms "
			   "(FERRY_RDMA_FAULT_BREAK_MS, a test setting)",
			   t->base.cfg.rank, t->fault_ms);
	}
	return 0;
}

/*
 * ferry__rdma_peer_drained - is every completion of the lost link's queue
 * pair taken, so that the count of chunks delivered is final?
 *
 * Yes once its receives and signaled requests all completed (flushed), as
 * verbs promise. Some providers (rxe in Linux 6.1) drop the receives of a
 * queue pair moved to the error state without flushing them: a queue pair
 * in the error state places nothing more, so once RDMA_DRAIN_GRACE_MS
 * passed since the move, the CQs are polled a last time and what is still
 * outstanding is written off; one-sided ops still recorded complete with
 * -FERRY_E_PEER here. Progress thread.
 */
bool ferry__rdma_peer_drained(struct rdma_tp *t, struct rdma_peer *p)
{
	struct rdma_op **ops = NULL;
	uint32_t sig_n, n = 0;

	pthread_mutex_lock(&p->lock);
	sig_n = p->sig_n;
	pthread_mutex_unlock(&p->lock);
	if (!p->rx_out && !sig_n)
		return true;
	if (!p->draining || rdma_now_ms() < p->err_ms + RDMA_DRAIN_GRACE_MS)
		return false;
	ferry__rdma_poll_cqs(t);
	if (!p->draining)
		return false; /* failed, or replaced, meanwhile */
	pthread_mutex_lock(&p->lock);
	if (p->sig_n)
		ops = calloc(p->sig_n, sizeof(*ops));
	for (; p->sig_n; p->sig_n--) {
		struct rdma_op *op = p->sig[p->sig_head].op;

		p->sig_head = (p->sig_head + 1) % t->sq_depth;
		if (op && ops)
			ops[n++] = op;
		else if (op)
			free(op); /* no memory to defer the call: a lost completion */
	}
	pthread_mutex_unlock(&p->lock);
	ferry_dbg("rdma: rank %u: the lost queue pair to rank %u left %u receives and %u signaled "
		  "requests unflushed after %d ms; written off",
		  t->base.cfg.rank, p->rank, p->rx_out, sig_n, RDMA_DRAIN_GRACE_MS);
	p->rx_out = 0;
	for (uint32_t i = 0; i < n; i++)
		ferry__rdma_op_done(t, ops[i], -FERRY_E_PEER, 0);
	free(ops);
	return true;
}

/*
 * ferry__rdma_peer_lost - the link to @p is lost (@why: what was seen, for the
 * log): keep the session and wait for a new link, or fail the peer when
 * there will be none (no reconnection, a BYE, shutdown before it was up)
 */
void ferry__rdma_peer_lost(struct rdma_tp *t, struct rdma_peer *p, const char *why)
{
	uint32_t me = t->base.cfg.rank;
	int64_t now = rdma_now_ms();

	if (p->reported || (p->lost && !p->live))
		return; /* failed already, or lost and draining already */
	if (!t->reconnect_ms || p->bye || !p->ever_up) {
		if (p->bye)
			ferry_info("rdma: rank %u left (%s)", p->rank, why);
		else if (__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
			ferry_info("rdma: %s; marking it failed", why);
		else
			ferry_warn("rdma: %s; marking it failed%s", why,
				   t->reconnect_ms ? "" :
						     " (FERRY_RECONNECT_MS=0: no reconnection)");
		ferry__rdma_peer_fail(t, p, -FERRY_E_PEER);
		return;
	}
	/*
	 * The grace counts from the loss, or from the last connection that
	 * stood since (a link broken again while it resumes): a peer whose
	 * process died makes no connection, and is failed in time.
	 */
	if (!p->lost) {
		p->lost = 1;
		p->lost_ms = now;
		p->redials = 0;
		snprintf(p->redial_why, sizeof(p->redial_why), "%s",
			 p->rank < me ? "no dial yet" : "no request came");
		ferry_info("rdma: %s; %s rank %u for up to %d ms", why,
			   p->rank < me ? "redialing" : "waiting for", p->rank, t->reconnect_ms);
	} else {
		p->lost_ms = now;
		ferry_info("rdma: %s while the session resumed; %s rank %u for up to %d ms", why,
			   p->rank < me ? "redialing" : "waiting for", p->rank, t->reconnect_ms);
	}
	pthread_mutex_lock(&p->lock);
	if (p->state != RDMA_PEER_FAILED && p->state != RDMA_PEER_IDLE)
		p->state = RDMA_PEER_LOST;
	pthread_cond_broadcast(&p->q_drained);
	pthread_mutex_unlock(&p->lock);
	p->live = 0;
	p->draining = 1;
	p->err_ms = now;
	if (p->rank < me) {
		t->dials[p->rank].next_ms = now;
		t->dials[p->rank].backoff_ms = RDMA_RETRY_MIN_MS;
	}
	if (p->conn && p->conn->id && p->conn->id->qp) {
		struct ibv_qp_attr qa = { .qp_state = IBV_QPS_ERR };
		int ret;

		/* flush what it holds, whether or not rdma_cm does it for us */
		ret = RDMA_TIMED(t, p->rank, "moving a queue pair to the error state",
				 ibv_modify_qp(p->conn->id->qp, &qa, IBV_QP_STATE));
		if (ret)
			ferry_warn("rdma: rank %u: cannot move the queue pair to rank %u to the "
				   "error state (%s); its completions may never drain",
				   me, p->rank, strerror(ret));
	}
	if (p->conn && !p->conn->disconnected) {
		p->conn->disconnected = 1;
		RDMA_TIMED(t, p->rank, "rdma_disconnect", rdma_disconnect(p->conn->id));
	}
}

/* send again the chunks after the peer's count, then what waits. p->lock held. */
static int rdma_resume_go_locked(struct rdma_tp *t, struct rdma_peer *p, uint64_t *resent_p)
{
	uint64_t from = p->rsm_from, n = p->s_posted - from, acked = p->tx_acked;
	int ret;

	p->tx_acked = from;
	ferry__rdma_imm_acked_locked(p, acked); /* its RESUME covers them: delivered */
	p->s_done = from;
	p->credits = RDMA_CREDITS - (uint32_t)n;
	p->imm_resent = 0;
	for (uint64_t k = from; k < p->s_posted; k++) {
		bool sig = k % RDMA_SIGNAL_EVERY == RDMA_SIGNAL_EVERY - 1 || k + 1 == p->s_posted;

		/* a write_imm goes again whole, from the caller's memory (imm.c) */
		p->imm_resent += p->sop[k % RDMA_SBUFS] != NULL;
		ret = p->sop[k % RDMA_SBUFS] ?
			      ferry__rdma_post_imm_wr(t, p, k, sig) :
			      ferry__rdma_post_data(t, p, k, p->slen[k % RDMA_SBUFS], sig);
		if (ret)
			return ret;
	}
	*resent_p = n;
	p->state = RDMA_PEER_UP;
	ret = ferry__rdma_flush_locked(t, p);
	pthread_cond_broadcast(&p->q_drained);
	return ret;
}

/* after the resumption: log it, or take the link for lost again */
static int rdma_resume_done(struct rdma_tp *t, struct rdma_peer *p, int ret, uint64_t resent)
{
	char why[160];

	ferry__rdma_imm_run(t, p); /* what the RESUME acknowledged */
	if (ret) {
		snprintf(why, sizeof(why), "rank %u: posting to rank %u failed (%s)",
			 t->base.cfg.rank, p->rank, strerror(-ret));
		ferry__rdma_peer_lost(t, p, why);
		return -1;
	}
	ferry__rdma_peer_up(t, p);
	if (p->lost)
		ferry_info("rdma: rank %u: resumed the session with rank %u after %lld ms; "
			   "%llu chunks sent again (%u of them WRITEs with immediate)",
			   t->base.cfg.rank, p->rank, (long long)(rdma_now_ms() - p->lost_ms),
			   (unsigned long long)resent, p->imm_resent);
	p->lost = 0;
	return 0;
}

/*
 * ferry__rdma_resume_post - our RESUME, the first message on a new queue pair:
 * the chunks we delivered, modulo 2^16. When the peer's came already, the
 * stream goes on. Called when the connection is established.
 * Return: 0, or -1 when the link was taken for lost again.
 */
int ferry__rdma_resume_post(struct rdma_tp *t, struct rdma_peer *p)
{
	struct ibv_send_wr wr = {
		.wr_id = rdma_wr_id(RDMA_WR_SIG, p->rank, p->gen, 0),
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(rdma_imm_resume(p->rx_seq)),
	};
	struct ibv_send_wr *bad;
	uint64_t resent = 0;
	int ret;

	pthread_mutex_lock(&p->lock);
	ret = -ibv_post_send(p->qp, &wr, &bad);
	if (!ret) {
		p->sq_posted++;
		ferry__rdma_sig_push(t, p, NULL);
		p->rsm_sent = 1;
		if (p->rsm_got)
			ret = rdma_resume_go_locked(t, p, &resent);
	}
	pthread_mutex_unlock(&p->lock);
	if (!ret && !p->rsm_got)
		return 0;
	return rdma_resume_done(t, p, ret, resent);
}

/*
 * ferry__rdma_resume_got - the peer's RESUME came, with its count @count16 of
 * our chunks it delivered (modulo 2^16)
 *
 * Return: 0 (*@why_p set when the RESUME is bad: the caller fails the peer),
 * or -1 when the link was taken for lost again.
 */
int ferry__rdma_resume_got(struct rdma_tp *t, struct rdma_peer *p, uint32_t count16,
			   const char **why_p)
{
	uint64_t from, resent = 0;
	int ret = 0, go = 0;

	pthread_mutex_lock(&p->lock);
	if (p->rsm_got) {
		*why_p = "it sent a second RESUME on one queue pair";
	} else if (rdma_resume_from(p->tx_acked, p->s_posted, count16, &from)) {
		*why_p = "its RESUME counts chunks that were never sent to it";
	} else {
		p->rsm_from = from;
		p->rsm_got = 1;
		/*
		 * A RESUME read from a lost link's queue pair while it drains (it
		 * came before the loss) resumes nothing: that queue pair is dead.
		 * Resuming on it left the peer neither lost nor live, so it was
		 * never redialed and its grace never ran out: the link stayed
		 * away for good (the VM showed it). The chunks after it on that
		 * queue pair are still delivered; the new one carries its own.
		 */
		go = p->rsm_sent && !p->draining;
		if (go)
			ret = rdma_resume_go_locked(t, p, &resent);
	}
	pthread_mutex_unlock(&p->lock);
	if (!go)
		return 0;
	return rdma_resume_done(t, p, ret, resent);
}

/* break the next established link (FERRY_RDMA_FAULT_BREAK_MS) */
static void rdma_fault_break(struct rdma_tp *t)
{
	uint32_t world = t->base.cfg.world;

	for (uint32_t i = 0; i < world; i++) {
		uint32_t r = (t->fault_rr + i) % world;
		struct rdma_peer *p = &t->peers[r];
		char why[128];

		if (r == t->base.cfg.rank || !p->live || p->lost || p->reported || !p->conn)
			continue;
		t->fault_rr = r + 1;
		snprintf(why, sizeof(why), "rank %u: fault injection broke the link to rank %u",
			 t->base.cfg.rank, r);
		ferry__rdma_peer_lost(t, p, why);
		return;
	}
}

/*
 * a stream that does not move while frames wait for it, or a frame half
 * received, is logged once at debug level with its counters: what a stuck
 * session looks like from here
 */
static void rdma_stall_check(struct rdma_tp *t, struct rdma_peer *p, int64_t now)
{
	uint64_t posted, done, acked, seq;
	uint32_t credits, sig_n;
	size_t queued;
	int state;

	pthread_mutex_lock(&p->lock);
	posted = p->s_posted;
	done = p->s_done;
	acked = p->tx_acked;
	credits = p->credits;
	queued = p->q_bytes;
	sig_n = p->sig_n;
	state = p->state;
	pthread_mutex_unlock(&p->lock);
	seq = posted + p->rx_seq;
	if (seq != p->stall_seq || (!queued && !p->asm_need && posted == acked)) {
		p->stall_seq = seq;
		p->stall_ms = now;
		p->stall_logged = 0;
		return;
	}
	if (p->stall_logged || now - p->stall_ms < RDMA_STALL_MS)
		return;
	p->stall_logged = 1;
	ferry_dbg("rdma: rank %u: the stream with rank %u has not moved for %lld ms: state %d, "
		  "live %d, lost %d, %zu bytes queued, credits %u, chunks posted %llu, completed "
		  "%llu, acknowledged %llu, %u signaled out; received %llu, a frame waits for %zu "
		  "of %zu bytes",
		  t->base.cfg.rank, p->rank, (long long)(now - p->stall_ms), state, p->live,
		  p->lost, queued, credits, (unsigned long long)posted, (unsigned long long)done,
		  (unsigned long long)acked, sig_n, (unsigned long long)p->rx_seq,
		  p->asm_need > p->asm_have ? p->asm_need - p->asm_have : 0, p->asm_need);
}

/*
 * ferry__rdma_session_tick - fail the lost links past FERRY_RECONNECT_MS, and
 * inject faults when asked. Return: when to look again, or -1.
 */
int64_t ferry__rdma_session_tick(struct rdma_tp *t)
{
	int64_t now = rdma_now_ms(), next = -1;

	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct rdma_peer *p = &t->peers[r];
		int64_t due;

		/* (checked whenever the thread turns; it sets no timer of its own) */
		if (r != t->base.cfg.rank && !p->reported && p->ever_up)
			rdma_stall_check(t, p, now);
		if (r == t->base.cfg.rank || !p->lost || p->reported)
			continue;
		if (p->live) {
			/*
			 * a new link stood, but the RESUMEs have not both passed: the
			 * peer's may have been flushed by a loss it saw and we did not
			 * (a disconnect request lost on the way). Take it for lost.
			 */
			int wait = t->reconnect_ms / 4 > RDMA_RESUME_MIN_MS ? t->reconnect_ms / 4 :
									      RDMA_RESUME_MIN_MS;
			char why[128];

			due = p->up_ms + wait;
			if (now >= due) {
				snprintf(why, sizeof(why),
					 "rank %u: the link to rank %u stood but did not resume "
					 "within %d ms",
					 t->base.cfg.rank, r, wait);
				ferry__rdma_peer_lost(t, p, why);
				due = p->lost_ms + t->reconnect_ms;
			}
			if (next < 0 || due < next)
				next = due;
			continue;
		}
		due = p->lost_ms + t->reconnect_ms;
		if (now >= due) {
			uint32_t sig_n;

			pthread_mutex_lock(&p->lock);
			sig_n = p->sig_n;
			pthread_mutex_unlock(&p->lock);
			ferry_warn(
				"rdma: rank %u: the link to rank %u was lost %lld ms ago and did "
				"not come back; marking it failed (FERRY_RECONNECT_MS sets the "
				"grace, now %d ms; its last queue pair: %s, %u receives and %u "
				"signaled requests outstanding; %u %s since the loss, the last: "
				"%s)",
				t->base.cfg.rank, r, (long long)(now - p->lost_ms), t->reconnect_ms,
				!p->conn		     ? "none" :
				p->conn->state == RDMA_CS_UP ? "draining" :
							       ferry__rdma_conn_state_str(p->conn),
				p->rx_out, sig_n, p->redials,
				r < t->base.cfg.rank ? "dials" : "requests from it", p->redial_why);
			p->lost = 0;
			ferry__rdma_peer_fail(t, p, -FERRY_E_PEER);
			continue;
		}
		if (next < 0 || due < next)
			next = due;
	}
	if (t->fault_ms && t->seen_phase == RDMA_PHASE_DONE &&
	    !__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE)) {
		if (now >= t->fault_next_ms) {
			rdma_fault_break(t);
			t->fault_next_ms = now + t->fault_ms;
		}
		if (next < 0 || t->fault_next_ms < next)
			next = t->fault_next_ms;
	}
	return next;
}

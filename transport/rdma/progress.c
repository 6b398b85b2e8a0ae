/* SPDX-License-Identifier: MIT */
/*
 * progress.c - the progress thread: one epoll loop over the completion
 * channel, the cm event channel, the device's async fd and the wake eventfd;
 * the self queue; the device's async events; and, at fini, the drain of the
 * out queues and the completion of what is still pending.
 *
 * Frames to our own rank, and one-sided operations on our own memory, go
 * through the self queue and the wake eventfd; so does the completion of a
 * WRITE that a worker found in poll().
 *
 * In blocking mode the thread polls for the completions it waits for
 * itself: while a one-sided op that a handler posted (a hand-over's WRITE)
 * is in flight, for at most spin_ns after the post, it polls the CQs (and
 * the epoll set, without waiting) instead of sleeping, so the completion
 * costs no event, no re-arm and no wake-up (each a system call on rxe, and
 * a scheduler round trip). A CQ whose event it took stays unarmed until it
 * is about to sleep: then it arms it, polls once more, and sleeps. It does
 * not spin after waking a worker or after a frame: measured in the 2-vCPU
 * guest, a progress thread that spins after any activity takes the CPU the
 * woken worker needs (docs/benchmarks.md). An idle node never spins.
 * FERRY_RDMA_SPIN_US sets the bound (default RDMA_SPIN_US; 0: off, every
 * event re-arms at once). --busy-poll never sleeps at all.
 *
 * Context: the progress thread; ferry__rdma_wake(), ferry__rdma_self_push() and
 * ferry__rdma_self_send() on any thread; ferry__rdma_start_thread() in init().
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "transport/rdma/rdma.h"

#define RDMA_SPIN_US 100  /* the spin after activity (FERRY_RDMA_SPIN_US) */
#define RDMA_RX_SPIN_US 0 /* the adaptive spin after a receive (FERRY_RDMA_RX_SPIN_US) */

/* Context: any thread. Wakes the progress thread out of epoll_wait(). */
void ferry__rdma_wake(struct rdma_tp *t)
{
	uint64_t one = 1;

	/* EAGAIN means the counter is already non-zero: the wake is pending */
	if (write(t->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		ferry_err("rdma: rank %u: cannot wake the progress thread: %s", t->base.cfg.rank,
			  strerror(errno));
}

/* ---- self queue ---------------------------------------------------------- */

void ferry__rdma_self_push(struct rdma_tp *t, struct rdma_selfmsg *m)
{
	int was_empty;

	m->next = NULL;
	pthread_mutex_lock(&t->self_lock);
	was_empty = !t->self_head;
	if (t->self_tail)
		t->self_tail->next = m;
	else
		t->self_head = m;
	t->self_tail = m;
	pthread_mutex_unlock(&t->self_lock);
	/*
	 * a non-empty queue has a wake pending already (see rdma_self_deliver);
	 * the progress thread itself (a handler sending to its own rank, as a
	 * home that is the key's owner does) needs none: its loop delivers the
	 * queue before it waits again, with no eventfd round trip
	 */
	if (was_empty && !pthread_equal(pthread_self(), t->thread))
		ferry__rdma_wake(t);
}

/* Context: any thread. */
int ferry__rdma_self_send(struct rdma_tp *t, const struct iovec *iov, int iovcnt, size_t total)
{
	struct rdma_selfmsg *m = malloc(sizeof(*m) + total);
	struct rdma_cursor c = { .iov = iov, .cnt = iovcnt };

	if (!m)
		return -ENOMEM;
	memset(m, 0, sizeof(*m));
	ferry__rdma_cursor_copy(&c, m->data, total);
	m->len = total;
	ferry__rdma_self_push(t, m);
	return 0;
}

/*
 * Context: progress thread. @deliver 0 at shutdown: frames are dropped.
 * Return: 1 when the queue held something (handlers may have queued more).
 */
static int rdma_self_deliver(struct rdma_tp *t, int deliver)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct rdma_selfmsg *m, *next;

	pthread_mutex_lock(&t->self_lock);
	m = t->self_head;
	t->self_head = t->self_tail = NULL;
	pthread_mutex_unlock(&t->self_lock);
	if (!m)
		return 0;
	for (; m; m = next) {
		next = m->next;
		if (m->done) {
			if (h->on_rdma_done)
				h->on_rdma_done(t->base.cfg.core, m->ctx, m->status);
		} else if (deliver) {
			h->on_msg(t->base.cfg.core, t->base.cfg.rank, m->data, m->len);
		}
		free(m);
	}
	return 1;
}

/* ---- async events -------------------------------------------------------- */

static void rdma_async_input(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank;
	struct ibv_async_event ae;

	while (!ibv_get_async_event(t->ctx, &ae)) {
		enum ibv_event_type type = ae.event_type;
		struct ibv_qp *qp = NULL;
		int all = 0;

		switch (type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
			qp = ae.element.qp;
			break;
		case IBV_EVENT_CQ_ERR:
			all = ae.element.cq == t->scq || ae.element.cq == t->rcq;
			break;
		case IBV_EVENT_DEVICE_FATAL:
			all = 1;
			break;
		case IBV_EVENT_COMM_EST:
			/*
			 * data came on a queue pair whose connection rdma_cm has not
			 * seen stand (the RTU was lost): tell it, so that ESTABLISHED
			 * comes (rdma_notify(3))
			 */
			for (struct rdma_conn *c = t->conns; c; c = c->next)
				if (c->id && c->id->qp == ae.element.qp &&
				    c->state == RDMA_CS_CONNECTING)
					rdma_notify(c->id, IBV_EVENT_COMM_EST);
			break;
		case IBV_EVENT_PORT_ERR:
			ferry_warn("rdma: rank %u: port %u of %s went down", me,
				   ae.element.port_num, t->dev_name);
			break;
		default:
			ferry_dbg("rdma: rank %u: async event %s", me, ibv_event_type_str(type));
			break;
		}
		ibv_ack_async_event(&ae);
		/*
		 * The context is shared by every instance in the process: an event
		 * about a queue pair of another instance is not ours to act on (its
		 * owner sees the same failure in its completions).
		 */
		for (uint32_t r = 0; (qp || all) && r < t->base.cfg.world; r++) {
			struct rdma_peer *p = &t->peers[r];

			char why[128];

			if (!p->live || (!all && p->qp != qp))
				continue;
			snprintf(why, sizeof(why), "rank %u: %s on the queue pair to rank %u", me,
				 ibv_event_type_str(type), r);
			ferry__rdma_peer_lost(t, p, why);
		}
	}
}

/* ---- progress thread ---------------------------------------------------- */

static void rdma_wake_input(struct rdma_tp *t)
{
	uint64_t v;

	if (read(t->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		ferry_dbg("rdma: reading the wake eventfd: %s", strerror(errno));
	rdma_self_deliver(t, 1);
	if (__atomic_exchange_n(&t->fail_pending, 0, __ATOMIC_ACQ_REL))
		ferry__rdma_fail_broken(t);
	ferry__rdma_setup_sync(t);
}

/*
 * rdma_drained - fini: 1 when nothing is queued or in flight to any peer
 *
 * Sends that went unsignaled are only known complete once a later signaled
 * work request completes: a peer whose queue is empty with such a tail gets
 * a signaled credit-only message (no data, no credit of its own). Progress
 * thread.
 */
static int rdma_drained(struct rdma_tp *t)
{
	int busy;

	pthread_mutex_lock(&t->self_lock);
	busy = t->self_head != NULL;
	pthread_mutex_unlock(&t->self_lock);
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct rdma_peer *p = &t->peers[r];

		pthread_mutex_lock(&p->lock);
		if (p->state == RDMA_PEER_UP) {
			if (!p->q_head && !p->sig_n && p->s_done != p->s_posted &&
			    rdma_sq_room(t, p) && ferry__rdma_post_credit(t, p))
				p->s_done = p->s_posted; /* cannot post: the peer is failing */
			busy |= p->q_head || p->sig_n || p->s_done != p->s_posted;
		} else if (p->state == RDMA_PEER_LOST) {
			/* a lost link may come back while we drain: what it holds goes then */
			busy |= p->q_head || p->tx_acked != p->s_posted;
		}
		pthread_mutex_unlock(&p->lock);
	}
	return !busy;
}

/* the thread stops: every op still queued or in flight completes, once */
static void rdma_progress_cancel(struct rdma_tp *t)
{
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct rdma_peer *p = &t->peers[r];
		struct rdma_qent *q;
		struct rdma_op **ops = NULL;
		uint32_t n = 0;

		if (r == t->base.cfg.rank)
			continue;
		pthread_mutex_lock(&p->lock);
		if (p->state == RDMA_PEER_UP || p->state == RDMA_PEER_BROKEN ||
		    p->state == RDMA_PEER_LOST)
			p->state = RDMA_PEER_FAILED;
		q = p->q_head;
		p->q_head = p->q_tail = NULL;
		p->q_bytes = 0;
		pthread_cond_broadcast(&p->q_drained);
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
		ferry__rdma_imm_fail_locked(p, -FERRY_E_CLOSED);
		pthread_mutex_unlock(&p->lock);
		ferry__rdma_imm_run(t, p);
		for (uint32_t i = 0; i < n; i++)
			ferry__rdma_op_done(t, ops[i], -FERRY_E_CLOSED, 0);
		free(ops);
		ferry__rdma_q_cancel(t, q, -FERRY_E_CLOSED);
	}
	rdma_self_deliver(t, 0);
}

/*
 * rdma_progress - the progress thread: every handler runs here, one at a time
 *
 * Runs until fini() sets closing; then flushes the out queues for at most
 * RDMA_DRAIN_MS (still delivering what arrives), completes every one-sided
 * operation still pending with -FERRY_E_CLOSED, and returns.
 */
static void *rdma_progress(void *arg)
{
	struct rdma_tp *t = arg;
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct epoll_event evs[RDMA_EVENTS];
	int busy = t->base.cfg.busy_poll;
	int64_t drain_end = -1;
	int spinning = 0, again = 0;

	if (h->on_thread_start)
		h->on_thread_start(t->base.cfg.core);

	for (;;) {
		int64_t next = ferry__rdma_setup_tick(t), lost = ferry__rdma_session_tick(t), now;
		int timeout = -1, n, did = 0;

		if (lost >= 0 && (next < 0 || lost < next))
			next = lost;
		if (busy || spinning || again) {
			timeout = 0;
		} else if (drain_end >= 0) {
			timeout = 10;
		} else if (next >= 0) {
			now = rdma_now_ms();
			timeout = next > now ? (int)(next - now) : 0;
		}
		if (t->scq_off && !busy) {
			now = rdma_now_ms();
			if (timeout < 0 || now + timeout > t->scq_check_ms)
				timeout = t->scq_check_ms > now ? (int)(t->scq_check_ms - now) : 0;
		}
		n = epoll_wait(t->epfd, evs, RDMA_EVENTS, timeout);
		if (n < 0 && errno != EINTR) {
			ferry_err("rdma: rank %u: epoll_wait: %s; the progress thread stops",
				  t->base.cfg.rank, strerror(errno));
			break;
		}
		for (int i = 0; i < n; i++) {
			static const char *const kinds[] = { "", "wake", "completion", "cm",
							     "async" };
			int64_t t0 = rdma_now_ms(), took;

			switch (evs[i].data.u32) {
			case RDMA_EV_WAKE:
				rdma_wake_input(t);
				break;
			case RDMA_EV_CQ:
				ferry__rdma_cq_input(t);
				break;
			case RDMA_EV_CM:
				ferry__rdma_cm_input(t);
				break;
			case RDMA_EV_ASYNC:
				rdma_async_input(t);
				break;
			}
			/* what keeps the thread from its other work: none should be slow */
			took = rdma_now_ms() - t0;
			if (took >= RDMA_SLOW_TURN_MS && evs[i].data.u32 <= RDMA_EV_ASYNC)
				ferry_dbg("rdma: rank %u: the progress thread spent %lld ms on %s "
					  "events",
					  t->base.cfg.rank, (long long)took,
					  kinds[evs[i].data.u32]);
		}
		/* what this thread sent to itself in the handlers above */
		again = rdma_self_deliver(t, 1);
		did = again;
		ferry__rdma_scq_check(t);
		if (busy || spinning) {
			did |= ferry__rdma_poll_cqs(t);
			if (!did && n <= 0)
				sched_yield();
		}
		if (!busy && (t->spin_ns || t->rx_spin_ns)) {
			int64_t ns = rdma_now_ns();

			spinning = __atomic_load_n(&t->spin_ops, __ATOMIC_RELAXED) > 0 &&
				   ns < t->spin_until;
			if (__atomic_exchange_n(&t->rx_spin_req, 0, __ATOMIC_ACQ_REL) &&
			    !t->rx_spin_until)
				t->rx_spin_until = ns + t->rx_spin_cur;
			if (t->rx_spin_until && ns >= t->rx_spin_until) {
				/* the receive spin ended with nothing: shorter next time */
				t->rx_spin_until = 0;
				t->rx_spin_cur /= 2;
				if (t->rx_spin_cur < RDMA_RX_SPIN_MIN_NS)
					t->rx_spin_cur = RDMA_RX_SPIN_MIN_NS;
			}
			spinning |= t->rx_spin_until != 0;
			/* about to sleep: arm; what the poll after it finds is
			 * handled in the next round, without a wait */
			if (!spinning && ferry__rdma_cq_arm(t))
				again = 1;
		}
		if (!__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
			continue;
		if (drain_end < 0)
			drain_end = rdma_now_ms() + RDMA_DRAIN_MS;
		if (!busy)
			ferry__rdma_poll_cqs(t);
		if (rdma_drained(t))
			break;
		if (rdma_now_ms() >= drain_end) {
			ferry_warn("rdma: rank %u: frames still queued after %d ms of shutdown; "
				   "dropping them",
				   t->base.cfg.rank, RDMA_DRAIN_MS);
			break;
		}
	}

	rdma_progress_cancel(t);
	if (h->on_thread_stop)
		h->on_thread_stop(t->base.cfg.core);
	return NULL;
}

long ferry__rdma_env_int(const char *name, long min, long max, long def)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtol(s, &end, 10);
	if (*end || errno || v < min || v > max) {
		ferry_warn("rdma: %s='%s' is not %ld to %ld; using %ld (unset it or give a number "
			   "in that range)",
			   name, s, min, max, def);
		return def;
	}
	return v;
}

int ferry__rdma_start_thread(struct rdma_tp *t)
{
	sigset_t all, old;
	int ret;

	/* the progress thread takes no process signals */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	t->spin_ns = ferry__rdma_env_int("FERRY_RDMA_SPIN_US", 0, 100000, RDMA_SPIN_US) * 1000;
	t->rx_spin_ns =
		ferry__rdma_env_int("FERRY_RDMA_RX_SPIN_US", 0, 100000, RDMA_RX_SPIN_US) * 1000;
	t->rx_spin_cur = t->rx_spin_ns;
	t->rx_spin_until = 0;
	ret = -pthread_create(&t->thread, NULL, rdma_progress, t);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		ferry_err("rdma: cannot start the progress thread: %s", strerror(-ret));
		return ret;
	}
	pthread_setname_np(t->thread, "ferry-rdma");
	t->thread_started = 1;
	return 0;
}

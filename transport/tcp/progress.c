/* SPDX-License-Identifier: MIT */
/*
 * progress.c - the tcp transport's progress thread: one per transport
 * instance, on its own epoll set. Every handler of the core runs here, one
 * at a time: on_msg() for the frames of the connections and of the self
 * queue, on_peer_failed() for the connections that fail. It also runs the
 * sessions (session.c): the listening socket after connect(), redials,
 * probes and handshakes of lost links, and the timers (ACKs, redials,
 * deadlines), which bound its epoll_wait(). The wake eventfd
 * (in the epoll set with a NULL data pointer) brings it out of epoll_wait()
 * for the self queue, for connections a sender found broken, and for fini().
 *
 * Context: the progress thread, except ferry__tcp_start_thread() (init()'s thread)
 * and ferry__tcp_wake() (any thread).
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"

/* the engine this thread holds (struct tcp_tp's engine), or NULL */
static __thread struct tcp_tp *tcp_engine_of;

static void tcp_engine_lock(struct tcp_tp *t)
{
	pthread_mutex_lock(&t->engine);
	tcp_engine_of = t;
}

static void tcp_engine_unlock(struct tcp_tp *t)
{
	tcp_engine_of = NULL;
	pthread_mutex_unlock(&t->engine);
}

int ferry__tcp_engine_held(const struct tcp_tp *t)
{
	return tcp_engine_of == t;
}

/* Context: any thread. Wakes the progress thread out of epoll_wait(). */
void ferry__tcp_wake(struct tcp_tp *t)
{
	uint64_t one = 1;

	/* EAGAIN means the counter is already non-zero: the wake is pending */
	if (write(t->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		ferry_err("tcp: rank %u: cannot wake the progress thread: %s", t->base.cfg.rank,
			  strerror(errno));
}

static void tcp_wake_input(struct tcp_tp *t)
{
	uint64_t v;

	if (read(t->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		ferry_dbg("tcp: reading the wake eventfd: %s", strerror(errno));
	ferry__tcp_self_deliver(t);
	if (__atomic_exchange_n(&t->fail_pending, 0, __ATOMIC_ACQ_REL))
		ferry__tcp_fail_broken(t);
}

/* fini: 1 when no connection has bytes left to write (a lost link that may
 * come back counts: its frames wait). Progress thread. */
static int tcp_flushed(struct tcp_tp *t)
{
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct tcp_conn *c = &t->conns[r];
		int busy;

		pthread_mutex_lock(&c->lock);
		busy = (c->state == TCP_CONN_UP || c->state == TCP_CONN_DOWN) && c->snd;
		pthread_mutex_unlock(&c->lock);
		if (busy)
			return 0;
	}
	return 1;
}

static void tcp_conn_event(struct tcp_tp *t, struct tcp_conn *c, uint32_t events)
{
	int err;

	if (c->fd < 0)
		return; /* failed earlier in this batch of events */
	if (events & EPOLLOUT) {
		err = ferry__tcp_conn_flush(t, c);
		if (err) {
			char why[128];

			snprintf(why, sizeof(why), "rank %u: sending to rank %u failed (%s)",
				 t->base.cfg.rank, c->rank, strerror(-err));
			ferry__tcp_conn_lost(t, c, why);
			return;
		}
	}
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		ferry__tcp_conn_input(t, c);
}

/* handle @n events of epoll_wait(); the engine held */
static void tcp_events(struct tcp_tp *t, const struct epoll_event *evs, int n)
{
	for (int i = 0; i < n; i++) {
		void *p = evs[i].data.ptr;

		if (!p) {
			tcp_wake_input(t);
			continue;
		}
		switch (*(const int *)p) { /* enum tcp_ev, every target's first member */
		case TCP_EV_CONN:
			tcp_conn_event(t, p, evs[i].events);
			break;
		case TCP_EV_LISTEN:
			ferry__tcp_listen_event(t);
			break;
		case TCP_EV_LINK:
			ferry__tcp_link_event(t, p, evs[i].events);
			break;
		case TCP_EV_ACC:
			ferry__tcp_acc_event(t, p, evs[i].events);
			break;
		}
	}
}

/*
 * ferry__tcp_poll - ops->poll: a worker waiting for a reply takes what the
 * sockets hold and runs its handlers itself, so the reply needs no hand-off
 * from the progress thread (one thread wake-up less per round trip)
 *
 * Only with FERRY_TCP_WORKER_POLL=1, or in a holding spin (@flags has
 * FERRY_TP_POLL_HOLD: a collective's caller, lib/coll/): else it returns 0
 * at once. A holding spin counts itself in t->spinners (FIRST .. LAST), and
 * while it does, and FERRY_TP_POLL_LINGER_MS after, the progress thread
 * sleeps on park_epfd, which holds the wake eventfd alone: the sockets'
 * frames then wake no one but reach the spinner's epoll_wait(0). It takes
 * the engine with a trylock: while the progress thread handles events, or
 * another worker polls, it returns 0 and the caller waits as before. The
 * epoll set is level-triggered, so the progress thread, woken by the same
 * data, finds nothing left and sleeps again. Handlers run here as they run
 * on the progress thread: one at a time, the engine held, rcu_read_lock
 * taken by the core around each, on an RCU-registered thread (a worker's)
 * that holds no lock of the core. A timer armed here (an ACK's, a lost
 * link's) that is earlier than the progress thread's sleep wakes it, and
 * the wake eventfd is left to the progress thread: a poller that read it
 * would take that wake-up away (epoll_wait finds it drained and sleeps on
 * with its old timeout, and the timer never runs). Context: a waiting
 * worker (ferry__node_poll), never inside a handler; not once fini() began.
 * Return: events handled.
 */
int ferry__tcp_poll(struct ferry_tp *tp, unsigned flags)
{
	struct tcp_tp *t = to_tcp(tp);
	struct epoll_event evs[TCP_EVENTS];
	int64_t timer;
	int n;

	if (!t->worker_poll && !(flags & FERRY_TP_POLL_HOLD))
		return 0;
	if (flags & FERRY_TP_POLL_HOLD) {
		if (flags & FERRY_TP_POLL_FIRST) {
			__atomic_add_fetch(&t->spinners, 1, __ATOMIC_ACQ_REL);
		} else if (flags & FERRY_TP_POLL_LAST) {
			/* the progress thread goes back to the sockets within
			 * the linger; no wake-up now, so a caller that spins
			 * again at once finds it still aside */
			__atomic_store_n(&t->park_until,
					 flags & FERRY_TP_POLL_LINGER ?
						 tcp_now_ms() + FERRY_TP_POLL_LINGER_MS :
						 0,
					 __ATOMIC_RELEASE);
			/* the last spinner goes to sleep: the sockets go back
			 * to the progress thread now */
			if (!__atomic_sub_fetch(&t->spinners, 1, __ATOMIC_ACQ_REL) &&
			    !(flags & FERRY_TP_POLL_LINGER))
				ferry__tcp_wake(t);
		}
	}
	if (__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE) || pthread_mutex_trylock(&t->engine))
		return 0;
	tcp_engine_of = t;
	timer = t->timer_ms;
	n = epoll_wait(t->epfd, evs, TCP_EVENTS, 0);
	for (int i = 0; i < n; i++)
		if (!evs[i].data.ptr) /* the wake eventfd: the progress thread's */
			evs[i--] = evs[--n];
	if (n > 0)
		tcp_events(t, evs, n);
	if (t->timer_ms && (!timer || t->timer_ms < timer))
		ferry__tcp_wake(t); /* it computes its sleep from the new timer */
	tcp_engine_unlock(t);
	return n > 0 ? n : 0;
}

/*
 * tcp_progress - the progress thread: every handler runs here, one at a time
 *
 * Runs until fini() sets closing; then flushes the out queues for at most
 * TCP_DRAIN_MS (still delivering what arrives) and returns.
 */
static void *tcp_progress(void *arg)
{
	struct tcp_tp *t = arg;
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct epoll_event evs[TCP_EVENTS];
	int busy = t->base.cfg.busy_poll;
	int64_t drain_end = -1;

	if (h->on_thread_start)
		h->on_thread_start(t->base.cfg.core);
	tcp_engine_lock(t);
	if (t->fault_ms)
		ferry__tcp_timer_at(t, tcp_now_ms() + t->fault_ms);

	for (;;) {
		int timeout = busy ? 0 : (drain_end >= 0 ? 10 : -1);
		int64_t next = t->timer_ms;
		int epfd = t->epfd;
		int n;

		if (next) {
			int64_t now = tcp_now_ms();

			if (now >= next)
				next = ferry__tcp_timers(t, now);
			if (next && timeout != 0) {
				int64_t wait = next > now ? next - now : 0;

				if (timeout < 0 || wait < timeout)
					timeout = (int)wait;
			}
		}
		/*
		 * A worker spins on poll(FERRY_TP_POLL_HOLD) (lib/coll/): stand
		 * aside from the sockets, so the frames it waits for wake no one
		 * (a wake-up here would take the core from it), and watch only
		 * the wake eventfd (self-sends, broken links, timers armed
		 * elsewhere, stop), rechecking every ms; back to the sockets once
		 * no one spun for FERRY_TP_POLL_LINGER_MS
		 */
		if (drain_end < 0 &&
		    (__atomic_load_n(&t->spinners, __ATOMIC_ACQUIRE) > 0 ||
		     tcp_now_ms() < __atomic_load_n(&t->park_until, __ATOMIC_ACQUIRE))) {
			/* it sleeps even with busy_poll: the spinner spins */
			epfd = t->park_epfd;
			if (timeout <= 0 || timeout > FERRY_TP_POLL_LINGER_MS)
				timeout = FERRY_TP_POLL_LINGER_MS;
		}
		tcp_engine_unlock(t);
		n = epoll_wait(epfd, evs, TCP_EVENTS, timeout);
		tcp_engine_lock(t);

		if (n < 0 && errno != EINTR) {
			ferry_err("tcp: rank %u: epoll_wait: %s; the progress thread stops",
				  t->base.cfg.rank, strerror(errno));
			break;
		}
		if (busy && n == 0)
			sched_yield(); /* spin, but let runnable threads have the core */
		if (n > 0)
			tcp_events(t, evs, n);
		if (!__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
			continue;
		if (drain_end < 0)
			drain_end = tcp_now_ms() + TCP_DRAIN_MS;
		if (tcp_flushed(t))
			break;
		if (tcp_now_ms() >= drain_end) {
			ferry_warn("tcp: rank %u: frames still queued after %d ms of shutdown; "
				   "dropping them",
				   t->base.cfg.rank, TCP_DRAIN_MS);
			break;
		}
	}

	tcp_engine_unlock(t);
	if (h->on_thread_stop)
		h->on_thread_stop(t->base.cfg.core);
	return NULL;
}

int ferry__tcp_start_thread(struct tcp_tp *t)
{
	sigset_t all, old;
	int ret;

	/* the progress thread takes no process signals */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = -pthread_create(&t->thread, NULL, tcp_progress, t);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		ferry_err("tcp: cannot start the progress thread: %s", strerror(-ret));
		return ret;
	}
	pthread_setname_np(t->thread, "ferry-tcp");
	return 0;
}

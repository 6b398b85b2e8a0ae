/* SPDX-License-Identifier: MIT */
/*
 * session.c - sessions that outlive a lost link: a connection that breaks
 * (a reset, an EOF without BYE, a socket error) while the peer process is
 * alive is re-established, and its frames resume where the peer stopped
 * delivering, none lost and none twice. Context: the progress thread,
 * except ferry__tcp_session_init() (init()), ferry__tcp_hs_build() and
 * ferry__tcp_resume_parse() (also connect()).
 *
 * A session is the pair's whole life. Each direction numbers its frames
 * 1, 2, ... (all but HELLO, RESUME and ACK) in the order they enter the
 * sender's log (send.c); the stream keeps that order, so the number needs no
 * field: the receiver counts what it delivered (rx_seq) and says it in ACKs
 * (recv.c) and in the RESUME of a handshake.
 *
 *   higher rank i (dials)                          lower rank j (listens)
 *   link lost: DOWN, redial at once                link lost: DOWN, probe i's
 *   (backoff 10 ms doubling to 100 ms)             listener every 50 ms
 *   connect() ---------------------------------->  accept (slot, TCP_HS_MS)
 *   HELLO{cluster, i, world}                       check HELLO; old connection
 *   RESUME{inc_i, delivered from j, sent to j} ->  still UP? it is lost now
 *                                                  check RESUME: inc_i, counts
 *              <----------------------------------  HELLO{cluster, j, world}
 *   check HELLO, RESUME: inc_j, counts              RESUME{inc_j, delivered, sent}
 *   resend from j's delivered + 1                   resend from i's delivered + 1
 *
 * A peer is failed instead (on_peer_failed, once) when it said BYE (a
 * departure), when its listener refuses a connection (nobody listens: its
 * process is gone; a SIGKILLed process's port refuses at once), when it
 * comes back as another process (incarnation) or with counts that do not
 * fit, and when it stays away past FERRY_RECONNECT_MS (default 1000; 0 turns
 * reconnection off: a lost link fails the peer at once, as before).
 *
 * FERRY_TCP_FAULT_RESET_MS=N (tests): every N ms the progress thread breaks
 * one of its established connections, alternately with shutdown() (the peer
 * reads an EOF after what was in flight) and with a reset (SO_LINGER 0: the
 * kernel drops what it still held, both ways).
 */
#define _GNU_SOURCE /* like every file of the transport (tcp.h) */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/base/session.h"
#include "transport/tcp/tcp.h"

/* ---- setup -------------------------------------------------------------- */

int ferry__tcp_session_init(struct tcp_tp *t)
{
	uint64_t inc;

	if (ferry__tp_env_ms("tcp", "FERRY_RECONNECT_MS", TCP_RECONNECT_MS, &t->reconnect_ms) ||
	    ferry__tp_env_ms("tcp", "FERRY_TCP_FAULT_RESET_MS", 0, &t->fault_ms))
		return -EINVAL;
	inc = ferry__tp_incarnation(t);
	t->incarnation = inc; /* never 0: a RESUME of 0 means "any" at setup */
	t->fault_rand = inc * 0x9e3779b97f4a7c15ull + t->base.cfg.rank + 1;
	t->lfd_ev = TCP_EV_LISTEN;
	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++) {
		t->acc[i].ev = TCP_EV_ACC;
		t->acc[i].fd = -1;
	}
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct tcp_conn *c = &t->conns[r];

		c->ev = TCP_EV_CONN;
		c->link.ev = TCP_EV_LINK;
		c->link.c = c;
		c->link.fd = -1;
	}
	if (t->fault_ms)
		ferry_warn("tcp: rank %u breaks one of its connections every %d ms "
			   "(FERRY_TCP_FAULT_RESET_MS, a test setting)",
			   t->base.cfg.rank, t->fault_ms);
	return 0;
}

void ferry__tcp_session_fini(struct tcp_tp *t)
{
	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++)
		if (t->acc[i].fd >= 0) {
			close(t->acc[i].fd);
			t->acc[i].fd = -1;
		}
	for (uint32_t r = 0; t->conns && r < t->base.cfg.world; r++)
		if (t->conns[r].link.fd >= 0) {
			close(t->conns[r].link.fd);
			t->conns[r].link.fd = -1;
		}
}

/* ---- the handshake: HELLO, then RESUME ----------------------------------- */

void ferry__tcp_hs_build(struct tcp_tp *t, struct tcp_conn *c, unsigned char *buf)
{
	const struct ferry_tp_config *cfg = &t->base.cfg;
	struct ferry_msg_hello hello = {
		.cluster_id = cfg->cluster_id,
		.rank = cfg->rank,
		.world = cfg->world,
	};
	struct ferry_msg_resume r = { .incarnation = t->incarnation };
	struct ferry_msg_hdr hdr;

	if (c) {
		r.delivered = c->rx_seq; /* progress thread: ours */
		pthread_mutex_lock(&c->lock);
		r.sent = c->tx_seq;
		pthread_mutex_unlock(&c->lock);
	}
	ferry__proto_hdr_init(&hdr, FERRY_MSG_HELLO, TCP_HELLO_LEN, cfg->rank, 0);
	memcpy(buf, &hdr, sizeof(hdr));
	memcpy(buf + sizeof(hdr), &hello, sizeof(hello));
	ferry__proto_hdr_init(&hdr, FERRY_MSG_RESUME, TCP_RESUME_LEN, cfg->rank, 0);
	memcpy(buf + TCP_HELLO_LEN, &hdr, sizeof(hdr));
	memcpy(buf + TCP_HELLO_LEN + sizeof(hdr), &r, sizeof(r));
}

int ferry__tcp_resume_parse(const struct tcp_tp *t, const unsigned char *frame, uint32_t peer,
			    uint64_t incarnation, struct ferry_msg_resume *r, char *why,
			    size_t wlen)
{
	const char *bad = "invalid header";
	struct ferry_msg_hdr hdr;

	memcpy(&hdr, frame, sizeof(hdr));
	if (ferry__proto_check_hdr(&hdr, t->base.cfg.world, &bad)) {
		snprintf(why, wlen, "its RESUME is not a Ferry frame (%s)", bad);
		return -1;
	}
	if (hdr.type != FERRY_MSG_RESUME || hdr.len != TCP_RESUME_LEN || hdr.src != peer) {
		snprintf(why, wlen,
			 "its HELLO is followed by a frame of type %u and %u bytes from rank %u, "
			 "not its RESUME",
			 hdr.type, hdr.len, hdr.src);
		return -1;
	}
	memcpy(r, frame + sizeof(hdr), sizeof(*r));
	if (!incarnation && (r->delivered || r->sent)) {
		snprintf(why, wlen,
			 "it resumes a session (%llu frames sent) while this node is still "
			 "connecting",
			 (unsigned long long)r->sent);
		return -1;
	}
	if (incarnation && r->incarnation != incarnation) {
		snprintf(why, wlen,
			 "it is another process than the one its session began with (incarnation "
			 "%#llx, was %#llx)",
			 (unsigned long long)r->incarnation, (unsigned long long)incarnation);
		return -1;
	}
	return 0;
}

/* ---- timers --------------------------------------------------------------- */

void ferry__tcp_timer_at(struct tcp_tp *t, int64_t when)
{
	if (!t->timer_ms || when < t->timer_ms)
		t->timer_ms = when;
}

static void session_epoll_del_close(struct tcp_tp *t, int fd)
{
	epoll_ctl(t->epfd, EPOLL_CTL_DEL, fd, NULL);
	close(fd);
}

/* ---- lost links ----------------------------------------------------------- */

/* the higher rank of a pair redials; the lower one waits for it, and probes */
static int session_we_dial(const struct tcp_tp *t, const struct tcp_conn *c)
{
	return t->base.cfg.rank > c->rank;
}

void ferry__tcp_conn_lost(struct tcp_tp *t, struct tcp_conn *c, const char *why)
{
	int64_t now = tcp_now_ms();
	int fd, dropped;

	if (c->reported) {
		ferry__tcp_conn_fail(t, c, -FERRY_E_PEER); /* the core dropped it: close */
		return;
	}
	pthread_mutex_lock(&c->lock);
	dropped = c->state == TCP_CONN_BROKEN && c->send_err == ECONNABORTED;
	if ((c->state != TCP_CONN_UP && c->state != TCP_CONN_BROKEN) || dropped) {
		pthread_mutex_unlock(&c->lock);
		if (dropped)
			ferry__tcp_conn_fail(t, c, -FERRY_E_PEER);
		return;
	}
	fd = c->fd;
	c->fd = -1;
	c->state = TCP_CONN_DOWN;
	c->out_armed = 0;
	c->send_err = 0;
	pthread_mutex_unlock(&c->lock);
	if (fd >= 0)
		session_epoll_del_close(t, fd);
	/* a frame cut short was never delivered: the peer sends it again */
	c->rhead = c->rtail = c->rneed = 0;
	c->ack_due = 0;

	if (!t->reconnect_ms || c->bye) {
		ferry_warn("tcp: %s; marking it failed%s", why,
			   c->bye ? "" : " (FERRY_RECONNECT_MS=0: no reconnection)");
		ferry__tcp_conn_fail(t, c, -FERRY_E_PEER);
		return;
	}
	c->down_since = now;
	c->down_until = now + t->reconnect_ms;
	c->link.next_ms = now;
	c->link.backoff_ms = TCP_RETRY_MIN_MS;
	ferry_info("tcp: %s; %s rank %u for up to %d ms", why,
		   session_we_dial(t, c) ? "redialing" : "waiting for", c->rank, t->reconnect_ms);
	ferry__tcp_timer_at(t, now);
}

/* the session goes on over @fd: resend from the peer's delivered + 1 */
static void session_resume(struct tcp_tp *t, struct tcp_conn *c, int fd,
			   const struct ferry_msg_resume *r)
{
	struct epoll_event ev = { .data.ptr = c };
	uint64_t acked = 0, sent = 0, resent = 0;
	int bad = 0, err = 0;

	if (c->link.fd == fd)
		c->link.fd = -1; /* a redial's connection: ours now, closed only below */
	if (r->sent < c->rx_seq) {
		ferry_warn("tcp: rank %u resumes its session with rank %u having sent %llu frames, "
			   "but %llu of its frames were delivered; marking it failed",
			   c->rank, t->base.cfg.rank, (unsigned long long)r->sent,
			   (unsigned long long)c->rx_seq);
		session_epoll_del_close(t, fd);
		ferry__tcp_conn_fail(t, c, -FERRY_E_PROTO);
		return;
	}
	pthread_mutex_lock(&c->lock);
	acked = c->tx_acked;
	sent = c->tx_seq;
	if (c->state != TCP_CONN_DOWN)
		err = EALREADY; /* cannot be: only this thread resumes */
	else if (r->delivered < acked || r->delivered > sent ||
		 ferry__tcp_log_rewind(c, r->delivered, &resent))
		bad = 1;
	if (!bad && !err) {
		ev.events = EPOLLIN | EPOLLRDHUP | (c->snd ? EPOLLOUT : 0);
		/* the fd is in the epoll set already, as a link's or an accepted one */
		if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, fd, &ev)) {
			err = errno;
		} else {
			c->fd = fd;
			c->state = TCP_CONN_UP;
			c->out_armed = c->snd != NULL;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (bad) {
		ferry_warn(
			"tcp: rank %u resumes its session with rank %u at frame %llu, but rank %u "
			"sent it %llu frames and keeps those after frame %llu; marking it failed",
			c->rank, t->base.cfg.rank, (unsigned long long)r->delivered + 1,
			t->base.cfg.rank, (unsigned long long)sent, (unsigned long long)acked);
		session_epoll_del_close(t, fd);
		ferry__tcp_conn_fail(t, c, -FERRY_E_PROTO);
		return;
	}
	if (err) {
		ferry_warn("tcp: rank %u: cannot resume the session with rank %u (%s); it stays "
			   "down",
			   t->base.cfg.rank, c->rank, strerror(err));
		session_epoll_del_close(t, fd);
		return;
	}
	if (c->link.fd >= 0) /* a probe in flight */
		session_epoll_del_close(t, c->link.fd);
	c->link.fd = -1;
	c->rx_acked = c->rx_seq;
	c->rx_unacked = 0;
	t->resumed++;
	ferry__tcp_trim_arm(t); /* the rewind put acknowledged chunks in the pool */
	ferry_info("tcp: rank %u: resumed the session with rank %u after %lld ms; %llu frames "
		   "sent again (it had delivered %llu of our %llu)",
		   t->base.cfg.rank, c->rank, (long long)(tcp_now_ms() - c->down_since),
		   (unsigned long long)resent, (unsigned long long)r->delivered,
		   (unsigned long long)sent);
}

/* the peer is gone for good: @why; @err for on_peer_failed (-ECONNREFUSED:
 * no process listens there any more). Progress thread. */
static void session_gone(struct tcp_tp *t, struct tcp_conn *c, const char *why, int err)
{
	char where[64];

	ferry__tcp_sockaddr_str(&c->sa, where, sizeof(where));
	ferry_warn("tcp: rank %u: rank %u at %s %s; marking it failed", t->base.cfg.rank, c->rank,
		   where, why);
	ferry__tcp_conn_fail(t, c, err);
}

/* ---- redials and probes (struct tcp_link) -------------------------------- */

static void link_close(struct tcp_tp *t, struct tcp_link *l)
{
	if (l->fd >= 0)
		session_epoll_del_close(t, l->fd);
	l->fd = -1;
}

/* try again after the backoff (a probe: after TCP_PROBE_MS) */
static void link_later(struct tcp_tp *t, struct tcp_link *l, int probe, const char *why)
{
	int64_t now = tcp_now_ms();

	link_close(t, l);
	ferry_dbg("tcp: rank %u: %s rank %u: %s", t->base.cfg.rank, probe ? "probing" : "redialing",
		  l->c->rank, why);
	if (probe) {
		l->next_ms = now + TCP_PROBE_MS;
	} else {
		l->next_ms = now + l->backoff_ms;
		l->backoff_ms = l->backoff_ms * 2 > TCP_REDIAL_MAX_MS ? TCP_REDIAL_MAX_MS :
									l->backoff_ms * 2;
	}
	ferry__tcp_timer_at(t, l->next_ms);
}

static void link_start(struct tcp_tp *t, struct tcp_conn *c)
{
	struct tcp_link *l = &c->link;
	int probe = !session_we_dial(t, c);
	struct epoll_event ev = { .events = EPOLLOUT, .data.ptr = l };
	int fd;

	if (!c->have_sa) {
		l->next_ms = c->down_until; /* no address to try: wait for it */
		return;
	}
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		link_later(t, l, probe, strerror(errno));
		return;
	}
	ferry__tcp_set_nodelay(fd);
	l->fd = fd;
	l->connecting = 1;
	l->in_off = l->out_off = 0;
	if (connect(fd, (struct sockaddr *)&c->sa, sizeof(c->sa)) && errno != EINPROGRESS &&
	    errno != EINTR) {
		if (errno == ECONNREFUSED) {
			link_close(t, l);
			session_gone(t, c, "refuses connections: its process is gone",
				     -ECONNREFUSED);
			return;
		}
		link_later(t, l, probe, strerror(errno));
		return;
	}
	/* EPOLLOUT says the connect finished, either way (SO_ERROR says which) */
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev))
		link_later(t, l, probe, strerror(errno));
}

/* Return: 1 when the peer's handshake is in, 0 while it goes on, -1 after
 * link_later(), -2 when the peer failed the token proof (l->auth.why) */
static int link_hs_step(struct tcp_tp *t, struct tcp_link *l)
{
	ssize_t n;

	if (!l->authed) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = l };
		int ret = ferry__auth_hs_step(&l->auth, l->fd);

		if (ret == -EACCES)
			return -2;
		if (ret < 0) {
			link_later(t, l, 0,
				   ret == -ENODATA ? "it closed before its token proof" :
						     strerror(-ret));
			return -1;
		}
		if (ret == 1) {
			/* proven: now the HELLO and RESUME, with the counts of now */
			l->authed = 1;
			ferry__tcp_hs_build(t, l->c, l->out);
		}
		if (ret == 1 || ferry__auth_hs_want_out(&l->auth))
			ev.events |= EPOLLOUT;
		if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, l->fd, &ev)) {
			link_later(t, l, 0, strerror(errno));
			return -1;
		}
		if (!ret)
			return 0;
	}

	if (l->out_off < TCP_HS_LEN) {
		while (l->out_off < TCP_HS_LEN) {
			n = send(l->fd, l->out + l->out_off, TCP_HS_LEN - l->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				break;
			if (n < 0) {
				link_later(t, l, 0, strerror(errno));
				return -1;
			}
			l->out_off += n;
		}
		if (l->out_off == TCP_HS_LEN) {
			/* all out: EPOLLOUT would fire on every wait until the answer */
			struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = l };

			if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, l->fd, &ev)) {
				link_later(t, l, 0, strerror(errno));
				return -1;
			}
		}
	}
	while (l->in_off < TCP_HS_LEN) {
		n = recv(l->fd, l->in + l->in_off, TCP_HS_LEN - l->in_off, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0) {
			link_later(t, l, 0, n ? strerror(errno) : "it closed before its HELLO");
			return -1;
		}
		l->in_off += n;
	}
	return l->out_off == TCP_HS_LEN;
}

void ferry__tcp_link_event(struct tcp_tp *t, struct tcp_link *l, uint32_t events)
{
	const struct ferry_tp_config *cfg = &t->base.cfg;
	struct tcp_conn *c = l->c;
	int probe = !session_we_dial(t, c);
	struct ferry_msg_resume r;
	char why[200];
	int ret;

	(void)events;
	if (l->fd < 0)
		return; /* handed over or closed earlier in this batch */
	if (l->connecting) {
		int err = 0;
		socklen_t elen = sizeof(err);
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP,
					  .data.ptr = l };

		if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &elen))
			err = errno;
		if (err == ECONNREFUSED) {
			link_close(t, l);
			session_gone(t, c, "refuses connections: its process is gone",
				     -ECONNREFUSED);
			return;
		}
		if (err) {
			link_later(t, l, probe, strerror(err));
			return;
		}
		l->connecting = 0;
		if (probe) {
			/* someone listens there: the process lives; it is its turn to dial */
			link_later(t, l, 1, "its listener answers");
			return;
		}
		l->authed = !cfg->auth;
		if (cfg->auth)
			ferry__auth_hs_init(&l->auth, cfg->auth_key, "tcp", FERRY_AUTH_DIALER,
					    cfg->rank);
		else
			ferry__tcp_hs_build(t, c, l->out);
		if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, l->fd, &ev)) {
			link_later(t, l, 0, strerror(errno));
			return;
		}
	}
	ret = link_hs_step(t, l);
	if (ret == -2) {
		char msg[256];

		link_close(t, l);
		snprintf(msg, sizeof(msg), "answers, but fails the token proof: %s", l->auth.why);
		session_gone(t, c, msg, -FERRY_E_PEER);
		return;
	}
	if (ret <= 0)
		return;
	if (ferry__proto_check_hello(l->in, TCP_HELLO_LEN, cfg->cluster_id, cfg->world, cfg->rank,
				     (int)c->rank, why, sizeof(why)) < 0 ||
	    ferry__tcp_resume_parse(t, l->in + TCP_HELLO_LEN, c->rank, c->peer_inc, &r, why,
				    sizeof(why))) {
		char msg[256];

		link_close(t, l);
		snprintf(msg, sizeof(msg), "answers, but not as its session's peer: %s", why);
		session_gone(t, c, msg, -FERRY_E_PEER);
		return;
	}
	session_resume(t, c, l->fd, &r);
}

/* ---- accepting again ------------------------------------------------------ */

static void acc_close(struct tcp_tp *t, struct tcp_acc *a)
{
	if (a->fd >= 0)
		session_epoll_del_close(t, a->fd);
	a->fd = -1;
}

/* move @a's token proof on. Return: 1 through, 0 not yet, -1 closed (logged) */
static int acc_auth(struct tcp_tp *t, struct tcp_acc *a)
{
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = a };
	int ret = ferry__auth_hs_step(&a->auth, a->fd);

	if (ret == 1) {
		a->authed = 1;
		return 1;
	}
	if (ret < 0) {
		/* nothing at all: a peer's probe of our listener */
		if (ret != -ENODATA || a->auth.in_off)
			ferry_warn("tcp: rank %u rejected a connection from %s: %s",
				   t->base.cfg.rank, a->who,
				   ret == -EACCES  ? a->auth.why :
				   ret == -ENODATA ? "it closed before its token proof" :
						     strerror(-ret));
		acc_close(t, a);
		return -1;
	}
	if (ferry__auth_hs_want_out(&a->auth))
		ev.events |= EPOLLOUT;
	if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, a->fd, &ev)) {
		acc_close(t, a);
		return -1;
	}
	return 0;
}

/* a slot for a connection from @source: a free one, else the oldest of the
 * source's when it holds TCP_HS_PER_SOURCE, else the oldest of all (a real
 * peer sends its handshake at once: the oldest is an idle one) */
static struct tcp_acc *acc_slot(struct tcp_tp *t, uint32_t source)
{
	struct tcp_acc *free_slot = NULL, *oldest = NULL, *oldest_src = NULL, *a;
	unsigned from_src = 0;

	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++) {
		a = &t->acc[i];
		if (a->fd < 0) {
			if (!free_slot)
				free_slot = a;
			continue;
		}
		if (!oldest || a->until < oldest->until)
			oldest = a;
		if (a->source == source) {
			from_src++;
			if (!oldest_src || a->until < oldest_src->until)
				oldest_src = a;
		}
	}
	a = from_src >= TCP_HS_PER_SOURCE ? oldest_src : free_slot ? free_slot : oldest;
	if (a->fd >= 0) {
		if (!t->acc_full_logged++)
			ferry_warn("tcp: rank %u: %d connections wait in their handshake (%u from "
				   "the newcomer's address); closing the oldest (from %s) to make "
				   "room; logged once",
				   t->base.cfg.rank, TCP_MAX_HANDSHAKES, from_src, a->who);
		acc_close(t, a);
	}
	return a;
}

void ferry__tcp_listen_event(struct tcp_tp *t)
{
	for (;;) {
		struct sockaddr_in sa;
		socklen_t salen = sizeof(sa);
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
		struct tcp_acc *a = NULL;
		int fd;

		fd = accept4(t->lfd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				ferry_warn("tcp: rank %u: accept: %s", t->base.cfg.rank,
					   strerror(errno));
			return;
		}
		a = acc_slot(t, sa.sin_addr.s_addr);
		ev.data.ptr = a;
		if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev)) {
			ferry_warn("tcp: rank %u: epoll_ctl: %s", t->base.cfg.rank,
				   strerror(errno));
			close(fd);
			continue;
		}
		ferry__tcp_set_nodelay(fd);
		a->fd = fd;
		a->in_off = 0;
		a->until = tcp_now_ms() + TCP_HS_MS;
		a->source = sa.sin_addr.s_addr;
		a->authed = !t->base.cfg.auth;
		ferry__tcp_sockaddr_str(&sa, a->who, sizeof(a->who));
		ferry__tcp_timer_at(t, a->until);
		if (t->base.cfg.auth) {
			/* our nonce goes out now; the rest when the peer answers */
			ferry__auth_hs_init(&a->auth, t->base.cfg.auth_key, "tcp",
					    FERRY_AUTH_ACCEPTOR, t->base.cfg.rank);
			acc_auth(t, a);
		}
	}
}

/* an accepted handshake is through: the peer's session goes on over it */
static void acc_resume(struct tcp_tp *t, struct tcp_acc *a, uint32_t peer)
{
	struct tcp_conn *c = &t->conns[peer];
	unsigned char out[TCP_HS_LEN];
	struct ferry_msg_resume r;
	enum tcp_conn_state state;
	uint64_t inc;
	char why[200];
	ssize_t n;
	int fd;

	pthread_mutex_lock(&c->lock);
	state = c->state;
	inc = c->peer_inc;
	pthread_mutex_unlock(&c->lock);
	if (state == TCP_CONN_IDLE || state == TCP_CONN_FAILED || c->reported) {
		ferry_info("tcp: rank %u: rank %u reconnected from %s, but %s; closing it",
			   t->base.cfg.rank, peer, a->who,
			   state == TCP_CONN_IDLE ? "this node is still connecting" :
						    "its session ended (it failed)");
		acc_close(t, a);
		return;
	}
	if (ferry__tcp_resume_parse(t, a->in + TCP_HELLO_LEN, peer, inc, &r, why, sizeof(why))) {
		ferry_warn("tcp: rank %u rejected a connection from %s: %s", t->base.cfg.rank,
			   a->who, why);
		acc_close(t, a);
		return;
	}
	if (state != TCP_CONN_DOWN) {
		char lost[96];

		/* it saw the loss first: what the old connection still holds is not
		 * delivered, and our RESUME says so */
		snprintf(lost, sizeof(lost),
			 "rank %u redialed rank %u while their connection stood", peer,
			 t->base.cfg.rank);
		ferry__tcp_conn_lost(t, c, lost);
		if (c->reported) {
			acc_close(t, a);
			return;
		}
	}
	ferry__tcp_hs_build(t, c, out);
	n = send(a->fd, out, sizeof(out), MSG_NOSIGNAL | MSG_DONTWAIT);
	if (n != (ssize_t)sizeof(out)) {
		ferry_info("tcp: rank %u: the handshake to rank %u at %s failed (%s); it will "
			   "redial",
			   t->base.cfg.rank, peer, a->who, n < 0 ? strerror(errno) : "short write");
		acc_close(t, a);
		return;
	}
	fd = a->fd;
	a->fd = -1; /* the connection's now; still in the epoll set */
	session_resume(t, c, fd, &r);
}

void ferry__tcp_acc_event(struct tcp_tp *t, struct tcp_acc *a, uint32_t events)
{
	const struct ferry_tp_config *cfg = &t->base.cfg;
	char why[200];
	int peer;

	(void)events;
	if (a->fd < 0)
		return;
	if (!a->authed && acc_auth(t, a) <= 0)
		return;
	while (a->in_off < TCP_HS_LEN) {
		ssize_t n = recv(a->fd, a->in + a->in_off, TCP_HS_LEN - a->in_off, MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			/* nothing at all: a peer's probe of our listener */
			if (a->in_off || n < 0)
				ferry_warn("tcp: rank %u rejected a connection from %s: %s",
					   cfg->rank, a->who,
					   n ? strerror(errno) : "it closed before its HELLO");
			acc_close(t, a);
			return;
		}
		a->in_off += n;
	}
	if (a->in_off < TCP_HELLO_LEN)
		return;
	/* the HELLO is checked as soon as it is in: a stranger goes at once */
	peer = ferry__proto_check_hello(a->in, TCP_HELLO_LEN, cfg->cluster_id, cfg->world,
					cfg->rank, -1, why, sizeof(why));
	if (peer < 0) {
		ferry_warn("tcp: rank %u rejected a connection from %s: %s", cfg->rank, a->who,
			   why);
		acc_close(t, a);
		return;
	}
	if (a->in_off == TCP_HS_LEN)
		acc_resume(t, a, (uint32_t)peer);
}

/* ---- fault injection (tests) ---------------------------------------------- */

static void session_fault(struct tcp_tp *t)
{
	uint32_t world = t->base.cfg.world, me = t->base.cfg.rank;
	uint64_t x = t->fault_rand;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	t->fault_rand = x;
	for (uint32_t i = 0; i < world; i++) {
		struct tcp_conn *c = &t->conns[(uint32_t)(x % world + i) % world];
		struct linger lg = { .l_onoff = 1, .l_linger = 0 };
		char why[96];
		int up, fd;

		if (c->rank == me)
			continue;
		pthread_mutex_lock(&c->lock);
		up = c->state == TCP_CONN_UP;
		fd = c->fd;
		pthread_mutex_unlock(&c->lock);
		if (!up)
			continue;
		/* only this thread closes fd: it stays valid without the lock */
		if (x & 1024) {
			ferry_info(
				"tcp: rank %u: fault injection shuts down its connection to rank "
				"%u",
				me, c->rank);
			shutdown(fd, SHUT_RDWR); /* both ends read an EOF */
			return;
		}
		setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		snprintf(why, sizeof(why),
			 "rank %u: fault injection reset its connection to rank %u", me, c->rank);
		ferry__tcp_conn_lost(t, c, why); /* the close sends a reset */
		return;
	}
}

/* ---- the timers ------------------------------------------------------------ */

int64_t ferry__tcp_timers(struct tcp_tp *t, int64_t now)
{
	int64_t next = 0;

#define TCP_NEXT(w)                      \
	do {                             \
		if (!next || (w) < next) \
			next = (w);      \
	} while (0)

	t->timer_ms = 0; /* what runs below may set timers of its own */
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct tcp_conn *c = &t->conns[r];
		int down;

		if (r == t->base.cfg.rank)
			continue;
		if (c->ack_due) {
			if (now >= c->ack_due)
				ferry__tcp_send_ack(t, c);
			else
				TCP_NEXT(c->ack_due);
		}
		pthread_mutex_lock(&c->lock);
		down = c->state == TCP_CONN_DOWN;
		pthread_mutex_unlock(&c->lock);
		if (!down)
			continue;
		if (now >= c->down_until) {
			ferry_warn("tcp: rank %u: rank %u did not come back within %d ms of losing "
				   "its connection; marking it failed (FERRY_RECONNECT_MS sets the "
				   "bound)",
				   t->base.cfg.rank, r, t->reconnect_ms);
			ferry__tcp_conn_fail(t, c, -FERRY_E_PEER);
			continue;
		}
		TCP_NEXT(c->down_until);
		if (c->link.fd < 0 && now >= c->link.next_ms)
			link_start(t, c);
		if (c->link.fd < 0 && !c->reported)
			TCP_NEXT(c->link.next_ms);
	}
	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++) {
		struct tcp_acc *a = &t->acc[i];

		if (a->fd < 0)
			continue;
		if (now >= a->until) {
			ferry_info(
				"tcp: rank %u: closing a connection from %s that had not finished "
				"its handshake within %d ms",
				t->base.cfg.rank, a->who, TCP_HS_MS);
			acc_close(t, a);
			continue;
		}
		TCP_NEXT(a->until);
	}
	if (t->trim_ms) {
		if (now >= t->trim_ms) {
			t->trim_ms = 0;
			/* again while something is left to trim (mem.c) */
			if (ferry__tcp_trim(t))
				t->trim_ms = now + TCP_TRIM_MS;
		}
		if (t->trim_ms)
			TCP_NEXT(t->trim_ms);
	}
	if (t->fault_ms && !__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE)) {
		if (!t->fault_next)
			t->fault_next = now + t->fault_ms;
		if (now >= t->fault_next) {
			session_fault(t);
			t->fault_next = now + t->fault_ms;
		}
		TCP_NEXT(t->fault_next);
	}
#undef TCP_NEXT
	if (next)
		ferry__tcp_timer_at(t, next);
	return t->timer_ms;
}

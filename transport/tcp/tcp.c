/* SPDX-License-Identifier: MIT */
/*
 * tcp.c - the TCP transport: one connection per pair of nodes, Ferry frames
 * on the byte stream, one epoll progress thread per transport instance.
 *
 * Connection setup (ops->connect, on the caller's thread)
 *
 *   Rank i dials every rank j < i and accepts every rank j > i. Both ends
 *   send a HELLO first and check the other's before the connection counts:
 *
 *     rank j (j < i)                                  rank i
 *     listening since init  <-------- connect() ----  retried until the deadline
 *     HELLO{cluster, j, world} --------------------->  magic, version, cluster,
 *                            <---------------------   world, rank == j
 *     magic, version, cluster, world,                  HELLO{cluster, i, world}
 *     rank i > j, not a duplicate
 *
 *   A connection that fails its HELLO is logged once, closed and not counted;
 *   accepting goes on. Once all world-1 connections stand, the listening
 *   socket is closed (later strangers are refused by the kernel) and the
 *   sockets are handed to the progress thread.
 *
 * Sending (ops->send, any thread)
 *
 *   Under the connection's lock: when nothing is queued, sendmsg() straight
 *   from the caller's iovec, one syscall in the common case; whatever the
 *   socket does not take is copied to the out queue and EPOLLOUT is armed.
 *   The progress thread flushes the queue with gathered writes and disarms
 *   EPOLLOUT when it is empty. A frame is queued whole or not at all, so
 *   frames never interleave, and the frames of one thread to one destination
 *   leave in the order they were sent.
 *
 *     out queue: [chunk: f1 f2 f3] -> [chunk: rest of f4] -> NULL
 *                 ^ oq_off = bytes of the head chunk already written
 *
 *   Frames to our own rank go through the self queue (a mutex-protected list
 *   of copies and the wake eventfd) and are delivered by the progress thread.
 *
 * Receiving (progress thread)
 *
 *     rbuf: [consumed | frame | frame | partial frame |   free   ]
 *                     ^ rhead                         ^ rtail    ^ rcap
 *
 *   One recv() takes as much as fits (several frames per syscall under
 *   load); every complete frame is checked (ferry__proto_check_hdr(), src ==
 *   the connection's rank) and handed to on_msg() in place. rbuf comes from
 *   malloc and every frame length is a multiple of FERRY_MSG_ALIGN, so each
 *   frame starts 8-byte aligned. The buffer grows to hold a frame of up to
 *   FERRY_MSG_MAX bytes and is freed once it is empty and above TCP_RBUF_KEEP.
 *
 * Failures: a bad header, a wrong src, EOF or a socket error closes that one
 * connection and calls on_peer_failed() once for that rank, from the progress
 * thread; the other connections go on.
 */
#define _GNU_SOURCE /* accept4, pthread_setname_np, IOV_MAX */
#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "transport/transport.h"

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

#define TCP_HDR_LEN sizeof(struct ferry_msg_hdr)
#define TCP_HELLO_LEN (sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_hello))
#define TCP_RBUF_SIZE (256u << 10) /* receive buffer of a connection */
#define TCP_RBUF_KEEP (4u << 20)   /* an emptied buffer above this is freed */
#define TCP_READ_MIN (16u << 10)   /* compact when less room is left */
#define TCP_READS_PER_EVENT 16	   /* then let the other connections in */
#define TCP_CHUNK_SIZE (64u << 10) /* least capacity of an out queue chunk */
#define TCP_FLUSH_IOV 64	   /* chunks per gathered write */
#define TCP_EVENTS 64		   /* epoll events per wait */
#define TCP_MAX_HANDSHAKES 64	   /* accepted connections in their HELLO at once */
#define TCP_DRAIN_MS 1000	   /* fini: bound on flushing the out queues */
#define TCP_RETRY_MIN_MS 10	   /* backoff between dials of a refused rank */
#define TCP_RETRY_MAX_MS 250

_Static_assert(sizeof(struct ferry_msg_hdr) == 16, "the wire header is 16 bytes");
_Static_assert(sizeof(struct ferry_msg_hello) == 16, "the HELLO body is 16 bytes");

enum tcp_conn_state {
	TCP_CONN_IDLE,	 /* connect() has not handed it over yet */
	TCP_CONN_UP,	 /* established, in the epoll set */
	TCP_CONN_BROKEN, /* a sender hit a socket error; the progress thread fails it */
	TCP_CONN_FAILED, /* closed; on_peer_failed() was called */
};

/* a piece of the out queue: bytes [0, len) of data, of which the head has sent oq_off */
struct tcp_chunk {
	struct tcp_chunk *next;
	size_t len;
	size_t cap;
	unsigned char data[];
};

struct tcp_conn {
	/*
	 * lock guards fd (writes), state, send_err, out_armed and the out queue.
	 * Senders take it around their sendmsg(); the progress thread takes it to
	 * flush and to fail the connection, and never holds it across a handler.
	 */
	pthread_mutex_t lock;
	int fd; /* -1 when there is none; the progress thread reads it unlocked */
	enum tcp_conn_state state;
	int send_err;  /* BROKEN: the errno a sender saw */
	int out_armed; /* EPOLLOUT is in the connection's epoll events */
	struct tcp_chunk *oq_head;
	struct tcp_chunk *oq_tail;
	size_t oq_off;

	/* set in init, read-only afterwards */
	uint32_t rank;

	/* progress thread only */
	int reported; /* on_peer_failed() was called */
	int bye;      /* the peer said FERRY_MSG_BYE: its close is a departure */
	unsigned char *rbuf;
	size_t rcap;
	size_t rhead;
	size_t rtail;
	size_t rneed; /* length of the frame at rhead once its header is in; 0 before */
};

/* a frame to our own rank; data is 16-byte aligned as it follows two words */
struct tcp_selfmsg {
	struct tcp_selfmsg *next;
	size_t len;
	_Alignas(16) unsigned char data[];
};

struct tcp_tp {
	struct ferry_tp base;
	char bind[NI_MAXHOST]; /* our copy of cfg.bind_addr */
	char addr[64];	       /* "ip:port" that peers dial: our address blob */
	int lfd;	       /* listening socket until connect() succeeds */
	int epfd;
	int wake_fd; /* eventfd: self queue, broken connections, stop */
	pthread_t thread;
	struct tcp_conn *conns; /* one per rank; ours unused */
	int connected;		/* connect() succeeded; caller's thread only */

	pthread_mutex_t self_lock; /* guards self_head, self_tail */
	struct tcp_selfmsg *self_head;
	struct tcp_selfmsg *self_tail;

	int closing;	  /* atomic: fini() asked the progress thread to stop */
	int fail_pending; /* atomic: some connection is BROKEN */
};

static inline struct tcp_tp *to_tcp(struct ferry_tp *tp)
{
	return container_of(tp, struct tcp_tp, base);
}

static int64_t tcp_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void tcp_set_nodelay(int fd)
{
	int one = 1;

	/* a failure costs latency, not correctness */
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
		ferry_dbg("tcp: TCP_NODELAY: %s", strerror(errno));
}

static void tcp_sockaddr_str(const struct sockaddr_in *sa, char *buf, size_t len)
{
	char ip[INET_ADDRSTRLEN];

	if (!inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip)))
		snprintf(ip, sizeof(ip), "?");
	snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(sa->sin_port));
}

/* Context: any thread. Wakes the progress thread out of epoll_wait(). */
static void tcp_wake(struct tcp_tp *t)
{
	uint64_t one = 1;

	/* EAGAIN means the counter is already non-zero: the wake is pending */
	if (write(t->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		ferry_err("tcp: rank %u: cannot wake the progress thread: %s", t->base.cfg.rank,
			  strerror(errno));
}

/* ---- out queue ---------------------------------------------------------- */

static void tcp_oq_free(struct tcp_conn *c)
{
	struct tcp_chunk *ch = c->oq_head, *next;

	for (; ch; ch = next) {
		next = ch->next;
		free(ch);
	}
	c->oq_head = c->oq_tail = NULL;
	c->oq_off = 0;
}

/*
 * tcp_oq_append - queue what is left of a frame after @skip bytes went out
 *
 * All or nothing: on -ENOMEM the queue is unchanged. Call with c->lock held.
 */
static int tcp_oq_append(struct tcp_conn *c, const struct iovec *iov, int iovcnt, size_t skip,
			 size_t total)
{
	size_t need = total - skip, room = 0, fill;
	struct tcp_chunk *tail = c->oq_tail, *fresh = NULL;

	if (tail)
		room = tail->cap - tail->len;
	if (need > room) {
		size_t cap = need - room;

		if (cap < TCP_CHUNK_SIZE)
			cap = TCP_CHUNK_SIZE;
		fresh = malloc(sizeof(*fresh) + cap);
		if (!fresh)
			return -ENOMEM;
		fresh->next = NULL;
		fresh->len = 0;
		fresh->cap = cap;
	}

	for (int i = 0; i < iovcnt; i++) {
		const unsigned char *p = iov[i].iov_base;
		size_t n = iov[i].iov_len;

		if (skip >= n) {
			skip -= n;
			continue;
		}
		p += skip;
		n -= skip;
		skip = 0;
		if (room) {
			fill = n < room ? n : room;
			memcpy(tail->data + tail->len, p, fill);
			tail->len += fill;
			room -= fill;
			p += fill;
			n -= fill;
		}
		if (n) {
			memcpy(fresh->data + fresh->len, p, n);
			fresh->len += n;
		}
	}
	if (fresh) {
		if (tail)
			tail->next = fresh;
		else
			c->oq_head = fresh;
		c->oq_tail = fresh;
	}
	return 0;
}

/* Call with c->lock held and c->state UP. Return: 0 or a negative errno. */
static int tcp_conn_arm(struct tcp_tp *t, struct tcp_conn *c, int out)
{
	struct epoll_event ev = {
		.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0),
		.data.ptr = c,
	};

	if (c->out_armed == out)
		return 0;
	if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, c->fd, &ev))
		return -errno;
	c->out_armed = out;
	return 0;
}

/*
 * tcp_conn_flush - write out what the connection's queue holds
 *
 * Context: progress thread; takes c->lock.
 * Return: 0 (sent, or the socket is full again), or the negative errno of a
 * socket error; the caller fails the connection then.
 */
static int tcp_conn_flush(struct tcp_tp *t, struct tcp_conn *c)
{
	struct iovec iov[TCP_FLUSH_IOV];
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	while (c->state == TCP_CONN_UP && c->oq_head) {
		struct msghdr mh = { .msg_iov = iov };
		struct tcp_chunk *ch = c->oq_head;
		size_t off = c->oq_off;
		ssize_t n;

		for (; ch && mh.msg_iovlen < TCP_FLUSH_IOV; ch = ch->next, off = 0) {
			iov[mh.msg_iovlen].iov_base = ch->data + off;
			iov[mh.msg_iovlen].iov_len = ch->len - off;
			mh.msg_iovlen++;
		}
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				ret = -errno;
			break;
		}
		while (n > 0) {
			ch = c->oq_head;
			if ((size_t)n < ch->len - c->oq_off) {
				c->oq_off += n;
				break;
			}
			n -= ch->len - c->oq_off;
			c->oq_off = 0;
			c->oq_head = ch->next;
			free(ch);
		}
		if (!c->oq_head)
			c->oq_tail = NULL;
		else if (c->oq_off)
			break; /* a short write: the socket is full */
	}
	if (!ret && c->state == TCP_CONN_UP && !c->oq_head)
		ret = tcp_conn_arm(t, c, 0);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* ---- failures ----------------------------------------------------------- */

/*
 * tcp_conn_fail - close a connection and report its rank failed, once
 *
 * The caller has logged the cause. Context: progress thread.
 */
static void tcp_conn_fail(struct tcp_tp *t, struct tcp_conn *c, int err)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	int fd;

	pthread_mutex_lock(&c->lock);
	fd = c->fd;
	c->fd = -1;
	c->state = TCP_CONN_FAILED;
	tcp_oq_free(c);
	pthread_mutex_unlock(&c->lock);

	/* no sender touches fd now that the state is FAILED */
	if (fd >= 0) {
		epoll_ctl(t->epfd, EPOLL_CTL_DEL, fd, NULL);
		close(fd);
	}
	free(c->rbuf);
	c->rbuf = NULL;
	c->rcap = c->rhead = c->rtail = c->rneed = 0;

	if (!c->reported) {
		c->reported = 1;
		if (h->on_peer_failed)
			h->on_peer_failed(t->base.cfg.core, c->rank, err);
	}
}

/* Context: progress thread, after a sender flagged fail_pending. */
static void tcp_fail_broken(struct tcp_tp *t)
{
	uint32_t world = t->base.cfg.world;

	for (uint32_t r = 0; r < world; r++) {
		struct tcp_conn *c = &t->conns[r];
		int err;

		pthread_mutex_lock(&c->lock);
		err = c->state == TCP_CONN_BROKEN ? c->send_err : 0;
		pthread_mutex_unlock(&c->lock);
		if (!err)
			continue;
		ferry_warn("tcp: rank %u: sending to rank %u failed (%s); marking it failed",
			   t->base.cfg.rank, r, strerror(err));
		tcp_conn_fail(t, c, -FERRY_E_PEER);
	}
}

/* ---- receiving ---------------------------------------------------------- */

/* make room in c->rbuf for the frame at rhead and a large read. Progress thread. */
static int tcp_rbuf_make_room(struct tcp_conn *c)
{
	size_t want = c->rneed > TCP_HDR_LEN ? c->rneed : TCP_HDR_LEN;
	unsigned char *buf;

	if (c->rhead && (c->rcap - c->rtail < TCP_READ_MIN || c->rhead + want > c->rcap)) {
		memmove(c->rbuf, c->rbuf + c->rhead, c->rtail - c->rhead);
		c->rtail -= c->rhead;
		c->rhead = 0;
	}
	if (c->rbuf && want <= c->rcap)
		return 0;
	/* room for the whole frame and for the frames that follow it */
	want = want < TCP_RBUF_SIZE ? TCP_RBUF_SIZE : want + TCP_RBUF_SIZE;
	buf = realloc(c->rbuf, want);
	if (!buf)
		return -ENOMEM;
	c->rbuf = buf;
	c->rcap = want;
	return 0;
}

/*
 * tcp_conn_deliver - hand every complete frame in rbuf to on_msg()
 *
 * Context: progress thread. Return: 0, or -1 when the connection failed.
 */
static int tcp_conn_deliver(struct tcp_tp *t, struct tcp_conn *c)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	uint32_t world = t->base.cfg.world;

	while (c->rtail - c->rhead >= TCP_HDR_LEN) {
		const unsigned char *frame = c->rbuf + c->rhead;
		struct ferry_msg_hdr hdr;
		const char *why = "invalid header";

		memcpy(&hdr, frame, sizeof(hdr));
		if (ferry__proto_check_hdr(&hdr, world, &why)) {
			ferry_warn("tcp: rank %u sent rank %u a frame with a bad header (%s); "
				   "dropping its connection and marking it failed",
				   c->rank, t->base.cfg.rank, why);
			tcp_conn_fail(t, c, -FERRY_E_PROTO);
			return -1;
		}
		if (hdr.src != c->rank) {
			ferry_warn("tcp: rank %u sent rank %u a frame that claims to come from "
				   "rank %u; dropping its connection and marking it failed",
				   c->rank, t->base.cfg.rank, hdr.src);
			tcp_conn_fail(t, c, -FERRY_E_PROTO);
			return -1;
		}
		if (c->rtail - c->rhead < hdr.len) {
			c->rneed = hdr.len;
			return 0;
		}
		/* rbuf is malloc-aligned and every len a multiple of FERRY_MSG_ALIGN */
		c->rhead += hdr.len;
		c->rneed = 0;
		if (hdr.type == FERRY_MSG_BYE) {
			c->bye = 1; /* the transport's own: the core never sees it */
			continue;
		}
		h->on_msg(t->base.cfg.core, c->rank, frame, hdr.len);
	}
	if (c->rhead == c->rtail) {
		c->rhead = c->rtail = 0;
		if (c->rcap > TCP_RBUF_KEEP) {
			free(c->rbuf);
			c->rbuf = NULL;
			c->rcap = 0;
		}
	}
	return 0;
}

/* the peer closed its end: between frames, or in the middle of one. Progress thread. */
static void tcp_conn_eof(struct tcp_tp *t, struct tcp_conn *c)
{
	size_t have = c->rtail - c->rhead;
	uint32_t me = t->base.cfg.rank;

	if (!have) {
		if (c->bye)
			ferry_info("tcp: rank %u left (it closed its connection to rank %u)",
				   c->rank, me);
		else if (__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
			ferry_info(
				"tcp: rank %u closed its connection to rank %u; marking it failed",
				c->rank, me);
		else
			ferry_warn(
				"tcp: rank %u closed its connection to rank %u; marking it failed",
				c->rank, me);
	} else if (!c->rneed) {
		ferry_warn("tcp: rank %u closed its connection to rank %u in the middle of a "
			   "frame header (%zu of %zu bytes); marking it failed",
			   c->rank, me, have, TCP_HDR_LEN);
	} else {
		ferry_warn("tcp: rank %u closed its connection to rank %u in the middle of a "
			   "frame (%zu of %zu bytes); marking it failed",
			   c->rank, me, have, c->rneed);
	}
	tcp_conn_fail(t, c, -FERRY_E_PEER);
}

/* read what the socket has and deliver it. Context: progress thread. */
static void tcp_conn_input(struct tcp_tp *t, struct tcp_conn *c)
{
	for (int i = 0; i < TCP_READS_PER_EVENT; i++) {
		size_t room;
		ssize_t n;

		if (tcp_rbuf_make_room(c)) {
			ferry_err("tcp: rank %u: no memory for a %zu-byte frame from rank %u; "
				  "dropping its connection",
				  t->base.cfg.rank, c->rneed, c->rank);
			tcp_conn_fail(t, c, -ENOMEM);
			return;
		}
		room = c->rcap - c->rtail;
		n = recv(c->fd, c->rbuf + c->rtail, room, 0);
		if (n > 0) {
			c->rtail += n;
			if (tcp_conn_deliver(t, c))
				return;
			if ((size_t)n < room)
				return; /* drained; level-triggered epoll says when more comes */
			continue;
		}
		if (n == 0) {
			tcp_conn_eof(t, c);
			return;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return;
		ferry_warn("tcp: rank %u: the connection to rank %u failed (%s); marking it failed",
			   t->base.cfg.rank, c->rank, strerror(errno));
		tcp_conn_fail(t, c, -FERRY_E_PEER);
		return;
	}
}

/* Context: progress thread. */
static void tcp_self_deliver(struct tcp_tp *t)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct tcp_selfmsg *m, *next;

	pthread_mutex_lock(&t->self_lock);
	m = t->self_head;
	t->self_head = t->self_tail = NULL;
	pthread_mutex_unlock(&t->self_lock);

	for (; m; m = next) {
		next = m->next;
		h->on_msg(t->base.cfg.core, t->base.cfg.rank, m->data, m->len);
		free(m);
	}
}

/* ---- progress thread ---------------------------------------------------- */

static void tcp_wake_input(struct tcp_tp *t)
{
	uint64_t v;

	if (read(t->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		ferry_dbg("tcp: reading the wake eventfd: %s", strerror(errno));
	tcp_self_deliver(t);
	if (__atomic_exchange_n(&t->fail_pending, 0, __ATOMIC_ACQ_REL))
		tcp_fail_broken(t);
}

/* fini: 1 when no connection has bytes queued. Progress thread. */
static int tcp_flushed(struct tcp_tp *t)
{
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct tcp_conn *c = &t->conns[r];
		int busy;

		pthread_mutex_lock(&c->lock);
		busy = c->state == TCP_CONN_UP && c->oq_head;
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
		err = tcp_conn_flush(t, c);
		if (err) {
			ferry_warn(
				"tcp: rank %u: sending to rank %u failed (%s); marking it failed",
				t->base.cfg.rank, c->rank, strerror(-err));
			tcp_conn_fail(t, c, -FERRY_E_PEER);
			return;
		}
	}
	if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
		tcp_conn_input(t, c);
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

	for (;;) {
		int timeout = busy ? 0 : (drain_end >= 0 ? 10 : -1);
		int n = epoll_wait(t->epfd, evs, TCP_EVENTS, timeout);

		if (n < 0 && errno != EINTR) {
			ferry_err("tcp: rank %u: epoll_wait: %s; the progress thread stops",
				  t->base.cfg.rank, strerror(errno));
			break;
		}
		if (busy && n == 0)
			sched_yield(); /* spin, but let runnable threads have the core */
		for (int i = 0; i < n; i++) {
			if (!evs[i].data.ptr)
				tcp_wake_input(t);
			else
				tcp_conn_event(t, evs[i].data.ptr, evs[i].events);
		}
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

	if (h->on_thread_stop)
		h->on_thread_stop(t->base.cfg.core);
	return NULL;
}

/* ---- init / fini -------------------------------------------------------- */

static int tcp_resolve(const char *host, struct in_addr *in)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	int ret;

	if (inet_pton(AF_INET, host, in) == 1)
		return 0;
	ret = getaddrinfo(host, NULL, &hints, &res);
	if (ret) {
		ferry_err("tcp: cannot resolve the bind address \"%s\" to IPv4: %s", host,
			  gai_strerror(ret));
		return -EADDRNOTAVAIL;
	}
	*in = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
	freeaddrinfo(res);
	return 0;
}

static int tcp_listen(struct tcp_tp *t)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t salen = sizeof(sa);
	int ret, fd;

	ret = tcp_resolve(t->bind, &sa.sin_addr);
	if (ret)
		return ret;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		ferry_err("tcp: socket: %s", strerror(errno));
		return ret;
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, SOMAXCONN) ||
	    getsockname(fd, (struct sockaddr *)&sa, &salen)) {
		ret = -errno;
		ferry_err("tcp: cannot listen on %s: %s; check that the address belongs to "
			  "this host",
			  t->bind, strerror(errno));
		close(fd);
		return ret;
	}
	tcp_sockaddr_str(&sa, t->addr, sizeof(t->addr));
	t->lfd = fd;
	return 0;
}

static int tcp_start_thread(struct tcp_tp *t)
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

static void tcp_conns_fini(struct tcp_tp *t, uint32_t n)
{
	for (uint32_t r = 0; r < n; r++) {
		struct tcp_conn *c = &t->conns[r];

		if (c->fd >= 0)
			close(c->fd);
		tcp_oq_free(c);
		free(c->rbuf);
		pthread_mutex_destroy(&c->lock);
	}
	free(t->conns);
	t->conns = NULL;
}

/*
 * tcp_init - listen, and start the progress thread
 *
 * Context: any thread; @tp is zeroed memory of tp_size bytes with ops set.
 * Return: 0, -EINVAL for a bad config, or the errno of what failed.
 */
static int tcp_init(struct ferry_tp *tp, const struct ferry_tp_config *cfg)
{
	struct tcp_tp *t = to_tcp(tp);
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	const char *bind_addr = cfg->bind_addr && *cfg->bind_addr ? cfg->bind_addr : "127.0.0.1";
	uint32_t r;
	int ret;

	if (!cfg->world || cfg->rank >= cfg->world || !cfg->handler || !cfg->handler->on_msg) {
		ferry_err("tcp: bad config: rank %u of world %u%s", cfg->rank, cfg->world,
			  cfg->handler && cfg->handler->on_msg ? "" : ", no on_msg handler");
		return -EINVAL;
	}
	if (strlen(bind_addr) >= sizeof(t->bind)) {
		ferry_err("tcp: the bind address \"%.40s...\" is too long", bind_addr);
		return -EINVAL;
	}
	tp->cfg = *cfg;
	strcpy(t->bind, bind_addr);
	tp->cfg.bind_addr = t->bind;
	t->lfd = t->epfd = t->wake_fd = -1;

	ret = tcp_listen(t);
	if (ret)
		return ret;

	t->conns = calloc(cfg->world, sizeof(*t->conns));
	if (!t->conns) {
		ret = -ENOMEM;
		goto err_close_listen;
	}
	for (r = 0; r < cfg->world; r++) {
		ret = -pthread_mutex_init(&t->conns[r].lock, NULL);
		if (ret)
			goto err_free_conns;
		t->conns[r].fd = -1;
		t->conns[r].rank = r;
	}
	ret = -pthread_mutex_init(&t->self_lock, NULL);
	if (ret)
		goto err_free_conns;

	t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->wake_fd < 0) {
		ret = -errno;
		ferry_err("tcp: eventfd: %s", strerror(errno));
		goto err_destroy_self_lock;
	}
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->epfd < 0) {
		ret = -errno;
		ferry_err("tcp: epoll_create1: %s", strerror(errno));
		goto err_close_wake;
	}
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_fd, &ev)) {
		ret = -errno;
		ferry_err("tcp: epoll_ctl: %s", strerror(errno));
		goto err_close_epoll;
	}
	ret = tcp_start_thread(t);
	if (ret)
		goto err_close_epoll;
	ferry_dbg("tcp: rank %u of %u listens on %s", cfg->rank, cfg->world, t->addr);
	return 0;

err_close_epoll:
	close(t->epfd);
err_close_wake:
	close(t->wake_fd);
err_destroy_self_lock:
	pthread_mutex_destroy(&t->self_lock);
err_free_conns:
	tcp_conns_fini(t, r);
err_close_listen:
	close(t->lfd);
	return ret;
}

/*
 * tcp_fini - stop the progress thread and free everything but @tp itself
 *
 * Flushes queued frames for at most TCP_DRAIN_MS first. No handler runs
 * after it returns. Context: not concurrently with any other op of @tp.
 */
static void tcp_fini(struct ferry_tp *tp)
{
	struct tcp_tp *t = to_tcp(tp);
	struct tcp_selfmsg *m, *next;

	ferry__tp_send_bye(tp); /* queued, flushed while draining */
	__atomic_store_n(&t->closing, 1, __ATOMIC_RELEASE);
	tcp_wake(t);
	pthread_join(t->thread, NULL);

	tcp_conns_fini(t, t->base.cfg.world);
	for (m = t->self_head; m; m = next) {
		next = m->next;
		free(m);
	}
	t->self_head = t->self_tail = NULL;
	pthread_mutex_destroy(&t->self_lock);
	close(t->epfd);
	close(t->wake_fd);
	if (t->lfd >= 0)
		close(t->lfd);
}

static int tcp_addr_get(struct ferry_tp *tp, void *buf, size_t *len)
{
	struct tcp_tp *t = to_tcp(tp);
	size_t n = strlen(t->addr);

	if (*len < n) {
		*len = n;
		return -ENOSPC;
	}
	memcpy(buf, t->addr, n);
	*len = n;
	return 0;
}

/* ---- connection setup --------------------------------------------------- */

/* a connection in its HELLO exchange */
struct tcp_hs {
	int fd;		/* -1: none */
	int connecting; /* our non-blocking connect() is in flight */
	size_t out_off;
	size_t in_off;
	unsigned char in[TCP_HELLO_LEN];
	char who[64]; /* the peer's ip:port, for the log */
};

/* the state of our dials to one lower rank */
struct tcp_dial {
	struct sockaddr_in sa;
	char where[64];
	struct tcp_hs hs;
	int64_t next_ms; /* earliest time of the next attempt */
	int backoff_ms;
	int last_err;  /* errno of the last failed attempt, 0 when none */
	char why[160]; /* or why its HELLO was refused */
	int logged;    /* a refused HELLO was logged */
};

struct tcp_setup {
	struct tcp_tp *t;
	uint32_t rank, world;
	int *fds; /* established, per rank; -1 while missing */
	uint32_t missing;
	struct tcp_dial *dials; /* ranks [0, rank) */
	struct tcp_hs acc[TCP_MAX_HANDSHAKES];
	unsigned char hello[TCP_HELLO_LEN];
	int64_t deadline;
	int full_logged; /* "too many handshakes" was logged */
};

static void tcp_hs_close(struct tcp_hs *hs)
{
	if (hs->fd >= 0)
		close(hs->fd);
	hs->fd = -1;
}

static void tcp_dial_retry(struct tcp_dial *d, int err)
{
	tcp_hs_close(&d->hs);
	if (err)
		d->last_err = err;
	d->next_ms = tcp_now_ms() + d->backoff_ms;
	d->backoff_ms = d->backoff_ms * 2 > TCP_RETRY_MAX_MS ? TCP_RETRY_MAX_MS : d->backoff_ms * 2;
}

static void tcp_dial_start(struct tcp_dial *d)
{
	struct tcp_hs *hs = &d->hs;
	int fd;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		tcp_dial_retry(d, errno);
		return;
	}
	tcp_set_nodelay(fd);
	memset(hs, 0, sizeof(*hs));
	hs->fd = fd;
	snprintf(hs->who, sizeof(hs->who), "%s", d->where);
	if (!connect(fd, (struct sockaddr *)&d->sa, sizeof(d->sa)))
		return;
	if (errno == EINPROGRESS || errno == EINTR) {
		hs->connecting = 1;
		return;
	}
	tcp_dial_retry(d, errno);
}

/*
 * tcp_hs_step - move a HELLO exchange on
 *
 * Return: 1 when our HELLO is out and the peer's is in, 0 while it goes on,
 * -ENODATA when the peer closed before its HELLO was complete, or the
 * negative errno of a socket error.
 */
static int tcp_hs_step(struct tcp_setup *s, struct tcp_hs *hs)
{
	ssize_t n;

	if (hs->connecting) {
		int err = 0;
		socklen_t elen = sizeof(err);

		if (getsockopt(hs->fd, SOL_SOCKET, SO_ERROR, &err, &elen))
			return -errno;
		if (err)
			return -err;
		hs->connecting = 0;
	}
	while (hs->out_off < TCP_HELLO_LEN) {
		n = send(hs->fd, s->hello + hs->out_off, TCP_HELLO_LEN - hs->out_off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			return -errno;
		}
		hs->out_off += n;
	}
	/* exactly the HELLO: frames that follow it stay in the socket for the progress thread */
	while (hs->in_off < TCP_HELLO_LEN) {
		n = recv(hs->fd, hs->in + hs->in_off, TCP_HELLO_LEN - hs->in_off, 0);
		if (n == 0)
			return -ENODATA;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -errno;
		}
		hs->in_off += n;
	}
	return hs->out_off == TCP_HELLO_LEN;
}

/*
 * tcp_hello_check - is the peer's HELLO one of our cluster?
 * @dialed: the rank we dialed, or -1 for a connection we accepted
 *
 * Return: the peer's rank, or -1 with @why (of @len bytes) saying what is wrong.
 */
static int tcp_hello_check(struct tcp_setup *s, const struct tcp_hs *hs, int dialed, char *why,
			   size_t len)
{
	const struct ferry_tp_config *cfg = &s->t->base.cfg;
	int peer = ferry__proto_check_hello(hs->in, TCP_HELLO_LEN, cfg->cluster_id, s->world,
					    s->rank, dialed, why, len);

	if (peer < 0)
		return -1;
	if (s->fds[peer] >= 0) {
		snprintf(why, len, "rank %d is already connected", peer);
		return -1;
	}
	return peer;
}

static void tcp_setup_accept(struct tcp_setup *s)
{
	for (;;) {
		struct sockaddr_in sa;
		socklen_t salen = sizeof(sa);
		struct tcp_hs *hs = NULL;
		int fd;

		fd = accept4(s->t->lfd, (struct sockaddr *)&sa, &salen,
			     SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				ferry_warn("tcp: rank %u: accept: %s", s->rank, strerror(errno));
			return;
		}
		for (int i = 0; i < TCP_MAX_HANDSHAKES && !hs; i++)
			if (s->acc[i].fd < 0)
				hs = &s->acc[i];
		if (!hs) {
			if (!s->full_logged++)
				ferry_warn(
					"tcp: rank %u: %d connections are in their HELLO already; "
					"closing new ones",
					s->rank, TCP_MAX_HANDSHAKES);
			close(fd);
			continue;
		}
		tcp_set_nodelay(fd);
		memset(hs, 0, sizeof(*hs));
		hs->fd = fd;
		tcp_sockaddr_str(&sa, hs->who, sizeof(hs->who));
	}
}

/* an accepted connection is readable or writable */
static void tcp_setup_acc_step(struct tcp_setup *s, struct tcp_hs *hs)
{
	char why[160];
	int ret, peer;

	ret = tcp_hs_step(s, hs);
	if (!ret)
		return;
	if (ret < 0) {
		ferry_warn("tcp: rank %u rejected a connection from %s: %s", s->rank, hs->who,
			   ret == -ENODATA ? "it closed before its HELLO" : strerror(-ret));
		tcp_hs_close(hs);
		return;
	}
	peer = tcp_hello_check(s, hs, -1, why, sizeof(why));
	if (peer < 0) {
		ferry_warn("tcp: rank %u rejected a connection from %s: %s", s->rank, hs->who, why);
		tcp_hs_close(hs);
		return;
	}
	ferry_dbg("tcp: rank %u accepted rank %d from %s", s->rank, peer, hs->who);
	s->fds[peer] = hs->fd;
	s->missing--;
	hs->fd = -1;
}

/* a connection we dialed to rank @j is readable or writable */
static void tcp_setup_dial_step(struct tcp_setup *s, uint32_t j)
{
	struct tcp_dial *d = &s->dials[j];
	int ret, peer;

	ret = tcp_hs_step(s, &d->hs);
	if (!ret)
		return;
	if (ret < 0) {
		/* refused (not listening yet), or it closed on us: try again */
		if (ret == -ENODATA)
			snprintf(d->why, sizeof(d->why),
				 "it closed the connection before its HELLO");
		else
			d->why[0] = '\0';
		ferry_dbg("tcp: rank %u: dialing rank %u at %s: %s", s->rank, j, d->where,
			  ret == -ENODATA ? d->why : strerror(-ret));
		tcp_dial_retry(d, ret == -ENODATA ? 0 : -ret);
		return;
	}
	peer = tcp_hello_check(s, &d->hs, (int)j, d->why, sizeof(d->why));
	if (peer < 0) {
		if (!d->logged++)
			ferry_warn(
				"tcp: rank %u: the node at %s, dialed as rank %u, is refused: %s",
				s->rank, d->where, j, d->why);
		tcp_dial_retry(d, 0);
		return;
	}
	ferry_dbg("tcp: rank %u connected to rank %u at %s", s->rank, j, d->where);
	s->fds[j] = d->hs.fd;
	s->missing--;
	d->hs.fd = -1;
}

/* log, once, the ranks that never connected and what we know of why */
static void tcp_setup_timeout(struct tcp_setup *s, int timeout_ms)
{
	char list[512], hint[384];
	size_t off = 0, hoff = 0;
	uint32_t listed = 0;

	list[0] = hint[0] = '\0';
	for (uint32_t r = 0; r < s->world; r++) {
		if (r == s->rank || s->fds[r] >= 0)
			continue;
		if (listed++ < 16 && off < sizeof(list))
			off += snprintf(list + off, sizeof(list) - off, "%s%u",
					listed > 1 ? ", " : "", r);
		if (r < s->rank && hoff < sizeof(hint)) {
			struct tcp_dial *d = &s->dials[r];

			hoff += snprintf(hint + hoff, sizeof(hint) - hoff, "; rank %u at %s: %s", r,
					 d->where,
					 d->why[0]   ? d->why :
					 d->last_err ? strerror(d->last_err) :
						       "no answer");
		}
	}
	if (listed > 16 && off < sizeof(list))
		snprintf(list + off, sizeof(list) - off, " and %u more", listed - 16);
	ferry_err("tcp: rank %u timed out after %d ms waiting for rank%s %s to connect; check "
		  "that they started and can reach %s%s",
		  s->rank, timeout_ms, listed > 1 ? "s" : "", list, s->t->addr, hint);
}

/* the sockets go to the progress thread. Return: 0 or a negative errno. */
static int tcp_setup_publish(struct tcp_setup *s)
{
	struct tcp_tp *t = s->t;

	for (uint32_t r = 0; r < s->world; r++) {
		struct tcp_conn *c = &t->conns[r];
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = c };
		int ret = 0;

		if (r == s->rank)
			continue;
		pthread_mutex_lock(&c->lock);
		c->fd = s->fds[r];
		s->fds[r] = -1;
		c->state = TCP_CONN_UP;
		if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, c->fd, &ev))
			ret = -errno;
		pthread_mutex_unlock(&c->lock);
		if (ret) {
			/* fini() closes what was handed over */
			ferry_err("tcp: rank %u: epoll_ctl: %s", s->rank, strerror(-ret));
			return ret;
		}
	}
	return 0;
}

/*
 * tcp_connect - connect to every peer
 *
 * Blocks the calling thread for at most cfg.timeout_ms. Context: once per
 * transport, after init(), before any send() to a peer. The HELLO carries
 * tp->cfg.cluster_id as it is now: the core learns the id in the bootstrap,
 * after init(), and stores it there before calling connect().
 * Return: 0; -ETIMEDOUT (the log names the ranks that never connected);
 * -EINVAL for an address blob that is not ours; -EALREADY when called twice.
 */
static int tcp_connect(struct ferry_tp *tp, const void *const *addrs, const size_t *lens)
{
	struct tcp_tp *t = to_tcp(tp);
	const struct ferry_tp_config *cfg = &tp->cfg;
	struct pollfd *pfds = NULL;
	int *owner = NULL; /* per pollfd: the rank dialed, or -1 - index in acc[] */
	struct tcp_setup *s;
	struct ferry_msg_hdr hdr = {
		.magic = FERRY_MSG_MAGIC,
		.version = FERRY_PROTO_VERSION,
		.type = FERRY_MSG_HELLO,
		.len = TCP_HELLO_LEN,
		.src = cfg->rank,
	};
	struct ferry_msg_hello hello = {
		.cluster_id = cfg->cluster_id,
		.rank = cfg->rank,
		.world = cfg->world,
	};
	int timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30000;
	int ret = 0;
	uint32_t r;

	if (t->connected)
		return -EALREADY;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->t = t;
	s->rank = cfg->rank;
	s->world = cfg->world;
	s->missing = cfg->world - 1;
	s->deadline = tcp_now_ms() + timeout_ms;
	memcpy(s->hello, &hdr, sizeof(hdr));
	memcpy(s->hello + sizeof(hdr), &hello, sizeof(hello));
	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++)
		s->acc[i].fd = -1;

	s->fds = malloc(cfg->world * sizeof(*s->fds));
	s->dials = calloc(cfg->rank ? cfg->rank : 1, sizeof(*s->dials));
	pfds = calloc(1 + cfg->rank + TCP_MAX_HANDSHAKES, sizeof(*pfds));
	owner = calloc(1 + cfg->rank + TCP_MAX_HANDSHAKES, sizeof(*owner));
	if (!s->fds || !s->dials || !pfds || !owner) {
		ret = -ENOMEM;
		goto out_free;
	}
	for (r = 0; r < cfg->world; r++)
		s->fds[r] = -1;
	for (r = 0; r < cfg->rank; r++) {
		struct tcp_dial *d = &s->dials[r];

		d->hs.fd = -1;
		d->backoff_ms = TCP_RETRY_MIN_MS;
		if (ferry__tp_parse_ipv4(addrs[r], lens[r], &d->sa)) {
			ferry_err("tcp: rank %u: the address of rank %u is not an \"ip:port\" of "
				  "the tcp transport; do all nodes use the same transport?",
				  cfg->rank, r);
			ret = -EINVAL;
			goto out_close;
		}
		tcp_sockaddr_str(&d->sa, d->where, sizeof(d->where));
	}

	while (s->missing) {
		int64_t now = tcp_now_ms(), wake = s->deadline;
		nfds_t n = 0;
		int nready;

		if (now >= s->deadline) {
			tcp_setup_timeout(s, timeout_ms);
			ret = -ETIMEDOUT;
			goto out_close;
		}
		pfds[n] = (struct pollfd){ .fd = t->lfd, .events = POLLIN };
		n++;
		for (r = 0; r < cfg->rank; r++) {
			struct tcp_dial *d = &s->dials[r];

			if (s->fds[r] >= 0)
				continue;
			if (d->hs.fd < 0 && now >= d->next_ms)
				tcp_dial_start(d);
			if (d->hs.fd < 0) {
				if (d->next_ms < wake)
					wake = d->next_ms;
				continue;
			}
			pfds[n] = (struct pollfd){
				.fd = d->hs.fd,
				.events = d->hs.connecting ?
						  POLLOUT :
						  POLLIN |
							  (d->hs.out_off < TCP_HELLO_LEN ? POLLOUT :
											   0),
			};
			owner[n++] = (int)r;
		}
		for (int i = 0; i < TCP_MAX_HANDSHAKES; i++) {
			struct tcp_hs *hs = &s->acc[i];

			if (hs->fd < 0)
				continue;
			pfds[n] = (struct pollfd){
				.fd = hs->fd,
				.events = POLLIN | (hs->out_off < TCP_HELLO_LEN ? POLLOUT : 0),
			};
			owner[n++] = -1 - i;
		}

		nready = poll(pfds, n, (int)(wake > now ? wake - now : 0));
		if (nready < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			ferry_err("tcp: rank %u: poll: %s", cfg->rank, strerror(errno));
			goto out_close;
		}
		if (!nready)
			continue;

		for (nfds_t i = 1; i < n; i++) {
			if (!pfds[i].revents)
				continue;
			if (owner[i] >= 0)
				tcp_setup_dial_step(s, (uint32_t)owner[i]);
			else
				tcp_setup_acc_step(s, &s->acc[-1 - owner[i]]);
		}
		if (pfds[0].revents)
			tcp_setup_accept(s);
	}

	ret = tcp_setup_publish(s);
	if (ret)
		goto out_close;
	t->connected = 1;
	close(t->lfd);
	t->lfd = -1;
	ferry_dbg("tcp: rank %u is connected to all %u peers", cfg->rank, cfg->world - 1);

out_close:
	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++) {
		if (s->acc[i].fd >= 0 && !ret)
			ferry_info("tcp: rank %u: closing a connection from %s that had not "
				   "finished its HELLO",
				   cfg->rank, s->acc[i].who);
		tcp_hs_close(&s->acc[i]);
	}
	for (r = 0; r < cfg->rank; r++)
		tcp_hs_close(&s->dials[r].hs);
	for (r = 0; r < cfg->world; r++)
		if (s->fds[r] >= 0)
			close(s->fds[r]);
out_free:
	free(owner);
	free(pfds);
	free(s->dials);
	free(s->fds);
	free(s);
	return ret;
}

/* ---- sending ------------------------------------------------------------ */

/* Context: any thread. */
static int tcp_self_send(struct tcp_tp *t, const struct iovec *iov, int iovcnt, size_t total)
{
	struct tcp_selfmsg *m = malloc(sizeof(*m) + total);
	size_t off = 0;
	int was_empty;

	if (!m)
		return -ENOMEM;
	for (int i = 0; i < iovcnt; i++) {
		memcpy(m->data + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	m->next = NULL;
	m->len = total;

	pthread_mutex_lock(&t->self_lock);
	was_empty = !t->self_head;
	if (t->self_tail)
		t->self_tail->next = m;
	else
		t->self_head = m;
	t->self_tail = m;
	pthread_mutex_unlock(&t->self_lock);

	/* a non-empty queue has a wake pending already (see tcp_self_deliver) */
	if (was_empty)
		tcp_wake(t);
	return 0;
}

/*
 * tcp_send - queue one frame to @dst
 *
 * Context: any thread, concurrently with other sends and with the progress
 * thread (handlers may send); not after fini(). Never blocks on the network.
 * The iovec's memory is the caller's again when it returns.
 * Return: 0; -EINVAL (bad dst or iovcnt, or a header that fails
 * ferry__proto_check_hdr() or whose len is not the iovec's total);
 * -ENOTCONN before connect() succeeded; -FERRY_E_PEER when @dst failed;
 * -ENOMEM.
 */
static int tcp_send(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt)
{
	struct tcp_tp *t = to_tcp(tp);
	struct msghdr mh = { .msg_iov = (struct iovec *)iov, .msg_iovlen = iovcnt };
	struct tcp_conn *c;
	size_t total, sent = 0;
	int ret = 0, wake = 0;
	ssize_t n;

	if (dst >= tp->cfg.world || iovcnt <= 0 || iovcnt > IOV_MAX)
		return -EINVAL;
	if (ferry__tp_check_frame(&t->base, dst, iov, iovcnt, &total))
		return -EINVAL;
	if (dst == tp->cfg.rank)
		return tcp_self_send(t, iov, iovcnt, total);

	c = &t->conns[dst];
	pthread_mutex_lock(&c->lock);
	if (c->state != TCP_CONN_UP) {
		ret = c->state == TCP_CONN_IDLE ? -ENOTCONN : -FERRY_E_PEER;
		goto out_unlock;
	}
	if (!c->oq_head) {
		do {
			n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		} while (n < 0 && errno == EINTR);
		if (n == (ssize_t)total)
			goto out_unlock;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
			/* the progress thread logs it, closes, and reports the peer */
			c->state = TCP_CONN_BROKEN;
			c->send_err = errno;
			__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
			wake = 1;
			ret = -FERRY_E_PEER;
			goto out_unlock;
		}
		sent = n > 0 ? (size_t)n : 0;
	}
	ret = tcp_oq_append(c, iov, iovcnt, sent, total);
	if (ret) {
		if (sent) {
			/* half a frame is on the wire: the stream cannot go on */
			c->state = TCP_CONN_BROKEN;
			c->send_err = ENOMEM;
			__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
			wake = 1;
		}
		goto out_unlock;
	}
	ret = tcp_conn_arm(t, c, 1);
	if (ret) {
		/* queued but never flushed: treat the connection as broken */
		c->state = TCP_CONN_BROKEN;
		c->send_err = -ret;
		__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
		wake = 1;
		ret = -FERRY_E_PEER;
	}
out_unlock:
	pthread_mutex_unlock(&c->lock);
	if (wake)
		tcp_wake(t);
	return ret;
}

const struct ferry_tp_ops ferry__tcp_ops = {
	.size = sizeof(struct ferry_tp_ops),
	.name = "tcp",
	.caps = 0,
	.tp_size = sizeof(struct tcp_tp),
	.mr_size = sizeof(struct ferry_tp_mr),
	.init = tcp_init,
	.addr_get = tcp_addr_get,
	.connect = tcp_connect,
	.send = tcp_send,
	.fini = tcp_fini,
};

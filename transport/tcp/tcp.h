/* SPDX-License-Identifier: MIT */
/*
 * tcp.h - the TCP transport's private header: one connection per pair of
 * nodes, Ferry frames on the byte stream, one epoll progress thread per
 * transport instance. Never included by the core; transport/loop/ uses the
 * transport only through ferry__tcp_ops.
 *
 * One room per concern, each saying at its top which threads run its code:
 *
 *   tcp.c       the ops table; init, fini, addr_get     the caller's thread
 *   conn.c      listening socket, dial, accept, HELLO,  the caller's thread
 *               ops->connect
 *   send.c      ops->send, the out queues               any thread; flush on
 *                                                       the progress thread
 *   recv.c      receiving, framing, failures            progress thread
 *   progress.c  the epoll loop, its start, its wake-up  progress thread;
 *                                                       ferry__tcp_wake any thread
 *
 * The functions declared below are the ones another file of the transport
 * calls; everything else stays static in its own file. The library is built
 * with -fvisibility=hidden, so none of these names leaves it.
 *
 * Every .c file of the transport defines _GNU_SOURCE before its first include
 * (accept4, pthread_setname_np, IOV_MAX, NI_MAXHOST).
 */
#ifndef FERRY_TRANSPORT_TCP_TCP_H
#define FERRY_TRANSPORT_TCP_TCP_H

#include <netdb.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

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
	size_t oq_bytes;	   /* queued, not yet written (lock) */
	pthread_cond_t oq_drained; /* oq_bytes fell below FERRY_TP_SENDQ_MAX / 2 */

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

static inline int64_t tcp_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- progress.c --------------------------------------------------------- */

/* start the progress thread, all signals blocked. Context: init(). */
int ferry__tcp_start_thread(struct tcp_tp *t);
/* Context: any thread. Wakes the progress thread out of epoll_wait(). */
void ferry__tcp_wake(struct tcp_tp *t);

/* ---- conn.c ------------------------------------------------------------- */

/* open the listening socket on t->bind and set t->addr. Context: init(). */
int ferry__tcp_listen(struct tcp_tp *t);
/* ops->connect */
int ferry__tcp_connect(struct ferry_tp *tp, const void *const *addrs, const size_t *lens);

/* ---- send.c ------------------------------------------------------------- */

/* free the out queue. Call with c->lock held, or once no other thread runs. */
void ferry__tcp_oq_free(struct tcp_conn *c);
/* Context: progress thread; takes c->lock. */
int ferry__tcp_conn_flush(struct tcp_tp *t, struct tcp_conn *c);
/* ops->send: any thread */
int ferry__tcp_send(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt);
/* the core dropped @dst: close its connection soon; progress thread */
void ferry__tcp_drop(struct ferry_tp *tp, uint32_t dst);

/* ---- recv.c: progress thread only --------------------------------------- */

/* close @c and report its rank failed, once; the caller logged the cause */
void ferry__tcp_conn_fail(struct tcp_tp *t, struct tcp_conn *c, int err);
/* log and fail the connections senders marked BROKEN */
void ferry__tcp_fail_broken(struct tcp_tp *t);
/* read what @c's socket has and deliver its complete frames */
void ferry__tcp_conn_input(struct tcp_tp *t, struct tcp_conn *c);
/* deliver the frames queued to our own rank */
void ferry__tcp_self_deliver(struct tcp_tp *t);

#endif /* FERRY_TRANSPORT_TCP_TCP_H */

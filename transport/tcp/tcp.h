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
 *   session.c   lost links: redial, probe, accept again, progress thread
 *               resume; acks; fault injection
 *   progress.c  the epoll loop, its start, its wake-up  progress thread;
 *                                                       ferry__tcp_wake any thread
 *   mem.c       the buffers' memory: log chunks,        where their users run;
 *               receive buffers, the trim that          the trim on the
 *               returns them after a burst              progress thread
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
#include <netinet/in.h>
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
#define TCP_RESUME_LEN (sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_resume))
#define TCP_HS_LEN (TCP_HELLO_LEN + TCP_RESUME_LEN) /* a handshake: HELLO, then RESUME */
#define TCP_ACK_LEN (sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_ack))
#define TCP_RBUF_SIZE (256u << 10) /* receive buffer of a connection */
#define TCP_RBUF_KEEP (4u << 20)   /* an emptied buffer above this is freed */
#define TCP_TRIM_MS 100		   /* the buffers' trim window (mem.c) */
#define TCP_TRIM_HEAP (256u << 10) /* a trim that frees this much trims malloc's heap */
#define TCP_READ_MIN (16u << 10)   /* compact when less room is left */
#define TCP_READS_PER_EVENT 16	   /* then let the other connections in */
#define TCP_CHUNK_SIZE (64u << 10) /* least capacity of a send log chunk */
#define TCP_SPARE_MAX (4u << 20)   /* freed chunks up to this much are kept for reuse */
#define TCP_FLUSH_IOV 64	   /* chunks per gathered write */
#define TCP_EVENTS 64		   /* epoll events per wait */
#define TCP_MAX_HANDSHAKES 64	   /* accepted connections in their HELLO at once */
#define TCP_HS_PER_SOURCE 32	   /* of them, from one address; past a bound the oldest goes */
#define TCP_DRAIN_MS 1000	   /* fini: bound on flushing the out queues */
#define TCP_RETRY_MIN_MS 10	   /* backoff between dials of a refused rank */
#define TCP_RETRY_MAX_MS 250
#define TCP_RECONNECT_MS 1000	 /* FERRY_RECONNECT_MS default: grace of a lost link */
#define TCP_REDIAL_MAX_MS 100	 /* backoff cap between redials of a lost link */
#define TCP_PROBE_MS 50		 /* the accepting end looks for the peer's listener */
#define TCP_HS_MS 1000		 /* an accepted connection's handshake, at most */
#define TCP_ACK_FRAMES 1024	 /* acknowledge after this many frames, */
#define TCP_ACK_BYTES (1u << 20) /* or bytes, */
#define TCP_ACK_DELAY_MS 10	 /* or this long after the first */

_Static_assert(sizeof(struct ferry_msg_hdr) == 16, "the wire header is 16 bytes");
_Static_assert(sizeof(struct ferry_msg_hello) == 16, "the HELLO body is 16 bytes");
_Static_assert(sizeof(struct ferry_msg_resume) == 24, "the RESUME body is 24 bytes");
_Static_assert(TCP_ACK_BYTES < FERRY_TP_SENDQ_MAX / 2, "acks come before a sender waits");

/* what an epoll event's data.ptr points to: its first member says */
enum tcp_ev {
	TCP_EV_CONN = 1, /* struct tcp_conn: an established connection */
	TCP_EV_LISTEN,	 /* tcp_tp.lfd_ev: the listening socket, after connect() */
	TCP_EV_LINK,	 /* struct tcp_link: a redial or a probe of a lost link */
	TCP_EV_ACC,	 /* struct tcp_acc: an accepted connection in its handshake */
};

enum tcp_conn_state {
	TCP_CONN_IDLE,	 /* connect() has not handed it over yet */
	TCP_CONN_UP,	 /* established, in the epoll set */
	TCP_CONN_DOWN,	 /* the link was lost, the session lives: frames wait in the log */
	TCP_CONN_BROKEN, /* a sender hit a socket error (or the core dropped the peer:
			    send_err ECONNABORTED); the progress thread takes it on */
	TCP_CONN_FAILED, /* closed for good; on_peer_failed() was called */
};

/*
 * A piece of the send log: whole frames back to back in data[0, len) (a
 * frame never spans chunks). One malloc of sizeof(struct tcp_chunk) + cap
 * bytes, a multiple of TCP_CHUNK_SIZE (mem.c). seq0 is the number the first sequenced frame
 * appended to it got (or would have got), seq_end the number of its last
 * one (seq0 - 1 when it holds none, only ACKs).
 */
struct tcp_chunk {
	struct tcp_chunk *next;
	size_t len;
	size_t cap;
	uint64_t seq0;
	uint64_t seq_end;
	unsigned char data[];
};

/* a redial (the higher rank) or a probe (the lower rank) of a lost link */
struct tcp_link {
	int ev; /* TCP_EV_LINK */
	struct tcp_conn *c;
	int fd;		/* -1: none in flight */
	int connecting; /* the non-blocking connect() is in flight */
	size_t out_off, in_off;
	unsigned char out[TCP_HS_LEN]; /* our HELLO and RESUME (dials) */
	unsigned char in[TCP_HS_LEN];  /* the peer's */
	int authed;		       /* the token proof is through (or there is no token) */
	struct ferry_auth_hs auth;
	int64_t next_ms; /* earliest time of the next attempt */
	int backoff_ms;
};

struct tcp_conn {
	int ev; /* TCP_EV_CONN: first, for the epoll dispatch */
	/*
	 * lock guards fd (writes), state, send_err, out_armed, the send log
	 * and its counters. Senders take it around their append and
	 * sendmsg(); the progress thread takes it to flush, acknowledge,
	 * resume and fail, and never holds it across a handler.
	 */
	pthread_mutex_t lock;
	int fd; /* -1 when there is none; the progress thread reads it unlocked */
	enum tcp_conn_state state;
	int send_err;  /* BROKEN: the errno a sender saw */
	int out_armed; /* EPOLLOUT is in the connection's epoll events */
	/*
	 * The send log: every frame to the peer, appended whole, written from
	 * (snd, snd_off), kept after it was written until the peer
	 * acknowledges it, so that a lost link loses nothing. Bound:
	 * oq_bytes <= FERRY_TP_SENDQ_MAX + one frame for senders other than
	 * the progress thread (they wait for room); the receiver acknowledges
	 * every TCP_ACK_BYTES, TCP_ACK_FRAMES or TCP_ACK_DELAY_MS.
	 */
	struct tcp_chunk *oq_head;
	struct tcp_chunk *oq_tail;
	struct tcp_chunk *snd;	   /* the next byte to write; NULL: all written */
	size_t snd_off;		   /* < snd->len */
	size_t oq_bytes;	   /* in the log: unwritten and unacknowledged */
	struct tcp_chunk *spare;   /* acknowledged chunks kept for reuse, */
	size_t spare_bytes;	   /* of capacities <= TCP_SPARE_MAX in all */
	size_t oq_held;		   /* capacities of the log's chunks */
	size_t held_peak;	   /* the most oq_held since the last trim (mem.c) */
	uint64_t tx_seq;	   /* sequenced frames appended: the last one's number */
	uint64_t tx_acked;	   /* of them, acknowledged by the peer */
	pthread_cond_t oq_drained; /* oq_bytes fell below FERRY_TP_SENDQ_MAX / 2 */

	/* set in init and connect(), read-only afterwards */
	uint32_t rank;
	struct sockaddr_in sa; /* the peer's listening address */
	int have_sa;	       /* sa was given (a probe or redial can reach it) */
	uint64_t peer_inc;     /* the incarnation the peer began the session with */

	/* progress thread only */
	int reported;	     /* on_peer_failed() was called */
	int bye;	     /* the peer said FERRY_MSG_BYE: its close is a departure */
	unsigned char *rbuf; /* a mapping of rcap bytes (mem.c) */
	size_t rcap;
	size_t rhead;
	size_t rtail;
	size_t rneed;	      /* length of the frame at rhead once its header is in; 0 before */
	size_t rtouched;      /* rbuf's bytes written since its pages were last dropped
			       * (atomic: ferry__tcp_mem_held reads it) */
	size_t rbig;	      /* the largest frame received since the last trim */
	uint64_t rx_seq;      /* sequenced frames of the peer delivered to on_msg() */
	uint64_t rx_acked;    /* the count our last ACK or RESUME told the peer */
	size_t rx_unacked;    /* bytes delivered since */
	int64_t ack_due;      /* an ACK goes at this time; 0: none pending */
	int64_t down_since;   /* DOWN: when the link was lost, */
	int64_t down_until;   /* and when the peer is declared failed */
	struct tcp_link link; /* DOWN: the redial or probe */
};

/* an accepted connection in its handshake (progress thread) */
struct tcp_acc {
	int ev;		 /* TCP_EV_ACC */
	int fd;		 /* -1: free slot */
	int64_t until;	 /* closed at this time if not through (TCP_HS_MS) */
	uint32_t source; /* the peer's IPv4 address: TCP_HS_PER_SOURCE */
	int authed;	 /* the token proof is through (or there is no token) */
	struct ferry_auth_hs auth;
	size_t in_off;
	unsigned char in[TCP_HS_LEN];
	char who[64];
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
	int lfd;	       /* listening socket, open until fini (peers redial) */
	int lfd_ev;	       /* TCP_EV_LISTEN: lfd's epoll data points here */
	int epfd;
	int wake_fd; /* eventfd: self queue, broken connections, stop */
	pthread_t thread;
	struct tcp_conn *conns; /* one per rank; ours unused */
	int connected;		/* connect() succeeded; caller's thread only */

	pthread_mutex_t self_lock; /* guards self_head, self_tail */
	struct tcp_selfmsg *self_head;
	struct tcp_selfmsg *self_tail;

	/*
	 * The engine: whoever holds it runs the handlers, the sessions and the
	 * timers (what "progress thread" says below: the progress thread, or a
	 * waiting worker inside ferry__tcp_poll); one holder at a time, so
	 * every handler still runs one call at a time. The progress thread
	 * drops it only around epoll_wait().
	 */
	pthread_mutex_t engine;
	int worker_poll; /* FERRY_TCP_WORKER_POLL=1: waiting workers poll (set in init) */
	/* poll(FERRY_TP_POLL_HOLD): threads spinning on poll() now, and until
	 * when (ms) the progress thread stands aside after the last one
	 * stopped; it then sleeps on park_epfd (the wake eventfd alone) */
	int spinners;	    /* atomic */
	int64_t park_until; /* atomic */
	int park_epfd;
	int closing;	  /* atomic: fini() asked the progress thread to stop */
	int fail_pending; /* atomic: some connection is BROKEN */

	/* set in init, read-only afterwards */
	uint64_t incarnation; /* random: a redial proves it is the same process */
	int reconnect_ms;     /* FERRY_RECONNECT_MS: grace of a lost link; 0: none */
	int fault_ms;	      /* FERRY_TCP_FAULT_RESET_MS: tests; 0: off */

	/* progress thread only */
	struct tcp_acc acc[TCP_MAX_HANDSHAKES]; /* bound: TCP_MAX_HANDSHAKES, each TCP_HS_MS */
	int acc_full_logged;
	int64_t timer_ms;   /* the earliest timer (acks, redials, deadlines); 0: none */
	int64_t trim_ms;    /* the next trim of the buffers (mem.c); 0: none armed */
	int64_t fault_next; /* the next injected reset */
	uint64_t fault_rand;
	unsigned long resumed; /* sessions resumed (the log says each) */
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
/* ops->poll: a waiting worker takes what arrived, when the engine is free */
int ferry__tcp_poll(struct ferry_tp *tp, unsigned flags);
/* the calling thread holds @t's engine (it must not wait for room) */
int ferry__tcp_engine_held(const struct tcp_tp *t);

/* ---- mem.c -------------------------------------------------------------- */

/* a send log chunk with room for @total bytes, or NULL (no memory); the
 * capacity it gets. Any thread. */
struct tcp_chunk *ferry__tcp_chunk_new(size_t total);
size_t ferry__tcp_chunk_cap(size_t total);
void ferry__tcp_chunk_free(struct tcp_chunk *ch);
/* grow @c's receive buffer to @want bytes (rounded up to pages), keeping its
 * bytes. Progress thread. Return: 0 or -ENOMEM. */
int ferry__tcp_rbuf_resize(struct tcp_conn *c, size_t want);
/* free @c's receive buffer. Progress thread, or once no other thread runs. */
void ferry__tcp_rbuf_free(struct tcp_conn *c);
/* something may be trimmed: make sure a trim runs within TCP_TRIM_MS. Progress thread. */
void ferry__tcp_trim_arm(struct tcp_tp *t);
/* the timer: trim every connection. Return: 1 while something is left to trim. */
int ferry__tcp_trim(struct tcp_tp *t);
/* ops->mem_held: bytes the buffers of every connection hold now. Any thread. */
size_t ferry__tcp_mem_held(struct ferry_tp *tp);

/* ---- conn.c ------------------------------------------------------------- */

/* open the listening socket on t->bind and set t->addr. Context: init(). */
int ferry__tcp_listen(struct tcp_tp *t);
/* ops->connect */
int ferry__tcp_connect(struct ferry_tp *tp, const void *const *addrs, const size_t *lens);

/* Context: any thread. */
void ferry__tcp_set_nodelay(int fd);
void ferry__tcp_sockaddr_str(const struct sockaddr_in *sa, char *buf, size_t len);

/* ---- send.c ------------------------------------------------------------- */

/* free the send log. Call with c->lock held, or once no other thread runs. */
void ferry__tcp_oq_free(struct tcp_conn *c);
/* Context: progress thread; takes c->lock. Return: 0 or a socket error. */
int ferry__tcp_conn_flush(struct tcp_tp *t, struct tcp_conn *c);
/* drop the chunks the peer has acknowledged and that are written (an ACK
 * went into the tail after the last ACK came); c->lock held */
void ferry__tcp_log_forget(struct tcp_conn *c);
/* the peer has delivered @n frames: forget them (n <= tx_seq). c->lock held. */
void ferry__tcp_log_ack(struct tcp_conn *c, uint64_t n);
/* resume after the peer's @n delivered frames: the next write is frame n + 1;
 * @again_p: how many of the frames from there had been written already.
 * c->lock held; tx_acked <= n <= tx_seq. Return: 0, or -1 if it is not held. */
int ferry__tcp_log_rewind(struct tcp_conn *c, uint64_t n, uint64_t *again_p);
/* tell the peer what we delivered (an ACK frame). Context: progress thread. */
void ferry__tcp_send_ack(struct tcp_tp *t, struct tcp_conn *c);
/* ops->send: any thread */
int ferry__tcp_send(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt);
/* the core dropped @dst: close its connection soon; progress thread */
void ferry__tcp_drop(struct ferry_tp *tp, uint32_t dst);

/* ---- recv.c: progress thread only --------------------------------------- */

/* close @c for good and report its rank failed, once; the caller logged the cause */
void ferry__tcp_conn_fail(struct tcp_tp *t, struct tcp_conn *c, int err);
/* log and fail the connections senders marked BROKEN */
void ferry__tcp_fail_broken(struct tcp_tp *t);
/* read what @c's socket has and deliver its complete frames */
void ferry__tcp_conn_input(struct tcp_tp *t, struct tcp_conn *c);
/* deliver the frames queued to our own rank */
void ferry__tcp_self_deliver(struct tcp_tp *t);

/* ---- session.c: progress thread, except where said ---------------------- */

/* read FERRY_RECONNECT_MS and FERRY_TCP_FAULT_RESET_MS, draw the incarnation.
 * Context: init(). Return: 0 or -EINVAL. */
int ferry__tcp_session_init(struct tcp_tp *t);
/* our HELLO and RESUME to @c's rank into @buf (TCP_HS_LEN bytes). Context:
 * connect() (counters 0) or the progress thread; takes c->lock. */
void ferry__tcp_hs_build(struct tcp_tp *t, struct tcp_conn *c, unsigned char *buf);
/* the RESUME after a checked HELLO of @peer's: header, @incarnation (0: any,
 * at setup). Any thread. Return: 0, or -1 with @why. */
int ferry__tcp_resume_parse(const struct tcp_tp *t, const unsigned char *frame, uint32_t peer,
			    uint64_t incarnation, struct ferry_msg_resume *r, char *why,
			    size_t wlen);
/* @c's link is lost (@why says how, for the log): keep the session and
 * reconnect, or fail the peer when that is off or the peer said BYE */
void ferry__tcp_conn_lost(struct tcp_tp *t, struct tcp_conn *c, const char *why);
/* a timer (ACK, redial, probe, deadline) is due at @when */
void ferry__tcp_timer_at(struct tcp_tp *t, int64_t when);
/* run the due timers. Return: the earliest pending one, or 0 */
int64_t ferry__tcp_timers(struct tcp_tp *t, int64_t now);
/* epoll events of the listening socket, a link, an accepted handshake */
void ferry__tcp_listen_event(struct tcp_tp *t);
void ferry__tcp_link_event(struct tcp_tp *t, struct tcp_link *l, uint32_t events);
void ferry__tcp_acc_event(struct tcp_tp *t, struct tcp_acc *a, uint32_t events);
/* fini: close what the sessions hold besides the connections */
void ferry__tcp_session_fini(struct tcp_tp *t);

#endif /* FERRY_TRANSPORT_TCP_TCP_H */

/* SPDX-License-Identifier: MIT */
/*
 * rdma.h - the RDMA transport's private header: its constants, its objects
 * (struct rdma_tp, rdma_peer, rdma_conn, rdma_op, rdma_mr, ...), their
 * container_of accessors, small inline helpers, and the functions its files
 * share. Never installed; the core never includes it.
 *
 * The RDMA transport: rdma_cm connection setup, one reliable-connected
 * queue pair per pair of nodes, Ferry frames carried in chunks through
 * pre-posted receive buffers under credit-based flow control, one-sided RDMA
 * READ and WRITE, and one progress thread per transport instance. One file
 * per verbs object or concern, as libfabric's prov/verbs:
 *
 *   file        owns                                        runs on
 *   rdma.c      init, fini, addr_get, send, the ops table   the core's threads
 *   device.c    memlock check, device, port and GID, probe, init/fini (caller);
 *               the listening cm_id, PD, CQs, the message   probe, memlock: any
 *               buffers
 *   cm.c        rdma_cm: dial, accept, reject,              progress thread;
 *               connection setup, connect()                 connect(): caller
 *   hello.c     HELLO and token proof of REQ/REP, REJ       progress thread;
 *               reasons, probes of a lost higher rank       connect(): caller
 *   session.c   a peer's session: a lost link, RESUMEs,     progress thread
 *               the grace, fault injection
 *   qp.c        a peer's queue pair: out queue, posting     senders (any thread),
 *               (chunks, credits, ops), flush, failures     progress thread
 *   cq.c        completions: the receive path (stream       progress thread;
 *               reassembly), send completions, CQ arming    workers in poll()
 *   progress.c  the progress thread: epoll loop, wake,      progress thread
 *               self queue, async events, drain at fini
 *   reap.c      the reaper: destroys the queue pairs and    reaper thread;
 *               cm_ids of connections cut loose             queued: progress
 *   rma.c       one-sided read, read_v, write; poll         any thread
 *   imm.c       write_imm: a WRITE_WITH_IMM in the chunk    any thread; its receive
 *               stream, kept until acknowledged             path: progress
 *   mr.c        mem_reg, mem_dereg                          any thread
 *
 * Functions shared between these files keep the rdma_ prefix and are not
 * static: the library is built with -fvisibility=hidden, so none leaves it.
 *
 * Messages
 *
 *   The frames to one peer form a byte stream cut into chunks of at most
 *   RDMA_CHUNK bytes, each one SEND_WITH_IMM from a registered send buffer
 *   into one of the peer's pre-posted receive buffers. Frames are multiples of
 *   8 bytes, so chunks are too, and a frame that lies inside one chunk is
 *   handed to on_msg() in place (8-byte aligned); one that spans chunks is
 *   reassembled, in order (RC keeps order), into a malloc'd buffer. The
 *   immediate is the chunk's header:
 *
 *     31      24 23 22 21     16 15                0
 *     +---------+--+--+--------+------------------+
 *     | 0xf7    |C |  number   | credits returned |   data chunk (C = 0)
 *     | 0xf7    |1 |0 | 0      | credits returned |   credit-only, no data
 *     | 0xf7    |1 |1 | 0      | delivered % 2^16 |   RESUME, no data
 *     +---------+--+--+--------+------------------+
 *
 *   Numbering (session.c): the data chunks to a peer are numbered 0, 1, ...
 *   for the transport's life (s_posted), across its queue pairs; a chunk
 *   carries its number modulo 128 and the receiver checks it against its
 *   count of chunks delivered (rx_seq). A returned credit is a cumulative
 *   acknowledgement: the receiver returns one only once the chunk's frames
 *   were delivered, so tx_acked (credits returned, summed) counts the
 *   chunks the peer has for good, and a send buffer is reused only for the
 *   chunk RDMA_SBUFS after one acknowledged. The first message on every
 *   queue pair, each way, is a RESUME with the sender's rx_seq; each side
 *   then sends again, from its send buffers, the chunks after the peer's
 *   count, and only then anything new. So frames are delivered exactly
 *   once, in order, across a lost link; the chunks kept for that are the
 *   send buffers themselves (RDMA_SBUFS = RDMA_CREDITS per peer: no memory
 *   beyond them).
 *
 *   Flow control: a sender may have RDMA_CREDITS data chunks unreturned per
 *   peer. The receiver reposts a buffer once its frames were delivered and
 *   owes one credit; owed credits ride on the next chunk it sends that peer,
 *   or, once RDMA_CREDIT_BATCH are owed, in a credit-only message. Credit-only
 *   messages are not themselves flow controlled: each carries at least
 *   RDMA_CREDIT_BATCH credits and at most RDMA_CREDITS can be in flight, so
 *   RDMA_RECV_EXTRA spare receive buffers always catch them.
 *
 *   send() (any thread) copies the frame straight into send buffers and posts
 *   it while credits, send buffers and send-queue slots last; the rest goes to
 *   the peer's out queue, flushed by the progress thread when credits or
 *   completions come back. It never waits for the network. A small frame of
 *   a burst (less than cork_ns, FERRY_RDMA_CORK_US, after the last one to
 *   that peer) also waits in the out queue while RDMA_CORK_INFLIGHT sends and
 *   a signaled work request are in flight (its completion flushes the queue):
 *   under load many frames then leave in one chunk, one work request,
 *   instead of one each. Only every RDMA_SIGNAL_EVERY-th send is signaled,
 *   so a request does not wake its sender's progress thread for its own
 *   completion; a signaled completion retires every work request posted before it
 *   (an RC send queue completes in order), which frees their send buffers.
 *   (There are RDMA_SBUFS >= RDMA_SIGNAL_EVERY send buffers, so when they are
 *   all in flight one of them is signaled. At fini a signaled credit-only
 *   message retires an unsignaled tail.)
 *
 *     out queue: [bytes: f1 f2 f3] -> [op: READ] -> [bytes: rest of f4] -> NULL
 *
 *   A write_imm() is a chunk of the stream (imm.c): a credit, a number, the
 *   same order; its op is kept in its send buffer's slot until acknowledged.
 *
 *   One-sided read()/write() post on the same queue pair, in the same order
 *   as the frames around them (an op waits in the out queue behind queued
 *   bytes), always signaled; read_v() posts a run of READs to one peer as
 *   one chain, only its last signaled. on_rdma_done() runs on the progress
 *   thread, or, for a READ, on a worker that called poll() to take its own
 *   completions (then the send CQ stays unarmed, see ferry__rdma_cq_input() in cq.c).
 *   Frames to our own rank, and one-sided operations on our own memory, go
 *   through the self queue and the wake eventfd.
 *
 * Failures: a work completion in error, RDMA_CM_EVENT_DISCONNECTED or a
 * fatal async event on the peer's queue pair lose the link, not the peer:
 * the session goes on over a new queue pair (session.c), and the peer is
 * failed only when that does not happen within FERRY_RECONNECT_MS, or when
 * it said BYE, or was dropped. A chunk or a frame with a bad header fails it
 * at once. Failing a peer: one log line that names the rank and the cause,
 * its queued and posted one-sided operations complete with -FERRY_E_PEER,
 * on_peer_failed() runs once, and the other peers go on.
 */
#ifndef FERRY_TRANSPORT_RDMA_RDMA_H
#define FERRY_TRANSPORT_RDMA_RDMA_H

#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "ferry/ferry.h"
#include "transport/transport.h"

#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

#define RDMA_HDR_LEN sizeof(struct ferry_msg_hdr)
#define RDMA_HELLO_LEN (sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_hello))
#define RDMA_CHUNK (64u << 10) /* bytes of a receive or send buffer */
#define RDMA_CREDITS 32u       /* data chunks a sender may have unreturned per peer */
#define RDMA_CREDIT_BATCH 8u   /* least credits a credit-only message returns */
/* for credit-only messages: at most CREDITS / BATCH, fini's last one and the RESUME */
#define RDMA_RECV_EXTRA (RDMA_CREDITS / RDMA_CREDIT_BATCH + 2)
#define RDMA_RECVS (RDMA_CREDITS + RDMA_RECV_EXTRA) /* receive buffers per peer */
#define RDMA_SBUFS 32u				    /* send buffers per peer */
#define RDMA_SIGNAL_EVERY 8u			    /* selective signaling of sends */
#define RDMA_SQ_DEPTH 256u	  /* work requests in flight per queue pair, at most */
#define RDMA_SQ_MIN 64u		  /* ... and at least, or init fails */
#define RDMA_MAX_RD 16u		  /* RDMA READs in flight per queue pair, each way */
#define RDMA_POLL_BATCH 32	  /* work completions per ibv_poll_cq() */
#define RDMA_CHAIN_MAX 64	  /* READs of a read_v() posted under one doorbell */
#define RDMA_SCQ_CHECK_MS 2	  /* send CQ left unarmed while workers poll: look again after */
#define RDMA_EVENTS 16		  /* epoll events per wait */
#define RDMA_ASM_MIN (64u << 10)  /* least capacity of a reassembly buffer */
#define RDMA_ASM_KEEP (4u << 20)  /* a reassembly buffer above this is freed after use */
#define RDMA_CORK_INFLIGHT 2u	  /* sends in flight from which small frames wait and batch */
#define RDMA_INLINE_WANT 256u	  /* max_inline_data asked of a queue pair (FERRY_RDMA_INLINE) */
#define RDMA_RX_SPIN_MIN_NS 2000  /* least adaptive receive spin, once it shrank */
#define RDMA_CORK_MAX (16u << 10) /* frames up to this size may wait */
#define RDMA_CORK_US 50		  /* ... when they follow the last by less (FERRY_RDMA_CORK_US) */
#define RDMA_QCHUNK (64u << 10)	  /* least capacity of an out queue entry */
#define RDMA_DRAIN_MS 1000	  /* fini: bound on flushing the out queues */
#define RDMA_RETRY_MIN_MS 10	  /* backoff between dials of a refusing rank */
#define RDMA_RETRY_MAX_MS 250
#define RDMA_RESOLVE_MS 2000 /* rdma_resolve_addr / _route timeout */
#define RDMA_MAX_HELD 64     /* connection requests held until connect() */
#define RDMA_GID_SCAN 16     /* GID table entries looked at (ibv_query_gid_ex) */
#define RDMA_IMM_TAG 0xf7u
#define RDMA_IMM_CREDIT_ONLY (1u << 23)
#define RDMA_IMM_RESUME (1u << 22) /* with CREDIT_ONLY: the low 16 bits are a count */
#define RDMA_IMM_SEQ_SHIFT 16	   /* a data chunk's number, modulo 128 */
#define RDMA_IMM_SEQ_MASK 0x7fu
#define RDMA_RECONNECT_MS 1000 /* FERRY_RECONNECT_MS default: grace of a lost link */
#define RDMA_DRAIN_GRACE_MS 20 /* a lost qp's completions not flushed by then never will be */
#define RDMA_RESUME_MIN_MS 100 /* a new link resumes within max(this, FERRY_RECONNECT_MS / 4) */
/* a redial in flight longer than max(this, FERRY_RECONNECT_MS / 2) is abandoned and made again */
#define RDMA_REDIAL_MIN_MS 100
/* the reason of a kernel CM's REJ when nothing listens on the port (IB_CM_REJ_INVALID_SERVICE_ID) */
#define RDMA_CM_REJ_NO_LISTENER 8
/* a lower rank probes a lost higher rank after FERRY_RECONNECT_MS / 4 within these (session.c) */
#define RDMA_PROBE_MIN_MS 100
#define RDMA_PROBE_MAX_MS 250
#define RDMA_STALL_MS 2000   /* frames waiting this long on an unmoving stream are logged (debug) */
#define RDMA_SLOW_CALL_MS 20 /* a verbs or rdma_cm call this slow is logged (debug) */
#define RDMA_REAP_MAX 64     /* connections waiting for the reaper, at most (reap.c) */
#define RDMA_SLOW_TURN_MS 100 /* the progress thread this long on one event is logged (debug) */

#define RDMA_REJ_MAGIC 0x4a525946u /* "FYRJ" */
#define RDMA_CM_PDATA_MAX 96	   /* private data bytes we look at */
#define RDMA_RKEY_HIST 4096	   /* rkeys remembered, so none is handed out twice */

_Static_assert(sizeof(struct ferry_msg_hdr) == 16, "the wire header is 16 bytes");
_Static_assert(sizeof(struct ferry_msg_hello) == 16, "the HELLO body is 16 bytes");
_Static_assert(RDMA_CHUNK % FERRY_MSG_ALIGN == 0, "chunks keep frames 8-byte aligned");
_Static_assert(RDMA_SBUFS >= RDMA_SIGNAL_EVERY, "every window of sends holds a signaled one");
_Static_assert(RDMA_CREDITS < (1u << 16), "credits fit the immediate");
_Static_assert(RDMA_RECVS < (1u << 16), "a buffer index fits the wr_id");
_Static_assert(RDMA_SQ_MIN > RDMA_SBUFS + 2, "the send queue holds every send buffer");
_Static_assert(RDMA_SBUFS == RDMA_CREDITS,
	       "a send buffer is kept until its credit acknowledges it");
_Static_assert(RDMA_CREDITS < 128, "a chunk's number modulo 128 tells the unacknowledged apart");

/* the transport's part of the connection private data, after the HELLO frame */
struct rdma_hello_ext {
	uint16_t chunk_kib;   /* RDMA_CHUNK >> 10 */
	uint16_t credits;     /* RDMA_CREDITS */
	uint32_t incarnation; /* random, per transport instance: a redial must repeat it */
};

#define RDMA_PDATA_LEN (RDMA_HELLO_LEN + sizeof(struct rdma_hello_ext))
_Static_assert(RDMA_PDATA_LEN <= 56, "a REQ carries 56 bytes of private data over rdma_cm");

/*
 * The cluster token's proof, after the HELLO and the geometry, when the
 * cluster has a token (cm.c, "Token"): the dialer's in its REQ (56 bytes
 * in all: the MAC is cut to 96 bits), the acceptor's in its REP.
 */
struct rdma_auth_req {
	uint32_t attempt; /* the dialer's count of its dials to this rank: must grow */
	uint8_t mac[12];
};

struct rdma_auth_rep {
	uint32_t attempt; /* the REQ's */
	uint32_t pad;
	uint8_t mac[FERRY_AUTH_MAC_LEN];
};

#define RDMA_REQ_PDATA_LEN (RDMA_PDATA_LEN + sizeof(struct rdma_auth_req))
#define RDMA_REP_PDATA_LEN (RDMA_PDATA_LEN + sizeof(struct rdma_auth_rep))
_Static_assert(RDMA_REQ_PDATA_LEN == 56, "the REQ's proof fills its private data");
_Static_assert(RDMA_REP_PDATA_LEN <= 196, "a REP carries 196 bytes of private data");

/* why a connection request was rejected: the REJ's private data */
enum rdma_rej_reason {
	RDMA_REJ_HELLO = 1,   /* not a HELLO of this cluster */
	RDMA_REJ_DUP,	      /* that rank is connected already */
	RDMA_REJ_CLOSED,      /* the cluster is connected, or gave up */
	RDMA_REJ_BUSY,	      /* too many requests held */
	RDMA_REJ_RESOURCES,   /* no queue pair could be made */
	RDMA_REJ_AUTH,	      /* no valid proof of the cluster token */
	RDMA_REJ_AGAIN,	      /* a redial: the last link is still being closed; dial again */
	RDMA_REJ_FAILED,      /* a redial of a rank marked failed (or dropped by the core) */
	RDMA_REJ_INCARNATION, /* a redial from another process than the session's */
	RDMA_REJ_REDIAL,      /* a probe of a live peer: it redials us (session.c) */
};

struct rdma_rej {
	uint32_t magic;
	uint32_t reason;
};

/* wr_id: rank << 32 | buffer index << 16 | generation << 8 | kind */
enum rdma_wr_kind {
	RDMA_WR_RECV = 1,
	RDMA_WR_UNSIG = 2, /* an unsignaled send: seen only when it fails */
	RDMA_WR_SIG = 3,   /* a signaled work request: a record in the peer's sig ring */
};

/* the buffer index of a send's wr_id that marks a WRITE with immediate (imm.c) */
#define RDMA_WR_IDX_IMM 1u

static inline uint64_t rdma_wr_id(enum rdma_wr_kind kind, uint32_t rank, uint8_t gen, uint32_t idx)
{
	return (uint64_t)rank << 32 | (uint64_t)(idx & 0xffff) << 16 | (uint64_t)gen << 8 | kind;
}

/* one read() or write() */
struct rdma_op {
	struct rdma_op *next; /* the rest of a read_v() chain that completes with it */
	void *ctx;
	void *local;
	uint32_t lkey;
	uint32_t rkey;
	uint64_t raddr;
	uint32_t len;
	int write;
	int spin; /* posted by the progress thread, which spins for its completion */
	/* a write_imm (imm.c): a chunk of the stream, completed when acknowledged */
	int imm;
	uint32_t tag;
	int status; /* its completion's, once detached to imm_done */
};

/* an entry of a peer's out queue: frame bytes [off, len) of data, or one op */
struct rdma_qent {
	struct rdma_qent *next;
	struct rdma_op *op;
	size_t len;
	size_t cap;
	size_t off;
	_Alignas(16) unsigned char data[];
};

/* a signaled work request in flight: its completion retires everything before it */
struct rdma_sig {
	uint64_t sq_after; /* sq_posted once it was posted */
	uint64_t s_after;  /* s_posted once it was posted */
	struct rdma_op *op;
};

enum rdma_conn_kind {
	RDMA_CONN_LISTEN,
	RDMA_CONN_DIAL,
	RDMA_CONN_ACCEPT,
	RDMA_CONN_PROBE, /* a lower rank's probe of a lost higher rank's listener (session.c) */
};

enum rdma_conn_state {
	RDMA_CS_NEW,
	RDMA_CS_ADDR,	    /* dial: resolving the address */
	RDMA_CS_ROUTE,	    /* dial: resolving the route */
	RDMA_CS_HELD,	    /* accept: waiting for connect() */
	RDMA_CS_CONNECTING, /* rdma_connect() / rdma_accept() done, waiting for ESTABLISHED */
	RDMA_CS_UP,
};

/* one rdma_cm_id; owned by the progress thread (by fini() after it stopped) */
struct rdma_conn {
	struct rdma_conn *next; /* in rdma_tp.conns */
	struct rdma_cm_id *id;
	enum rdma_conn_kind kind;
	enum rdma_conn_state state;
	uint32_t rank; /* the dialed or accepted rank; UINT32_MAX before it is known */
	int disconnected;
	char who[64]; /* the other end's ip:port, for the log */
	/* a request held until connect(): what the REQ carried */
	uint8_t pdata[RDMA_CM_PDATA_MAX];
	uint8_t plen;
	uint8_t initiator_depth;
	uint8_t responder_resources;
	uint32_t attempt; /* with a token: the dial attempt its proofs name */
	int64_t t0_ms;	  /* when it was made: a redial in flight is bounded (session.c) */
	unsigned char pdata_out[RDMA_REP_PDATA_LEN]; /* what we send: HELLO, proof */
};

enum rdma_peer_state {
	RDMA_PEER_IDLE, /* not connected yet */
	RDMA_PEER_UP,
	RDMA_PEER_LOST,	  /* the link was lost, or is resuming: frames wait in the out queue */
	RDMA_PEER_BROKEN, /* a sender's post failed; the progress thread fails it */
	RDMA_PEER_FAILED, /* on_peer_failed() was called (or fini ran) */
};

struct rdma_peer {
	/*
	 * lock guards state, qp, gen, the send side (credits, owed, counters,
	 * sig ring, out queue) and send_err. Senders hold it while they post;
	 * the progress thread takes it to flush, to account completions and to
	 * fail the peer, and never holds it across a handler.
	 */
	pthread_mutex_t lock;
	enum rdma_peer_state state;
	struct ibv_qp *qp;
	uint8_t gen;		   /* bumped with every queue pair: stale completions are dropped */
	uint32_t credits;	   /* data chunks we may still send */
	uint32_t owed;		   /* credits we owe the peer (buffers reposted) */
	uint64_t s_posted, s_done; /* sends (send buffers) */
	uint32_t max_inline;	   /* the queue pair's max_inline_data: smaller chunks go inline */
	int64_t last_send_ns; /* when send() last took a frame for this peer (the cork's gap) */
	uint64_t sq_posted, sq_done; /* work requests on the send queue */
	struct rdma_sig *sig;	     /* ring of sq_depth records */
	uint32_t sig_head, sig_n;
	struct rdma_qent *q_head, *q_tail;
	size_t q_bytes;		  /* frame bytes queued, not yet posted (lock) */
	pthread_cond_t q_drained; /* q_bytes fell below FERRY_TP_SENDQ_MAX / 2 */
	int send_err;
	int break_logged; /* a worker logged why it broke the peer */
	/* the session (lock; session.c): the stream of data chunks across queue pairs */
	uint64_t tx_acked;	   /* chunks the peer acknowledged (credits returned, summed) */
	uint32_t slen[RDMA_SBUFS]; /* bytes of the chunk in each send buffer, kept until acked */
	int rsm_sent, rsm_got;	   /* this queue pair: our RESUME posted, the peer's received */
	/* the write_imm whose chunk each send buffer's number holds (imm.c),
	 * NULL for a data chunk; kept until acknowledged, posted again after a
	 * lost link. Detached ones (acknowledged, or failed) wait in imm_done
	 * for their on_rdma_done, which runs without the lock */
	struct rdma_op *sop[RDMA_SBUFS];
	struct rdma_op *imm_done;
	int imm_owed;	     /* a write_imm was delivered since owed credits last went back */
	uint32_t imm_resent; /* the last resumption: write_imms posted again (for the log) */
	uint64_t rsm_from;   /* the peer's RESUME: the chunks it has */

	/* set in init, read-only afterwards */
	uint32_t rank;
	unsigned char *rbuf; /* RDMA_RECVS receive buffers */
	unsigned char *sbuf; /* RDMA_SBUFS send buffers */

	/* progress thread only */
	struct rdma_conn *conn; /* the connection (attempt) that owns qp */
	int rx_ok;		/* chunks on qp are delivered (from attach until failure) */
	int live;		/* UP and not failed */
	int bye;		/* it sent FERRY_MSG_BYE: its disconnect is a departure */
	uint32_t auth_attempt;	/* the last dial attempt of its whose token proof passed */
	int reported;		/* on_peer_failed() was called */
	uint64_t rx_seq;	/* data chunks delivered from it (the session's count) */
	uint32_t rx_out;	/* receives posted on qp and not completed */
	uint32_t inc;		/* its incarnation (from its HELLO), 0 before it connected */
	int ever_up;		/* it connected once: a new queue pair resumes the stream */
	int lost;		/* the link is lost: waiting for the old qp to drain and a redial */
	int draining;		/* qp is the lost link's: its completions are taken, not reposted */
	int64_t lost_ms;	/* when it was lost (FERRY_RECONNECT_MS counts from here) */
	int64_t err_ms;		/* when its queue pair was moved to the error state */
	int64_t up_ms;		/* when the last connection stood (the RESUMEs are due) */
	uint32_t redials;	/* since the loss: dials made (higher rank) or requests seen */
	int64_t req_ms;		/* the last request from it (a higher rank) while lost */
	uint32_t probes;	/* probes of it (a higher rank) made, for the log */
	uint64_t stall_seq;	/* s_posted + rx_seq when last seen to move (session.c) */
	int64_t stall_ms;	/* since when it has not moved while frames wait */
	int stall_logged;
	char redial_why[96]; /* the last one's outcome, for the line that fails the peer */

	int dirty;		/* flush after this batch of completions */
	unsigned char *asm_buf; /* reassembly of a frame that spans chunks */
	size_t asm_cap, asm_have, asm_need;
};

/* a frame to our own rank, or the completion of a one-sided op on our own memory */
struct rdma_selfmsg {
	struct rdma_selfmsg *next;
	size_t len;
	void *ctx; /* a completion: on_rdma_done(ctx, status) */
	int status;
	int done;
	_Alignas(16) unsigned char data[];
};

struct rdma_mr {
	struct ferry_tp_mr base;
	struct ibv_mr *mr;
	int access;	      /* IBV_ACCESS_* */
	struct rdma_mr *next; /* in rdma_tp.mrs */
};

/* dial state for one lower rank; for a higher one, its probes (session.c) */
struct rdma_dial {
	struct sockaddr_in sa;
	char where[64];
	struct rdma_conn *conn; /* the attempt in flight; progress thread */
	int64_t next_ms;	/* earliest next attempt; progress thread */
	int backoff_ms;
	int logged;	   /* a refused HELLO was logged */
	char why[160];	   /* the last failure; under setup_lock */
	uint32_t attempts; /* dials made: each REQ's proof names its number */
	int probe_ok;	   /* a higher rank: its address parsed, it may be probed */
};

enum rdma_phase {
	RDMA_PHASE_IDLE,       /* before connect(): requests are held */
	RDMA_PHASE_CONNECTING, /* connect() waits */
	RDMA_PHASE_DONE,       /* every peer connected */
	RDMA_PHASE_ABANDONED,  /* connect() gave up */
};

enum rdma_ev_tag {
	RDMA_EV_WAKE = 1,
	RDMA_EV_CQ,
	RDMA_EV_CM,
	RDMA_EV_ASYNC,
};

struct rdma_tp {
	struct ferry_tp base;
	char bind[NI_MAXHOST];	   /* our copy of cfg.bind_addr */
	char addr[64];		   /* "ip:port" that peers dial: our address blob */
	struct sockaddr_in src_sa; /* the bind address, port 0: source of our dials */
	char dev_name[IBV_SYSFS_NAME_MAX];
	uint8_t port_num;
	int gid_index; /* the RoCE v2 GID of the bind address, -1 when unknown */

	struct ibv_context **devs; /* rdma_get_devices(): keeps rdma_cm's contexts open */
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *scq, *rcq;
	/*
	 * cq_lock serializes polling the send CQ and accounting what it
	 * returns (a signaled completion retires the sig ring's oldest record,
	 * so completions must be handled in the order polled): the progress
	 * thread takes it, a worker in poll() tries it. Taken before any
	 * peer's lock, never after.
	 */
	pthread_mutex_t cq_lock;
	uint64_t polls;			 /* atomic: poll() calls that got cq_lock */
	unsigned scq_events, rcq_events; /* completion events not acked yet */
	struct rdma_event_channel *ec;
	struct rdma_conn *listen;
	void *region; /* the peers' buffers */
	size_t region_len;
	struct ibv_mr *region_mr;
	size_t pinned; /* bytes this instance counts in ferry__rdma_pinned */
	uint32_t sq_depth;
	uint32_t max_rd;
	uint32_t max_msg;
	uint32_t inline_want; /* max_inline_data asked of every queue pair (FERRY_RDMA_INLINE) */
	int64_t cork_ns;      /* a small frame this soon after the last to its peer may wait */

	int epfd;
	int wake_fd;
	pthread_t thread;
	int thread_started;
	struct rdma_peer *peers; /* one per rank; ours unused */
	int connected;		 /* connect() succeeded; caller's thread only */

	pthread_mutex_t self_lock; /* guards self_head, self_tail */
	struct rdma_selfmsg *self_head;
	struct rdma_selfmsg *self_tail;

	pthread_mutex_t mr_lock; /* guards mrs and the rkey history */
	struct rdma_mr *mrs;
	/* the last RDMA_RKEY_HIST rkeys this transport handed out (a ring): a
	 * new registration never repeats one (mr.c), so a key a peer kept from
	 * a destroyed table opens nothing of a later one */
	uint32_t rkey_hist[RDMA_RKEY_HIST];
	uint32_t rkey_hist_n;

	int closing;	  /* atomic: fini() asked the progress thread to stop */
	int reconnect_ms; /* FERRY_RECONNECT_MS: grace of a lost link; 0: none (session.c) */
	int fault_ms;	  /* FERRY_RDMA_FAULT_BREAK_MS: tests; 0: off */
	int64_t fault_next_ms;
	uint32_t fault_rr; /* the next rank fault injection looks at */
	uint32_t incarnation;
	int fail_pending; /* atomic: some peer is BROKEN */

	/* shared by connect() and the progress thread, under setup_lock */
	pthread_mutex_t setup_lock;
	pthread_cond_t setup_cond;
	enum rdma_phase phase;
	uint32_t missing;
	uint8_t *up;		 /* per rank: connected */
	struct rdma_dial *dials; /* per rank: dials of [0, rank), probes of (rank, world) */
	unsigned char hello[RDMA_PDATA_LEN];

	/* progress thread only */
	uint64_t polls_seen;  /* polls when last looked at */
	int scq_off;	      /* send CQ not armed: workers poll it (atomic writes) */
	int scq_rearm;	      /* atomic: a worker stopped polling; arm it now */
	int64_t scq_check_ms; /* when to look again whether they still do */
	/*
	 * the spin for its own one-sided ops (progress.c): the thread polls the
	 * CQs while an op it posted is in flight (spin_ops, atomic: completions
	 * may be taken by a worker), for at most spin_ns after its last post
	 * (spin_until); a CQ whose event was taken stays unarmed (*_unarmed)
	 * until the thread is about to sleep. spin_ns 0: off
	 */
	int64_t spin_ns;
	int64_t spin_until; /* CLOCK_MONOTONIC ns */
	int spin_ops;
	/*
	 * the spin after a frame came (FERRY_RDMA_RX_SPIN_US, progress.c): the
	 * thread polls for up to rx_spin_cur ns after a receive completion
	 * before it sleeps, and after a worker sent a frame (rx_spin_req: the
	 * reply's wait starts at once, off the reply's path); a spin that
	 * catches the next receive doubles
	 * rx_spin_cur (up to rx_spin_ns), one that ends empty halves it (down
	 * to RDMA_RX_SPIN_MIN_NS). rx_spin_ns 0: off
	 */
	int64_t rx_spin_ns, rx_spin_cur;
	int64_t rx_spin_until; /* CLOCK_MONOTONIC ns; 0: no spin under way */
	int rx_spin_req;       /* atomic: a worker sent a frame, a reply may come: spin */
	uint8_t scq_unarmed, rcq_unarmed;
	enum rdma_phase seen_phase;
	struct rdma_conn *conns; /* every cm_id but the listener */
	uint32_t nheld;
	uint32_t *dirty; /* ranks to flush after a batch of completions */
	uint32_t ndirty;

	/*
	 * the reaper (reap.c): connections cut loose by the progress thread,
	 * whose queue pair and cm_id it destroys; at most RDMA_REAP_MAX wait.
	 * reap_lock guards the queue, reap_n, reap_stop and reaped.
	 */
	pthread_mutex_t reap_lock;
	pthread_cond_t reap_cond;
	struct rdma_conn *reap_head, *reap_tail;
	uint32_t reap_n;
	uint64_t reaped; /* connections the reaper destroyed */
	int reap_stop;
	int reap_started; /* init() and fini() only */
	pthread_t reap_thread;
};

static inline struct rdma_tp *to_rdma(struct ferry_tp *tp)
{
	return container_of(tp, struct rdma_tp, base);
}

static inline struct rdma_mr *to_rdma_mr(struct ferry_tp_mr *mr)
{
	return container_of(mr, struct rdma_mr, base);
}

/* a gather cursor over a caller's iovec */
struct rdma_cursor {
	const struct iovec *iov;
	int cnt;
	int i;
	size_t off;
};

/* bytes this process registered through this transport (RLIMIT_MEMLOCK check; device.c) */
extern uint64_t ferry__rdma_pinned;

static inline int64_t rdma_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline int64_t rdma_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * RDMA_TIMED - run @call, an rdma_cm or verbs call that returns int, and log
 * it at debug level when it took RDMA_SLOW_CALL_MS or more: under TCG some
 * of them wait in the kernel for hundreds of ms, on the progress thread
 * (docs/rdma.md, "The reaper"). Return: what @call returned.
 */
#define RDMA_TIMED(t, rank, what, call)                          \
	({                                                       \
		int64_t t0_ = rdma_now_ms();                     \
		int r_ = (call);                                 \
		ferry__rdma_slow_note((t), (rank), (what), t0_); \
		r_;                                              \
	})

/* the immediate of data chunk @seq that returns @owed credits (the chunk header above) */
static inline uint32_t rdma_imm_data(uint64_t seq, uint32_t owed)
{
	return RDMA_IMM_TAG << 24 | (uint32_t)(seq & RDMA_IMM_SEQ_MASK) << RDMA_IMM_SEQ_SHIFT |
	       owed;
}

/* the immediate of a RESUME: @delivered chunks, modulo 2^16 */
static inline uint32_t rdma_imm_resume(uint64_t delivered)
{
	return RDMA_IMM_TAG << 24 | RDMA_IMM_CREDIT_ONLY | RDMA_IMM_RESUME |
	       (uint32_t)(delivered & 0xffff);
}

/*
 * rdma_resume_from - the peer's count of our chunks it delivered, from the
 * low 16 bits @count16 of its RESUME: the one number in [@acked, @posted]
 * with those bits (at most RDMA_CREDITS chunks are unacknowledged, so there
 * is at most one). Return: 0 with *@from_p, or -1 when none is.
 */
static inline int rdma_resume_from(uint64_t acked, uint64_t posted, uint32_t count16,
				   uint64_t *from_p)
{
	uint64_t from = acked + ((count16 - acked) & 0xffff);

	if (from > posted)
		return -1;
	*from_p = from;
	return 0;
}

/* room on the send side of @p; call with p->lock held */
static inline bool rdma_sq_room(const struct rdma_tp *t, const struct rdma_peer *p)
{
	return p->sq_posted - p->sq_done < t->sq_depth;
}

static inline bool rdma_can_post_data(const struct rdma_tp *t, const struct rdma_peer *p)
{
	return p->credits && p->s_posted - p->s_done < RDMA_SBUFS && rdma_sq_room(t, p);
}

static inline unsigned char *rdma_sbuf(const struct rdma_peer *p, uint64_t seq)
{
	return p->sbuf + (size_t)(seq % RDMA_SBUFS) * RDMA_CHUNK;
}

/* ---- functions the files share ------------------------------------------ */

/*
 * The functions the files share. Each definition's comment gives its full
 * contract; the thread that may call it is repeated here.
 */

/* device.c: init() and fini(), on their caller's thread (probe, memlock: any) */
int ferry__rdma_set_nonblock(int fd);
int ferry__rdma_memlock_check(uint32_t rank, uint64_t more, const char *what);
int ferry__rdma_pick_device(char *name, uint8_t *port_p, const char **why_p);
int ferry__rdma_pick_addr(struct rdma_tp *t, const char *host);
int ferry__rdma_probe(const char **why_p);
int ferry__rdma_tp_listen(struct rdma_tp *t);
void ferry__rdma_unlisten(struct rdma_tp *t);
int ferry__rdma_query(struct rdma_tp *t);
int ferry__rdma_verbs_init(struct rdma_tp *t);
void ferry__rdma_verbs_fini(struct rdma_tp *t);
int ferry__rdma_peers_init(struct rdma_tp *t);
void ferry__rdma_peers_fini(struct rdma_tp *t);

/* reap.c: ferry__rdma_reap on the progress thread (or in fini); start: init; stop: fini */
int ferry__rdma_reaper_start(struct rdma_tp *t);
void ferry__rdma_reaper_stop(struct rdma_tp *t);
void ferry__rdma_reap(struct rdma_tp *t, struct rdma_conn *c);
void ferry__rdma_slow_note(const struct rdma_tp *t, uint32_t rank, const char *what, int64_t t0);

/* cm.c: progress thread (ferry__rdma_conn_destroy also in fini; connect on its caller) */
void ferry__rdma_conn_destroy(struct rdma_tp *t, struct rdma_conn *c);
const char *ferry__rdma_conn_state_str(const struct rdma_conn *c);
/* copy of the fields of an rdma_cm_event we use: the event is acked before they are (cm.c) */
struct rdma_cm_ev {
	enum rdma_cm_event_type type;
	struct rdma_cm_id *id; /* a CONNECT_REQUEST's new id; otherwise not to be touched */
	void *ctx;	       /* id->context, read before the ack */
	int status;
	uint8_t pdata[RDMA_CM_PDATA_MAX];
	uint8_t plen;
	uint8_t initiator_depth;
	uint8_t responder_resources;
};

/* cm.c */
struct rdma_conn *ferry__rdma_conn_new(struct rdma_tp *t, enum rdma_conn_kind kind);
void ferry__rdma_conn_reject(struct rdma_tp *t, struct rdma_conn *c, enum rdma_rej_reason reason);
void ferry__rdma_conn_param(struct rdma_tp *t, struct rdma_conn *c, struct rdma_conn_param *cp,
			    uint8_t their_init, uint8_t their_resp, int accepting);
/* hello.c */
void ferry__rdma_hello_build(struct rdma_tp *t);
int ferry__rdma_hello_check(struct rdma_tp *t, const uint8_t *pdata, size_t len, int dialed,
			    int probe_ok, uint32_t *inc_p, char *why, size_t wlen);
void ferry__rdma_auth_mac(const struct rdma_tp *t, const char *label, uint32_t i, uint32_t j,
			  uint32_t a, uint8_t *mac);
int ferry__rdma_auth_check(const struct rdma_tp *t, const uint8_t *pdata, size_t len, int rep,
			   uint32_t i, uint32_t j, uint32_t *attempt_p, char *why, size_t wlen);
const char *ferry__rdma_rej_str(uint32_t reason);
void ferry__rdma_probe_answer(struct rdma_tp *t, struct rdma_conn *c, struct rdma_peer *p);
void ferry__rdma_probe_event(struct rdma_tp *t, struct rdma_conn *c, const struct rdma_cm_ev *ev);
int64_t ferry__rdma_probe_tick(struct rdma_tp *t, int64_t now);
void ferry__rdma_redial_note(struct rdma_peer *p, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* how long a redial may stay in flight: max(RDMA_REDIAL_MIN_MS, FERRY_RECONNECT_MS / 2) */
static inline int ferry__rdma_redial_ms(const struct rdma_tp *t)
{
	return t->reconnect_ms / 2 > RDMA_REDIAL_MIN_MS ? t->reconnect_ms / 2 : RDMA_REDIAL_MIN_MS;
}
void ferry__rdma_setup_sync(struct rdma_tp *t);
int64_t ferry__rdma_setup_tick(struct rdma_tp *t);
void ferry__rdma_cm_input(struct rdma_tp *t);
int ferry__rdma_tp_connect(struct ferry_tp *tp, const void *const *addrs, const size_t *lens);
void ferry__rdma_peer_up(struct rdma_tp *t, struct rdma_peer *p);

/* qp.c: any thread; the out queue and posting with p->lock held */
void ferry__rdma_cursor_copy(struct rdma_cursor *c, unsigned char *dst, size_t n);
void ferry__rdma_q_push(struct rdma_peer *p, struct rdma_qent *e);
int ferry__rdma_q_append(struct rdma_peer *p, struct rdma_cursor *c, size_t n);
void ferry__rdma_sig_push(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op *op);
int ferry__rdma_post_chunk(struct rdma_tp *t, struct rdma_peer *p, size_t n);
int ferry__rdma_post_credit(struct rdma_tp *t, struct rdma_peer *p);
int ferry__rdma_post_op(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op *op);
int ferry__rdma_flush_locked(struct rdma_tp *t, struct rdma_peer *p);
void ferry__rdma_peer_break(struct rdma_tp *t, struct rdma_peer *p, int err);
/* back-pressure: wait for room in @p's queue; p->lock held; any thread but the progress thread */
int ferry__rdma_wait_room(struct rdma_tp *t, struct rdma_peer *p);
/* the core dropped @dst: fail it soon; progress thread */
void ferry__rdma_drop(struct ferry_tp *tp, uint32_t dst);
/* qp.c: progress thread (ferry__rdma_op_done also on a worker in poll()) */
int ferry__rdma_post_recv(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx);
int ferry__rdma_conn_attach(struct rdma_tp *t, struct rdma_conn *c, uint32_t r);
void ferry__rdma_op_done(struct rdma_tp *t, struct rdma_op *op, int status, int worker);
void ferry__rdma_q_cancel(struct rdma_tp *t, struct rdma_qent *e, int status);
void ferry__rdma_peer_fail(struct rdma_tp *t, struct rdma_peer *p, int err);
/* @p broke the chunk stream's rules (@why): one line, and it fails with
 * -FERRY_E_PROTO. Progress thread. */
void ferry__rdma_bad_chunk(struct rdma_tp *t, struct rdma_peer *p, const char *why);
void ferry__rdma_fail_broken(struct rdma_tp *t);

/* cq.c: progress thread (ferry__rdma_scq_drain also on a worker in poll(), cq_lock held) */
void ferry__rdma_mark_dirty(struct rdma_tp *t, struct rdma_peer *p);
void ferry__rdma_flush_dirty(struct rdma_tp *t);
int ferry__rdma_scq_drain(struct rdma_tp *t, int worker);
int ferry__rdma_poll_cqs(struct rdma_tp *t);
void ferry__rdma_cq_input(struct rdma_tp *t);
void ferry__rdma_scq_check(struct rdma_tp *t);
int ferry__rdma_cq_arm(struct rdma_tp *t);

/* progress.c: any thread (ferry__rdma_start_thread: init) */
void ferry__rdma_wake(struct rdma_tp *t);
void ferry__rdma_self_push(struct rdma_tp *t, struct rdma_selfmsg *m);
int ferry__rdma_self_send(struct rdma_tp *t, const struct iovec *iov, int iovcnt, size_t total);
/*
 * ferry__rdma_env_int - the integer in environment variable @name, @min to
 * @max; @def when unset or (said once per call, with the fix) out of range
 */
long ferry__rdma_env_int(const char *name, long min, long max, long def);
int ferry__rdma_start_thread(struct rdma_tp *t);

/* session.c: progress thread (ferry__rdma_session_init: init) */
int ferry__rdma_session_init(struct rdma_tp *t);
void ferry__rdma_peer_lost(struct rdma_tp *t, struct rdma_peer *p, const char *why);
bool ferry__rdma_peer_drained(struct rdma_tp *t, struct rdma_peer *p);
int ferry__rdma_resume_post(struct rdma_tp *t, struct rdma_peer *p);
int ferry__rdma_resume_got(struct rdma_tp *t, struct rdma_peer *p, uint32_t count16,
			   const char **why_p);
int ferry__rdma_resume_go(struct rdma_tp *t, struct rdma_peer *p);
int64_t ferry__rdma_session_tick(struct rdma_tp *t);
/* qp.c, with p->lock held: post data chunk @seq (its bytes in its send buffer) */
int ferry__rdma_post_data(struct rdma_tp *t, struct rdma_peer *p, uint64_t seq, size_t n, bool sig);

/* imm.c: write_imm (any thread); the post and ack helpers with p->lock held;
 * ferry__rdma_imm_run and the receive path on the progress thread */
int ferry__rdma_write_imm(struct ferry_tp *tp, uint32_t dst, const void *local,
			  struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey, size_t len,
			  uint32_t tag, void *ctx);
int ferry__rdma_post_imm(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op *op);
int ferry__rdma_post_imm_wr(struct rdma_tp *t, struct rdma_peer *p, uint64_t seq, bool sig);
void ferry__rdma_imm_acked_locked(struct rdma_peer *p, uint64_t from);
void ferry__rdma_imm_fail_locked(struct rdma_peer *p, int status);
void ferry__rdma_imm_run(struct rdma_tp *t, struct rdma_peer *p);
void ferry__rdma_rx_imm(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx,
			const struct ibv_wc *wc);
/* cq.c: repost receive buffer @idx of @p once its chunk was delivered, and
 * owe a credit for it unless @credit_only. Progress thread. */
void ferry__rdma_rx_repost(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx, bool credit_only);

/* rma.c: ops, any thread */
struct rdma_op *ferry__rdma_op_new(struct rdma_tp *t, int write, uint32_t dst, void *local,
				   struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey,
				   size_t len, void *ctx, int *ret_p);
int ferry__rdma_op_queue(struct rdma_peer *p, struct rdma_op *op);
int ferry__rdma_read(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		     uint64_t raddr, uint64_t rkey, size_t len, void *ctx);
int ferry__rdma_read_v(struct ferry_tp *tp, struct ferry_tp_rd *rds, size_t n);
int ferry__rdma_write(struct ferry_tp *tp, uint32_t dst, const void *local, struct ferry_tp_mr *lmr,
		      uint64_t raddr, uint64_t rkey, size_t len, void *ctx);
int ferry__rdma_poll(struct ferry_tp *tp, unsigned flags);

/* mr.c: ops, any thread (ferry__rdma_mrs_fini: fini) */
int ferry__rdma_mem_reg(struct ferry_tp *tp, void *addr, size_t len, unsigned access,
			struct ferry_tp_mr *mr);
void ferry__rdma_mem_dereg(struct ferry_tp *tp, struct ferry_tp_mr *mr);
void ferry__rdma_mrs_fini(struct rdma_tp *t);

#endif /* FERRY_TRANSPORT_RDMA_RDMA_H */

/* SPDX-License-Identifier: MIT */
/*
 * transport.h - the internal provider interface between the Ferry core and
 * its transports (tcp/, rdma/). Never installed.
 *
 *   core (lib/)                               transport (transport/<name>/)
 *   ---------------------------------------   ---------------------------------
 *   ferry__tp_create(ops, cfg)  ------------> ops->init(tp, cfg)
 *   ferry__bootstrap: addr blobs <----------- ops->addr_get()
 *                    all blobs -------------> ops->connect(tp, blobs, timeout)
 *   ferry__tp_send(tp, dst, iov) -----------> ops->send()        any thread
 *   arena memory ----------------------------> ops->mem_reg()     one per arena chunk
 *   remote pull (when CAP_READ) -------------> ops->read()        one-sided
 *   a batch of pulls ------------------------> ops->read_v()      one doorbell per peer
 *   a worker waiting for its reads ----------> ops->poll()        completions in the caller
 *   handler->on_msg(src, frame) <------------ progress thread, frames in order
 *   handler->on_peer_failed(src, err) <------ progress thread, once per peer
 *   handler->on_rdma_done(ctx, status) <----- progress thread (loop: inline;
 *                                             a read's also inside poll())
 *   a WRITE the receiver must hear of ------> ops->write_imm()   CAP_WRITE_IMM
 *   handler->on_write_imm(src, tag) <-------- receiver's progress thread,
 *                                             in order with src's frames
 *
 * A transport owns exactly one progress thread per node. Every handler is
 * called on it, one call at a time (tcp with FERRY_TCP_WORKER_POLL=1: or on
 * a waiting worker inside poll(), never at the same time as the progress
 * thread runs one); messages from one source arrive in the
 * order that source sent them (a FIFO per ordered pair of ranks, including
 * a node sending to itself). send() never blocks on the network: what the
 * socket or queue pair cannot take now is queued and flushed by the progress
 * thread, so two nodes sending to each other can never deadlock.
 *
 * Frames are whole Ferry protocol messages (transport/base/frame.h): the
 * first 16 bytes are a struct ferry_msg_hdr whose len field gives the
 * frame's total length. A transport reads that header to frame a byte
 * stream, checks magic, version and length with ferry__proto_check_hdr()
 * before it trusts len, and checks that src is the rank of the connection
 * (on_msg's @src is then the header's; the core does not check it again).
 * A frame that fails is a protocol error: the transport logs it, drops that
 * connection and calls on_peer_failed(). The core checks everything else.
 * Frame lengths are multiples of FERRY_MSG_ALIGN = 8; on_msg() must get each
 * frame at an 8-byte-aligned address: keep receive buffers aligned.
 */
#ifndef FERRY_TRANSPORT_H
#define FERRY_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include <sys/uio.h>

#include "transport/base/auth.h"
#include "transport/base/clock.h"
#include "transport/base/frame.h"
#include "transport/base/log.h"

/* capability bits: the core tests bits, never transport names */
#define FERRY_TP_CAP_READ (1u << 0)	 /* one-sided read of registered memory */
#define FERRY_TP_CAP_WRITE (1u << 1)	 /* one-sided write */
#define FERRY_TP_CAP_ATOMIC (1u << 2)	 /* remote atomics */
#define FERRY_TP_CAP_POLL_MSG (1u << 3)	 /* poll() with FERRY_TP_POLL_HOLD delivers frames */
#define FERRY_TP_CAP_WRITE_IMM (1u << 4) /* write_imm(): a WRITE its receiver hears of */

/*
 * WRITE with immediate (write_imm, CAP_WRITE_IMM): a one-sided WRITE of
 * @len bytes from @local to @raddr/@rkey of @dst, and a 24-bit @tag that
 * the receiver's core gets through on_write_imm(src, tag). What a transport
 * that offers it keeps to:
 *
 * - Placed first: on_write_imm runs only after the bytes are in place at
 *   the receiver (rdma: the receive completion of IBV_WR_RDMA_WRITE_WITH_IMM
 *   on an RC queue pair).
 * - In order with frames: it takes a place in the writer's stream to @dst
 *   like a frame (rdma: a number in the chunk stream and a credit; it
 *   consumes one of the receiver's posted receives), so on_write_imm runs
 *   after every frame the writer sent @dst before it and before every frame
 *   sent after it, on the receiver's progress thread, one handler at a time.
 * - Once: across a lost and re-established link it is neither lost nor
 *   delivered twice. The writer posts it again from @local (with the same
 *   tag) when the peer's RESUME does not cover it, so @local stays the
 *   writer's to keep unchanged until on_rdma_done(@ctx): that comes once
 *   the receiver acknowledged it (its on_write_imm ran), not when the WRITE
 *   completed at the writer.
 * - Failure: a peer declared failed (on_peer_failed, drop, fini) completes
 *   every write_imm to it not acknowledged with -FERRY_E_PEER (fini:
 *   -FERRY_E_CLOSED); on_write_imm was then perhaps run, perhaps not, and
 *   the receiver may hold any part of the bytes. A write_imm that returns an
 *   error was not posted and never completes.
 * - Bound: what the transport keeps per write_imm not acknowledged is its
 *   descriptor (addresses, keys, length, tag, ctx: rdma keeps it in the
 *   chunk's send-buffer slot, at most RDMA_CREDITS per peer; more wait in
 *   its out queue, one entry each; loop: one entry each). The caller bounds
 *   how many it posts (a collective: its segments).
 * - @dst is never the writer's own rank (-EINVAL): there is no stream to
 *   itself.
 * - Into memory the receiver does not offer for remote writes: loop refuses
 *   it at the call (-EACCES); rdma learns it from the peer's NIC after the
 *   post, and fails the peer (on_peer_failed, the op -FERRY_E_PEER): posted
 *   again it would be refused again.
 * - Tags: the top FERRY_TP_IMM_USER_BITS bits name the core's module
 *   (FERRY_TP_IMM_USER_*), the rest are the module's. The transport does not
 *   look inside the tag; the core checks it as it checks a frame.
 */
#define FERRY_TP_IMM_TAG_BITS 24
#define FERRY_TP_IMM_TAG_MASK ((1u << FERRY_TP_IMM_TAG_BITS) - 1)
#define FERRY_TP_IMM_USER_BITS 3
#define FERRY_TP_IMM_USER_SHIFT (FERRY_TP_IMM_TAG_BITS - FERRY_TP_IMM_USER_BITS)
#define FERRY_TP_IMM_USER_COLL 1u /* lib/coll/put.c */
#define FERRY_TP_IMM_USERS (1u << FERRY_TP_IMM_USER_BITS)

/* one read of a batch: read_v() */
struct ferry_tp_rd {
	uint32_t dst;
	void *local; /* inside @lmr */
	struct ferry_tp_mr *lmr;
	uint64_t raddr;
	uint64_t rkey;
	size_t len;
	void *ctx;  /* on_rdma_done(ctx, status) */
	int status; /* out: 0 posted (it will complete), or why not */
};

#define FERRY_TP_POLL_LAST (1u << 0) /* poll(): the caller stops polling now */
/*
 * poll() of a holding spin (transports with FERRY_TP_CAP_POLL_MSG; lib/coll/
 * waits so): the caller spins on poll(), every call with HOLD, the first
 * with HOLD | FIRST and the last with HOLD | LAST, on one thread, and takes
 * every frame that arrives meanwhile on that thread (on_msg runs there,
 * whatever FERRY_TCP_WORKER_POLL says). The progress thread stands aside
 * from the peers' sockets while anyone spins so (tcp: it sleeps on its wake
 * eventfd only), and goes back to them at most FERRY_TP_POLL_LINGER_MS after
 * the last spin ended: the frames the spinner waits for wake no other
 * thread, and back-to-back spins find it still aside.
 */
#define FERRY_TP_POLL_HOLD (1u << 1)
#define FERRY_TP_POLL_FIRST (1u << 2)
/* with HOLD | LAST: the spinner got what it waited for (it may spin again
 * soon), so the progress thread may linger aside; without it, the spinner
 * goes to sleep and the progress thread takes the sockets back at once */
#define FERRY_TP_POLL_LINGER (1u << 3)
#define FERRY_TP_POLL_LINGER_MS 1

/* access for mem_reg(): the least that is needed */
#define FERRY_TP_ACCESS_REMOTE_READ (1u << 0)
#define FERRY_TP_ACCESS_REMOTE_WRITE (1u << 1)

#define FERRY_TP_ADDR_MAX 256 /* bytes of a transport address blob */

/*
 * Back-pressure: a send() from any thread but the progress thread waits,
 * bounded by cfg.timeout_ms, while its peer's queue holds more than this
 * many bytes (a peer that stops reading), and then fails with -EAGAIN: the
 * memory a node queues for a peer stays below this plus one frame. The
 * progress thread never waits (it must flush): what it queues (replies,
 * forwards, hand-overs) follows what the peers sent it, which their own
 * bound limits.
 */
#define FERRY_TP_SENDQ_MAX (128u << 20)

struct ferry_tp;

struct ferry_tp_handler {
	/* a whole frame from @src (may be our own rank); @buf valid during the call */
	void (*on_msg)(void *core, uint32_t src, const void *buf, size_t len);
	/* @src failed (its process is gone, it left, it stayed unreachable, or it
	 * sent garbage); called once per peer. A transport that re-establishes
	 * lost links (tcp, rdma: FERRY_RECONNECT_MS) calls it only when that fails:
	 * frames in between are neither lost nor delivered twice. @err is
	 * -ECONNREFUSED only when the peer's process is known to be gone (no
	 * listener answers its address: tcp), else -FERRY_E_PEER or the cause */
	void (*on_peer_failed)(void *core, uint32_t src, int err);
	/* a one-sided read()/write() finished; @status 0 or a negative errno.
	 * Runs on the progress thread, except where poll() or the transport's
	 * own header says otherwise (a read's may run inside poll()); the
	 * core's handler works from any RCU-registered thread. */
	void (*on_rdma_done)(void *core, void *ctx, int status);
	/* a write_imm() from @src landed (CAP_WRITE_IMM, see above): its bytes
	 * are in place; @tag is the writer's 24 bits. Progress thread, in
	 * order with @src's frames. */
	void (*on_write_imm)(void *core, uint32_t src, uint32_t tag);
	/* the progress thread starts / stops (to register with RCU) */
	void (*on_thread_start)(void *core);
	void (*on_thread_stop)(void *core);
};

struct ferry_tp_config {
	uint32_t rank;
	uint32_t world;
	uint64_t cluster_id;   /* chosen by rank 0; every connection proves it */
	const char *bind_addr; /* IPv4 address or host name to listen on */
	const char *adv_addr;  /* what peers dial when bind_addr is 0.0.0.0; NULL: none */
	int busy_poll;	       /* spin in the progress thread instead of sleeping */
	int timeout_ms;	       /* bound on connection setup */
	const struct ferry_tp_handler *handler;
	void *core; /* first argument of every handler */
	/* the cluster token's key (transport/base/auth.h): when auth is set,
	 * every connection opens with its proof, both ways, before its HELLO */
	int auth;
	uint8_t auth_key[FERRY_AUTH_KEY_LEN];
};

struct ferry_tp_mr {
	void *addr;
	size_t len;
	uint64_t rkey; /* what a peer needs to access it; 0 where meaningless */
};

struct ferry_tp_ops {
	size_t size; /* sizeof(struct ferry_tp_ops): lets the table grow */
	const char *name;
	uint32_t caps;	/* FERRY_TP_CAP_* */
	size_t tp_size; /* bytes of the transport object; embeds struct ferry_tp first */
	size_t mr_size; /* bytes of a memory registration; embeds struct ferry_tp_mr first */

	/* probe: 0 when this transport can run here; else a negative errno and
	 * @why (may be NULL) receives a static explanation. Optional. */
	int (*probe)(const char **why);

	/* set up (listening socket, device, progress thread); cfg copied */
	int (*init)(struct ferry_tp *tp, const struct ferry_tp_config *cfg);
	/* this node's address blob for the bootstrap exchange; *len in/out */
	int (*addr_get)(struct ferry_tp *tp, void *buf, size_t *len);
	/* connect to every peer; @addrs[r] is rank r's blob of @lens[r] bytes;
	 * reads tp->cfg.cluster_id now (the core sets it after init, once
	 * the bootstrap chose it);
	 * returns when all connections stand or after timeout_ms (-ETIMEDOUT,
	 * logging the ranks that did not connect) */
	int (*connect)(struct ferry_tp *tp, const void *const *addrs, const size_t *lens);
	/* queue one frame (the concatenation of @iov) to @dst, which may be
	 * our own rank; never blocks on the network; any thread; waits for
	 * room only as FERRY_TP_SENDQ_MAX says */
	int (*send)(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt);
	/* optional: register memory; a NULL op means no registration is needed */
	int (*mem_reg)(struct ferry_tp *tp, void *addr, size_t len, unsigned access,
		       struct ferry_tp_mr *mr);
	void (*mem_dereg)(struct ferry_tp *tp, struct ferry_tp_mr *mr);
	/* optional (CAP_READ): read @len bytes at @raddr/@rkey of @dst into
	 * @local (inside @lmr); completion through on_rdma_done(@ctx) */
	int (*read)(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		    uint64_t raddr, uint64_t rkey, size_t len, void *ctx);
	/* optional (CAP_READ): post @n reads, those to one destination that
	 * stand next to each other under one doorbell with one completion
	 * signaled; rds[i].status says which were posted (each of those
	 * completes through on_rdma_done, once). Return: 0 when all were, else
	 * the first error. NULL: the core calls read() n times. */
	int (*read_v)(struct ferry_tp *tp, struct ferry_tp_rd *rds, size_t n);
	/* optional: handle the completions that are ready on the calling
	 * thread, so a waiting worker needs no hand-off from the progress
	 * thread: on_rdma_done of a read() may run inside it (a write()'s
	 * still runs on the progress thread); tcp's runs on_msg and
	 * on_peer_failed there when it may (FERRY_TCP_WORKER_POLL=1), one
	 * handler at a time with its progress thread. Any RCU-registered thread, not
	 * inside a handler; never blocks (another poller busy: returns 0);
	 * must not be called once fini() began. @flags FERRY_TP_POLL_LAST: the
	 * caller stops polling now (it goes to sleep), so completions must
	 * reach the progress thread again without delay. Return: completions
	 * handled. */
	int (*poll)(struct ferry_tp *tp, unsigned flags);
	/* optional (CAP_WRITE): the same for a write */
	int (*write)(struct ferry_tp *tp, uint32_t dst, const void *local, struct ferry_tp_mr *lmr,
		     uint64_t raddr, uint64_t rkey, size_t len, void *ctx);
	/* optional: forget @dst, whom the core dropped (a protocol error, or a
	 * failure the core saw first): close its connection, so the peer sees
	 * the drop too, and fail what is queued for it. on_peer_failed is not
	 * called for it again. The progress thread (inside a handler). */
	void (*drop)(struct ferry_tp *tp, uint32_t dst);
	/* stop the progress thread (no handler runs after it returns), close
	 * everything; the core frees the object. Peers are told with a
	 * FERRY_MSG_BYE frame first, so they log a departure, not a failure */
	void (*fini)(struct ferry_tp *tp);
	/* optional: the bytes the transport's message buffers hold now (send
	 * queues, receive buffers, their reuse pools), for ferry_stats(). Any
	 * thread, between connect() and fini(). */
	size_t (*mem_held)(struct ferry_tp *tp);
	/* optional (CAP_WRITE_IMM): a WRITE and its notice in one, as the
	 * comment at FERRY_TP_CAP_WRITE_IMM says; @tag must fit
	 * FERRY_TP_IMM_TAG_BITS; on_rdma_done(@ctx) once the receiver
	 * acknowledged it. Any thread; never blocks on the network. */
	int (*write_imm)(struct ferry_tp *tp, uint32_t dst, const void *local,
			 struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey, size_t len,
			 uint32_t tag, void *ctx);
};

/* the base every transport object embeds first */
struct ferry_tp {
	const struct ferry_tp_ops *ops;
	struct ferry_tp_config cfg;
};

/* an address blob "a.b.c.d:port" (the tcp and rdma transports' format) -> sockaddr;
 * 0 or -EINVAL */
int ferry__tp_parse_ipv4(const void *blob, size_t len, struct sockaddr_in *sa);

/* at the sender: is the frame in @iov one the peer will accept (header check,
 * len equal to the bytes given)? A bad one would cost the whole connection at
 * the receiver. Logs once; 0 with the frame's length, or -EINVAL. */
int ferry__tp_check_frame(const struct ferry_tp *tp, uint32_t dst, const struct iovec *iov,
			  int iovcnt, size_t *total_p);

/* fini(): tell every peer, through tp->ops->send, that this close is on
 * purpose (a FERRY_MSG_BYE frame), so it logs a departure, not a failure */
void ferry__tp_send_bye(struct ferry_tp *tp);

/* a CLOCK_MONOTONIC deadline cfg.timeout_ms from now (30 s if unset), for
 * waits on condition variables made with that clock; Return: the ms used */
int ferry__tp_deadline(const struct ferry_tp *tp, struct timespec *ts);

/* the transports that exist */
extern const struct ferry_tp_ops ferry__tcp_ops;
extern const struct ferry_tp_ops ferry__rdma_ops;
extern const struct ferry_tp_ops ferry__loop_ops; /* tests: tcp + in-process one-sided */

#endif /* FERRY_TRANSPORT_H */

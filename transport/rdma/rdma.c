/* SPDX-License-Identifier: MIT */
/*
 * rdma.c - the RDMA transport: rdma_cm connection setup, one reliable-connected
 * queue pair per pair of nodes, Ferry frames carried in chunks through
 * pre-posted receive buffers under credit-based flow control, one-sided RDMA
 * READ and WRITE, and one progress thread per transport instance.
 *
 * Resources (init)
 *
 *   rdma_cm picks the device from the bind address, so the listening cm_id is
 *   bound first and its verbs context (rdma_cm's own, kept open by
 *   rdma_get_devices() until fini) is the one everything else lives on:
 *
 *     listen cm_id (bind_addr:0) --> ibv_context --> PD --> send CQ, recv CQ
 *                                                        (one completion channel)
 *                                                   --> one registered region:
 *                                                       per peer RDMA_RECVS receive
 *                                                       and RDMA_SBUFS send buffers
 *                                                       of RDMA_CHUNK bytes
 *
 *   ibv_fork_init() runs before any of it (see docs/rdma.md, "fork").
 *
 * Connection setup (ops->connect on the caller's thread; the work on the
 * progress thread, which owns every cm_id)
 *
 *     rank j (j < i)                                  rank i
 *     listening since init  <-- REQ{HELLO i, bufs} --  rdma_resolve_addr/route,
 *     check HELLO: cluster, world, rank > j,           create QP, post receives,
 *     buffers; create QP, post receives,               rdma_connect; retried with
 *     rdma_accept(HELLO j) ----- REP --------------->  backoff until the deadline
 *     ESTABLISHED                                      ESTABLISHED: check HELLO j
 *
 *   The private data is the same HELLO frame the tcp transport sends first
 *   (struct ferry_msg_hdr + struct ferry_msg_hello), followed by this
 *   transport's buffer geometry (struct rdma_hello_ext), which must match. A
 *   request that fails its check is rejected (with a reason in the REJ's
 *   private data), logged once and not counted. Requests that arrive before
 *   connect() was called (the cluster id is not known yet) are held and judged
 *   when it is. Once every peer is up the listener is destroyed, so later
 *   strangers are refused by the kernel.
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
 *     31      24 23 22        16 15                0
 *     +---------+--+------------+------------------+
 *     | 0xf7    |C | 0          | credits returned |   C: credit-only, no data
 *     +---------+--+------------+------------------+
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
 *   completions come back. It never waits for the network. A small frame
 *   also waits in the out queue while RDMA_CORK_INFLIGHT sends and a
 *   signaled work request are in flight (its completion flushes the queue):
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
 *   One-sided read()/write() post on the same queue pair, in the same order
 *   as the frames around them (an op waits in the out queue behind queued
 *   bytes), always signaled; read_v() posts a run of READs to one peer as
 *   one chain, only its last signaled. on_rdma_done() runs on the progress
 *   thread, or, for a READ, on a worker that called poll() to take its own
 *   completions (then the send CQ stays unarmed, see rdma_cq_input()).
 *   Frames to our own rank, and one-sided operations on our own memory, go
 *   through the self queue and the wake eventfd.
 *
 * Failures: a work completion in error, RDMA_CM_EVENT_DISCONNECTED, a fatal
 * async event on the peer's queue pair, a chunk with a bad header or a frame
 * with a bad header: one log line that names the rank and the cause, the peer
 * is marked failed, its queued and posted one-sided operations complete with
 * -FERRY_E_PEER, on_peer_failed() runs once, and the other peers go on.
 */
#define _GNU_SOURCE /* pthread_setname_np, IOV_MAX */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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
#define RDMA_RECV_EXTRA (RDMA_CREDITS / RDMA_CREDIT_BATCH + 1) /* for credit-only messages */
#define RDMA_RECVS (RDMA_CREDITS + RDMA_RECV_EXTRA)	       /* receive buffers per peer */
#define RDMA_SBUFS 32u					       /* send buffers per peer */
#define RDMA_SIGNAL_EVERY 8u				       /* selective signaling of sends */
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
#define RDMA_CORK_MAX (16u << 10) /* frames up to this size may wait */
#define RDMA_QCHUNK (64u << 10)	  /* least capacity of an out queue entry */
#define RDMA_DRAIN_MS 1000	  /* fini: bound on flushing the out queues */
#define RDMA_RETRY_MIN_MS 10	  /* backoff between dials of a refusing rank */
#define RDMA_RETRY_MAX_MS 250
#define RDMA_RESOLVE_MS 2000 /* rdma_resolve_addr / _route timeout */
#define RDMA_MAX_HELD 64     /* connection requests held until connect() */
#define RDMA_GID_SCAN 16     /* GID table entries read from sysfs */
#define RDMA_IMM_TAG 0xf7u
#define RDMA_IMM_CREDIT_ONLY (1u << 23)
#define RDMA_REJ_MAGIC 0x4a525946u /* "FYRJ" */
#define RDMA_CM_PDATA_MAX 64	   /* private data bytes we look at */

_Static_assert(sizeof(struct ferry_msg_hdr) == 16, "the wire header is 16 bytes");
_Static_assert(sizeof(struct ferry_msg_hello) == 16, "the HELLO body is 16 bytes");
_Static_assert(RDMA_CHUNK % FERRY_MSG_ALIGN == 0, "chunks keep frames 8-byte aligned");
_Static_assert(RDMA_SBUFS >= RDMA_SIGNAL_EVERY, "every window of sends holds a signaled one");
_Static_assert(RDMA_CREDITS < (1u << 16), "credits fit the immediate");
_Static_assert(RDMA_RECVS < (1u << 16), "a buffer index fits the wr_id");
_Static_assert(RDMA_SQ_MIN > RDMA_SBUFS + 2, "the send queue holds every send buffer");

/* the transport's part of the connection private data, after the HELLO frame */
struct rdma_hello_ext {
	uint32_t chunk;	  /* RDMA_CHUNK */
	uint32_t credits; /* RDMA_CREDITS */
};

#define RDMA_PDATA_LEN (RDMA_HELLO_LEN + sizeof(struct rdma_hello_ext))
_Static_assert(RDMA_PDATA_LEN <= 56, "a REQ carries 56 bytes of private data over rdma_cm");

/* why a connection request was rejected: the REJ's private data */
enum rdma_rej_reason {
	RDMA_REJ_HELLO = 1, /* not a HELLO of this cluster */
	RDMA_REJ_DUP,	    /* that rank is connected already */
	RDMA_REJ_CLOSED,    /* the cluster is connected, or gave up */
	RDMA_REJ_BUSY,	    /* too many requests held */
	RDMA_REJ_RESOURCES, /* no queue pair could be made */
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
};

enum rdma_peer_state {
	RDMA_PEER_IDLE, /* not connected yet */
	RDMA_PEER_UP,
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
	uint64_t sq_posted, sq_done; /* work requests on the send queue */
	struct rdma_sig *sig;	     /* ring of sq_depth records */
	uint32_t sig_head, sig_n;
	struct rdma_qent *q_head, *q_tail;
	int send_err;
	int break_logged; /* a worker logged why it broke the peer */

	/* set in init, read-only afterwards */
	uint32_t rank;
	unsigned char *rbuf; /* RDMA_RECVS receive buffers */
	unsigned char *sbuf; /* RDMA_SBUFS send buffers */

	/* progress thread only */
	struct rdma_conn *conn; /* the connection (attempt) that owns qp */
	int rx_ok;		/* chunks on qp are delivered (from attach until failure) */
	int live;		/* UP and not failed */
	int bye;		/* it sent FERRY_MSG_BYE: its disconnect is a departure */
	int reported;		/* on_peer_failed() was called */
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

/* dial state for one lower rank */
struct rdma_dial {
	struct sockaddr_in sa;
	char where[64];
	struct rdma_conn *conn; /* the attempt in flight; progress thread */
	int64_t next_ms;	/* earliest next attempt; progress thread */
	int backoff_ms;
	int logged;    /* a refused HELLO was logged */
	char why[160]; /* the last failure; under setup_lock */
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
	size_t pinned; /* bytes this instance counts in rdma_pinned */
	uint32_t sq_depth;
	uint32_t max_rd;
	uint32_t max_msg;

	int epfd;
	int wake_fd;
	pthread_t thread;
	int thread_started;
	struct rdma_peer *peers; /* one per rank; ours unused */
	int connected;		 /* connect() succeeded; caller's thread only */

	pthread_mutex_t self_lock; /* guards self_head, self_tail */
	struct rdma_selfmsg *self_head;
	struct rdma_selfmsg *self_tail;

	pthread_mutex_t mr_lock; /* guards mrs */
	struct rdma_mr *mrs;

	int closing;	  /* atomic: fini() asked the progress thread to stop */
	int fail_pending; /* atomic: some peer is BROKEN */

	/* shared by connect() and the progress thread, under setup_lock */
	pthread_mutex_t setup_lock;
	pthread_cond_t setup_cond;
	enum rdma_phase phase;
	uint32_t missing;
	uint8_t *up;		 /* per rank: connected */
	struct rdma_dial *dials; /* ranks [0, rank) */
	unsigned char hello[RDMA_PDATA_LEN];

	/* progress thread only */
	uint64_t polls_seen;  /* polls when last looked at */
	int scq_off;	      /* send CQ not armed: workers poll it (atomic writes) */
	int scq_rearm;	      /* atomic: a worker stopped polling; arm it now */
	int64_t scq_check_ms; /* when to look again whether they still do */
	enum rdma_phase seen_phase;
	struct rdma_conn *conns; /* every cm_id but the listener */
	uint32_t nheld;
	uint32_t *dirty; /* ranks to flush after a batch of completions */
	uint32_t ndirty;
};

static inline struct rdma_tp *to_rdma(struct ferry_tp *tp)
{
	return container_of(tp, struct rdma_tp, base);
}

static inline struct rdma_mr *to_rdma_mr(struct ferry_tp_mr *mr)
{
	return container_of(mr, struct rdma_mr, base);
}

/* bytes this process registered through this transport (RLIMIT_MEMLOCK check) */
static uint64_t rdma_pinned;

static int64_t rdma_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void rdma_sa_str(const struct sockaddr *sa, char *buf, size_t len)
{
	char ip[INET_ADDRSTRLEN];
	const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

	if (!sa || sa->sa_family != AF_INET || !inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip))) {
		snprintf(buf, len, "?");
		return;
	}
	snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(in->sin_port));
}

static void rdma_bytes_str(uint64_t n, char *buf, size_t len)
{
	if (n >= (1ull << 30))
		snprintf(buf, len, "%.1f GiB", (double)n / (1ull << 30));
	else if (n >= (1u << 20))
		snprintf(buf, len, "%.1f MiB", (double)n / (1u << 20));
	else
		snprintf(buf, len, "%" PRIu64 " KiB", n >> 10);
}

/* Context: any thread. Wakes the progress thread out of epoll_wait(). */
static void rdma_wake(struct rdma_tp *t)
{
	uint64_t one = 1;

	/* EAGAIN means the counter is already non-zero: the wake is pending */
	if (write(t->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		ferry_err("rdma: rank %u: cannot wake the progress thread: %s", t->base.cfg.rank,
			  strerror(errno));
}

static int rdma_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK))
		return -errno;
	return 0;
}

/* ---- memlock ------------------------------------------------------------ */

/* 1 when the process holds CAP_IPC_LOCK, which exempts it from RLIMIT_MEMLOCK */
static int rdma_has_ipc_lock(void)
{
	char line[256];
	FILE *f = fopen("/proc/self/status", "re");
	int ret = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long caps;

		if (sscanf(line, "CapEff: %llx", &caps) == 1) {
			ret = !!(caps & (1ull << 14)); /* CAP_IPC_LOCK */
			break;
		}
	}
	fclose(f);
	return ret;
}

/*
 * rdma_memlock_check - will registering @more bytes fit under RLIMIT_MEMLOCK?
 * @what: what needs them, for the log
 *
 * Counts what this transport registered in the process so far; the kernel
 * also counts other pinned memory, so this catches the common case (a small
 * default limit) with a clear message, not every case.
 * Return: 0, or -ENOMEM after logging the limit and how to raise it.
 */
static int rdma_memlock_check(uint32_t rank, uint64_t more, const char *what)
{
	char need[32], lim[32], have_s[32];
	struct rlimit rl;
	uint64_t have;

	if (getrlimit(RLIMIT_MEMLOCK, &rl) || rl.rlim_cur == RLIM_INFINITY)
		return 0;
	have = __atomic_load_n(&rdma_pinned, __ATOMIC_RELAXED);
	if (have + more <= rl.rlim_cur || rdma_has_ipc_lock())
		return 0;
	rdma_bytes_str(more, need, sizeof(need));
	rdma_bytes_str(rl.rlim_cur, lim, sizeof(lim));
	rdma_bytes_str(have, have_s, sizeof(have_s));
	ferry_err(
		"rdma: rank %u: registering %s needs %s of locked memory (%s registered already) but the "
		"memlock limit (RLIMIT_MEMLOCK) is %s; raise it with `ulimit -l unlimited` "
		"before starting the process, or with a memlock line in "
		"/etc/security/limits.conf (e.g. `* - memlock unlimited`); containers need "
		"--ulimit memlock=-1",
		rank, what, need, have_s, lim);
	return -ENOMEM;
}

/* ---- device, port and GID ----------------------------------------------- */

/* the first active port of @dev, 0 when none; *err_p the errno of a failed open */
static uint8_t rdma_active_port(struct ibv_device *dev, int *err_p)
{
	struct ibv_device_attr da;
	struct ibv_context *ctx;
	uint8_t port = 0;

	*err_p = 0;
	ctx = ibv_open_device(dev);
	if (!ctx) {
		*err_p = errno ? errno : ENODEV;
		return 0;
	}
	if (!ibv_query_device(ctx, &da)) {
		for (uint8_t p = 1; p <= da.phys_port_cnt && !port; p++) {
			struct ibv_port_attr pa;

			if (!ibv_query_port(ctx, p, &pa) && pa.state == IBV_PORT_ACTIVE)
				port = p;
		}
	}
	ibv_close_device(ctx);
	return port;
}

/*
 * rdma_pick_device - FERRY_RDMA_DEVICE, or the first device with an active port
 * @name: receives the device's name (IBV_SYSFS_NAME_MAX bytes)
 * @port_p: receives its first active port
 * @why_p: on failure, the reason (static, per thread)
 *
 * Opens and closes what it looks at; leaves nothing open. Context: any thread.
 * Return: 0 or -FERRY_E_NODEV.
 */
static int rdma_pick_device(char *name, uint8_t *port_p, const char **why_p)
{
	static __thread char why[192];
	const char *want = getenv("FERRY_RDMA_DEVICE");
	struct ibv_device **list;
	int n = 0, err = 0, ret = -FERRY_E_NODEV;
	uint8_t port = 0;

	if (want && !*want)
		want = NULL;
	list = ibv_get_device_list(&n);
	if (!list || n <= 0) {
		*why_p = "no RDMA device (ibv_get_device_list found none)";
		goto out_free;
	}
	for (int i = 0; i < n; i++) {
		const char *dn = ibv_get_device_name(list[i]);

		if (want && strcmp(dn, want))
			continue;
		port = rdma_active_port(list[i], &err);
		if (port) {
			snprintf(name, IBV_SYSFS_NAME_MAX, "%s", dn);
			*port_p = port;
			ret = 0;
			goto out_free;
		}
		if (want || n == 1) {
			if (err)
				snprintf(why, sizeof(why),
					 "cannot open device %s: %s (is /dev/infiniband "
					 "there?)",
					 dn, strerror(err));
			else
				snprintf(why, sizeof(why), "device %s has no active port", dn);
			*why_p = why;
			goto out_free;
		}
	}
	if (want)
		snprintf(why, sizeof(why), "FERRY_RDMA_DEVICE=%s does not exist", want);
	else
		snprintf(why, sizeof(why), "none of the %d RDMA devices has an active port", n);
	*why_p = why;
out_free:
	if (list)
		ibv_free_device_list(list);
	return ret;
}

static int rdma_read_line(const char *path, char *buf, size_t len)
{
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	return 0;
}

/* the IPv4 address GID @idx of @dev port @port maps, when it is a RoCE v2 IPv4 GID */
static int rdma_gid_ipv4(const char *dev, uint8_t port, int idx, struct in_addr *in)
{
	char path[256], buf[64];
	struct in6_addr a6;

	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%u/gid_attrs/types/%d", dev,
		 port, idx);
	if (rdma_read_line(path, buf, sizeof(buf)) || strcmp(buf, "RoCE v2"))
		return -1;
	snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%u/gids/%d", dev, port, idx);
	if (rdma_read_line(path, buf, sizeof(buf)) || inet_pton(AF_INET6, buf, &a6) != 1 ||
	    !IN6_IS_ADDR_V4MAPPED(&a6))
		return -1;
	memcpy(&in->s_addr, &a6.s6_addr[12], 4);
	return 0;
}

/* FERRY_RDMA_GID_INDEX: -1 when unset; -2 (logged) when malformed */
static int rdma_env_gid_index(void)
{
	const char *s = getenv("FERRY_RDMA_GID_INDEX");
	char *end;
	long v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < 0 || v > 65535) {
		ferry_err("rdma: FERRY_RDMA_GID_INDEX=%s is not a GID index (0, 1, ...)", s);
		return -2;
	}
	return (int)v;
}

/*
 * rdma_pick_addr - the IPv4 address to listen on, and its GID index
 *
 * rdma_cm resolves the GID from the address itself; the GID table serves to
 * find the device's address where the bind address cannot carry rdma_cm
 * (loopback, or unspecified), and to warn when FERRY_RDMA_GID_INDEX names a
 * GID of another address. Return: 0 or a negative errno (logged).
 */
static int rdma_pick_addr(struct rdma_tp *t, const char *host)
{
	uint32_t rank = t->base.cfg.rank;
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
	struct in_addr in = { 0 }, g;
	int env_idx = rdma_env_gid_index(), found = -1, ret;
	char ip[INET_ADDRSTRLEN];

	if (env_idx == -2)
		return -EINVAL;
	if (host && *host && inet_pton(AF_INET, host, &in) != 1) {
		struct addrinfo *res;

		ret = getaddrinfo(host, NULL, &hints, &res);
		if (ret) {
			ferry_err("rdma: cannot resolve the bind address \"%s\" to IPv4: %s", host,
				  gai_strerror(ret));
			return -EADDRNOTAVAIL;
		}
		in = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
		freeaddrinfo(res);
	}
	if (!in.s_addr || (ntohl(in.s_addr) >> 24) == 127) {
		/* rdma_cm cannot use loopback: take the device's own IPv4 address */
		int ok = -1;

		if (env_idx >= 0) {
			ok = rdma_gid_ipv4(t->dev_name, t->port_num, env_idx, &g);
			found = env_idx;
		}
		for (int i = 0; env_idx < 0 && i < RDMA_GID_SCAN && ok; i++) {
			ok = rdma_gid_ipv4(t->dev_name, t->port_num, i, &g);
			found = i;
		}
		if (ok) {
			ferry_err("rdma: rank %u: the bind address \"%s\" cannot carry rdma_cm and "
				  "device %s port %u has no RoCE v2 IPv4 GID%s to use instead; set "
				  "FERRY_BIND_ADDR to the IPv4 address of the interface %s sits on",
				  rank, host && *host ? host : "(none)", t->dev_name, t->port_num,
				  env_idx >= 0 ? " at FERRY_RDMA_GID_INDEX" : "", t->dev_name);
			return -EADDRNOTAVAIL;
		}
		inet_ntop(AF_INET, &g, ip, sizeof(ip));
		ferry_info(
			"rdma: rank %u: rdma_cm cannot use the bind address \"%s\"; listening on "
			"%s, the address of %s (GID index %d), instead",
			rank, host && *host ? host : "(none)", ip, t->dev_name, found);
		in = g;
	} else {
		for (int i = 0; i < RDMA_GID_SCAN && found < 0; i++)
			if (!rdma_gid_ipv4(t->dev_name, t->port_num, i, &g) &&
			    g.s_addr == in.s_addr)
				found = i;
		if (env_idx >= 0 &&
		    (rdma_gid_ipv4(t->dev_name, t->port_num, env_idx, &g) || g.s_addr != in.s_addr))
			ferry_warn(
				"rdma: rank %u: FERRY_RDMA_GID_INDEX=%d is not the RoCE v2 GID of "
				"the bind address %s on %s port %u; rdma_cm uses the address's "
				"own GID%s",
				rank, env_idx, host, t->dev_name, t->port_num,
				found >= 0 ? "" : " (none among the first 16 entries)");
		else if (env_idx >= 0)
			found = env_idx;
	}
	t->gid_index = found;
	t->src_sa = (struct sockaddr_in){ .sin_family = AF_INET, .sin_addr = in };
	return 0;
}

/*
 * rdma_probe - can this transport run here?
 *
 * The device FERRY_RDMA_DEVICE (or any) must exist and have an active port,
 * and rdma_cm's device node must be there. Cheap; leaves nothing open.
 */
static int rdma_probe(const char **why_p)
{
	char name[IBV_SYSFS_NAME_MAX];
	const char *why = NULL;
	uint8_t port;
	int ret;

	ret = rdma_pick_device(name, &port, &why);
	if (!ret && access("/dev/infiniband/rdma_cm", R_OK | W_OK)) {
		why = "rdma_cm is unavailable (/dev/infiniband/rdma_cm is missing or not "
		      "accessible: load rdma_ucm)";
		ret = -FERRY_E_NODEV;
	}
	if (ret && why_p)
		*why_p = why;
	return ret;
}

/* ---- HELLO -------------------------------------------------------------- */

/* our private data; call with setup_lock held, once cluster_id is known */
static void rdma_hello_build(struct rdma_tp *t)
{
	const struct ferry_tp_config *cfg = &t->base.cfg;
	struct ferry_msg_hdr hdr = {
		.magic = FERRY_MSG_MAGIC,
		.version = FERRY_PROTO_VERSION,
		.type = FERRY_MSG_HELLO,
		.len = RDMA_HELLO_LEN,
		.src = cfg->rank,
	};
	struct ferry_msg_hello hello = {
		.cluster_id = cfg->cluster_id,
		.rank = cfg->rank,
		.world = cfg->world,
	};
	struct rdma_hello_ext ext = { .chunk = RDMA_CHUNK, .credits = RDMA_CREDITS };

	memcpy(t->hello, &hdr, sizeof(hdr));
	memcpy(t->hello + sizeof(hdr), &hello, sizeof(hello));
	memcpy(t->hello + RDMA_HELLO_LEN, &ext, sizeof(ext));
}

/*
 * rdma_hello_check - is the peer's private data a HELLO of our cluster?
 * @dialed: the rank we dialed, or -1 for a request we got
 *
 * Context: progress thread, after connect() published the cluster id.
 * Return: the peer's rank, or -1 with @why saying what is wrong.
 */
static int rdma_hello_check(struct rdma_tp *t, const uint8_t *pdata, size_t len, int dialed,
			    char *why, size_t wlen)
{
	const struct ferry_tp_config *cfg = &t->base.cfg;
	struct rdma_hello_ext ext;
	int peer;

	if (len < RDMA_PDATA_LEN) {
		snprintf(why, wlen, "its private data is %zu bytes, not a HELLO", len);
		return -1;
	}
	peer = ferry__proto_check_hello(pdata, RDMA_HELLO_LEN, cfg->cluster_id, cfg->world,
					cfg->rank, dialed, why, wlen);
	if (peer < 0)
		return -1;
	memcpy(&ext, pdata + RDMA_HELLO_LEN, sizeof(ext));
	if (ext.chunk != RDMA_CHUNK || ext.credits != RDMA_CREDITS) {
		snprintf(why, wlen,
			 "its receive buffers (%u x %u bytes) differ from ours (%u x %u): a "
			 "different Ferry build",
			 ext.credits, ext.chunk, RDMA_CREDITS, RDMA_CHUNK);
		return -1;
	}
	return peer;
}

static const char *rdma_rej_str(uint32_t reason)
{
	switch (reason) {
	case RDMA_REJ_HELLO:
		return "it did not accept our HELLO (see its log)";
	case RDMA_REJ_DUP:
		return "it counts us as connected already";
	case RDMA_REJ_CLOSED:
		return "its cluster is connected or gave up";
	case RDMA_REJ_BUSY:
		return "it holds too many requests";
	case RDMA_REJ_RESOURCES:
		return "it could not make a queue pair";
	default:
		return "an unknown reason";
	}
}

/* ---- out queue ---------------------------------------------------------- */

/* a gather cursor over a caller's iovec */
struct rdma_cursor {
	const struct iovec *iov;
	int cnt;
	int i;
	size_t off;
};

static void rdma_cursor_copy(struct rdma_cursor *c, unsigned char *dst, size_t n)
{
	while (n) {
		const struct iovec *v = &c->iov[c->i];
		size_t take = v->iov_len - c->off;

		if (!take) {
			c->i++;
			c->off = 0;
			continue;
		}
		if (take > n)
			take = n;
		memcpy(dst, (const unsigned char *)v->iov_base + c->off, take);
		dst += take;
		n -= take;
		c->off += take;
	}
}

static void rdma_q_push(struct rdma_peer *p, struct rdma_qent *e)
{
	e->next = NULL;
	if (p->q_tail)
		p->q_tail->next = e;
	else
		p->q_head = e;
	p->q_tail = e;
}

static void rdma_q_pop(struct rdma_peer *p)
{
	p->q_head = p->q_head->next;
	if (!p->q_head)
		p->q_tail = NULL;
}

/*
 * rdma_q_append - queue the next @n bytes of a frame from @c
 *
 * All or nothing: on -ENOMEM the queue is unchanged. Call with p->lock held.
 */
static int rdma_q_append(struct rdma_peer *p, struct rdma_cursor *c, size_t n)
{
	struct rdma_qent *tail = p->q_tail, *fresh = NULL;
	size_t room = tail && !tail->op ? tail->cap - tail->len : 0, fill;

	if (n > room) {
		size_t cap = n - room < RDMA_QCHUNK ? RDMA_QCHUNK : n - room;

		fresh = malloc(sizeof(*fresh) + cap);
		if (!fresh)
			return -ENOMEM;
		memset(fresh, 0, sizeof(*fresh));
		fresh->cap = cap;
	}
	fill = n < room ? n : room;
	if (fill) {
		rdma_cursor_copy(c, tail->data + tail->len, fill);
		tail->len += fill;
		n -= fill;
	}
	if (fresh) {
		rdma_cursor_copy(c, fresh->data, n);
		fresh->len = n;
		rdma_q_push(p, fresh);
	}
	return 0;
}

/* ---- posting (call with p->lock held) ------------------------------------ */

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

static void rdma_sig_push(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op *op)
{
	uint32_t i = (p->sig_head + p->sig_n) % t->sq_depth;

	p->sig[i] = (struct rdma_sig){ .sq_after = p->sq_posted, .s_after = p->s_posted, .op = op };
	p->sig_n++;
}

/* post the @n bytes in the next send buffer */
static int rdma_post_chunk(struct rdma_tp *t, struct rdma_peer *p, size_t n)
{
	bool sig = p->s_posted % RDMA_SIGNAL_EVERY == RDMA_SIGNAL_EVERY - 1;
	struct ibv_sge sge = {
		.addr = (uintptr_t)rdma_sbuf(p, p->s_posted),
		.length = (uint32_t)n,
		.lkey = t->region_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = rdma_wr_id(sig ? RDMA_WR_SIG : RDMA_WR_UNSIG, p->rank, p->gen, 0),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = sig ? IBV_SEND_SIGNALED : 0,
		.imm_data = htonl(RDMA_IMM_TAG << 24 | p->owed),
	};
	struct ibv_send_wr *bad;
	int ret;

	ret = ibv_post_send(p->qp, &wr, &bad);
	if (ret)
		return -ret;
	p->owed = 0;
	p->credits--;
	p->s_posted++;
	p->sq_posted++;
	if (sig)
		rdma_sig_push(t, p, NULL);
	return 0;
}

/* a credit-only message: no data, no credit of its own, always signaled */
static int rdma_post_credit(struct rdma_tp *t, struct rdma_peer *p)
{
	struct ibv_send_wr wr = {
		.wr_id = rdma_wr_id(RDMA_WR_SIG, p->rank, p->gen, 0),
		.opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(RDMA_IMM_TAG << 24 | RDMA_IMM_CREDIT_ONLY | p->owed),
	};
	struct ibv_send_wr *bad;
	int ret;

	ret = ibv_post_send(p->qp, &wr, &bad);
	if (ret)
		return -ret;
	p->owed = 0;
	p->sq_posted++;
	rdma_sig_push(t, p, NULL);
	return 0;
}

static int rdma_post_op(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op *op)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)op->local,
		.length = op->len,
		.lkey = op->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = rdma_wr_id(RDMA_WR_SIG, p->rank, p->gen, 0),
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op->write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = op->raddr, .rkey = op->rkey },
	};
	struct ibv_send_wr *bad;
	int ret;

	ret = ibv_post_send(p->qp, &wr, &bad);
	if (ret)
		return -ret;
	p->sq_posted++;
	rdma_sig_push(t, p, op);
	return 0;
}

/*
 * rdma_flush_locked - post what the out queue holds, as far as credits, send
 * buffers and send-queue slots allow, then return owed credits if they are
 * many and rode on no chunk
 *
 * Call with p->lock held and the peer UP. Return: 0, or the negative errno of
 * a failed post (the caller fails the peer).
 */
static int rdma_flush_locked(struct rdma_tp *t, struct rdma_peer *p)
{
	struct rdma_qent *e;
	int ret;

	while ((e = p->q_head)) {
		unsigned char *buf;
		size_t n = 0;

		if (e->op) {
			if (!rdma_sq_room(t, p))
				break;
			ret = rdma_post_op(t, p, e->op);
			if (ret)
				return ret;
			rdma_q_pop(p);
			free(e);
			continue;
		}
		if (!rdma_can_post_data(t, p))
			break;
		buf = rdma_sbuf(p, p->s_posted);
		while (n < RDMA_CHUNK && (e = p->q_head) && !e->op) {
			size_t take = e->len - e->off;

			if (take > RDMA_CHUNK - n)
				take = RDMA_CHUNK - n;
			memcpy(buf + n, e->data + e->off, take);
			e->off += take;
			n += take;
			if (e->off == e->len) {
				rdma_q_pop(p);
				free(e);
			}
		}
		ret = rdma_post_chunk(t, p, n);
		if (ret)
			return ret;
	}
	if (p->owed >= RDMA_CREDIT_BATCH && rdma_sq_room(t, p))
		return rdma_post_credit(t, p);
	return 0;
}

/* ---- failures ----------------------------------------------------------- */

static void rdma_self_push(struct rdma_tp *t, struct rdma_selfmsg *m);

/*
 * rdma_op_done - complete an op and the rest of its read_v() chain
 *
 * @worker: called inside poll() on a worker's thread. A read completes right
 * there; a write's handler belongs to the progress thread (the core's
 * relocation code runs on it), so it is handed over through the self queue.
 */
static void rdma_op_done(struct rdma_tp *t, struct rdma_op *op, int status, int worker)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct rdma_op *next;

	for (; op; op = next) {
		next = op->next;
		if (worker && op->write) {
			struct rdma_selfmsg *m = calloc(1, sizeof(*m));

			if (m) {
				m->done = 1;
				m->ctx = op->ctx;
				m->status = status;
				rdma_self_push(t, m);
				free(op);
				continue;
			}
			/* no memory to hand it over: complete it here, late beats never */
		}
		if (h->on_rdma_done)
			h->on_rdma_done(t->base.cfg.core, op->ctx, status);
		free(op);
	}
}

/* free a detached out queue; its ops complete with @status. Progress thread. */
static void rdma_q_cancel(struct rdma_tp *t, struct rdma_qent *e, int status)
{
	struct rdma_qent *next;

	for (; e; e = next) {
		next = e->next;
		if (e->op)
			rdma_op_done(t, e->op, status, 0);
		free(e);
	}
}

/*
 * rdma_peer_fail - mark a peer failed and report it, once
 *
 * The caller has logged the cause. Moves the queue pair to the error state
 * (rdma_disconnect: the peer sees DISCONNECTED); posted one-sided ops then
 * complete with -FERRY_E_PEER as they are flushed, queued ones here.
 * Context: progress thread.
 */
static void rdma_peer_fail(struct rdma_tp *t, struct rdma_peer *p, int err)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct rdma_qent *q;

	pthread_mutex_lock(&p->lock);
	p->state = RDMA_PEER_FAILED;
	q = p->q_head;
	p->q_head = p->q_tail = NULL;
	pthread_mutex_unlock(&p->lock);

	p->live = 0;
	p->rx_ok = 0;
	free(p->asm_buf);
	p->asm_buf = NULL;
	p->asm_cap = p->asm_have = p->asm_need = 0;
	if (p->conn && !p->conn->disconnected) {
		p->conn->disconnected = 1;
		rdma_disconnect(p->conn->id);
	}
	if (!p->reported) {
		p->reported = 1;
		if (h->on_peer_failed)
			h->on_peer_failed(t->base.cfg.core, p->rank, err);
	}
	rdma_q_cancel(t, q, -FERRY_E_PEER);
}

/* Context: progress thread, after a sender flagged fail_pending. */
static void rdma_fail_broken(struct rdma_tp *t)
{
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct rdma_peer *p = &t->peers[r];
		int err;

		pthread_mutex_lock(&p->lock);
		err = p->state == RDMA_PEER_BROKEN ? p->send_err : 0;
		pthread_mutex_unlock(&p->lock);
		if (!err)
			continue;
		if (!p->break_logged)
			ferry_warn(
				"rdma: rank %u: posting to rank %u failed (%s); marking it failed",
				t->base.cfg.rank, r, strerror(err));
		rdma_peer_fail(t, p, -FERRY_E_PEER);
	}
}

/* a sender could not post: the progress thread fails the peer. Call with p->lock held. */
static void rdma_peer_break(struct rdma_tp *t, struct rdma_peer *p, int err)
{
	if (p->state != RDMA_PEER_UP)
		return;
	p->state = RDMA_PEER_BROKEN;
	p->send_err = err > 0 ? err : EIO;
	__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
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
		rdma_peer_fail(t, p, -FERRY_E_PROTO);
		return 0;
	}
	if (hdr.src != p->rank) {
		ferry_warn("rdma: rank %u sent rank %u a frame that claims to come from rank %u; "
			   "dropping its connection and marking it failed",
			   p->rank, t->base.cfg.rank, hdr.src);
		rdma_peer_fail(t, p, -FERRY_E_PROTO);
		return 0;
	}
	return hdr.len;
}

static int rdma_rx_nomem(struct rdma_tp *t, struct rdma_peer *p, size_t len)
{
	ferry_err("rdma: rank %u: no memory for a %zu-byte frame from rank %u; dropping its "
		  "connection",
		  t->base.cfg.rank, len, p->rank);
	rdma_peer_fail(t, p, -ENOMEM);
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

static void rdma_mark_dirty(struct rdma_tp *t, struct rdma_peer *p)
{
	if (!p->dirty) {
		p->dirty = 1;
		t->dirty[t->ndirty++] = p->rank;
	}
}

static int rdma_post_recv(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(p->rbuf + (size_t)idx * RDMA_CHUNK),
		.length = RDMA_CHUNK,
		.lkey = t->region_mr->lkey,
	};
	struct ibv_recv_wr wr = {
		.wr_id = rdma_wr_id(RDMA_WR_RECV, p->rank, p->gen, idx),
		.sg_list = &sge,
		.num_sge = 1,
	};
	struct ibv_recv_wr *bad;

	return -ibv_post_recv(p->qp, &wr, &bad);
}

/* one chunk arrived in receive buffer @idx of @p */
static void rdma_rx_chunk(struct rdma_tp *t, struct rdma_peer *p, uint32_t idx,
			  const struct ibv_wc *wc)
{
	const char *why = NULL;
	uint32_t imm = 0, credits = 0, len = wc->byte_len;
	bool credit_only = false;
	int ret;

	if (!(wc->wc_flags & IBV_WC_WITH_IMM)) {
		why = "it carries no immediate header";
	} else {
		imm = ntohl(wc->imm_data);
		credits = imm & 0xffff;
		credit_only = imm & RDMA_IMM_CREDIT_ONLY;
		if (imm >> 24 != RDMA_IMM_TAG || (imm & 0x7f0000))
			why = "its immediate header is not ours";
		else if (credit_only && len)
			why = "a credit-only chunk carries data";
		else if (!credit_only && !len)
			why = "a data chunk is empty";
		else if (len % FERRY_MSG_ALIGN)
			why = "its length is not a multiple of 8";
	}
	pthread_mutex_lock(&p->lock);
	if (!why && p->credits + credits > RDMA_CREDITS)
		why = "it returns more credits than it was given";
	else if (!why && !credit_only && p->owed >= RDMA_CREDITS)
		why = "it sent more chunks than it had credits";
	if (!why)
		p->credits += credits;
	pthread_mutex_unlock(&p->lock);
	if (why) {
		ferry_warn(
			"rdma: rank %u sent rank %u a chunk with a bad header (%s); dropping its "
			"connection and marking it failed",
			p->rank, t->base.cfg.rank, why);
		rdma_peer_fail(t, p, -FERRY_E_PROTO);
		return;
	}
	if (credits)
		rdma_mark_dirty(t, p);
	if (!credit_only && rdma_rx_stream(t, p, p->rbuf + (size_t)idx * RDMA_CHUNK, len))
		return;
	ret = rdma_post_recv(t, p, idx);
	if (ret) {
		ferry_warn("rdma: rank %u: reposting a receive buffer for rank %u failed (%s); "
			   "marking it failed",
			   t->base.cfg.rank, p->rank, strerror(-ret));
		rdma_peer_fail(t, p, -FERRY_E_PEER);
		return;
	}
	if (!credit_only) {
		pthread_mutex_lock(&p->lock);
		p->owed++;
		pthread_mutex_unlock(&p->lock);
		rdma_mark_dirty(t, p);
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
	if (wc->status != IBV_WC_SUCCESS && !p->live)
		return; /* an attempt that fails before it stood: the cm events tell */
	if (wc->status == IBV_WC_WR_FLUSH_ERR) {
		/* the queue pair went to the error state for a cause seen elsewhere, if at all */
		if (p->bye)
			ferry_info("rdma: rank %u left (its queue pair to rank %u closed)", p->rank,
				   t->base.cfg.rank);
		else
			ferry_warn(
				"rdma: rank %u: the queue pair to rank %u went to the error state "
				"(its receives were flushed); marking it failed",
				t->base.cfg.rank, p->rank);
		rdma_peer_fail(t, p, -FERRY_E_PEER);
		return;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		ferry_warn("rdma: rank %u: a receive from rank %u failed (%s); marking it failed",
			   t->base.cfg.rank, p->rank, ibv_wc_status_str(wc->status));
		rdma_peer_fail(t, p, -FERRY_E_PEER);
		return;
	}
	if (wc->opcode != IBV_WC_RECV) {
		ferry_warn("rdma: rank %u sent rank %u a chunk with a bad header (opcode %d, not a "
			   "send); dropping its connection and marking it failed",
			   p->rank, t->base.cfg.rank, wc->opcode);
		rdma_peer_fail(t, p, -FERRY_E_PROTO);
		return;
	}
	rdma_rx_chunk(t, p, (uint32_t)(wc->wr_id >> 16) & 0xffff, wc);
}

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
		if (wc->status != IBV_WC_SUCCESS) {
			report = 1;
			p->break_logged = 1;
			rdma_peer_break(t, p, EIO);
		} else if (p->q_head || p->owed >= RDMA_CREDIT_BATCH) {
			ret = rdma_flush_locked(t, p);
			if (ret)
				rdma_peer_break(t, p, -ret);
		}
	}
	pthread_mutex_unlock(&p->lock);
	if (rec.op)
		what = rec.op->write ? "an RDMA WRITE" : "an RDMA READ";
	if (report)
		ferry_warn("rdma: rank %u: %s to rank %u failed (%s); marking it failed",
			   t->base.cfg.rank, what, p->rank, ibv_wc_status_str(wc->status));
	rdma_op_done(t, rec.op, rdma_wc_errno(wc->status), worker);
	if (worker) {
		if (report || ret)
			rdma_wake(t);
		return;
	}
	if (wc->status == IBV_WC_SUCCESS) {
		if (p->live)
			rdma_mark_dirty(t, p);
		return;
	}
	if (p->live) {
		ferry_warn("rdma: rank %u: %s to rank %u failed (%s); marking it failed",
			   t->base.cfg.rank, what, p->rank, ibv_wc_status_str(wc->status));
		rdma_peer_fail(t, p, -FERRY_E_PEER);
	}
}

/* flush the peers that completions or credits touched */
static void rdma_flush_dirty(struct rdma_tp *t)
{
	for (uint32_t i = 0; i < t->ndirty; i++) {
		struct rdma_peer *p = &t->peers[t->dirty[i]];
		int ret = 0;

		p->dirty = 0;
		if (!p->live)
			continue;
		pthread_mutex_lock(&p->lock);
		if (p->state == RDMA_PEER_UP)
			ret = rdma_flush_locked(t, p);
		pthread_mutex_unlock(&p->lock);
		if (ret) {
			ferry_warn(
				"rdma: rank %u: posting to rank %u failed (%s); marking it failed",
				t->base.cfg.rank, p->rank, strerror(-ret));
			rdma_peer_fail(t, p, -FERRY_E_PEER);
		}
	}
	t->ndirty = 0;
}

/* poll the send CQ empty; t->cq_lock held. Return: completions seen. */
static int rdma_scq_drain(struct rdma_tp *t, int worker)
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
 * rdma_poll_cqs - poll both CQs empty
 *
 * The send CQ first: when a send or a one-sided op fails, its queue pair's
 * receives are flushed right after, and the failure should be reported with
 * its cause, not as a flushed receive. (A worker in poll() may have taken
 * some send completions already.) Return: completions seen. Progress
 * thread.
 */
static int rdma_poll_cqs(struct rdma_tp *t)
{
	struct ibv_wc wc[RDMA_POLL_BATCH];
	int n, total;

	pthread_mutex_lock(&t->cq_lock);
	total = rdma_scq_drain(t, 0);
	pthread_mutex_unlock(&t->cq_lock);
	do {
		n = ibv_poll_cq(t->rcq, RDMA_POLL_BATCH, wc);
		for (int i = 0; i < n; i++)
			rdma_recv_done(t, &wc[i]);
		total += n > 0 ? n : 0;
	} while (n == RDMA_POLL_BATCH);
	if (n < 0)
		ferry_err("rdma: rank %u: ibv_poll_cq failed", t->base.cfg.rank);
	rdma_flush_dirty(t);
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
 * rdma_cq_input - the completion channel is readable: take one event, ack
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
 * rdma_scq_check() re-arms it once RDMA_SCQ_CHECK_MS pass without a poll(),
 * or at once when a worker's last poll() before it sleeps asks for it.
 * Progress thread.
 */
static void rdma_cq_input(struct rdma_tp *t)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	if (!ibv_get_cq_event(t->cc, &cq, &cq_ctx)) {
		ibv_ack_cq_events(cq, 1);
		if (cq == t->scq && rdma_workers_poll(t)) {
			__atomic_store_n(&t->scq_off, 1, __ATOMIC_RELAXED);
			t->scq_check_ms = rdma_now_ms() + RDMA_SCQ_CHECK_MS;
		} else {
			ibv_req_notify_cq(cq, 0);
		}
	}
	rdma_poll_cqs(t);
}

/* the send CQ is not armed: arm it again once no worker polled for a while */
static void rdma_scq_check(struct rdma_tp *t)
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
	rdma_poll_cqs(t); /* what came while it was not armed */
}

/* ---- self queue ---------------------------------------------------------- */

static void rdma_self_push(struct rdma_tp *t, struct rdma_selfmsg *m)
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
	/* a non-empty queue has a wake pending already (see rdma_self_deliver) */
	if (was_empty)
		rdma_wake(t);
}

/* Context: any thread. */
static int rdma_self_send(struct rdma_tp *t, const struct iovec *iov, int iovcnt, size_t total)
{
	struct rdma_selfmsg *m = malloc(sizeof(*m) + total);
	struct rdma_cursor c = { .iov = iov, .cnt = iovcnt };

	if (!m)
		return -ENOMEM;
	memset(m, 0, sizeof(*m));
	rdma_cursor_copy(&c, m->data, total);
	m->len = total;
	rdma_self_push(t, m);
	return 0;
}

/* Context: progress thread. @deliver 0 at shutdown: frames are dropped. */
static void rdma_self_deliver(struct rdma_tp *t, int deliver)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct rdma_selfmsg *m, *next;

	pthread_mutex_lock(&t->self_lock);
	m = t->self_head;
	t->self_head = t->self_tail = NULL;
	pthread_mutex_unlock(&t->self_lock);

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
}

/* ---- connections (progress thread) ---------------------------------------- */

static struct rdma_conn *rdma_conn_new(struct rdma_tp *t, enum rdma_conn_kind kind)
{
	struct rdma_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->kind = kind;
	c->rank = UINT32_MAX;
	c->next = t->conns;
	t->conns = c;
	return c;
}

/*
 * rdma_conn_destroy - destroy a connection's queue pair and cm_id
 *
 * Its events were acked (they always are before they are handled). A peer
 * whose queue pair it was loses it, and bumps its generation so that its
 * stale completions are dropped. Context: progress thread, or fini().
 */
static void rdma_conn_destroy(struct rdma_tp *t, struct rdma_conn *c)
{
	struct rdma_conn **pp;

	if (c->rank < t->base.cfg.world && c->kind != RDMA_CONN_LISTEN) {
		struct rdma_peer *p = &t->peers[c->rank];

		if (p->conn == c) {
			pthread_mutex_lock(&p->lock);
			p->qp = NULL;
			p->gen++;
			pthread_mutex_unlock(&p->lock);
			p->conn = NULL;
			p->live = 0;
			p->rx_ok = 0;
		}
		if (c->kind == RDMA_CONN_DIAL && c->rank < t->base.cfg.rank &&
		    t->dials[c->rank].conn == c)
			t->dials[c->rank].conn = NULL;
	}
	if (c->state == RDMA_CS_HELD)
		t->nheld--;
	for (pp = &t->conns; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	if (c->id) {
		if (c->id->qp)
			rdma_destroy_qp(c->id);
		rdma_destroy_id(c->id);
	}
	free(c);
}

static void rdma_conn_reject(struct rdma_tp *t, struct rdma_conn *c, enum rdma_rej_reason reason)
{
	struct rdma_rej rej = { .magic = RDMA_REJ_MAGIC, .reason = reason };

	rdma_reject(c->id, &rej, sizeof(rej));
	rdma_conn_destroy(t, c);
}

/*
 * rdma_conn_attach - give connection @c a queue pair for rank @r, with @r's
 * receive buffers posted on it
 *
 * A previous attempt that held @r's buffers is destroyed first.
 * Return: 0 or a negative errno (logged); the caller destroys @c.
 */
static int rdma_conn_attach(struct rdma_tp *t, struct rdma_conn *c, uint32_t r)
{
	struct rdma_peer *p = &t->peers[r];
	struct ibv_qp_init_attr qa = {
		.send_cq = t->scq,
		.recv_cq = t->rcq,
		.qp_type = IBV_QPT_RC,
		.cap = {
			.max_send_wr = t->sq_depth,
			.max_recv_wr = RDMA_RECVS,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
	};
	int ret;

	if (p->conn && p->conn != c)
		rdma_conn_destroy(t, p->conn);
	c->rank = r;
	if (rdma_create_qp(c->id, t->pd, &qa)) {
		ret = -errno;
		ferry_err("rdma: rank %u: cannot create a queue pair for rank %u: %s",
			  t->base.cfg.rank, r, strerror(errno));
		return ret;
	}
	pthread_mutex_lock(&p->lock);
	p->qp = c->id->qp;
	p->gen++;
	p->credits = RDMA_CREDITS;
	p->owed = 0;
	p->s_posted = p->s_done = p->sq_posted = p->sq_done = 0;
	p->sig_head = p->sig_n = 0;
	pthread_mutex_unlock(&p->lock);
	p->conn = c;
	p->asm_have = p->asm_need = 0;
	for (uint32_t i = 0; i < RDMA_RECVS; i++) {
		ret = rdma_post_recv(t, p, i);
		if (ret) {
			ferry_err("rdma: rank %u: cannot post receive buffers for rank %u: %s",
				  t->base.cfg.rank, r, strerror(-ret));
			return ret;
		}
	}
	p->rx_ok = 1;
	return 0;
}

static void rdma_conn_param(struct rdma_tp *t, struct rdma_conn_param *cp, uint8_t their_init,
			    uint8_t their_resp, int accepting)
{
	memset(cp, 0, sizeof(*cp));
	cp->private_data = t->hello;
	cp->private_data_len = RDMA_PDATA_LEN;
	cp->responder_resources = (uint8_t)t->max_rd;
	cp->initiator_depth = (uint8_t)t->max_rd;
	if (accepting) {
		if (cp->responder_resources > their_init)
			cp->responder_resources = their_init;
		if (cp->initiator_depth > their_resp)
			cp->initiator_depth = their_resp;
	}
	cp->retry_count = 7;
	cp->rnr_retry_count = 7; /* credits keep buffers posted; never give up on RNR */
}

/* the progress thread's side of connect(): a peer is up */
static void rdma_conn_up(struct rdma_tp *t, struct rdma_conn *c)
{
	struct rdma_peer *p = &t->peers[c->rank];
	int done;

	if (p->conn != c) {
		rdma_conn_destroy(t, c);
		return;
	}
	c->state = RDMA_CS_UP;
	if (!p->reported) {
		/* (a peer that sent garbage before this event is failed: it stays so) */
		pthread_mutex_lock(&p->lock);
		p->state = RDMA_PEER_UP;
		pthread_mutex_unlock(&p->lock);
		p->live = 1;
		/*
		 * Credits owed for chunks that came before this event go back now:
		 * no completion may come to return them if the peer used them all.
		 */
		rdma_mark_dirty(t, p);
		rdma_flush_dirty(t);
	}

	pthread_mutex_lock(&t->setup_lock);
	if (!t->up[c->rank]) {
		t->up[c->rank] = 1;
		t->missing--;
	}
	done = !t->missing && t->phase == RDMA_PHASE_CONNECTING;
	if (done)
		t->phase = RDMA_PHASE_DONE;
	pthread_cond_broadcast(&t->setup_cond);
	pthread_mutex_unlock(&t->setup_lock);
	ferry_dbg("rdma: rank %u is connected to rank %u (%s, %s)", t->base.cfg.rank, c->rank,
		  c->kind == RDMA_CONN_DIAL ? "dialed" : "accepted", c->who);
	if (done) {
		struct rdma_conn *x, *next;

		t->seen_phase = RDMA_PHASE_DONE;
		/* later strangers are refused by the kernel; leftovers go */
		if (t->listen) {
			rdma_conn_destroy(t, t->listen);
			t->listen = NULL;
		}
		for (x = t->conns; x; x = next) {
			next = x->next;
			if (x->state != RDMA_CS_UP)
				rdma_conn_destroy(t, x);
		}
	}
}

/* a connection that was up is gone (DISCONNECTED, DEVICE_REMOVAL) */
static void rdma_conn_lost(struct rdma_tp *t, struct rdma_conn *c, const char *how)
{
	struct rdma_peer *p = &t->peers[c->rank];

	c->disconnected = 1;
	if (p->conn != c || !p->live)
		return;
	if (p->bye)
		ferry_info("rdma: rank %u left (it %s rank %u)", c->rank, how, t->base.cfg.rank);
	else if (__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
		ferry_info("rdma: rank %u %s rank %u; marking it failed", c->rank, how,
			   t->base.cfg.rank);
	else
		ferry_warn("rdma: rank %u %s rank %u; marking it failed", c->rank, how,
			   t->base.cfg.rank);
	rdma_peer_fail(t, p, -FERRY_E_PEER);
}

/* judge a connection request and accept or reject it; connect() has begun */
static void rdma_accept_request(struct rdma_tp *t, struct rdma_conn *c)
{
	uint32_t me = t->base.cfg.rank;
	struct rdma_conn_param cp;
	enum rdma_rej_reason reason = RDMA_REJ_HELLO;
	char why[192];
	int rank;

	rank = rdma_hello_check(t, c->pdata, c->plen, -1, why, sizeof(why));
	if (rank >= 0 && (t->peers[rank].reported ||
			  (t->peers[rank].conn && t->peers[rank].conn->state == RDMA_CS_UP))) {
		snprintf(why, sizeof(why), "rank %d is already connected%s", rank,
			 t->peers[rank].reported ? " (and failed)" : "");
		reason = RDMA_REJ_DUP;
		rank = -1;
	}
	if (rank < 0) {
		ferry_warn("rdma: rank %u rejected a connection from %s: %s", me, c->who, why);
		rdma_conn_reject(t, c, reason);
		return;
	}
	/* a pending accept of the same rank is a dead attempt: the dialer retried */
	if (rdma_conn_attach(t, c, (uint32_t)rank)) {
		rdma_conn_reject(t, c, RDMA_REJ_RESOURCES);
		return;
	}
	rdma_conn_param(t, &cp, c->initiator_depth, c->responder_resources, 1);
	if (rdma_accept(c->id, &cp)) {
		ferry_warn("rdma: rank %u: rdma_accept of rank %d from %s: %s", me, rank, c->who,
			   strerror(errno));
		rdma_conn_destroy(t, c);
		return;
	}
	c->state = RDMA_CS_CONNECTING;
}

/* copy of the fields of an rdma_cm_event we use: the event is acked before they are */
struct rdma_cm_ev {
	enum rdma_cm_event_type type;
	struct rdma_cm_id *id;
	int status;
	uint8_t pdata[RDMA_CM_PDATA_MAX];
	uint8_t plen;
	uint8_t initiator_depth;
	uint8_t responder_resources;
};

static void rdma_on_request(struct rdma_tp *t, const struct rdma_cm_ev *ev)
{
	uint32_t me = t->base.cfg.rank;
	struct rdma_conn *c = rdma_conn_new(t, RDMA_CONN_ACCEPT);

	if (!c) {
		rdma_reject(ev->id, NULL, 0);
		rdma_destroy_id(ev->id);
		return;
	}
	c->id = ev->id;
	ev->id->context = c;
	rdma_sa_str(rdma_get_peer_addr(ev->id), c->who, sizeof(c->who));
	memcpy(c->pdata, ev->pdata, ev->plen);
	c->plen = ev->plen;
	c->initiator_depth = ev->initiator_depth;
	c->responder_resources = ev->responder_resources;

	switch (t->seen_phase) {
	case RDMA_PHASE_IDLE:
		/* the cluster id is not known before connect(): judge it then */
		if (t->nheld >= RDMA_MAX_HELD) {
			ferry_warn("rdma: rank %u rejected a connection from %s: %d requests wait "
				   "for connect() already",
				   me, c->who, RDMA_MAX_HELD);
			rdma_conn_reject(t, c, RDMA_REJ_BUSY);
			return;
		}
		c->state = RDMA_CS_HELD;
		t->nheld++;
		return;
	case RDMA_PHASE_CONNECTING:
		rdma_accept_request(t, c);
		return;
	default:
		ferry_info("rdma: rank %u rejected a connection from %s: the cluster is %s", me,
			   c->who, t->seen_phase == RDMA_PHASE_DONE ? "connected" : "closed");
		rdma_conn_reject(t, c, RDMA_REJ_CLOSED);
		return;
	}
}

static void rdma_dial_retry(struct rdma_tp *t, uint32_t j, const char *why)
{
	struct rdma_dial *d = &t->dials[j];

	if (why) {
		pthread_mutex_lock(&t->setup_lock);
		snprintf(d->why, sizeof(d->why), "%s", why);
		pthread_mutex_unlock(&t->setup_lock);
	}
	d->next_ms = rdma_now_ms() + d->backoff_ms;
	d->backoff_ms = d->backoff_ms * 2 > RDMA_RETRY_MAX_MS ? RDMA_RETRY_MAX_MS :
								d->backoff_ms * 2;
}

static void rdma_dial_start(struct rdma_tp *t, uint32_t j)
{
	struct rdma_dial *d = &t->dials[j];
	struct rdma_conn *c = rdma_conn_new(t, RDMA_CONN_DIAL);
	char why[96];

	if (!c) {
		rdma_dial_retry(t, j, "out of memory");
		return;
	}
	c->rank = j;
	snprintf(c->who, sizeof(c->who), "%s", d->where);
	if (rdma_create_id(t->ec, &c->id, c, RDMA_PS_TCP)) {
		snprintf(why, sizeof(why), "rdma_create_id: %s", strerror(errno));
		c->id = NULL;
		goto err_destroy;
	}
	if (rdma_resolve_addr(c->id, (struct sockaddr *)&t->src_sa, (struct sockaddr *)&d->sa,
			      RDMA_RESOLVE_MS)) {
		snprintf(why, sizeof(why), "rdma_resolve_addr: %s", strerror(errno));
		goto err_destroy;
	}
	c->state = RDMA_CS_ADDR;
	d->conn = c;
	return;

err_destroy:
	rdma_conn_destroy(t, c);
	rdma_dial_retry(t, j, why);
}

/* an event on a connection we dialed */
static void rdma_dial_event(struct rdma_tp *t, struct rdma_conn *c, const struct rdma_cm_ev *ev)
{
	uint32_t me = t->base.cfg.rank, j = c->rank;
	struct rdma_dial *d = &t->dials[j];
	struct rdma_conn_param cp;
	char why[192];

	switch (ev->type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(c->id, RDMA_RESOLVE_MS)) {
			snprintf(why, sizeof(why), "rdma_resolve_route: %s", strerror(errno));
			break;
		}
		c->state = RDMA_CS_ROUTE;
		return;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (rdma_conn_attach(t, c, j)) {
			snprintf(why, sizeof(why), "no queue pair");
			break;
		}
		rdma_conn_param(t, &cp, 0, 0, 0);
		if (rdma_connect(c->id, &cp)) {
			snprintf(why, sizeof(why), "rdma_connect: %s", strerror(errno));
			break;
		}
		c->state = RDMA_CS_CONNECTING;
		return;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (rdma_hello_check(t, ev->pdata, ev->plen, (int)j, why, sizeof(why)) < 0) {
			if (!d->logged++)
				ferry_warn("rdma: rank %u: the node at %s, dialed as rank %u, is "
					   "refused: %s",
					   me, d->where, j, why);
			c->disconnected = 1;
			rdma_disconnect(c->id);
			break;
		}
		rdma_conn_up(t, c);
		return;
	case RDMA_CM_EVENT_REJECTED: {
		struct rdma_rej rej = { 0 };

		if (ev->plen >= sizeof(rej))
			memcpy(&rej, ev->pdata, sizeof(rej));
		if (rej.magic == RDMA_REJ_MAGIC)
			snprintf(why, sizeof(why), "rejected: %s", rdma_rej_str(rej.reason));
		else
			snprintf(why, sizeof(why), "rejected (status %d): nothing listens there",
				 ev->status);
		break;
	}
	case RDMA_CM_EVENT_DISCONNECTED:
		if (c->state == RDMA_CS_UP) {
			rdma_conn_lost(t, c, "disconnected from");
			return;
		}
		snprintf(why, sizeof(why), "it disconnected before the connection stood");
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		snprintf(why, sizeof(why), "%s (%s)", rdma_event_str(ev->type),
			 strerror(ev->status < 0 ? -ev->status : ev->status));
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		if (c->state == RDMA_CS_UP) {
			rdma_conn_lost(t, c, "was lost (device removed) to");
			return;
		}
		snprintf(why, sizeof(why), "the device was removed");
		break;
	default:
		return;
	}
	/* this attempt failed */
	if (c->state == RDMA_CS_UP)
		return;
	ferry_dbg("rdma: rank %u: dialing rank %u at %s: %s", me, j, d->where, why);
	rdma_conn_destroy(t, c);
	if (t->seen_phase == RDMA_PHASE_CONNECTING)
		rdma_dial_retry(t, j, why);
}

/* an event on a connection we accepted */
static void rdma_accept_event(struct rdma_tp *t, struct rdma_conn *c, const struct rdma_cm_ev *ev)
{
	switch (ev->type) {
	case RDMA_CM_EVENT_ESTABLISHED:
		rdma_conn_up(t, c);
		return;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		if (c->state == RDMA_CS_UP) {
			rdma_conn_lost(t, c,
				       ev->type == RDMA_CM_EVENT_DISCONNECTED ?
					       "disconnected from" :
					       "was lost (device removed) to");
			return;
		}
		break;
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		if (c->state == RDMA_CS_UP)
			return;
		break;
	default:
		return;
	}
	ferry_dbg("rdma: rank %u: the connection from %s (rank %u) failed before it stood: %s",
		  t->base.cfg.rank, c->who, c->rank, rdma_event_str(ev->type));
	rdma_conn_destroy(t, c);
}

/* connect() began or gave up: act on it. Progress thread. */
static void rdma_setup_sync(struct rdma_tp *t)
{
	struct rdma_conn *c, *next;
	enum rdma_phase phase;

	pthread_mutex_lock(&t->setup_lock);
	phase = t->phase;
	pthread_mutex_unlock(&t->setup_lock);
	if (phase == t->seen_phase)
		return;
	t->seen_phase = phase;
	if (phase == RDMA_PHASE_CONNECTING) {
		/* the cluster id is known now: judge the held requests, oldest first */
		for (;;) {
			struct rdma_conn *oldest = NULL;

			for (c = t->conns; c; c = c->next)
				if (c->state == RDMA_CS_HELD)
					oldest = c;
			if (!oldest)
				break;
			oldest->state = RDMA_CS_NEW;
			t->nheld--;
			rdma_accept_request(t, oldest);
		}
		return;
	}
	if (phase == RDMA_PHASE_ABANDONED || phase == RDMA_PHASE_DONE) {
		if (t->listen) {
			rdma_conn_destroy(t, t->listen);
			t->listen = NULL;
		}
		for (c = t->conns; c; c = next) {
			next = c->next;
			if (c->state != RDMA_CS_UP)
				rdma_conn_destroy(t, c);
		}
	}
}

/* start due dials; Return: the next time one is due, or -1. Progress thread. */
static int64_t rdma_setup_tick(struct rdma_tp *t)
{
	int64_t now, next = -1;

	if (t->seen_phase != RDMA_PHASE_CONNECTING)
		return -1;
	now = rdma_now_ms();
	for (uint32_t j = 0; j < t->base.cfg.rank; j++) {
		struct rdma_dial *d = &t->dials[j];

		if (t->peers[j].live || t->peers[j].reported || d->conn)
			continue;
		if (now >= d->next_ms)
			rdma_dial_start(t, j);
		if (!d->conn && (next < 0 || d->next_ms < next))
			next = d->next_ms;
	}
	return next;
}

static void rdma_cm_dispatch(struct rdma_tp *t, const struct rdma_cm_ev *ev)
{
	struct rdma_conn *c;

	if (ev->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
		rdma_setup_sync(t);
		rdma_on_request(t, ev);
		return;
	}
	c = ev->id ? ev->id->context : NULL;
	if (!c)
		return;
	switch (c->kind) {
	case RDMA_CONN_DIAL:
		rdma_dial_event(t, c, ev);
		break;
	case RDMA_CONN_ACCEPT:
		rdma_accept_event(t, c, ev);
		break;
	case RDMA_CONN_LISTEN:
		if (ev->type == RDMA_CM_EVENT_DEVICE_REMOVAL)
			ferry_err("rdma: rank %u: device %s was removed", t->base.cfg.rank,
				  t->dev_name);
		break;
	}
}

/* the cm event channel is readable. Progress thread. */
static void rdma_cm_input(struct rdma_tp *t)
{
	for (;;) {
		struct rdma_cm_event *e;
		struct rdma_cm_ev ev;

		if (rdma_get_cm_event(t->ec, &e)) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				ferry_err("rdma: rank %u: rdma_get_cm_event: %s", t->base.cfg.rank,
					  strerror(errno));
			return;
		}
		memset(&ev, 0, sizeof(ev));
		ev.type = e->event;
		ev.id = e->id;
		ev.status = e->status;
		if (e->param.conn.private_data && e->param.conn.private_data_len) {
			ev.plen = e->param.conn.private_data_len < sizeof(ev.pdata) ?
					  e->param.conn.private_data_len :
					  sizeof(ev.pdata);
			memcpy(ev.pdata, e->param.conn.private_data, ev.plen);
		}
		ev.initiator_depth = e->param.conn.initiator_depth;
		ev.responder_resources = e->param.conn.responder_resources;
		/* acked first, so that rdma_destroy_id() on its id cannot wait for it */
		rdma_ack_cm_event(e);
		rdma_cm_dispatch(t, &ev);
	}
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

			if (!p->live || (!all && p->qp != qp))
				continue;
			ferry_warn(
				"rdma: rank %u: %s on the queue pair to rank %u; marking it failed",
				me, ibv_event_type_str(type), r);
			rdma_peer_fail(t, p, -FERRY_E_PEER);
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
		rdma_fail_broken(t);
	rdma_setup_sync(t);
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
			    rdma_sq_room(t, p) && rdma_post_credit(t, p))
				p->s_done = p->s_posted; /* cannot post: the peer is failing */
			busy |= p->q_head || p->sig_n || p->s_done != p->s_posted;
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
		if (p->state == RDMA_PEER_UP || p->state == RDMA_PEER_BROKEN)
			p->state = RDMA_PEER_FAILED;
		q = p->q_head;
		p->q_head = p->q_tail = NULL;
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
		for (uint32_t i = 0; i < n; i++)
			rdma_op_done(t, ops[i], -FERRY_E_CLOSED, 0);
		free(ops);
		rdma_q_cancel(t, q, -FERRY_E_CLOSED);
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

	if (h->on_thread_start)
		h->on_thread_start(t->base.cfg.core);

	for (;;) {
		int64_t next = rdma_setup_tick(t), now;
		int timeout = -1, n, did = 0;

		if (busy) {
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
			switch (evs[i].data.u32) {
			case RDMA_EV_WAKE:
				rdma_wake_input(t);
				break;
			case RDMA_EV_CQ:
				rdma_cq_input(t);
				break;
			case RDMA_EV_CM:
				rdma_cm_input(t);
				break;
			case RDMA_EV_ASYNC:
				rdma_async_input(t);
				break;
			}
		}
		rdma_scq_check(t);
		if (busy) {
			did = rdma_poll_cqs(t);
			if (!did && n <= 0)
				sched_yield();
		}
		if (!__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
			continue;
		if (drain_end < 0)
			drain_end = rdma_now_ms() + RDMA_DRAIN_MS;
		if (!busy)
			rdma_poll_cqs(t);
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

/* ---- init / fini -------------------------------------------------------- */

static int rdma_start_thread(struct rdma_tp *t)
{
	sigset_t all, old;
	int ret;

	/* the progress thread takes no process signals */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
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

static int rdma_epoll_add(struct rdma_tp *t, int fd, enum rdma_ev_tag tag)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = tag };

	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev)) {
		int ret = -errno;

		ferry_err("rdma: epoll_ctl: %s", strerror(errno));
		return ret;
	}
	return 0;
}

/*
 * rdma_tp_listen - create the event channel and the listening cm_id on the bind
 * address; the cm_id's device becomes ours
 */
static int rdma_tp_listen(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank;
	struct sockaddr_in sa = t->src_sa;
	struct rdma_conn *l;
	const char *dn;
	char ip[INET_ADDRSTRLEN];
	int ret;

	inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
	t->ec = rdma_create_event_channel();
	if (!t->ec) {
		ret = -errno;
		ferry_err("rdma: rank %u: rdma_create_event_channel: %s (is rdma_ucm loaded?)", me,
			  strerror(errno));
		return ret ? ret : -FERRY_E_NODEV;
	}
	ret = rdma_set_nonblock(t->ec->fd);
	if (ret)
		goto err_destroy_channel;
	l = calloc(1, sizeof(*l));
	if (!l) {
		ret = -ENOMEM;
		goto err_destroy_channel;
	}
	l->kind = RDMA_CONN_LISTEN;
	l->rank = UINT32_MAX;
	if (rdma_create_id(t->ec, &l->id, l, RDMA_PS_TCP)) {
		ret = -errno;
		ferry_err("rdma: rank %u: rdma_create_id: %s", me, strerror(errno));
		goto err_free_listen;
	}
	if (rdma_bind_addr(l->id, (struct sockaddr *)&sa) || rdma_listen(l->id, 128)) {
		ret = -errno;
		ferry_err("rdma: rank %u: cannot listen on %s: %s; check that the address belongs "
			  "to this host and to the interface of an RDMA device",
			  me, ip, strerror(errno));
		goto err_destroy_id;
	}
	if (!l->id->verbs) {
		ret = -EADDRNOTAVAIL;
		ferry_err("rdma: rank %u: the bind address %s is not on an RDMA device's "
			  "interface; set FERRY_BIND_ADDR to the IPv4 address of the interface %s "
			  "sits on",
			  me, ip, t->dev_name);
		goto err_destroy_id;
	}
	dn = ibv_get_device_name(l->id->verbs->device);
	if (strcmp(dn, t->dev_name)) {
		if (getenv("FERRY_RDMA_DEVICE") && *getenv("FERRY_RDMA_DEVICE")) {
			ret = -EADDRNOTAVAIL;
			ferry_err("rdma: rank %u: the bind address %s belongs to device %s, not to "
				  "FERRY_RDMA_DEVICE=%s; bind to an address of %s's interface",
				  me, ip, dn, t->dev_name, t->dev_name);
			goto err_destroy_id;
		}
		ferry_info("rdma: rank %u: the bind address %s belongs to device %s; using it", me,
			   ip, dn);
		snprintf(t->dev_name, sizeof(t->dev_name), "%s", dn);
	}
	if (l->id->port_num)
		t->port_num = l->id->port_num;
	sa.sin_port = rdma_get_src_port(l->id);
	snprintf(t->addr, sizeof(t->addr), "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
	t->ctx = l->id->verbs;
	t->listen = l;
	return 0;

err_destroy_id:
	rdma_destroy_id(l->id);
err_free_listen:
	free(l);
err_destroy_channel:
	rdma_destroy_event_channel(t->ec);
	t->ec = NULL;
	return ret;
}

static void rdma_unlisten(struct rdma_tp *t)
{
	if (t->listen) {
		rdma_destroy_id(t->listen->id);
		free(t->listen);
		t->listen = NULL;
	}
	rdma_destroy_event_channel(t->ec);
	t->ec = NULL;
}

/* size the queues to the device; Return: 0 or a negative errno (logged) */
static int rdma_query(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank, world = t->base.cfg.world;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	uint32_t depth = RDMA_SQ_DEPTH;
	int ret;

	ret = ibv_query_device(t->ctx, &da);
	if (!ret)
		ret = ibv_query_port(t->ctx, t->port_num, &pa);
	if (ret) {
		ferry_err("rdma: rank %u: querying %s: %s", me, t->dev_name, strerror(ret));
		return -ret;
	}
	if ((uint32_t)da.max_qp_wr < depth)
		depth = (uint32_t)da.max_qp_wr;
	/* one send CQ holds every peer's work requests */
	if (world > 1 && (uint64_t)depth * world + 64 > (uint64_t)da.max_cqe)
		depth = (uint32_t)((da.max_cqe - 64) / world);
	if (depth < RDMA_SQ_MIN || (uint32_t)da.max_qp_wr < RDMA_RECVS ||
	    (uint64_t)RDMA_RECVS * world + 64 > (uint64_t)da.max_cqe) {
		ferry_err("rdma: rank %u: device %s is too small for %u nodes (max_qp_wr %d, "
			  "max_cqe %d)",
			  me, t->dev_name, world, da.max_qp_wr, da.max_cqe);
		return -ENOSPC;
	}
	t->sq_depth = depth;
	t->max_rd = RDMA_MAX_RD;
	if ((uint32_t)da.max_qp_rd_atom < t->max_rd)
		t->max_rd = (uint32_t)da.max_qp_rd_atom;
	if ((uint32_t)da.max_qp_init_rd_atom < t->max_rd)
		t->max_rd = (uint32_t)da.max_qp_init_rd_atom;
	t->max_msg = pa.max_msg_sz ? pa.max_msg_sz : UINT32_MAX;
	ferry_dbg("rdma: rank %u: %s port %u (active MTU %d bytes), GID index %d, send queue %u, "
		  "%u READs in flight",
		  me, t->dev_name, t->port_num, 128 << pa.active_mtu, t->gid_index, t->sq_depth,
		  t->max_rd);
	return 0;
}

/* PD, completion channel, the two CQs */
static int rdma_verbs_init(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank, world = t->base.cfg.world;
	int ret;

	t->pd = ibv_alloc_pd(t->ctx);
	if (!t->pd) {
		ret = -errno;
		ferry_err("rdma: rank %u: ibv_alloc_pd: %s", me, strerror(errno));
		return ret ? ret : -ENOMEM;
	}
	t->cc = ibv_create_comp_channel(t->ctx);
	if (!t->cc) {
		ret = -errno;
		ferry_err("rdma: rank %u: ibv_create_comp_channel: %s", me, strerror(errno));
		goto err_dealloc_pd;
	}
	ret = rdma_set_nonblock(t->cc->fd);
	if (ret)
		goto err_destroy_channel;
	t->scq = ibv_create_cq(t->ctx, (int)(t->sq_depth * world + 64), NULL, t->cc, 0);
	if (!t->scq) {
		ret = -errno;
		ferry_err("rdma: rank %u: ibv_create_cq: %s", me, strerror(errno));
		goto err_destroy_channel;
	}
	t->rcq = ibv_create_cq(t->ctx, (int)(RDMA_RECVS * world + 64), NULL, t->cc, 0);
	if (!t->rcq) {
		ret = -errno;
		ferry_err("rdma: rank %u: ibv_create_cq: %s", me, strerror(errno));
		goto err_destroy_scq;
	}
	if (!t->base.cfg.busy_poll &&
	    (ibv_req_notify_cq(t->scq, 0) || ibv_req_notify_cq(t->rcq, 0))) {
		ret = -EIO;
		ferry_err("rdma: rank %u: ibv_req_notify_cq failed", me);
		goto err_destroy_rcq;
	}
	return 0;

err_destroy_rcq:
	ibv_destroy_cq(t->rcq);
err_destroy_scq:
	ibv_destroy_cq(t->scq);
err_destroy_channel:
	ibv_destroy_comp_channel(t->cc);
err_dealloc_pd:
	ibv_dealloc_pd(t->pd);
	return ret ? ret : -ENOMEM;
}

static void rdma_verbs_fini(struct rdma_tp *t)
{
	ibv_destroy_cq(t->rcq);
	ibv_destroy_cq(t->scq);
	ibv_destroy_comp_channel(t->cc);
	ibv_dealloc_pd(t->pd);
}

/* the peers and their buffers: one region, registered once */
static int rdma_peers_init(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank, world = t->base.cfg.world, r;
	size_t per = (size_t)(RDMA_RECVS + RDMA_SBUFS) * RDMA_CHUNK;
	int ret;

	t->peers = calloc(world, sizeof(*t->peers));
	t->dirty = calloc(world, sizeof(*t->dirty));
	t->up = calloc(world, sizeof(*t->up));
	t->dials = calloc(me ? me : 1, sizeof(*t->dials));
	if (!t->peers || !t->dirty || !t->up || !t->dials) {
		ret = -ENOMEM;
		goto err_free;
	}
	t->region_len = per * (world - 1);
	if (t->region_len) {
		ret = rdma_memlock_check(me, t->region_len, "the message buffers");
		if (ret)
			goto err_free;
		t->region = mmap(NULL, t->region_len, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (t->region == MAP_FAILED) {
			ret = -errno;
			t->region = NULL;
			ferry_err("rdma: rank %u: cannot map %zu bytes of buffers: %s", me,
				  t->region_len, strerror(errno));
			goto err_free;
		}
		t->region_mr = ibv_reg_mr(t->pd, t->region, t->region_len, IBV_ACCESS_LOCAL_WRITE);
		if (!t->region_mr) {
			ret = -errno;
			ferry_err("rdma: rank %u: registering %zu bytes of message buffers failed: "
				  "%s%s",
				  me, t->region_len, strerror(errno),
				  errno == ENOMEM || errno == EPERM || errno == EAGAIN ?
					  "; check the memlock limit (`ulimit -l`; raise it with "
					  "`ulimit -l unlimited`, or memlock in "
					  "/etc/security/limits.conf)" :
					  "");
			goto err_unmap;
		}
		__atomic_add_fetch(&rdma_pinned, t->region_len, __ATOMIC_RELAXED);
		t->pinned = t->region_len;
	}
	for (r = 0; r < world; r++) {
		struct rdma_peer *p = &t->peers[r];

		ret = -pthread_mutex_init(&p->lock, NULL);
		if (!ret && r != me) {
			size_t slot = r < me ? r : r - 1;

			p->sig = calloc(t->sq_depth, sizeof(*p->sig));
			if (!p->sig) {
				pthread_mutex_destroy(&p->lock);
				ret = -ENOMEM;
			}
			p->rbuf = (unsigned char *)t->region + slot * per;
			p->sbuf = p->rbuf + (size_t)RDMA_RECVS * RDMA_CHUNK;
		}
		if (ret)
			goto err_destroy_peers;
		p->rank = r;
	}
	for (r = 0; r < me; r++)
		t->dials[r].backoff_ms = RDMA_RETRY_MIN_MS;
	t->missing = world - 1;
	return 0;

err_destroy_peers:
	while (r--) {
		free(t->peers[r].sig);
		pthread_mutex_destroy(&t->peers[r].lock);
	}
	if (t->region_mr) {
		ibv_dereg_mr(t->region_mr);
		__atomic_sub_fetch(&rdma_pinned, t->pinned, __ATOMIC_RELAXED);
		t->region_mr = NULL;
		t->pinned = 0;
	}
err_unmap:
	if (t->region)
		munmap(t->region, t->region_len);
	t->region = NULL;
err_free:
	free(t->dials);
	free(t->up);
	free(t->dirty);
	free(t->peers);
	t->peers = NULL;
	return ret;
}

static void rdma_peers_fini(struct rdma_tp *t)
{
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct rdma_peer *p = &t->peers[r];
		struct rdma_qent *e, *next;

		for (e = p->q_head; e; e = next) {
			next = e->next;
			free(e->op);
			free(e);
		}
		free(p->asm_buf);
		free(p->sig);
		pthread_mutex_destroy(&p->lock);
	}
	if (t->region_mr) {
		ibv_dereg_mr(t->region_mr);
		__atomic_sub_fetch(&rdma_pinned, t->pinned, __ATOMIC_RELAXED);
	}
	if (t->region)
		munmap(t->region, t->region_len);
	free(t->dials);
	free(t->up);
	free(t->dirty);
	free(t->peers);
	t->peers = NULL;
}

/*
 * rdma_init - pick the device and address, listen, set up the verbs
 * resources and start the progress thread
 *
 * Context: any thread; @tp is zeroed memory of tp_size bytes with ops set.
 * Return: 0, -EINVAL for a bad config, -FERRY_E_NODEV without a usable
 * device, -ENOMEM when the memlock limit is too small, or the errno of what
 * failed (each logged).
 */
static int rdma_init(struct ferry_tp *tp, const struct ferry_tp_config *cfg)
{
	struct rdma_tp *t = to_rdma(tp);
	const char *bind_addr = cfg->bind_addr ? cfg->bind_addr : "";
	const char *why = NULL;
	pthread_condattr_t ca;
	int ret;

	if (!cfg->world || cfg->rank >= cfg->world || !cfg->handler || !cfg->handler->on_msg) {
		ferry_err("rdma: bad config: rank %u of world %u%s", cfg->rank, cfg->world,
			  cfg->handler && cfg->handler->on_msg ? "" : ", no on_msg handler");
		return -EINVAL;
	}
	if (strlen(bind_addr) >= sizeof(t->bind)) {
		ferry_err("rdma: the bind address \"%.40s...\" is too long", bind_addr);
		return -EINVAL;
	}
	tp->cfg = *cfg;
	strcpy(t->bind, bind_addr);
	tp->cfg.bind_addr = t->bind;
	t->epfd = t->wake_fd = -1;

	/*
	 * Before any verbs resource: memory registered later stays out of a
	 * fork()ed child's way (a no-op where the kernel copies DMA pages at
	 * fork, IBV_FORK_UNNEEDED).
	 */
	ret = ibv_fork_init();
	if (ret)
		ferry_warn("rdma: rank %u: ibv_fork_init: %s; memory registered from now on is not "
			   "protected against fork() (set RDMAV_FORK_SAFE=1 before the process "
			   "starts, or do not fork after ferry_open)",
			   cfg->rank, strerror(ret));

	ret = rdma_pick_device(t->dev_name, &t->port_num, &why);
	if (ret) {
		ferry_err("rdma: rank %u: %s", cfg->rank, why);
		return ret;
	}
	ret = rdma_pick_addr(t, t->bind);
	if (ret)
		return ret;
	/* rdma_cm's contexts stay open while we hold this list */
	t->devs = rdma_get_devices(NULL);
	if (!t->devs) {
		ferry_err("rdma: rank %u: rdma_get_devices found no device (is rdma_ucm loaded?)",
			  cfg->rank);
		return -FERRY_E_NODEV;
	}
	ret = rdma_tp_listen(t);
	if (ret)
		goto err_free_devices;
	ret = rdma_query(t);
	if (ret)
		goto err_unlisten;
	ret = rdma_verbs_init(t);
	if (ret)
		goto err_unlisten;
	ret = rdma_peers_init(t);
	if (ret)
		goto err_verbs_fini;

	pthread_mutex_init(&t->self_lock, NULL);
	pthread_mutex_init(&t->mr_lock, NULL);
	pthread_mutex_init(&t->setup_lock, NULL);
	pthread_mutex_init(&t->cq_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&t->setup_cond, &ca);
	pthread_condattr_destroy(&ca);

	t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->wake_fd < 0) {
		ret = -errno;
		ferry_err("rdma: eventfd: %s", strerror(errno));
		goto err_destroy_locks;
	}
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->epfd < 0) {
		ret = -errno;
		ferry_err("rdma: epoll_create1: %s", strerror(errno));
		goto err_close_wake;
	}
	/* the async fd is the shared context's: every instance reads it without blocking */
	ret = rdma_set_nonblock(t->ctx->async_fd);
	if (!ret)
		ret = rdma_epoll_add(t, t->wake_fd, RDMA_EV_WAKE);
	if (!ret)
		ret = rdma_epoll_add(t, t->ec->fd, RDMA_EV_CM);
	if (!ret)
		ret = rdma_epoll_add(t, t->ctx->async_fd, RDMA_EV_ASYNC);
	if (!ret && !cfg->busy_poll)
		ret = rdma_epoll_add(t, t->cc->fd, RDMA_EV_CQ);
	if (ret)
		goto err_close_epoll;
	ret = rdma_start_thread(t);
	if (ret)
		goto err_close_epoll;
	ferry_dbg("rdma: rank %u of %u listens on %s (%s port %u)", cfg->rank, cfg->world, t->addr,
		  t->dev_name, t->port_num);
	return 0;

err_close_epoll:
	close(t->epfd);
err_close_wake:
	close(t->wake_fd);
err_destroy_locks:
	pthread_cond_destroy(&t->setup_cond);
	pthread_mutex_destroy(&t->cq_lock);
	pthread_mutex_destroy(&t->setup_lock);
	pthread_mutex_destroy(&t->mr_lock);
	pthread_mutex_destroy(&t->self_lock);
	rdma_peers_fini(t);
err_verbs_fini:
	rdma_verbs_fini(t);
err_unlisten:
	rdma_unlisten(t);
err_free_devices:
	rdma_free_devices(t->devs);
	t->devs = NULL;
	return ret;
}

/*
 * rdma_fini - stop the progress thread and free everything but @tp itself
 *
 * Sends every peer a FERRY_MSG_BYE, so that it logs a departure, not a
 * failure, and flushes queued frames for at most RDMA_DRAIN_MS; one-sided
 * operations still pending complete with -FERRY_E_CLOSED on the progress
 * thread before it stops. No handler runs after it returns. Memory the core
 * registered and did not deregister is deregistered here. Context: not
 * concurrently with any other op of @tp.
 */
static void rdma_fini(struct ferry_tp *tp)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_selfmsg *m, *next;
	struct rdma_mr *mr;

	ferry__tp_send_bye(tp); /* queued, flushed while draining */
	__atomic_store_n(&t->closing, 1, __ATOMIC_RELEASE);
	rdma_wake(t);
	pthread_join(t->thread, NULL);

	/* the peers see DISCONNECTED; then every queue pair and cm_id goes */
	for (struct rdma_conn *c = t->conns; c; c = c->next)
		if (c->state == RDMA_CS_UP && !c->disconnected) {
			c->disconnected = 1;
			rdma_disconnect(c->id);
		}
	while (t->conns)
		rdma_conn_destroy(t, t->conns);
	for (m = t->self_head; m; m = next) {
		next = m->next;
		free(m);
	}
	t->self_head = t->self_tail = NULL;
	for (mr = t->mrs; mr; mr = mr->next) {
		ferry_dbg("rdma: rank %u: deregistering %zu bytes at %p the core left registered",
			  t->base.cfg.rank, mr->base.len, mr->base.addr);
		__atomic_sub_fetch(&rdma_pinned, mr->base.len, __ATOMIC_RELAXED);
		ibv_dereg_mr(mr->mr);
		mr->mr = NULL;
	}
	t->mrs = NULL;
	close(t->epfd);
	close(t->wake_fd);
	pthread_cond_destroy(&t->setup_cond);
	pthread_mutex_destroy(&t->cq_lock);
	pthread_mutex_destroy(&t->setup_lock);
	pthread_mutex_destroy(&t->mr_lock);
	pthread_mutex_destroy(&t->self_lock);
	rdma_peers_fini(t);
	rdma_verbs_fini(t);
	rdma_unlisten(t);
	rdma_free_devices(t->devs);
	t->devs = NULL;
}

static int rdma_addr_get(struct ferry_tp *tp, void *buf, size_t *len)
{
	struct rdma_tp *t = to_rdma(tp);
	size_t n = strlen(t->addr);

	if (*len < n) {
		*len = n;
		return -ENOSPC;
	}
	memcpy(buf, t->addr, n);
	*len = n;
	return 0;
}

/* ---- connection setup (caller's thread) ---------------------------------- */

/* log, once, the ranks that never connected and what we know of why. setup_lock held. */
static void rdma_setup_timeout(struct rdma_tp *t, int timeout_ms)
{
	uint32_t me = t->base.cfg.rank, listed = 0;
	char list[512], hint[384];
	size_t off = 0, hoff = 0;

	list[0] = hint[0] = '\0';
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		if (r == me || t->up[r])
			continue;
		if (listed++ < 16 && off < sizeof(list))
			off += snprintf(list + off, sizeof(list) - off, "%s%u",
					listed > 1 ? ", " : "", r);
		if (r < me && hoff < sizeof(hint)) {
			struct rdma_dial *d = &t->dials[r];

			hoff += snprintf(hint + hoff, sizeof(hint) - hoff, "; rank %u at %s: %s", r,
					 d->where, d->why[0] ? d->why : "no answer");
		}
	}
	if (listed > 16 && off < sizeof(list))
		snprintf(list + off, sizeof(list) - off, " and %u more", listed - 16);
	ferry_err("rdma: rank %u timed out after %d ms waiting for rank%s %s to connect; check "
		  "that they started and can reach %s%s",
		  me, timeout_ms, listed > 1 ? "s" : "", list, t->addr, hint);
}

/*
 * rdma_tp_connect - connect to every peer
 *
 * Hands the work to the progress thread and waits for at most
 * cfg.timeout_ms. Context: once per transport, after init(), before any
 * send() to a peer; cfg.cluster_id is set.
 * Return: 0; -ETIMEDOUT (the log names the ranks that never connected);
 * -EINVAL for an address blob that is not ours; -EALREADY when called twice.
 */
static int rdma_tp_connect(struct ferry_tp *tp, const void *const *addrs, const size_t *lens)
{
	struct rdma_tp *t = to_rdma(tp);
	const struct ferry_tp_config *cfg = &tp->cfg;
	int timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30000;
	struct timespec dl;
	int ret = 0;

	if (t->connected)
		return -EALREADY;
	for (uint32_t r = 0; r < cfg->rank; r++) {
		struct rdma_dial *d = &t->dials[r];

		if (ferry__tp_parse_ipv4(addrs[r], lens[r], &d->sa)) {
			ferry_err("rdma: rank %u: the address of rank %u is not an \"ip:port\" of "
				  "the rdma transport; do all nodes use the same transport?",
				  cfg->rank, r);
			return -EINVAL;
		}
		rdma_sa_str((struct sockaddr *)&d->sa, d->where, sizeof(d->where));
	}

	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&t->setup_lock);
	rdma_hello_build(t);
	t->phase = t->missing ? RDMA_PHASE_CONNECTING : RDMA_PHASE_DONE;
	pthread_mutex_unlock(&t->setup_lock);
	rdma_wake(t);

	pthread_mutex_lock(&t->setup_lock);
	while (t->missing &&
	       pthread_cond_timedwait(&t->setup_cond, &t->setup_lock, &dl) != ETIMEDOUT)
		;
	if (t->missing) {
		t->phase = RDMA_PHASE_ABANDONED;
		rdma_setup_timeout(t, timeout_ms);
		ret = -ETIMEDOUT;
	}
	pthread_mutex_unlock(&t->setup_lock);
	rdma_wake(t);
	if (!ret) {
		t->connected = 1;
		ferry_dbg("rdma: rank %u is connected to all %u peers", cfg->rank, cfg->world - 1);
	}
	return ret;
}

/* ---- sending ------------------------------------------------------------ */

/*
 * rdma_send - queue one frame to @dst
 *
 * Context: any thread, concurrently with other sends and with the progress
 * thread (handlers may send); not after fini(). Never blocks on the network.
 * The iovec's memory is the caller's again when it returns.
 * Return: 0; -EINVAL (bad dst or iovcnt, or a header that fails
 * ferry__proto_check_hdr() or whose len is not the iovec's total);
 * -ENOTCONN before connect() succeeded; -FERRY_E_PEER when @dst failed;
 * -ENOMEM.
 */
static int rdma_send(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_cursor cur = { .iov = iov, .cnt = iovcnt };
	struct rdma_peer *p;
	size_t total, rem;
	int ret = 0, wake = 0;

	if (dst >= tp->cfg.world || iovcnt <= 0 || iovcnt > IOV_MAX)
		return -EINVAL;
	if (ferry__tp_check_frame(&t->base, dst, iov, iovcnt, &total))
		return -EINVAL;
	if (dst == tp->cfg.rank)
		return rdma_self_send(t, iov, iovcnt, total);

	p = &t->peers[dst];
	rem = total;
	pthread_mutex_lock(&p->lock);
	if (p->state != RDMA_PEER_UP) {
		ret = p->state == RDMA_PEER_IDLE ? -ENOTCONN : -FERRY_E_PEER;
		goto out_unlock;
	}
	/*
	 * corked: a small frame waits for the sends in flight and leaves with
	 * others, once a signaled completion (sig_n) comes to flush the queue
	 */
	if (!p->q_head &&
	    (total > RDMA_CORK_MAX || !p->sig_n || p->s_posted - p->s_done < RDMA_CORK_INFLIGHT)) {
		while (rem && rdma_can_post_data(t, p)) {
			size_t n = rem < RDMA_CHUNK ? rem : RDMA_CHUNK;

			rdma_cursor_copy(&cur, rdma_sbuf(p, p->s_posted), n);
			rem -= n;
			ret = rdma_post_chunk(t, p, n);
			if (ret) {
				rdma_peer_break(t, p, -ret);
				wake = 1;
				ret = -FERRY_E_PEER;
				goto out_unlock;
			}
		}
	}
	if (rem) {
		ret = rdma_q_append(p, &cur, rem);
		if (ret && rem != total) {
			/* half a frame is posted: the stream cannot go on */
			rdma_peer_break(t, p, ENOMEM);
			wake = 1;
		}
	}
out_unlock:
	pthread_mutex_unlock(&p->lock);
	if (wake)
		rdma_wake(t);
	return ret;
}

/* ---- one-sided operations ------------------------------------------------ */

/* an op on our own memory: served by memcpy, completed through the self queue */
static int rdma_self_rw(struct rdma_tp *t, int write, void *local, uint64_t raddr, uint32_t rkey,
			size_t len, void *ctx)
{
	int need = write ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
	struct rdma_selfmsg *m = calloc(1, sizeof(*m));
	struct rdma_mr *mr;
	void *remote = NULL;

	if (!m)
		return -ENOMEM;
	pthread_mutex_lock(&t->mr_lock);
	for (mr = t->mrs; mr && !remote; mr = mr->next) {
		uintptr_t a = (uintptr_t)mr->base.addr;

		if (mr->mr->rkey == rkey && raddr >= a && raddr - a <= mr->base.len &&
		    len <= mr->base.len - (raddr - a) && (mr->access & need))
			remote = (void *)(uintptr_t)raddr;
	}
	if (remote) {
		if (write)
			memmove(remote, local, len);
		else
			memmove(local, remote, len);
	}
	pthread_mutex_unlock(&t->mr_lock);
	if (!remote) {
		free(m);
		return -EACCES;
	}
	m->done = 1;
	m->ctx = ctx;
	rdma_self_push(t, m);
	return 0;
}

/* check one read()/write() and make its op; NULL with *@ret_p set when refused */
static struct rdma_op *rdma_op_new(struct rdma_tp *t, int write, uint32_t dst, void *local,
				   struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey,
				   size_t len, void *ctx, int *ret_p)
{
	const struct ferry_tp *tp = &t->base;
	struct rdma_mr *m;
	struct rdma_op *op;

	*ret_p = -EINVAL;
	if (dst >= tp->cfg.world || !lmr || !local || !len || len > t->max_msg ||
	    rkey > UINT32_MAX || !tp->cfg.handler->on_rdma_done)
		return NULL;
	m = to_rdma_mr(lmr);
	if (!m->mr || (uintptr_t)local < (uintptr_t)lmr->addr ||
	    (uintptr_t)local - (uintptr_t)lmr->addr > lmr->len ||
	    len > lmr->len - ((uintptr_t)local - (uintptr_t)lmr->addr))
		return NULL;
	*ret_p = -ENOMEM;
	op = malloc(sizeof(*op));
	if (!op)
		return NULL;
	*op = (struct rdma_op){
		.ctx = ctx,
		.local = local,
		.lkey = m->mr->lkey,
		.rkey = (uint32_t)rkey,
		.raddr = raddr,
		.len = (uint32_t)len,
		.write = write,
	};
	*ret_p = 0;
	return op;
}

/* queue @op behind what the out queue holds; p->lock held */
static int rdma_op_queue(struct rdma_peer *p, struct rdma_op *op)
{
	struct rdma_qent *e = calloc(1, sizeof(*e));

	if (!e)
		return -ENOMEM;
	e->op = op;
	rdma_q_push(p, e);
	return 0;
}

static int rdma_rw(struct ferry_tp *tp, int write, uint32_t dst, void *local,
		   struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_peer *p;
	struct rdma_op *op;
	int ret, wake = 0;

	if (dst == tp->cfg.rank) {
		/* the same argument checks, without the op */
		op = rdma_op_new(t, write, dst, local, lmr, raddr, rkey, len, ctx, &ret);
		free(op);
		return ret ? ret : rdma_self_rw(t, write, local, raddr, (uint32_t)rkey, len, ctx);
	}
	op = rdma_op_new(t, write, dst, local, lmr, raddr, rkey, len, ctx, &ret);
	if (!op)
		return ret;
	p = &t->peers[dst];
	pthread_mutex_lock(&p->lock);
	if (p->state != RDMA_PEER_UP) {
		ret = p->state == RDMA_PEER_IDLE ? -ENOTCONN : -FERRY_E_PEER;
	} else if (!p->q_head && rdma_sq_room(t, p)) {
		ret = rdma_post_op(t, p, op);
		if (ret) {
			rdma_peer_break(t, p, -ret);
			wake = 1;
			ret = -FERRY_E_PEER;
		}
	} else {
		/* behind queued frames, or the send queue is full: in order, later */
		ret = rdma_op_queue(p, op);
	}
	pthread_mutex_unlock(&p->lock);
	if (ret)
		free(op);
	if (wake)
		rdma_wake(t);
	return ret;
}

/*
 * rdma_post_chain - post @n READs to @p as one chain, one doorbell: only the
 * last is signaled, and its completion completes them all (an RC send queue
 * completes in order; a failed one among them fails the queue pair, and the
 * flushed signaled one then fails the chain)
 *
 * Call with p->lock held, the peer UP and room for @n work requests.
 * Return: 0, or the negative errno of ibv_post_send (nothing posted).
 */
static int rdma_post_chain(struct rdma_tp *t, struct rdma_peer *p, struct rdma_op **ops, size_t n)
{
	struct ibv_sge sge[RDMA_CHAIN_MAX];
	struct ibv_send_wr wr[RDMA_CHAIN_MAX], *bad;
	int ret;

	for (size_t i = 0; i < n; i++) {
		int last = i + 1 == n;

		sge[i] = (struct ibv_sge){
			.addr = (uintptr_t)ops[i]->local,
			.length = ops[i]->len,
			.lkey = ops[i]->lkey,
		};
		wr[i] = (struct ibv_send_wr){
			.wr_id = rdma_wr_id(last ? RDMA_WR_SIG : RDMA_WR_UNSIG, p->rank, p->gen, 0),
			.next = last ? NULL : &wr[i + 1],
			.sg_list = &sge[i],
			.num_sge = 1,
			.opcode = IBV_WR_RDMA_READ,
			.send_flags = last ? IBV_SEND_SIGNALED : 0,
			.wr.rdma = { .remote_addr = ops[i]->raddr, .rkey = ops[i]->rkey },
		};
		ops[i]->next = last ? NULL : ops[i + 1];
	}
	ret = ibv_post_send(p->qp, wr, &bad);
	if (ret) {
		for (size_t i = 0; i < n; i++)
			ops[i]->next = NULL;
		return -ret;
	}
	p->sq_posted += n;
	/* the record names the first op; the chain hangs off it */
	rdma_sig_push(t, p, ops[0]);
	return 0;
}

/* read_v() for @n reads to one peer; sets each rds[i].status */
static void rdma_read_run(struct rdma_tp *t, struct ferry_tp_rd *rds, size_t n)
{
	struct rdma_op *ops[RDMA_CHAIN_MAX];
	struct ferry_tp_rd *idx[RDMA_CHAIN_MAX];
	uint32_t dst = rds[0].dst;
	struct rdma_peer *p;
	size_t k = 0, i;
	int ret = 0, wake = 0;

	for (i = 0; i < n; i++) {
		struct ferry_tp_rd *d = &rds[i];

		if (dst == t->base.cfg.rank) {
			d->status = rdma_rw(&t->base, 0, dst, d->local, d->lmr, d->raddr, d->rkey,
					    d->len, d->ctx);
			continue;
		}
		ops[k] = rdma_op_new(t, 0, dst, d->local, d->lmr, d->raddr, d->rkey, d->len, d->ctx,
				     &d->status);
		if (ops[k])
			idx[k++] = d;
	}
	if (!k)
		return;
	p = &t->peers[dst];
	pthread_mutex_lock(&p->lock);
	if (p->state != RDMA_PEER_UP) {
		ret = p->state == RDMA_PEER_IDLE ? -ENOTCONN : -FERRY_E_PEER;
		i = 0;
	} else {
		size_t room = t->sq_depth - (size_t)(p->sq_posted - p->sq_done);
		size_t now = p->q_head ? 0 : k < room ? k : room;

		ret = now ? rdma_post_chain(t, p, ops, now) : 0;
		if (ret) {
			rdma_peer_break(t, p, -ret);
			wake = 1;
			ret = -FERRY_E_PEER;
			i = 0;
		} else {
			/* what did not fit waits in the out queue, in order */
			for (i = now; i < k; i++)
				if (rdma_op_queue(p, ops[i]))
					break;
			if (i < k)
				ret = -ENOMEM;
		}
	}
	pthread_mutex_unlock(&p->lock);
	/* ops[i..k) were not posted (i = 0: none was) */
	for (; i < k; i++) {
		idx[i]->status = ret;
		free(ops[i]);
	}
	if (wake)
		rdma_wake(t);
}

/*
 * rdma_read_v - post a batch of READs: each run of entries to one
 * destination (at most RDMA_CHAIN_MAX at a time) is one chain of work
 * requests, one ibv_post_send, one signaled completion
 *
 * Context: any thread. Return: 0, or the first entry's error (rds[i].status
 * says which were posted; those complete through on_rdma_done, once).
 */
static int rdma_read_v(struct ferry_tp *tp, struct ferry_tp_rd *rds, size_t n)
{
	struct rdma_tp *t = to_rdma(tp);
	size_t i = 0, j;
	int ret = 0;

	while (i < n) {
		for (j = i + 1; j < n && j - i < RDMA_CHAIN_MAX && rds[j].dst == rds[i].dst; j++)
			;
		if (rds[i].dst >= tp->cfg.world) {
			for (; i < j; i++)
				rds[i].status = -EINVAL;
			continue;
		}
		rdma_read_run(t, rds + i, j - i);
		i = j;
	}
	for (i = 0; i < n && !ret; i++)
		ret = rds[i].status;
	return ret;
}

/*
 * rdma_poll - handle the send CQ's completions on the calling thread
 *
 * A worker that waits for its READs calls it instead of waiting for the
 * progress thread to take the completion and wake it: a READ's
 * on_rdma_done() runs right here. Another poller (the progress thread, or
 * another worker) busy: returns 0 at once. Context: any thread but the
 * progress thread, not inside a handler, never after fini() began.
 * Return: completions handled.
 */
static int rdma_poll(struct ferry_tp *tp, unsigned flags)
{
	struct rdma_tp *t = to_rdma(tp);
	int total = 0;

	if (pthread_mutex_trylock(&t->cq_lock))
		return 0;
	__atomic_add_fetch(&t->polls, 1, __ATOMIC_RELAXED);
	if (!__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
		total = rdma_scq_drain(t, 1);
	pthread_mutex_unlock(&t->cq_lock);
	if ((flags & FERRY_TP_POLL_LAST) && __atomic_load_n(&t->scq_off, __ATOMIC_RELAXED)) {
		/* the progress thread must take completions again, now */
		__atomic_store_n(&t->scq_rearm, 1, __ATOMIC_RELEASE);
		rdma_wake(t);
	}
	return total;
}

/*
 * rdma_read - post one RDMA READ of @len bytes at @raddr/@rkey of @dst into
 * @local, which lies inside @lmr
 *
 * Context: any thread. Completion: on_rdma_done(@ctx, 0 or a negative errno)
 * on the progress thread, exactly once, unless this returns an error.
 * Return: 0; -EINVAL (bad arguments, or no on_rdma_done handler);
 * -ENOTCONN, -FERRY_E_PEER, -ENOMEM; -EACCES for our own rank when no
 * registration of ours matches @raddr/@rkey.
 */
static int rdma_read(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		     uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	return rdma_rw(tp, 0, dst, local, lmr, raddr, rkey, len, ctx);
}

/* rdma_write - the same for an RDMA WRITE of @local to @raddr/@rkey of @dst */
static int rdma_write(struct ferry_tp *tp, uint32_t dst, const void *local, struct ferry_tp_mr *lmr,
		      uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	return rdma_rw(tp, 1, dst, (void *)local, lmr, raddr, rkey, len, ctx);
}

/*
 * rdma_mem_reg - register @len bytes at @addr with the least access needed
 *
 * Local write always (the buffer may be the target of a READ), remote read
 * and remote write only as @access asks. Context: any thread, after init().
 * Return: 0 (@mr filled), -EINVAL, -ENOMEM when the memlock limit is too
 * small (logged with the fix), or ibv_reg_mr's errno.
 */
static int rdma_mem_reg(struct ferry_tp *tp, void *addr, size_t len, unsigned access,
			struct ferry_tp_mr *mr)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_mr *m = to_rdma_mr(mr);
	int flags = IBV_ACCESS_LOCAL_WRITE, ret;
	char what[64];

	if (!addr || !len)
		return -EINVAL;
	if (access & FERRY_TP_ACCESS_REMOTE_READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	if (access & FERRY_TP_ACCESS_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	snprintf(what, sizeof(what), "a region of %zu bytes", len);
	ret = rdma_memlock_check(tp->cfg.rank, len, what);
	if (ret)
		return ret;
	m->mr = ibv_reg_mr(t->pd, addr, len, flags);
	if (!m->mr) {
		ret = errno ? -errno : -ENOMEM;
		ferry_err(
			"rdma: rank %u: registering %zu bytes at %p failed: %s%s", tp->cfg.rank,
			len, addr, strerror(-ret),
			ret == -ENOMEM || ret == -EPERM || ret == -EAGAIN ?
				"; check the memlock limit (`ulimit -l`; raise it with `ulimit -l "
				"unlimited`, or memlock in /etc/security/limits.conf)" :
				"");
		return ret;
	}
	__atomic_add_fetch(&rdma_pinned, len, __ATOMIC_RELAXED);
	m->access = flags;
	mr->addr = addr;
	mr->len = len;
	mr->rkey = m->mr->rkey;
	pthread_mutex_lock(&t->mr_lock);
	m->next = t->mrs;
	t->mrs = m;
	pthread_mutex_unlock(&t->mr_lock);
	return 0;
}

/* Context: any thread; no read()/write() on @mr may be in flight. */
static void rdma_mem_dereg(struct ferry_tp *tp, struct ferry_tp_mr *mr)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_mr *m = to_rdma_mr(mr), **pp;

	if (!m->mr)
		return;
	pthread_mutex_lock(&t->mr_lock);
	for (pp = &t->mrs; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	}
	pthread_mutex_unlock(&t->mr_lock);
	ibv_dereg_mr(m->mr);
	__atomic_sub_fetch(&rdma_pinned, mr->len, __ATOMIC_RELAXED);
	m->mr = NULL;
}

const struct ferry_tp_ops ferry__rdma_ops = {
	.size = sizeof(struct ferry_tp_ops),
	.name = "rdma",
	.caps = FERRY_TP_CAP_READ | FERRY_TP_CAP_WRITE,
	.tp_size = sizeof(struct rdma_tp),
	.mr_size = sizeof(struct rdma_mr),
	.probe = rdma_probe,
	.init = rdma_init,
	.addr_get = rdma_addr_get,
	.connect = rdma_tp_connect,
	.send = rdma_send,
	.mem_reg = rdma_mem_reg,
	.mem_dereg = rdma_mem_dereg,
	.read = rdma_read,
	.read_v = rdma_read_v,
	.poll = rdma_poll,
	.write = rdma_write,
	.fini = rdma_fini,
};

/* SPDX-License-Identifier: MIT */
/*
 * core.h - the core's internal objects: node, table, worker, request.
 *
 * Threads: a node has one progress thread (owned by its transport) that runs
 * every message handler, one at a time, and any number of application
 * threads, each with its own worker. Who touches what:
 *
 *   node.tables[]          written at create/destroy; read by all (RCU)
 *   table.dir.own          keys live here: written under dir.own_lock (a spin lock), read
 *                          under rcu_read_lock (lib/dir/dir.h)
 *   table.dir.loc          location hints; relaxed atomics, any thread
 *   table.dir.owners       authoritative owner at the home: progress thread only
 *   table.pend             keys on their way here: table.pend.lock (+ RCU)
 *   table.inbox            landing entries (free list, busy marks): table.pend.lock
 *   worker.reqs[]          the worker's thread; replies under worker.lock
 *   req.dsts               the worker's thread (sends and waits)
 *   node.failed[], failures  atomics, written once per rank by the progress thread
 *   node.barrier_*, table_*  node.lock (application threads and progress thread)
 */
#ifndef FERRY_LIB_CORE_H
#define FERRY_LIB_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <urcu/urcu-memb.h>

#include "ferry/ferry.h"
#include "transport/base/log.h"
#include "lib/dir/pend.h"
#include "lib/dir/dir.h"
#include "lib/dir/placement.h"
#include "lib/core/config.h"
#include "lib/core/proto.h"
#include "lib/store/init.h"
#include "lib/store/store.h"
#include "transport/base/clock.h"
#include "transport/transport.h"

#define FERRY_MAX_TABLES 256
#define FERRY_MAX_WORKERS 1024
#define FERRY_SPARSE_CAPACITY (1u << 20) /* slots per node of a sparse table by default */
#define FERRY_MAX_INFLIGHT 1024		 /* tickets per worker */
#define FERRY_MAX_HOPS 32		 /* forwards before an operation is given up */

struct ferry;
struct ferry_table;

/*
 * What a one-sided operation's completion context starts with: the function
 * that finishes it. The node's on_rdma_done calls it with rcu_read_lock held,
 * on the progress thread or on a worker polling the transport; the module
 * that posted the operation owns the context.
 */
struct ferry_rdma_ctx {
	void (*done)(struct ferry *fy, void *ctx, int status);
};

/*
 * The frame dispatcher (dispatch.c). A module registers a handler per frame
 * type before the node starts (ferry__node_start); the progress thread calls
 * it, one frame at a time, with rcu_read_lock held, after ferry__proto_parse
 * checked the whole frame. FERRY_DISPATCH_TABLE: the frame names a table,
 * which the dispatcher looks up and parses against (@t is never NULL);
 * FERRY_DISPATCH_NODE: a node-wide frame, parsed with the world's limits
 * only (@t is NULL). Bound: one entry per frame type.
 */
enum ferry_dispatch_scope {
	FERRY_DISPATCH_NODE = 1,
	FERRY_DISPATCH_TABLE,
};

typedef void (*ferry_msg_fn)(struct ferry *fy, struct ferry_table *t, uint32_t src,
			     const struct ferry_proto_view *v);

/* a write_imm() from @src landed; @tag: the module's bits of the 24-bit tag
 * (FERRY_TP_IMM_USER_SHIFT of them). Progress thread, rcu_read_lock held. */
typedef void (*ferry_imm_fn)(struct ferry *fy, uint32_t src, uint32_t tag);

struct ferry_msg_handler {
	ferry_msg_fn fn;
	enum ferry_dispatch_scope scope;
};

/*
 * The landing inbox (lib/reloc/inbox.c): entries a peer RDMA WRITEs a handed-over value
 * into, registered for remote writes only, so that the arena needs no remote
 * write access. One region of @k entries per peer, each its own registration
 * whose rkey only that peer receives (a CHUNK frame to it alone), so a peer
 * can write only its own region. The requester reserves an entry, in the
 * region of the node it expects to hand the key over, with the slot when it
 * starts a localize and frees it when the key is installed (or the home says
 * it is ours already). Free lists and busy marks under table.pend.lock.
 */
struct ferry_inbox {
	uint8_t *base; /* NULL: no inbox, hand-overs to this node go by message */
	size_t bytes;
	uint32_t n;			      /* entries: k per peer, world - 1 regions */
	uint32_t k;			      /* entries per region */
	uint32_t stride;		      /* bytes per entry, a multiple of 64 */
	struct ferry_tp_mr **mrs;	      /* per region (world - 1) */
	uint32_t *free;			      /* per region r, a stack at free[r * k] (pend.lock) */
	uint32_t *nfree_r;		      /* per region: entries on its stack */
	uint32_t nfree;			      /* in all */
	uint8_t *busy;			      /* per entry: 1 while reserved (pend.lock) */
	atomic_uint_fast64_t onesided;	      /* values received through it */
	atomic_uint_fast64_t write_fallbacks; /* old owner: batches sent by message after a
					       * failed write */
	atomic_bool bad_index_logged;	      /* old owner: a landing index out of range */
};

/* a peer's arena chunks, as its CHUNK frames announced them */
struct ferry_peer_chunks {
	uint32_t shift; /* slots per chunk, log2; 0: nothing known yet (atomic) */
	uint32_t pad;
	struct {
		uint64_t rkey;
		uint32_t valid; /* set (release) after rkey */
		uint32_t pad;
	} c[FERRY_CHUNKS_MAX];
};

/*
 * A table whose consistency model is not SEQUENTIAL has its pulls, pushes
 * and sets served by lib/cons/ (which sends through ops underneath); ops
 * calls these instead of its own path. Set before the table is returned to
 * the application, never changed after.
 */
struct ferry_worker;
struct ferry_cons_hooks {
	int (*pull)(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		    float *vals);
	int (*push)(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		    const float *deltas);
	int (*set)(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		   const float *vals);
};

struct ferry_table {
	struct ferry *fy;
	uint32_t id;
	struct ferry_table_params params;
	uint32_t *value_lens; /* copy, or NULL */
	uint64_t *value_offs; /* prefix sums of value_lens, or NULL */
	uint32_t max_len;
	struct ferry_init_spec init; /* values before the first write */
	struct ferry_placement_map place;
	struct ferry_proto_limits lim;
	struct ferry_dir dir;
	struct ferry_arena arena;
	struct ferry_tp_mr *chunk_mr[FERRY_ARENA_CHUNKS_MAX]; /* registered chunks (atomic) */
	uint64_t registered;				      /* their bytes (atomic) */
	uint32_t chunks_announced;			      /* progress thread */
	struct ferry_peer_chunks *peer_chunks; /* world entries; one-sided transports */
	struct ferry_inbox inbox;
	struct ferry_msg_arena *peer_arena; /* one-sided transports: every rank's arena
					     * and landing inbox */
	uint64_t *inbox_grant; /* per rank: the rkey of its inbox region for us, from its
				* CHUNK frame; 0: none yet (progress thread) */
	bool onesided;	       /* one-sided access on: set (release) once peer_arena is
			* known, after the table is already served; read it with
			* ferry__table_onesided() */

	struct ferry_pend_table pend; /* keys on their way here (lib/dir/pend.h) */
	bool dying; /* destroyed here, served until every node destroyed it (fy->lock) */
	atomic_bool full_logged; /* a new sparse key found the arena full (logged once) */

	/* table create handshake (rank 0 collects; everyone waits for the ack) */
	struct ferry_msg_table wire;

	/* consistency model other than SEQUENTIAL: lib/cons/'s hooks and state */
	const struct ferry_cons_hooks *cons_hooks;
	void *cons;
	struct ferry_repl *repl; /* replicas: backups, held replies (lib/ops/repl.c) */
	void *codec;		 /* push_codec: the workers' residuals (lib/ops/codec.c) */
	/* push_codec: ferry_push() goes through lib/ops/codec.c, which calls
	 * the request path in turn (so a pointer, set by lib/table/) */
	int (*codec_push)(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			  size_t n, const float *deltas);
	/* hot keys: their replicas and deltas (lib/cons/hot.c); read by the
	 * progress thread under RCU, freed after a grace period */
	void *hot;
};

struct ferry_worker;
struct ferry_req;

/* sends a request's remote part for a request kind of a module above ops
 * (localize); the worker's thread. Return: 0 or a negative errno (the
 * request then carries the status). */
typedef int (*ferry_req_start_fn)(struct ferry_worker *w, struct ferry_table *t,
				  struct ferry_req *r, uint64_t ticket);

struct ferry_req {
	uint64_t ticket;	  /* (generation << 32) | index; 0 when free */
	uint8_t op;		  /* enum ferry_op, or FERRY_REQ_LOCALIZE */
	ferry_req_start_fn start; /* NULL: pull, push, set (OP frames) */
	bool held;		  /* waiting for an earlier operation on one of its keys */
	struct ferry_table *t;
	const uint64_t *keys;
	size_t n;
	float *out;	  /* pull */
	const float *in;  /* push, set */
	size_t remaining; /* key operations not done yet (worker.lock) */
	int status;	  /* first failure (worker.lock) */
	uint8_t *done;	  /* one bit per key: each completes once */
	struct ferry_req *next_held;
	bool tracked; /* its remote keys are in worker.inflight */
	/* the ranks its frames and reads went to, so a wait ends at once when
	 * one of them fails (more than FERRY_REQ_DSTS: the timeout bounds it) */
	uint8_t ndsts;
	bool dsts_many;
	uint32_t dsts[8];
	/* ranks that nodes on the way forwarded its keys to (OP_FWD); written
	 * by the progress thread and read by the worker, both under w->lock */
	uint8_t nfwds;
	bool fwds_many;
	uint32_t fwds[4];
	atomic_bool fwds_new; /* set with each: the worker looks at them again */
	unsigned fail_seen;   /* node.failures when it started */
	unsigned take_seen;   /* replicas: table.repl.takeovers when it was sent */
	uint16_t flags;	      /* FERRY_OP_F_* of its OP frames (compressed pushes) */
};

#define FERRY_REQ_LOCALIZE 16

struct ferry_worker {
	struct ferry *fy;
	uint32_t id;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int sleeping;
	struct ferry_req reqs[FERRY_MAX_INFLIGHT];
	uint32_t free_idx[FERRY_MAX_INFLIGHT];
	uint32_t nfree;
	uint32_t gen;
	struct ferry_req *held_head, *held_tail;
	/* keys with a remote operation in flight: open addressing */
	uint64_t *inflight_keys;
	uint32_t *inflight_cnt;
	uint32_t inflight_cap;
	uint32_t inflight_n;
	/* counters, written by this worker's thread only */
	uint64_t local_ops, remote_ops;
	/* landing areas for one-sided reads, per table (created on first use) */
	struct ferry_rd_pool *rd_pools[FERRY_MAX_TABLES];
	uint16_t op_flags; /* the next request's flags (lib/ops/codec.c sets it) */
};

struct ferry {
	struct ferry_fastrd *fastrd; /* the workers' fast-path sections (lib/dir/fastrd.h) */
	struct ferry_budget budget;  /* bytes of slots in use, all tables (lib/store/store.h) */
	uint32_t rank, world;
	struct ferry_msg_handler handlers[FERRY_MSG_TYPE_MAX]; /* written before start */
	/* on_write_imm per module (FERRY_TP_IMM_USER_*); written before start */
	ferry_imm_fn imm_fns[FERRY_TP_IMM_USERS];
	struct ferry_config *cfg; /* between ferry__node_create and _start only */
	int timeout_ms;
	int busy_poll;
	struct ferry_tp *tp;
	uint64_t cluster_id;
	/* rank 0: the thread that answers rejoins on the rendezvous port
	 * (rejoin.c), from ferry__node_start to ferry__node_close; else NULL.
	 * node.c reaches it through the hooks ferry__rejoin_attach sets (the
	 * module above it is not called by name) */
	struct ferry_rejoin_srv *rejoin_srv;
	int (*rejoin_start)(struct ferry *fy, const struct ferry_config *c, int lfd);
	void (*rejoin_stop)(struct ferry_rejoin_srv *srv);
	void (*rejoin_free)(struct ferry_rejoin_srv *srv);
	/* whether a takeover of @rank still waits here (a table with replicas:
	 * lib/ops/failover.c sets it); NULL: none ever does. Progress thread,
	 * rcu_read_lock held */
	bool (*takeover_pending)(struct ferry *fy, uint32_t rank);
	/* keys a move's ticket (struct ferry_msg_mv) is drawn with: random per
	 * node (ferry__node_create), read-only afterwards */
	uint8_t move_key[16];
	atomic_uint_fast64_t move_seq; /* moves started: each ticket's input */
	atomic_int refs;
	atomic_bool closed;
	atomic_int pollers;  /* threads inside ferry__node_poll(): close waits for them */
	int tp_polls;	     /* the transport has poll(); set before any worker exists */
	atomic_bool *failed; /* per rank */

	pthread_mutex_t lock; /* tables, workers, barrier and table handshakes */
	pthread_cond_t cond;
	struct ferry_table *tables[FERRY_MAX_TABLES]; /* RCU */
	uint32_t ntables;
	struct ferry_worker *workers[FERRY_MAX_WORKERS]; /* RCU */

	/* listeners of peer failures (ferry__node_on_peer_failed); written
	 * before the node starts */
	void (*peer_failed_fns[8])(struct ferry *fy, uint32_t rank);
	/* a module's node-wide state, freed with the node (after the transport
	 * stopped and every handle that holds a reference went): collectives */
	void *coll;
	void (*coll_free)(void *coll);
	/* the membership manager's state (lib/mgr/): set by ferry_open after the
	 * node started, taken back by ferry_close before it stops; NULL: the
	 * embedded manager */
	void *mgr;
	atomic_uint failures; /* peers marked failed so far: waiters re-check on change */

	/* barrier: rank 0 counts, everyone waits for the release */
	uint32_t barrier_broken;   /* 1 + a rank that failed: every barrier fails (lock) */
	uint64_t barrier_gen;	   /* next generation this node enters */
	uint64_t barrier_released; /* highest released generation + 1 */
	uint64_t *barrier_arrived; /* rank 0: per rank, generations entered */
	/* table handshake at rank 0: the parameters each rank sent, per table id */
	struct ferry_msg_table *table_seen[FERRY_MAX_TABLES];
	uint32_t table_nseen[FERRY_MAX_TABLES];
	int table_verdict[FERRY_MAX_TABLES]; /* 1 + status once acked */
	struct ferry_msg_table table_ack[FERRY_MAX_TABLES];
	struct ferry_msg_arena *table_arenas[FERRY_MAX_TABLES]; /* from the ack */
	/* table destroy fence: ids in use here (a destroyed id is reused, as
	 * every node frees it before any creates again); rank 0: per id, the
	 * ranks that destroyed it (world bytes while a destroy runs) */
	bool table_inuse[FERRY_MAX_TABLES];
	uint8_t *table_freeing[FERRY_MAX_TABLES];
	bool table_freed[FERRY_MAX_TABLES]; /* the fence passed: free it */

	/* counters of the progress thread and of destroyed workers */
	atomic_uint_fast64_t served_ops, forwards, reloc_in, reloc_out;
	atomic_uint_fast64_t msgs_sent, msgs_recv, bytes_sent, bytes_recv;
	atomic_uint_fast64_t gone_local_ops, gone_remote_ops;
	atomic_uint_fast64_t onesided_reads, onesided_retries, onesided_fallbacks;

	/* consistency models (lib/cons/): node-wide clocks, freed with the
	 * node; a worker joins the clocks when it is made and leaves them
	 * first thing when it goes (worker.c calls cons_worker_new and
	 * cons_worker_gone); reads of SSP/ESSP tables by staleness */
	void *cons;
	void (*cons_free)(void *cons);
	void (*cons_worker_new)(struct ferry_worker *w);
	void (*cons_worker_gone)(struct ferry_worker *w);
	/* ferry_barrier() calls it with after = 0 before it enters (flush what
	 * this node buffered) and after = 1 once released (drop cached copies) */
	int (*cons_barrier)(struct ferry *fy, int after);
	/* ferry_close(), before the transport goes: lib/cons/'s own threads stop */
	void (*cons_close)(struct ferry *fy);
	atomic_uint_fast64_t staleness[FERRY_STALENESS_BUCKETS];
	atomic_uint_fast64_t cons_hits, cons_misses, cons_refreshed;
	atomic_uint_fast64_t essp_subscribed, essp_pushed, essp_taken, essp_refused;
	/* failure detector (heartbeat.c): per rank, set when a frame arrives
	 * (dispatch.c) and cleared by the detector's tick; its state, freed with
	 * the node after the transport */
	atomic_uchar *heard;
	/* per rank: its process is known to be gone (the transport found no
	 * listener: on_peer_failed(-ECONNREFUSED), set in dispatch.c; or a
	 * peer's REPL_SYNC said so); read by the fencing's takeover wait */
	atomic_uchar *gone;
	int heartbeat_ms; /* timeout; -1: off */
	/* fencing (heartbeat.c, lib/ops/failover.c): this node learned that the
	 * others failed it, or it lost a quorum; its tables with replicas stop
	 * serving for good */
	atomic_bool fenced;
	void *hb;
	void (*hb_free)(void *hb);
	void (*tick_fns[4])(struct ferry *fy); /* written before the node starts */
	/* reloc's: a move of @key to this node waits for a failed old owner
	 * (lib/ops/repl.c): @keep, finish it with @val from the key's backup;
	 * else drop it (the key goes on to a later requester). 0, or -ENOENT
	 * when no move of @key is waiting. Progress thread. */
	int (*move_fill)(struct ferry_table *t, uint64_t key, const float *val, uint32_t len,
			 bool keep);
	/* the step stamps of ferry-bench --timeline (timeline.h); NULL: off.
	 * Set once by ferry__tl_enable, freed with the node */
	_Atomic(struct ferry_tl *) tl;
};

/* node.c: the bottom of the core; modules call it, it calls none of them */
/* a node from @params, its transport chosen, not started: modules register
 * their handlers, then ferry__node_start(); 0 or a negative errno */
int ferry__node_create(const struct ferry_params *params, struct ferry **fy_p);
/* start the transport with @handler (the dispatcher's) for what it
 * delivers, join the cluster, connect; on failure the node is freed.
 * Context: the thread of ferry_open. */
int ferry__node_start(struct ferry *fy, const struct ferry_tp_handler *handler);
void ferry__node_close(struct ferry *fy);
int ferry__send(struct ferry *fy, uint32_t dst, const void *frame, size_t len);
/* the same for a frame in pieces (header and body, data, padding) */
int ferry__sendv(struct ferry *fy, uint32_t dst, const struct iovec *iov, int iovcnt);
/* take a reference on the node (a handle that outlives ferry_close) */
void ferry__node_get(struct ferry *fy);
void ferry__node_put(struct ferry *fy);
int ferry__node_poll(struct ferry *fy, unsigned flags);
int ferry__cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *ts);
/*
 * ferry__node_peer_failed - mark @rank failed (its connection broke, or it
 * broke the protocol, which the caller logged): sends to it fail at once,
 * waiters wake, the transport forgets it (a peer dropped for a protocol
 * error learns it from the closed connection), and the listeners run. Once
 * per rank. Context: the progress thread (a handler, or the transport's
 * on_peer_failed).
 */
void ferry__node_peer_failed(struct ferry *fy, uint32_t rank);
/* run @fn(fy, rank) on the progress thread when a peer fails; before start.
 * Return: 0 or -ENOSPC */
int ferry__node_on_peer_failed(struct ferry *fy, void (*fn)(struct ferry *fy, uint32_t rank));
/* the first rank after @rank (cyclically) that is not failed, treating
 * @spare as alive (world: none), or world when none is; any thread */
uint32_t ferry__node_live_after(const struct ferry *fy, uint32_t rank, uint32_t spare);
/* register the calling thread with RCU unless it is already (counted per
 * thread: workers and table teardown share it); any application thread */
void ferry__rcu_enter(void);
void ferry__rcu_leave(void);

/* dispatch.c */
/* Context: before ferry__node_start. Return: 0, or -EEXIST / -EINVAL. */
int ferry__dispatch_register(struct ferry *fy, uint8_t type, enum ferry_dispatch_scope scope,
			     ferry_msg_fn fn);
/* the handler of write_imm tags of module @user (FERRY_TP_IMM_USER_*).
 * Context: before ferry__node_start. Return: 0, or -EEXIST / -EINVAL. */
int ferry__dispatch_register_imm(struct ferry *fy, uint32_t user, ferry_imm_fn fn);
extern const struct ferry_tp_handler ferry__dispatch_handler;

/* barrier.c */
int ferry__barrier_attach(struct ferry *fy);

/* heartbeat.c: attach before the node starts; start after (off when the
 * timeout is -1 or the world is one node); stop before the node closes */
int ferry__heartbeat_attach(struct ferry *fy);
int ferry__heartbeat_start(struct ferry *fy);
void ferry__heartbeat_stop(struct ferry *fy);
/*
 * The lease (fencing, docs/faults.md): with the heartbeat on, a node holds
 * its lease while the ranks whose echo of one of its beats sent less than
 * ferry__lease_ms() ago form a quorum with it (more than half the world, or
 * exactly half including rank 0); off: always held. Progress thread.
 */
bool ferry__lease_held(struct ferry *fy);
/* 0, or -FERRY_E_PEER (fenced, or the lease lapsed) with a log line (at
 * most one a second) naming @what was not acknowledged */
int ferry__lease_check(struct ferry *fy, const char *what);
/* 0, or -FERRY_E_PEER with a log line (at most one a second) when this
 * node is fenced; any thread */
int ferry__fenced_check(struct ferry *fy, const char *what);
int ferry__lease_ms(const struct ferry *fy); /* 0: no heartbeat, no lease */
/* the wait before a takeover of a failed node's keys: the lease plus a
 * margin (ms; 0 without a heartbeat) */
int ferry__lease_takeover_ms(const struct ferry *fy);
/* does the set of ranks @in (world bools, or NULL: the ranks not failed)
 * form a quorum? */
bool ferry__quorum(const struct ferry *fy, const bool *in);
/* @rank's process is known to be gone (fy->gone): it can acknowledge
 * nothing more, so a takeover of its keys need not wait its lease out. Any
 * thread */
void ferry__lease_gone(struct ferry *fy, uint32_t rank);
bool ferry__lease_is_gone(const struct ferry *fy, uint32_t rank);
/* stop serving tables with replicas for good; @why ends the log line */
void ferry__node_fence(struct ferry *fy, const char *why);
/* a function the heartbeat's tick calls (progress thread); 0 or -ENOSPC */
int ferry__heartbeat_on_tick(struct ferry *fy, void (*fn)(struct ferry *fy));

/* small helpers */
static inline bool ferry__table_onesided(const struct ferry_table *t)
{
	return __atomic_load_n(&t->onesided, __ATOMIC_ACQUIRE);
}

static inline uint32_t ferry__value_len(const struct ferry_table *t, uint64_t key)
{
	return t->value_lens ? t->value_lens[key] : t->params.value_len;
}

/* a key of the table: any key of a sparse table, 0 .. num_keys-1 else */
static inline bool ferry__key_ok(const struct ferry_table *t, uint64_t key)
{
	return t->params.sparse || key < t->params.num_keys;
}

/* the home of @key as it was while @spare was alive (world: as now) */
static inline uint32_t ferry__home_as(const struct ferry_table *t, uint64_t key, uint32_t spare)
{
	uint32_t h = ferry__placement_home(&t->place, key);

	if (t->params.replicas && h != spare &&
	    atomic_load_explicit(&t->fy->failed[h], memory_order_relaxed))
		h = ferry__node_live_after(t->fy, h, spare);
	return h;
}

/* the home placement gives @key, failed or not */
static inline uint32_t ferry__home_orig(const struct ferry_table *t, uint64_t key)
{
	return ferry__placement_home(&t->place, key);
}

/*
 * The home of @key. With replicas, a failed home's keys pass to the next
 * live rank after it (lib/ops/repl.c: its successor holds their backups),
 * so every node that has seen the same failures names the same home.
 */
static inline uint32_t ferry__home(const struct ferry_table *t, uint64_t key)
{
	uint32_t h = ferry__placement_home(&t->place, key);

	if (t->params.replicas && atomic_load_explicit(&t->fy->failed[h], memory_order_relaxed))
		h = ferry__node_live_after(t->fy, h, t->fy->world);
	return h;
}

/* the live slot of @key here, or NULL; rcu_read_lock held */
static inline struct ferry_slot *ferry__own(const struct ferry_table *t, uint64_t key)
{
	return (struct ferry_slot *)ferry__dir_own(&t->dir, key);
}

/* the owner of @key at its home (this node); progress thread */
static inline uint32_t ferry__owner(const struct ferry_table *t, uint64_t key)
{
	return ferry__dir_owner(&t->dir, key);
}

/*
 * Location hints (lib/dir/dir.h: a bounded cache). Only hints: a one-sided
 * reader checks key, epoch and state in the slot, and a node that does not
 * own a key forwards to its home. No hint: the home.
 */
static inline uint32_t ferry__loc_get(const struct ferry_table *t, uint64_t key)
{
	uint64_t w = ferry__dir_loc(&t->dir, key);
	uint32_t rank = (uint32_t)(w & 0xffff);

	return rank && rank <= t->fy->world ? rank - 1 : ferry__home(t, key);
}

static inline void ferry__loc_set(struct ferry_table *t, uint64_t key, uint32_t rank)
{
	ferry__dir_loc_put(&t->dir, key, (uint64_t)rank + 1);
}

static inline void ferry__loc_set_slot(struct ferry_table *t, uint64_t key, uint32_t rank,
				       uint32_t slot, uint32_t epoch)
{
	uint64_t w = (uint64_t)(rank + 1) | (uint64_t)(epoch & 0xffff) << 16 |
		     (uint64_t)(slot + 1) << 32;

	ferry__dir_loc_put(&t->dir, key, w);
}

/* 1 with rank, slot and epoch (low 16 bits) when the slot is known */
static inline int ferry__loc_slot(const struct ferry_table *t, uint64_t key, uint32_t *rank,
				  uint32_t *slot, uint32_t *epoch16)
{
	uint64_t w = ferry__dir_loc(&t->dir, key);
	uint32_t r = (uint32_t)(w & 0xffff);

	if (!r || r > t->fy->world || !(w >> 32))
		return 0;
	*rank = r - 1;
	*epoch16 = (uint32_t)(w >> 16) & 0xffff;
	*slot = (uint32_t)(w >> 32) - 1;
	return 1;
}

#endif /* FERRY_LIB_CORE_H */

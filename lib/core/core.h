/* SPDX-License-Identifier: MIT */
/*
 * core.h - the core's internal objects: node, table, worker, request.
 *
 * Threads: a node has one progress thread (owned by its transport) that runs
 * every message handler, one at a time, and any number of application
 * threads, each with its own worker. Who touches what:
 *
 *   node.tables[]          written at create/destroy; read by all (RCU)
 *   table.dir.own[]        published by the progress thread, read by workers
 *                          and the progress thread under rcu_read_lock
 *   table.dir.loc[]        location hints; relaxed atomics, any thread
 *   table.dir.owner[]      authoritative owner at the home: progress thread only
 *   table.pend             keys on their way here: table.pend_lock
 *   table.inbox            landing entries (free list, busy marks): table.pend_lock
 *   worker.reqs[]          the worker's thread; replies under worker.lock
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
#include "lib/dir/placement.h"
#include "lib/core/proto.h"
#include "lib/store/store.h"
#include "transport/transport.h"

#define FERRY_MAX_TABLES 256
#define FERRY_MAX_WORKERS 1024
#define FERRY_MAX_INFLIGHT 1024 /* tickets per worker */
#define FERRY_MAX_HOPS 32	/* forwards before an operation is given up */

/* what a one-sided operation's completion context starts with */
enum {
	FERRY_RDMA_CTX_READ = 1,
	FERRY_RDMA_CTX_WRITE
};
struct ferry_rdma_ctx {
	int kind;
};

/* ---- location hints: owner rank in one 64-bit word per key ------------- */

/* ---- keys on their way to this node (dir.c / reloc.c) ------------------- */

struct ferry_pend_item; /* a queued operation or hand-over request */

struct ferry_pend {
	uint64_t key;
	uint32_t slot;			     /* the slot reserved for the value */
	uint32_t landing;		     /* landing entry reserved, or FERRY_LANDING_NONE */
	struct ferry_pend *next;	     /* hash chain */
	struct ferry_pend_item *head, *tail; /* arrived early, in order */
	struct ferry_pend_waiter *waiters;
};

struct ferry_pend_waiter {
	struct ferry_pend_waiter *next;
	uint32_t worker;
	uint64_t ticket;
	uint32_t idx;
};

/*
 * The landing inbox (reloc.c): entries a peer RDMA WRITEs a handed-over value
 * into, registered for remote writes only, so that the arena needs no remote
 * write access. The requester reserves an entry with the slot when it starts
 * a localize and frees it when the key is installed (or the home says it is
 * ours already). Free list and busy marks under table.pend_lock.
 */
struct ferry_inbox {
	uint8_t *base; /* NULL: no inbox, hand-overs to this node go by message */
	size_t bytes;
	uint32_t n;	 /* entries */
	uint32_t stride; /* bytes per entry, a multiple of 64 */
	struct ferry_tp_mr *mr;
	uint32_t *free; /* stack of free entries (pend_lock) */
	uint32_t nfree;
	uint8_t *busy;			      /* per entry: 1 while reserved (pend_lock) */
	atomic_uint_fast64_t onesided;	      /* values received through it */
	atomic_uint_fast64_t write_fallbacks; /* old owner: batches sent by message after a
					       * failed write */
	atomic_bool bad_index_logged;	      /* old owner: a landing index out of range */
};

struct ferry_dir {
	struct ferry_slot **own; /* key -> live slot here, or NULL (RCU) */
	uint64_t *loc;		 /* key -> owner hint (atomic) */
	uint32_t *owner;	 /* key -> owner, meaningful at the key's home */
};

struct ferry_table {
	struct ferry *fy;
	uint32_t id;
	struct ferry_table_params params;
	uint32_t *value_lens; /* copy, or NULL */
	uint64_t *value_offs; /* prefix sums of value_lens, or NULL */
	uint32_t max_len;
	struct ferry_placement_map place;
	struct ferry_proto_limits lim;
	struct ferry_dir dir;
	struct ferry_arena arena;
	struct ferry_inbox inbox;
	struct ferry_msg_arena *peer_arena; /* one-sided transports: every rank's arena
					     * and landing inbox */
	bool onesided;			    /* one-sided access on: set (release) once peer_arena is
			* known, after the table is already served; read it with
			* ferry__table_onesided() */

	pthread_mutex_t pend_lock;
	struct ferry_pend **pend; /* hash buckets */
	uint32_t pend_buckets;
	uint64_t npend;

	/* table create handshake (rank 0 collects; everyone waits for the ack) */
	struct ferry_msg_table wire;
};

struct ferry_req {
	uint64_t ticket; /* (generation << 32) | index; 0 when free */
	uint8_t op;	 /* enum ferry_op, or FERRY_REQ_LOCALIZE */
	bool held;	 /* waiting for an earlier operation on one of its keys */
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
};

struct ferry {
	uint32_t rank, world;
	int timeout_ms;
	int busy_poll;
	struct ferry_tp *tp;
	uint64_t cluster_id;
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

	/* barrier: rank 0 counts, everyone waits for the release */
	uint64_t barrier_gen;	   /* next generation this node enters */
	uint64_t barrier_released; /* highest released generation + 1 */
	uint64_t *barrier_arrived; /* rank 0: per rank, generations entered */
	/* table handshake at rank 0: the parameters each rank sent, per table id */
	struct ferry_msg_table *table_seen[FERRY_MAX_TABLES];
	uint32_t table_nseen[FERRY_MAX_TABLES];
	int table_verdict[FERRY_MAX_TABLES]; /* 1 + status once acked */
	struct ferry_msg_table table_ack[FERRY_MAX_TABLES];
	struct ferry_msg_arena *table_arenas[FERRY_MAX_TABLES]; /* from the ack */

	/* counters of the progress thread and of destroyed workers */
	atomic_uint_fast64_t served_ops, forwards, reloc_in, reloc_out;
	atomic_uint_fast64_t msgs_sent, msgs_recv, bytes_sent, bytes_recv;
	atomic_uint_fast64_t gone_local_ops, gone_remote_ops;
	atomic_uint_fast64_t onesided_reads, onesided_retries, onesided_fallbacks;
};

/* node.c */
int ferry__send(struct ferry *fy, uint32_t dst, const void *frame, size_t len);
void ferry__node_put(struct ferry *fy);
int ferry__node_poll(struct ferry *fy, unsigned flags);
int ferry__deadline_ms(int timeout_ms, struct timespec *ts);
int ferry__cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *ts);

/* ops.c: called by the progress thread */
void ferry__ops_on_op(struct ferry *fy, struct ferry_table *t, uint32_t src,
		      const struct ferry_proto_view *v);
void ferry__ops_on_reply(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v);
/* mark key idx of a ticket done with @status; progress thread */
void ferry__ops_complete(struct ferry *fy, uint32_t worker, uint64_t ticket, const uint32_t *idx,
			 uint32_t count, int status, const float *vals, size_t nvals);
/* send results of an operation to its origin (or complete it, if ours) */
void ferry__ops_send_reply(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			   int status, const uint32_t *idx, uint32_t count, const float *vals,
			   size_t nvals);
/* pass one key operation on toward its owner */
void ferry__ops_forward_one(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			    const struct ferry_msg_key *k, const float *in);
/* apply one key operation to a live slot here; 0 or -EAGAIN (not live) */
int ferry__ops_apply(struct ferry_table *t, uint8_t op, uint64_t key, const float *in, float *out);

/* a one-sided read finished (transport handler; any registered thread) */
void ferry__ops_on_rdma_done(struct ferry *fy, void *ctx, int status);
/* free a worker's landing areas (worker destroy) */
void ferry__ops_rd_fini(struct ferry_worker *w);

/* reloc.c */
int ferry__reloc_start(struct ferry_worker *w, struct ferry_table *t, struct ferry_req *r,
		       uint64_t ticket);
void ferry__reloc_on_localize(struct ferry *fy, struct ferry_table *t, uint32_t src,
			      const struct ferry_proto_view *v);
void ferry__reloc_on_handover_req(struct ferry *fy, struct ferry_table *t, uint32_t src,
				  const struct ferry_proto_view *v);
void ferry__reloc_on_handover(struct ferry *fy, struct ferry_table *t, uint32_t src,
			      const struct ferry_proto_view *v);
void ferry__reloc_on_ack(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v);
/* queue an arriving operation on a key on its way here; 1 if queued */
int ferry__reloc_queue_op(struct ferry_table *t, const struct ferry_msg_op *op,
			  const struct ferry_msg_key *k, const float *vals);
void ferry__reloc_table_fini(struct ferry_table *t);
/* create and register the table's landing inbox where the transport writes
 * one-sided (table build; none is not an error); 0 or -ENOMEM */
int ferry__reloc_inbox_init(struct ferry *fy, struct ferry_table *t);
void ferry__reloc_inbox_fini(struct ferry *fy, struct ferry_table *t);
/* tests: entries and free entries of the inbox; any thread */
void ferry__reloc_inbox_usage(struct ferry_table *t, uint32_t *entries_p, uint32_t *nfree_p);
/* a hand-over write finished (on_rdma_done with a FERRY_RDMA_CTX_WRITE) */
void ferry__reloc_on_write_done(struct ferry *fy, void *ctx, int status);

/* table.c */
void ferry__table_on_msg(struct ferry *fy, uint32_t src, const struct ferry_proto_view *v);

/* small helpers */
static inline bool ferry__table_onesided(const struct ferry_table *t)
{
	return __atomic_load_n(&t->onesided, __ATOMIC_ACQUIRE);
}

static inline uint32_t ferry__value_len(const struct ferry_table *t, uint64_t key)
{
	return t->value_lens ? t->value_lens[key] : t->params.value_len;
}

static inline uint32_t ferry__home(const struct ferry_table *t, uint64_t key)
{
	return ferry__placement_home(&t->place, key);
}

/*
 * A location hint is one word: bits 0-15 the owner's rank, 16-31 the low
 * bits of its slot's epoch, 32-63 the slot index + 1 (0: slot unknown). It
 * is only a hint: a one-sided reader checks key, epoch and state in the slot.
 */
static inline uint32_t ferry__loc_get(const struct ferry_table *t, uint64_t key)
{
	return (uint32_t)(__atomic_load_n(&t->dir.loc[key], __ATOMIC_RELAXED) & 0xffff);
}

static inline void ferry__loc_set(struct ferry_table *t, uint64_t key, uint32_t rank)
{
	__atomic_store_n(&t->dir.loc[key], (uint64_t)rank, __ATOMIC_RELAXED);
}

static inline void ferry__loc_set_slot(struct ferry_table *t, uint64_t key, uint32_t rank,
				       uint32_t slot, uint32_t epoch)
{
	uint64_t w = (uint64_t)rank | (uint64_t)(epoch & 0xffff) << 16 | (uint64_t)(slot + 1) << 32;

	__atomic_store_n(&t->dir.loc[key], w, __ATOMIC_RELAXED);
}

/* 1 with rank, slot and epoch (low 16 bits) when the slot is known */
static inline int ferry__loc_slot(const struct ferry_table *t, uint64_t key, uint32_t *rank,
				  uint32_t *slot, uint32_t *epoch16)
{
	uint64_t w = __atomic_load_n(&t->dir.loc[key], __ATOMIC_RELAXED);

	*rank = (uint32_t)(w & 0xffff);
	*epoch16 = (uint32_t)(w >> 16) & 0xffff;
	*slot = (uint32_t)(w >> 32) - 1;
	return (w >> 32) != 0;
}

#endif /* FERRY_LIB_CORE_H */

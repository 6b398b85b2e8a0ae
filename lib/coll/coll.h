/* SPDX-License-Identifier: MIT */
/*
 * coll.h - collectives (lib/coll/): broadcast, reduce, all-reduce over every
 * node, on messages (docs/collectives.md has the algorithms and figures).
 *
 *   coll.c   public calls, numbering, the node's list of collectives under
 *            way, frames that came early, peer failures, waiting
 *     group.c  node groups: handles, ids, frames of groups not made yet
 *     rd.c ring.c tree.c   the algorithms: a plan per node, what to send
 *                          when a collective starts, what to do with each
 *                          frame (progress thread)
 *       base.c   segments to frames, the reduction kernels, completion
 *
 * Threads: the caller of a collective copies its input, sends the first
 * step's frames (no lock held: a send may wait for room) and hands the
 * collective to the progress thread, which runs every later step as frames
 * arrive: reduce, forward, complete. Everything of a collective after its
 * start is under colls->lock, which the progress thread takes per frame.
 *
 *   collective state (struct ferry_coll)   caller until RUNNING, then the
 *                                          progress thread, under colls->lock
 *   colls->active, ahead, next_seq, broken colls->lock
 *   coll->done                             set under the lock (release); read
 *                                          by the waiter without it first
 */
#ifndef FERRY_LIB_COLL_H
#define FERRY_LIB_COLL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/core/core.h"

/* collectives started and not yet collected, per node */
#define FERRY_COLL_MAX_ACTIVE 16
/*
 * A frame may belong to a collective this node has not started yet, but no
 * further ahead than this: a node completes no all-reduce or reduce before
 * every node started it, and a broadcast's root waits for every node's
 * acknowledgement, so a live peer is never more than FERRY_COLL_MAX_ACTIVE +
 * 2 collectives ahead. A frame beyond the window is a protocol error.
 */
#define FERRY_COLL_WINDOW (4 * FERRY_COLL_MAX_ACTIVE)
/* largest segment: one frame's data (a whole step is several frames) */
#define FERRY_COLL_SEG_BYTES (1u << 20)

/* the least bytes of a collective whose ring or chain puts by WRITE
 * (FERRY_COLL_ZCOPY_MIN overrides it; lib/coll/put.c) */
#define FERRY_COLL_ZCOPY_MIN_DEFAULT (64u << 10)

struct coll_put;

/*
 * WRITE with immediate (put.c, FERRY_TP_CAP_WRITE_IMM): a receiver that
 * offers memory also offers one of its node's FERRY_COLL_IMM_SLOTS slots
 * (COLL_KEYS' n is the slot + 1; 0: none), and a writer then sends each
 * segment as one write_imm whose tag's collective bits are
 *
 *    20        14 13         6 5      0
 *   +------------+------------+--------+
 *   | slot       | step       | segment|   segment: its number in the step
 *   +------------+------------+--------+
 *
 * The receiver takes it as it would the COLL_PUT of that segment.
 */
#define FERRY_COLL_IMM_SLOTS 128u
#define FERRY_COLL_IMM_SLOT_SHIFT 14
#define FERRY_COLL_IMM_STEP_SHIFT 6
#define FERRY_COLL_IMM_STEPS 256u /* steps a tag can name */
#define FERRY_COLL_IMM_SEGS 64u	  /* segments of one step a tag can name */

/*
 * A collective's puts (put.c): its segments to one member (the ring's right
 * neighbour, the chain's next node) go by one-sided WRITE into memory that
 * member offered in a COLL_KEYS frame, each announced by a COLL_PUT frame
 * once its WRITE completed; a segment whose WRITE failed goes by message.
 * Under colls->lock once the collective runs; before, its caller's.
 */
struct coll_zc {
	bool on;	   /* keys are exchanged for this collective */
	bool offer;	   /* this node offered its memory to @src */
	bool keys;	   /* @dst's keys came */
	bool finish_ok;	   /* complete once the queue below is empty */
	uint32_t src, dst; /* members; UINT32_MAX: none */
	struct ferry_tp_mr *mr_buf, *mr_land;
	void *land; /* the ring's landing buffer (count elements), owned */
	uint64_t pbuf, pbuf_rkey, pland, pland_rkey; /* @dst's */
	struct coll_put *head, *tail;		     /* segments to @dst in send order */
	unsigned inflight;			     /* WRITEs posted and not completed */
	/* WRITE with immediate: @slot ours + 1 (0: none; the world's glock),
	 * @pslot @dst's + 1 when this node writes to it so; @wseg: per step,
	 * the segments queued to @dst (2 n + 2 entries) */
	bool imm;
	uint32_t slot, pslot;
	uint32_t *wseg;
};

enum ferry_coll_state {
	FERRY_COLL_STARTING = 1, /* its caller sends the first step: frames wait */
	FERRY_COLL_RUNNING,	 /* the progress thread runs it */
	FERRY_COLL_DONE,
};

/* a frame kept until its collective (or, recursive doubling, its step) is
 * ready: a copy of the whole frame. Bound: see FERRY_COLL_WINDOW and each
 * algorithm's file. */
struct ferry_coll_early {
	struct ferry_coll_early *next;
	uint32_t src;
	uint32_t len;
	uint64_t frame[]; /* 8-aligned, as on_msg gave it */
};

struct ferry_coll {
	struct ferry *fy;
	struct ferry_colls *colls;
	struct ferry_coll *next;   /* colls->active */
	struct ferry_msg_coll sig; /* seq, count, kind, dtype, op, algo, root */
	uint32_t esz;
	const void *src;
	void *buf;     /* the working buffer: dst, or scratch (reduce, not root) */
	void *scratch; /* owned */
	enum ferry_coll_state state;
	atomic_bool done;
	int status;
	struct ferry_coll_early *early, *early_tail; /* in arrival order */
	bool replay; /* RUNNING, its KICK not handled yet: new frames queue behind
		      * the kept ones, so a sender's segments stay in order */

	/* algorithm state (rd.c, ring.c, tree.c); progress thread, under the lock */
	uint32_t cur;	    /* recursive doubling: the step under way */
	uint64_t remaining; /* elements still to receive (doubling: in step cur) */
	uint64_t *next_off; /* per step: the next segment expected (world x 2 + 2) */
	uint32_t acks;	    /* broadcast root: nodes that have the data */
	uint8_t *acked;	    /* broadcast root: per rank */
	struct coll_zc zc;  /* puts by WRITE (put.c) */
};

/*
 * A group of nodes that run collectives together: the whole cluster (the
 * node's fy->coll, id 0) or a group made by ferry_group_create(). Every
 * algorithm works on indices within the group, 0 .. n - 1; frames go to
 * and come from ranks, mapped at the edges (base.c sends, coll.c receives).
 * Memory: 8 bytes per rank of the world for the two maps, per group.
 */
struct ferry_colls {
	struct ferry *fy;
	uint64_t id;		  /* 0: the whole cluster */
	uint32_t n, me;		  /* members, and this node's index among them */
	uint32_t *ranks;	  /* index -> rank; NULL: the identity */
	int32_t *index;		  /* rank -> index, -1 for a non-member; NULL: identity */
	struct ferry_colls *next; /* the node's groups (the world's glock) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t next_seq;
	struct ferry_coll *active; /* started and not done: at most FERRY_COLL_MAX_ACTIVE */
	unsigned nstarted;	   /* started and not collected */
	/* frames of collectives this node has not started (FERRY_COLL_WINDOW) */
	struct ferry_coll_early *ahead, *ahead_tail;
	int broken; /* 0, or the status every later collective fails with */
	uint32_t broken_rank;
	enum ferry_coll_algo algo; /* forced, or AUTO */
	size_t crossover;	   /* bytes */
	/* a waiter polls the transport (FERRY_TP_CAP_POLL_MSG, FERRY_COLL_POLL
	 * not 0): it takes its frames itself, the progress thread stands aside */
	bool poll;
	/* a waiter that found nothing to read yields the CPU at once, not
	 * after 20 us of spinning: this host runs more ranks than it has CPUs
	 * (FERRY_COLL_YIELD, ferry__coll_yield_decide) */
	bool yield_now;
	atomic_ullong polled;	 /* frames of @cs handled by a thread waiting on it */
	atomic_ullong puts;	 /* segments this node put by WRITE (COLL_PUT sent) */
	atomic_ullong put_fails; /* ... whose WRITE failed: sent by message instead */
	atomic_ullong puts_imm;	 /* segments this node sent by WRITE with immediate */
	atomic_bool imm;	 /* FERRY_COLL_IMM not 0: WRITE with immediate where it can (the
			  * whole cluster's counts, for every group) */
	bool zcopy;		 /* FERRY_COLL_ZCOPY not 0: offer memory and write */
	size_t zcopy_min;	 /* bytes: below, no keys are exchanged */

	/* the whole cluster's only: the node's groups, and frames of groups not
	 * made here yet (at most FERRY_COLL_WINDOW collectives into each of at
	 * most FERRY_COLL_ORPHAN_GROUPS groups); glock before any lock */
	pthread_mutex_t glock;
	struct ferry_colls *groups;
	struct ferry_coll_early *orphans, *orphans_tail;
	/* the collectives that offered a WRITE-with-immediate slot (put.c);
	 * glock. A slot freed by a collective that ended on a broken group is
	 * retired until reused: late writes into it are ignored, not errors */
	struct ferry_coll *imm_slots[FERRY_COLL_IMM_SLOTS];
	bool imm_retired[FERRY_COLL_IMM_SLOTS];
	uint32_t imm_next; /* where the next slot search starts */
};

/* groups not made here yet whose frames a node keeps */
#define FERRY_COLL_ORPHAN_GROUPS 16

/* the rank of @idx in @cs */
static inline uint32_t ferry__coll_rank(const struct ferry_colls *cs, uint32_t idx)
{
	return cs->ranks ? cs->ranks[idx] : idx;
}

/* a node's handle to a group (group.c): its collectives' state */
struct ferry_group {
	struct ferry_colls cs;
};

static inline struct ferry_group *ferry__coll_to_group(struct ferry_colls *cs)
{
	return (struct ferry_group *)(void *)((char *)cs - offsetof(struct ferry_group, cs));
}

/* the body of a kept frame */
static inline const struct ferry_msg_coll *ferry__coll_frame_body(const struct ferry_coll_early *e)
{
	return (const void *)((const uint8_t *)e->frame + sizeof(struct ferry_msg_hdr));
}

/* ---- base.c ---------------------------------------------------------- */

/* do waiters poll the transport (struct ferry_colls, poll)? Reads
 * FERRY_COLL_POLL */
bool ferry__coll_poll_enabled(const struct ferry *fy);
/*
 * Does a waiter with nothing to read yield at once (struct ferry_colls,
 * yield_now)? @setting: FERRY_COLL_YIELD (NULL or "auto", "0", "1"; any
 * other value warns and counts as auto); @ompi: OMPI_MCA_mpi_oversubscribe,
 * which Open MPI's mpirun sets to 1 when a host runs more processes than it
 * has slots; @local: the ranks on this host (OMPI_COMM_WORLD_LOCAL_SIZE, else
 * torchrun's LOCAL_WORLD_SIZE), or NULL; @cpus: the host's online CPUs.
 * auto: yes when @ompi is "1" or @local exceeds @cpus. Pure (the unit test
 * calls it); ferry__coll_colls_init() passes the environment.
 */
bool ferry__coll_yield_decide(const char *setting, const char *ompi, const char *local, long cpus);
/* frames of the whole cluster's and every group's collectives that a thread
 * waiting on them handled itself (tests) */
unsigned long long ferry__coll_polled(const struct ferry *fy);
/* @cs of the whole cluster of @fy (a group sets its members after); fini
 * frees its kept frames and maps, not @cs */
void ferry__coll_colls_init(struct ferry_colls *cs, struct ferry *fy);
void ferry__coll_colls_fini(struct ferry_colls *cs);
/* free a list of kept frames */
void ferry__coll_early_free(struct ferry_coll_early *e);

/* send elements [off, off + n) of @c's working buffer to member @dst as step @step,
 * in segments of at most FERRY_COLL_SEG_BYTES. Any thread; 0 or a negative
 * errno */
int ferry__coll_send_msg(struct ferry_coll *c, uint32_t dst, uint32_t step, uint64_t off,
			 uint64_t n);
/* the same, by WRITE where the collective puts to @dst (put.c): the
 * caller's thread before the collective runs, else the lock held */
int ferry__coll_send(struct ferry_coll *c, uint32_t dst, uint32_t step, uint64_t off, uint64_t n);
/* a frame without data (ACK, KICK) of @c to member @dst */
int ferry__coll_send_ctl(struct ferry_coll *c, uint32_t dst, uint8_t type);
/* acc[i] = op(first, second) for i < n, first = in when @in_first, else acc:
 * a fixed operand order, so every node computes the same bits */
void ferry__coll_reduce(const struct ferry_coll *c, void *acc, const void *in, size_t n,
			bool in_first);
/* @c is over with @status: off the active list, waiter woken. Lock held. */
void ferry__coll_finish(struct ferry_coll *c, int status);
/* append a copy of a frame to the list @head..@tail (a collective's early
 * frames, or the node's frames of collectives not started); lock held;
 * 0 or -ENOMEM */
int ferry__coll_keep(struct ferry_coll_early **head, struct ferry_coll_early **tail, uint32_t src,
		     const void *frame, size_t len);
/* elements [lo, hi) of chunk @i of @count split @n ways */
static inline uint64_t ferry__coll_chunk_lo(uint64_t count, uint32_t n, uint32_t i)
{
	return (uint64_t)((unsigned __int128)count * i / n);
}

/*
 * The algorithms. start: the caller's thread, no lock, state STARTING: send
 * the first step. on_frame: the progress thread, lock held, a frame of @c
 * whose signature matched, from member @src (ranks, roots and peers are
 * indices in the group, c->colls): check the sender and segment for this step
 * (return a static reason on a protocol error, NULL otherwise), apply,
 * forward, finish @c when done. run: the progress thread, lock held, just
 * after @c went RUNNING and its early frames were replayed.
 */
struct ferry_coll_algo_ops {
	int (*start)(struct ferry_coll *c);
	const char *(*on_frame)(struct ferry_coll *c, uint32_t src, uint8_t type,
				const struct ferry_msg_coll *m, const void *data);
	void (*run)(struct ferry_coll *c);
	/* steps this node takes (next_off entries) */
	uint32_t (*nsteps)(const struct ferry_coll *c);
	/* the elements [*lo, *hi) this node receives at step @step (the
	 * algorithms that put: ring, chain); lock held */
	void (*recv_range)(const struct ferry_coll *c, uint32_t step, uint64_t *lo, uint64_t *hi);
};

extern const struct ferry_coll_algo_ops ferry__coll_rd;	   /* rd.c */
extern const struct ferry_coll_algo_ops ferry__coll_ring;  /* ring.c */
extern const struct ferry_coll_algo_ops ferry__coll_tree;  /* tree.c: binomial tree */
extern const struct ferry_coll_algo_ops ferry__coll_chain; /* tree.c: pipelined chain */

/* ---- put.c ----------------------------------------------------------- */

/* segments of the whole cluster's and every group's collectives this node
 * put by WRITE (tests, stats) */
unsigned long long ferry__coll_puts(const struct ferry *fy);
/* ... and those whose WRITE failed, sent by message instead */
unsigned long long ferry__coll_put_fails(const struct ferry *fy);
/* what FERRY_COLL_ZCOPY and FERRY_COLL_ZCOPY_MIN set, for the collectives
 * started after it (benchmarks: every node alike, between collectives) */
void ferry__coll_zcopy_set(struct ferry *fy, bool on, size_t min);
/* what FERRY_COLL_IMM sets (WRITE with immediate where the transport has
 * it), for the collectives whose keys come after it (benchmarks) */
void ferry__coll_imm_set(struct ferry *fy, bool on);
/*
 * the algorithm's start (caller's thread, no lock): this collective
 * receives from member @src and sends to member @dst (UINT32_MAX: none);
 * where the transport can WRITE and the collective is large enough,
 * register the buffers (@land: and a landing buffer for the reduce-scatter
 * steps) and send @src the keys. 0 or a negative errno (a send failed)
 */
int ferry__coll_zc_start(struct ferry_coll *c, uint32_t src, uint32_t dst, bool land);
/* COLL_KEYS @m (its keys at @data) from member @src (lock held); Return: a
 * protocol error */
const char *ferry__coll_zc_keys(struct ferry_coll *c, uint32_t src, const struct ferry_msg_coll *m,
				const void *data);
/* segments of the whole cluster's and every group's collectives this node
 * sent by WRITE with immediate (tests, stats) */
unsigned long long ferry__coll_puts_imm(const struct ferry *fy);
/*
 * COLL_PUT of step @step at [off, off + n) from @src (lock held): where its
 * elements are: *@in_place_p when in the working buffer already. Return:
 * NULL with *@why_p on a protocol error
 */
const void *ferry__coll_zc_landed(struct ferry_coll *c, uint32_t src,
				  const struct ferry_msg_coll *m, bool land, bool *in_place_p,
				  const char **why_p);
/* finish @c with success once its puts were announced (lock held) */
void ferry__coll_finish_ok(struct ferry_coll *c);
/* coll_free: wait (bounded) for the WRITEs in flight, deregister, free.
 * Return: false when WRITEs are still in flight (the memory must leak) */
bool ferry__coll_zc_fini(struct ferry_coll *c);

/* ---- group.c --------------------------------------------------------- */

/* the id of the group of member list @ranks: every member computes the same
 * one, and its frames carry it; never 0 (the whole cluster) */
uint64_t ferry__coll_group_id(const uint32_t *ranks, size_t n);
/* keep a frame of a group not made here (progress thread, world->glock
 * held); Return: NULL, or a protocol error of its sender */
const char *ferry__coll_orphan(struct ferry_colls *world, uint32_t src,
			       const struct ferry_proto_view *v);
/* the node's groups and kept frames of groups, at close */
void ferry__coll_groups_free(struct ferry_colls *world);

/* coll.c: register the frame handlers and the failure listener (ferry_open) */
int ferry__coll_attach(struct ferry *fy);

#endif /* FERRY_LIB_COLL_H */

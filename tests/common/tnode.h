/* SPDX-License-Identifier: MIT */
/*
 * tnode.h - a transport instance with a test's core (struct tnode): the
 * handlers record what they see (frames checked for length, content and
 * order; failures; the progress thread's identity) under the node's mutex,
 * and the test thread waits on the node's condvar with a deadline. Handlers
 * never assert: they count, and the test asserts on the counts.
 *
 * Shared by the transport suite (tests/transport/test_transport.c, every
 * node a thread of one process, Criterion) and ferry-tp-check
 * (tests/rank/tp_check.c, one node per process, a rank in its own network
 * namespace in ci/netns-test.sh): nothing here depends on Criterion.
 *
 * Test frames: a struct ferry_msg_hdr whose table field carries
 * (sender thread << 24 | sequence number), then a byte pattern derived from
 * (src, table, offset), so that a lost, reordered, shifted or torn frame is
 * seen. Type FERRY_MSG_OP marks data frames, FERRY_MSG_REPLY the acks that a
 * node with echo set sends back from its progress thread, FERRY_MSG_BARRIER
 * the marks of tn_sync() (a barrier through the transport itself).
 */
#ifndef FERRY_TEST_TNODE_H
#define FERRY_TEST_TNODE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "transport/transport.h"

#define TN_MAX_NODES 8
#define TN_MAX_SENDERS 8
#define TN_WAIT_MS 30000 /* bound on any wait for frames (sanitizers are slow) */
#define TN_HDR_LEN sizeof(struct ferry_msg_hdr)
#define TN_IMM_LOG 2048 /* on_write_imm calls a tnode remembers in order */

struct tnode {
	const struct ferry_tp_ops *ops;
	struct ferry_tp *tp;
	uint32_t rank, world;
	char addr[FERRY_TP_ADDR_MAX];
	size_t addr_len;

	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t cond;  /* broadcast on every change */
	int starts, stops;
	pthread_t progress;
	int wrong_thread; /* handler calls off the progress thread */
	int after_fini;	  /* handler calls after fini() returned */
	int fini_done;

	uint64_t frames[TN_MAX_NODES]; /* data frames from each src */
	uint64_t bytes[TN_MAX_NODES];
	uint64_t acks[TN_MAX_NODES];
	uint32_t marks[TN_MAX_NODES];	       /* tn_sync() marks from each src */
	uint64_t frames_at_mark[TN_MAX_NODES]; /* frames[src] when its last mark came */
	uint32_t next_seq[TN_MAX_NODES][TN_MAX_SENDERS];
	int bad_len, bad_content, bad_order, misaligned, ack_errs;
	char first_bad[160];

	int failed[TN_MAX_NODES]; /* on_peer_failed() calls per rank */
	int failed_err[TN_MAX_NODES];
	int64_t failed_ms[TN_MAX_NODES]; /* tn_now_ms() of the first */

	int echo;	 /* ack every data frame back to its src */
	int gate_closed; /* on_msg waits while set (bounded) */
	int gated;	 /* on_msg is waiting at the gate */

	uint64_t rdma_done; /* on_rdma_done() calls */
	int rdma_errs;	    /* ... with a non-zero status */
	int rdma_first_err;
	int rdma_off_thread; /* ... off the progress thread, outside poll() */
	int rdma_polled;     /* ... inside poll(), on the thread that called it */
	int msgs_polled;     /* on_msg/on_peer_failed inside poll() (tcp's worker poll) */

	/* on_write_imm(): calls, and the first TN_IMM_LOG of them in order: the
	 * source, the tag and how many data frames from that source had come
	 * before (its place among the frames) */
	uint64_t imms;
	uint32_t imm_n;
	struct tn_imm {
		uint32_t src, tag;
		uint64_t frames_before;
	} imm_log[TN_IMM_LOG];
	/* when set, on_write_imm checks that imm_base + tag * imm_stride holds
	 * imm_stride bytes of tn_pattern(src, tag, i): placed before the notice */
	const uint8_t *imm_base;
	size_t imm_stride;
	int imm_bad; /* ... it did not */

	/* when set, every data frame checks that watch holds watch_len bytes of watch_want */
	const uint8_t *watch;
	const uint8_t *watch_want;
	size_t watch_len;
	int watch_good, watch_bad;
};

/* what the ctx of a one-sided operation points to; filled by on_rdma_done */
struct rdma_slot {
	int done; /* on_rdma_done() calls for it: exactly 1 */
	int status;
	/* when set, on_rdma_done copies *seen_ptr (another node's imms) into
	 * seen: what the receiver of a write_imm had taken at its completion */
	const uint64_t *seen_ptr;
	uint64_t seen;
};

/* the handlers of every tnode (core = the struct tnode) */
extern const struct ferry_tp_handler tn_handler;
/* set by a thread while it is inside ops->poll(), where a read's completion may run */
extern __thread int tn_in_poll;

int64_t tn_now_ms(void);
/* a CLOCK_MONOTONIC deadline @ms from now (the clock of every tnode's cond) */
struct timespec tn_deadline_in(int ms);

/* the byte at offset @i of a test frame from @src with table field @table */
static inline uint8_t tn_pattern(uint32_t src, uint32_t table, size_t i)
{
	return (uint8_t)((i * 31u) ^ (i >> 7) ^ (table * 131u) ^ (src * 17u) ^ 0x5a);
}

/* a header of @type and @len bytes, then the pattern */
void tn_frame_fill(uint8_t *buf, uint8_t type, uint32_t len, uint32_t src, uint32_t table);

/*
 * tn_start - init @n and its transport @ops with @cfg (handler and core are
 * filled in here), then read its address blob into n->addr
 * Context: the test's thread. Return: 0, or what ops->init or addr_get
 * returned (n->tp is then NULL).
 */
int tn_start(struct tnode *n, const struct ferry_tp_ops *ops, const struct ferry_tp_config *cfg);
/* ops->fini, then free; no handler runs after it (fini_done set). Idempotent. */
void tn_fini(struct tnode *n);

/*
 * tn_send_frame - one data frame of @len bytes (a multiple of 8, >= 16) to
 * @dst, gathered from three pieces; @seq numbers it for (@sender, @dst)
 * Context: any thread. Return: what ops->send returned, or -ENOMEM.
 */
int tn_send_frame(struct tnode *n, uint32_t dst, uint32_t sender, uint32_t seq, uint32_t len);

/* 0 when @n saw no defect, else -1 and @why lists each kind with its count */
int tn_clean(struct tnode *n, char *why, size_t len);

/*
 * tn_sync - a barrier of the ranks in @live (bit r: rank r) through the
 * transport: a mark to each, then wait for theirs (n->marks counts them;
 * @round is the mark each must have reached, from 1). Frames from one rank
 * arrive in order, so once its mark is here everything it sent before is
 * too (n->frames_at_mark[r] counts it). Return: 0, -ETIMEDOUT after @ms, or a
 * send's error.
 */
int tn_sync(struct tnode *n, uint32_t live, uint32_t round, int ms);

/*
 * The cases' traffic, shared by the suite and ferry-tp-check:
 *
 * tn_size_classes[]: one frame of each size from the smallest frame to 8 MiB
 *   across the transports' thresholds (a header alone, eager sizes, a page,
 *   a page and a bit, 64 KiB, 1 MiB, several MiB).
 * tn_sender_main(): a thread sending @count frames of varied sizes (16 B to
 *   128 KiB), numbered per (sender, dst), to every rank in turn.
 * tn_flood_main(): a thread sending @count frames of @len bytes to @dst,
 *   numbered from 0 as @sender.
 */
extern const uint32_t tn_size_classes[];
extern const size_t tn_nsize_classes;

struct tn_sender {
	struct tnode *n;
	uint32_t sender;
	uint32_t count;
	pthread_barrier_t *go; /* all start together; NULL: at once */
	int errors;	       /* sends that failed */
	int first_err;
	pthread_t thread;
};

void *tn_sender_main(void *arg);

struct tn_flood {
	struct tnode *n;
	uint32_t dst, count, len;
	uint32_t sender; /* numbers its frames as this sender, from 0 */
	int errors;
	pthread_t thread;
};

void *tn_flood_main(void *arg);

/* evaluate @pred under @nd's lock until it holds or @ms pass; the result */
#define WAIT_FOR(nd, pred, ms)                                                              \
	({                                                                                  \
		struct timespec dl_ = tn_deadline_in(ms);                                   \
		bool ok_;                                                                   \
		pthread_mutex_lock(&(nd)->lock);                                            \
		while (!(ok_ = (pred)) &&                                                   \
		       pthread_cond_timedwait(&(nd)->cond, &(nd)->lock, &dl_) != ETIMEDOUT) \
			;                                                                   \
		ok_ = (pred);                                                               \
		pthread_mutex_unlock(&(nd)->lock);                                          \
		ok_;                                                                        \
	})

/* read a field of @n under its lock */
#define LOCKED(n, expr)                           \
	({                                        \
		pthread_mutex_lock(&(n)->lock);   \
		__typeof__(expr) v_ = (expr);     \
		pthread_mutex_unlock(&(n)->lock); \
		v_;                               \
	})

#endif

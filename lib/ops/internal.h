/* SPDX-License-Identifier: MIT */
/*
 * internal.h - what the files of lib/ops/ share, and nobody else. The files
 * call each other in one direction only:
 *
 *   request.c --> worker.c --> onesided.c --> serve.c
 *        \___________________________^___________^
 *
 * serve.c    applies operations, completes requests, builds and sends OP,
 *            REPLY and forwarded frames (progress thread and workers)
 * onesided.c one-sided pulls: landing areas, posting, checking the image
 * worker.c   workers, their in-flight key set and request slots
 * request.c  the public calls: fast path, requests, holding, waiting
 */
#ifndef FERRY_LIB_OPS_INTERNAL_H
#define FERRY_LIB_OPS_INTERNAL_H

#include <time.h>

#include "lib/ops/ops.h"

/* counters: written by the worker's thread only, read by ferry_stats() */
static inline void ferry__ops_count(uint64_t *c, uint64_t n)
{
	__atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
}

static inline int64_t ferry__ops_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline const char *ferry__ops_name(uint8_t op)
{
	switch (op) {
	case FERRY_OP_PULL:
		return "pull";
	case FERRY_OP_PUSH:
		return "push";
	case FERRY_OP_SET:
		return "set";
	default:
		return "localize";
	}
}

static inline struct ferry_req *ferry__ops_req_find(struct ferry_worker *w, uint64_t ticket)
{
	uint32_t idx = (uint32_t)ticket;

	/* 0 is what a free slot holds (and a zeroed ticket variable): never ours */
	if (!ticket || idx >= FERRY_MAX_INFLIGHT || w->reqs[idx].ticket != ticket)
		return NULL;
	return &w->reqs[idx];
}

/* ---- serve.c ---- */

struct ops_dest {
	struct ferry_frame f;
	uint32_t count;
	uint32_t dst;
};

/*
 * An OP frame is keys first, then values; for a frame we build key by key we
 * keep values in a second buffer and splice them at the end.
 */
struct ops_out {
	struct ops_dest d;
	struct ferry_msg_op tmpl; /* the frame's operation, for error replies */
	struct ferry_frame vals;
	int used;
};

/* add a key to the OP frame for @dst; a full frame is sent first, so an
 * operation of any size leaves in frames within FERRY_MSG_MAX */
void ferry__ops_out_add(struct ferry *fy, struct ferry_table *t, struct ops_out *o,
			const struct ferry_msg_op *tmpl, uint32_t dst,
			const struct ferry_msg_key *k, const float *in);
void ferry__ops_out_flush(struct ferry *fy, struct ferry_table *t, struct ops_out *o);
/* @hint: (slot << 32 | epoch) of the slot applied, for one-sided origins */
int ferry__ops_apply_slot(struct ferry_table *t, uint8_t op, uint64_t key, const float *in,
			  float *out, uint64_t *hint);

/* ---- onesided.c ---- */

/*
 * A pull of a key whose owner and slot the hint names is one READ of the
 * whole slot into a landing area of the worker's. The image is accepted when
 * its seal matches (in whatever order its bytes came) and key, epoch and
 * state match; a torn image (a write overlapped) is read again, a few times;
 * a slot that moved or was reused sends the pull by message, through the
 * home.
 */
#define OPS_RD_POOL 64
#define OPS_RD_TRIES 16
#define OPS_RD_BATCH 16 /* pulls of more keys go by message */

struct ferry_rd {
	struct ferry_rdma_ctx ctx; /* FERRY_RDMA_CTX_READ */
	struct ferry_rd_pool *pool;
	uint64_t ticket;
	uint64_t key;
	uint64_t rkey; /* of the owner's chunk that holds the slot */
	uint32_t idx, owner, slot, epoch16, tries;
	uint8_t *buf;
};

struct ferry_rd_pool {
	struct ferry *fy;
	uint32_t worker; /* the worker's index; never a pointer: see orphan */
	bool orphan;	 /* the worker is gone; the last completion frees the pool (set
			  * under lock, read atomically) */
	struct ferry_table *t;
	struct ferry_tp_mr *mr;
	uint8_t *mem;
	size_t stride;
	pthread_mutex_t lock; /* free list: worker takes, completions give back */
	uint32_t nfree;
	uint32_t inflight;
	uint32_t free[OPS_RD_POOL];
	struct ferry_rd rd[OPS_RD_POOL];
};

/* a landing area for key @i of @r when its slot is known; posted later */
struct ferry_rd *ferry__ops_rd_prepare(struct ferry_worker *w, struct ferry_req *r, uint64_t ticket,
				       size_t i);
/* post a request's reads, one doorbell per owner where the transport can */
void ferry__ops_rd_post_all(struct ferry *fy, struct ferry_rd **reads, size_t n);
/* free a worker's landing areas (worker destroy) */
void ferry__ops_rd_fini(struct ferry_worker *w);

/* ---- worker.c ---- */

int ferry__ops_inflight_has(const struct ferry_worker *w, uint64_t key);
int ferry__ops_inflight_add(struct ferry_worker *w, uint64_t key);
void ferry__ops_inflight_del(struct ferry_worker *w, uint64_t key);
/* forget the in-flight marks of a request's remote keys */
void ferry__ops_untrack(struct ferry_worker *w, struct ferry_req *r);
/* give a request slot back; the worker's thread */
void ferry__ops_req_free(struct ferry_worker *w, struct ferry_req *r);

/* chunks.c: peers' chunk rkeys, this node's announcements */
/* 1 with *@rkey when @rank's chunk holding @slot is known here; any thread */
int ferry__ops_peer_rkey(const struct ferry_table *t, uint32_t rank, uint32_t slot, uint64_t *rkey);
/* send CHUNK for every chunk made usable since the last call; the progress
 * thread, before a reply that names a slot */
void ferry__ops_chunks_announce(struct ferry *fy, struct ferry_table *t);
int ferry__ops_chunks_attach(struct ferry *fy);

#endif /* FERRY_LIB_OPS_INTERNAL_H */

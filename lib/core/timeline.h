/* SPDX-License-Identifier: MIT */
/*
 * timeline.h - where the time of one relocation or one push goes (issue 20):
 * each node stamps the steps of an operation it passes, keyed by the
 * operation's key, and ferry-bench --timeline turns the stamps into per-step
 * medians (bench/bench/timeline.c, docs/benchmarks.md "Where the time goes").
 *
 *   requester B           home H               old owner C
 *   LOC_POST ----------> LOC_HOME_RECV
 *                        LOC_HOME_FWD -------> LOC_OWNER_RECV
 *                                              LOC_WRITE_POST  (one-sided)
 *                                              LOC_WRITE_DONE
 *   LOC_NOTICE_RECV <--------------------------- LOC_NOTICE_SENT
 *   LOC_WAKE (installed; the worker is woken next), then the worker returns
 *
 *   worker W              owner O
 *   PUSH_POST ---------> OP_RECV, OP_APPLIED
 *   REPLY_RECV <-------- REPLY_SENT
 *
 * The clock is CLOCK_MONOTONIC_RAW (vDSO, tens of ns; no NTP slew), not the
 * TSC: transport/base/clock.h has no TSC reader, and under QEMU's TCG (the
 * SoftRoCE guest) the TSC is emulated and not known to be stable or
 * constant. A "posted" stamp is taken just before the frame goes to the
 * transport (the receiver may run before the sender returns); a "received"
 * one when the dispatcher hands the frame to its handler. Stamps of one node are compared only with stamps of that node;
 * a step that spans nodes is a round trip minus the remote node's own steps.
 *
 * Cost when off: one load of fy->tl and a predicted branch per stamp site.
 * Memory when on: the capacity given to ferry__tl_enable (events of 24
 * bytes), fixed; stamps past it are counted as dropped, never stored.
 */
#ifndef FERRY_CORE_TIMELINE_H
#define FERRY_CORE_TIMELINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "lib/core/core.h"

enum ferry_tl_step {
	/* localize */
	FERRY_TL_LOC_CALL = 1,	  /* the worker calls ferry_localize (bench) */
	FERRY_TL_LOC_POST,	  /* requester: LOCALIZE handed to the transport */
	FERRY_TL_LOC_HOME_RECV,	  /* home: LOCALIZE dispatched */
	FERRY_TL_LOC_HOME_FWD,	  /* home: HANDOVER_REQ handed to the transport */
	FERRY_TL_LOC_OWNER_RECV,  /* old owner: HANDOVER_REQ dispatched */
	FERRY_TL_LOC_WRITE_POST,  /* old owner: the value's RDMA WRITE posted */
	FERRY_TL_LOC_WRITE_DONE,  /* old owner: its completion seen */
	FERRY_TL_LOC_NOTICE_SENT, /* old owner: HANDOVER(_DONE) handed to the transport */
	FERRY_TL_LOC_NOTICE_RECV, /* requester: HANDOVER(_DONE) dispatched */
	FERRY_TL_LOC_WAKE,   /* requester: value installed, key published; the worker woken next */
	FERRY_TL_LOC_RETURN, /* the worker's ferry_localize returned (bench) */
	/* push (any update by message: push, set) */
	FERRY_TL_PUSH_CALL,   /* the worker calls ferry_push (bench) */
	FERRY_TL_PUSH_POST,   /* worker: OP frame handed to the transport */
	FERRY_TL_OP_RECV,     /* owner: OP dispatched */
	FERRY_TL_OP_APPLIED,  /* owner: the update applied */
	FERRY_TL_REPLY_SENT,  /* owner: REPLY handed to the transport */
	FERRY_TL_REPLY_RECV,  /* worker's node: REPLY dispatched, worker signalled */
	FERRY_TL_PUSH_RETURN, /* the worker's ferry_push returned (bench) */
	FERRY_TL_NSTEPS
};

struct ferry_tl_ev {
	uint64_t key;
	int64_t ns; /* CLOCK_MONOTONIC_RAW */
	uint32_t step;
	uint32_t pad;
};

/* Written by any thread of the node (atomic index), read after the run. */
struct ferry_tl {
	atomic_uint_fast64_t n; /* stamps taken, including dropped ones */
	uint64_t cap;
	struct ferry_tl_ev ev[];
};

static inline int64_t ferry__tl_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct ferry_proto_view;
/* @step 0 stamps nothing */
void ferry__tl_put(struct ferry_tl *tl, enum ferry_tl_step step, uint64_t key);
void ferry__tl_put_keys(struct ferry_tl *tl, enum ferry_tl_step step, const uint64_t *key0,
			size_t stride, size_t n);
void ferry__tl_put_frame(struct ferry_tl *tl, const struct ferry_proto_view *v);
/* the step of a frame of @type being sent (0: none) */
enum ferry_tl_step ferry__tl_send_step(uint8_t type);

/* whether @fy stamps (for loops over many keys) */
static inline struct ferry_tl *ferry__tl_of(const struct ferry *fy)
{
	return __builtin_expect(atomic_load_explicit(&fy->tl, memory_order_acquire) != NULL, 0) ?
		       atomic_load_explicit(&fy->tl, memory_order_relaxed) :
		       NULL;
}

/* stamp @step of the operation on @key; any thread; no-op when off */
static inline void ferry__tl_stamp(const struct ferry *fy, enum ferry_tl_step step, uint64_t key)
{
	struct ferry_tl *tl = ferry__tl_of(fy);

	if (tl)
		ferry__tl_put(tl, step, key);
}

/*
 * stamp @step for @n keys, the first at @key0 and each @stride bytes after
 * the last (the key field of an array of structs); no-op when off
 */
static inline void ferry__tl_stamp_keys(const struct ferry *fy, enum ferry_tl_step step,
					const uint64_t *key0, size_t stride, size_t n)
{
	struct ferry_tl *tl = ferry__tl_of(fy);

	if (tl)
		ferry__tl_put_keys(tl, step, key0, stride, n);
}

/*
 * dispatch.c's, for a frame about to go to its handler: the receive steps
 * (LOCALIZE at the home, HANDOVER_REQ at the old owner, HANDOVER(_DONE) at
 * the requester, OP at the owner), one stamp per key
 */
static inline void ferry__tl_frame(const struct ferry *fy, const struct ferry_proto_view *v)
{
	struct ferry_tl *tl = ferry__tl_of(fy);

	if (tl)
		ferry__tl_put_frame(tl, v);
}

/*
 * ferry__tl_enable - start stamping on this node, into @cap events
 * Context: any thread, once per node (a second call returns -EALREADY); the
 * buffer lives until the node is closed. Return: 0 or a negative errno.
 */
int ferry__tl_enable(struct ferry *fy, uint64_t cap);
/* forget the stamps so far; call only while no operation runs on the node */
void ferry__tl_reset(struct ferry *fy);
/*
 * ferry__tl_events - the stamps so far (not a copy: read them only while no
 * operation runs); *dropped_p: stamps that found the buffer full.
 * Return: the number of events (0 when off)
 */
size_t ferry__tl_events(struct ferry *fy, const struct ferry_tl_ev **ev_p, uint64_t *dropped_p);
/* node_free's: frees the buffer */
void ferry__tl_free(struct ferry *fy);

#endif /* FERRY_CORE_TIMELINE_H */

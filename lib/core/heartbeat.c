/* SPDX-License-Identifier: MIT */
/*
 * heartbeat.c - the failure detector: a node that hears nothing from a peer
 * for the heartbeat timeout declares it failed.
 *
 *   heartbeat thread (every timeout / 4)       progress thread
 *   ------------------------------------       ---------------
 *   HEARTBEAT -> self ----------------------->  tick: for each live peer,
 *   HEARTBEAT -> every live peer                  heard since the last tick?
 *                                                 else silent > timeout:
 *   any frame from a peer (dispatch.c) ------>    ferry__node_peer_failed()
 *   sets heard[peer]
 *
 * Transport events (a reset connection, a refused listener, BYE) fail a peer
 * within milliseconds; this covers the peer that is there but does nothing:
 * stopped (SIGSTOP), hung, or cut off without a reset. Any frame counts as a
 * sign of life, so a peer busy sending large frames is not failed for a
 * heartbeat queued behind them.
 *
 * The check runs on the progress thread, where every other failure is
 * declared (listeners expect it there): the tick is a HEARTBEAT frame the
 * node sends itself. A node that was itself stopped or starved (its last tick
 * is more than half a timeout old) gives every peer a fresh start instead of
 * failing all of them on waking up.
 *
 * Memory: two words and a byte per rank. Heartbeats are not counted in
 * ferry_stats' message counters (they go to the transport directly).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/core.h"

struct ferry_hb {
	struct ferry *fy;
	int timeout_ms;
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;    /* lock */
	uint64_t seq; /* the thread's */
	/* the progress thread's */
	int64_t last_tick_ns;
	int64_t *last_ns; /* per rank: when it was last heard of */
};

static int64_t hb_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* the tick, on the progress thread (the node's own HEARTBEAT) */
static void hb_check(struct ferry *fy, struct ferry_hb *hb)
{
	const int64_t now = hb_now_ns(), timeout = (int64_t)hb->timeout_ms * 1000000;
	const bool stalled = hb->last_tick_ns && now - hb->last_tick_ns > timeout / 2;

	hb->last_tick_ns = now;
	for (uint32_t r = 0; r < fy->world; r++) {
		if (r == fy->rank || atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			continue;
		if (atomic_exchange_explicit(&fy->heard[r], 0, memory_order_relaxed) || stalled ||
		    !hb->last_ns[r]) {
			hb->last_ns[r] = now;
			continue;
		}
		if (now - hb->last_ns[r] > timeout) {
			ferry_err(
				"heartbeat: nothing arrived from rank %u for %lld ms (the timeout "
				"is %d ms: FERRY_HEARTBEAT_MS or params.heartbeat_ms); declaring "
				"it failed (stopped, hung or cut off)",
				r, (long long)((now - hb->last_ns[r]) / 1000000), hb->timeout_ms);
			ferry__node_peer_failed(fy, r);
		}
	}
}

static void hb_on_beat(struct ferry *fy, struct ferry_table *t, uint32_t src,
		       const struct ferry_proto_view *v)
{
	struct ferry_hb *hb = __atomic_load_n((struct ferry_hb **)&fy->hb, __ATOMIC_ACQUIRE);

	/* a peer's beat did its work in the dispatcher (heard[src]) */
	if (src == fy->rank && hb)
		hb_check(fy, hb);
}

static void *hb_thread(void *arg)
{
	struct ferry_hb *hb = arg;
	struct ferry *fy = hb->fy;
	const int period = hb->timeout_ms / 4;
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_heartbeat b;
	} f;
	struct iovec iov = { .iov_base = &f, .iov_len = sizeof(f) };

	pthread_mutex_lock(&hb->lock);
	while (!hb->stop) {
		struct timespec ts;

		ferry__deadline_ms(period, &ts);
		ferry__cond_wait_until(&hb->cond, &hb->lock, &ts);
		if (hb->stop)
			break;
		pthread_mutex_unlock(&hb->lock);
		memset(&f, 0, sizeof(f));
		ferry__proto_hdr_init(&f.h, FERRY_MSG_HEARTBEAT, sizeof(f), fy->rank, 0);
		f.b.seq = ++hb->seq;
		/* self first: a send that waits for room at a stuck peer must not
		 * delay the tick that will fail it */
		for (uint32_t i = 0; i < fy->world; i++) {
			uint32_t r = (fy->rank + i) % fy->world;

			if (atomic_load_explicit(&fy->closed, memory_order_acquire))
				break;
			if (i && atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
				continue;
			(void)fy->tp->ops->send(fy->tp, r, &iov, 1);
		}
		pthread_mutex_lock(&hb->lock);
	}
	pthread_mutex_unlock(&hb->lock);
	return NULL;
}

static void hb_free(void *arg)
{
	struct ferry_hb *hb = arg;

	if (!hb)
		return;
	pthread_mutex_destroy(&hb->lock);
	pthread_cond_destroy(&hb->cond);
	free(hb->last_ns);
	free(hb);
}

int ferry__heartbeat_attach(struct ferry *fy)
{
	return ferry__dispatch_register(fy, FERRY_MSG_HEARTBEAT, FERRY_DISPATCH_NODE, hb_on_beat);
}

int ferry__heartbeat_start(struct ferry *fy)
{
	struct ferry_hb *hb;
	int rc;

	if (fy->heartbeat_ms <= 0 || fy->world < 2)
		return 0; /* off: transport events only */
	hb = calloc(1, sizeof(*hb));
	if (!hb)
		return -ENOMEM;
	hb->fy = fy;
	hb->timeout_ms = fy->heartbeat_ms;
	hb->last_ns = calloc(fy->world, sizeof(*hb->last_ns));
	if (!hb->last_ns || pthread_mutex_init(&hb->lock, NULL)) {
		free(hb->last_ns);
		free(hb);
		return -ENOMEM;
	}
	if (ferry__cond_init_monotonic(&hb->cond)) {
		pthread_mutex_destroy(&hb->lock);
		free(hb->last_ns);
		free(hb);
		return -ENOMEM;
	}
	/* the node frees it (after the transport, whose thread reads it) */
	fy->hb_free = hb_free;
	__atomic_store_n((struct ferry_hb **)&fy->hb, hb, __ATOMIC_RELEASE);
	rc = pthread_create(&hb->thread, NULL, hb_thread, hb);
	if (rc) {
		ferry_err("heartbeat: cannot start its thread: %s; peers are failed on transport "
			  "events only",
			  strerror(rc));
		return -rc;
	}
	hb->started = true;
	ferry_info("heartbeat: a peer silent for %d ms is failed (beats every %d ms)",
		   hb->timeout_ms, hb->timeout_ms / 4);
	return 0;
}

void ferry__heartbeat_stop(struct ferry *fy)
{
	struct ferry_hb *hb = fy->hb;

	if (!hb || !hb->started)
		return;
	pthread_mutex_lock(&hb->lock);
	hb->stop = true;
	pthread_cond_signal(&hb->cond);
	pthread_mutex_unlock(&hb->lock);
	pthread_join(hb->thread, NULL);
	hb->started = false;
}

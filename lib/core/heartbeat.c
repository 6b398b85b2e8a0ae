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
 * The lease (fencing): each beat to a peer carries the sender's clock at
 * the send; the peer answers at once with an echo of it. A node holds its
 * lease while the ranks that echoed a beat it sent less than L ago, with
 * itself, form a quorum (more than half the world, or
 * exactly half with rank 0 in it: two quorums always share a node); L is
 * three quarters of the timeout. Tables with replicas acknowledge updates
 * only under the lease, and a takeover of a failed node's keys waits L and
 * a margin (a quarter of the timeout: the whole timeout in all) after
 * every live node said it failed that node, by when no node that failed it
 * echoes it any more and its lease has run out (docs/faults.md, "Fencing").
 *
 *   node D                                     peer P
 *   HEARTBEAT{sent_ns = t0} ------------------>
 *                           <------------------ HEARTBEAT{echo_ns = t0}
 *   lease from P until t0 + L (D's clock: an interval, no clock is compared)
 *
 * Memory: four words and a byte per rank, and fy->gone's byte per rank.
 * Heartbeats are not counted in ferry_stats' message counters (they go to
 * the transport directly).
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
	/* per rank: the send time of our latest beat it echoed (0: none yet;
	 * the progress threads, atomic) */
	int64_t *lease_ns;
	int64_t lease_log_ns; /* the last "lease lapsed" or "fenced" line (atomic) */
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

/* L: three quarters of the timeout (beats go every quarter, echoes at once,
 * so a lease lapses only after two beats or their echoes are lost or late) */
static int hb_lease_ms(const struct ferry_hb *hb)
{
	return hb->timeout_ms / 4 * 3;
}

/* answer a peer's beat at once: the echo renews its lease from this node */
static void hb_echo(struct ferry *fy, uint32_t dst, uint64_t sent_ns)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_heartbeat b;
	} f;
	struct iovec iov = { .iov_base = &f, .iov_len = sizeof(f) };

	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, FERRY_MSG_HEARTBEAT, sizeof(f), fy->rank, 0);
	f.b.echo_ns = sent_ns;
	(void)fy->tp->ops->send(fy->tp, dst, &iov, 1);
}

static void hb_on_beat(struct ferry *fy, struct ferry_table *t, uint32_t src,
		       const struct ferry_proto_view *v)
{
	struct ferry_hb *hb = __atomic_load_n((struct ferry_hb **)&fy->hb, __ATOMIC_ACQUIRE);
	const struct ferry_msg_heartbeat *b = v->body;

	if (!hb)
		return;
	if (src == fy->rank) {
		hb_check(fy, hb);
		for (size_t i = 0; i < sizeof(fy->tick_fns) / sizeof(fy->tick_fns[0]); i++)
			if (fy->tick_fns[i])
				fy->tick_fns[i](fy);
		return;
	}
	/* a peer's beat did its liveness work in the dispatcher (heard[src]);
	 * a fenced node echoes nobody: its word no longer counts */
	if (b->sent_ns && !atomic_load_explicit(&fy->fenced, memory_order_relaxed))
		hb_echo(fy, src, b->sent_ns);
	if (b->echo_ns) {
		int64_t e = (int64_t)b->echo_ns;

		if (e > hb_now_ns()) {
			/* an echo of a beat this node has not sent yet */
			ferry_err("proto: rank %u echoed a heartbeat from this node's future; "
				  "dropping rank %u",
				  src, src);
			ferry__node_peer_failed(fy, src);
			return;
		}
		if (e > __atomic_load_n(&hb->lease_ns[src], __ATOMIC_RELAXED))
			__atomic_store_n(&hb->lease_ns[src], e, __ATOMIC_RELAXED);
	}
}

int ferry__lease_ms(const struct ferry *fy)
{
	const struct ferry_hb *hb = __atomic_load_n((struct ferry_hb **)&fy->hb, __ATOMIC_ACQUIRE);

	return hb ? hb_lease_ms(hb) : 0;
}

int ferry__lease_takeover_ms(const struct ferry *fy)
{
	const struct ferry_hb *hb = __atomic_load_n((struct ferry_hb **)&fy->hb, __ATOMIC_ACQUIRE);

	return hb ? hb_lease_ms(hb) + hb->timeout_ms / 4 : 0;
}

/* @n ranks, @with0: rank 0 among them */
static bool hb_quorum(uint32_t world, uint32_t n, bool with0)
{
	return 2 * n > world || (2 * n == world && with0);
}

bool ferry__quorum(const struct ferry *fy, const bool *in)
{
	uint32_t n = 0;

	for (uint32_t r = 0; r < fy->world; r++)
		if (in ? in[r] : !atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			n++;
	return hb_quorum(fy->world, n,
			 in ? in[0] : !atomic_load_explicit(&fy->failed[0], memory_order_relaxed));
}

bool ferry__lease_held(struct ferry *fy)
{
	struct ferry_hb *hb = __atomic_load_n((struct ferry_hb **)&fy->hb, __ATOMIC_ACQUIRE);
	int64_t now, lease;
	uint32_t n = 0;
	bool with0 = false;

	if (atomic_load_explicit(&fy->fenced, memory_order_relaxed))
		return false;
	if (!hb)
		return true;
	now = hb_now_ns();
	lease = (int64_t)hb_lease_ms(hb) * 1000000;
	for (uint32_t r = 0; r < fy->world; r++)
		if (r == fy->rank ||
		    (!atomic_load_explicit(&fy->failed[r], memory_order_relaxed) &&
		     now - __atomic_load_n(&hb->lease_ns[r], __ATOMIC_RELAXED) < lease)) {
			n++;
			with0 |= r == 0;
		}
	return hb_quorum(fy->world, n, with0);
}

/* one line a second at most: a caller that loops on a failing call */
static bool hb_log_ok(struct ferry_hb *hb)
{
	int64_t now = hb_now_ns(), last = __atomic_load_n(&hb->lease_log_ns, __ATOMIC_RELAXED);

	return now - last >= 1000000000 &&
	       __atomic_compare_exchange_n(&hb->lease_log_ns, &last, now, false, __ATOMIC_RELAXED,
					   __ATOMIC_RELAXED);
}

int ferry__lease_check(struct ferry *fy, const char *what)
{
	struct ferry_hb *hb = __atomic_load_n((struct ferry_hb **)&fy->hb, __ATOMIC_ACQUIRE);

	if (ferry__lease_held(fy))
		return 0;
	if (hb && !hb_log_ok(hb))
		return -FERRY_E_PEER;
	if (atomic_load_explicit(&fy->fenced, memory_order_relaxed))
		ferry_err("%s: not acknowledged: rank %u is fenced (the others failed it) and "
			  "serves no table with replicas any more; restart it (more such lines "
			  "are suppressed for 1 s)",
			  what, fy->rank);
	else
		ferry_err("%s: not acknowledged: rank %u has not heard an echo from a quorum "
			  "for %d ms (its lease lapsed: stopped, starved or cut off); it fails "
			  "with -FERRY_E_PEER, try again (more such lines are suppressed for 1 s)",
			  what, fy->rank, hb ? hb_lease_ms(hb) : 0);
	return -FERRY_E_PEER;
}

int ferry__fenced_check(struct ferry *fy, const char *what)
{
	struct ferry_hb *hb = __atomic_load_n((struct ferry_hb **)&fy->hb, __ATOMIC_ACQUIRE);

	if (!atomic_load_explicit(&fy->fenced, memory_order_acquire))
		return 0;
	if (!hb || hb_log_ok(hb))
		ferry_err("%s: rank %u is fenced (the others failed it, or it lost a quorum) "
			  "and serves no table with replicas any more: -FERRY_E_PEER; restart "
			  "this process (more such lines are suppressed for 1 s)",
			  what, fy->rank);
	return -FERRY_E_PEER;
}

void ferry__lease_gone(struct ferry *fy, uint32_t rank)
{
	if (rank < fy->world)
		atomic_store_explicit(&fy->gone[rank], 1, memory_order_relaxed);
}

bool ferry__lease_is_gone(const struct ferry *fy, uint32_t rank)
{
	return rank < fy->world && atomic_load_explicit(&fy->gone[rank], memory_order_relaxed);
}

void ferry__node_fence(struct ferry *fy, const char *why)
{
	if (atomic_exchange(&fy->fenced, true))
		return;
	ferry_err("fencing: rank %u stops serving its tables with replicas for good: %s; "
		  "every call on them fails with -FERRY_E_PEER; restart this process",
		  fy->rank, why);
	pthread_mutex_lock(&fy->lock);
	pthread_cond_broadcast(&fy->cond);
	pthread_mutex_unlock(&fy->lock);
}

int ferry__heartbeat_on_tick(struct ferry *fy, void (*fn)(struct ferry *fy))
{
	for (size_t i = 0; i < sizeof(fy->tick_fns) / sizeof(fy->tick_fns[0]); i++)
		if (!fy->tick_fns[i]) {
			fy->tick_fns[i] = fn;
			return 0;
		}
	return -ENOSPC;
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
		f.b.sent_ns = (uint64_t)hb_now_ns();
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
	free(hb->lease_ns);
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
	hb->lease_ns = calloc(fy->world, sizeof(*hb->lease_ns));
	if (!hb->last_ns || !hb->lease_ns || pthread_mutex_init(&hb->lock, NULL)) {
		free(hb->last_ns);
		free(hb->lease_ns);
		free(hb);
		return -ENOMEM;
	}
	if (ferry__cond_init_monotonic(&hb->cond)) {
		pthread_mutex_destroy(&hb->lock);
		free(hb->last_ns);
		free(hb->lease_ns);
		free(hb);
		return -ENOMEM;
	}
	/* a node starts with its lease: nobody can have failed it yet, and
	 * the first echoes come a quarter of the timeout from now */
	for (uint32_t r = 0; r < fy->world; r++)
		hb->lease_ns[r] = hb_now_ns();
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

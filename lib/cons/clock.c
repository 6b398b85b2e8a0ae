/* SPDX-License-Identifier: MIT */
/*
 * clock.c - the node's clocks (lib/cons/cons.h).
 *
 *   worker w: ferry_clock() -> wclock[w] + 1      (joins at the node's clock)
 *   node:     local = min over joined workers     (never goes down)
 *             local moved on: flush every table's buffered pushes (cons.c),
 *             each applied at its owner, then
 *   node ---CLOCK{local}---> every other rank:  peer[src] = clock
 *   global  = min over ranks of peer[]: every push made in a clock below it,
 *             on any node, is applied at its owner; when it moves on, ESSP's
 *             owners push their subscribed values (essp.c)
 *
 * A CLOCK only ever goes up; one that goes down is a protocol error and its
 * sender is dropped. Waits for the global clock are bounded by the node's
 * timeout and end at once when a rank holding it back fails.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cons/cons.h"

struct ferry_cons_node *ferry__cons_node(struct ferry *fy)
{
	return fy->cons;
}

uint64_t ferry__cons_wclock(struct ferry_cons_node *cn, const struct ferry_worker *w)
{
	uint64_t c;

	pthread_mutex_lock(&cn->lock);
	c = cn->joined[w->id] ? cn->wclock[w->id] : cn->local;
	pthread_mutex_unlock(&cn->lock);
	return c;
}

/* lock held: the least joined worker's clock, or local when none joined */
static bool clock_recompute(struct ferry_cons_node *cn)
{
	uint64_t min = UINT64_MAX;

	for (uint32_t i = 0, seen = 0; i < FERRY_MAX_WORKERS && seen < cn->njoined; i++)
		if (cn->joined[i]) {
			seen++;
			if (cn->wclock[i] < min)
				min = cn->wclock[i];
		}
	if (min != UINT64_MAX && min > cn->local) {
		cn->local = min;
		return true;
	}
	return false;
}

void ferry__cons_join(struct ferry_cons_node *cn, struct ferry_worker *w)
{
	pthread_mutex_lock(&cn->lock);
	if (!cn->joined[w->id]) {
		cn->joined[w->id] = 1;
		cn->njoined++;
		cn->wclock[w->id] = cn->local;
	}
	pthread_mutex_unlock(&cn->lock);
}

bool ferry__cons_tick(struct ferry_cons_node *cn, struct ferry_worker *w, uint64_t *c_p)
{
	bool moved;

	pthread_mutex_lock(&cn->lock);
	if (!cn->joined[w->id]) {
		/* made before the node had its clock state: cannot happen */
		pthread_mutex_unlock(&cn->lock);
		ferry__cons_join(cn, w);
		pthread_mutex_lock(&cn->lock);
	}
	*c_p = ++cn->wclock[w->id];
	moved = clock_recompute(cn);
	pthread_mutex_unlock(&cn->lock);
	return moved;
}

bool ferry__cons_leave(struct ferry_cons_node *cn, struct ferry_worker *w)
{
	bool moved = false;

	pthread_mutex_lock(&cn->lock);
	if (cn->joined[w->id]) {
		cn->joined[w->id] = 0;
		cn->njoined--;
		moved = clock_recompute(cn);
	}
	pthread_mutex_unlock(&cn->lock);
	return moved;
}

uint64_t ferry__cons_local(struct ferry_cons_node *cn)
{
	uint64_t c;

	pthread_mutex_lock(&cn->lock);
	c = cn->local;
	pthread_mutex_unlock(&cn->lock);
	return c;
}

/* lock held: the least announced clock, and a rank that holds it */
static uint64_t clock_global_locked(struct ferry_cons_node *cn, uint32_t *who_p)
{
	uint64_t g = UINT64_MAX;

	for (uint32_t r = 0; r < cn->fy->world; r++)
		if (cn->peer[r] < g) {
			g = cn->peer[r];
			*who_p = r;
		}
	return g;
}

int ferry__cons_announce(struct ferry_cons_node *cn, uint64_t clock)
{
	struct ferry *fy = cn->fy;
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_clock c;
	} msg;
	int rc = 0;

	uint32_t who = 0;
	uint64_t g0, g1;

	if (clock <= cn->announced)
		return 0;
	cn->announced = clock;
	pthread_mutex_lock(&cn->lock);
	g0 = clock_global_locked(cn, &who);
	cn->peer[fy->rank] = clock;
	g1 = clock_global_locked(cn, &who);
	pthread_cond_broadcast(&cn->cond);
	pthread_mutex_unlock(&cn->lock);
	if (g1 > g0)
		ferry__essp_kick(cn, g1); /* ESSP's owners push, on the progress thread */
	memset(&msg, 0, sizeof(msg));
	ferry__proto_hdr_init(&msg.h, FERRY_MSG_CLOCK, sizeof(msg), fy->rank, 0);
	msg.c.clock = clock;
	for (uint32_t r = 0; r < fy->world; r++) {
		int src;

		if (r == fy->rank || atomic_load(&fy->failed[r]))
			continue;
		src = ferry__send(fy, r, &msg, sizeof(msg));
		if (src && !rc)
			rc = src;
	}
	return rc;
}

uint64_t ferry__cons_global(struct ferry_cons_node *cn)
{
	uint32_t who = 0;
	uint64_t g;

	pthread_mutex_lock(&cn->lock);
	g = clock_global_locked(cn, &who);
	pthread_mutex_unlock(&cn->lock);
	return g;
}

int ferry__cons_wait_global(struct ferry_cons_node *cn, uint64_t need, uint64_t c, uint32_t s)
{
	struct ferry *fy = cn->fy;
	struct timespec ts, slice;
	uint32_t who = 0;
	uint64_t g;
	int rc = 0;

	ferry__deadline_ms(fy->timeout_ms, &ts);
	pthread_mutex_lock(&cn->lock);
	while ((g = clock_global_locked(cn, &who)) < need) {
		if (atomic_load(&fy->closed)) {
			rc = -FERRY_E_CLOSED;
			break;
		}
		if (atomic_load(&fy->failed[who])) {
			rc = -FERRY_E_PEER;
			ferry_err("cons: a worker at clock %llu needs every node at clock %llu or "
				  "more (staleness bound %u), and rank %u, at clock %llu, failed; "
				  "restart the job",
				  (unsigned long long)c, (unsigned long long)need, s, who,
				  (unsigned long long)g);
			break;
		}
		/* in slices of 100 ms: a close of this node (which the contract
		 * rules out while its workers run) does not signal this condition */
		ferry__deadline_ms(100, &slice);
		if (slice.tv_sec > ts.tv_sec ||
		    (slice.tv_sec == ts.tv_sec && slice.tv_nsec > ts.tv_nsec))
			slice = ts;
		if (ferry__cond_wait_until(&cn->cond, &cn->lock, &slice) == ETIMEDOUT &&
		    slice.tv_sec == ts.tv_sec && slice.tv_nsec == ts.tv_nsec &&
		    clock_global_locked(cn, &who) < need) {
			rc = -ETIMEDOUT;
			ferry_err(
				"cons: a worker at clock %llu waited %d ms for every node to reach "
				"clock %llu (staleness bound %u); rank %u is still at clock %llu: "
				"every worker of every node must keep calling ferry_clock() (or be "
				"destroyed), or raise the staleness bound or the timeout",
				(unsigned long long)c, fy->timeout_ms, (unsigned long long)need, s,
				who, (unsigned long long)clock_global_locked(cn, &who));
			break;
		}
	}
	pthread_mutex_unlock(&cn->lock);
	return rc;
}

/* CLOCK: any peer, any time after start; its clock never goes down */
static void clock_on_msg(struct ferry *fy, struct ferry_table *unused, uint32_t src,
			 const struct ferry_proto_view *v)
{
	struct ferry_cons_node *cn = fy->cons;
	const struct ferry_msg_clock *m = v->body;
	uint64_t prev, g0, g1;
	uint32_t who = 0;
	bool bad = false;

	(void)unused;
	if (src == fy->rank)
		return; /* never sent to self: nothing to learn */
	pthread_mutex_lock(&cn->lock);
	prev = cn->peer[src];
	g0 = clock_global_locked(cn, &who);
	if (m->clock < prev)
		bad = true;
	else
		cn->peer[src] = m->clock;
	g1 = clock_global_locked(cn, &who);
	pthread_cond_broadcast(&cn->cond);
	pthread_mutex_unlock(&cn->lock);
	if (g1 > g0)
		ferry__essp_push_all(cn, g1); /* ESSP's owners push (essp.c) */
	if (bad) {
		ferry_err("cons: rank %u sent clock %llu after clock %llu; clocks never go down, "
			  "so it is dropped as broken (a peer with another library version?)",
			  src, (unsigned long long)m->clock, (unsigned long long)prev);
		ferry__node_peer_failed(fy, src);
	}
}

static void clock_on_peer_failed(struct ferry *fy, uint32_t rank)
{
	struct ferry_cons_node *cn = fy->cons;

	(void)rank;
	pthread_mutex_lock(&cn->lock);
	pthread_cond_broadcast(&cn->cond);
	pthread_mutex_unlock(&cn->lock);
}

int ferry__cons_clock_attach(struct ferry *fy, struct ferry_cons_node *cn)
{
	int rc = ferry__dispatch_register(fy, FERRY_MSG_CLOCK, FERRY_DISPATCH_NODE, clock_on_msg);

	fy->cons = cn;
	return rc ? rc : ferry__node_on_peer_failed(fy, clock_on_peer_failed);
}

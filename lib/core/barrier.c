/* SPDX-License-Identifier: MIT */
/*
 * barrier.c - ferry_barrier: every node sends BARRIER{gen} to rank 0; rank 0
 * counts, per rank, the generations entered, and once every rank entered
 * generation g it sends BARRIER_REL{g} to everyone and releases its own
 * waiter last. Waits are bounded by the node's timeout; a timeout on rank 0
 * names the ranks that never entered.
 *
 * State: fy->barrier_* under fy->lock. The handler runs on the progress
 * thread; ferry_barrier on any application thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "lib/core/core.h"

static void barrier_on_msg(struct ferry *fy, struct ferry_table *t, uint32_t src,
			   const struct ferry_proto_view *v)
{
	const struct ferry_msg_barrier *b = v->body;
	const uint8_t type = v->hdr->type;

	pthread_mutex_lock(&fy->lock);
	if (type == FERRY_MSG_BARRIER && fy->rank == 0 && b->gen != fy->barrier_arrived[src]) {
		/* a node enters barriers one after the other, and its frames keep order */
		ferry_warn("barrier: rank %u entered barrier %llu, but its next is %llu; ignored",
			   src, (unsigned long long)b->gen,
			   (unsigned long long)fy->barrier_arrived[src]);
	} else if (type == FERRY_MSG_BARRIER && fy->rank == 0) {
		uint64_t gen;
		uint32_t r;

		fy->barrier_arrived[src] = b->gen + 1;
		/* release every generation that all ranks have entered */
		for (;;) {
			gen = fy->barrier_released;
			for (r = 0; r < fy->world; r++)
				if (fy->barrier_arrived[r] <= gen)
					break;
			if (r < fy->world)
				break;
			/*
			 * Send the releases first, then release rank 0's own waiter: a
			 * barrier that has returned on rank 0 sends nothing more (the
			 * stats of the test after it must see no barrier traffic).
			 * Only this thread changes barrier_released on rank 0.
			 */
			pthread_mutex_unlock(&fy->lock);
			{
				struct {
					struct ferry_msg_hdr h;
					struct ferry_msg_barrier b;
				} rel;

				memset(&rel, 0, sizeof(rel));
				ferry__proto_hdr_init(&rel.h, FERRY_MSG_BARRIER_REL, sizeof(rel),
						      fy->rank, 0);
				rel.b.gen = gen;
				for (r = 1; r < fy->world; r++)
					ferry__send(fy, r, &rel, sizeof(rel));
			}
			pthread_mutex_lock(&fy->lock);
			fy->barrier_released = gen + 1;
		}
		pthread_cond_broadcast(&fy->cond);
	} else if (type == FERRY_MSG_BARRIER_REL && src == 0 && b->status) {
		/* rank 0 says a rank failed: no barrier can complete any more */
		if (!fy->barrier_broken)
			fy->barrier_broken = (b->rank < fy->world ? b->rank : 0) + 1;
		pthread_cond_broadcast(&fy->cond);
	} else if (type == FERRY_MSG_BARRIER_REL && src == 0 && b->gen >= fy->barrier_gen) {
		ferry_warn("barrier: rank 0 released barrier %llu, which this node has not "
			   "entered (it entered %llu); ignored",
			   (unsigned long long)b->gen, (unsigned long long)fy->barrier_gen);
	} else if (type == FERRY_MSG_BARRIER_REL && src == 0) {
		if (b->gen + 1 > fy->barrier_released)
			fy->barrier_released = b->gen + 1;
		pthread_cond_broadcast(&fy->cond);
	} else {
		ferry_warn("barrier: rank %u sent a barrier message meant for rank 0; ignored",
			   src);
	}
	pthread_mutex_unlock(&fy->lock);
}

int ferry_barrier(struct ferry *fy)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_barrier b;
	} msg;
	struct timespec ts;
	uint64_t gen;
	int rc = 0;

	if (!fy)
		return -EINVAL;
	if (atomic_load(&fy->closed))
		return -FERRY_E_CLOSED;
	if (fy->cons_barrier) {
		rc = fy->cons_barrier(fy, 0);
		if (rc)
			return rc;
	}
	pthread_mutex_lock(&fy->lock);
	gen = fy->barrier_gen++;
	pthread_mutex_unlock(&fy->lock);
	memset(&msg, 0, sizeof(msg));
	ferry__proto_hdr_init(&msg.h, FERRY_MSG_BARRIER, sizeof(msg), fy->rank, 0);
	msg.b.gen = gen;
	rc = ferry__send(fy, 0, &msg, sizeof(msg));
	if (rc)
		return rc;
	ferry__deadline_ms(fy->timeout_ms, &ts);
	pthread_mutex_lock(&fy->lock);
	while (fy->barrier_released <= gen && !rc) {
		if (atomic_load(&fy->closed))
			rc = -FERRY_E_CLOSED;
		else if (fy->barrier_broken)
			rc = -FERRY_E_PEER;
		else if (ferry__cond_wait_until(&fy->cond, &fy->lock, &ts) == ETIMEDOUT)
			rc = -ETIMEDOUT;
	}
	if (rc == -FERRY_E_PEER)
		ferry_err("barrier %llu: rank %u failed, and a barrier cannot complete without it; "
			  "restart the job (or leave out the barrier)",
			  (unsigned long long)gen, fy->barrier_broken - 1);
	if (rc == -ETIMEDOUT) {
		char names[256] = "";
		size_t off = 0;

		if (fy->rank == 0) {
			for (uint32_t r = 0; r < fy->world && off < sizeof(names); r++)
				if (fy->barrier_arrived[r] <= gen)
					off += (size_t)snprintf(names + off, sizeof(names) - off,
								"%s%u", off ? ", " : "", r);
			ferry_err("barrier %llu: timed out after %d ms; ranks %s never entered it",
				  (unsigned long long)gen, fy->timeout_ms, names);
		} else {
			ferry_err("barrier %llu: timed out after %d ms waiting for rank 0 to "
				  "release it (see rank 0's log for the missing ranks)",
				  (unsigned long long)gen, fy->timeout_ms);
		}
	}
	pthread_mutex_unlock(&fy->lock);
	if (!rc && fy->cons_barrier)
		fy->cons_barrier(fy, 1);
	return rc;
}

/*
 * A peer failed (progress thread). Rank 0 decides for everyone: the barrier
 * is broken for good (the failed rank can enter no later barrier), and a
 * release with a status tells every live rank, in order after the releases
 * it sent before. Other ranks break it themselves only when rank 0 failed.
 */
static void barrier_on_peer_failed(struct ferry *fy, uint32_t rank)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_barrier b;
	} rel;

	pthread_mutex_lock(&fy->lock);
	if (fy->barrier_broken || (fy->rank != 0 && rank != 0)) {
		pthread_mutex_unlock(&fy->lock);
		return;
	}
	fy->barrier_broken = rank + 1;
	memset(&rel, 0, sizeof(rel));
	ferry__proto_hdr_init(&rel.h, FERRY_MSG_BARRIER_REL, sizeof(rel), fy->rank, 0);
	rel.b.gen = fy->barrier_released;
	rel.b.status = -FERRY_E_PEER;
	rel.b.rank = rank;
	pthread_cond_broadcast(&fy->cond);
	pthread_mutex_unlock(&fy->lock);
	if (fy->rank == 0)
		for (uint32_t r = 1; r < fy->world; r++)
			ferry__send(fy, r, &rel, sizeof(rel)); /* the failed ones refuse it */
}

int ferry__barrier_attach(struct ferry *fy)
{
	int rc = ferry__dispatch_register(fy, FERRY_MSG_BARRIER, FERRY_DISPATCH_NODE,
					  barrier_on_msg);

	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_BARRIER_REL, FERRY_DISPATCH_NODE,
					      barrier_on_msg);
	return rc ? rc : ferry__node_on_peer_failed(fy, barrier_on_peer_failed);
}

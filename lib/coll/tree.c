/* SPDX-License-Identifier: MIT */
/*
 * tree.c - broadcast down a tree rooted at the root, in segments: each
 * node copies a segment from its parent into its buffer and forwards it to
 * its children at once, so a large buffer streams through the tree.
 *
 *   binomial (small buffers)         chain (large buffers)
 *   v = (rank - root) mod w          v -> v + 1
 *        0                           0 -> 1 -> 2 -> 3 -> ...
 *      / | \                         every link carries the buffer once:
 *     4  2  1                        the pipeline's rate is one link's
 *     |  |
 *     6  3 ...   log2(w) rounds: the latency-bound shape
 *
 * A node that has the whole buffer acknowledges it to the root (COLL_ACK);
 * the root returns once every node did. That bounds how far a root can run
 * ahead of the others (coll.h, FERRY_COLL_WINDOW) and makes a broadcast's
 * return mean the same on every node. Memory: the caller's buffer, and one
 * byte per rank at the root (who acknowledged).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/coll/coll.h"

static uint32_t tree_nsteps(const struct ferry_coll *c)
{
	return 1;
}

static uint32_t tree_vrank(const struct ferry_coll *c)
{
	return (c->colls->me + c->colls->n - c->sig.root) % c->colls->n;
}

static uint32_t tree_real(const struct ferry_coll *c, uint32_t v)
{
	return (v + c->sig.root) % c->colls->n;
}

static uint32_t tree_highbit(uint32_t v)
{
	return v ? 1u << (31 - __builtin_clz(v)) : 0;
}

/* the parent's rank (never asked for the root) */
static uint32_t tree_parent(const struct ferry_coll *c, bool chain)
{
	uint32_t v = tree_vrank(c);

	return tree_real(c, chain ? v - 1 : v - tree_highbit(v));
}

/* send [off, off + n) to every child, the largest subtree first */
static int tree_forward(struct ferry_coll *c, bool chain, uint64_t off, uint64_t n)
{
	const uint32_t w = c->colls->n, v = tree_vrank(c);
	int rc = 0;

	if (chain)
		return v + 1 < w ? ferry__coll_send(c, tree_real(c, v + 1), 0, off, n) : 0;
	for (int k = 31; k >= 0 && !rc; k--) {
		uint64_t child = (uint64_t)v + (1ull << k);

		if ((1ull << k) > v && child < w)
			rc = ferry__coll_send(c, tree_real(c, (uint32_t)child), 0, off, n);
	}
	return rc;
}

static int tree_start_any(struct ferry_coll *c, bool chain)
{
	const uint32_t w = c->colls->n, v = tree_vrank(c);

	/* the chain puts by WRITE where it can (put.c): straight into the next
	 * node's buffer */
	if (chain) {
		int rc = ferry__coll_zc_start(c, v ? tree_parent(c, true) : UINT32_MAX,
					      v + 1 < w ? tree_real(c, v + 1) : UINT32_MAX, false);

		if (rc)
			return rc;
	}
	if (c->colls->me != c->sig.root) {
		c->remaining = c->sig.count;
		c->next_off[0] = 0;
		return 0;
	}
	c->acked = calloc(c->colls->n, 1);
	if (!c->acked)
		return -ENOMEM;
	c->acks = 0;
	return tree_forward(c, chain, 0, c->sig.count);
}

static const char *tree_on_frame_any(struct ferry_coll *c, uint32_t src, uint8_t type,
				     const struct ferry_msg_coll *m, const void *data, bool chain)
{
	const uint32_t root = c->sig.root;
	const char *why = NULL;
	bool in_place = false;
	int rc;

	if (type == FERRY_MSG_COLL_KEYS)
		return ferry__coll_zc_keys(c, src, m, data);
	if (type == FERRY_MSG_COLL_ACK) {
		if (c->colls->me != root)
			return "coll: a broadcast acknowledgement to a node that is not its root";
		if (src == root || c->acked[src])
			return "coll: a second broadcast acknowledgement from one rank";
		c->acked[src] = 1;
		if (++c->acks == c->colls->n - 1)
			ferry__coll_finish_ok(c);
		return NULL;
	}
	if (c->colls->me == root)
		return "coll: broadcast data sent to its root";
	if (src != tree_parent(c, chain))
		return "coll: broadcast data from a rank that is not this node's parent";
	if (m->off != c->next_off[0] || m->n > c->remaining)
		return "coll: a segment out of order";
	if (type == FERRY_MSG_COLL_PUT) {
		data = ferry__coll_zc_landed(c, src, m, false, &in_place, &why);
		if (!data)
			return why;
	}
	if (!in_place)
		memcpy((uint8_t *)c->buf + m->off * c->esz, data, (size_t)m->n * c->esz);
	c->next_off[0] += m->n;
	c->remaining -= m->n;
	rc = tree_forward(c, chain, m->off, m->n);
	if (!rc && c->remaining == 0)
		rc = ferry__coll_send_ctl(c, root, FERRY_MSG_COLL_ACK);
	if (rc)
		ferry__coll_finish(c, rc);
	else if (c->remaining == 0)
		ferry__coll_finish_ok(c);
	return NULL;
}

static int tree_start(struct ferry_coll *c)
{
	return tree_start_any(c, false);
}

static int chain_start(struct ferry_coll *c)
{
	return tree_start_any(c, true);
}

static const char *tree_on_frame(struct ferry_coll *c, uint32_t src, uint8_t type,
				 const struct ferry_msg_coll *m, const void *data)
{
	return tree_on_frame_any(c, src, type, m, data, false);
}

static const char *chain_on_frame(struct ferry_coll *c, uint32_t src, uint8_t type,
				  const struct ferry_msg_coll *m, const void *data)
{
	return tree_on_frame_any(c, src, type, m, data, true);
}

const struct ferry_coll_algo_ops ferry__coll_tree = {
	.start = tree_start,
	.on_frame = tree_on_frame,
	.nsteps = tree_nsteps,
};

/* the chain's one step carries the whole buffer */
static void chain_recv_range(const struct ferry_coll *c, uint32_t s, uint64_t *lo, uint64_t *hi)
{
	(void)s;
	*lo = 0;
	*hi = c->sig.count;
}

const struct ferry_coll_algo_ops ferry__coll_chain = {
	.recv_range = chain_recv_range,
	.start = chain_start,
	.on_frame = chain_on_frame,
	.nsteps = tree_nsteps,
};

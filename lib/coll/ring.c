/* SPDX-License-Identifier: MIT */
/*
 * ring.c - all-reduce (and reduce) on a ring: the bandwidth-bound
 * algorithm. The buffer is cut into world chunks; each node sends to its
 * right neighbour and receives from its left one, 2 (world - 1) steps:
 *
 *   reduce-scatter, s = 0 .. w-2:  send chunk (r - s), receive chunk
 *                                  (r - s - 1) and reduce it in
 *   all-gather, s = w-1 .. 2w-3:   send chunk (r + 1 - s'), receive chunk
 *                                  (r - s') and copy it   (s' = s - (w - 1))
 *
 *   world 3, chunks A B C:      r0        r1        r2
 *     s0 (reduce-scatter)     A ->      B ->      C ->     (each its own)
 *     s1                      C+A ->    A+B ->    B+C ->
 *     s2 (all-gather)         B+C+A ->  C+A+B ->  A+B+C -> (whole chunks)
 *     s3                      ...every node has every whole chunk
 *
 * What a node sends at step s + 1 is exactly the chunk it received (and
 * reduced) at step s, so the ring runs per segment: a segment received at
 * step s is reduced and forwarded at once, and the whole ring is a pipeline
 * of FERRY_COLL_SEG_BYTES segments. Each node moves 2 (w - 1) / w of the
 * buffer each way, the least an all-reduce can. A chunk is reduced to its
 * whole value on one node and copied from there: every node gets the same
 * bits. Segments of one step arrive in order (one sender, FIFO), which is
 * what the receiver checks; steps interleave freely, and no frame needs to
 * be kept once the collective runs (each step writes a different chunk, and
 * a chunk's all-gather copy arrives only after this node's part of its
 * reduction left). Memory: none beyond the caller's buffer and 2 w offsets.
 */
#include <string.h>

#include "lib/coll/coll.h"

static uint32_t ring_nsteps(const struct ferry_coll *c)
{
	return 2 * (c->colls->n - 1);
}

/* the chunk this node receives at step @s */
static uint32_t ring_rchunk(const struct ferry_coll *c, uint32_t s)
{
	const uint32_t n = c->colls->n, r = c->colls->me;

	if (s < n - 1)
		return (r + 2 * n - s - 1) % n;
	return (r + 2 * n - (s - (n - 1))) % n;
}

static int ring_start(struct ferry_coll *c)
{
	const uint32_t n = c->colls->n, r = c->colls->me;
	const uint64_t count = c->sig.count;
	uint64_t lo, hi;
	int rc;

	c->remaining = 0;
	for (uint32_t s = 0; s < ring_nsteps(c); s++) {
		uint32_t k = ring_rchunk(c, s);

		c->next_off[s] = ferry__coll_chunk_lo(count, n, k);
		c->remaining += ferry__coll_chunk_lo(count, n, k + 1) - c->next_off[s];
	}
	lo = ferry__coll_chunk_lo(count, n, r);
	hi = ferry__coll_chunk_lo(count, n, r + 1);
	rc = ferry__coll_zc_start(c, (r + n - 1) % n, (r + 1) % n, true);
	return rc ? rc : ferry__coll_send(c, (r + 1) % n, 0, lo, hi - lo);
}

static const char *ring_on_frame(struct ferry_coll *c, uint32_t src, uint8_t type,
				 const struct ferry_msg_coll *m, const void *data)
{
	const uint32_t n = c->colls->n, r = c->colls->me;
	const uint32_t s = m->step;
	bool in_place = false;
	const char *why = NULL;
	int rc;

	if (type == FERRY_MSG_COLL_KEYS)
		return ferry__coll_zc_keys(c, src, m, data);
	if (type != FERRY_MSG_COLL && type != FERRY_MSG_COLL_PUT)
		return "coll: an acknowledgement in a reduction";
	if (src != (r + n - 1) % n)
		return "coll: a ring frame from a rank that is not this node's left neighbour";
	if (s >= ring_nsteps(c))
		return "coll: a ring step beyond the last";
	if (m->off != c->next_off[s])
		return "coll: a segment out of order";
	if (m->off + m->n > ferry__coll_chunk_lo(c->sig.count, n, ring_rchunk(c, s) + 1))
		return "coll: a segment beyond its chunk";
	if (type == FERRY_MSG_COLL_PUT) {
		data = ferry__coll_zc_landed(c, src, m, s < n - 1, &in_place, &why);
		if (!data)
			return why;
	}
	if (s < n - 1)
		ferry__coll_reduce(c, (uint8_t *)c->buf + m->off * c->esz, data, m->n, true);
	else if (!in_place)
		memcpy((uint8_t *)c->buf + m->off * c->esz, data, (size_t)m->n * c->esz);
	c->next_off[s] += m->n;
	c->remaining -= m->n;
	if (s + 1 < ring_nsteps(c)) {
		rc = ferry__coll_send(c, (r + 1) % n, s + 1, m->off, m->n);
		if (rc) {
			ferry__coll_finish(c, rc);
			return NULL;
		}
	}
	if (c->remaining == 0)
		ferry__coll_finish_ok(c);
	return NULL;
}

static void ring_recv_range(const struct ferry_coll *c, uint32_t s, uint64_t *lo, uint64_t *hi)
{
	uint32_t k = ring_rchunk(c, s);

	*lo = ferry__coll_chunk_lo(c->sig.count, c->colls->n, k);
	*hi = ferry__coll_chunk_lo(c->sig.count, c->colls->n, k + 1);
}

const struct ferry_coll_algo_ops ferry__coll_ring = {
	.recv_range = ring_recv_range,
	.start = ring_start,
	.on_frame = ring_on_frame,
	.nsteps = ring_nsteps,
};

/* SPDX-License-Identifier: MIT */
/*
 * rd.c - all-reduce (and reduce) by recursive doubling: the latency-bound
 * algorithm, log2(p) exchanges of the whole buffer, p the largest power of
 * two <= world. The rem = world - p extra ranks are folded in first and
 * served last (Rabenseifner's fix-up, as Open MPI's coll/tuned does it):
 *
 *   step 0 (pre)     ranks < 2 rem: even r sends its buffer to r + 1, which
 *                    reduces it in (op(even, odd)); even r then waits
 *   steps 1 .. L     the p ranks left, renumbered nr (odd r < 2 rem: r / 2,
 *                    r >= 2 rem: r - rem), exchange with nr ^ 2^(k-1) and
 *                    reduce, the lower nr's operand first
 *   step L + 1       odd r < 2 rem sends the result to r - 1
 *
 *   world 6 (p 4, rem 2):   0 -> 1   2 -> 3        (pre)
 *                           1 <-> 3   4 <-> 5      (k = 1: nr 0<->1, 2<->3)
 *                           1 <-> 4   3 <-> 5      (k = 2: nr 0<->2, 1<->3)
 *                           1 -> 0   3 -> 2        (post)
 *
 * Both ends of an exchange compute op(lower, higher) on the same operands:
 * every node ends with the same bits. A step starts (its buffer sent) only
 * when the one before is complete; frames of a later step that come early
 * (the peer is ahead) are kept, at most (L + 2) x the buffer per
 * collective (the crossover keeps that small; a forced doubling of a large
 * buffer costs it).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/coll/coll.h"

struct rd_geom {
	uint32_t p, rem, L, nr;
};

static struct rd_geom rd_geom(const struct ferry_coll *c)
{
	const uint32_t n = c->colls->n, r = c->colls->me;
	struct rd_geom g = { .p = 1 };

	while (g.p * 2 <= n) {
		g.p *= 2;
		g.L++;
	}
	g.rem = n - g.p;
	g.nr = r < 2 * g.rem ? r / 2 : r - g.rem;
	return g;
}

static uint32_t rd_real(const struct rd_geom *g, uint32_t nr)
{
	return nr < g->rem ? nr * 2 + 1 : nr + g->rem;
}

/* the rank this node sends to (recv = 0) or receives from (recv = 1) at
 * step @k, or -1 */
static int64_t rd_peer(const struct ferry_coll *c, const struct rd_geom *g, uint32_t k, int recv)
{
	const uint32_t r = c->colls->me;

	if (r < 2 * g->rem && r % 2 == 0) {
		if (k == 0 && !recv)
			return r + 1;
		if (k == g->L + 1 && recv)
			return r + 1;
		return -1;
	}
	if (k == 0)
		return r < 2 * g->rem && recv ? (int64_t)r - 1 : -1;
	if (k == g->L + 1)
		return r < 2 * g->rem && !recv ? (int64_t)r - 1 : -1;
	if (k > g->L + 1)
		return -1;
	return rd_real(g, g->nr ^ (1u << (k - 1)));
}

static uint32_t rd_nsteps(const struct ferry_coll *c)
{
	return rd_geom(c).L + 2;
}

/* enter step @k: send this node's buffer, expect the peer's */
static int rd_enter(struct ferry_coll *c, const struct rd_geom *g, uint32_t k)
{
	int64_t to = rd_peer(c, g, k, 0);

	c->cur = k;
	c->remaining = rd_peer(c, g, k, 1) >= 0 ? c->sig.count : 0;
	c->next_off[k] = 0;
	return to >= 0 ? ferry__coll_send(c, (uint32_t)to, k, 0, c->sig.count) : 0;
}

static int rd_start(struct ferry_coll *c)
{
	struct rd_geom g = rd_geom(c);
	int rc = rd_enter(c, &g, c->colls->me < 2 * g.rem ? 0 : 1);

	/* even ranks of the fix-up expect nothing at step 0: the progress
	 * thread must move them on to the last step */
	return rc ? rc : c->remaining == 0;
}

static void rd_apply(struct ferry_coll *c, const struct rd_geom *g, const struct ferry_msg_coll *m,
		     const void *data)
{
	uint8_t *dst = (uint8_t *)c->buf + m->off * c->esz;
	bool in_first;

	if (m->step == g->L + 1) {
		memcpy(dst, data, (size_t)m->n * c->esz);
	} else {
		/* pre: the even sender's operand first; exchange: the lower nr's */
		in_first = m->step == 0 || (g->nr ^ (1u << (m->step - 1))) < g->nr;
		ferry__coll_reduce(c, dst, data, m->n, in_first);
	}
	c->next_off[m->step] += m->n;
	c->remaining -= m->n;
}

/* while the step under way is complete: enter the next, apply its kept
 * frames; finish after the last */
static void rd_progress(struct ferry_coll *c, const struct rd_geom *g)
{
	while (c->state == FERRY_COLL_RUNNING && c->remaining == 0) {
		struct ferry_coll_early **pp;
		uint32_t k = c->cur + 1;
		int rc;

		while (k <= g->L + 1 && rd_peer(c, g, k, 0) < 0 && rd_peer(c, g, k, 1) < 0)
			k++;
		if (k > g->L + 1) {
			ferry__coll_finish(c, 0);
			return;
		}
		rc = rd_enter(c, g, k);
		if (rc) {
			ferry__coll_finish(c, rc);
			return;
		}
		/* frames of this step that came early, in arrival order */
		for (pp = &c->early; *pp;) {
			struct ferry_coll_early *e = *pp;
			const struct ferry_msg_coll *m =
				(const void *)((const uint8_t *)e->frame +
					       sizeof(struct ferry_msg_hdr));

			if (m->step != k) {
				pp = &e->next;
				continue;
			}
			*pp = e->next;
			if (c->early_tail == e) {
				struct ferry_coll_early *t = c->early;

				while (t && t->next)
					t = t->next;
				c->early_tail = t;
			}
			/* offsets of kept frames are checked here, as on arrival;
			 * the sender is the step's peer (checked then): it broke
			 * the order, but this step's other frames are gone, so the
			 * collective fails rather than the peer */
			if (m->off == c->next_off[k] && m->n <= c->remaining) {
				rd_apply(c, g, m, m + 1);
			} else {
				ferry_err("coll: collective %llu, step %u: rank %u sent a segment "
					  "out of order; the collective fails",
					  (unsigned long long)c->sig.seq, k,
					  ferry__coll_rank(c->colls, e->src));
				ferry__coll_finish(c, -FERRY_E_PROTO);
			}
			free(e);
			if (c->state != FERRY_COLL_RUNNING)
				return;
		}
	}
}

static const char *rd_on_frame(struct ferry_coll *c, uint32_t src, uint8_t type,
			       const struct ferry_msg_coll *m, const void *data)
{
	struct rd_geom g = rd_geom(c);

	if (type != FERRY_MSG_COLL)
		return "coll: an acknowledgement in a reduction";
	if (m->step > g.L + 1 || rd_peer(c, &g, m->step, 1) != (int64_t)src)
		return "coll: a frame from a rank that is not this node's peer at that step";
	if (m->step < c->cur || (m->step == c->cur && c->remaining == 0))
		return "coll: a frame of a step already complete";
	if (m->step > c->cur) {
		const struct ferry_msg_hdr *h = (const void *)((const uint8_t *)m - sizeof(*h));

		if (ferry__coll_keep(&c->early, &c->early_tail, src, h, h->len))
			ferry__coll_finish(c, -ENOMEM);
		return NULL;
	}
	if (m->off != c->next_off[m->step] || m->n > c->remaining)
		return "coll: a segment out of order";
	rd_apply(c, &g, m, data);
	rd_progress(c, &g);
	return NULL;
}

static void rd_run(struct ferry_coll *c)
{
	struct rd_geom g = rd_geom(c);

	rd_progress(c, &g);
}

const struct ferry_coll_algo_ops ferry__coll_rd = {
	.start = rd_start,
	.on_frame = rd_on_frame,
	.run = rd_run,
	.nsteps = rd_nsteps,
};

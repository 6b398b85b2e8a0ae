/* SPDX-License-Identifier: MIT */
/* placement.c - range blocks and the consistent-hash ring. */
#include <errno.h>
#include <stdlib.h>

#include "ferry/ferry.h"
#include "lib/dir/placement.h"

struct ring_point {
	uint64_t hash;
	uint32_t rank;
};

static int ring_cmp(const void *a, const void *b)
{
	const struct ring_point *x = a, *y = b;

	if (x->hash != y->hash)
		return x->hash < y->hash ? -1 : 1;
	return x->rank < y->rank ? -1 : (x->rank > y->rank);
}

int ferry__placement_init(struct ferry_placement_map *m, uint32_t kind, uint64_t num_keys,
			  uint32_t world, uint32_t vnodes)
{
	size_t npoints;
	uint32_t p = 0;

	m->num_keys = num_keys;
	m->world = world;
	m->kind = kind;
	m->ring = NULL;
	m->ring_rank = NULL;
	m->index = NULL;
	m->npoints = 0;
	if (!world || world > 65535 || (kind == FERRY_PLACEMENT_HASH && !vnodes))
		return -EINVAL;
	if (kind == FERRY_PLACEMENT_RANGE)
		return 0;
	if (kind != FERRY_PLACEMENT_HASH)
		return -EINVAL;

	npoints = (size_t)world * vnodes;
	if (npoints > UINT32_MAX)
		return -EINVAL;
	{
		struct ring_point *ring = malloc(npoints * sizeof(*ring));

		m->ring = malloc(npoints * sizeof(*m->ring));
		m->ring_rank = malloc(npoints * sizeof(*m->ring_rank));
		m->index = malloc((FERRY_RING_INDEX + 1) * sizeof(*m->index));
		if (!ring || !m->ring || !m->ring_rank || !m->index) {
			free(ring);
			ferry__placement_fini(m);
			return -ENOMEM;
		}
		for (uint32_t r = 0; r < world; r++)
			for (uint32_t v = 0; v < vnodes; v++) {
				struct ring_point *q = &ring[(size_t)r * vnodes + v];

				q->hash = ferry__hash64(((uint64_t)r << 32 | v) ^
							0x5a17f3e29b4c6d01ull);
				q->rank = r;
			}
		qsort(ring, npoints, sizeof(*ring), ring_cmp);
		for (size_t i = 0; i < npoints; i++) {
			m->ring[i] = ring[i].hash;
			m->ring_rank[i] = (uint16_t)ring[i].rank;
		}
		free(ring);
	}
	m->npoints = (uint32_t)npoints;
	/* index[b]: the first point whose hash has top bits >= b */
	for (uint32_t b = 0; b <= FERRY_RING_INDEX; b++) {
		while (p < m->npoints && (m->ring[p] >> (64 - FERRY_RING_INDEX_BITS)) < b)
			p++;
		m->index[b] = p;
	}
	return 0;
}

uint32_t ferry__placement_ring(const struct ferry_placement_map *m, uint64_t key)
{
	uint64_t h = ferry__hash64(key + 0x9e3779b97f4a7c15ull);
	uint32_t b = (uint32_t)(h >> (64 - FERRY_RING_INDEX_BITS));
	uint32_t lo = m->index[b], hi = m->index[b + 1];

	while (lo < hi) { /* first point with hash >= h, within h's index bucket */
		uint32_t mid = lo + (hi - lo) / 2;

		if (m->ring[mid] < h)
			lo = mid + 1;
		else
			hi = mid;
	}
	return m->ring_rank[lo == m->npoints ? 0 : lo];
}

void ferry__placement_fini(struct ferry_placement_map *m)
{
	free(m->ring);
	free(m->ring_rank);
	free(m->index);
	m->ring = NULL;
	m->ring_rank = NULL;
	m->index = NULL;
}

void ferry__placement_range_of(const struct ferry_placement_map *m, uint32_t rank, uint64_t *lo,
			       uint64_t *n)
{
	/* home(k) = floor(k world / N): rank r holds ceil(r N / world) .. */
	unsigned __int128 a = ((unsigned __int128)rank * m->num_keys + m->world - 1) / m->world;
	unsigned __int128 b =
		((unsigned __int128)(rank + 1) * m->num_keys + m->world - 1) / m->world;

	*lo = (uint64_t)a;
	*n = (uint64_t)(b - a);
}

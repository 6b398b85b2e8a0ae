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
	struct ring_point *ring;
	size_t npoints;

	m->num_keys = num_keys;
	m->world = world;
	m->kind = kind;
	m->home = NULL;
	if (!world || world > 65535 || !num_keys || (kind == FERRY_PLACEMENT_HASH && !vnodes))
		return -EINVAL;
	if (kind == FERRY_PLACEMENT_RANGE)
		return 0;
	if (kind != FERRY_PLACEMENT_HASH)
		return -EINVAL;

	npoints = (size_t)world * vnodes;
	ring = malloc(npoints * sizeof(*ring));
	m->home = malloc(num_keys * sizeof(*m->home));
	if (!ring || !m->home) {
		free(ring);
		free(m->home);
		m->home = NULL;
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < world; r++)
		for (uint32_t v = 0; v < vnodes; v++) {
			struct ring_point *p = &ring[(size_t)r * vnodes + v];

			p->hash = ferry__hash64(((uint64_t)r << 32 | v) ^ 0x5a17f3e29b4c6d01ull);
			p->rank = r;
		}
	qsort(ring, npoints, sizeof(*ring), ring_cmp);
	for (uint64_t k = 0; k < num_keys; k++) {
		uint64_t h = ferry__hash64(k + 0x9e3779b97f4a7c15ull);
		size_t lo = 0, hi = npoints;

		while (lo < hi) { /* first point with hash >= h */
			size_t mid = (lo + hi) / 2;

			if (ring[mid].hash < h)
				lo = mid + 1;
			else
				hi = mid;
		}
		m->home[k] = (uint16_t)ring[lo == npoints ? 0 : lo].rank;
	}
	free(ring);
	return 0;
}

void ferry__placement_fini(struct ferry_placement_map *m)
{
	free(m->home);
	m->home = NULL;
}

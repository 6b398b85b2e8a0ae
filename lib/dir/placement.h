/* SPDX-License-Identifier: MIT */
/*
 * placement.h - which node is a key's home.
 *
 * Range: node r is home of the r-th of N contiguous blocks, whose sizes differ
 * by at most one key. Hash: a consistent-hash ring with V virtual nodes per
 * node; a key's home is the node of the first point at or after the key's
 * hash. The ring is resolved once per key at table creation into a dense
 * array, so a lookup is one load either way.
 */
#ifndef FERRY_LIB_PLACEMENT_H
#define FERRY_LIB_PLACEMENT_H

#include <stdint.h>

struct ferry_placement_map {
	uint64_t num_keys;
	uint32_t world;
	uint32_t kind;	/* enum ferry_placement */
	uint16_t *home; /* hash: per key; NULL for range */
};

/* Return: 0, -EINVAL (world 0 or above 65535, no keys), -ENOMEM. */
int ferry__placement_init(struct ferry_placement_map *m, uint32_t kind, uint64_t num_keys,
			  uint32_t world, uint32_t vnodes);
void ferry__placement_fini(struct ferry_placement_map *m);

static inline uint32_t ferry__placement_home(const struct ferry_placement_map *m, uint64_t key)
{
	if (m->home)
		return m->home[key];
	return (uint32_t)(((unsigned __int128)key * m->world) / m->num_keys);
}

/* 64-bit mixer (splitmix64 finalizer) */
static inline uint64_t ferry__hash64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

#endif

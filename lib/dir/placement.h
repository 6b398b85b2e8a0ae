/* SPDX-License-Identifier: MIT */
/*
 * placement.h - which node is a key's home.
 *
 * Range: node r is home of the r-th of N contiguous blocks, whose sizes differ
 * by at most one key; a sparse table (num_keys 0) splits the whole 64-bit
 * space the same way. Hash: a consistent-hash ring with V virtual nodes per
 * node; a key's home is the node of the first point at or after the key's
 * hash. The ring (12 bytes per point: world x V points) has an index over
 * the top FERRY_RING_INDEX_BITS bits of the hash, so a lookup is a short
 * binary search inside one bucket. Nothing here grows with the keys.
 */
#ifndef FERRY_LIB_PLACEMENT_H
#define FERRY_LIB_PLACEMENT_H

#include <stdint.h>

#define FERRY_RING_INDEX_BITS 12
#define FERRY_RING_INDEX (1u << FERRY_RING_INDEX_BITS)

struct ferry_placement_map {
	uint64_t num_keys; /* 0: the whole 64-bit space */
	uint32_t world;
	uint32_t kind;	     /* enum ferry_placement */
	uint32_t npoints;    /* hash: points on the ring */
	uint64_t *ring;	     /* hash: the points' hashes, sorted */
	uint16_t *ring_rank; /* hash: each point's node */
	uint32_t *index;     /* hash: FERRY_RING_INDEX + 1 first points */
};

/* Return: 0, -EINVAL (world 0 or above 65535, no vnodes), -ENOMEM. */
int ferry__placement_init(struct ferry_placement_map *m, uint32_t kind, uint64_t num_keys,
			  uint32_t world, uint32_t vnodes);
void ferry__placement_fini(struct ferry_placement_map *m);

/* the ring's answer for @key (hash placement) */
uint32_t ferry__placement_ring(const struct ferry_placement_map *m, uint64_t key);

/* range placement of a dense table: rank's keys are [*lo, *lo + *n) */
void ferry__placement_range_of(const struct ferry_placement_map *m, uint32_t rank, uint64_t *lo,
			       uint64_t *n);

static inline uint32_t ferry__placement_home(const struct ferry_placement_map *m, uint64_t key)
{
	if (m->ring)
		return ferry__placement_ring(m, key);
	if (!m->num_keys)
		return (uint32_t)(((unsigned __int128)key * m->world) >> 64);
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

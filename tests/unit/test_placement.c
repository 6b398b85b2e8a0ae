/* SPDX-License-Identifier: MIT */
/*
 * test_placement.c - which node is a key's home.
 *
 * Range placement must be exact (blocks differ by at most one key, in rank
 * order); the hash ring must be even enough and consistent: a node that
 * joins takes keys only for itself, about 1/(world+1) of them.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "ferry/ferry.h"
#include "common/cluster.h"
#include "lib/dir/placement.h"

/* ---- range --------------------------------------------------------------- */

static void check_range(uint64_t n, uint32_t world)
{
	struct ferry_placement_map m;
	uint64_t *count = calloc(world, sizeof(*count));
	uint64_t lo = n / world, hi = (n + world - 1) / world;
	uint32_t prev = 0;

	cr_assert_not_null(count);
	cr_assert_eq(ferry__placement_init(&m, FERRY_PLACEMENT_RANGE, n, world, 0), 0,
		     "range n=%llu world=%u refused", (unsigned long long)n, world);
	cr_assert_eq(ferry__placement_home(&m, 0), 0, "n=%llu world=%u: key 0 not on rank 0",
		     (unsigned long long)n, world);
	for (uint64_t k = 0; k < n; k++) {
		uint32_t h = ferry__placement_home(&m, k);

		cr_assert_lt(h, world, "n=%llu world=%u: key %llu -> rank %u",
			     (unsigned long long)n, world, (unsigned long long)k, h);
		/* non-decreasing: each rank's keys are one block, in rank order */
		cr_assert_geq(h, prev, "n=%llu world=%u: key %llu -> rank %u after rank %u",
			      (unsigned long long)n, world, (unsigned long long)k, h, prev);
		prev = h;
		count[h]++;
	}
	for (uint32_t r = 0; r < world; r++)
		cr_assert(count[r] == lo || count[r] == hi,
			  "n=%llu world=%u: rank %u has %llu keys, not %llu or %llu",
			  (unsigned long long)n, world, r, (unsigned long long)count[r],
			  (unsigned long long)lo, (unsigned long long)hi);
	if (n >= world)
		cr_assert_eq(prev, world - 1, "n=%llu world=%u: the last key is on rank %u",
			     (unsigned long long)n, world, prev);
	ferry__placement_fini(&m);
	free(count);
}

Test(placement, range_blocks_are_exact)
{
	static const struct {
		uint64_t n;
		uint32_t world;
	} c[] = {
		{ 1, 1 },	  { 100, 1 },	    { 100, 4 },	   { 1000, 3 }, { 1000, 7 },
		{ 10, 3 },	  { 11, 4 },	    { 7, 7 },	   { 8, 7 },	{ 1000003, 16 },
		{ 65535, 65535 }, { 65536, 65535 }, { 999, 1000 },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
		check_range(c[i].n, c[i].world);
}

Test(placement, range_with_fewer_keys_than_nodes_gives_blocks_of_0_or_1)
{
	static const struct {
		uint64_t n;
		uint32_t world;
	} c[] = { { 1, 2 }, { 1, 65535 }, { 3, 5 }, { 2, 7 }, { 5, 8 }, { 100, 65535 } };

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct ferry_placement_map m;

		check_range(c[i].n, c[i].world);
		/* and no two keys share a node */
		cr_assert_eq(
			ferry__placement_init(&m, FERRY_PLACEMENT_RANGE, c[i].n, c[i].world, 0), 0);
		for (uint64_t k = 1; k < c[i].n; k++)
			cr_assert_gt(ferry__placement_home(&m, k),
				     ferry__placement_home(&m, k - 1));
		ferry__placement_fini(&m);
	}
}

Test(placement, range_with_huge_key_space_does_not_overflow)
{
	static const uint64_t ns[] = { 1ull << 40, UINT64_MAX / 3, UINT64_MAX };

	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
		struct ferry_placement_map m;
		uint64_t n = ns[i];
		uint32_t world = 65535;

		cr_assert_eq(ferry__placement_init(&m, FERRY_PLACEMENT_RANGE, n, world, 0), 0);
		cr_assert_eq(ferry__placement_home(&m, 0), 0);
		cr_assert_eq(ferry__placement_home(&m, n - 1), world - 1, "n=%llu: last key on %u",
			     (unsigned long long)n, ferry__placement_home(&m, n - 1));
		/* the first key of rank r's block: ceil(r * n / world) */
		for (uint32_t r = 1; r < world; r += 4099) {
			unsigned __int128 first = ((unsigned __int128)r * n + world - 1) / world;

			cr_assert_eq(ferry__placement_home(&m, (uint64_t)first), r);
			cr_assert_eq(ferry__placement_home(&m, (uint64_t)first - 1), r - 1);
		}
		ferry__placement_fini(&m);
	}
}

/* ---- hash ring ----------------------------------------------------------- */

#define RING_KEYS 1000000ull

/* keys per node for @world nodes and @vnodes points each */
static void ring_shares(uint32_t world, uint32_t vnodes, uint64_t *count)
{
	struct ferry_placement_map m;

	cr_assert_eq(ferry__placement_init(&m, FERRY_PLACEMENT_HASH, RING_KEYS, world, vnodes), 0);
	for (uint32_t r = 0; r < world; r++)
		count[r] = 0;
	for (uint64_t k = 0; k < RING_KEYS; k++) {
		uint32_t h = ferry__placement_home(&m, k);

		cr_assert_lt(h, world, "key %llu -> rank %u", (unsigned long long)k, h);
		count[h]++;
	}
	ferry__placement_fini(&m);
}

Test(placement, hash_ring_with_default_vnodes_is_within_10_percent_of_even)
{
	const uint32_t world = 4, vnodes = 1024; /* ferry_table_params' default */
	const double even = (double)RING_KEYS / world;
	uint64_t count[4];
	int bad = 0;

	ring_shares(world, vnodes, count);
	for (uint32_t r = 0; r < world; r++) {
		double share = count[r] / even;

		cr_log_info("rank %u: %llu keys (%.4f of even)", r, (unsigned long long)count[r],
			    share);
		bad |= share < 0.9 || share > 1.1;
	}
	cr_assert_not(bad,
		      "256 vnodes, 4 nodes, 1M keys: shares %.4f %.4f %.4f %.4f of even; want each "
		      "within [0.9, 1.1]",
		      count[0] / even, count[1] / even, count[2] / even, count[3] / even);
}

Test(placement, hash_ring_is_deterministic)
{
	struct ferry_placement_map a, b;

	cr_assert_eq(ferry__placement_init(&a, FERRY_PLACEMENT_HASH, 100000, 5, 64), 0);
	cr_assert_eq(ferry__placement_init(&b, FERRY_PLACEMENT_HASH, 100000, 5, 64), 0);
	for (uint64_t k = 0; k < 100000; k++)
		cr_assert_eq(ferry__placement_home(&a, k), ferry__placement_home(&b, k),
			     "key %llu placed differently by two inits", (unsigned long long)k);
	ferry__placement_fini(&a);
	ferry__placement_fini(&b);
}

Test(placement, hash_ring_adding_a_node_moves_only_its_share_to_it)
{
	struct ferry_placement_map m4, m5;
	uint64_t moved = 0;
	double frac;

	cr_assert_eq(ferry__placement_init(&m4, FERRY_PLACEMENT_HASH, RING_KEYS, 4, 256), 0);
	cr_assert_eq(ferry__placement_init(&m5, FERRY_PLACEMENT_HASH, RING_KEYS, 5, 256), 0);
	for (uint64_t k = 0; k < RING_KEYS; k++) {
		uint32_t before = ferry__placement_home(&m4, k);
		uint32_t after = ferry__placement_home(&m5, k);

		if (before == after)
			continue;
		cr_assert_eq(after, 4,
			     "key %llu moved from rank %u to old rank %u, not the new one",
			     (unsigned long long)k, before, after);
		moved++;
	}
	frac = (double)moved / RING_KEYS;
	cr_log_info("4 -> 5 nodes: %.4f of the keys moved", frac);
	cr_assert(frac >= 0.10 && frac <= 0.30, "adding a 5th node moved %.4f of the keys", frac);
	ferry__placement_fini(&m4);
	ferry__placement_fini(&m5);
}

Test(placement, hash_ring_single_node_owns_everything)
{
	struct ferry_placement_map m;

	cr_assert_eq(ferry__placement_init(&m, FERRY_PLACEMENT_HASH, 1000, 1, 256), 0);
	for (uint64_t k = 0; k < 1000; k++)
		cr_assert_eq(ferry__placement_home(&m, k), 0);
	ferry__placement_fini(&m);
}

/* ---- invalid arguments --------------------------------------------------- */

Test(placement, invalid_arguments_are_einval)
{
	static const uint32_t kinds[] = { FERRY_PLACEMENT_RANGE, FERRY_PLACEMENT_HASH };

	for (size_t i = 0; i < 2; i++) {
		struct ferry_placement_map m;
		uint32_t kind = kinds[i];

		cr_assert_eq(ferry__placement_init(&m, kind, 100, 0, 256), -EINVAL,
			     "kind %u: world 0 accepted", kind);
		cr_assert_null(m.ring);
		cr_assert_eq(ferry__placement_init(&m, kind, 100, 65536, 256), -EINVAL,
			     "kind %u: world 65536 accepted", kind);
		cr_assert_null(m.ring);
		/* the largest world is fine */
		cr_assert_eq(ferry__placement_init(&m, kind, 10, 65535, 1), 0,
			     "kind %u: world 65535 refused", kind);
		ferry__placement_fini(&m);
	}
	{
		struct ferry_placement_map m;

		/* a ring without points has no home for any key (it used to read
		 * past a zero-length ring); range placement ignores vnodes */
		cr_assert_eq(ferry__placement_init(&m, FERRY_PLACEMENT_HASH, 100, 4, 0), -EINVAL,
			     "a hash ring with 0 vnodes was accepted");
		cr_assert_null(m.ring);
		cr_assert_eq(ferry__placement_init(&m, FERRY_PLACEMENT_RANGE, 100, 4, 0), 0);
		ferry__placement_fini(&m);
		cr_assert_eq(ferry__placement_init(&m, 7, 100, 4, 256), -EINVAL,
			     "an unknown placement kind was accepted");
		cr_assert_null(m.ring);
	}
}

/* ---- sparse tables: the whole 64-bit space --------------------------------- */

/* num_keys 0: range blocks over 2^64 keys, and the ring, both balanced and
 * holding nothing per key */
Test(placement, sparse_keys_spread_over_every_node)
{
	static const uint32_t kinds[] = { FERRY_PLACEMENT_RANGE, FERRY_PLACEMENT_HASH };
	const uint32_t world = 5;

	for (size_t i = 0; i < 2; i++) {
		struct ferry_placement_map m;
		uint64_t count[5] = { 0 }, x = 0x243f6a8885a308d3ull;

		cr_assert_eq(ferry__placement_init(&m, kinds[i], 0, world, 256), 0);
		cr_assert_eq(ferry__placement_home(&m, 0),
			     kinds[i] == FERRY_PLACEMENT_RANGE ? 0 : ferry__placement_home(&m, 0));
		if (kinds[i] == FERRY_PLACEMENT_RANGE) {
			cr_assert_eq(ferry__placement_home(&m, UINT64_MAX), world - 1);
			cr_assert_eq(ferry__placement_home(&m, UINT64_MAX / world), 0);
			cr_assert_eq(ferry__placement_home(&m, UINT64_MAX / world + 1), 1);
		}
		for (int k = 0; k < 100000; k++) {
			uint32_t h;

			h = ferry__placement_home(&m, tc_rand(&x)); /* keys from the whole space */
			cr_assert_lt(h, world);
			count[h]++;
		}
		for (uint32_t r = 0; r < world; r++)
			cr_assert(count[r] > 100000 / world * 7 / 10 &&
					  count[r] < 100000 / world * 13 / 10,
				  "kind %u: rank %u is home of %llu of 100000 keys", kinds[i], r,
				  (unsigned long long)count[r]);
		ferry__placement_fini(&m);
	}
}

/* the ring's index gives the answer of a plain binary search over the ring */
Test(placement, the_ring_index_agrees_with_a_full_search)
{
	struct ferry_placement_map m;
	uint64_t x = 0x13198a2e03707344ull;

	cr_assert_eq(ferry__placement_init(&m, FERRY_PLACEMENT_HASH, 0, 7, 300), 0);
	for (int k = 0; k < 200000; k++) {
		uint64_t key = k < 100000 ? (uint64_t)k : tc_rand(&x);
		uint64_t h = ferry__hash64(key + 0x9e3779b97f4a7c15ull);
		uint32_t lo = 0, hi = m.npoints;

		while (lo < hi) {
			uint32_t mid = lo + (hi - lo) / 2;

			if (m.ring[mid] < h)
				lo = mid + 1;
			else
				hi = mid;
		}
		cr_assert_eq(ferry__placement_home(&m, key), m.ring_rank[lo == m.npoints ? 0 : lo],
			     "key %llu", (unsigned long long)key);
	}
	ferry__placement_fini(&m);
}

/* SPDX-License-Identifier: MIT */
/*
 * test_topk.c - the Misra-Gries counts hot_auto chooses from (lib/cons/
 * topk.c), against exact counts of the same stream.
 *
 * The guarantee checked: with cap counters over a stream of total accesses,
 * every key accessed more than total / (cap + 1) times has a counter, and
 * every counter is at most the key's true count and at least the true count
 * minus the cuts (which are at most total / (cap + 1)). The order of top():
 * most first, ties by the lower key. Decay halves, and drops what reaches 0.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/cluster.h"
#include "lib/cons/topk.h"

#define SPACE 5000

/* a skewed stream: key i drawn with weight about 1 / (i + 1) */
static uint64_t zipfish(uint64_t *seed)
{
	uint64_t r = tc_rand(seed) % 1000000 + 1;

	return (1000000 / r - 1) % SPACE;
}

static void check_stream(uint32_t cap, int weighted)
{
	struct ferry_topk s;
	uint64_t *exact = calloc(SPACE, sizeof(*exact)), total = 0, seed = 42 + cap;
	uint64_t *keys = malloc(cap * sizeof(*keys)), *cnts = malloc(cap * sizeof(*cnts));
	uint32_t n;

	cr_assert(exact && keys && cnts);
	cr_assert_eq(ferry__topk_init(&s, cap), 0);
	for (int i = 0; i < 200000; i++) {
		uint64_t k = zipfish(&seed), by = weighted ? 1 + tc_rand(&seed) % 4 : 1;

		ferry__topk_add(&s, k, by);
		exact[k] += by;
		total += by;
	}
	cr_assert_leq(s.n, cap, "%u counters for a cap of %u", s.n, cap);
	cr_assert_leq(s.cuts, total / (cap + 1), "cuts %llu above total/(cap+1) = %llu",
		      (unsigned long long)s.cuts, (unsigned long long)(total / (cap + 1)));
	n = ferry__topk_top(&s, cap, keys, cnts);
	cr_assert_eq(n, s.n);
	for (uint32_t i = 0; i < n; i++) {
		cr_assert_leq(cnts[i], exact[keys[i]], "key %llu counted %llu, true %llu",
			      (unsigned long long)keys[i], (unsigned long long)cnts[i],
			      (unsigned long long)exact[keys[i]]);
		cr_assert_geq(cnts[i] + s.cuts, exact[keys[i]], "key %llu counted too low",
			      (unsigned long long)keys[i]);
		if (i)
			cr_assert(cnts[i] < cnts[i - 1] ||
					  (cnts[i] == cnts[i - 1] && keys[i] > keys[i - 1]),
				  "top() out of order at %u", i);
	}
	/* every heavy key has a counter */
	for (uint64_t k = 0; k < SPACE; k++) {
		bool found = false;

		if (exact[k] <= total / (cap + 1))
			continue;
		for (uint32_t i = 0; i < n && !found; i++)
			found = keys[i] == k;
		cr_assert(found, "key %llu, %llu of %llu accesses, has no counter (cap %u)",
			  (unsigned long long)k, (unsigned long long)exact[k],
			  (unsigned long long)total, cap);
	}
	ferry__topk_fini(&s);
	free(exact);
	free(keys);
	free(cnts);
}

Test(topk, heavy_keys_are_kept_and_counts_are_bounded)
{
	check_stream(64, 0);
	check_stream(100, 0);
	check_stream(1024, 0);
	check_stream(64, 1);
}

Test(topk, top_orders_by_count_then_key_and_decay_halves)
{
	struct ferry_topk s;
	uint64_t keys[8], cnts[8];

	cr_assert_eq(ferry__topk_init(&s, 8), 0);
	ferry__topk_add(&s, 9, 4);
	ferry__topk_add(&s, 3, 4);
	ferry__topk_add(&s, 7, 10);
	ferry__topk_add(&s, 1, 1);
	cr_assert_eq(ferry__topk_top(&s, 3, keys, cnts), 3);
	cr_assert(keys[0] == 7 && cnts[0] == 10);
	cr_assert(keys[1] == 3 && keys[2] == 9, "ties: the lower key first");
	ferry__topk_decay(&s);
	cr_assert_eq(ferry__topk_top(&s, 8, keys, cnts), 3, "key 1 (count 1) should go");
	cr_assert(keys[0] == 7 && cnts[0] == 5 && cnts[1] == 2 && cnts[2] == 2);
	/* full: a new key lowers every counter by the least */
	for (uint64_t k = 100; k < 105; k++)
		ferry__topk_add(&s, k, 1);
	cr_assert_eq(s.n, 8);
	ferry__topk_add(&s, 200, 1);
	cr_assert_eq(ferry__topk_top(&s, 8, keys, cnts), 3, "the counters at 1 should go");
	cr_assert(keys[0] == 7 && cnts[0] == 4);
	ferry__topk_fini(&s);
	cr_assert_eq(ferry__topk_init(&s, 0), -EINVAL);
}

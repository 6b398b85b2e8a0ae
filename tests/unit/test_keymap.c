/* SPDX-License-Identifier: MIT */
/*
 * test_keymap.c - the directory's key -> word map (lib/dir/keymap.c, the
 * home's owner records): against a plain reference, through growth, churn
 * (tombstones) and shrinking, with keys from the whole 64-bit space (0 and
 * 2^64-1 too), and its memory within the bound keymap.h states. The map
 * of keys owned here, which lock-free readers use, is test_slotmap.c's.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include <urcu/urcu-memb.h>

#include "common/cluster.h"
#include "lib/dir/keymap.h"

Test(keymap, agrees_with_a_reference_through_growth_churn_and_shrinking)
{
	enum {
		N = 20000
	};
	uint64_t *keys = malloc(N * sizeof(*keys)), *vals = calloc(N, sizeof(*vals)),
		 s = 88172645463325252ull;
	struct ferry_keymap m;

	cr_assert(keys && vals);
	urcu_memb_register_thread();
	cr_assert_eq(ferry__keymap_init(&m), 0);
	for (int i = 0; i < N; i++)
		keys[i] = i == 0 ? 0 : i == 1 ? UINT64_MAX : tc_rand(&s);
	for (int round = 0; round < 6; round++) {
		for (int i = 0; i < N; i++) {
			uint64_t r = tc_rand(&s);

			if (r % 3 == 0) {
				ferry__keymap_del(&m, keys[i]);
				vals[i] = 0;
			} else {
				vals[i] = r | 1;
				if (vals[i] == FERRY_KEYMAP_TOMB)
					vals[i] = 3;
				cr_assert_eq(ferry__keymap_put(&m, keys[i], vals[i]), 0);
			}
		}
		for (int i = 0; i < N; i++)
			cr_assert_eq(ferry__keymap_get(&m, keys[i]), vals[i], "round %d key %d",
				     round, i);
	}
	{
		uint64_t live = 0;

		for (int i = 0; i < N; i++)
			live += vals[i] != 0;
		cr_assert_eq(ferry__keymap_count(&m), live);
		/* a map shrinks once live keys fall under 1/16 of its buckets:
		 * at most 16 x 16 B per live key, plus the header */
		cr_assert_leq(ferry__keymap_bytes(&m), live * 16 * 16 + 64,
			      "%llu bytes for %llu keys",
			      (unsigned long long)ferry__keymap_bytes(&m),
			      (unsigned long long)live);
	}
	/* emptied: it shrinks back to its floor */
	for (int i = 0; i < N; i++)
		ferry__keymap_del(&m, keys[i]);
	cr_assert_eq(ferry__keymap_count(&m), 0);
	cr_assert_leq(ferry__keymap_bytes(&m), FERRY_KEYMAP_MIN * 16 + 64);
	for (int i = 0; i < N; i++)
		cr_assert_eq(ferry__keymap_get(&m, keys[i]), 0);
	urcu_memb_barrier();
	ferry__keymap_fini(&m);
	urcu_memb_unregister_thread();
	free(keys);
	free(vals);
}

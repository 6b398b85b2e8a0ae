/* SPDX-License-Identifier: MIT */
/*
 * test_keymap.c - the directory's map (lib/dir/keymap.c) and the fast
 * path's read-side sections (lib/dir/fastrd.h).
 *
 * - against a plain reference, through growth, churn (tombstones) and
 *   shrinking, with keys from the whole 64-bit space (0 and 2^64-1 too);
 * - its memory: within the bound keymap.h states, per live key;
 * - readers that never lock (RCU readers and fast-path readers) against a
 *   writer that rebuilds the array again and again: a reader must find
 *   every key that is always there, with its value; under ASan (ci/test.sh)
 *   a read of a freed array fails the run.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <urcu/urcu-memb.h>

#include "common/cluster.h"
#include "lib/dir/fastrd.h"
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
	cr_assert_eq(ferry__keymap_init(&m, NULL), 0);
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

/* ---- readers that take no lock against a writer that rebuilds ------------- */

#define STABLE 512  /* always in the map */
#define CHURN 20000 /* put and deleted over and over: rebuilds both ways */
#define READERS 2

struct race {
	struct ferry_keymap m;
	struct ferry_fastrd *fast;
	int stop;
	long reads[READERS], misses[READERS], wrong[READERS];
};

static uint64_t stable_key(int i)
{
	return 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
}

static uint64_t stable_val(uint64_t key)
{
	return (key ^ 0x5555) | 1;
}

struct reader_arg {
	struct race *r;
	int id;
	int fast; /* 1: fast-path sections; 0: rcu_read_lock */
};

static void *reader(void *p)
{
	struct reader_arg *a = p;
	struct race *r = a->r;
	struct ferry_fastrd_cell *cell = &r->fast->cell[a->id];
	uint64_t s = 0x1234567ull + (uint64_t)a->id;

	urcu_memb_register_thread();
	while (!__atomic_load_n(&r->stop, __ATOMIC_RELAXED)) {
		for (int b = 0; b < 64; b++) {
			int i = (int)(tc_rand(&s) % STABLE);
			uint64_t key = stable_key(i), v;

			if (a->fast)
				ferry__fastrd_enter(cell);
			else
				urcu_memb_read_lock();
			v = ferry__keymap_get(&r->m, key);
			if (a->fast)
				ferry__fastrd_leave(cell);
			else
				urcu_memb_read_unlock();
			r->reads[a->id]++;
			if (!v)
				r->misses[a->id]++;
			else if (v != stable_val(key))
				r->wrong[a->id]++;
		}
	}
	urcu_memb_unregister_thread();
	return NULL;
}

Test(keymap, lockless_readers_see_every_stable_key_while_the_writer_rebuilds, .timeout = 120)
{
	struct race *r = calloc(1, sizeof(*r));
	struct reader_arg args[READERS];
	pthread_t th[READERS];
	uint64_t s = 99, rebuilds = 0, last = 0;
	static uint64_t churn[CHURN];

	cr_assert_not_null(r);
	r->fast = aligned_alloc(64, sizeof(*r->fast));
	cr_assert_not_null(r->fast);
	memset(r->fast, 0, sizeof(*r->fast));
	ferry__fastrd_init(r->fast);
	urcu_memb_register_thread();
	cr_assert_eq(ferry__keymap_init(&r->m, r->fast), 0);
	for (int i = 0; i < STABLE; i++)
		cr_assert_eq(ferry__keymap_put(&r->m, stable_key(i), stable_val(stable_key(i))), 0);
	for (int i = 0; i < READERS; i++) {
		args[i] = (struct reader_arg){ .r = r, .id = i, .fast = i % 2 == 0 };
		pthread_create(&th[i], NULL, reader, &args[i]);
	}
	for (int round = 0; round < 20; round++) {
		/* fill (the array doubles, several times), then empty (it halves) */
		for (int i = 0; i < CHURN; i++) {
			churn[i] = tc_rand(&s) | (1ull << 63);
			cr_assert_eq(ferry__keymap_put(&r->m, churn[i], 7), 0);
			if (ferry__keymap_bytes(&r->m) != last)
				rebuilds++;
			last = ferry__keymap_bytes(&r->m);
		}
		for (int i = 0; i < STABLE; i += 7) /* a stable key rewritten in place */
			cr_assert_eq(ferry__keymap_put(&r->m, stable_key(i),
						       stable_val(stable_key(i))),
				     0);
		for (int i = 0; i < CHURN; i++) {
			ferry__keymap_del(&r->m, churn[i]);
			if (ferry__keymap_bytes(&r->m) != last)
				rebuilds++;
			last = ferry__keymap_bytes(&r->m);
		}
	}
	cr_assert_geq(rebuilds, 20 * 4, "only %llu rebuilds", (unsigned long long)rebuilds);
	__atomic_store_n(&r->stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < READERS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < READERS; i++) {
		cr_assert_gt(r->reads[i], 1000, "reader %d read %ld times", i, r->reads[i]);
		cr_assert_eq(r->misses[i], 0, "reader %d (%s) missed a stable key %ld times in %ld",
			     i, args[i].fast ? "fast" : "rcu", r->misses[i], r->reads[i]);
		cr_assert_eq(r->wrong[i], 0, "reader %d read a wrong value %ld times", i,
			     r->wrong[i]);
	}
	cr_assert_eq(ferry__keymap_count(&r->m), STABLE);
	urcu_memb_barrier();
	ferry__keymap_fini(&r->m);
	urcu_memb_unregister_thread();
	free(r->fast);
	free(r);
}

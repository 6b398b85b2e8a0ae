/* SPDX-License-Identifier: MIT */
/*
 * test_slotmap.c - the map of keys owned here to their slots
 * (lib/dir/slotmap.c) and the fast path's read-side sections
 * (lib/dir/fastrd.h).
 *
 * - against a plain reference, through growth, churn (tombstones) and
 *   shrinking, with keys from the whole 64-bit space (0 and 2^64-1 too),
 *   many of them sharing a tag (the key is checked in the slot);
 * - its memory: within the bound slotmap.h states, per live key, shrinking
 *   and growing;
 * - readers that never lock (RCU readers and fast-path readers) against a
 *   writer that rebuilds the array again and again and reuses slots for
 *   other keys (unpublished first, as the map requires): a reader must
 *   find every key that is always there, in its own slot, and never be
 *   handed a slot that holds another key; under ASan (ci/test.sh) a read
 *   of a freed array fails the run.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <urcu/urcu-memb.h>

#include "common/cluster.h"
#include "lib/dir/fastrd.h"
#include "lib/dir/slotmap.h"

/* a slot as the arena lays it out: a header word, then the key */
struct tslot {
	uint64_t version;
	uint64_t key;
	uint64_t pad[2];
};

static void tslot_key(struct tslot *s, uint64_t key)
{
	__atomic_store_n(&s->key, key, __ATOMIC_RELAXED);
}

Test(slotmap, agrees_with_a_reference_through_growth_churn_and_shrinking)
{
	enum {
		N = 20000
	};
	struct tslot *slots = calloc(N, sizeof(*slots));
	uint64_t *keys = malloc(N * sizeof(*keys)), s = 88172645463325252ull;
	char *in = calloc(N, 1);
	struct ferry_slotmap m;

	cr_assert(keys && slots && in);
	urcu_memb_register_thread();
	cr_assert_eq(ferry__slotmap_init(&m, NULL), 0);
	ferry__slotmap_arena(&m, slots, sizeof(*slots), offsetof(struct tslot, key));
	for (int i = 0; i < N; i++) {
		keys[i] = i == 0 ? 0 : i == 1 ? UINT64_MAX : tc_rand(&s);
		tslot_key(&slots[i], keys[i]);
	}
	for (int round = 0; round < 6; round++) {
		for (int i = 0; i < N; i++) {
			if (tc_rand(&s) % 3 == 0) {
				ferry__slotmap_del(&m, keys[i]);
				in[i] = 0;
			} else {
				cr_assert_eq(ferry__slotmap_put(&m, keys[i], &slots[i]), 0);
				in[i] = 1;
			}
		}
		for (int i = 0; i < N; i++) {
			struct tslot *h = ferry__slotmap_hint(&m, keys[i]);

			cr_assert_eq(ferry__slotmap_get(&m, keys[i]), in[i] ? &slots[i] : NULL,
				     "round %d key %d", round, i);
			/* the fast path's guess, read from the map alone: the
			 * right slot for a live key (these keys' tags differ),
			 * and never a slot holding a deleted one */
			if (in[i])
				cr_assert_eq(h, &slots[i], "round %d key %d", round, i);
			else
				cr_assert(!h || h->key != keys[i], "round %d key %d", round, i);
		}
	}
	{
		uint64_t live = 0, seen = 0;

		for (int i = 0; i < N; i++)
			live += in[i];
		cr_assert_eq(ferry__slotmap_count(&m), live);
		/* shrinks once live keys fall under 1/16 of its buckets: at
		 * most 16 x 8 B per live key, plus the header */
		cr_assert_leq(ferry__slotmap_bytes(&m), live * 16 * 8 + 64,
			      "%llu bytes for %llu keys",
			      (unsigned long long)ferry__slotmap_bytes(&m),
			      (unsigned long long)live);
		for (int i = 0; i < N; i++)
			seen += in[i] && ferry__slotmap_get(&m, keys[i]) == &slots[i];
		cr_assert_eq(seen, live);
	}
	/* emptied: back to its floor */
	for (int i = 0; i < N; i++)
		ferry__slotmap_del(&m, keys[i]);
	cr_assert_eq(ferry__slotmap_count(&m), 0);
	cr_assert_leq(ferry__slotmap_bytes(&m), FERRY_SLOTMAP_MIN * 8 + 64);
	for (int i = 0; i < N; i++)
		cr_assert_null(ferry__slotmap_get(&m, keys[i]));
	urcu_memb_barrier();
	ferry__slotmap_fini(&m);
	urcu_memb_unregister_thread();
	free(keys);
	free(slots);
	free(in);
}

/* a map that grows keeps 16 to 22 bytes per live key (slotmap.h): its array
 * grows by 4/3, not 2, so it is never under 3/8 full once past its floor */
Test(slotmap, a_growing_map_stays_within_22_bytes_per_key)
{
	enum {
		N = 300000
	};
	struct tslot *slots = calloc(N, sizeof(*slots));
	struct ferry_slotmap m;
	uint64_t s = 2463534242ull, rebuilds = 0, last = 0;

	cr_assert(slots);
	urcu_memb_register_thread();
	cr_assert_eq(ferry__slotmap_init(&m, NULL), 0);
	ferry__slotmap_arena(&m, slots, sizeof(*slots), offsetof(struct tslot, key));
	for (uint64_t i = 0; i < N; i++) {
		/* half in runs of sequential keys, half spread */
		tslot_key(&slots[i], i % 2 ? tc_rand(&s) : 1000000 + i);
		cr_assert_eq(ferry__slotmap_put(&m, slots[i].key, &slots[i]), 0);
		if (ferry__slotmap_bytes(&m) != last) {
			last = ferry__slotmap_bytes(&m);
			rebuilds++;
		}
		/* past the small maps' rule (keymap.h, FERRY_MAP_FINE) */
		if (i + 1 > FERRY_MAP_FINE * 3 / 4)
			cr_assert_leq(last, (i + 1) * 22 + 128, "%llu bytes for %llu keys",
				      (unsigned long long)last, (unsigned long long)(i + 1));
	}
	for (uint64_t i = 0; i < N; i++)
		cr_assert_eq(ferry__slotmap_get(&m, slots[i].key), &slots[i], "key %llu",
			     (unsigned long long)i);
	/* x4 to 98,304 buckets, then x4/3 to 300,000 keys: about 10 rebuilds */
	cr_assert_leq(rebuilds, 16, "%llu rebuilds", (unsigned long long)rebuilds);
	urcu_memb_barrier();
	ferry__slotmap_fini(&m);
	urcu_memb_unregister_thread();
	free(slots);
}

Test(slotmap, a_run_of_four_keys_and_a_moved_key_are_told_apart)
{
	struct tslot slots[8] = { 0 };
	struct ferry_slotmap m;

	urcu_memb_register_thread();
	cr_assert_eq(ferry__slotmap_init(&m, NULL), 0);
	ferry__slotmap_arena(&m, slots, sizeof(slots[0]), offsetof(struct tslot, key));
	/* keys 40..43 share their hash's high half: the tags must differ */
	for (int i = 0; i < 4; i++) {
		tslot_key(&slots[i], 40 + i);
		cr_assert_eq(ferry__slotmap_put(&m, 40 + i, &slots[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		cr_assert_eq(ferry__slotmap_get(&m, 40 + i), &slots[i]);
	/* a key republished in another slot: the map follows */
	tslot_key(&slots[5], 41);
	cr_assert_eq(ferry__slotmap_put(&m, 41, &slots[5]), 0);
	cr_assert_eq(ferry__slotmap_get(&m, 41), &slots[5]);
	cr_assert_eq(ferry__slotmap_count(&m), 4);
	/* a slot that no longer holds the key is not handed out for it */
	tslot_key(&slots[2], 99);
	cr_assert_null(ferry__slotmap_get(&m, 42));
	urcu_memb_barrier();
	ferry__slotmap_fini(&m);
	urcu_memb_unregister_thread();
}

/* ---- readers that take no lock against a writer that rebuilds ------------- */

#define STABLE 512  /* always in the map */
#define CHURN 20000 /* put and deleted over and over: rebuilds both ways */
#define READERS 2

struct race {
	struct ferry_slotmap m;
	struct ferry_fastrd *fast;
	struct tslot *slots; /* [0, STABLE): the stable keys'; then churn slots */
	int stop;
	long reads[READERS], misses[READERS], wrong[READERS];
};

static uint64_t stable_key(int i)
{
	return 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
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
			uint64_t key = stable_key(i);
			struct tslot *v;

			if (a->fast)
				ferry__fastrd_enter(cell);
			else
				urcu_memb_read_lock();
			v = ferry__slotmap_get(&r->m, key);
			if (a->fast)
				ferry__fastrd_leave(cell);
			else
				urcu_memb_read_unlock();
			r->reads[a->id]++;
			if (!v)
				r->misses[a->id]++;
			else if (v != &r->slots[i] ||
				 __atomic_load_n(&v->key, __ATOMIC_RELAXED) != key)
				r->wrong[a->id]++;
		}
	}
	urcu_memb_unregister_thread();
	return NULL;
}

Test(slotmap, lockless_readers_see_every_stable_key_while_the_writer_rebuilds, .timeout = 120)
{
	struct race *r = calloc(1, sizeof(*r));
	struct reader_arg args[READERS];
	pthread_t th[READERS];
	uint64_t s = 99, rebuilds = 0, last = 0;
	static uint64_t churn[CHURN];

	cr_assert_not_null(r);
	r->slots = calloc(STABLE + CHURN, sizeof(*r->slots));
	r->fast = aligned_alloc(64, sizeof(*r->fast));
	cr_assert(r->slots && r->fast);
	memset(r->fast, 0, sizeof(*r->fast));
	ferry__fastrd_init(r->fast);
	urcu_memb_register_thread();
	cr_assert_eq(ferry__slotmap_init(&r->m, r->fast), 0);
	ferry__slotmap_arena(&r->m, r->slots, sizeof(*r->slots), offsetof(struct tslot, key));
	for (int i = 0; i < STABLE; i++) {
		tslot_key(&r->slots[i], stable_key(i));
		cr_assert_eq(ferry__slotmap_put(&r->m, stable_key(i), &r->slots[i]), 0);
	}
	for (int i = 0; i < READERS; i++) {
		args[i] = (struct reader_arg){ .r = r, .id = i, .fast = i % 2 == 0 };
		pthread_create(&th[i], NULL, reader, &args[i]);
	}
	for (int round = 0; round < 20; round++) {
		/* fill (the array doubles, several times), then empty (it halves);
		 * each round reuses the churn slots for new keys, as an arena
		 * reuses freed slots */
		for (int i = 0; i < CHURN; i++) {
			struct tslot *sl = &r->slots[STABLE + i];

			churn[i] = tc_rand(&s) | (1ull << 63);
			tslot_key(sl, churn[i]);
			cr_assert_eq(ferry__slotmap_put(&r->m, churn[i], sl), 0);
			if (ferry__slotmap_bytes(&r->m) != last)
				rebuilds++;
			last = ferry__slotmap_bytes(&r->m);
		}
		for (int i = 0; i < STABLE; i += 7) /* a stable key republished in place */
			cr_assert_eq(ferry__slotmap_put(&r->m, stable_key(i), &r->slots[i]), 0);
		for (int i = 0; i < CHURN; i++) {
			ferry__slotmap_del(&r->m, churn[i]);
			if (ferry__slotmap_bytes(&r->m) != last)
				rebuilds++;
			last = ferry__slotmap_bytes(&r->m);
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
		cr_assert_eq(r->wrong[i], 0, "reader %d was handed a wrong slot %ld times", i,
			     r->wrong[i]);
	}
	cr_assert_eq(ferry__slotmap_count(&r->m), STABLE);
	urcu_memb_barrier();
	ferry__slotmap_fini(&r->m);
	urcu_memb_unregister_thread();
	free(r->fast);
	free(r->slots);
	free(r);
}

/* SPDX-License-Identifier: MIT */
/*
 * slotmap.c - the map of keys owned here to their slots (see slotmap.h for
 * the contract, the reader/writer protocol and the size bound).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/dir/fastrd.h"
#include "lib/dir/slotmap.h"

static struct ferry_slotmap_arr *slotmap_arr_new(uint64_t buckets)
{
	struct ferry_slotmap_arr *a =
		ferry__map_arr_new(sizeof(struct ferry_slotmap_arr) + buckets * sizeof(uint64_t));

	if (a)
		a->nb = buckets;
	return a;
}

static uint64_t slotmap_arr_bytes(const struct ferry_slotmap_arr *a)
{
	return sizeof(*a) + a->nb * sizeof(uint64_t);
}

int ferry__slotmap_init(struct ferry_slotmap *m, const struct ferry_fastrd *fast)
{
	memset(m, 0, sizeof(*m));
	m->fast = fast;
	m->arr = slotmap_arr_new(FERRY_SLOTMAP_MIN);
	m->bytes = m->arr ? slotmap_arr_bytes(m->arr) : 0;
	return m->arr ? 0 : -ENOMEM;
}

void ferry__slotmap_arena(struct ferry_slotmap *m, const void *base, uint64_t stride,
			  uint64_t key_off)
{
	m->base = base;
	m->stride = stride;
	m->key_off = key_off;
}

void ferry__slotmap_fini(struct ferry_slotmap *m)
{
	if (m->arr)
		ferry__map_arr_free(m->arr, slotmap_arr_bytes(m->arr));
	m->arr = NULL;
}

/*
 * The old array, replaced already: freed after an RCU grace period
 * (readers under rcu_read_lock) and after every fast-path section that may
 * hold it ended (fastrd.h). The callback makes the membarrier and waits,
 * off the writer's path (a writer that rebuilt and waited itself made a
 * batch localize of 1000 keys 30% slower: one system call per rebuild).
 */
static void slotmap_arr_free_rcu(struct rcu_head *head)
{
	struct ferry_slotmap_arr *a = caa_container_of(head, struct ferry_slotmap_arr, rcu);

	if (a->fast)
		ferry__fastrd_wait(a->fast, a->retired);
	ferry__map_arr_free(a, slotmap_arr_bytes(a));
}

static uint64_t slotmap_key(const struct ferry_slotmap *m, uint64_t w)
{
	return __atomic_load_n((const uint64_t *)(ferry__slotmap_slot(m, w) + m->key_off),
			       __ATOMIC_RELAXED);
}

static uint64_t slotmap_word(const struct ferry_slotmap *m, uint64_t key, uint64_t h,
			     const void *slot)
{
	uint64_t idx = (uint64_t)((const uint8_t *)slot - m->base) / m->stride;

	return (uint64_t)ferry__slotmap_tag(h, key) << 32 | (idx + 1);
}

/*
 * A rebuild reads every live key from its slot, a cache miss each in a big
 * map (a batch localize into a map of 150,000 keys spent 12 ms in one
 * rebuild, 72% of it on that load), and writes a random bucket of the new
 * array, another. So it runs as a pipeline: a live bucket's slot is
 * prefetched, REBUILD_AHEAD buckets later its key is read and its new
 * bucket prefetched, and REBUILD_AHEAD after that it is placed. Any order
 * of placing gives a valid map. Bound: 2 x REBUILD_AHEAD words on the
 * stack.
 */
#define REBUILD_AHEAD 16

struct rebuild_pipe {
	uint64_t w[REBUILD_AHEAD];   /* stage 1: slot prefetched */
	uint64_t w2[REBUILD_AHEAD];  /* stage 2: new bucket prefetched */
	uint64_t at2[REBUILD_AHEAD]; /* stage 2: its first bucket */
	unsigned n1, n2, h1, h2;     /* counts and heads of both rings */
};

static void rebuild_place(struct ferry_slotmap_arr *a, uint64_t w, uint64_t j)
{
	for (; a->e[j]; j = ferry__map_next(j, a->nb))
		;
	a->e[j] = w; /* the tag came from the same hash */
}

/* move stage 1's oldest entry to stage 2 (placing stage 2's oldest when full) */
static void rebuild_step2(const struct ferry_slotmap *m, struct ferry_slotmap_arr *a,
			  struct rebuild_pipe *p)
{
	uint64_t w = p->w[p->h1], j;

	p->h1 = (p->h1 + 1) % REBUILD_AHEAD;
	p->n1--;
	j = ferry__map_first(ferry__keymap_hash(slotmap_key(m, w)), a->nb);
	__builtin_prefetch(&a->e[j], 1);
	if (p->n2 == REBUILD_AHEAD) {
		rebuild_place(a, p->w2[p->h2], p->at2[p->h2]);
		p->h2 = (p->h2 + 1) % REBUILD_AHEAD;
		p->n2--;
	}
	p->w2[(p->h2 + p->n2) % REBUILD_AHEAD] = w;
	p->at2[(p->h2 + p->n2) % REBUILD_AHEAD] = j;
	p->n2++;
}

/* a new array for the live keys, each rehashed from its slot's key.
 * Return: 0 or -ENOMEM (nothing changed) */
static int slotmap_rebuild(struct ferry_slotmap *m, uint64_t buckets)
{
	struct ferry_slotmap_arr *old = m->arr, *a = slotmap_arr_new(buckets);
	struct rebuild_pipe p = { .n1 = 0 };

	if (!a)
		return -ENOMEM;
	for (uint64_t i = 0; i < old->nb; i++) {
		uint64_t w = old->e[i];

		if (!(uint32_t)w)
			continue; /* empty or tombstone */
		__builtin_prefetch(ferry__slotmap_slot(m, w) + m->key_off);
		if (p.n1 == REBUILD_AHEAD)
			rebuild_step2(m, a, &p);
		p.w[(p.h1 + p.n1) % REBUILD_AHEAD] = w;
		p.n1++;
	}
	while (p.n1)
		rebuild_step2(m, a, &p);
	for (; p.n2; p.n2--, p.h2 = (p.h2 + 1) % REBUILD_AHEAD)
		rebuild_place(a, p.w2[p.h2], p.at2[p.h2]);
	__atomic_store_n(&m->arr, a, __ATOMIC_RELEASE); /* rcu_assign_pointer */
	__atomic_store_n(&m->bytes, slotmap_arr_bytes(a), __ATOMIC_RELAXED);
	m->used = m->n;
	old->fast = m->fast;
	if (old->fast)
		old->retired = ferry__fastrd_retire();
	urcu_memb_call_rcu(&old->rcu, slotmap_arr_free_rcu);
	return 0;
}

int ferry__slotmap_put(struct ferry_slotmap *m, uint64_t key, const void *slot)
{
	struct ferry_slotmap_arr *a = m->arr;
	uint64_t h = ferry__keymap_hash(key), i = ferry__map_first(h, a->nb), tomb = UINT64_MAX;
	uint64_t w = slotmap_word(m, key, h, slot);
	uint32_t tag = ferry__slotmap_tag(h, key);

	for (;; i = ferry__map_next(i, a->nb)) {
		uint64_t e = a->e[i];

		if (!e)
			break;
		if (!(uint32_t)e) {
			if (tomb == UINT64_MAX)
				tomb = i; /* the first on the way: the chain stays as long */
			continue;
		}
		if ((uint32_t)(e >> 32) == tag && slotmap_key(m, e) == key) {
			__atomic_store_n(&a->e[i], w, __ATOMIC_RELEASE); /* readers: old or new */
			return 0;
		}
	}
	if (tomb != UINT64_MAX) {
		i = tomb;
	} else if ((m->used + 1) * 2 > a->nb) {
		if (!slotmap_rebuild(m, ferry__map_buckets_for(m->n + 1, FERRY_SLOTMAP_MIN))) {
			a = m->arr;
			for (i = ferry__map_first(h, a->nb); a->e[i]; i = ferry__map_next(i, a->nb))
				;
		} else if (m->used + 2 > a->nb) {
			return -ENOMEM; /* a probe needs an empty bucket to stop at */
		}
		m->used++;
	} else {
		m->used++;
	}
	__atomic_store_n(&a->e[i], w, __ATOMIC_RELEASE);
	__atomic_store_n(&m->n, m->n + 1, __ATOMIC_RELAXED);
	return 0;
}

void ferry__slotmap_del(struct ferry_slotmap *m, uint64_t key)
{
	struct ferry_slotmap_arr *a = m->arr;
	uint64_t h = ferry__keymap_hash(key), i = ferry__map_first(h, a->nb);
	uint32_t tag = ferry__slotmap_tag(h, key);

	for (;; i = ferry__map_next(i, a->nb)) {
		uint64_t e = a->e[i];

		if (!e)
			return;
		if (!(uint32_t)e || (uint32_t)(e >> 32) != tag || slotmap_key(m, e) != key)
			continue;
		__atomic_store_n(&m->n, m->n - 1, __ATOMIC_RELAXED);
		if (a->e[ferry__map_next(i, a->nb)]) {
			__atomic_store_n(&a->e[i], FERRY_SLOTMAP_TOMB, __ATOMIC_RELEASE);
			break;
		}
		/* the chain ends here: this bucket and the tombstones before it
		 * become empty (no key lies past them to lose) */
		do {
			__atomic_store_n(&a->e[i], 0, __ATOMIC_RELEASE);
			m->used--;
			i = ferry__map_prev(i, a->nb);
		} while (a->e[i] && !(uint32_t)a->e[i]);
		break;
	}
	if (a->nb > FERRY_SLOTMAP_MIN && m->n < a->nb / 16)
		(void)slotmap_rebuild(
			m,
			ferry__map_buckets_for(m->n, FERRY_SLOTMAP_MIN)); /* no memory: stay big */
}

uint64_t ferry__slotmap_bytes(const struct ferry_slotmap *m)
{
	return __atomic_load_n(&m->bytes, __ATOMIC_RELAXED);
}

uint64_t ferry__slotmap_count(const struct ferry_slotmap *m)
{
	return __atomic_load_n(&m->n, __ATOMIC_RELAXED);
}

void ferry__slotmap_each(const struct ferry_slotmap *m,
			 void (*fn)(void *arg, uint64_t key, void *slot), void *arg)
{
	const struct ferry_slotmap_arr *a = m->arr;

	for (uint64_t i = 0; a && i < a->nb; i++)
		if ((uint32_t)a->e[i])
			fn(arg, slotmap_key(m, a->e[i]), (void *)ferry__slotmap_slot(m, a->e[i]));
}

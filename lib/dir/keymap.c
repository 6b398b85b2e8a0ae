/* SPDX-License-Identifier: MIT */
/*
 * keymap.c - the directory's open-addressing map (see keymap.h for the
 * contract, the reader/writer protocol and the size bound).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "lib/dir/keymap.h"

void *ferry__map_arr_new(size_t bytes)
{
	void *a;

	/* written when made, never only zero-filled: a fresh page that is read
	 * first maps the zero page, and the first write then copies it and
	 * shoots down every CPU's TLB entry (an IPI per page); a probe reads
	 * before it writes. MAP_POPULATE faults a writable private mapping in
	 * for writing, in the kernel, without a trap per page. */
	if (bytes >= FERRY_MAP_MMAP_MIN) {
		a = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		return a == MAP_FAILED ? NULL : a;
	}
	a = malloc(bytes);
	if (a)
		memset(a, 0, bytes);
	return a;
}

void ferry__map_arr_free(void *arr, size_t bytes)
{
	if (!arr)
		return;
	if (bytes >= FERRY_MAP_MMAP_MIN)
		munmap(arr, bytes);
	else
		free(arr);
}

uint64_t ferry__map_buckets_for(uint64_t n, uint64_t min)
{
	uint64_t b = (n * 8 + 2) / 3;

	/* small maps grow 4 times what they hold, so that a batch that fills
	 * one from its floor rebuilds it once or twice, not at every third */
	if (b < FERRY_MAP_FINE)
		b = n * 4;
	b = (b + 7) & ~7ull;
	if (b >= 1ull << 34)
		b = (1ull << 34) - 8; /* ferry__map_first()'s bound: 128 GiB of buckets */
	return b < min ? min : b;
}

static struct ferry_keymap_arr *keymap_arr_new(uint64_t buckets)
{
	struct ferry_keymap_arr *a = ferry__map_arr_new(sizeof(struct ferry_keymap_arr) +
							buckets * sizeof(struct ferry_keymap_ent));

	if (a)
		a->nb = buckets;
	return a;
}

static uint64_t keymap_arr_bytes(const struct ferry_keymap_arr *a)
{
	return sizeof(*a) + a->nb * sizeof(struct ferry_keymap_ent);
}

int ferry__keymap_init(struct ferry_keymap *m)
{
	m->arr = keymap_arr_new(FERRY_KEYMAP_MIN);
	m->n = 0;
	m->used = 0;
	m->bytes = m->arr ? keymap_arr_bytes(m->arr) : 0;
	return m->arr ? 0 : -ENOMEM;
}

void ferry__keymap_fini(struct ferry_keymap *m)
{
	if (m->arr)
		ferry__map_arr_free(m->arr, keymap_arr_bytes(m->arr));
	m->arr = NULL;
}

/* the old array, replaced already: freed after an RCU grace period */
static void keymap_arr_free_rcu(struct rcu_head *head)
{
	struct ferry_keymap_arr *a = caa_container_of(head, struct ferry_keymap_arr, rcu);

	ferry__map_arr_free(a, keymap_arr_bytes(a));
}

/* into an unpublished array: no reader yet, plain stores */
static void keymap_fill(struct ferry_keymap_arr *a, uint64_t key, uint64_t val)
{
	uint64_t i = ferry__map_first(ferry__keymap_hash(key), a->nb);

	while (a->e[i].val)
		i = ferry__map_next(i, a->nb);
	a->e[i].key = key;
	a->e[i].val = val;
}

/* a new array for the live keys; Return: 0 or -ENOMEM (nothing changed) */
static int keymap_rebuild(struct ferry_keymap *m, uint64_t buckets)
{
	struct ferry_keymap_arr *old = m->arr, *a = keymap_arr_new(buckets);

	if (!a)
		return -ENOMEM;
	for (uint64_t i = 0; i < old->nb; i++)
		if (old->e[i].val && old->e[i].val != FERRY_KEYMAP_TOMB)
			keymap_fill(a, old->e[i].key, old->e[i].val);
	__atomic_store_n(&m->arr, a, __ATOMIC_RELEASE); /* rcu_assign_pointer */
	__atomic_store_n(&m->bytes, keymap_arr_bytes(a), __ATOMIC_RELAXED);
	m->used = m->n;
	urcu_memb_call_rcu(&old->rcu, keymap_arr_free_rcu);
	return 0;
}

int ferry__keymap_put(struct ferry_keymap *m, uint64_t key, uint64_t val)
{
	struct ferry_keymap_arr *a = m->arr;
	uint64_t i = ferry__map_first(ferry__keymap_hash(key), a->nb), tomb = UINT64_MAX;

	for (;;) {
		struct ferry_keymap_ent *e = &a->e[i];

		if (!e->val)
			break;
		if (e->key == key) {
			/* live or this key's own tombstone: readers see old or new */
			if (e->val == FERRY_KEYMAP_TOMB)
				__atomic_store_n(&m->n, m->n + 1, __ATOMIC_RELAXED);
			__atomic_store_n(&e->val, val, __ATOMIC_RELEASE);
			return 0;
		}
		if (e->val == FERRY_KEYMAP_TOMB && tomb == UINT64_MAX)
			tomb = i;
		i = ferry__map_next(i, a->nb);
	}
	if (tomb != UINT64_MAX) {
		/* the first tombstone on the way: the chain stays as long */
		__atomic_store_n(&a->e[tomb].key, key, __ATOMIC_RELAXED);
		__atomic_store_n(&a->e[tomb].val, val, __ATOMIC_RELEASE);
		__atomic_store_n(&m->n, m->n + 1, __ATOMIC_RELAXED);
		return 0;
	}
	if ((m->used + 1) * 2 > a->nb) {
		if (!keymap_rebuild(m, ferry__map_buckets_for(m->n + 1, FERRY_KEYMAP_MIN))) {
			a = m->arr;
			i = ferry__map_first(ferry__keymap_hash(key), a->nb);
			while (a->e[i].val)
				i = ferry__map_next(i, a->nb);
		} else if (m->used + 2 > a->nb) {
			/* a reader's probe needs an empty bucket to stop at */
			return -ENOMEM;
		}
	}
	__atomic_store_n(&a->e[i].key, key, __ATOMIC_RELAXED);
	__atomic_store_n(&a->e[i].val, val, __ATOMIC_RELEASE);
	__atomic_store_n(&m->n, m->n + 1, __ATOMIC_RELAXED);
	m->used++;
	return 0;
}

void ferry__keymap_del(struct ferry_keymap *m, uint64_t key)
{
	struct ferry_keymap_arr *a = m->arr;
	uint64_t i = ferry__map_first(ferry__keymap_hash(key), a->nb);

	for (;; i = ferry__map_next(i, a->nb)) {
		struct ferry_keymap_ent *e = &a->e[i];

		if (!e->val)
			return;
		if (e->key != key)
			continue;
		if (e->val == FERRY_KEYMAP_TOMB)
			return;
		__atomic_store_n(&m->n, m->n - 1, __ATOMIC_RELAXED);
		if (a->e[ferry__map_next(i, a->nb)].val) {
			__atomic_store_n(&e->val, FERRY_KEYMAP_TOMB, __ATOMIC_RELEASE);
			break;
		}
		/* the chain ends here: this bucket and the tombstones before it
		 * become empty (no key lies past them to lose) */
		do {
			__atomic_store_n(&a->e[i].val, 0, __ATOMIC_RELEASE);
			m->used--;
			i = ferry__map_prev(i, a->nb);
		} while (a->e[i].val == FERRY_KEYMAP_TOMB);
		break;
	}
	if (a->nb > FERRY_KEYMAP_MIN && m->n < a->nb / 16)
		(void)keymap_rebuild(m, ferry__map_buckets_for(
						m->n, FERRY_KEYMAP_MIN)); /* no memory: stay big */
}

uint64_t ferry__keymap_bytes(const struct ferry_keymap *m)
{
	return __atomic_load_n(&m->bytes, __ATOMIC_RELAXED);
}

uint64_t ferry__keymap_count(const struct ferry_keymap *m)
{
	return __atomic_load_n(&m->n, __ATOMIC_RELAXED);
}

void ferry__keymap_each(const struct ferry_keymap *m,
			void (*fn)(void *arg, uint64_t key, uint64_t val), void *arg)
{
	const struct ferry_keymap_arr *a = m->arr;

	for (uint64_t i = 0; a && i < a->nb; i++)
		if (a->e[i].val && a->e[i].val != FERRY_KEYMAP_TOMB)
			fn(arg, a->e[i].key, a->e[i].val);
}

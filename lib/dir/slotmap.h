/* SPDX-License-Identifier: MIT */
/*
 * slotmap.h - the directory's map from keys to the slots that hold them
 * here: 8 bytes a bucket, read without a lock, written by one thread at a
 * time.
 *
 * The map of keys owned here sits on the path of every local operation,
 * so it is built for the cache: a bucket is one 64-bit word, a 32-bit tag
 * from the key's hash above the index + 1 of the slot in the table's arena
 * (0: empty bucket; index field 0 with a tag: a tombstone). The key itself
 * is not stored: the slot holds it, and a lookup reads it there, in the
 * slot's header, which the caller reads next anyway. So a lookup is a hash,
 * usually one bucket load, and the slot's cache line; the 16-byte {key,
 * val} buckets of keymap.h spent twice the cache and made ferry-mf's local
 * SGD steps 1.5x slower than the arrays the directory had before.
 *
 * Open addressing with linear probing over an array of any multiple of 8
 * buckets; buckets are found by ferry__keymap_hash() and ferry__map_first()
 * (runs of 4 consecutive keys in order). A bucket is written with one
 * atomic store, so a reader sees a whole entry or none. Sizes and
 * tombstones as keymap.h: rebuilt (dropping tombstones) when live keys and
 * tombstones would pass 1/2 of the buckets or live keys fall under 1/16,
 * to 3/8 full (1/4 under FERRY_MAP_FINE buckets), never under
 * FERRY_SLOTMAP_MIN buckets. So a map past 49,152 keys (its first rebuild
 * past FERRY_MAP_FINE buckets) that grows spends 16 to 22 bytes per live
 * key (a power-of-two array, which doubles,
 * spent 16 to 32: ferry-bench's memory scenario at 10^6 keys measured 33
 * after moves), one that shrank at most 128, plus the old array until a grace
 * period and the fast-path sections of @fast that may hold it ended.
 *
 * The invariant the map needs from its writer: a slot stays holding its
 * key for as long as the map maps the key to it (a key is unpublished
 * before its slot is freed or reused). A reader racing the writer may meet
 * a bucket whose slot was reused for another key since: the key check in
 * the slot skips it, and the lookup may then miss (NULL) a key that is
 * being republished, which every reader treats as "not here now".
 *
 * Writers: the caller serializes them. Readers: any RCU-registered thread
 * in a read-side section, a fast-path reader in a section of @fast, or
 * the writer.
 */
#ifndef FERRY_LIB_DIR_SLOTMAP_H
#define FERRY_LIB_DIR_SLOTMAP_H

#include <stdint.h>

#include <urcu/urcu-memb.h>

#include "lib/dir/keymap.h"

/* 64 KiB: a map that empties and fills again (a batch of keys moving back
 * and forth) does not rebuild every time below 3,000 keys */
#define FERRY_SLOTMAP_MIN 8192u
#define FERRY_SLOTMAP_TOMB (1ull << 32)

struct ferry_fastrd;

struct ferry_slotmap_arr {
	uint64_t nb; /* buckets: a multiple of 8 */
	struct rcu_head rcu;
	const struct ferry_fastrd *fast; /* retired: the fast readers to wait for */
	uint64_t retired;		 /* its number (fastrd.h) */
	uint64_t e[];			 /* tag << 32 | (slot index + 1) */
};

struct ferry_slotmap {
	struct ferry_slotmap_arr *arr;	 /* RCU-published */
	const struct ferry_fastrd *fast; /* fast-path readers too, or NULL */
	const uint8_t *base;		 /* slot i is at base + i * stride */
	uint64_t stride;
	uint64_t key_off; /* the slot's key: a uint64_t at this offset */
	uint64_t n;	  /* live keys (writer; atomic stores) */
	uint64_t bytes;	  /* of the current array (atomic) */
	uint64_t used;	  /* live keys + tombstones (writer) */
};

/* Return: 0 or -ENOMEM. Context: setup. @fast: as keymap.h. */
int ferry__slotmap_init(struct ferry_slotmap *m, const struct ferry_fastrd *fast);
/* where the slots are: set once, before the first put */
void ferry__slotmap_arena(struct ferry_slotmap *m, const void *base, uint64_t stride,
			  uint64_t key_off);
/* free at once: no reader may be left. Context: teardown. */
void ferry__slotmap_fini(struct ferry_slotmap *m);

static inline uint32_t ferry__slotmap_tag(uint64_t h, uint64_t key)
{
	/* the hash's high half, which the bucket index (ferry__map_first)
	 * does not use; a run's 4 keys share it, so their low bits tell them
	 * apart */
	return (uint32_t)(h >> 32) ^ (uint32_t)(key & 3) * 0x9e3779b9u;
}

static inline const uint8_t *ferry__slotmap_slot(const struct ferry_slotmap *m, uint64_t w)
{
	return m->base + ((w & 0xffffffffull) - 1) * m->stride;
}

/* the slot @key is mapped to, or NULL. Context: see above. */
static inline void *ferry__slotmap_get(const struct ferry_slotmap *m, uint64_t key)
{
	/* acquire: rcu_dereference, inline (see keymap.h) */
	const struct ferry_slotmap_arr *a = __atomic_load_n(&m->arr, __ATOMIC_ACQUIRE);
	uint64_t h = ferry__keymap_hash(key), i = ferry__map_first(h, a->nb);
	uint32_t tag = ferry__slotmap_tag(h, key);

	for (;; i = ferry__map_next(i, a->nb)) {
		uint64_t w = __atomic_load_n(&a->e[i], __ATOMIC_ACQUIRE);
		const uint8_t *s;

		if (!w)
			return NULL;
		if ((uint32_t)(w >> 32) != tag || !(uint32_t)w)
			continue;
		s = ferry__slotmap_slot(m, w);
		if (__atomic_load_n((const uint64_t *)(s + m->key_off), __ATOMIC_RELAXED) == key)
			return (void *)s;
	}
}

/*
 * The slot @key is probably mapped to, without reading any slot: the first
 * bucket on @key's probe whose tag is @key's, or NULL when the probe meets
 * an empty bucket first. A caller checks the key in the slot anyway (a
 * tag is 32 bits of the hash, so another key's slot comes back about once
 * in 2^32 probes) and takes a miss or a wrong slot as "not known here":
 * the fast path does, and so starts loading the slot before it needs it.
 * Context: as ferry__slotmap_get().
 */
static inline void *ferry__slotmap_hint(const struct ferry_slotmap *m, uint64_t key)
{
	const struct ferry_slotmap_arr *a = __atomic_load_n(&m->arr, __ATOMIC_ACQUIRE);
	uint64_t h = ferry__keymap_hash(key), i = ferry__map_first(h, a->nb);
	uint32_t tag = ferry__slotmap_tag(h, key);

	for (;; i = ferry__map_next(i, a->nb)) {
		uint64_t w = __atomic_load_n(&a->e[i], __ATOMIC_ACQUIRE);

		if (!w)
			return NULL;
		if ((uint32_t)(w >> 32) == tag && (uint32_t)w)
			return (void *)ferry__slotmap_slot(m, w);
	}
}

/*
 * Start loading the bucket ferry__slotmap_get(@m, @key) reads first; it
 * changes nothing, and a prefetch never faults. Context: as
 * ferry__slotmap_get() (the array it reads must not be freed under it).
 */
static inline void ferry__slotmap_prefetch(const struct ferry_slotmap *m, uint64_t key)
{
	const struct ferry_slotmap_arr *a = __atomic_load_n(&m->arr, __ATOMIC_ACQUIRE);

	__builtin_prefetch(&a->e[ferry__map_first(ferry__keymap_hash(key), a->nb)]);
}

/*
 * ferry__slotmap_put - map @key to @slot (in the arena, holding @key),
 * replacing what it had. Return: 0, or -ENOMEM (a rebuild found no memory
 * while the array is full; nothing changed). Context: the writer,
 * RCU-registered.
 */
int ferry__slotmap_put(struct ferry_slotmap *m, uint64_t key, const void *slot);
/* forget @key (nothing when absent); may shrink the array, and never
 * fails (a shrink with no memory keeps the bigger array). Context: the
 * writer. */
void ferry__slotmap_del(struct ferry_slotmap *m, uint64_t key);

/* bytes of the current array, and live keys: snapshots, any thread */
uint64_t ferry__slotmap_bytes(const struct ferry_slotmap *m);
uint64_t ferry__slotmap_count(const struct ferry_slotmap *m);

/* call @fn(arg, key, slot) for every live key. Context: the writer, or
 * with no writer left. */
void ferry__slotmap_each(const struct ferry_slotmap *m,
			 void (*fn)(void *arg, uint64_t key, void *slot), void *arg);

#endif /* FERRY_LIB_DIR_SLOTMAP_H */

/* SPDX-License-Identifier: MIT */
/*
 * keymap.h - a map from 64-bit keys to nonzero 64-bit words, read without a
 * lock, written by one thread at a time: the directory's tables (which
 * slot holds a key here; who owns a key that left its home).
 *
 * Open addressing with linear probing over an array of
 * {key, val} pairs, the whole 64-bit key space allowed. val 0 marks an empty
 * bucket (a probe stops there), FERRY_KEYMAP_TOMB one whose key was deleted
 * (a probe goes on). A writer fills a bucket key first, then val (release);
 * a reader loads val (acquire), then key. A delete at the end of a chain
 * empties the bucket (and the tombstones before it) instead of leaving a
 * tombstone, and an insert reuses the first tombstone on its way, so chains
 * stay short under churn. The price: a reader that races with writers on
 * the same bucket may get a deleted key's val, or, if the bucket was reused
 * meanwhile, another key's. Every reader of the maps here checks what it
 * gets (a slot holds its key; the owner records have no reader but their
 * writer), and docs/architecture.md says so.
 *
 * Why not liburcu's cds_lfht (which lib/dir/pend.c uses): a lookup here is
 * a hash and usually one cache line, with no pointer chase per node and no
 * allocation per key, and it costs 16 bytes per bucket instead of a node of
 * 48 bytes plus the bucket index; the directory's local reads sit on the
 * path of a local pull, which ferry-bench measures against a memory copy.
 *
 * Size: a rebuild (into a new array; it drops every tombstone) comes when
 * live keys and tombstones would pass 1/2 of the buckets, or live keys fall
 * under 1/16 of them, and makes the live keys 3/8 of the new array (never
 * under FERRY_KEYMAP_MIN buckets; 1/4 while under FERRY_MAP_FINE, so that
 * small maps, which batches fill and empty, rebuild rarely). The array's
 * length is any multiple of 8, not a power of two (ferry__map_first() maps a
 * hash onto it by a multiply), so a map past FERRY_MAP_FINE buckets that
 * grows spends 32 to 43 bytes per live key, where doubling spent 32 to 64,
 * and one that shrank at most 256, plus the old array for one RCU grace
 * period after a rebuild. A rebuild comes after at least 1/8 of the
 * buckets' worth of inserts and deletes, so it costs at most 8 bucket
 * copies per change. The old array is freed by
 * call_rcu: readers either hold rcu_read_lock (memb flavor) or are the
 * writer.
 *
 * Writers: the caller serializes them (one thread, or a lock of its own).
 * Readers: any RCU-registered thread inside a read-side section, or the
 * writer itself.
 */
#ifndef FERRY_LIB_DIR_KEYMAP_H
#define FERRY_LIB_DIR_KEYMAP_H

#include <stddef.h>
#include <stdint.h>

#include <urcu/urcu-memb.h>

#define FERRY_KEYMAP_TOMB UINT64_MAX
#define FERRY_KEYMAP_MIN 1024u /* 16 KiB: small maps do not rebuild on every burst */

struct ferry_keymap_ent {
	uint64_t key;
	uint64_t val; /* 0: never used; FERRY_KEYMAP_TOMB: deleted */
};

struct ferry_keymap_arr {
	uint64_t nb; /* buckets: a multiple of 8 */
	struct rcu_head rcu;
	struct ferry_keymap_ent e[];
};

struct ferry_keymap {
	struct ferry_keymap_arr *arr; /* RCU-published */
	uint64_t n;		      /* live keys (writer; atomic stores) */
	uint64_t bytes;		      /* of the current array (atomic) */
	uint64_t used;		      /* live keys + tombstones (writer) */
};

/* the directory's maps' shared pieces (keymap.c; slotmap.c uses them too): a
 * zeroed array of @bytes, written when made, and its free (given the same
 * @bytes); buckets for @n live keys, 3/8 full (1/4 under FERRY_MAP_FINE
 * buckets), a multiple of 8, @min at least (a large map that grows at 1/2
 * grows by 4/3, a small one doubles).
 *
 * An array of FERRY_MAP_MMAP_MIN bytes or more is a mapping of its own, not
 * malloc's: a map that grows leaves each older, smaller array behind, and
 * malloc kept those it had served from its heap as free memory that the
 * next, larger array did not fit (1.5 MB and more on each node of
 * ferry-bench -s memory after the moves, docs/benchmarks.md); an unmapped
 * array is the kernel's again at once. */
#define FERRY_MAP_FINE 65536u
#define FERRY_MAP_MMAP_MIN (64u << 10)
void *ferry__map_arr_new(size_t bytes);
void ferry__map_arr_free(void *arr, size_t bytes);
uint64_t ferry__map_buckets_for(uint64_t n, uint64_t min);

/*
 * The first bucket to probe for hash @h (ferry__keymap_hash) among @nb (a
 * multiple of 4, under 2^34): the low 32 bits of the run's hash pick a
 * group of 4 buckets by a multiply-shift (Lemire's "fastrange", so any @nb
 * works), and the key's place in its run picks the bucket in the group.
 * The low bits, not the high ones: after one round of the mix the high bits
 * are those of a product, a Weyl sequence over consecutive runs, which
 * clustered (a mean probe of 15 buckets at 10^4 sequential keys, against
 * 1.8 for these). The high half of @h is left for tags.
 */
static inline uint64_t ferry__map_first(uint64_t h, uint64_t nb)
{
	return ((uint64_t)(uint32_t)(h >> 2) * (nb >> 2)) >> 32 << 2 | (h & 3);
}

static inline uint64_t ferry__map_next(uint64_t i, uint64_t nb)
{
	return i + 1 == nb ? 0 : i + 1;
}

static inline uint64_t ferry__map_prev(uint64_t i, uint64_t nb)
{
	return (i ? i : nb) - 1;
}

/* Return: 0 or -ENOMEM. Context: setup. */
int ferry__keymap_init(struct ferry_keymap *m);
/* free at once: no reader may be left. Context: teardown. */
void ferry__keymap_fini(struct ferry_keymap *m);

/*
 * The key's home bucket (this map's and slotmap.h's). Runs of 4 consecutive keys keep their order in 4
 * consecutive buckets (one cache line): a batch of sequential keys, what a
 * dense table's users send, touches memory in order. Which run goes where
 * is a 64-bit mix of the rest of the key, so sparse and hashed keys spread
 * over the whole array. Measured (ferry-bench -s batch-localize, ferry-mf):
 * a full mix of every key made a batch localize of 1000 sequential keys
 * 1.4-2.4x slower than the arrays the map replaced (a cache miss per key);
 * runs of 16 made linear probing's clusters long enough to slow ferry-mf's
 * local pushes; runs of 4, with at most half the buckets in use, keep both
 * near the arrays' figures.
 */
static inline uint64_t ferry__keymap_hash(uint64_t key)
{
	uint64_t hi = key >> 2;

	hi ^= hi >> 33;
	hi *= 0xff51afd7ed558ccdull;
	hi ^= hi >> 33;
	return hi << 2 | (key & 3);
}

/* @key's val, or 0. Context: see above. */
static inline uint64_t ferry__keymap_get(const struct ferry_keymap *m, uint64_t key)
{
	/* acquire: what rcu_dereference is, inline (liburcu's is a call, and
	 * one TSan cannot see into) */
	const struct ferry_keymap_arr *a = __atomic_load_n(&m->arr, __ATOMIC_ACQUIRE);
	uint64_t i = ferry__map_first(ferry__keymap_hash(key), a->nb);

	for (;;) {
		const struct ferry_keymap_ent *e = &a->e[i];
		uint64_t v = __atomic_load_n(&e->val, __ATOMIC_ACQUIRE);

		if (!v)
			return 0;
		if (__atomic_load_n(&e->key, __ATOMIC_RELAXED) == key)
			return v == FERRY_KEYMAP_TOMB ? 0 : v;
		i = ferry__map_next(i, a->nb);
	}
}

/*
 * ferry__keymap_prefetch - start loading the bucket where @key's probe
 * begins, for writing (a handler looks a record up, then sets it), so that
 * a batch's lookups overlap their cache misses. No bucket is read and a
 * prefetch never faults: a rebuild meanwhile costs only the wasted load.
 * Context: as ferry__keymap_get().
 */
static inline void ferry__keymap_prefetch(const struct ferry_keymap *m, uint64_t key)
{
	const struct ferry_keymap_arr *a = __atomic_load_n(&m->arr, __ATOMIC_ACQUIRE);

	__builtin_prefetch(&a->e[ferry__map_first(ferry__keymap_hash(key), a->nb)], 1);
}

/*
 * ferry__keymap_put - map @key to @val (nonzero, not FERRY_KEYMAP_TOMB),
 * replacing what it had. Return: 0, or -ENOMEM (a rebuild could not get
 * memory while the array is full; the map is as it was). Context: the
 * writer, RCU-registered.
 */
int ferry__keymap_put(struct ferry_keymap *m, uint64_t key, uint64_t val);
/* forget @key (nothing when absent); may shrink the array. Never fails:
 * a shrink that gets no memory keeps the bigger array. Context: the writer. */
void ferry__keymap_del(struct ferry_keymap *m, uint64_t key);

/* bytes of the current array, and live keys: snapshots, any thread */
uint64_t ferry__keymap_bytes(const struct ferry_keymap *m);
uint64_t ferry__keymap_count(const struct ferry_keymap *m);

/* call @fn(arg, key, val) for every live key. Context: the writer, or
 * with no writer left. */
void ferry__keymap_each(const struct ferry_keymap *m,
			void (*fn)(void *arg, uint64_t key, uint64_t val), void *arg);

#endif /* FERRY_LIB_DIR_KEYMAP_H */

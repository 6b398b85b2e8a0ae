/* SPDX-License-Identifier: MIT */
/*
 * dir.h - a table's directory on one node: which keys live here, who owns
 * the keys this node is home of that left, and where other keys were last
 * seen. Every part is bounded by what the node holds, never by the size of
 * the table:
 *
 *   own     key -> live slot here            one entry per key owned here
 *                                            (a dense range-placed table:
 *                                            an array over its home keys)
 *   owners  key -> owner (at the key's home) one entry per key homed here
 *                                            that lives on another node
 *   loc     key -> location hint             a fixed number of entries,
 *                                            chosen at table creation
 *
 * A key homed here with no owners entry is owned here (or was never
 * written: a sparse key comes into being at its home on first use). A key
 * with no loc entry is looked for at its home, which knows its owner and
 * forwards.
 *
 * Threads:
 *   own     readers: any RCU-registered thread in a read-side section, or
 *           a worker in a fast-path section (lib/dir/fastrd.h); a reader
 *           racing a writer may get a stale slot, which it checks (the
 *           slot holds its key); writers: the progress thread and table
 *           creation, serialized by own_lock (a spin lock) inside
 *           ferry__dir_own_set(); a home key's array entry, one atomic
 *           exchange with no lock (one thread at a time moves a key)
 *   owners  the progress thread only (it serves the home's protocol)
 *   loc     any thread, relaxed atomics: a hint may be stale or, under a
 *           race of writers on one entry, another key's; every user checks
 *           what it finds (a rank below world, the key and epoch in the
 *           slot a READ fetched; a wrong node forwards to the home)
 */
#ifndef FERRY_LIB_DIR_DIR_H
#define FERRY_LIB_DIR_DIR_H

#include <pthread.h>
#include <stdint.h>

#include "lib/dir/fastrd.h"
#include "lib/dir/keymap.h"
#include "lib/dir/slotmap.h"

/* location-cache entries when the table does not say: 16 bytes each */
#define FERRY_LOC_CACHE_DEFAULT 65536u
#define FERRY_LOC_CACHE_MAX (1u << 30)

struct ferry_loc_ent {
	uint64_t key;
	uint64_t hint; /* 0: empty */
};

struct ferry_dir {
	/* a dense range-placed table's home keys [home_lo, home_lo + home_n):
	 * an array, fixed for the table's life (so read with no section), as
	 * the node held every one of them at creation; other keys: own */
	uint64_t home_lo, home_n;
	void **home_own;
	uint64_t home_live;	    /* entries of home_own set (atomic) */
	struct ferry_slotmap own;   /* key -> its slot (8 B a bucket) */
	int own_lock;		    /* serializes own's writers: a spin lock */
	struct ferry_keymap owners; /* key -> owner rank + 1 (progress thread) */
	uint32_t self;		    /* this node's rank */
	uint64_t loc_mask;	    /* loc entries - 1 (a power of two) */
	struct ferry_loc_ent *loc;  /* direct-mapped by key hash */
};

/*
 * ferry__dir_init - an empty directory with @loc_entries location entries
 * (0: FERRY_LOC_CACHE_DEFAULT; rounded up to a power of two); @fast: the
 * node's fast-path reader cells, which may read own. Return: 0,
 * -EINVAL (above FERRY_LOC_CACHE_MAX), -ENOMEM. Context: table build.
 */
int ferry__dir_init(struct ferry_dir *d, uint32_t self, uint64_t loc_entries,
		    const struct ferry_fastrd *fast);
/* give a dense range-placed table's home keys [@lo, @lo + @n) an array of
 * their own (8 bytes per home key). Return: 0 or -ENOMEM. Context: table
 * build, before any key is published. */
int ferry__dir_home_range(struct ferry_dir *d, uint64_t lo, uint64_t n);
/* own's slots are in the arena at @base, @stride bytes apart, each holding
 * its key at @key_off. Context: table build, before any key is published. */
void ferry__dir_arena(struct ferry_dir *d, const void *base, uint64_t stride, uint64_t key_off);
/* Context: teardown, no reader left. */
void ferry__dir_fini(struct ferry_dir *d);

/* the live slot of @key here, or NULL. Context: see above (own). */
static inline void *ferry__dir_own(const struct ferry_dir *d, uint64_t key)
{
	if (key - d->home_lo < d->home_n)
		return __atomic_load_n(&d->home_own[key - d->home_lo], __ATOMIC_ACQUIRE);
	return ferry__slotmap_get(&d->own, key);
}

/* the slot that probably holds @key here, read from the directory alone
 * (ferry__slotmap_hint()): the caller checks the key in the slot and takes
 * a wrong slot or NULL as "not known here". Context: as ferry__dir_own(). */
static inline void *ferry__dir_own_hint(const struct ferry_dir *d, uint64_t key)
{
	if (key - d->home_lo < d->home_n)
		return __atomic_load_n(&d->home_own[key - d->home_lo], __ATOMIC_ACQUIRE);
	return ferry__slotmap_hint(&d->own, key);
}

/* start loading what ferry__dir_own(@d, @key) reads first (a hint: no
 * effect on what it returns). Context: as ferry__dir_own(). */
static inline void ferry__dir_own_prefetch(const struct ferry_dir *d, uint64_t key)
{
	if (key - d->home_lo < d->home_n)
		__builtin_prefetch(&d->home_own[key - d->home_lo]);
	else
		ferry__slotmap_prefetch(&d->own, key);
}

/*
 * ferry__dir_own_set - publish @slot as @key's live slot here, or unpublish
 * it (@slot NULL). Return: 0; -ENOMEM (publishing only: the map could not
 * grow; the key stays unpublished). Context: any registered thread.
 */
int ferry__dir_own_set(struct ferry_dir *d, uint64_t key, void *slot);

/*
 * A walk of every key owned here: ferry__dir_own_each() calls @fn(@arg,
 * key, slot) for each, between ferry__dir_own_lock() and _unlock(), which
 * hold off the map's writers (a spin lock: they wait, yielding, for the
 * walk). A dense table's home keys take no lock: their entries can change
 * during the walk, which a caller at a quiescent point (a checkpoint's
 * mark) does not see. Context: any registered thread.
 */
void ferry__dir_own_lock(struct ferry_dir *d);
void ferry__dir_own_unlock(struct ferry_dir *d);
void ferry__dir_own_each(const struct ferry_dir *d, void (*fn)(void *arg, uint64_t key, void *slot),
			 void *arg);

/* keys owned here; keys homed here that live elsewhere (snapshots, any
 * thread) */
uint64_t ferry__dir_own_count(struct ferry_dir *d);
uint64_t ferry__dir_away_count(const struct ferry_dir *d);

/* the owner of @key, which is homed here. Context: the progress thread. */
static inline uint32_t ferry__dir_owner(const struct ferry_dir *d, uint64_t key)
{
	uint64_t v = ferry__keymap_get(&d->owners, key);

	return v ? (uint32_t)(v - 1) : d->self;
}

/* start loading @key's owner record (a batch's handler, keys ahead) */
static inline void ferry__dir_owner_prefetch(const struct ferry_dir *d, uint64_t key)
{
	ferry__keymap_prefetch(&d->owners, key);
}

/*
 * ferry__dir_owner_set - record @owner for @key, which is homed here (the
 * home itself: the record goes). Return: 0 or -ENOMEM (the record is as
 * it was). Context: the progress thread.
 */
int ferry__dir_owner_set(struct ferry_dir *d, uint64_t key, uint32_t owner);

/* ---- location hints --------------------------------------------------- */

/*
 * A hint is one word: bits 0-15 the owner's rank + 1, 16-31 the low bits of
 * its slot's epoch, 32-63 the slot index + 1 (0: slot unknown); 0 is no
 * hint. The cache is
 * direct-mapped: a key's hint replaces whatever key shared its entry (the
 * newest wins), so a key that loses its entry is looked for at its home.
 */
static inline struct ferry_loc_ent *ferry__dir_loc_ent(const struct ferry_dir *d, uint64_t key)
{
	return &d->loc[ferry__keymap_hash(key ^ 0x9e3779b97f4a7c15ull) & d->loc_mask];
}

/* @key's hint, or 0 when the cache has none */
static inline uint64_t ferry__dir_loc(const struct ferry_dir *d, uint64_t key)
{
	const struct ferry_loc_ent *e = ferry__dir_loc_ent(d, key);
	uint64_t k1, h;

	k1 = __atomic_load_n(&e->key, __ATOMIC_RELAXED);
	h = __atomic_load_n(&e->hint, __ATOMIC_ACQUIRE);
	/* a hint seen belongs to the key its writer stored before it (release):
	 * the same key read again means no other writer came between */
	if (k1 != key || __atomic_load_n(&e->key, __ATOMIC_RELAXED) != key)
		return 0;
	return h;
}

static inline void ferry__dir_loc_put(struct ferry_dir *d, uint64_t key, uint64_t hint)
{
	struct ferry_loc_ent *e = ferry__dir_loc_ent(d, key);

	__atomic_store_n(&e->key, key, __ATOMIC_RELAXED);
	__atomic_store_n(&e->hint, hint, __ATOMIC_RELEASE);
}

/* forget @key's hint (when it is @key's) */
static inline void ferry__dir_loc_forget(struct ferry_dir *d, uint64_t key)
{
	struct ferry_loc_ent *e = ferry__dir_loc_ent(d, key);

	if (__atomic_load_n(&e->key, __ATOMIC_RELAXED) == key)
		__atomic_store_n(&e->hint, 0, __ATOMIC_RELEASE);
}

/* bytes the directory holds now (its maps and the cache) */
uint64_t ferry__dir_bytes(const struct ferry_dir *d);

#endif /* FERRY_LIB_DIR_DIR_H */

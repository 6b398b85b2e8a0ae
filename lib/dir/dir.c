/* SPDX-License-Identifier: MIT */
/*
 * dir.c - a table's directory on one node (see dir.h for what each part
 * holds, its bound and its threads).
 */
#include <errno.h>
#include <stdlib.h>

#include "lib/dir/dir.h"
#include "transport/base/cpu.h"

int ferry__dir_init(struct ferry_dir *d, uint32_t self, uint64_t loc_entries,
		    const struct ferry_fastrd *fast)
{
	uint64_t n = 1;
	int rc;

	if (!loc_entries)
		loc_entries = FERRY_LOC_CACHE_DEFAULT;
	if (loc_entries > FERRY_LOC_CACHE_MAX)
		return -EINVAL;
	while (n < loc_entries)
		n *= 2;
	d->self = self;
	d->loc_mask = n - 1;
	d->loc = calloc(n, sizeof(*d->loc));
	if (!d->loc)
		return -ENOMEM;
	rc = ferry__slotmap_init(&d->own, fast);
	if (!rc)
		rc = ferry__keymap_init(&d->owners);
	if (rc) {
		ferry__dir_fini(d);
		return rc;
	}
	return 0;
}

int ferry__dir_home_range(struct ferry_dir *d, uint64_t lo, uint64_t n)
{
	d->home_own = n ? calloc(n, sizeof(*d->home_own)) : NULL;
	if (n && !d->home_own)
		return -ENOMEM;
	d->home_lo = lo;
	d->home_n = n;
	return 0;
}

void ferry__dir_arena(struct ferry_dir *d, const void *base, uint64_t stride, uint64_t key_off)
{
	ferry__slotmap_arena(&d->own, base, stride, key_off);
}

void ferry__dir_fini(struct ferry_dir *d)
{
	free(d->home_own);
	d->home_own = NULL;
	d->home_n = 0;
	ferry__slotmap_fini(&d->own);
	ferry__keymap_fini(&d->owners);
	free(d->loc);
	d->loc = NULL;
}

/*
 * own's writers take a spin lock: a publish is a few stores, and a mutex
 * doubled what a batch localize of 1000 small keys spent in the directory
 * (cachegrind); a rebuild, which takes longer, is rare, and a waiter yields
 * after a bound (ferry__spin). A home key's array entry needs no lock: one
 * thread at a time moves a given key.
 */
void ferry__dir_own_lock(struct ferry_dir *d)
{
	unsigned round = 0;

	while (__atomic_exchange_n(&d->own_lock, 1, __ATOMIC_ACQUIRE))
		while (__atomic_load_n(&d->own_lock, __ATOMIC_RELAXED))
			ferry__spin(&round);
}

void ferry__dir_own_unlock(struct ferry_dir *d)
{
	__atomic_store_n(&d->own_lock, 0, __ATOMIC_RELEASE);
}

int ferry__dir_own_set(struct ferry_dir *d, uint64_t key, void *slot)
{
	int rc = 0;

	if (key - d->home_lo < d->home_n) {
		void **e = &d->home_own[key - d->home_lo];
		void *old = __atomic_exchange_n(e, slot, __ATOMIC_ACQ_REL);

		__atomic_add_fetch(&d->home_live, (uint64_t)((slot != NULL) - (old != NULL)),
				   __ATOMIC_RELAXED);
		return 0;
	}
	ferry__dir_own_lock(d);
	if (slot)
		rc = ferry__slotmap_put(&d->own, key, slot);
	else
		ferry__slotmap_del(&d->own, key);
	ferry__dir_own_unlock(d);
	return rc;
}

void ferry__dir_own_each(const struct ferry_dir *d, void (*fn)(void *arg, uint64_t key, void *slot),
			 void *arg)
{
	for (uint64_t i = 0; i < d->home_n; i++) {
		void *s = __atomic_load_n(&d->home_own[i], __ATOMIC_ACQUIRE);

		if (s)
			fn(arg, d->home_lo + i, s);
	}
	ferry__slotmap_each(&d->own, fn, arg);
}

uint64_t ferry__dir_own_count(struct ferry_dir *d)
{
	return ferry__slotmap_count(&d->own) + __atomic_load_n(&d->home_live, __ATOMIC_RELAXED);
}

uint64_t ferry__dir_away_count(const struct ferry_dir *d)
{
	return ferry__keymap_count(&d->owners);
}

int ferry__dir_owner_set(struct ferry_dir *d, uint64_t key, uint32_t owner)
{
	if (owner == d->self) {
		ferry__keymap_del(&d->owners, key);
		return 0;
	}
	return ferry__keymap_put(&d->owners, key, (uint64_t)owner + 1);
}

uint64_t ferry__dir_bytes(const struct ferry_dir *d)
{
	return ferry__slotmap_bytes(&d->own) + ferry__keymap_bytes(&d->owners) +
	       (d->loc_mask + 1) * sizeof(*d->loc) + d->home_n * sizeof(*d->home_own);
}

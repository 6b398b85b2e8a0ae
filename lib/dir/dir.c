/* SPDX-License-Identifier: MIT */
/*
 * dir.c - a table's directory on one node (see dir.h for what each part
 * holds, its bound and its threads).
 */
#include <errno.h>
#include <stdlib.h>

#include "lib/dir/dir.h"

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
	pthread_mutex_init(&d->own_lock, NULL);
	d->self = self;
	d->loc_mask = n - 1;
	d->loc = calloc(n, sizeof(*d->loc));
	if (!d->loc) {
		pthread_mutex_destroy(&d->own_lock);
		return -ENOMEM;
	}
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
	if (d->loc)
		pthread_mutex_destroy(&d->own_lock);
	ferry__slotmap_fini(&d->own);
	ferry__keymap_fini(&d->owners);
	free(d->loc);
	d->loc = NULL;
}

int ferry__dir_own_set(struct ferry_dir *d, uint64_t key, void *slot)
{
	int rc = 0;

	pthread_mutex_lock(&d->own_lock);
	if (key - d->home_lo < d->home_n) {
		void **e = &d->home_own[key - d->home_lo];

		d->home_live += (slot != NULL) - (*e != NULL);
		__atomic_store_n(e, slot, __ATOMIC_RELEASE);
	} else if (slot) {
		rc = ferry__slotmap_put(&d->own, key, slot);
	} else {
		ferry__slotmap_del(&d->own, key);
	}
	pthread_mutex_unlock(&d->own_lock);
	return rc;
}

uint64_t ferry__dir_own_count(struct ferry_dir *d)
{
	uint64_t n;

	pthread_mutex_lock(&d->own_lock);
	n = d->own.n + d->home_live;
	pthread_mutex_unlock(&d->own_lock);
	return n;
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

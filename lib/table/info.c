/* SPDX-License-Identifier: MIT */
/*
 * info.c - what a table says about itself: this node's share of it
 * (ferry_table_stats), a key's home and its value length. Reads only: any
 * thread, no lock (counts are snapshots).
 */
#include <errno.h>

#include "lib/ops/ops.h"
#include "lib/table/table.h"

int ferry_table_stats(struct ferry_table *t, struct ferry_table_stats *st)
{
	if (!t || !st)
		return -EINVAL;
	*st = (struct ferry_table_stats){
		.keys_owned = ferry__dir_own_count(&t->dir),
		.keys_away = ferry__dir_away_count(&t->dir),
		.dir_bytes = ferry__dir_bytes(&t->dir),
		.slots = t->arena.capacity,
		.slot_bytes = t->arena.stride,
		.registered_bytes = __atomic_load_n(&t->registered, __ATOMIC_RELAXED) +
				    (t->inbox.base ? t->inbox.bytes : 0),
		.backups = ferry__repl_count(t),
		.backup_bytes = ferry__repl_bytes(t),
		.slots_free = ferry__arena_nfree(&t->arena),
	};
	return 0;
}

int ferry_table_home(const struct ferry_table *t, uint64_t key)
{
	if (!t)
		return -EINVAL;
	if (!ferry__key_ok(t, key))
		return -ERANGE;
	return (int)ferry__home(t, key);
}

uint32_t ferry_table_value_len(const struct ferry_table *t, uint64_t key)
{
	if (!t || !ferry__key_ok(t, key))
		return 0;
	return ferry__value_len(t, key);
}

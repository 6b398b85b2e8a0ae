/* SPDX-License-Identifier: MIT */
/*
 * sparse.c - a sparse key comes into being at its home.
 *
 * A sparse table's key that was never written has no slot anywhere: its
 * home owns it (no owner record says otherwise) and its value is the
 * table's initial value (lib/store/init.h). The home gives it a slot the
 * first time it must serve it from one: an operation that reaches it
 * (serve.c), a hand-over request (another node localizes it), or a
 * localize by the home itself (lib/reloc). Until then no node spends
 * memory on it.
 */
#include <errno.h>
#include <stdlib.h>

#include "lib/ops/internal.h"

int ferry__ops_materialize_locked(struct ferry_table *t, uint64_t key, struct ferry_slot **s_p)
{
	struct ferry *fy = t->fy;
	uint32_t len = ferry__value_len(t, key), idx;
	struct ferry_slot *s;
	int rc;

	if (!t->params.sparse || ferry__home(t, key) != fy->rank || ferry__pend_find(&t->pend, key))
		return -EAGAIN;
	if ((s = ferry__own(t, key))) {
		*s_p = s;
		return 0;
	}
	rc = ferry__arena_alloc(&t->arena, &idx);
	if (rc == -ENOMEM)
		return rc; /* the budget: logged by the arena */
	if (rc) {
		if (!atomic_exchange(&t->full_logged, true))
			ferry_err(
				"table %u: rank %u has no free slot for new key %llu (capacity %u "
				"slots); raise the table's capacity",
				t->id, fy->rank, (unsigned long long)key, t->arena.capacity);
		return -ENOSPC;
	}
	s = ferry__arena_slot(&t->arena, idx);
	ferry__slot_install_init(&t->arena, s, key, &t->init, len);
	rc = ferry__dir_own_set(&t->dir, key, s);
	if (rc) {
		/* never published: nobody saw it */
		ferry__arena_free(&t->arena, idx);
		ferry_err("table %u: out of memory in the directory creating key %llu on rank %u",
			  t->id, (unsigned long long)key, fy->rank);
		return rc;
	}
	*s_p = s;
	return 0;
}

int ferry__ops_materialize(struct ferry_table *t, uint64_t key, struct ferry_slot **s_p)
{
	int rc;

	if (ferry__owner(t, key) != t->fy->rank)
		return -EAGAIN;
	pthread_mutex_lock(&t->pend.lock);
	rc = ferry__ops_materialize_locked(t, key, s_p);
	pthread_mutex_unlock(&t->pend.lock);
	return rc;
}

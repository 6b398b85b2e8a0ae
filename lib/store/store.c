/* SPDX-License-Identifier: MIT */
/* store.c - arenas of seqlocked slots (see store.h for the layout). */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <urcu/urcu-memb.h>

#include "lib/store/store.h"
#include "transport/base/log.h"

int ferry__arena_init(struct ferry_arena *a, uint32_t capacity, uint32_t max_len)
{
	size_t stride = FERRY_SLOT_HDR + (size_t)max_len * sizeof(float) + sizeof(uint64_t);

	memset(a, 0, sizeof(*a));
	stride = (stride + 63) & ~(size_t)63;
	a->stride = stride;
	a->capacity = capacity;
	a->bytes = stride * (size_t)(capacity ? capacity : 1);
	/* reserve address space only: pages appear as slots are first used */
	a->base = mmap(NULL, a->bytes, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (a->base == MAP_FAILED) {
		ferry_err(
			"store: cannot reserve %zu bytes for %u slots of %zu bytes: %s; lower the "
			"table's capacity",
			a->bytes, capacity, stride, strerror(errno));
		a->base = NULL;
		return -ENOMEM;
	}
	a->free_stack = malloc(sizeof(uint32_t) * (capacity ? capacity : 1));
	if (!a->free_stack) {
		munmap(a->base, a->bytes);
		a->base = NULL;
		return -ENOMEM;
	}
	pthread_mutex_init(&a->lock, NULL);
	return 0;
}

void ferry__arena_fini(struct ferry_arena *a)
{
	if (!a->base)
		return;
	munmap(a->base, a->bytes);
	free(a->free_stack);
	pthread_mutex_destroy(&a->lock);
	a->base = NULL;
}

int ferry__arena_alloc(struct ferry_arena *a, uint32_t *idx_p)
{
	struct ferry_slot *s;
	uint32_t idx;

	pthread_mutex_lock(&a->lock);
	if (a->nfree) {
		idx = a->free_stack[--a->nfree];
	} else if (a->next_fresh < a->capacity) {
		idx = a->next_fresh++;
	} else {
		pthread_mutex_unlock(&a->lock);
		return -ENOSPC;
	}
	pthread_mutex_unlock(&a->lock);
	s = ferry__arena_slot(a, idx);
	s->state = FERRY_SLOT_INCOMING;
	*idx_p = idx;
	return 0;
}

void ferry__arena_free(struct ferry_arena *a, uint32_t idx)
{
	struct ferry_slot *s = ferry__arena_slot(a, idx);

	/* a new epoch: a stale one-sided reader of the old key notices */
	s->epoch++;
	__atomic_store_n(&s->state, FERRY_SLOT_FREE, __ATOMIC_RELEASE);
	pthread_mutex_lock(&a->lock);
	a->free_stack[a->nfree++] = idx;
	pthread_mutex_unlock(&a->lock);
}

struct arena_deferred {
	struct rcu_head rcu;
	struct ferry_arena *arena;
	uint32_t idx;
};

static void arena_free_rcu(struct rcu_head *head)
{
	struct arena_deferred *d = caa_container_of(head, struct arena_deferred, rcu);

	__atomic_fetch_sub(&d->arena->ndeferred, 1, __ATOMIC_RELAXED);
	ferry__arena_free(d->arena, d->idx);
	free(d);
}

void ferry__arena_free_deferred(struct ferry_arena *a, uint32_t idx)
{
	struct arena_deferred *d = malloc(sizeof(*d));

	if (!d) {
		/* cannot defer: waiting for the grace period here is correct too */
		urcu_memb_synchronize_rcu();
		ferry__arena_free(a, idx);
		return;
	}
	d->arena = a;
	d->idx = idx;
	__atomic_fetch_add(&a->ndeferred, 1, __ATOMIC_RELAXED);
	urcu_memb_call_rcu(&d->rcu, arena_free_rcu);
}

uint32_t ferry__arena_avail(struct ferry_arena *a)
{
	uint32_t n;

	pthread_mutex_lock(&a->lock);
	n = a->nfree + (a->capacity - a->next_fresh);
	pthread_mutex_unlock(&a->lock);
	return n;
}

void ferry__arena_reclaim(struct ferry_arena *a)
{
	if (__atomic_load_n(&a->ndeferred, __ATOMIC_RELAXED))
		urcu_memb_barrier();
}

int ferry__slot_update(const struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
		       const float *in, uint32_t len, int add)
{
	uint64_t v = ferry__slot_lock(a, s);

	if (s->state != FERRY_SLOT_LIVE || s->key != key) {
		/* nothing written: give the version back unchanged */
		__atomic_store_n(&s->version, v, __ATOMIC_RELEASE);
		return -EAGAIN;
	}
	if (add) {
		float *restrict dst = s->val;
		const float *restrict src = in;

		/* vectorizes: the delta never aliases the slot */
		for (uint32_t i = 0; i < len; i++)
			dst[i] += src[i];
	} else {
		memcpy(s->val, in, (size_t)len * sizeof(float));
	}
	ferry__slot_unlock(a, s, v);
	return 0;
}

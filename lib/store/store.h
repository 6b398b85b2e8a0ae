/* SPDX-License-Identifier: MIT */
/*
 * store.h - the slot store: one arena of fixed-stride slots per table and
 * node, in memory the transport registers once.
 *
 *   slot (stride = multiple of 64 bytes)
 *   +---------+-----+-------+-------+-----+-----+----------------+---------+
 *   | version | key | epoch | state | len | pad | value: len f32 | version |
 *   +---------+-----+-------+-------+-----+-----+----------------+---------+
 *   0         8     16      20      24    28    32               stride-8
 *
 * The version is a seqlock: a writer makes it odd (a CAS from even, which
 * also excludes other writers), writes, copies the new even version into the
 * trailing word and then into the head. A reader copies the head, the value
 * and (for a one-sided READ, which sees the slot in address order) the tail,
 * and retries when the head is odd or differs from the tail or from a second
 * read of the head. key, epoch and state are checked too: a slot that moved
 * away says MOVED, and a freed slot is reused only after an RCU grace period
 * and with a new epoch, so a stale reader always notices.
 */
#ifndef FERRY_LIB_STORE_H
#define FERRY_LIB_STORE_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "transport/transport.h"

enum ferry_slot_state {
	FERRY_SLOT_FREE = 0,
	FERRY_SLOT_LIVE,     /* this node owns the key; the value is current */
	FERRY_SLOT_MOVED,    /* the key left; ask its home */
	FERRY_SLOT_INCOMING, /* reserved for a relocation under way */
};

struct ferry_slot {
	uint64_t version;
	uint64_t key;
	uint32_t epoch;
	uint32_t state;
	uint32_t len;
	uint32_t pad;
	float val[];
};

#define FERRY_SLOT_HDR ((size_t)sizeof(struct ferry_slot))

struct ferry_arena {
	uint8_t *base;
	size_t bytes;
	size_t stride;
	uint32_t capacity;
	pthread_mutex_t lock; /* the free list only */
	uint32_t *free_stack;
	uint32_t nfree;
	uint32_t next_fresh;	/* slots never used yet: [next_fresh, capacity) */
	uint32_t ndeferred;	/* freed, waiting for a grace period (atomic) */
	struct ferry_tp_mr *mr; /* NULL when the transport needs no registration */
};

int ferry__arena_init(struct ferry_arena *a, uint32_t capacity, uint32_t max_len);
void ferry__arena_fini(struct ferry_arena *a);

static inline struct ferry_slot *ferry__arena_slot(const struct ferry_arena *a, uint32_t idx)
{
	return (struct ferry_slot *)(a->base + (size_t)idx * a->stride);
}

static inline uint32_t ferry__arena_idx(const struct ferry_arena *a, const struct ferry_slot *s)
{
	return (uint32_t)(((const uint8_t *)s - a->base) / a->stride);
}

/* Reserve a slot (state INCOMING). Any thread. Return: 0 or -ENOSPC. */
int ferry__arena_alloc(struct ferry_arena *a, uint32_t *idx_p);
/* Give a slot back at once: only for a slot no reader can have seen
 * (never published); otherwise use ferry__arena_free_deferred(). */
void ferry__arena_free(struct ferry_arena *a, uint32_t idx);
/* Give a slot back after an RCU grace period (call_rcu); it returns with a
 * new epoch. Any RCU-registered thread; the slot is unpublished already. */
void ferry__arena_free_deferred(struct ferry_arena *a, uint32_t idx);

/* slots free now (a snapshot); any thread */
uint32_t ferry__arena_avail(struct ferry_arena *a);
/* make slots waiting for a grace period free now: call outside any RCU
 * read-side section and without locks the callbacks take */
void ferry__arena_reclaim(struct ferry_arena *a);

/* tail version word of a slot */
static inline uint64_t *ferry__slot_tail(const struct ferry_arena *a, struct ferry_slot *s)
{
	return (uint64_t *)((uint8_t *)s + a->stride - sizeof(uint64_t));
}

/*
 * Writer side. ferry__slot_lock() spins until it owns the slot (version odd)
 * and returns the even version it started from; ferry__slot_unlock() publishes
 * version + 2. Writers are this node's worker threads and its progress thread.
 *
 * The tail is made odd too, before the value changes: a one-sided reader
 * copies head, value, tail in address order, so if its copy of the value
 * overlaps a write, its tail is odd or newer than its head. (Were the tail
 * written only after the value, a reader could copy the old head, a torn
 * value and the old tail, and accept it: test_onesided catches that.)
 */
static inline uint64_t ferry__slot_lock(const struct ferry_arena *a, struct ferry_slot *s)
{
	uint64_t v = __atomic_load_n(&s->version, __ATOMIC_RELAXED);

	for (;;) {
		if (!(v & 1) && __atomic_compare_exchange_n(&s->version, &v, v + 1, 1,
							    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			break;
		__builtin_ia32_pause();
		v = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
	}
	__atomic_store_n(ferry__slot_tail(a, s), v + 1, __ATOMIC_RELAXED);
	/* order the odd versions before the writes that follow (for readers
	 * that see the writes, and for one-sided READs) */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	return v;
}

static inline void ferry__slot_unlock(const struct ferry_arena *a, struct ferry_slot *s, uint64_t v)
{
	__atomic_store_n(ferry__slot_tail(a, s), v + 2, __ATOMIC_RELEASE);
	__atomic_store_n(&s->version, v + 2, __ATOMIC_RELEASE);
}

/*
 * ferry__slot_read - copy a consistent value out of a slot
 * @key: the key the caller expects there
 *
 * Context: rcu_read_lock held (the slot stays mapped and is not reused).
 * Return: 0 with @out filled; -EAGAIN when the slot no longer holds @key
 * live (moved, freed, reused): look the key up again.
 */
static inline int ferry__slot_read(const struct ferry_slot *s, uint64_t key, float *out,
				   uint32_t len)
{
	for (;;) {
		uint64_t v1 = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
		uint32_t state;
		uint64_t k;

		if (__builtin_expect(v1 & 1, 0)) {
			__builtin_ia32_pause();
			continue;
		}
		state = __atomic_load_n(&s->state, __ATOMIC_RELAXED);
		k = __atomic_load_n(&s->key, __ATOMIC_RELAXED);
		/* races with writers by design: the version check below detects
		 * it (ThreadSanitizer runs suppress this function) */
		memcpy(out, s->val, (size_t)len * sizeof(float));
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__builtin_expect(__atomic_load_n(&s->version, __ATOMIC_RELAXED) != v1, 0))
			continue;
		if (__builtin_expect(state != FERRY_SLOT_LIVE || k != key, 0))
			return -EAGAIN;
		return 0;
	}
}

/*
 * ferry__slot_update - apply a push (add) or set to a live slot
 * Context: as ferry__slot_read. Return: 0, or -EAGAIN as above.
 */
int ferry__slot_update(const struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
		       const float *in, uint32_t len, int add);

#endif /* FERRY_LIB_STORE_H */

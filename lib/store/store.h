/* SPDX-License-Identifier: MIT */
/*
 * store.h - the slot store: one arena of fixed-stride slots per table and
 * node, in memory the transport registers once.
 *
 *   slot (stride = multiple of 64 bytes)
 *   +---------+-----+-------+-------+-----+-----+----------------+------+
 *   | version | key | epoch | state | len | pad | value: len f32 | seal |
 *   +---------+-----+-------+-------+-----+-----+----------------+------+
 *   0         8     16      20      24    28    32               stride-8
 *
 * Writers. The version is a seqlock: a writer makes it odd (a CAS from even,
 * which also excludes other writers), changes the slot, computes the seal of
 * what it wrote and stores it, then publishes version + 2. Every change of a
 * slot goes through that lock, the header's as well as the value's: alloc
 * (INCOMING), install (key, len, value, LIVE), MOVED, free (FREE and a new
 * epoch), push and set. So every change bumps the version and reseals. (An
 * update refused because the slot is not live gives the lock back with the
 * version it found: nothing changed, so the old seal still holds.)
 *
 * The seal is a 64-bit hash of the whole header, the version included, and
 * the value (ferry__slot_seal: XXH3-64 of the value seeds XXH3-64 of the
 * 32-byte header). Read validity rests on it, not on the order of reads:
 *
 * - A local reader (a thread of this node) uses the seqlock: it loads the
 *   version, then the header (relaxed atomic loads) and the value
 *   (ferry__slot_get), then, after an acquire fence, the version again;
 *   equal and even means no write overlapped the copy. The CPU's loads are
 *   coherent and the fences order them, so this proof needs no seal and
 *   costs no hash.
 * - A one-sided reader (a NIC's READ of the whole slot) has no such order: a
 *   READ is split into packets and PCIe reads that the hardware may serve in
 *   any order, so a version pair at both ends proves nothing about the
 *   middle. It accepts an image only when the image's seal equals the seal
 *   computed over the image's own header and value. The seal word changes
 *   only when a write ends, to the seal of the state that write leaves: any
 *   seal an image holds is seal(S) of one whole state S. If every other byte
 *   of the image is S's, the image is S, whatever order its bytes came in.
 *   If any byte is not (it came from before or after S, or from the middle
 *   of a write), the image differs from S, its version included, and it
 *   passes only if two different inputs have the same 64-bit hash: about
 *   2^-64 per torn image. Versions only grow, so no two states share one.
 *
 * key, epoch and state are checked after the seal: a slot that moved away
 * says MOVED, and a freed slot is reused only after an RCU grace period and
 * with a new epoch, so a stale reader always notices. ferry__slot_check() is
 * the one place that decides, for both kinds of reader.
 */
#ifndef FERRY_LIB_STORE_H
#define FERRY_LIB_STORE_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "transport/base/cpu.h"
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

struct arena_deferred;

/*
 * A node's memory budget for table values: the bytes of the slots in use
 * in all its arenas (a slot counts from its alloc until it is free again,
 * after its grace period). An arena hands out fresh slots only when none is
 * free, so the slot pages a table ever touched stay within the budget too.
 * The directory (keymap.h: 32-64 B per owned key, plus the fixed location
 * cache) is not counted.
 */
struct ferry_budget {
	uint64_t limit;	   /* bytes; 0: no budget */
	uint64_t used;	   /* atomic */
	int64_t logged_ns; /* atomic: when the budget was last said to be used up */
};

/*
 * Chunks. The arena reserves address space for all its slots at once
 * (mmap, MAP_NORESERVE: pages appear as slots are first used) and makes it
 * usable a chunk at a time: 1 << chunk_shift slots, about 2 MiB of them,
 * or a 16th of a smaller arena (64 slots at least; more when the capacity
 * needs more than FERRY_ARENA_CHUNKS_MAX chunks).
 * A fresh slot is handed out only from a chunk that on_chunk() made usable
 * (on rdma: registered, one MR and rkey per chunk), so registered (pinned)
 * memory follows the most slots the node ever had in use, rounded up to a
 * chunk. Policy: a chunk is never given back while the table lives (slots
 * freed are reused first, from the free list); the table's destroy
 * deregisters them all. A slot keeps its address, so one-sided readers
 * address it by (base, index) and take the chunk's rkey.
 */
#define FERRY_ARENA_CHUNKS_MAX 256u
#define FERRY_ARENA_CHUNK_BYTES (2u << 20)

struct ferry_arena;
/* make chunk @c usable (register it); Return: 0 or a negative errno (no
 * slot of it is handed out). Context: any thread that allocates, the
 * arena's grow_lock held (never its lock): it must not wait for the
 * progress thread. */
typedef int (*ferry_arena_chunk_fn)(void *arg, struct ferry_arena *a, uint32_t c);

struct ferry_arena {
	uint8_t *base;
	size_t bytes;
	size_t stride;
	uint32_t capacity;
	uint32_t chunk_shift;	       /* a chunk is 1 << chunk_shift slots */
	uint32_t nchunks;	       /* chunks that cover the capacity */
	uint32_t chunks_ready;	       /* usable chunks: [0, chunks_ready) (lock; atomic reads) */
	pthread_mutex_t grow_lock;     /* one chunk made at a time */
	ferry_arena_chunk_fn on_chunk; /* NULL: every chunk is usable at once */
	void *chunk_arg;
	uint32_t max_len;     /* floats a slot holds */
	pthread_mutex_t lock; /* the free list only */
	uint32_t *free_stack;
	uint32_t nfree;
	uint32_t next_fresh;		 /* slots never used yet: [next_fresh, capacity) */
	uint32_t ndeferred;		 /* freed, waiting for a grace period (atomic) */
	struct arena_deferred *deferred; /* one record per slot: a deferred free never allocates */
	struct ferry_budget *budget;	 /* the node's, or NULL */
};

/* @budget: the node's memory budget, or NULL. on_chunk/chunk_arg may be set
 * after it, before the first alloc. */
int ferry__arena_init(struct ferry_arena *a, uint32_t capacity, uint32_t max_len,
		      struct ferry_budget *budget);

/* chunk @c's first slot and its slot count */
static inline void ferry__arena_chunk_span(const struct ferry_arena *a, uint32_t c, uint32_t *first,
					   uint32_t *n)
{
	uint64_t lo = (uint64_t)c << a->chunk_shift, hi = lo + (1ull << a->chunk_shift);

	if (hi > a->capacity)
		hi = a->capacity;
	*first = (uint32_t)lo;
	*n = (uint32_t)(hi - lo);
}
void ferry__arena_fini(struct ferry_arena *a);

static inline struct ferry_slot *ferry__arena_slot(const struct ferry_arena *a, uint32_t idx)
{
	return (struct ferry_slot *)(a->base + (size_t)idx * a->stride);
}

static inline uint32_t ferry__arena_idx(const struct ferry_arena *a, const struct ferry_slot *s)
{
	return (uint32_t)(((const uint8_t *)s - a->base) / a->stride);
}

/*
 * ferry__arena_alloc - reserve a slot: state INCOMING, under the slot's lock
 * (a new version and seal). Any thread, inside or outside an RCU read-side
 * section: it never waits for a grace period (the first slot of a chunk
 * waits for on_chunk(), a registration). Return: 0; -ENOSPC (every slot in
 * use); -ENOMEM (the node's budget is used up: logged, at most once a
 * second, with the way to raise it); on_chunk()'s error.
 */
int ferry__arena_alloc(struct ferry_arena *a, uint32_t *idx_p);
/* Give a slot back at once, with a new epoch and state FREE (under the
 * slot's lock): only for a slot no reader can have seen (never published);
 * otherwise use ferry__arena_free_deferred(). Any thread. */
void ferry__arena_free(struct ferry_arena *a, uint32_t idx);
/* Give a slot back after an RCU grace period (call_rcu); it returns with a
 * new epoch. Any RCU-registered thread, the progress thread and handlers
 * inside their read-side section included: it never waits and never
 * allocates. The slot is unpublished already. */
void ferry__arena_free_deferred(struct ferry_arena *a, uint32_t idx);

/* slots free now (a snapshot); any thread */
uint32_t ferry__arena_avail(struct ferry_arena *a);
/* of those, the ones used before (not fresh): a snapshot; any thread */
uint32_t ferry__arena_nfree(struct ferry_arena *a);
/*
 * ferry__arena_reclaim - make slots waiting for a grace period free now
 *
 * Waits for the grace periods (rcu_barrier), so: a registered thread outside
 * any RCU read-side section, holding no lock the callbacks take - a worker's
 * thread starting a localize. Inside a read-side section (the progress
 * thread's handlers run in one) the wait would be for itself: liburcu 0.13's
 * rcu_barrier refuses with an error line, synchronize_rcu hangs. There it
 * waits for nothing and returns -EAGAIN; the caller then finds the arena as
 * full as it is and fails with -ENOSPC.
 * Return: 0, or -EAGAIN (called inside a read-side section: nothing done).
 */
int ferry__arena_reclaim(struct ferry_arena *a);

/* the seal word of a slot, or of a copy of one that is @stride bytes long */
static inline uint64_t *ferry__slot_seal_p(const struct ferry_slot *s, size_t stride)
{
	return (uint64_t *)((uint8_t *)s + stride - sizeof(uint64_t));
}

/*
 * ferry__slot_seal - the seal of a header (its version is the one sealed)
 * and @len floats of value. A writer seals its slot before it publishes the
 * version; a one-sided reader seals its image to check it. Any thread.
 */
uint64_t ferry__slot_seal(const struct ferry_slot *hdr, const float *val, uint32_t len);

/*
 * Writer side. ferry__slot_lock() spins until it owns the slot (version odd)
 * and returns the even version it started from; ferry__slot_unlock() seals
 * what is there now and publishes version + 2; ferry__slot_unlock_unchanged()
 * gives the lock back with the version it found, for a writer that changed
 * nothing. Writers are this node's worker threads, its progress thread and
 * its RCU callback thread (deferred frees). Between lock and unlock, code
 * outside store.c changes a slot only through ferry__slot_set_state();
 * store.c's writers store header and value with relaxed atomic stores too,
 * so readers' concurrent loads of them (the header's, a one-sided READ's)
 * are no data race; the value copy of ferry__slot_get() is the exception
 * that function's comment justifies.
 */
static inline uint64_t ferry__slot_lock(const struct ferry_arena *a, struct ferry_slot *s)
{
	uint64_t v = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
	unsigned round = 0;

	for (;;) {
		if (!(v & 1) && __atomic_compare_exchange_n(&s->version, &v, v + 1, 1,
							    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			break;
		/* a writer preempted with the version odd must get the CPU back */
		ferry__spin(&round);
		v = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
	}
	/* order the odd version before the writes that follow, for local
	 * readers (a one-sided reader relies on the seal, not on order) */
	__atomic_thread_fence(__ATOMIC_RELEASE);
	return v;
}

void ferry__slot_unlock(const struct ferry_arena *a, struct ferry_slot *s, uint64_t v);

static inline void ferry__slot_unlock_unchanged(struct ferry_slot *s, uint64_t v)
{
	__atomic_store_n(&s->version, v, __ATOMIC_RELEASE);
}

/* header fields; the slot's lock held */
static inline void ferry__slot_set_state(struct ferry_slot *s, enum ferry_slot_state state)
{
	__atomic_store_n(&s->state, (uint32_t)state, __ATOMIC_RELAXED);
}

/*
 * ferry__slot_install - make a slot reserved with ferry__arena_alloc() the
 * live copy of @key: key, len, @len floats of @val (zeros when @val is NULL),
 * state LIVE, one new version and seal. Publish it (own[key]) only after.
 * Context: the thread that reserved the slot, or the progress thread.
 */
void ferry__slot_install(const struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
			 const float *val, uint32_t len);

struct ferry_init_spec;

/* ferry__slot_install with the table's initial value of @key, computed
 * into the slot (no buffer: never fails). Context: as ferry__slot_install. */
void ferry__slot_install_init(const struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
			      const struct ferry_init_spec *spec, uint32_t len);

/* ---- readers ----------------------------------------------------------- */

#define FERRY_SLOT_ANY_EPOCH UINT32_MAX

/* what proves that a copy of a slot is one whole state */
enum ferry_slot_proof {
	/* the copy was made by this node's CPU: the version read again after
	 * the copy (acquire fence between) equals the version read before */
	FERRY_SLOT_BY_VERSION,
	/* the copy came in any order (a one-sided READ): the copy's seal word
	 * is the seal of the copy's own header and value */
	FERRY_SLOT_BY_SEAL,
};

/*
 * ferry__slot_check - may a copy of a slot be served as @key's value?
 * @h:       the copy's header (version, key, epoch, state, len)
 * @val:     the copy's value (BY_SEAL: @h->len floats are sealed)
 * @max_len: floats the copy can hold (BY_SEAL bounds @h->len with it)
 * @witness: BY_VERSION: the version read after the copy; BY_SEAL: the
 *           copy's seal word
 * @key, @len: what the reader expects; @epoch16: the low 16 bits of the
 *           epoch its hint names, or FERRY_SLOT_ANY_EPOCH
 *
 * The one decision both readers make: the local one (ferry__slot_read,
 * BY_VERSION) and the one-sided one (lib/ops/onesided.c, BY_SEAL). Pure: any
 * thread. Return: 0 the copy is @key's live value; -EBUSY the copy is torn
 * (a write overlapped it): copy again; -EAGAIN it is whole, but the slot
 * does not hold @key live (with that epoch): look the key up again.
 */
static inline int ferry__slot_check(const struct ferry_slot *h, const float *val, uint32_t max_len,
				    uint64_t witness, enum ferry_slot_proof proof, uint64_t key,
				    uint32_t epoch16, uint32_t len)
{
	if (__builtin_expect(h->version & 1, 0))
		return -EBUSY;
	if (proof == FERRY_SLOT_BY_VERSION) {
		if (__builtin_expect(witness != h->version, 0))
			return -EBUSY;
	} else if (h->len > max_len || witness != ferry__slot_seal(h, val, h->len)) {
		return -EBUSY;
	}
	if (__builtin_expect(h->state != FERRY_SLOT_LIVE || h->key != key || h->len != len, 0))
		return -EAGAIN;
	if (epoch16 != FERRY_SLOT_ANY_EPOCH && (h->epoch & 0xffff) != epoch16)
		return -EAGAIN;
	return 0;
}

/*
 * ferry__slot_get - copy @len floats out of a slot's value, for a seqlock
 * reader: the one data race the store keeps, on purpose, and why it is
 * benign.
 *
 * It is a plain memcpy because relaxed atomic loads, 8 bytes at a time,
 * cannot be vectorized: ferry-bench measured local pulls of 256 B 1.5x
 * slower with them and of 4 KiB 1.6-2.8x (a hot 4 KiB pull 50 -> 110-140 ns).
 * The race cannot do harm:
 * - every store into a value is made under the slot's lock (version odd),
 *   as a relaxed atomic store (store.c), and nothing else writes a value;
 * - the reader loads the version (acquire) before the copy and again after
 *   it (behind an acquire fence); the writer orders its odd version before
 *   its stores (release fence) and its stores before the next even version
 *   (release store). So a copy that saw any byte of a write sees the
 *   version odd or changed, and ferry__slot_read throws it away unread;
 * - memcpy is an opaque call into the caller's buffer: the compiler cannot
 *   re-load a byte after the check or invent a load the check did not cover.
 * tests/tsan.supp suppresses races with this function on the stack, and only
 * those: races on header words, in writers, between writers, or of
 * one-sided readers stay reported.
 */
static inline void ferry__slot_get(float *out, const struct ferry_slot *s, uint32_t len)
{
	memcpy(out, s->val, (size_t)len * sizeof(float));
}

/*
 * ferry__slot_read - copy a consistent value out of a slot
 * @key: the key the caller expects there
 *
 * A seqlock read: no lock, no hash. Context: any thread; the slot stays
 * mapped as long as the table's arena (no RCU read-side section needed).
 * Return: 0 with @out filled; -EAGAIN when the slot no longer holds @key
 * live (moved, freed, reused): look the key up again.
 */
static inline int ferry__slot_read(const struct ferry_slot *s, uint64_t key, float *out,
				   uint32_t len)
{
	unsigned round = 0;

	for (;;) {
		struct ferry_slot h;
		uint64_t v2;
		int rc;

		h.version = __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
		if (__builtin_expect(h.version & 1, 0)) {
			ferry__spin(&round);
			continue;
		}
		ferry__slot_get(out, s, len);
		/* the header after the value: nothing to keep across the copy, and
		 * still between the two loads of the version */
		h.key = __atomic_load_n(&s->key, __ATOMIC_RELAXED);
		h.epoch = 0;
		h.state = __atomic_load_n(&s->state, __ATOMIC_RELAXED);
		h.len = __atomic_load_n(&s->len, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		v2 = __atomic_load_n(&s->version, __ATOMIC_RELAXED);
		rc = ferry__slot_check(&h, out, len, v2, FERRY_SLOT_BY_VERSION, key,
				       FERRY_SLOT_ANY_EPOCH, len);
		if (__builtin_expect(rc != -EBUSY, 1))
			return rc;
	}
}

/*
 * ferry__slot_update - apply a push (add) or set to a live slot
 * Context: as ferry__slot_read. Return: 0, or -EAGAIN as above (nothing
 * written, the version as it was).
 */
int ferry__slot_update(const struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
		       const float *in, uint32_t len, int add);

#endif /* FERRY_LIB_STORE_H */

/* SPDX-License-Identifier: MIT */
/* store.c - arenas of sealed, seqlocked slots (see store.h for the layout). */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <urcu/urcu-memb.h>

/*
 * The seal is XXH3-64 (Debian's libxxhash): built for exactly this, hashing
 * memory at several GB/s with a 64-bit result, and its output is the same on
 * every CPU whatever vector width computes it, so an owner and a reader of
 * different builds agree. Values up to XXH3's mid size are hashed inline
 * (no call, no dispatch); longer ones through the library's runtime
 * dispatch, which picks AVX2 or AVX-512 where the CPU has them (a 4 KiB
 * value: about 230 ns with the SSE2 baseline, 70-110 ns dispatched).
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#ifdef FERRY_XXH_DISPATCH
/* xxh_x86dispatch.h declares it, but cannot be included beside XXH_INLINE_ALL */
XXH64_hash_t XXH3_64bits_dispatch(const void *input, size_t len);
#define FERRY_XXH_LONG XXH3_64bits_dispatch
#else
#define FERRY_XXH_LONG XXH3_64bits
#endif

#include "lib/store/init.h"
#include "lib/store/store.h"
#include "transport/base/log.h"

/* a deferred free's record: one per slot, so call_rcu never needs malloc */
struct arena_deferred {
	struct rcu_head rcu;
	struct ferry_arena *arena;
	uint32_t idx;
};

#ifdef FERRY_XXH_DISPATCH
/*
 * libxxhash 0.8.1's AVX2/AVX-512 paths return without vzeroupper; the dirty
 * upper state then slows the caller's later SSE code (ferry-bench's plain C
 * baseline run after a push cell: 42 -> 72 ns for 256 B). Clear it.
 */
__attribute__((target("avx"))) static void slot_zeroupper(void)
{
	__builtin_ia32_vzeroupper();
}
#endif

/* the value's half of a seal */
static uint64_t slot_seal_val(const float *val, uint32_t len)
{
	size_t bytes = (size_t)len * sizeof(float);
	uint64_t h;

	if (bytes <= XXH3_MIDSIZE_MAX)
		return XXH3_64bits(val, bytes);
	h = FERRY_XXH_LONG(val, bytes);
#ifdef FERRY_XXH_DISPATCH
	if (__builtin_cpu_supports("avx"))
		slot_zeroupper();
#endif
	return h;
}

/* the header's hash, seeded with the value's: both halves in one word */
static uint64_t slot_seal_hdr(const struct ferry_slot *hdr, uint64_t hv)
{
	return XXH3_64bits_withSeed(hdr, FERRY_SLOT_HDR, hv);
}

uint64_t ferry__slot_seal(const struct ferry_slot *hdr, const float *val, uint32_t len)
{
	return slot_seal_hdr(hdr, slot_seal_val(val, len));
}

int ferry__arena_init(struct ferry_arena *a, uint32_t capacity, uint32_t max_len,
		      struct ferry_budget *budget)
{
	size_t stride = FERRY_SLOT_HDR + (size_t)max_len * sizeof(float) + sizeof(uint64_t);

	memset(a, 0, sizeof(*a));
	stride = (stride + 63) & ~(size_t)63;
	a->stride = stride;
	a->capacity = capacity;
	/* what the stride holds, at least max_len */
	a->max_len = (uint32_t)((stride - FERRY_SLOT_HDR - sizeof(uint64_t)) / sizeof(float));
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
	/* calloc: large ones are fresh zero pages, touched only by slots that leave */
	a->deferred = calloc(capacity ? capacity : 1, sizeof(*a->deferred));
	if (!a->free_stack || !a->deferred) {
		ferry_err("store: out of memory for the free list of %u slots; lower the "
			  "table's capacity",
			  capacity);
		free(a->free_stack);
		free(a->deferred);
		munmap(a->base, a->bytes);
		a->base = NULL;
		return -ENOMEM;
	}
	pthread_mutex_init(&a->lock, NULL);
	pthread_mutex_init(&a->grow_lock, NULL);
	a->budget = budget;
	/* a power of two of slots a chunk: about 2 MiB, or a 16th of a smaller
	 * arena (64 slots at least); at most FERRY_ARENA_CHUNKS_MAX chunks */
	{
		size_t target = (size_t)a->capacity * stride / 16;

		if (target > FERRY_ARENA_CHUNK_BYTES)
			target = FERRY_ARENA_CHUNK_BYTES;
		a->chunk_shift = 6;
		while (((size_t)1 << a->chunk_shift) * stride < target && a->chunk_shift < 31)
			a->chunk_shift++;
	}
	while (((uint64_t)a->capacity + (1ull << a->chunk_shift) - 1) >> a->chunk_shift >
	       FERRY_ARENA_CHUNKS_MAX)
		a->chunk_shift++;
	a->nchunks = (uint32_t)(((uint64_t)a->capacity + (1ull << a->chunk_shift) - 1) >>
				a->chunk_shift);
	a->chunks_ready = 0;
	return 0;
}

/*
 * Map the pages of @len bytes at @p (fresh, zero), written: one
 * MADV_POPULATE_WRITE (Linux 5.14) faults them in the kernel without a trap
 * per page (the traps were a large part of a batch localize of fresh keys:
 * docs/benchmarks.md). The pages at both ends may hold slots of the neighbouring
 * chunks: those are zero too and populating a mapped page changes nothing.
 * An older kernel (EINVAL) gets the memset, which faults page by page.
 */
static void arena_populate(uint8_t *p, size_t len)
{
#ifdef MADV_POPULATE_WRITE
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)p & ~(pg - 1), hi = ((uintptr_t)p + len + pg - 1) & ~(pg - 1);

	if (!madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE))
		return;
#endif
	memset(p, 0, len);
}

/* make the chunk of slot @idx usable; Return: 0 or the hook's error */
static int arena_grow(struct ferry_arena *a, uint32_t c)
{
	int rc = 0;

	pthread_mutex_lock(&a->grow_lock);
	if (__atomic_load_n(&a->chunks_ready, __ATOMIC_ACQUIRE) <= c) {
		uint32_t first, n;

		/* written before use: a slot's first access is a read (its lock),
		 * which would map the zero page and make the write after it a
		 * copy with a TLB shootdown (an IPI to every CPU) per page */
		ferry__arena_chunk_span(a, c, &first, &n);
		arena_populate(a->base + (size_t)first * a->stride, (size_t)n * a->stride);
		rc = a->on_chunk ? a->on_chunk(a->chunk_arg, a, c) : 0;
		if (!rc) {
			pthread_mutex_lock(&a->lock);
			__atomic_store_n(&a->chunks_ready, c + 1, __ATOMIC_RELEASE);
			pthread_mutex_unlock(&a->lock);
		}
	}
	pthread_mutex_unlock(&a->grow_lock);
	return rc;
}

/* take a slot's bytes from the budget; Return: 0 or -ENOMEM (logged) */
static int arena_budget_take(struct ferry_arena *a)
{
	struct ferry_budget *b = a->budget;
	uint64_t used;

	if (!b || !b->limit)
		return 0;
	used = __atomic_load_n(&b->used, __ATOMIC_RELAXED);
	do {
		if (used + a->stride > b->limit) {
			struct timespec ts;
			int64_t now, last = __atomic_load_n(&b->logged_ns, __ATOMIC_RELAXED);

			clock_gettime(CLOCK_MONOTONIC, &ts);
			now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
			if (now - last > 1000000000 &&
			    __atomic_compare_exchange_n(&b->logged_ns, &last, now, 0,
							__ATOMIC_RELAXED, __ATOMIC_RELAXED))
				ferry_err(
					"store: the memory budget of %llu bytes is used up (%llu "
					"bytes in slots); new keys and localizes here fail with "
					"ENOMEM: raise FERRY_MEM_LIMIT (or params.mem_limit), or move "
					"keys to other nodes",
					(unsigned long long)b->limit, (unsigned long long)used);
			return -ENOMEM;
		}
	} while (!__atomic_compare_exchange_n(&b->used, &used, used + a->stride, 1,
					      __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	return 0;
}

static void arena_budget_give(struct ferry_arena *a)
{
	if (a->budget && a->budget->limit)
		__atomic_fetch_sub(&a->budget->used, a->stride, __ATOMIC_RELAXED);
}

void ferry__arena_fini(struct ferry_arena *a)
{
	if (!a->base)
		return;
	munmap(a->base, a->bytes);
	free(a->free_stack);
	free(a->deferred);
	pthread_mutex_destroy(&a->lock);
	pthread_mutex_destroy(&a->grow_lock);
	a->base = NULL;
}

/* ---- writers ----------------------------------------------------------- */

/* seal and publish version @v + 2; @hv: the value's hash */
static void slot_unlock_hv(const struct ferry_arena *a, struct ferry_slot *s, uint64_t v,
			   uint64_t hv)
{
	/* the header as readers will see it: under the version it gets now */
	struct ferry_slot h = {
		.version = v + 2,
		.key = s->key,
		.epoch = s->epoch,
		.state = s->state,
		.len = s->len,
		.pad = s->pad,
	};

	__atomic_store_n(ferry__slot_seal_p(s, a->stride), slot_seal_hdr(&h, hv), __ATOMIC_RELAXED);
	__atomic_store_n(&s->version, v + 2, __ATOMIC_RELEASE);
}

void ferry__slot_unlock(const struct ferry_arena *a, struct ferry_slot *s, uint64_t v)
{
	assert((v & 1) == 0 && s->len <= a->max_len);
	slot_unlock_hv(a, s, v, slot_seal_val(s->val, s->len));
}

/* the value, 8 bytes at a time (the value starts 8-byte aligned); @src may be
 * any float array */
static void slot_put(struct ferry_slot *s, const float *src, uint32_t len)
{
	uint64_t *dst = (uint64_t *)s->val;
	uint32_t n = len / 2;

#pragma GCC unroll 4
	for (uint32_t i = 0; i < n; i++) {
		uint64_t w;

		memcpy(&w, src + 2 * i, 8);
		__atomic_store_n(&dst[i], w, __ATOMIC_RELAXED);
	}
	if (len & 1) {
		uint32_t w;

		memcpy(&w, src + len - 1, 4);
		__atomic_store_n((uint32_t *)&s->val[len - 1], w, __ATOMIC_RELAXED);
	}
}

/* zeros, storing only where the value is not zero already: a table's fresh
 * slots stay untouched pages (the arena is reserved, not committed) */
static void slot_zero(struct ferry_slot *s, uint32_t len)
{
	uint32_t *dst = (uint32_t *)s->val;

	for (uint32_t i = 0; i < len; i++)
		if (__atomic_load_n(&dst[i], __ATOMIC_RELAXED))
			__atomic_store_n(&dst[i], 0, __ATOMIC_RELAXED);
}

static void slot_add(struct ferry_slot *s, const float *src, uint32_t len)
{
	uint64_t *dst = (uint64_t *)s->val;
	uint32_t n = len / 2;

#pragma GCC unroll 4
	for (uint32_t i = 0; i < n; i++) {
		uint64_t w = __atomic_load_n(&dst[i], __ATOMIC_RELAXED);
		float f[2];

		memcpy(f, &w, 8);
		f[0] += src[2 * i];
		f[1] += src[2 * i + 1];
		memcpy(&w, f, 8);
		__atomic_store_n(&dst[i], w, __ATOMIC_RELAXED);
	}
	if (len & 1) {
		uint32_t *d = (uint32_t *)&s->val[len - 1];
		uint32_t w = __atomic_load_n(d, __ATOMIC_RELAXED);
		float f;

		memcpy(&f, &w, 4);
		f += src[len - 1];
		memcpy(&w, &f, 4);
		__atomic_store_n(d, w, __ATOMIC_RELAXED);
	}
}

void ferry__slot_install(const struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
			 const float *val, uint32_t len)
{
	uint64_t v = ferry__slot_lock(a, s);

	assert(s->state == FERRY_SLOT_INCOMING && len <= a->max_len);
	__atomic_store_n(&s->key, key, __ATOMIC_RELAXED);
	__atomic_store_n(&s->len, len, __ATOMIC_RELAXED);
	if (val)
		slot_put(s, val, len);
	else
		slot_zero(s, len);
	ferry__slot_set_state(s, FERRY_SLOT_LIVE);
	ferry__slot_unlock(a, s, v);
}

void ferry__slot_install_init(const struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
			      const struct ferry_init_spec *spec, uint32_t len)
{
	uint64_t v;

	if (spec->kind == FERRY_INIT_ZERO) {
		ferry__slot_install(a, s, key, NULL, len);
		return;
	}
	v = ferry__slot_lock(a, s);
	assert(s->state == FERRY_SLOT_INCOMING && len <= a->max_len);
	__atomic_store_n(&s->key, key, __ATOMIC_RELAXED);
	__atomic_store_n(&s->len, len, __ATOMIC_RELAXED);
	for (uint32_t off = 0; off < len; off += 64) {
		float buf[64];
		uint32_t n = len - off < 64 ? len - off : 64;
		uint32_t *dst = (uint32_t *)&s->val[off];

		ferry__init_value(spec, key, off, buf, n);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t w;

			memcpy(&w, &buf[i], 4);
			__atomic_store_n(&dst[i], w, __ATOMIC_RELAXED);
		}
	}
	ferry__slot_set_state(s, FERRY_SLOT_LIVE);
	ferry__slot_unlock(a, s, v);
}

int ferry__slot_update(const struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
		       const float *in, uint32_t len, int add)
{
	/* a set knows its value before it locks: hash it outside, so readers
	 * wait for the stores only (a push must hash what the add left) */
	uint64_t hv = add ? 0 : slot_seal_val(in, len);
	uint64_t v = ferry__slot_lock(a, s);

	if (s->state != FERRY_SLOT_LIVE || s->key != key || s->len != len) {
		/* nothing written: the version (and so the seal) as they were */
		ferry__slot_unlock_unchanged(s, v);
		return -EAGAIN;
	}
	if (add) {
		slot_add(s, in, len);
		hv = slot_seal_val(s->val, len);
	} else {
		slot_put(s, in, len);
	}
	slot_unlock_hv(a, s, v, hv);
	return 0;
}

/* ---- the arena --------------------------------------------------------- */

int ferry__arena_alloc(struct ferry_arena *a, uint32_t *idx_p)
{
	struct ferry_slot *s;
	uint32_t idx;
	uint64_t v;

	if (arena_budget_take(a))
		return -ENOMEM;
	for (;;) {
		uint32_t c;
		int rc;

		pthread_mutex_lock(&a->lock);
		if (a->nfree) {
			idx = a->free_stack[--a->nfree];
			break;
		}
		if (a->next_fresh >= a->capacity) {
			pthread_mutex_unlock(&a->lock);
			arena_budget_give(a);
			return -ENOSPC;
		}
		c = a->next_fresh >> a->chunk_shift;
		if (c < a->chunks_ready) {
			idx = a->next_fresh++;
			break;
		}
		pthread_mutex_unlock(&a->lock);
		/* the next fresh slot is in a chunk nobody made usable yet */
		rc = arena_grow(a, c);
		if (rc) {
			arena_budget_give(a);
			return rc;
		}
	}
	pthread_mutex_unlock(&a->lock);
	/* under the lock: a stale local writer may still try the slot, and a
	 * one-sided reader with an old hint may read it */
	s = ferry__arena_slot(a, idx);
	v = ferry__slot_lock(a, s);
	ferry__slot_set_state(s, FERRY_SLOT_INCOMING);
	ferry__slot_unlock(a, s, v);
	*idx_p = idx;
	return 0;
}

void ferry__arena_free(struct ferry_arena *a, uint32_t idx)
{
	struct ferry_slot *s = ferry__arena_slot(a, idx);
	uint64_t v = ferry__slot_lock(a, s);

	/* a new epoch: a stale one-sided reader of the old key notices */
	__atomic_store_n(&s->epoch, s->epoch + 1, __ATOMIC_RELAXED);
	ferry__slot_set_state(s, FERRY_SLOT_FREE);
	ferry__slot_unlock(a, s, v);
	pthread_mutex_lock(&a->lock);
	a->free_stack[a->nfree++] = idx;
	pthread_mutex_unlock(&a->lock);
	arena_budget_give(a);
}

static void arena_free_rcu(struct rcu_head *head)
{
	struct arena_deferred *d = caa_container_of(head, struct arena_deferred, rcu);
	struct ferry_arena *a = d->arena;

	ferry__arena_free(a, d->idx);
	__atomic_fetch_sub(&a->ndeferred, 1, __ATOMIC_RELEASE);
}

void ferry__arena_free_deferred(struct ferry_arena *a, uint32_t idx)
{
	/* the slot's own record: a slot waits for one grace period at a time */
	struct arena_deferred *d = &a->deferred[idx];

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

uint32_t ferry__arena_nfree(struct ferry_arena *a)
{
	uint32_t n;

	pthread_mutex_lock(&a->lock);
	n = a->nfree;
	pthread_mutex_unlock(&a->lock);
	return n;
}

int ferry__arena_reclaim(struct ferry_arena *a)
{
	if (urcu_memb_read_ongoing())
		return -EAGAIN; /* rcu_barrier here would wait for this very section */
	if (__atomic_load_n(&a->ndeferred, __ATOMIC_ACQUIRE))
		urcu_memb_barrier();
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * fastrd.h - read-side sections for the local fast path, without a call
 * into liburcu.
 *
 * A local pull of an owned key looks the key up in the directory (a
 * keymap, lib/dir/keymap.h) and reads its slot. The directory's array can
 * be rebuilt, and the old one must not be freed under a reader. liburcu's
 * memb flavor protects it, but its rcu_read_lock()/unlock() are calls into
 * the library with a TLS lookup each: ferry-bench measured a hot local pull
 * of 8 bytes at 11 ns without them and 22 ns with them. liburcu 0.13 inlines
 * them only under _LGPL_SOURCE, which Ferry's license does not take.
 *
 * So the fast path has a section of its own, built the way memb builds its
 * own: each worker has a cell whose counter is odd while the worker is
 * inside a fast-path section. Entering is one plain store and a compiler
 * barrier; leaving is one release store. The writer that retires an array
 * publishes the new one; later, membarrier(PRIVATE_EXPEDITED) makes every
 * running thread of the process execute a full barrier: after it, a reader
 * that could still use the old array has its odd counter
 * visible. The array is freed by an RCU callback (after a grace period, for
 * readers under rcu_read_lock), which makes that membarrier (so the writer
 * pays no system call) and then waits, yielding, until each odd counter
 * moved on (that section ended; a section is one batch of local
 * operations). Without membarrier (a
 * kernel before 4.14), readers add a full fence on entry instead.
 *
 * Cells live in the node for its whole life (one per worker slot, 64 bytes
 * each: FERRY_FASTRD_MAX x 64 = 64 KiB per node); a cell's counter only
 * grows, across the workers that use the slot in turn.
 */
#ifndef FERRY_LIB_DIR_FASTRD_H
#define FERRY_LIB_DIR_FASTRD_H

#include <stdint.h>

#define FERRY_FASTRD_MAX 1024u /* = FERRY_MAX_WORKERS */

struct ferry_fastrd_cell {
	uint64_t seq; /* odd: inside a section */
} __attribute__((aligned(64)));

struct ferry_fastrd {
	struct ferry_fastrd_cell cell[FERRY_FASTRD_MAX];
};

/* 1 when readers must fence on entry (no membarrier) */
extern int ferry__fastrd_fence;

/* Return: 0. Context: node setup (registers the process for membarrier
 * once). */
int ferry__fastrd_init(struct ferry_fastrd *f);

static inline void ferry__fastrd_enter(struct ferry_fastrd_cell *c)
{
	__atomic_store_n(&c->seq, __atomic_load_n(&c->seq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
	if (__builtin_expect(ferry__fastrd_fence, 0))
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
	else
		__atomic_signal_fence(__ATOMIC_SEQ_CST); /* the writer's membarrier fences */
}

static inline void ferry__fastrd_leave(struct ferry_fastrd_cell *c)
{
	__atomic_store_n(&c->seq, __atomic_load_n(&c->seq, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
}

/*
 * The writer's side. ferry__fastrd_retire(), right after publishing a new
 * pointer, numbers the retirement; ferry__fastrd_sync(n), later, returns
 * once every fast reader that may hold the old pointer has its counter odd
 * and visible: a membarrier, unless one that began after retirement @n was
 * made already. Context: any thread; a system call at most.
 */
uint64_t ferry__fastrd_retire(void);
void ferry__fastrd_sync(uint64_t retired);
/* ferry__fastrd_sync(@retired), then wait, yielding, until every cell of
 * @f that was odd moved on: no fast reader of @f holds what was retired
 * then. Context: an RCU callback (the writer never waits). */
void ferry__fastrd_wait(const struct ferry_fastrd *f, uint64_t retired);

#endif /* FERRY_LIB_DIR_FASTRD_H */

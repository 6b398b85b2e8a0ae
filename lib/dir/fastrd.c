/* SPDX-License-Identifier: MIT */
/*
 * fastrd.c - the writer's side of the fast path's read-side sections (see
 * fastrd.h for the argument).
 */
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lib/dir/fastrd.h"
#include "transport/base/log.h"

int ferry__fastrd_fence;

static pthread_once_t fastrd_once = PTHREAD_ONCE_INIT;

static long fastrd_membarrier(int cmd)
{
	return syscall(__NR_membarrier, cmd, 0, 0);
}

static void fastrd_register(void)
{
	if (fastrd_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)) {
		/* readers pay a fence instead: correct, slower */
		ferry__fastrd_fence = 1;
		ferry_warn("dir: membarrier(PRIVATE_EXPEDITED) is not available (Linux 4.14+); "
			   "local reads take a full fence each");
	}
}

int ferry__fastrd_init(struct ferry_fastrd *f)
{
	(void)f;
	pthread_once(&fastrd_once, fastrd_register);
	return 0;
}

/* retirements so far, and the count the last membarrier covered */
static uint64_t fastrd_retired, fastrd_synced;

uint64_t ferry__fastrd_retire(void)
{
	return __atomic_add_fetch(&fastrd_retired, 1, __ATOMIC_SEQ_CST);
}

void ferry__fastrd_sync(uint64_t retired)
{
	uint64_t upto;

	/* a membarrier that began after this retirement covers it too: old
	 * arrays retired in a burst pay for one system call */
	if (__atomic_load_n(&fastrd_synced, __ATOMIC_ACQUIRE) >= retired)
		return;
	upto = __atomic_load_n(&fastrd_retired, __ATOMIC_SEQ_CST);
	pthread_once(&fastrd_once, fastrd_register);
	if (!ferry__fastrd_fence && fastrd_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED))
		__atomic_store_n(&ferry__fastrd_fence, 1, __ATOMIC_SEQ_CST); /* not reached */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	for (uint64_t cur = __atomic_load_n(&fastrd_synced, __ATOMIC_RELAXED); cur < upto;)
		if (__atomic_compare_exchange_n(&fastrd_synced, &cur, upto, 1, __ATOMIC_RELEASE,
						__ATOMIC_RELAXED))
			break;
}

void ferry__fastrd_wait(const struct ferry_fastrd *f, uint64_t retired)
{
	ferry__fastrd_sync(retired);
	for (uint32_t c = 0; c < FERRY_FASTRD_MAX; c++) {
		uint64_t seq = __atomic_load_n(&f->cell[c].seq, __ATOMIC_ACQUIRE);

		while ((seq & 1) && __atomic_load_n(&f->cell[c].seq, __ATOMIC_ACQUIRE) == seq)
			sched_yield();
	}
}

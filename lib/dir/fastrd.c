/* SPDX-License-Identifier: MIT */
/*
 * fastrd.c - the writer's side of the fast path's read-side sections (see
 * fastrd.h for the argument).
 */
#include <linux/membarrier.h>
#include <pthread.h>
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

void ferry__fastrd_sync(void)
{
	pthread_once(&fastrd_once, fastrd_register);
	if (!ferry__fastrd_fence && fastrd_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED))
		__atomic_store_n(&ferry__fastrd_fence, 1,
				 __ATOMIC_SEQ_CST); /* not reached in practice */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

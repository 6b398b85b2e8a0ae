/* SPDX-License-Identifier: MIT */
/* procs.c - test helper for clusters of forked processes (Criterion asserts:
 * kept out of cluster.c, which ferry-torn links without Criterion). */
#include <criterion/criterion.h>
#include <signal.h>
#include <sys/wait.h>

#include "common/cluster.h"

void tc_wait_procs(const pid_t *pids, int n, int skip, const char *why)
{
	for (int i = 0; i < n; i++) {
		int status;

		cr_assert_eq(waitpid(pids[i], &status, 0), pids[i]);
		if (i != skip)
			cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
				  "node %d failed (status %#x): %s", i, status, why);
	}
}

void tc_stop_proc(pid_t pid)
{
	int status;

	/* kill() only queues SIGSTOP: a thread of the target running on another
	 * CPU goes on until it is interrupted (long, under an emulated VM).
	 * WUNTRACED reports the group stop once every thread has stopped. */
	cr_assert_eq(kill(pid, SIGSTOP), 0);
	cr_assert_eq(waitpid(pid, &status, WUNTRACED), pid);
	cr_assert(WIFSTOPPED(status), "node %d did not stop (status %#x)", (int)pid, status);
}

/* SPDX-License-Identifier: MIT */
/* procs.c - test helper for clusters of forked processes (Criterion asserts:
 * kept out of cluster.c, which ferry-torn links without Criterion). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

void tc_procs_run(int n, const struct ferry_table_params *tp, int timeout_ms,
		  int (*fn)(struct tc *c, int rank, void *arg), void *arg, const char *why)
{
	struct ferry_params p;
	pid_t pids[TC_MAX];
	int rc;

	cr_assert(n > 0 && n <= TC_MAX);
	ferry_params_init(&p);
	/* rdma where asked (the VM); loop emulates one-sided access in one
	 * process only: tcp then */
	p.transport = getenv("FERRY_TRANSPORT") && strcmp(getenv("FERRY_TRANSPORT"), "loop") ?
			      FERRY_TRANSPORT_AUTO :
			      FERRY_TRANSPORT_TCP;
	p.timeout_ms = timeout_ms;
	rc = ferry_local_cluster_fork(n, &p, pids);
	if (rc >= 0 && rc < n) {
		struct tc c = { .n = n };
		int me = rc;

		rc = ferry_open(&p, &c.fy[me]);
		if (!rc)
			rc = ferry_table_create(c.fy[me], tp, &c.t[me]);
		if (!rc)
			rc = fn(&c, me, arg);
		if (rc)
			fprintf(stderr, "node %d: %d (%s)\n", me, rc, ferry_strerror(rc));
		ferry_table_destroy(c.t[me]);
		ferry_close(c.fy[me]);
		_exit(rc ? 1 : 0);
	}
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	tc_wait_procs(pids, n, -1, why);
}

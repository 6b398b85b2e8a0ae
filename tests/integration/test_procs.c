/* SPDX-License-Identifier: MIT */
/*
 * Integration: 4 nodes as 4 forked processes (ferry_local_cluster_fork), the
 * same scenarios as test_cluster.c. Results travel back through a shared
 * mapping; each child exits 0 on success.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cluster.h"
#include "common/scenarios.h"

#define NODES 4

static int child(int which, struct ferry_params *p, struct sc_shared *sh, enum ferry_mode mode)
{
	struct ferry_table_params tp;
	struct ferry_table *t;
	struct ferry *fy;
	int rc;

	rc = ferry_open(p, &fy);
	if (rc)
		return 10;
	sc_table_params(&tp, mode);
	rc = ferry_table_create(fy, &tp, &t);
	if (rc)
		return 11;
	switch (which) {
	case 0:
		rc = sc_semantics(fy, t, sh);
		break;
	case 1:
		rc = sc_localize_local(fy, t, sh);
		break;
	case 2:
		rc = sc_storm(fy, t, sh, 3000);
		break;
	default:
		rc = sc_async_order(fy, t, sh);
		break;
	}
	/* keep serving until everyone is done */
	if (!rc)
		rc = ferry_barrier(fy);
	ferry_table_destroy(t);
	ferry_close(fy);
	return rc ? 12 : 0;
}

static void run_procs(int which, enum ferry_mode mode)
{
	struct sc_shared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_params p;
	pid_t pids[NODES];
	int rc;

	cr_assert_neq(sh, MAP_FAILED);
	ferry_params_init(&p);
	p.transport = getenv("FERRY_TRANSPORT") ? FERRY_TRANSPORT_AUTO : FERRY_TRANSPORT_TCP;
	p.timeout_ms = 20000;
	rc = ferry_local_cluster_fork(NODES, &p, pids);
	if (rc >= 0 && rc < NODES)
		_exit(child(which, &p, sh, mode));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	tc_wait_procs(pids, NODES, -1, sh->why);
	cr_assert_eq(sh->failures, 0, "%s", sh->why);
	if (which == 2) {
		char why[512];

		cr_assert_eq(sc_check_history(sh, NODES, why, sizeof(why)), 0, "%s", why);
	}
	munmap(sh, sizeof(*sh));
}

Test(procs, pull_push_set_semantics, .timeout = 120)
{
	run_procs(0, FERRY_MODE_DYNAMIC);
}

Test(procs, localize_then_local_access_sends_no_message, .timeout = 120)
{
	run_procs(1, FERRY_MODE_DYNAMIC);
}

Test(procs, relocation_storm_loses_no_update_and_stays_consistent, .timeout = 240)
{
	run_procs(2, FERRY_MODE_DYNAMIC);
}

Test(procs, async_ops_of_one_worker_apply_in_issue_order, .timeout = 120)
{
	run_procs(3, FERRY_MODE_DYNAMIC);
}

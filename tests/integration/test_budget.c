/* SPDX-License-Identifier: MIT */
/*
 * Integration: a model larger than any node's memory budget. 4 nodes as
 * forked processes, each with a budget (params.mem_limit) smaller than the
 * table's total value bytes; a sparse table of keys from the whole 64-bit
 * space. Checked:
 *
 * - every key is written and read back exactly from every node, after a
 *   share of them moved (localize) between nodes;
 * - a node whose budget runs out gets -ENOMEM from the localize that needed
 *   memory; the keys it could not take stay where they were, with their
 *   values, and every node goes on serving;
 * - a sparse key's first write at a home with no budget left is -ENOMEM.
 *
 * FERRY_BUDGET_KEYS sets the number of keys (default 40000; the VM runs
 * fewer over rdma).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/cluster.h"
#include "ferry/ferry.h"

#define NODES 4
#define VLEN 16 /* 64 B values: 128-byte slots */
#define SLOT 128

struct shared {
	volatile int failures;
	volatile int enomem_seen;
	volatile long moved, refused;
	char why[512];
};

static uint64_t key_of(int rank, uint64_t i)
{
	return 0x9e3779b97f4a7c15ull * (i + 1) ^ ((uint64_t)(rank + 1) << 58);
}

static float val(uint64_t key, int j)
{
	return (float)(key % 65521) + (float)j;
}

static int fail(struct shared *sh, int rank, const char *what, uint64_t key, int rc)
{
	if (!__atomic_fetch_add(&sh->failures, 1, __ATOMIC_SEQ_CST))
		snprintf(sh->why, sizeof(sh->why), "rank %d: %s (key %llx): %s", rank, what,
			 (unsigned long long)key, ferry_strerror(rc));
	return 1;
}

/* every key of every rank, read here; @bonus: keys [0, n1) of rank @r1 got +1 */
static int check_all(struct shared *sh, int rank, struct ferry_worker *w, struct ferry_table *t,
		     uint64_t per)
{
	enum {
		B = 1024
	};
	uint64_t k[B];
	float *v = malloc(B * VLEN * sizeof(float));

	if (!v)
		return fail(sh, rank, "malloc", 0, -ENOMEM);
	for (int r = 0; r < NODES; r++)
		for (uint64_t i = 0; i < per; i += B) {
			uint64_t m = per - i < B ? per - i : B;
			int rc;

			for (uint64_t j = 0; j < m; j++)
				k[j] = key_of(r, i + j);
			rc = ferry_pull(w, t, k, m, v);
			if (rc) {
				free(v);
				return fail(sh, rank, "pull", k[0], rc);
			}
			for (uint64_t j = 0; j < m; j++)
				for (int x = 0; x < VLEN; x++)
					if (v[j * VLEN + x] != val(k[j], x)) {
						free(v);
						return fail(sh, rank, "value", k[j], 0);
					}
		}
	free(v);
	return 0;
}

static int child(int rank, struct ferry_params *p, struct shared *sh, uint64_t per)
{
	struct ferry_table_params tp = { .sparse = 1,
					 .value_len = VLEN,
					 .placement = FERRY_PLACEMENT_HASH,
					 .capacity = per * 4 };
	enum {
		B = 1024
	};
	uint64_t k[B];
	float *v = malloc(B * VLEN * sizeof(float));
	struct ferry_worker *w;
	struct ferry_table *t;
	struct ferry *fy;
	int rc;

	if (!v || ferry_open(p, &fy))
		return 10;
	if (ferry_table_create(fy, &tp, &t) || ferry_worker_create(fy, &w))
		return 11;
	/* 1. every rank writes its keys; each lands at its home */
	for (uint64_t i = 0; i < per; i += B) {
		uint64_t m = per - i < B ? per - i : B;

		for (uint64_t j = 0; j < m; j++) {
			k[j] = key_of(rank, i + j);
			for (int x = 0; x < VLEN; x++)
				v[j * VLEN + x] = val(k[j], x);
		}
		if ((rc = ferry_set(w, t, k, m, v)))
			return fail(sh, rank, "set", k[0], rc);
	}
	if ((rc = ferry_barrier(fy)))
		return fail(sh, rank, "barrier", 0, rc);
	/* 2. a tenth of the next rank's keys move here (room for them) */
	for (uint64_t i = 0; i < per / 10; i += B) {
		uint64_t m = per / 10 - i < B ? per / 10 - i : B;

		for (uint64_t j = 0; j < m; j++)
			k[j] = key_of((rank + 1) % NODES, i + j);
		if ((rc = ferry_localize(w, t, k, m)))
			return fail(sh, rank, "localize within the budget", k[0], rc);
	}
	if ((rc = ferry_barrier(fy)))
		return fail(sh, rank, "barrier", 0, rc);
	if (check_all(sh, rank, w, t, per))
		return 1;
	if ((rc = ferry_barrier(fy)))
		return fail(sh, rank, "barrier", 0, rc);
	/* 3. rank 0 tries to take all of rank 2's keys, one batch at a time:
	 * past its budget the localize fails with -ENOMEM, and the keys it
	 * could not take stay at their owners */
	if (rank == 0) {
		for (uint64_t i = 0; i < per; i += B) {
			uint64_t m = per - i < B ? per - i : B;

			for (uint64_t j = 0; j < m; j++)
				k[j] = key_of(2, i + j);
			rc = ferry_localize(w, t, k, m);
			if (rc == -ENOMEM) {
				sh->enomem_seen = 1;
				sh->refused += (long)m;
			} else if (rc) {
				return fail(sh, rank, "localize past the budget", k[0], rc);
			} else {
				sh->moved += (long)m;
			}
		}
		/* the last slots one key at a time, until none is left */
		for (uint64_t i = 0; i < per; i++) {
			k[0] = key_of(2, i);
			rc = ferry_localize(w, t, k, 1);
			if (rc == -ENOMEM)
				break;
			if (rc)
				return fail(sh, rank, "localize of one key", k[0], rc);
		}
		if (rc != -ENOMEM)
			return fail(sh, rank, "rank 2's keys all fit in the budget", 0, rc);
		/* a new key homed here: no room for it (reads of it would make it too) */
		for (uint64_t i = 0;; i++) {
			uint64_t key = 0x5151515151515151ull * (i + 3);

			if (ferry_table_home(t, key) != 0)
				continue;
			rc = ferry_set(w, t, &key, 1, v);
			if (rc != -ENOMEM)
				return fail(sh, rank,
					    "a first write at a full home should be ENOMEM", key,
					    rc);
			break;
		}
	}
	if ((rc = ferry_barrier(fy)))
		return fail(sh, rank, "barrier", 0, rc);
	/* 4. nothing was lost: every key, from every node */
	if (check_all(sh, rank, w, t, per))
		return 1;
	if ((rc = ferry_barrier(fy)))
		return fail(sh, rank, "barrier", 0, rc);
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	free(v);
	return 0;
}

Test(budget, a_model_larger_than_any_nodes_budget, .timeout = 300)
{
	struct shared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	const char *env = getenv("FERRY_BUDGET_KEYS");
	uint64_t total = env ? strtoull(env, NULL, 10) : 40000, per = total / NODES;
	struct ferry_params p;
	pid_t pids[NODES];
	int rc;

	cr_assert_neq(sh, MAP_FAILED);
	cr_assert_geq(total, 4000);
	ferry_params_init(&p);
	p.transport = getenv("FERRY_TRANSPORT") ? FERRY_TRANSPORT_AUTO : FERRY_TRANSPORT_TCP;
	p.timeout_ms = 30000;
	/* each node may hold slots for 40% of the keys (0.8 of the table's value
	 * bytes, with 128-byte slots for 64-byte values): its home share (a
	 * quarter, a few % more or less under hash placement) and the moved
	 * tenth (27%), keys waiting out a grace period, but not also the 3/4 of
	 * rank 2's keys it is not home of (19% more) */
	p.mem_limit = total * SLOT * 40 / 100;
	cr_assert_lt(p.mem_limit, total * 64, "the budget must be below the table's value bytes");
	rc = ferry_local_cluster_fork(NODES, &p, pids);
	if (rc >= 0 && rc < NODES)
		_exit(child(rc, &p, sh, per));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	tc_wait_procs(pids, NODES, -1, sh->why);
	cr_assert_eq(sh->failures, 0, "%s", sh->why);
	cr_assert(sh->enomem_seen, "rank 0 took %ld keys and never ran out of its budget",
		  sh->moved);
	cr_assert_gt(sh->moved, 0, "rank 0 could take none of rank 2's keys");
	munmap(sh, sizeof(*sh));
}

/* a budget that cannot hold one chunk of a table, and a budget that is no
 * number: refused, each with a log line that says the fix */
Test(budget, bad_budgets_are_refused)
{
	struct ferry_table_params tp = { .sparse = 1, .value_len = VLEN };
	struct ferry_table *t;
	struct ferry_params p;
	struct ferry *fy[1];

	ferry_params_init(&p);
	p.transport = FERRY_TRANSPORT_TCP;
	p.mem_limit = 4096; /* 32 slots of 128 bytes: less than any chunk */
	cr_assert_eq(ferry_local_cluster_open(1, &p, fy), 0);
	cr_assert_eq(ferry_table_create(fy[0], &tp, &t), -EINVAL);
	ferry_close(fy[0]);

	p.mem_limit = 0;
	setenv("FERRY_MEM_LIMIT", "12X", 1);
	cr_assert_eq(ferry_local_cluster_open(1, &p, fy), -EINVAL);
	setenv("FERRY_MEM_LIMIT", "-5", 1);
	cr_assert_eq(ferry_local_cluster_open(1, &p, fy), -EINVAL);
	setenv("FERRY_MEM_LIMIT", "64M", 1);
	cr_assert_eq(ferry_local_cluster_open(1, &p, fy), 0);
	cr_assert_eq(ferry_table_create(fy[0], &tp, &t), 0);
	ferry_table_destroy(t);
	ferry_close(fy[0]);
	unsetenv("FERRY_MEM_LIMIT");
}

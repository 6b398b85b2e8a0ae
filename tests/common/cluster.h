/* SPDX-License-Identifier: MIT */
/* cluster.h - test helpers: a local cluster with one table and a thread per node. */
#ifndef FERRY_TEST_CLUSTER_H
#define FERRY_TEST_CLUSTER_H

#include <pthread.h>
#include <stdlib.h>
#include <sys/types.h>

#include "ferry/ferry.h"

#define TC_MAX 8

struct tc {
	int n;
	struct ferry *fy[TC_MAX];
	struct ferry_table *t[TC_MAX];
};

/* xorshift64: a test's reproducible stream of keys and choices */
static inline uint64_t tc_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* a positive count from the environment variable @name, else @def (a suite's
 * operations per worker: the SoftRoCE VM, which emulates its CPUs, runs fewer) */
static inline int tc_env_count(const char *name, int def)
{
	const char *e = getenv(name);
	int n = e ? atoi(e) : 0;

	return n > 0 ? n : def;
}

/* open n in-process nodes and create one table on each (collectively) */
int tc_open(struct tc *c, int n, const struct ferry_table_params *tp, int timeout_ms);
void tc_close(struct tc *c);

/* run fn(c, rank, arg) on one thread per node; returns the first nonzero result */
int tc_run(struct tc *c, int (*fn)(struct tc *c, int rank, void *arg), void *arg);

/* reap the @n forked nodes of ferry_local_cluster_fork(); asserts that each
 * but @skip (-1: none; a node the test killed) exited 0, naming @why */
void tc_wait_procs(const pid_t *pids, int n, int skip, const char *why);

/* @n nodes as forked processes (tcp, or the transport FERRY_TRANSPORT names
 * unless it is loop), each creating @tp's table and running fn(c, rank, arg)
 * (@arg: shared memory, say mmap'd); asserts that each exited 0, naming @why */
void tc_procs_run(int n, const struct ferry_table_params *tp, int timeout_ms,
		  int (*fn)(struct tc *c, int rank, void *arg), void *arg, const char *why);

/* stop a forked node (SIGSTOP) and return once all its threads stopped */
void tc_stop_proc(pid_t pid);

/* messages sent by every node together */
unsigned long long tc_msgs(struct tc *c);

#endif

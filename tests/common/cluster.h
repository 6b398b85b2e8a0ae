/* SPDX-License-Identifier: MIT */
/* cluster.h - test helpers: a local cluster with one table and a thread per node. */
#ifndef FERRY_TEST_CLUSTER_H
#define FERRY_TEST_CLUSTER_H

#include <pthread.h>

#include "ferry/ferry.h"

#define TC_MAX 8

struct tc {
	int n;
	struct ferry *fy[TC_MAX];
	struct ferry_table *t[TC_MAX];
};

/* open n in-process nodes and create one table on each (collectively) */
int tc_open(struct tc *c, int n, const struct ferry_table_params *tp, int timeout_ms);
void tc_close(struct tc *c);

/* run fn(c, rank, arg) on one thread per node; returns the first nonzero result */
int tc_run(struct tc *c, int (*fn)(struct tc *c, int rank, void *arg), void *arg);

/* messages sent by every node together */
unsigned long long tc_msgs(struct tc *c);

#endif

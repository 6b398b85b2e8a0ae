/* SPDX-License-Identifier: MIT */
/*
 * scenarios.h - integration scenarios written once, run with nodes as
 * threads of one process and as forked processes (and, in the SoftRoCE VM,
 * over rdma). Each takes one node's view and returns 0 or a negative code;
 * results that the test asserts on go to a shared area.
 */
#ifndef FERRY_TEST_SCENARIOS_H
#define FERRY_TEST_SCENARIOS_H

#include <stdint.h>

#include "ferry/ferry.h"

#define SC_KEYS 8
#define SC_MAX_NODES 4
#define SC_HIST_MAX 20000

struct sc_event {
	int64_t start_ns, end_ns;
	uint32_t node;
	uint32_t key;
	int32_t kind; /* 0 push +1, 1 pull */
	float value;  /* pull */
};

/* shared between nodes (mmap'd MAP_SHARED for processes) */
struct sc_shared {
	int failures;
	char why[256];
	uint64_t count[SC_MAX_NODES]; /* events recorded per node */
	struct sc_event ev[SC_MAX_NODES][SC_HIST_MAX];
	unsigned long long msgs_before, msgs_after;
	float final[SC_KEYS];
	uint64_t pushes[SC_KEYS];
};

#define SC_TABLE_KEYS 64
#define SC_VALUE_LEN 4

/* the table every scenario uses */
void sc_table_params(struct ferry_table_params *tp, enum ferry_mode mode);

/* pull, push, set semantics on keys of every home */
int sc_semantics(struct ferry *fy, struct ferry_table *t, struct sc_shared *sh);
/* localize, then local access sends no message */
int sc_localize_local(struct ferry *fy, struct ferry_table *t, struct sc_shared *sh);
/* every node localizes the same keys over and over while pushing +1 and pulling;
 * records a history per node */
int sc_storm(struct ferry *fy, struct ferry_table *t, struct sc_shared *sh, int rounds);
/* async operations of one worker on one key apply in issue order */
int sc_async_order(struct ferry *fy, struct ferry_table *t, struct sc_shared *sh);

/*
 * sc_check_history - the consistency checker
 *
 * For counters pushed +1: every pull reads at least the pushes that completed
 * before it began and at most those that began before it ended; pulls that do
 * not overlap in time read non-decreasing values; the final value equals the
 * number of pushes. Return: 0, or -1 with a description in @why.
 */
int sc_check_history(const struct sc_shared *sh, int nodes, char *why, size_t len);

int64_t sc_now_ns(void);

#endif

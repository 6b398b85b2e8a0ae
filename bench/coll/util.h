/* SPDX-License-Identifier: MIT */
/*
 * util.h - what the collective benchmarks (allreduce_mpi.c, zcopy.c) share:
 * a monotonic clock in seconds, and sizes with K, M or G suffixes.
 */
#ifndef FERRY_BENCH_COLL_UTIL_H
#define FERRY_BENCH_COLL_UTIL_H

#include <stdlib.h>
#include <time.h>

static inline double coll_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "64K", "16M", "1G" or plain bytes; a suffix is binary (1K = 1024) */
static inline size_t coll_parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);

	if (*end == 'K' || *end == 'k')
		v *= 1024;
	else if (*end == 'M' || *end == 'm')
		v *= 1024 * 1024;
	else if (*end == 'G' || *end == 'g')
		v *= 1024.0 * 1024 * 1024;
	return (size_t)v;
}

#endif /* FERRY_BENCH_COLL_UTIL_H */

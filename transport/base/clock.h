/* SPDX-License-Identifier: MIT */
/*
 * clock.h - bounded waits on condition variables, for the core and the
 * transports alike: every such variable runs on CLOCK_MONOTONIC (a wall
 * clock step must not stretch or cut a timeout), and a deadline is "now +
 * timeout" on that clock.
 */
#ifndef FERRY_TRANSPORT_BASE_CLOCK_H
#define FERRY_TRANSPORT_BASE_CLOCK_H

#include <pthread.h>
#include <time.h>

/* a condition variable whose timed waits take CLOCK_MONOTONIC deadlines;
 * Return: 0 or a positive errno, as pthread_cond_init */
static inline int ferry__cond_init_monotonic(pthread_cond_t *c)
{
	pthread_condattr_t a;
	int rc;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	rc = pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
	return rc;
}

/* @ts := now + @timeout_ms on CLOCK_MONOTONIC */
static inline void ferry__deadline_ms(int timeout_ms, struct timespec *ts)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

#endif /* FERRY_TRANSPORT_BASE_CLOCK_H */

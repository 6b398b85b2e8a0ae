/* SPDX-License-Identifier: MIT */
/*
 * stats.c - the clock, percentiles and result records of ferry-bench.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fb.h"

int64_t fb_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

void fb_sort(int64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_i64);
}

void fb_sort_d(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_d);
}

/* nearest rank: the smallest value with at least p of the samples at or below it */
static size_t pct_idx(size_t n, double p)
{
	double r = p * (double)n;
	size_t i = (size_t)r;

	if ((double)i < r)
		i++;
	if (i > 0)
		i--;
	return i < n ? i : n - 1;
}

double fb_pct_us(const int64_t *sorted, size_t n, double p)
{
	if (!n)
		return 0;
	return (double)sorted[pct_idx(n, p)] / 1000.0;
}

double fb_pct_d(const double *sorted, size_t n, double p)
{
	if (!n)
		return 0;
	return sorted[pct_idx(n, p)];
}

/* min, mean and (sample) stdev of @n values, in the values' unit */
static void moments_i64(const int64_t *v, size_t n, double *min, double *mean, double *sd)
{
	double s = 0, q = 0;

	*min = *mean = *sd = 0;
	if (!n)
		return;
	for (size_t i = 0; i < n; i++)
		s += (double)v[i];
	*mean = s / (double)n;
	for (size_t i = 0; i < n; i++)
		q += ((double)v[i] - *mean) * ((double)v[i] - *mean);
	*sd = n > 1 ? sqrt(q / (double)(n - 1)) : 0;
	*min = (double)v[0];
}

static void moments_d(const double *v, size_t n, double *min, double *mean, double *sd)
{
	double s = 0, q = 0;

	*min = *mean = *sd = 0;
	if (!n)
		return;
	for (size_t i = 0; i < n; i++)
		s += v[i];
	*mean = s / (double)n;
	for (size_t i = 0; i < n; i++)
		q += (v[i] - *mean) * (v[i] - *mean);
	*sd = n > 1 ? sqrt(q / (double)(n - 1)) : 0;
	*min = v[0];
}

void fb_base_from_lat(struct fb_base *b, const char *name, int64_t *lat, long n)
{
	fb_sort(lat, (size_t)n);
	snprintf(b->name, sizeof(b->name), "%s", name);
	b->p50_us = fb_pct_us(lat, (size_t)n, 0.5);
	b->p99_us = fb_pct_us(lat, (size_t)n, 0.99);
	moments_i64(lat, (size_t)n, &b->min_us, &b->mean_us, &b->stdev_us);
	b->min_us /= 1000;
	b->mean_us /= 1000;
	b->stdev_us /= 1000;
}

void fb_result_lat(struct fb_result *r, const int64_t *sorted, size_t n)
{
	r->p50_us = fb_pct_us(sorted, n, 0.5);
	r->p99_us = fb_pct_us(sorted, n, 0.99);
	r->p999_us = fb_pct_us(sorted, n, 0.999);
	moments_i64(sorted, n, &r->min_us, &r->mean_us, &r->stdev_us);
	r->min_us /= 1000;
	r->mean_us /= 1000;
	r->stdev_us /= 1000;
}

void fb_result_lat_d(struct fb_result *r, const double *sorted, size_t n)
{
	r->p50_us = fb_pct_d(sorted, n, 0.5) / 1000;
	r->p99_us = fb_pct_d(sorted, n, 0.99) / 1000;
	r->p999_us = fb_pct_d(sorted, n, 0.999) / 1000;
	moments_d(sorted, n, &r->min_us, &r->mean_us, &r->stdev_us);
	r->min_us /= 1000;
	r->mean_us /= 1000;
	r->stdev_us /= 1000;
}

void fb_result_base(struct fb_result *r, const struct fb_base *b)
{
	snprintf(r->baseline, sizeof(r->baseline), "%s", b->name);
	r->base_p50_us = b->p50_us;
	r->base_p99_us = b->p99_us;
	r->base_min_us = b->min_us;
	r->base_mean_us = b->mean_us;
	r->base_stdev_us = b->stdev_us;
}

void fb_result_add(struct fb_shared *sh, const struct fb_result *in)
{
	struct fb_result r = *in;
	int i;

	/* Ferry's time per operation over the baseline's */
	if (r.base_p50_us > 0 && r.p50_us > 0)
		r.ratio = r.p50_us / r.base_p50_us;
	else if (r.base_ops_per_s > 0 && r.ops_per_s > 0)
		r.ratio = r.base_ops_per_s / r.ops_per_s;
	if (!r.baseline[0])
		snprintf(r.baseline, sizeof(r.baseline), "-");
	r.busy_poll = sh->busy_poll;
	/*
	 * The baseline of a latency row is its physical floor (the same bytes
	 * over the same link with nothing else to do, or a plain copy), except
	 * the hot key's, whose operations are mostly local: Ferry below a floor
	 * means the floor was not measured right (another wait, a descheduled
	 * thread), never that a goal was met. A raw stream is no such bound for
	 * a throughput row: Ferry may put several requests in one send.
	 */
	r.suspect = r.base_p50_us > 0 && r.p50_us > 0 && r.ratio > 0 && r.ratio < 1 &&
		    strcmp(r.op, "hot-key") != 0;
	i = atomic_fetch_add(&sh->nresults, 1);
	if (i >= FB_MAX_RESULTS) {
		atomic_store(&sh->nresults, FB_MAX_RESULTS);
		return;
	}
	sh->results[i] = r;
}

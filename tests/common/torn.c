/* SPDX-License-Identifier: MIT */
/* torn.c - the torn-read storm (torn.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cluster.h"
#include "common/torn.h"

struct torn_writer {
	const struct torn_cfg *cfg;
	struct tc *c;
	pthread_t th;
	int id;
	int *stop; /* atomic */
	long writes;
	int rc;
};

static int64_t torn_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint64_t torn_rand(uint64_t *x)
{
	*x ^= *x >> 12;
	*x ^= *x << 25;
	*x ^= *x >> 27;
	return *x * 0x2545f4914f6cdd1dull;
}

static void *torn_writer_main(void *p)
{
	struct torn_writer *wr = p;
	const struct torn_cfg *cfg = wr->cfg;
	float *v = malloc(cfg->value_len * sizeof(float));
	uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(wr->id + 1);
	struct ferry_worker *w = NULL;

	wr->rc = v ? ferry_worker_create(wr->c->fy[0], &w) : -ENOMEM;
	while (!wr->rc && !__atomic_load_n(wr->stop, __ATOMIC_RELAXED)) {
		uint64_t key = torn_rand(&x) % cfg->keys;
		/* distinct numbers per writer and write, exact in a float */
		float n = (float)(((uint64_t)++wr->writes * (uint64_t)cfg->writers +
				   (uint64_t)wr->id) &
				  0xffffff);

		for (uint32_t i = 0; i < cfg->value_len; i++)
			v[i] = n;
		wr->rc = ferry_set(w, wr->c->t[0], &key, 1, v);
		if (cfg->pause_ns) {
			int64_t until = torn_now_ns() + (int64_t)(torn_rand(&x) % cfg->pause_ns);

			while (torn_now_ns() < until)
				;
		}
	}
	if (w)
		ferry_worker_destroy(w);
	free(v);
	return NULL;
}

/* node 1 pulls until the quota or the time is reached */
static int torn_read(const struct torn_cfg *cfg, struct tc *c, struct torn_result *res)
{
	uint32_t b = cfg->batch < cfg->keys ? cfg->batch : cfg->keys;
	float *v = malloc((size_t)b * cfg->value_len * sizeof(float));
	float *last = calloc(cfg->keys, sizeof(float));
	uint64_t keys[16], x = 88172645463325252ull;
	int64_t end = torn_now_ns() + (int64_t)(cfg->max_seconds * 1e9);
	struct ferry_stats s0, s1;
	struct ferry_worker *w;
	int rc;

	if (!v || !last || b > 16) {
		free(v);
		free(last);
		snprintf(res->why, sizeof(res->why), "batch %u: at most 16 keys", b);
		return -EINVAL;
	}
	rc = ferry_worker_create(c->fy[1], &w);
	if (rc) {
		free(v);
		free(last);
		return rc;
	}
	ferry_stats(c->fy[1], &s0);
	for (long n = 0;; n++) {
		uint64_t k0 = torn_rand(&x) % cfg->keys;

		if ((n & 63) == 0) {
			ferry_stats(c->fy[1], &s1);
			if ((long)(s1.onesided_reads - s0.onesided_reads) >= cfg->reads ||
			    torn_now_ns() >= end)
				break;
		}
		for (uint32_t i = 0; i < b; i++)
			keys[i] = (k0 + i) % cfg->keys;
		rc = ferry_pull(w, c->t[1], keys, b, v);
		if (rc) {
			snprintf(res->why, sizeof(res->why), "pull: %s", ferry_strerror(rc));
			break;
		}
		for (uint32_t i = 0; i < b; i++) {
			const float *val = v + (size_t)i * cfg->value_len;

			res->values++;
			for (uint32_t j = 1; j < cfg->value_len; j++)
				if (val[j] != val[0]) {
					if (!res->torn++)
						snprintf(
							res->why, sizeof(res->why),
							"key %llu of %u floats: v[0] = %g, v[%u] = "
							"%g",
							(unsigned long long)keys[i], cfg->value_len,
							val[0], j, val[j]);
					break;
				}
			if (val[0] != last[keys[i]]) {
				res->changes++;
				last[keys[i]] = val[0];
			}
		}
	}
	ferry_stats(c->fy[1], &s1);
	res->onesided_reads = s1.onesided_reads - s0.onesided_reads;
	res->retries = s1.onesided_retries - s0.onesided_retries;
	res->fallbacks = s1.onesided_fallbacks - s0.onesided_fallbacks;
	ferry_worker_destroy(w);
	free(v);
	free(last);
	return rc;
}

int torn_run(const struct torn_cfg *cfg, struct torn_result *res)
{
	struct ferry_table_params tp = { .num_keys = 2 * (uint64_t)cfg->keys,
					 .value_len = cfg->value_len };
	struct torn_writer *wr = calloc((size_t)cfg->writers, sizeof(*wr));
	int64_t t0;
	int stop = 0, rc;
	struct tc c;

	memset(res, 0, sizeof(*res));
	if (!wr)
		return -ENOMEM;
	/* range placement: keys 0 .. keys-1 live on node 0, the writers' */
	rc = tc_open(&c, 2, &tp, cfg->timeout_ms ? cfg->timeout_ms : 20000);
	if (rc) {
		snprintf(res->why, sizeof(res->why), "cluster open: %s", ferry_strerror(rc));
		free(wr);
		return rc;
	}
	t0 = torn_now_ns();
	for (int i = 0; i < cfg->writers; i++) {
		wr[i] = (struct torn_writer){ .cfg = cfg, .c = &c, .id = i, .stop = &stop };
		if (pthread_create(&wr[i].th, NULL, torn_writer_main, &wr[i]))
			abort();
	}
	rc = torn_read(cfg, &c, res);
	__atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < cfg->writers; i++) {
		pthread_join(wr[i].th, NULL);
		res->writes += wr[i].writes;
		if (wr[i].rc && !rc) {
			rc = wr[i].rc;
			snprintf(res->why, sizeof(res->why), "writer %d: %s", i,
				 ferry_strerror(rc));
		}
	}
	res->seconds = (double)(torn_now_ns() - t0) / 1e9;
	tc_close(&c);
	free(wr);
	return rc;
}

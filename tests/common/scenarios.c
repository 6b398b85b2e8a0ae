/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "common/scenarios.h"

#define SC_FAIL(sh, ...)                                                  \
	do {                                                              \
		__atomic_fetch_add(&(sh)->failures, 1, __ATOMIC_RELAXED); \
		snprintf((sh)->why, sizeof((sh)->why), __VA_ARGS__);      \
		return -EIO;                                              \
	} while (0)

int64_t sc_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void sc_table_params(struct ferry_table_params *tp, enum ferry_mode mode)
{
	memset(tp, 0, sizeof(*tp));
	tp->num_keys = SC_TABLE_KEYS;
	tp->value_len = SC_VALUE_LEN;
	tp->mode = mode;
}

int sc_semantics(struct ferry *fy, struct ferry_table *t, struct sc_shared *sh)
{
	int rank = ferry_rank(fy), world = ferry_world(fy), rc;
	uint64_t keys[SC_TABLE_KEYS];
	float vals[SC_TABLE_KEYS * SC_VALUE_LEN], ones[SC_TABLE_KEYS * SC_VALUE_LEN];
	struct ferry_worker *w;

	rc = ferry_worker_create(fy, &w);
	if (rc)
		return rc;
	for (int i = 0; i < SC_TABLE_KEYS; i++)
		keys[i] = (uint64_t)i;
	for (int i = 0; i < SC_TABLE_KEYS * SC_VALUE_LEN; i++)
		ones[i] = 1.0f;
	/* rank 0 sets every key to its number, element j = key + j/10 */
	if (rank == 0) {
		for (int i = 0; i < SC_TABLE_KEYS; i++)
			for (int j = 0; j < SC_VALUE_LEN; j++)
				vals[i * SC_VALUE_LEN + j] = (float)i + (float)j / 10;
		rc = ferry_set(w, t, keys, SC_TABLE_KEYS, vals);
		if (rc)
			SC_FAIL(sh, "set: %s", ferry_strerror(rc));
	}
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	/* every node pushes +1 to every key, one batch */
	rc = ferry_push(w, t, keys, SC_TABLE_KEYS, ones);
	if (rc)
		SC_FAIL(sh, "push: %s", ferry_strerror(rc));
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	memset(vals, 0, sizeof(vals));
	rc = ferry_pull(w, t, keys, SC_TABLE_KEYS, vals);
	if (rc)
		SC_FAIL(sh, "pull: %s", ferry_strerror(rc));
	for (int i = 0; i < SC_TABLE_KEYS; i++)
		for (int j = 0; j < SC_VALUE_LEN; j++) {
			float want = (float)i + (float)j / 10 + (float)world;

			if (vals[i * SC_VALUE_LEN + j] != want)
				SC_FAIL(sh, "rank %d: key %d elem %d is %g, want %g", rank, i, j,
					vals[i * SC_VALUE_LEN + j], want);
		}
	/* duplicates in one batch apply once per occurrence, in order */
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	if (rank == world - 1) {
		uint64_t dup[3] = { 7, 7, 7 };
		float d[3 * SC_VALUE_LEN];

		for (int i = 0; i < 3 * SC_VALUE_LEN; i++)
			d[i] = 2.0f;
		rc = ferry_push(w, t, dup, 3, d);
		if (rc)
			SC_FAIL(sh, "push dup: %s", ferry_strerror(rc));
		rc = ferry_pull(w, t, dup, 1, vals);
		if (rc || vals[0] != 7.0f + (float)world + 6.0f)
			SC_FAIL(sh, "duplicate pushes: key 7 is %g, want %g (rc %d)", vals[0],
				7.0f + (float)world + 6.0f, rc);
	}
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	ferry_worker_destroy(w);
	return 0;
}

int sc_localize_local(struct ferry *fy, struct ferry_table *t, struct sc_shared *sh)
{
	int rank = ferry_rank(fy), world = ferry_world(fy), rc;
	struct ferry_worker *w;
	struct ferry_stats before, after;
	uint64_t mine[4];
	float v[4 * SC_VALUE_LEN], d[4 * SC_VALUE_LEN];

	rc = ferry_worker_create(fy, &w);
	if (rc)
		return rc;
	/* each node takes 4 keys whose home is another node */
	for (int i = 0; i < 4; i++)
		mine[i] =
			(uint64_t)(((rank + 1) % world) * (SC_TABLE_KEYS / world) + rank * 4 + i) %
			SC_TABLE_KEYS;
	for (int i = 0; i < 4 * SC_VALUE_LEN; i++)
		d[i] = 1.0f;
	rc = ferry_localize(w, t, mine, 4);
	if (rc)
		SC_FAIL(sh, "localize: %s", ferry_strerror(rc));
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	ferry_stats(fy, &before);
	for (int r = 0; r < 100; r++) {
		rc = ferry_push(w, t, mine, 4, d);
		if (!rc)
			rc = ferry_pull(w, t, mine, 4, v);
		if (rc)
			SC_FAIL(sh, "local op: %s", ferry_strerror(rc));
	}
	ferry_stats(fy, &after);
	if (after.msgs_sent != before.msgs_sent)
		SC_FAIL(sh, "rank %d sent %llu messages for localized keys", rank,
			(unsigned long long)(after.msgs_sent - before.msgs_sent));
	if (after.local_ops - before.local_ops != 800)
		SC_FAIL(sh, "rank %d: %llu local ops, want 800", rank,
			(unsigned long long)(after.local_ops - before.local_ops));
	if (v[0] != 100.0f)
		SC_FAIL(sh, "rank %d: localized key reads %g, want 100", rank, v[0]);
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	/* the others still reach the moved keys, location transparently */
	{
		uint64_t other = mine[0] + 0;
		uint64_t theirs = (uint64_t)(((rank + 2) % world) * (SC_TABLE_KEYS / world) +
					     ((rank + 1) % world) * 4) %
				  SC_TABLE_KEYS;

		(void)other;
		rc = ferry_pull(w, t, &theirs, 1, v);
		if (rc || v[0] != 100.0f)
			SC_FAIL(sh, "rank %d: remote pull of a moved key gave %g (rc %d), want 100",
				rank, v[0], rc);
	}
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	ferry_worker_destroy(w);
	return 0;
}

int sc_storm(struct ferry *fy, struct ferry_table *t, struct sc_shared *sh, int rounds)
{
	int rank = ferry_rank(fy), rc;
	unsigned seed = (unsigned)rank * 7919u + 1;
	struct ferry_worker *w;
	float d[SC_VALUE_LEN], v[SC_VALUE_LEN];
	uint64_t all[SC_KEYS];

	rc = ferry_worker_create(fy, &w);
	if (rc)
		return rc;
	for (int j = 0; j < SC_VALUE_LEN; j++)
		d[j] = 1.0f;
	for (int k = 0; k < SC_KEYS; k++)
		all[k] = (uint64_t)k;
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	for (int i = 0; i < rounds; i++) {
		uint64_t key = rand_r(&seed) % SC_KEYS;
		int what = rand_r(&seed) % 4;
		struct sc_event e = { .node = (uint32_t)rank, .key = (uint32_t)key };

		if (what == 0) {
			/* grab a few keys, sometimes all */
			int many = rand_r(&seed) % 2;

			rc = ferry_localize(w, t, many ? all : &key, many ? SC_KEYS : 1);
			if (rc)
				SC_FAIL(sh, "rank %d: localize: %s", rank, ferry_strerror(rc));
			continue;
		}
		e.kind = what == 1 ? 1 : 0;
		e.start_ns = sc_now_ns();
		if (e.kind)
			rc = ferry_pull(w, t, &key, 1, v);
		else
			rc = ferry_push(w, t, &key, 1, d);
		e.end_ns = sc_now_ns();
		if (rc)
			SC_FAIL(sh, "rank %d: %s: %s", rank, e.kind ? "pull" : "push",
				ferry_strerror(rc));
		e.value = v[0];
		if (e.kind && (v[1] != v[0] || v[3] != v[0]))
			SC_FAIL(sh, "rank %d: torn value on key %llu: %g %g %g %g", rank,
				(unsigned long long)key, v[0], v[1], v[2], v[3]);
		if (sh->count[rank] < SC_HIST_MAX)
			sh->ev[rank][sh->count[rank]++] = e;
		/* on two cores, let the other nodes interleave with this one */
		if (i % 2 == 0)
			usleep(20);
	}
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	if (rank == 0) {
		for (int k = 0; k < SC_KEYS; k++) {
			uint64_t key = (uint64_t)k;

			rc = ferry_pull(w, t, &key, 1, v);
			if (rc)
				SC_FAIL(sh, "final pull: %s", ferry_strerror(rc));
			sh->final[k] = v[0];
		}
	}
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	ferry_worker_destroy(w);
	return 0;
}

int sc_async_order(struct ferry *fy, struct ferry_table *t, struct sc_shared *sh)
{
	enum {
		N = 64
	};
	int rank = ferry_rank(fy), world = ferry_world(fy), rc;
	struct ferry_worker *w;
	uint64_t key = (uint64_t)(SC_TABLE_KEYS - 1 - rank), tickets[3 * N];
	float setv[N][SC_VALUE_LEN], pulled[N][SC_VALUE_LEN], one[SC_VALUE_LEN];
	int nt = 0;

	rc = ferry_worker_create(fy, &w);
	if (rc)
		return rc;
	for (int j = 0; j < SC_VALUE_LEN; j++)
		one[j] = 1.0f;
	/* set v_i, push +1, pull: each pull must read exactly v_i + 1, and
	 * the key keeps moving: the next node localizes it half way */
	for (int i = 0; i < N; i++) {
		for (int j = 0; j < SC_VALUE_LEN; j++)
			setv[i][j] = (float)(i * 10);
		rc = ferry_set_start(w, t, &key, 1, setv[i], &tickets[nt++]);
		if (!rc)
			rc = ferry_push_start(w, t, &key, 1, one, &tickets[nt++]);
		if (!rc)
			rc = ferry_pull_start(w, t, &key, 1, pulled[i], &tickets[nt++]);
		if (rc)
			SC_FAIL(sh, "rank %d: start: %s", rank, ferry_strerror(rc));
		if (i == N / 2 && world > 1) {
			uint64_t other = (uint64_t)(SC_TABLE_KEYS - 1 - (rank + 1) % world);

			rc = ferry_localize(w, t, &other, 1);
			if (rc)
				SC_FAIL(sh, "rank %d: localize: %s", rank, ferry_strerror(rc));
		}
		if (i == N / 2) {
			/* a synchronous pull while this worker's operations on the
			 * key are in flight waits for them; one of a key it has
			 * none on in flight (here now, or not) is served at once */
			float now[SC_VALUE_LEN], other_v[SC_VALUE_LEN];
			uint64_t other = (uint64_t)(SC_TABLE_KEYS - 1 - (rank + 1) % world);

			rc = ferry_pull(w, t, &key, 1, now);
			if (rc)
				SC_FAIL(sh, "rank %d: pull: %s", rank, ferry_strerror(rc));
			if (now[0] != (float)(i * 10) + 1.0f)
				SC_FAIL(sh,
					"rank %d: a pull after %d async pushes read %g, want %g",
					rank, i + 1, now[0], (float)(i * 10) + 1.0f);
			rc = ferry_pull(w, t, &other, 1, other_v);
			if (rc)
				SC_FAIL(sh, "rank %d: pull: %s", rank, ferry_strerror(rc));
		}
	}
	for (int i = nt - 1; i >= 0; i--) { /* wait in reverse on purpose */
		rc = ferry_wait(w, tickets[i]);
		if (rc)
			SC_FAIL(sh, "rank %d: wait: %s", rank, ferry_strerror(rc));
	}
	for (int i = 0; i < N; i++)
		if (pulled[i][0] != (float)(i * 10) + 1.0f)
			SC_FAIL(sh, "rank %d: async pull %d read %g, want %g (out of order)", rank,
				i, pulled[i][0], (float)(i * 10) + 1.0f);
	if ((rc = ferry_barrier(fy)))
		SC_FAIL(sh, "barrier: %s", ferry_strerror(rc));
	ferry_worker_destroy(w);
	return 0;
}

/* ---- the checker -------------------------------------------------------- */

struct sc_ref {
	const struct sc_event *e;
};

static int sc_cmp_start(const void *a, const void *b)
{
	const struct sc_event *x = ((const struct sc_ref *)a)->e,
			      *y = ((const struct sc_ref *)b)->e;

	return x->start_ns < y->start_ns ? -1 : x->start_ns > y->start_ns;
}

static int sc_cmp_end(const void *a, const void *b)
{
	const struct sc_event *x = ((const struct sc_ref *)a)->e,
			      *y = ((const struct sc_ref *)b)->e;

	return x->end_ns < y->end_ns ? -1 : x->end_ns > y->end_ns;
}

int sc_check_history(const struct sc_shared *sh, int nodes, char *why, size_t len)
{
	for (uint32_t key = 0; key < SC_KEYS; key++) {
		size_t n = 0, np = 0, ni = 0;
		struct sc_ref *pushes_by_end, *pushes_by_start, *pulls;

		for (int r = 0; r < nodes; r++)
			n += sh->count[r];
		pushes_by_end = calloc(n + 1, sizeof(*pushes_by_end));
		pushes_by_start = calloc(n + 1, sizeof(*pushes_by_start));
		pulls = calloc(n + 1, sizeof(*pulls));
		if (!pushes_by_end || !pushes_by_start || !pulls) {
			snprintf(why, len, "out of memory");
			return -1;
		}
		for (int r = 0; r < nodes; r++)
			for (uint64_t i = 0; i < sh->count[r]; i++) {
				const struct sc_event *e = &sh->ev[r][i];

				if (e->key != key)
					continue;
				if (e->kind == 0) {
					pushes_by_end[np].e = e;
					pushes_by_start[np++].e = e;
				} else {
					pulls[ni++].e = e;
				}
			}
		qsort(pushes_by_end, np, sizeof(*pushes_by_end), sc_cmp_end);
		qsort(pushes_by_start, np, sizeof(*pushes_by_start), sc_cmp_start);
		qsort(pulls, ni, sizeof(*pulls), sc_cmp_start);
		/* bounds per pull: [done before it began, begun before it ended] */
		for (size_t i = 0, lo, hi; i < ni; i++) {
			const struct sc_event *p = pulls[i].e;

			lo = 0;
			while (lo < np && pushes_by_end[lo].e->end_ns < p->start_ns)
				lo++;
			hi = 0;
			while (hi < np && pushes_by_start[hi].e->start_ns <= p->end_ns)
				hi++;
			if (p->value < (float)lo || p->value > (float)hi) {
				snprintf(why, len,
					 "key %u: node %u pulled %g, but %zu pushes had completed "
					 "before the pull began and only %zu had begun before it "
					 "ended",
					 key, p->node, p->value, lo, hi);
				goto fail;
			}
		}
		/* pulls that do not overlap read non-decreasing values: sweep the
		 * pulls by start, keeping the largest value of those that ended */
		{
			struct sc_ref *by_end = calloc(ni + 1, sizeof(*by_end));
			const struct sc_event *maxe = NULL;
			size_t k = 0;

			if (!by_end) {
				snprintf(why, len, "out of memory");
				goto fail;
			}
			memcpy(by_end, pulls, ni * sizeof(*pulls));
			qsort(by_end, ni, sizeof(*by_end), sc_cmp_end);
			for (size_t i = 0; i < ni; i++) {
				const struct sc_event *b = pulls[i].e;

				while (k < ni && by_end[k].e->end_ns < b->start_ns) {
					if (!maxe || by_end[k].e->value > maxe->value)
						maxe = by_end[k].e;
					k++;
				}
				if (maxe && maxe->value > b->value) {
					snprintf(
						why, len,
						"key %u: node %u read %g, and later node %u read %g "
						"(a push went back in time)",
						key, maxe->node, maxe->value, b->node, b->value);
					free(by_end);
					goto fail;
				}
			}
			free(by_end);
		}
		if (sh->final[key] != (float)np) {
			snprintf(why, len, "key %u: final value %g, but %zu pushes completed", key,
				 sh->final[key], np);
			goto fail;
		}
		free(pushes_by_end);
		free(pushes_by_start);
		free(pulls);
		continue;
fail:
		free(pushes_by_end);
		free(pushes_by_start);
		free(pulls);
		return -1;
	}
	return 0;
}

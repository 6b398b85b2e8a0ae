/* SPDX-License-Identifier: MIT */
/*
 * localize.c - the localize scenario: what moving a key costs.
 *
 *   move (owner = home)   2 nodes: rank 0 localizes, one at a time, keys
 *                         whose home and owner is rank 1 (a fresh key each
 *                         time): LOCALIZE to the home, which hands over
 *   move (owner != home)  3 nodes: rank 2 first takes the keys of rank 1's
 *                         home; rank 0 then localizes them one at a time:
 *                         LOCALIZE to the home, HANDOVER_REQ to the owner,
 *                         HANDOVER to rank 0
 *   batch                 one call on lbatch fresh keys of rank 1 (keys/s,
 *                         GB/s of values moved)
 *   hot-key               every node, for a while: localize the hot key,
 *                         then push +1 into its own component a few times;
 *                         p50 / p99 are rank 0's localize calls that moved it.
 *                         At the end every component must equal that node's
 *                         number of pushes: any difference is a lost update,
 *                         printed, and the run exits 1
 *
 * Baseline: the same transport's raw round trip between rank 0 and rank 1
 * with the bytes rank 0 sent and received for the move (ferry_stats() around
 * a warm-up move), taken in rounds between the moves, so the ratio counts
 * round trips under the same load. The goals: at most 2 when
 * the owner is the home, at most 3 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fb.h"

#define HOT_PUSHES 4		  /* pushes after each localize */
#define HOT_MAX_PUSHES (1u << 23) /* per node: exact in a float */
/*
 * Keys in the hot table (only key 0 is used): its capacity, slots per node,
 * is the key count, and a slot the key left is free again only after an RCU
 * grace period, so a 1-key table runs out of slots when the key comes back
 * quickly (-ENOSPC).
 */
#define HOT_TABLE_KEYS 64

static long loc_iters(const struct fb_opts *o)
{
	return o->iters < 20 ? 20 : o->iters;
}

static int loc_move(struct fb_node *n, struct ferry_table *t, const uint64_t *keys, size_t nk,
		    int64_t *dt)
{
	int64_t t0;
	int rc;

	if (n->o->timeline && nk == 1)
		fb_tl_mark(n, FB_TL_LOC_CALL, keys[0]);
	t0 = fb_now_ns();
	rc = ferry_localize(n->w, t, keys, nk);
	*dt = fb_now_ns() - t0;
	if (n->o->timeline && nk == 1)
		fb_tl_mark(n, FB_TL_LOC_RETURN, keys[0]);
	return rc;
}

/*
 * Rank 0 moves each of @keys (iters + 1 of them) once, timing each; the
 * first is the warm-up whose frames size the baseline.
 */
static int loc_single(struct fb_node *n, struct ferry_table *t, uint32_t bytes,
		      const uint64_t *keys, long iters, const char *op)
{
	int64_t *lat = malloc((size_t)iters * sizeof(*lat)), dt;
	struct fb_result res = { 0 };
	struct ferry_stats a, b, c;
	struct fb_basemeter m;
	long done = 0;
	int rc;

	if (!lat)
		return -1;
	ferry_stats(n->fy, &a);
	rc = loc_move(n, t, keys, 1, &dt);
	ferry_stats(n->fy, &b);
	if (rc) {
		fb_fail(n, "localize", rc);
		free(lat);
		return -1;
	}
	if (fb_base_begin(n, (size_t)(b.bytes_sent - a.bytes_sent),
			  (size_t)(b.bytes_recv - a.bytes_recv), iters, 0, bytes, &m)) {
		free(lat);
		return -1;
	}
	for (int round = 0; round < FB_ROUNDS && !rc; round++) {
		long end = iters * (round + 1) / FB_ROUNDS;

		for (long i = done; i < end && !rc; i++)
			rc = loc_move(n, t, &keys[1 + i], 1, &lat[i]);
		if (!rc && fb_base_chunk(n, &m, end - done))
			rc = -EIO;
		done = end;
	}
	ferry_stats(n->fy, &c);
	if (fb_base_end(n, &m) && !rc)
		rc = -EIO;
	if (rc) {
		if (rc != -EIO)
			fb_fail(n, "localize", rc);
		free(lat);
		return -1;
	}
	fb_sort(lat, (size_t)iters);
	snprintf(res.scenario, sizeof(res.scenario), "localize");
	snprintf(res.op, sizeof(res.op), "%s", op);
	res.value_bytes = bytes;
	res.threads = 1;
	res.keys = 1;
	fb_result_lat(&res, lat, (size_t)iters);
	res.ops_per_s = res.p50_us > 0 ? 1e6 / res.p50_us : 0;
	res.mb_per_s = res.ops_per_s * bytes / 1e6;
	snprintf(res.note, sizeof(res.note), "moved %llu/%ld, frames %llu/%llu B",
		 (unsigned long long)(c.relocations_in - b.relocations_in), iters,
		 (unsigned long long)(b.bytes_sent - a.bytes_sent),
		 (unsigned long long)(b.bytes_recv - a.bytes_recv));
	fb_result_base(&res, &m.b);
	fb_result_add(n->sh, &res);
	free(lat);
	return 0;
}

static int loc_tl_end(struct fb_node *n, enum fb_tl_kind kind, const char *what, uint32_t bytes)
{
	char title[96];

	snprintf(title, sizeof(title), "%s, %u-byte values, %s", what, bytes,
		 n->sh->busy_poll ? "busy-poll" : "blocking");
	return fb_tl_end(n, kind, title, bytes);
}

/*
 * --timeline: rank 0 pushes once into each of @keys (owned by rank 1, before
 * they move), so the push's steps are stamped like the moves'; the rows
 * themselves are the remote scenario's
 */
static int loc_tl_push(struct fb_node *n, struct ferry_table *t, uint32_t bytes,
		       const uint64_t *keys, long count)
{
	float *d = calloc(bytes / 4 ? bytes / 4 : 1, sizeof(float));
	int rc = d ? 0 : -ENOMEM;

	for (long i = 0; i < count && !rc; i++) {
		fb_tl_mark(n, FB_TL_PUSH_CALL, keys[i]);
		rc = ferry_push(n->w, t, &keys[i], 1, d);
		fb_tl_mark(n, FB_TL_PUSH_RETURN, keys[i]);
	}
	free(d);
	if (rc)
		fb_fail(n, "timeline push", rc);
	return rc ? -1 : 0;
}

/* --timeline, every node: the push phase, its table, then a clean slate for the moves */
static int loc_tl_run(struct fb_node *n, struct ferry_table *t, uint32_t bytes,
		      const uint64_t *keys, long iters)
{
	int bad = fb_tl_begin(n);

	if (n->rank == 0 && !bad)
		bad = loc_tl_push(n, t, bytes, keys, iters + 1);
	if (fb_phase_end(n, 0))
		bad = 1;
	if (loc_tl_end(n, FB_TL_PUSH, "push, one key of rank 1", bytes))
		bad = 1;
	return bad || fb_tl_begin(n) ? -1 : 0;
}

/* owner = home: a 2-node run over every size */
static int loc_home_node(struct fb_node *n)
{
	const struct fb_opts *o = n->o;
	long iters = loc_iters(o);
	uint64_t nk = (uint64_t)n->world * (uint64_t)(iters + 1);
	uint64_t *keys = malloc((size_t)(iters + 1) * sizeof(*keys));
	int bad = !keys;

	for (int si = 0; si < o->nsizes && keys; si++) {
		struct ferry_table *t;

		if (fb_table_create(n, nk, o->sizes[si], &t)) {
			bad = 1;
			break;
		}
		if (n->rank == 0 && !bad) {
			if (fb_keys_homed(t, nk, 1, 0, keys, (size_t)iters + 1) !=
			    (size_t)iters + 1) {
				fb_failf(n->sh, "localize: too few keys homed at rank 1");
				bad = 1;
			}
		}
		if (o->timeline && loc_tl_run(n, t, o->sizes[si], keys, iters))
			bad = 1;
		if (n->rank == 0 && !bad)
			bad = loc_single(n, t, o->sizes[si], keys, iters, "move-home");
		if (fb_phase_end(n, 0))
			bad = 1;
		if (o->timeline &&
		    loc_tl_end(n, FB_TL_LOCALIZE, "localize, owner = home", o->sizes[si]))
			bad = 1;
		ferry_table_destroy(t);
	}
	free(keys);
	return bad ? -1 : 0;
}

/* owner != home: rank 2 takes rank 1's keys first */
static int loc_third_node(struct fb_node *n)
{
	const struct fb_opts *o = n->o;
	long iters = loc_iters(o);
	uint64_t nk = (uint64_t)n->world * (uint64_t)(iters + 1);
	uint64_t *keys = malloc((size_t)(iters + 1) * sizeof(*keys));
	int bad = !keys;

	for (int si = 0; si < o->nsizes && keys; si++) {
		struct ferry_table *t;
		size_t got;

		if (fb_table_create(n, nk, o->sizes[si], &t)) {
			bad = 1;
			break;
		}
		got = fb_keys_homed(t, nk, 1, 0, keys, (size_t)iters + 1);
		if (got != (size_t)iters + 1) {
			if (n->rank == 0)
				fb_failf(n->sh, "localize: too few keys homed at rank 1");
			bad = 1;
		}
		if (n->rank == 2 && !bad) {
			for (size_t i = 0; i < got && !bad; i += 1000) {
				size_t m = got - i < 1000 ? got - i : 1000;
				int rc = ferry_localize(n->w, t, keys + i, m);

				if (rc) {
					fb_fail(n, "localize to the third node", rc);
					bad = 1;
				}
			}
		}
		if (fb_phase_end(n, 2))
			bad = 1;
		if (o->timeline && fb_tl_begin(n))
			bad = 1;
		if (n->rank == 0 && !bad)
			bad = loc_single(n, t, o->sizes[si], keys, iters, "move-third");
		if (fb_phase_end(n, 0))
			bad = 1;
		if (o->timeline &&
		    loc_tl_end(n, FB_TL_LOCALIZE, "localize, owner != home", o->sizes[si]))
			bad = 1;
		ferry_table_destroy(t);
	}
	free(keys);
	return bad ? -1 : 0;
}

/* batches of lbatch fresh keys of rank 1's, one call each */
static int loc_batch_node(struct fb_node *n)
{
	const struct fb_opts *o = n->o;
	size_t nb = o->lbatch;
	int reps = o->lreps;
	uint64_t nk = (uint64_t)n->world * nb * (uint64_t)(reps + 1);
	uint64_t *keys = malloc(nb * (size_t)(reps + 1) * sizeof(*keys));
	int bad = !keys;

	for (int si = 0; si < o->nlsizes && keys; si++) {
		uint32_t bytes = o->lsizes[si];
		struct ferry_table *t;

		if (fb_table_create(n, nk, bytes, &t)) {
			bad = 1;
			break;
		}
		if (n->rank == 0 && !bad) {
			int64_t *lat = malloc((size_t)reps * sizeof(*lat)), dt, sum = 0;
			struct fb_result res = { 0 };
			struct ferry_stats a, b;
			struct fb_basemeter m;
			int rc;

			if (!lat || fb_keys_homed(t, nk, 1, 0, keys, nb * (size_t)(reps + 1)) !=
					    nb * (size_t)(reps + 1)) {
				fb_failf(n->sh, "localize batch: too few keys homed at rank 1");
				free(lat);
				bad = 1;
				goto next;
			}
			ferry_stats(n->fy, &a);
			rc = loc_move(n, t, keys, nb, &dt);
			ferry_stats(n->fy, &b);
			if (!rc && fb_base_begin(n, (size_t)(b.bytes_sent - a.bytes_sent),
						 (size_t)(b.bytes_recv - a.bytes_recv), reps, 0,
						 bytes * (uint32_t)nb, &m)) {
				free(lat);
				bad = 1;
				goto next;
			}
			/* one batch, one raw round trip of the same bytes, and again */
			for (int i = 0; i < reps && !rc; i++) {
				rc = loc_move(n, t, keys + nb * (size_t)(i + 1), nb, &lat[i]);
				sum += lat[i];
				if (!rc && fb_base_chunk(n, &m, 1))
					rc = -EIO;
			}
			if (fb_base_end(n, &m) && !rc)
				rc = -EIO;
			if (rc) {
				if (rc != -EIO)
					fb_fail(n, "batch localize", rc);
				free(lat);
				bad = 1;
				goto next;
			}
			fb_sort(lat, (size_t)reps);
			snprintf(res.scenario, sizeof(res.scenario), "localize");
			snprintf(res.op, sizeof(res.op), "batch%zu", nb);
			res.value_bytes = bytes;
			res.threads = 1;
			res.keys = nb;
			fb_result_lat(&res, lat, (size_t)reps);
			res.ops_per_s = (double)nb * (double)reps * 1e9 / (double)sum;
			res.mb_per_s = res.ops_per_s * bytes / 1e6;
			snprintf(res.note, sizeof(res.note), "frames %llu/%llu B",
				 (unsigned long long)(b.bytes_sent - a.bytes_sent),
				 (unsigned long long)(b.bytes_recv - a.bytes_recv));
			free(lat);
			fb_result_base(&res, &m.b);
			fb_result_add(n->sh, &res);
		}
next:
		if (fb_phase_end(n, 0))
			bad = 1;
		ferry_table_destroy(t);
	}
	free(keys);
	return bad ? -1 : 0;
}

/*
 * The hot key: key 0, one float per node. Node r localizes it, pushes +1
 * into component r HOT_PUSHES times, and again, for hot_s seconds. Then each
 * node publishes its counts in a tally table and rank 0 checks the value.
 */
static int loc_hot_node(struct fb_node *n)
{
	const struct fb_opts *o = n->o;
	uint32_t len = (uint32_t)(n->world < 2 ? 2 : n->world);
	long cap = 1 + (long)(o->hot_s * 200000.0);
	int64_t *lat = n->rank == 0 ? malloc((size_t)cap * sizeof(*lat)) : NULL;
	float *delta = calloc(len, sizeof(float)), *val = calloc(len, sizeof(float));
	float tally[4] = { 0 };
	struct ferry_table *t = NULL, *tt = NULL;
	struct ferry_stats a, b;
	uint64_t key = 0, pushes = 0, moves = 0;
	long nlat = 0;
	int64_t t0, end, secs_ns;
	int rc = 0, bad = 0;

	if (!delta || !val || (n->rank == 0 && !lat)) {
		fb_failf(n->sh, "hot key: out of memory");
		bad = 1;
	}
	if (fb_table_create(n, HOT_TABLE_KEYS, len * 4, &t) ||
	    fb_table_create(n, (uint64_t)n->world, 16, &tt)) {
		bad = 1;
		goto out;
	}
	if (delta)
		delta[n->rank] = 1.0f;
	if (fb_barrier(n)) {
		bad = 1;
		goto out;
	}
	ferry_stats(n->fy, &a);
	t0 = fb_now_ns();
	end = t0 + (int64_t)(o->hot_s * 1e9);
	while (!bad && fb_now_ns() < end && pushes + HOT_PUSHES <= HOT_MAX_PUSHES) {
		struct ferry_stats s0, s1;
		int64_t dt;

		/* only a call that moved the key counts as a relocation */
		ferry_stats(n->fy, &s0);
		rc = loc_move(n, t, &key, 1, &dt);
		ferry_stats(n->fy, &s1);
		if (rc)
			break;
		if (s1.relocations_in != s0.relocations_in) {
			moves++;
			if (lat && nlat < cap)
				lat[nlat++] = dt;
		}
		for (int i = 0; i < HOT_PUSHES && !rc; i++) {
			rc = ferry_push(n->w, t, &key, 1, delta);
			pushes += !rc;
		}
		if (rc)
			break;
	}
	secs_ns = fb_now_ns() - t0;
	ferry_stats(n->fy, &b);
	if (rc) {
		fb_fail(n, "hot key: localize/push", rc);
		bad = 1;
	}
	tally[0] = (float)pushes;
	tally[1] = (float)(b.relocations_in - a.relocations_in);
	tally[2] = (float)moves;	       /* the localize calls that moved it */
	tally[3] = (float)(secs_ns / 1000000); /* ms */
	/* every push above is synchronous, so done when the barrier passes */
	if (fb_barrier(n)) {
		bad = 1;
		goto out;
	}
	{
		uint64_t me = (uint64_t)n->rank;

		rc = ferry_set(n->w, tt, &me, 1, tally);
		if (rc) {
			fb_fail(n, "hot key: tally", rc);
			bad = 1;
		}
	}
	if (fb_barrier(n)) {
		bad = 1;
		goto out;
	}
	if (n->rank == 0 && !bad) {
		double tot_push = 0, tot_reloc = 0, max_ms = 0, lost = 0;
		struct fb_result res = { 0 };
		struct fb_basemeter m;
		int mism = 0;

		rc = ferry_pull(n->w, t, &key, 1, val);
		for (int r = 0; r < n->world && !rc; r++) {
			uint64_t k = (uint64_t)r;

			rc = ferry_pull(n->w, tt, &k, 1, tally);
			if (rc)
				break;
			tot_push += tally[0];
			tot_reloc += tally[1];
			if (tally[3] > max_ms)
				max_ms = tally[3];
			if (val[r] != tally[0]) {
				mism++;
				lost += (double)tally[0] - (double)val[r];
				fprintf(stderr,
					"ferry-bench: hot key: node %d pushed %.0f times, its "
					"component holds %.0f\n",
					r, (double)tally[0], (double)val[r]);
			}
		}
		if (rc) {
			fb_fail(n, "hot key: final pull", rc);
			bad = 1;
			goto out;
		}
		if (mism) {
			fb_failf(n->sh,
				 "hot key: LOST UPDATES: %.0f of %.0f pushes missing from the "
				 "final value (%d nodes disagree)",
				 lost, tot_push, mism);
			bad = 1;
		}
		printf("# hot key: %d nodes, %.0f pushes, %.0f relocations in %.2f s; final value "
		       "%s: %.0f lost updates\n",
		       n->world, tot_push, tot_reloc, max_ms / 1000.0, mism ? "WRONG" : "checked",
		       lost);
		fb_sort(lat, (size_t)nlat);
		snprintf(res.scenario, sizeof(res.scenario), "localize");
		snprintf(res.op, sizeof(res.op), "hot-key");
		res.value_bytes = len * 4;
		res.threads = (uint32_t)n->world;
		res.keys = 1;
		fb_result_lat(&res, lat, (size_t)nlat);
		res.ops_per_s = max_ms > 0 ? tot_push * 1000.0 / max_ms : 0;
		res.extra = max_ms > 0 ? tot_reloc * 1000.0 / max_ms : 0;
		snprintf(res.extra_name, sizeof(res.extra_name), "relocations_per_s");
		snprintf(res.note, sizeof(res.note), "%.0f relocs/s, lost %.0f of %.0f", res.extra,
			 lost, tot_push);
		/* the round trip of a hand-over of this value, after the run */
		if (!fb_base_begin(n, 64, 64 + len * 4, 1000, 0, len * 4, &m) &&
		    !fb_base_end(n, &m)) {
			fb_result_base(&res, &m.b);
		} else {
			bad = 1;
		}
		fb_result_add(n->sh, &res);
	}
out:
	if (fb_phase_end(n, 0))
		bad = 1;
	if (t)
		ferry_table_destroy(t);
	if (tt)
		ferry_table_destroy(tt);
	free(lat);
	free(delta);
	free(val);
	return bad ? -1 : 0;
}

int fb_localize(const struct fb_opts *o, struct fb_shared *sh, unsigned parts)
{
	int bad = 0;

	if (o->mode == FERRY_MODE_CLASSIC)
		printf("# localize: classic mode: localize moves nothing; the rows show its "
		       "cost as a no-op\n");
	if (parts & FB_SCEN_MOVE)
		bad |= fb_cluster_run(o, sh, 2, loc_home_node, NULL, "localize: owner = home");
	if (parts & FB_SCEN_LBATCH)
		bad |= fb_cluster_run(o, sh, 2, loc_batch_node, NULL, "localize: batch");
	if (parts & FB_SCEN_MOVE)
		bad |= fb_cluster_run(o, sh, 3, loc_third_node, NULL, "localize: owner != home");
	if (parts & FB_SCEN_HOT)
		bad |= fb_cluster_run(o, sh, o->hot_nodes, loc_hot_node, NULL, "localize: hot key");
	return bad ? -1 : 0;
}

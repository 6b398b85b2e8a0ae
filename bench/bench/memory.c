/* SPDX-License-Identifier: MIT */
/*
 * memory.c - the memory scenario: what each node spends against what it
 * holds, for a sparse table of 64-byte values (issue 12's figures).
 *
 * 4 nodes (forked processes, so each has a resident size of its own; with
 * --external, the launched cluster). Each node:
 *   1. creates a sparse table (hash placement, 16 floats) and reads its
 *      resident size (VmRSS) as its base;
 *   2. sets keys/world keys drawn from the whole 64-bit space; each lands at
 *      its home: row "written";
 *   3. localizes a tenth of the next rank's keys: row "moved";
 *   4. pulls about keys/world/4 keys that exist and that it neither owns
 *      nor homes: row "foreign" (their values come by message, and only the
 *      fixed location cache may hold anything for them).
 * Each row is one node's: keys owned, the bytes of their slots, resident
 * growth since the base beyond those slots per owned key ("over/key"), the
 * directory's bytes, the transport's buffers (ferry_stats' tp_buffer_bytes),
 * and registered (pinned, on rdma) bytes over the owned slots' bytes (the
 * ratio column). The goals (docs/benchmarks.md): at most
 * 48 bytes of overhead per owned key, registered at most 1.25x the owned
 * slots plus one chunk, no growth for keys a node neither owns nor caches.
 */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "fb.h"

#define MEM_VALUE_FLOATS 16 /* 64 B */
#define MEM_BATCH 4096
#define MEM_SETTLE_US 300000 /* call_rcu's frees: a grace period takes milliseconds */

static long mem_rss_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmRSS:", 6)) {
			kb = strtol(line + 6, NULL, 10);
			break;
		}
	fclose(f);
	return kb;
}

/* rank r's keys: the whole 64-bit space, a sequence of its own */
static void mem_keys(int rank, uint64_t i0, uint64_t n, uint64_t *k)
{
	for (uint64_t i = 0; i < n; i++)
		k[i] = 0x9e3779b97f4a7c15ull * (i0 + i + 1) ^ ((uint64_t)(rank + 1) << 56);
}

struct mem_arg {
	uint64_t keys; /* the whole table */
};

static void mem_row(struct fb_node *n, struct ferry_table *t, const char *what, long base_kb,
		    uint64_t keys_total)
{
	struct ferry_table_stats st;
	struct ferry_stats ns;
	struct fb_result r = { .value_bytes = 64, .threads = 1 };
	long kb = mem_rss_kb();
	double slots_b, grow_b;

	if (ferry_table_stats(t, &st) || ferry_stats(n->fy, &ns) || kb < 0) {
		fb_fail(n, "memory: stats", -EIO);
		return;
	}
	slots_b = (double)st.keys_owned * (double)st.slot_bytes;
	grow_b = (double)(kb - base_kb) * 1024.0;
	snprintf(r.scenario, sizeof(r.scenario), "memory");
	snprintf(r.op, sizeof(r.op), "%s r%d", what, n->rank);
	snprintf(r.baseline, sizeof(r.baseline), "owned slots");
	r.keys = st.keys_owned;
	r.mb_per_s = 0;
	/* the ratio column: registered bytes over the owned slots' bytes */
	r.ratio = slots_b > 0 ? (double)st.registered_bytes / slots_b : 0;
	r.extra = st.keys_owned ? (grow_b - slots_b) / (double)st.keys_owned : 0;
	snprintf(r.extra_name, sizeof(r.extra_name), "over/key[B]");
	snprintf(r.note, sizeof(r.note),
		 "over %.0f B/key; rss+%.1f slots %.1f dir %.1f free %.1f reg %.1f tp %.2f MB",
		 r.extra, grow_b / 1e6, slots_b / 1e6, (double)st.dir_bytes / 1e6,
		 (double)st.slots_free * (double)st.slot_bytes / 1e6,
		 (double)st.registered_bytes / 1e6, (double)ns.tp_buffer_bytes / 1e6);
	(void)keys_total;
	fb_result_add(n->sh, &r);
}

static int mem_node(struct fb_node *n)
{
	const struct mem_arg *a = n->arg;
	uint64_t per = a->keys / (uint64_t)n->world;
	struct ferry_table_params tp = {
		.sparse = 1,
		.value_len = MEM_VALUE_FLOATS,
		.placement = FERRY_PLACEMENT_HASH,
		/* what a node holds: its home share (hash: +/- a few %), plus the
		 * moved tenth, plus slack */
		.capacity = per * 3 / 2 + 4096,
	};
	uint64_t *k = malloc(MEM_BATCH * sizeof(*k));
	float *v = malloc((size_t)MEM_BATCH * MEM_VALUE_FLOATS * sizeof(float));
	struct ferry_table *t = NULL;
	long base_kb;
	int rc, bad = 0;

	if (!k || !v) {
		fb_fail(n, "memory: buffers", -ENOMEM);
		bad = 1;
		goto out;
	}
	rc = ferry_table_create(n->fy, &tp, &t);
	if (rc) {
		fb_fail(n, "memory: table create", rc);
		bad = 1;
		goto out;
	}
	for (size_t i = 0; i < (size_t)MEM_BATCH * MEM_VALUE_FLOATS; i++)
		v[i] = 1.0f;
	base_kb = mem_rss_kb();
	for (uint64_t i = 0; i < per && !bad; i += MEM_BATCH) {
		uint64_t m = per - i < MEM_BATCH ? per - i : MEM_BATCH;

		mem_keys(n->rank, i, m, k);
		if ((rc = ferry_set(n->w, t, k, m, v))) {
			fb_fail(n, "memory: set", rc);
			bad = 1;
		}
	}
	if (fb_barrier(n))
		bad = 1;
	/* the directory's arrays replaced by a rebuild, and slots given away,
	 * are freed after an RCU grace period, by liburcu's call_rcu thread:
	 * give it time, so the row shows what stays, not what is on its way out */
	usleep(MEM_SETTLE_US);
	if (!bad)
		mem_row(n, t, "written", base_kb, a->keys);
	if (fb_barrier(n))
		bad = 1;
	for (uint64_t i = 0; i < per / 10 && !bad; i += MEM_BATCH) {
		uint64_t m = per / 10 - i < MEM_BATCH ? per / 10 - i : MEM_BATCH;

		mem_keys((n->rank + 1) % n->world, i, m, k);
		if ((rc = ferry_localize(n->w, t, k, m))) {
			fb_fail(n, "memory: localize", rc);
			bad = 1;
		}
	}
	if (fb_barrier(n))
		bad = 1;
	usleep(MEM_SETTLE_US);
	if (!bad)
		mem_row(n, t, "moved", base_kb, a->keys);
	if (fb_barrier(n))
		bad = 1;
	{
		long before = mem_rss_kb();
		struct ferry_table_stats s0, s1;

		ferry_table_stats(t, &s0);
		/* keys that exist (rank r+2's, past the tenth that moved), not
		 * homed here: nothing is created anywhere, and here only the
		 * fixed location cache may take note */
		for (uint64_t i = per / 2; i < per / 2 + per / 4 && !bad; i += MEM_BATCH) {
			uint64_t m = per / 2 + per / 4 - i < MEM_BATCH ? per / 2 + per / 4 - i :
									 MEM_BATCH,
				 nk = 0;

			mem_keys((n->rank + 2) % n->world, i, m, k);
			for (uint64_t j = 0; j < m; j++)
				if (ferry_table_home(t, k[j]) != n->rank)
					k[nk++] = k[j];
			if (nk && (rc = ferry_pull(n->w, t, k, nk, v))) {
				fb_fail(n, "memory: pull of foreign keys", rc);
				bad = 1;
			}
		}
		ferry_table_stats(t, &s1);
		if (fb_barrier(n))
			bad = 1;
		/* as for the other rows: the pulls' frames are gone, and the
		 * transport's buffers back to what is in flight (none) */
		usleep(MEM_SETTLE_US);
		if (!bad) {
			struct fb_result r = { .value_bytes = 64, .threads = 1 };

			snprintf(r.scenario, sizeof(r.scenario), "memory");
			snprintf(r.op, sizeof(r.op), "foreign r%d", n->rank);
			r.keys = per / 4;
			r.extra = (double)((long long)s1.dir_bytes - (long long)s0.dir_bytes);
			snprintf(r.extra_name, sizeof(r.extra_name), "dir+[B]");
			snprintf(r.note, sizeof(r.note),
				 "dir %+lld B, rss %+.1f MB for %llu foreign keys",
				 (long long)s1.dir_bytes - (long long)s0.dir_bytes,
				 (double)(mem_rss_kb() - before) / 1024.0,
				 (unsigned long long)(per / 4));
			fb_result_add(n->sh, &r);
		}
	}
out:
	if (fb_phase_end(n, 0))
		bad = 1;
	if (t)
		ferry_table_destroy(t);
	free(k);
	free(v);
	return bad ? -1 : 0;
}

int fb_memory(const struct fb_opts *o, struct fb_shared *sh)
{
	struct fb_opts po = *o;
	int bad = 0;

	/* a node's resident size is its own only in a process of its own */
	if (po.nodes_as == FB_NODES_THREADS)
		po.nodes_as = FB_NODES_PROCS;
	for (int i = 0; i < o->nmemkeys; i++) {
		struct mem_arg a = { .keys = o->memkeys[i] };

		bad |= fb_cluster_run(&po, sh, 4, mem_node, &a, "memory");
	}
	return bad ? -1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * timeline.c - ferry-bench --timeline: where the time of one relocation and
 * of one push goes, step by step, node by node (lib/core/timeline.h stamps
 * them; docs/benchmarks.md "Where the time goes" shows the tables).
 *
 * Each node turns its own stamps into durations of pairs of steps it saw
 * itself, key by key (the first stamp of each step of a key), and writes the
 * median of each pair into the shared region; rank 0 prints them. A step
 * that spans nodes is never one node's stamp minus another's: it is the
 * requester's round trip minus what the nodes it crossed spent inside (their
 * own medians), which leaves the one-way trips: the wire and each side's
 * transport (send posting, completion, progress thread wake-up, dispatch).
 * That difference is one of medians, not a median of differences.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "fb.h"
#include "lib/core/timeline.h"

#define TL_EVENTS (1u << 20) /* per node: 24 MiB, ~100k moves of 10 stamps */
#define TL_IDLE_MS 500	     /* the idle CPU measure after each table */

/* rank 0's process: CPU and wall time at fb_tl_begin */
static int64_t tl_cpu0, tl_wall0;

/* CPU time of the whole process (every node's threads when nodes are threads), ns */
static int64_t tl_cpu_ns(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL +
	       ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
}

struct tl_pair {
	enum fb_tl_kind kind;
	const char *who; /* the node that sees both stamps */
	const char *name;
	enum ferry_tl_step from, to;
};

static const struct tl_pair tl_pairs[] = {
	{ FB_TL_LOCALIZE, "requester", "call -> LOCALIZE posted", FERRY_TL_LOC_CALL,
	  FERRY_TL_LOC_POST },
	{ FB_TL_LOCALIZE, "requester", "LOCALIZE posted -> notice received (round trip)",
	  FERRY_TL_LOC_POST, FERRY_TL_LOC_NOTICE_RECV },
	{ FB_TL_LOCALIZE, "requester", "notice received -> installed", FERRY_TL_LOC_NOTICE_RECV,
	  FERRY_TL_LOC_WAKE },
	{ FB_TL_LOCALIZE, "requester", "installed -> worker woken, call returned",
	  FERRY_TL_LOC_WAKE, FERRY_TL_LOC_RETURN },
	{ FB_TL_LOCALIZE, "requester", "call -> return (total)", FERRY_TL_LOC_CALL,
	  FERRY_TL_LOC_RETURN },
	{ FB_TL_LOCALIZE, "home", "LOCALIZE received -> HANDOVER_REQ posted",
	  FERRY_TL_LOC_HOME_RECV, FERRY_TL_LOC_HOME_FWD },
	{ FB_TL_LOCALIZE, "home = owner", "HANDOVER_REQ posted -> received (to itself)",
	  FERRY_TL_LOC_HOME_FWD, FERRY_TL_LOC_OWNER_RECV },
	{ FB_TL_LOCALIZE, "old owner", "HANDOVER_REQ received -> WRITE posted",
	  FERRY_TL_LOC_OWNER_RECV, FERRY_TL_LOC_WRITE_POST },
	{ FB_TL_LOCALIZE, "old owner", "WRITE posted -> WRITE completion", FERRY_TL_LOC_WRITE_POST,
	  FERRY_TL_LOC_WRITE_DONE },
	{ FB_TL_LOCALIZE, "old owner", "WRITE completion -> notice posted", FERRY_TL_LOC_WRITE_DONE,
	  FERRY_TL_LOC_NOTICE_SENT },
	{ FB_TL_LOCALIZE, "old owner", "HANDOVER_REQ received -> notice posted",
	  FERRY_TL_LOC_OWNER_RECV, FERRY_TL_LOC_NOTICE_SENT },
	{ FB_TL_LOCALIZE, "home = owner", "LOCALIZE received -> notice posted",
	  FERRY_TL_LOC_HOME_RECV, FERRY_TL_LOC_NOTICE_SENT },
	{ FB_TL_PUSH, "worker", "call -> OP posted", FERRY_TL_PUSH_CALL, FERRY_TL_PUSH_POST },
	{ FB_TL_PUSH, "worker", "OP posted -> REPLY received (round trip)", FERRY_TL_PUSH_POST,
	  FERRY_TL_REPLY_RECV },
	{ FB_TL_PUSH, "worker", "REPLY received, worker signalled -> call returned",
	  FERRY_TL_REPLY_RECV, FERRY_TL_PUSH_RETURN },
	{ FB_TL_PUSH, "worker", "call -> return (total)", FERRY_TL_PUSH_CALL,
	  FERRY_TL_PUSH_RETURN },
	{ FB_TL_PUSH, "owner", "OP received -> applied", FERRY_TL_OP_RECV, FERRY_TL_OP_APPLIED },
	{ FB_TL_PUSH, "owner", "applied -> REPLY posted", FERRY_TL_OP_APPLIED,
	  FERRY_TL_REPLY_SENT },
	{ FB_TL_PUSH, "owner", "OP received -> REPLY posted", FERRY_TL_OP_RECV,
	  FERRY_TL_REPLY_SENT },
};
#define TL_NPAIRS (sizeof(tl_pairs) / sizeof(tl_pairs[0]))
_Static_assert(TL_NPAIRS <= FB_TL_MAX_PAIRS, "raise FB_TL_MAX_PAIRS");

/* indices into tl_pairs used by the derived lines */
enum {
	TLP_LOC_RTT = 1,
	TLP_LOC_TOTAL = 4,
	TLP_HOME = 5,
	TLP_WRITE = 8,
	TLP_OWNER = 10,
	TLP_HOME_OWNER = 11,
	TLP_PUSH_RTT = 13,
	TLP_PUSH_TOTAL = 15,
	TLP_PUSH_OWNER = 18,
};

int fb_tl_enable(struct fb_node *n)
{
	int rc = ferry__tl_enable(n->fy, TL_EVENTS);

	if (rc) {
		fb_fail(n, "timeline", rc);
		return -1;
	}
	return 0;
}

void fb_tl_mark(struct fb_node *n, enum fb_tl_mark m, uint64_t key)
{
	static const enum ferry_tl_step step[] = {
		[FB_TL_LOC_CALL] = FERRY_TL_LOC_CALL,
		[FB_TL_LOC_RETURN] = FERRY_TL_LOC_RETURN,
		[FB_TL_PUSH_CALL] = FERRY_TL_PUSH_CALL,
		[FB_TL_PUSH_RETURN] = FERRY_TL_PUSH_RETURN,
	};

	ferry__tl_stamp(n->fy, step[m], key);
}

int fb_tl_begin(struct fb_node *n)
{
	int rc;

	ferry__tl_reset(n->fy);
	rc = fb_barrier(n);
	if (n->rank == 0) {
		tl_cpu0 = tl_cpu_ns();
		tl_wall0 = fb_now_ns();
	}
	return rc;
}

/*
 * rank 0: the CPU the run took, and what the process takes while every node
 * waits (the others in a barrier, rank 0 asleep): a blocking node's idle
 * cost, and busy-poll's. Threads mode only: one process holds every node.
 */
static void tl_print_cpu(struct fb_node *n, int64_t cpu1, int64_t wall1)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = TL_IDLE_MS * 1000000L };
	int64_t c0, w0;

	if (n->o->nodes_as != FB_NODES_THREADS) {
		printf("#   CPU: measured only when the nodes are threads of one process\n");
		return;
	}
	c0 = tl_cpu_ns();
	w0 = fb_now_ns();
	nanosleep(&ts, NULL);
	printf("#   CPU of all %d nodes: run %.3f s in %.3f s wall (%.2f cores); idle %.1f ms "
	       "per s (%.3f cores)\n",
	       n->world, (double)(cpu1 - tl_cpu0) / 1e9, (double)(wall1 - tl_wall0) / 1e9,
	       (double)(cpu1 - tl_cpu0) / (double)(wall1 - tl_wall0),
	       (double)(tl_cpu_ns() - c0) / 1e6 / ((double)(fb_now_ns() - w0) / 1e9),
	       (double)(tl_cpu_ns() - c0) / (double)(fb_now_ns() - w0));
}

static int tl_ev_cmp(const void *a, const void *b)
{
	const struct ferry_tl_ev *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->ns < y->ns ? -1 : x->ns > y->ns;
}

/* this node's medians into sh->tl[rank] */
static int tl_collect(struct fb_node *n)
{
	const struct ferry_tl_ev *ev;
	uint64_t dropped;
	size_t ne = ferry__tl_events(n->fy, &ev, &dropped), nkeys = 0;
	struct ferry_tl_ev *v = malloc((ne ? ne : 1) * sizeof(*v));
	int64_t *d[TL_NPAIRS] = { 0 };
	size_t nd[TL_NPAIRS] = { 0 };
	struct fb_tl_node *out = &n->sh->tl[n->rank];
	int bad = !v;

	for (size_t p = 0; p < TL_NPAIRS && !bad; p++)
		bad = !(d[p] = malloc((ne ? ne : 1) * sizeof(int64_t)));
	if (bad) {
		fb_failf(n->sh, "timeline: out of memory for %zu stamps on rank %d", ne, n->rank);
		goto out;
	}
	memcpy(v, ev, ne * sizeof(*v));
	qsort(v, ne, sizeof(*v), tl_ev_cmp);
	for (size_t i = 0; i < ne;) {
		int64_t first[FERRY_TL_NSTEPS];
		size_t j = i;

		for (int s = 0; s < FERRY_TL_NSTEPS; s++)
			first[s] = -1;
		for (; j < ne && v[j].key == v[i].key; j++)
			if (v[j].step < FERRY_TL_NSTEPS && first[v[j].step] < 0)
				first[v[j].step] = v[j].ns;
		for (size_t p = 0; p < TL_NPAIRS; p++)
			if (first[tl_pairs[p].from] >= 0 && first[tl_pairs[p].to] >= 0)
				d[p][nd[p]++] = first[tl_pairs[p].to] - first[tl_pairs[p].from];
		nkeys++;
		i = j;
	}
	memset(out, 0, sizeof(*out));
	for (size_t p = 0; p < TL_NPAIRS; p++) {
		out->n[p] = (long)nd[p];
		if (nd[p]) {
			fb_sort(d[p], nd[p]);
			out->p50_us[p] = fb_pct_us(d[p], nd[p], 0.5);
		}
	}
	out->dropped = dropped;
	out->set = 1;
out:
	for (size_t p = 0; p < TL_NPAIRS; p++)
		free(d[p]);
	free(v);
	(void)nkeys;
	return bad ? -1 : 0;
}

/* the median of pair @p on the node that saw it most; 0 and *rank_p = -1: none */
static double tl_get(const struct fb_shared *sh, int world, size_t p, int *rank_p)
{
	long best = 0;

	*rank_p = -1;
	for (int r = 0; r < world && r < FB_TL_MAX_NODES; r++)
		if (sh->tl[r].set && sh->tl[r].n[p] > best) {
			best = sh->tl[r].n[p];
			*rank_p = r;
		}
	return *rank_p < 0 ? 0 : sh->tl[*rank_p].p50_us[p];
}

/* --hw-oneway's figure for a message of @bytes: the first size >= it, else the largest */
static double tl_hw_us(const struct fb_opts *o, uint32_t bytes)
{
	for (int i = 0; i < o->nhw; i++)
		if (o->hw_bytes[i] >= bytes)
			return o->hw_us[i];
	return o->hw_us[o->nhw - 1];
}

/*
 * The projection of the same operation on hardware: the steps that are the
 * wire (the derived one-way trips, and the hand-over WRITE's post to
 * completion) replaced by --hw-oneway's figures, every other step (the CPU's)
 * as measured here. The frame that carries the value (a push's OP; over tcp
 * a relocation's notice) is at the value's size, every other at the smallest
 * size given; a WRITE's completion is its bytes one way and an ack back.
 */
static void tl_project(const struct fb_node *n, enum fb_tl_kind kind, uint32_t bytes, double total,
		       double one_way, int legs)
{
	const struct fb_opts *o = n->o;
	double wire_here = one_way * legs, wire_hw, small = o->hw_us[0], big = tl_hw_us(o, bytes);
	double write = 0;
	int r_w = -1;

	if (kind == FB_TL_PUSH) {
		wire_hw = big + small * (legs - 1);
	} else {
		write = tl_get(n->sh, n->world, TLP_WRITE, &r_w);
		/* without a WRITE (tcp) the value rides on the last leg, the notice */
		wire_hw = r_w >= 0 ? small * legs + big + small : small * (legs - 1) + big;
		wire_here += write;
	}
	printf("#   projection (NOT a measurement): CPU steps as measured here %.1f us + wire at "
	       "--hw-oneway's figures %.1f us (%d one-way trip%s%s) = %.1f us; the wire here was "
	       "%.1f us\n",
	       total - wire_here, wire_hw, legs, legs > 1 ? "s" : "",
	       r_w >= 0 ? " and the WRITE's round trip" : "", total - wire_here + wire_hw,
	       wire_here);
}

static void tl_print(struct fb_node *n, enum fb_tl_kind kind, const char *title, uint32_t bytes)
{
	const struct fb_shared *sh = n->sh;
	double total, rtt, inside = 0;
	int r_total, r_rtt, r, legs;

	printf("# timeline: %s (p50 per step on the node that saw it; clock "
	       "CLOCK_MONOTONIC_RAW)\n",
	       title);
	printf("#   %-5s %-13s %-52s %10s %7s\n", "rank", "node", "step", "p50[us]", "n");
	for (size_t p = 0; p < TL_NPAIRS; p++) {
		if (tl_pairs[p].kind != kind)
			continue;
		long most = 0;

		for (r = 0; r < n->world && r < FB_TL_MAX_NODES; r++)
			if (sh->tl[r].set && sh->tl[r].n[p] > most)
				most = sh->tl[r].n[p];
		for (r = 0; r < n->world && r < FB_TL_MAX_NODES; r++) {
			/* a few stray keys (the bench's own barriers and exchanges
			 * stamp too) are left out */
			if (!sh->tl[r].set || !sh->tl[r].n[p] || sh->tl[r].n[p] * 10 < most)
				continue;
			/* a node that is both home and old owner sees the pairs of each */
			printf("#   %-5d %-13s %-52s %10.1f %7ld\n", r, tl_pairs[p].who,
			       tl_pairs[p].name, sh->tl[r].p50_us[p], sh->tl[r].n[p]);
		}
	}
	if (kind == FB_TL_LOCALIZE) {
		int r_ho, r_h, r_o;
		double ho = tl_get(sh, n->world, TLP_HOME_OWNER, &r_ho);
		double h = tl_get(sh, n->world, TLP_HOME, &r_h);
		double ow = tl_get(sh, n->world, TLP_OWNER, &r_o);

		total = tl_get(sh, n->world, TLP_LOC_TOTAL, &r_total);
		rtt = tl_get(sh, n->world, TLP_LOC_RTT, &r_rtt);
		if (r_ho >= 0 && r_h == r_o) {
			/* home = old owner: two one-way trips */
			inside = ho;
			legs = 2;
		} else {
			inside = h + ow;
			legs = 3;
		}
	} else {
		int r_o;

		total = tl_get(sh, n->world, TLP_PUSH_TOTAL, &r_total);
		rtt = tl_get(sh, n->world, TLP_PUSH_RTT, &r_rtt);
		inside = tl_get(sh, n->world, TLP_PUSH_OWNER, &r_o);
		legs = 2;
	}
	if (r_rtt >= 0)
		printf("#   derived: round trip %.1f - inside the remote node(s) %.1f = %d one-way "
		       "trips (wire + both transports) %.1f us, %.1f us each; total %.1f us\n",
		       rtt, inside, legs, rtt - inside, (rtt - inside) / legs, total);
	if (r_rtt >= 0 && r_total >= 0 && n->o->nhw)
		tl_project(n, kind, bytes, total, (rtt - inside) / legs, legs);
	for (r = 0; r < n->world && r < FB_TL_MAX_NODES; r++)
		if (sh->tl[r].dropped)
			printf("#   rank %d: %llu stamps dropped (buffer full): the medians miss "
			       "them\n",
			       r, sh->tl[r].dropped);
}

int fb_tl_end(struct fb_node *n, enum fb_tl_kind kind, const char *title, uint32_t bytes)
{
	int64_t cpu1 = tl_cpu_ns(), wall1 = fb_now_ns();
	int bad = 0;

	if (n->rank < FB_TL_MAX_NODES)
		bad = tl_collect(n);
	if (fb_barrier(n))
		return -1;
	if (n->rank == 0 && n->o->nodes_as == FB_NODES_EXTERNAL)
		printf("# timeline: %s: only rank 0's steps (--external: the other nodes' are "
		       "in their own processes)\n",
		       title);
	if (n->rank == 0) {
		tl_print(n, kind, title, bytes);
		tl_print_cpu(n, cpu1, wall1);
	}
	if (n->rank == 0)
		memset(n->sh->tl, 0, sizeof(n->sh->tl));
	ferry__tl_reset(n->fy);
	if (fb_barrier(n))
		return -1;
	return bad ? -1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Integration: collectives of node groups (ferry_group_create, lib/coll/).
 * Nodes are threads of this process (tests/common/cluster.h); with
 * FERRY_TRANSPORT=loop (or rdma, in the VM) they run over that transport.
 *
 * - 6 nodes in two disjoint groups of 3 listed out of order, a group of all
 *   six in reverse order, and the whole cluster, side by side: all-reduce,
 *   reduce and broadcast (roots as member indices) with both algorithms,
 *   against references over each group's members, bit-exact; one member
 *   of each group creates it late, after the others started collectives
 *   on it (their frames wait for it);
 * - bad lists (empty, out of range, twice, without this node) give -EINVAL,
 *   a second group of one list -EEXIST, a root past the members -EINVAL,
 *   a destroy with a collective started -EBUSY;
 * - a frame of a group from a node that is not a member drops that node:
 *   the collectives of the cluster fail from then on, those of a group
 *   without it go on.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cluster.h"
#include "ferry/ferry.h"
#include "lib/coll/coll.h"
#include "lib/core/core.h"

static int64_t input(uint32_t rank, size_t i, unsigned salt)
{
	return (int64_t)((rank * 7 + i * 13 + salt * 5) % 41) - 20;
}

static int64_t reference(const uint32_t *ranks, size_t n, enum ferry_redop op, size_t i,
			 unsigned salt)
{
	int64_t acc = input(ranks[0], i, salt);

	for (size_t r = 1; r < n; r++) {
		int64_t x = input(ranks[r], i, salt);

		acc = op == FERRY_SUM ? acc + x :
		      op == FERRY_MAX ? (x > acc ? x : acc) :
					(x < acc ? x : acc);
	}
	return acc;
}

struct shared {
	atomic_int failures;
	char why[512];
};

static int fail(struct shared *s, const char *what, int rank, int rc)
{
	if (atomic_fetch_add(&s->failures, 1) == 0)
		snprintf(s->why, sizeof(s->why), "rank %d: %s: %s", rank, what,
			 rc ? ferry_strerror(rc) : "wrong result");
	return 1;
}

#define NODES 6
static const uint32_t grp_a[] = { 4, 1, 3 };
static const uint32_t grp_b[] = { 0, 5, 2 };
static const uint32_t grp_all[] = { 5, 4, 3, 2, 1, 0 };
static const uint32_t world[] = { 0, 1, 2, 3, 4, 5 };
#define SMALL 13
#define LARGE 33001 /* doubles: past the 256 KiB crossover, the ring */

/* an all-reduce, a reduce to member 1 and a broadcast from member 2 of
 * @count doubles on @g (NULL: the whole cluster) whose members are
 * @ranks; 0 or 1 (failed) */
static int rounds(struct ferry *fy, struct ferry_group *g, const uint32_t *ranks, size_t n,
		  uint32_t rank, size_t count, unsigned salt, struct shared *sh, const char *name)
{
	double *buf = malloc(count * sizeof(*buf)), *out = malloc(count * sizeof(*out));
	int me = -1, rc, bad = 0;

	for (size_t i = 0; i < n; i++)
		if (ranks[i] == rank)
			me = (int)i;
	for (size_t i = 0; i < count; i++)
		buf[i] = (double)input(rank, i, salt);
	rc = g ? ferry_group_allreduce(g, buf, out, count, FERRY_FLOAT64, FERRY_SUM) :
		 ferry_allreduce(fy, buf, out, count, FERRY_FLOAT64, FERRY_SUM);
	for (size_t i = 0; !rc && !bad && i < count; i++)
		bad = out[i] != (double)reference(ranks, n, FERRY_SUM, i, salt);
	if (rc || bad) {
		bad = fail(sh, name, (int)rank, rc);
		goto out;
	}
	memset(out, 0, count * sizeof(*out));
	rc = g ? ferry_group_reduce(g, buf, out, count, FERRY_FLOAT64, FERRY_MAX, 1) :
		 ferry_reduce(fy, buf, out, count, FERRY_FLOAT64, FERRY_MAX, 1);
	for (size_t i = 0; !rc && !bad && me == 1 && i < count; i++)
		bad = out[i] != (double)reference(ranks, n, FERRY_MAX, i, salt);
	if (rc || bad) {
		bad = fail(sh, name, (int)rank, rc);
		goto out;
	}
	if (me != 2)
		memset(buf, 0, count * sizeof(*buf));
	rc = g ? ferry_group_broadcast(g, buf, count, FERRY_FLOAT64, 2) :
		 ferry_broadcast(fy, buf, count, FERRY_FLOAT64, 2);
	for (size_t i = 0; !rc && !bad && i < count; i++)
		bad = buf[i] != (double)input(ranks[2], i, salt);
	if (rc || bad)
		bad = fail(sh, name, (int)rank, rc);
out:
	free(buf);
	free(out);
	return bad;
}

static int groups_node(struct tc *c, int rank, void *arg)
{
	struct shared *sh = arg;
	struct ferry *fy = c->fy[rank];
	const uint32_t *mine = rank == 4 || rank == 1 || rank == 3 ? grp_a : grp_b;
	struct ferry_group *g = NULL, *all = NULL;
	int rc;

	/* the last member of each three creates it late: the others' frames
	 * wait for it */
	if ((uint32_t)rank == mine[2])
		usleep(100000);
	rc = ferry_group_create(fy, mine, 3, &g);
	if (!rc)
		rc = ferry_group_create(fy, grp_all, NODES, &all);
	if (rc)
		return fail(sh, "group_create", rank, rc);
	for (unsigned round = 0; round < 3; round++) {
		size_t count = round == 1 ? LARGE : SMALL;

		if (rounds(fy, g, mine, 3, (uint32_t)rank, count, round * 10, sh, "three") ||
		    rounds(fy, all, grp_all, NODES, (uint32_t)rank, count, round * 10 + 1, sh,
			   "six reversed") ||
		    rounds(fy, NULL, world, NODES, (uint32_t)rank, count, round * 10 + 2, sh,
			   "world"))
			return 1;
	}
	/* every member's collectives of a group are done before it goes */
	rc = ferry_barrier(fy);
	if (!rc)
		rc = ferry_group_destroy(g);
	if (!rc)
		rc = ferry_group_destroy(all);
	return rc ? fail(sh, "destroy", rank, rc) : 0;
}

Test(groups, groups_run_side_by_side_and_match_their_references, .timeout = 300)
{
	struct shared sh = { 0 };
	struct tc c;

	cr_assert_eq(tc_open(&c, NODES, NULL, 20000), 0);
	tc_run(&c, groups_node, &sh);
	tc_close(&c);
	cr_assert_eq(atomic_load(&sh.failures), 0, "%s", sh.why);
}

Test(groups, bad_lists_and_calls_are_refused)
{
	struct ferry_group *g = NULL, *g2 = NULL;
	struct ferry_coll *h;
	uint32_t dup[] = { 0, 1, 1 }, out[] = { 0, 9 }, other[] = { 1, 2 }, ok[] = { 1, 0 };
	double v[4] = { 0 }, v1[4] = { 0 };
	struct tc c;

	cr_assert_eq(tc_open(&c, 3, NULL, 5000), 0);
	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL);
	cr_assert_eq(ferry_group_create(c.fy[0], ok, 0, &g), -EINVAL);
	cr_assert_eq(ferry_group_create(c.fy[0], NULL, 2, &g), -EINVAL);
	cr_assert_eq(ferry_group_create(c.fy[0], ok, 2, NULL), -EINVAL);
	cr_assert_eq(ferry_group_create(c.fy[0], dup, 3, &g), -EINVAL);
	cr_assert_eq(ferry_group_create(c.fy[0], out, 2, &g), -EINVAL);
	cr_assert_eq(ferry_group_create(c.fy[0], other, 2, &g), -EINVAL, "rank 0 is not in it");
	cr_assert_eq(ferry_group_create(c.fy[0], ok, 4, &g), -EINVAL, "more than the world");
	cr_assert_null(g);
	cr_assert_eq(ferry_group_create(c.fy[0], ok, 2, &g), 0);
	cr_assert_eq(ferry_group_create(c.fy[0], ok, 2, &g2), -EEXIST);
	cr_assert_null(g2);
	cr_assert_eq(ferry_group_broadcast(g, v, 4, FERRY_FLOAT64, 2), -EINVAL, "root 2 of 2");
	cr_assert_eq(ferry_group_allreduce(NULL, v, v, 4, FERRY_FLOAT64, FERRY_SUM), -EINVAL);
	cr_assert_eq(ferry_group_allreduce_start(g, v, v, 4, FERRY_FLOAT64, FERRY_SUM, &h), 0);
	cr_assert_eq(ferry_group_destroy(g), -EBUSY);
	/* rank 1 joins: the started all-reduce completes */
	cr_assert_eq(ferry_group_create(c.fy[1], ok, 2, &g2), 0);
	cr_assert_eq(ferry_group_allreduce(g2, v1, v1, 4, FERRY_FLOAT64, FERRY_SUM), 0);
	cr_assert_eq(ferry_coll_wait(h), 0);
	cr_assert_eq(ferry_group_destroy(g), 0);
	cr_assert_eq(ferry_group_destroy(g2), 0);
	cr_assert_eq(ferry_group_destroy(NULL), 0);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	tc_close(&c);
}

static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static char cap_last[1024];
static int cap_errors;

static void capture(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	pthread_mutex_lock(&cap_lock);
	if (level == FERRY_LOG_ERROR && strstr(msg, "proto:")) {
		cap_errors++;
		snprintf(cap_last, sizeof(cap_last), "%s", msg);
	}
	pthread_mutex_unlock(&cap_lock);
}

Test(groups, a_non_member_frame_drops_its_sender_and_spares_the_groups_without_it, .timeout = 60)
{
	uint32_t pair[] = { 0, 1 };
	struct ferry_group *g0, *g1;
	double v[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, w[8], w1[8];
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_coll m;
		double data[8];
	} f;
	struct ferry_coll *h0;
	struct tc c;
	int n = 0;

	cr_assert_eq(tc_open(&c, 3, NULL, 5000), 0);
	cr_assert_eq(ferry_group_create(c.fy[0], pair, 2, &g0), 0);
	cr_assert_eq(ferry_group_create(c.fy[1], pair, 2, &g1), 0);
	ferry_log_set(FERRY_LOG_ERROR, capture, NULL);
	/* rank 2, not a member, sends rank 0 a frame of the pair's first
	 * all-reduce, as member 1 would */
	memset(&f, 0, sizeof(f));
	f.m = (struct ferry_msg_coll){ .seq = 0,
				       .count = 8,
				       .n = 8,
				       .kind = FERRY_COLL_KIND_ALLREDUCE,
				       .dtype = FERRY_FLOAT64,
				       .op = FERRY_SUM,
				       .algo = FERRY_COLL_ALGO_DOUBLING,
				       .group = ferry__coll_group_id(pair, 2) };
	ferry__proto_hdr_init(&f.h, FERRY_MSG_COLL, sizeof(f), 2, 0);
	cr_assert_eq(ferry__send(c.fy[2], 0, &f, sizeof(f)), 0);
	for (int i = 0; i < 300 && !n; i++) {
		usleep(10000);
		pthread_mutex_lock(&cap_lock);
		n = cap_errors;
		pthread_mutex_unlock(&cap_lock);
	}
	cr_assert_eq(n, 1, "one error line, got %d", n);
	cr_assert(strstr(cap_last, "not a member"), "%s", cap_last);
	cr_assert(strstr(cap_last, "dropping rank 2"), "%s", cap_last);
	/* the pair goes on, its first all-reduce untouched by the forgery; the
	 * whole cluster cannot */
	cr_assert_eq(ferry_group_allreduce_start(g0, v, w, 8, FERRY_FLOAT64, FERRY_SUM, &h0), 0);
	cr_assert_eq(ferry_group_allreduce(g1, v, w1, 8, FERRY_FLOAT64, FERRY_SUM), 0);
	cr_assert_eq(ferry_coll_wait(h0), 0);
	for (int i = 0; i < 8; i++)
		cr_assert(w[i] == 2 * v[i] && w1[i] == 2 * v[i], "element %d: %g and %g", i, w[i],
			  w1[i]);
	cr_assert_eq(ferry_allreduce(c.fy[0], v, w, 8, FERRY_FLOAT64, FERRY_SUM), -FERRY_E_PEER);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	cr_assert_eq(ferry_group_destroy(g0), 0);
	cr_assert_eq(ferry_group_destroy(g1), 0);
	tc_close(&c);
}

/* SPDX-License-Identifier: MIT */
/*
 * Integration: the collectives (lib/coll/) against references computed
 * here. Nodes are threads of this process (tests/common/cluster.h); with
 * FERRY_TRANSPORT=loop (or rdma, in the VM) they run over that transport.
 *
 * - every collective, type and operator, in place and not, both algorithms
 *   (forced with ferry_coll_algo_set), for 1 .. 8 nodes and counts 0, 1, 2,
 *   3, 7, 13, 100, 1001 and one past a segment: bit-exact (the inputs are
 *   small integers, so every order of summation gives the same result);
 *   a reduce leaves the non-roots' output untouched;
 * - many collectives back to back, started 16 at a time and collected by
 *   wait and by test, in mixed sizes (both algorithms by size);
 * - arguments that break the contract fail with -EINVAL (one log line
 *   each), a 17th started collective with -EBUSY;
 * - nodes that call different collectives get -FERRY_E_MISMATCH;
 * - a frame from a rank that is not the receiver's peer at that step, or of
 *   a collective too far ahead, drops its sender (one log line), and the
 *   collective under way ends with -FERRY_E_PEER;
 * - a node killed while the others are inside an all-reduce ends it at once
 *   with -FERRY_E_PEER, and the next collective fails at once too (forked
 *   processes).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "ferry/ferry.h"
#include "lib/coll/coll.h"
#include "lib/core/core.h"

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static size_t esz(enum ferry_dtype t)
{
	return t == FERRY_FLOAT32 ? 4 : 8;
}

/* small integers: any order of summation is exact in every type */
static int64_t input(int rank, size_t i, unsigned salt)
{
	return (int64_t)((rank * 7 + i * 13 + salt * 5) % 41) - 20;
}

static void put(void *buf, enum ferry_dtype t, size_t i, int64_t v)
{
	if (t == FERRY_FLOAT32)
		((float *)buf)[i] = (float)v;
	else if (t == FERRY_FLOAT64)
		((double *)buf)[i] = (double)v;
	else
		((int64_t *)buf)[i] = v;
}

static void fill(void *buf, enum ferry_dtype t, size_t count, int rank, unsigned salt)
{
	for (size_t i = 0; i < count; i++)
		put(buf, t, i, input(rank, i, salt));
}

static int64_t reference(int world, enum ferry_redop op, size_t i, unsigned salt)
{
	int64_t acc = input(0, i, salt);

	for (int r = 1; r < world; r++) {
		int64_t x = input(r, i, salt);

		acc = op == FERRY_SUM ? acc + x :
		      op == FERRY_MAX ? (x > acc ? x : acc) :
					(x < acc ? x : acc);
	}
	return acc;
}

/* first index where @buf differs from the reference, or -1 */
static long check(const void *buf, enum ferry_dtype t, size_t count, int world, enum ferry_redop op,
		  unsigned salt)
{
	for (size_t i = 0; i < count; i++) {
		void *want = malloc(8);
		int same;

		put(want, t, 0, reference(world, op, i, salt));
		same = !memcmp((const uint8_t *)buf + i * esz(t), want, esz(t));
		free(want);
		if (!same)
			return (long)i;
	}
	return -1;
}

struct shared {
	atomic_int failures;
	char why[512];
};

static int failf(struct shared *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int failf(struct shared *s, const char *fmt, ...)
{
	va_list ap;

	if (atomic_fetch_add(&s->failures, 1) == 0) {
		va_start(ap, fmt);
		vsnprintf(s->why, sizeof(s->why), fmt, ap);
		va_end(ap);
	}
	return 1;
}

/* ---- every collective against its reference ---------------------------- */

static const size_t counts[] = { 0, 1, 2, 3, 7, 13, 100, 1001 };
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))
static const enum ferry_dtype dtypes[] = { FERRY_FLOAT32, FERRY_FLOAT64, FERRY_INT64 };
static const enum ferry_redop ops[] = { FERRY_SUM, FERRY_MAX, FERRY_MIN };
static const char *const dnames[] = { "?", "float32", "float64", "int64" };
static const char *const onames[] = { "?", "sum", "max", "min" };

struct matrix {
	struct shared sh;
	enum ferry_coll_algo algo;
	int big; /* also counts past one segment; 2: and 4 MiB (put_node) */
};

static int one_case(struct ferry *fy, struct shared *sh, int rank, int world, int kind,
		    size_t count, enum ferry_dtype t, enum ferry_redop op, int inplace, int root,
		    unsigned salt)
{
	size_t bytes = count * esz(t);
	uint8_t *src = malloc(bytes + 8), *dst = malloc(bytes + 8);
	const char *what = kind == 0 ? "allreduce" : kind == 1 ? "reduce" : "broadcast";
	int rc, bad = 0;
	long at;

	fill(src, t, count, rank, salt);
	memset(dst, 0xa5, bytes + 8);
	if (getenv("FERRY_TEST_TRACE")) /* where a run stops, in the guest's output */
		fprintf(stderr, "trace: rank %d world %d: %s of %zu %s %s root %d\n", rank, world,
			what, count, dnames[t], onames[op], root);
	if (kind == 0) {
		rc = ferry_allreduce(fy, src, inplace ? src : dst, count, t, op);
	} else if (kind == 1) {
		rc = ferry_reduce(fy, src, inplace && rank == root ? src : dst, count, t, op, root);
	} else {
		if (rank != root)
			memset(src, 0x5a, bytes);
		rc = ferry_broadcast(fy, src, count, t, root);
	}
	if (rc) {
		bad = failf(sh, "rank %d: %s of %zu %s %s (world %d, root %d): %s", rank, what,
			    count, dnames[t], onames[op], world, root, ferry_strerror(rc));
		goto out;
	}
	if (kind == 2) {
		uint8_t *want = malloc(bytes + 8);

		fill(want, t, count, root, salt);
		if (memcmp(want, src, bytes))
			bad = failf(sh, "rank %d: broadcast of %zu %s from %d (world %d) differs",
				    rank, count, dnames[t], root, world);
		free(want);
		goto out;
	}
	if (kind == 1 && rank != root) {
		for (size_t i = 0; i < bytes + 8; i++)
			if (dst[i] != 0xa5) {
				bad = failf(sh, "rank %d: reduce to %d wrote a non-root's output",
					    rank, root);
				break;
			}
		goto out;
	}
	at = check(inplace ? src : dst, t, count, world, op, salt);
	if (at >= 0)
		bad = failf(sh,
			    "rank %d: %s of %zu %s %s (%s, world %d, root %d): element %ld "
			    "differs from the reference",
			    rank, what, count, dnames[t], onames[op],
			    inplace ? "in place" : "out of place", world, root, at);
	if (!inplace && dst[bytes] != 0xa5)
		bad = failf(sh, "rank %d: %s wrote past the end of its output", rank, what);
out:
	free(src);
	free(dst);
	return bad;
}

static int matrix_node(struct tc *c, int rank, void *arg)
{
	struct matrix *m = arg;
	struct ferry *fy = c->fy[rank];
	unsigned salt = 0;
	int rc;

	rc = ferry_coll_algo_set(fy, m->algo);
	if (rc)
		return failf(&m->sh, "algo_set: %s", ferry_strerror(rc));
	for (size_t ci = 0; ci < NCOUNTS + (size_t)m->big; ci++) {
		/* one past a 1 MiB segment of float64, odd */
		size_t count = ci < NCOUNTS ? counts[ci] : (1u << 17) + 3;

		for (int di = 0; di < 3; di++)
			for (int oi = 0; oi < 3; oi++) {
				int inplace = (int)((ci + di + oi) % 2);
				int root = (int)((ci + di) % (size_t)c->n);

				if (one_case(fy, &m->sh, rank, c->n, 0, count, dtypes[di], ops[oi],
					     inplace, 0, salt++) ||
				    one_case(fy, &m->sh, rank, c->n, 1, count, dtypes[di], ops[oi],
					     !inplace, root, salt++))
					return 1;
			}
		for (int di = 0; di < 3; di++)
			if (one_case(fy, &m->sh, rank, c->n, 2, count, dtypes[di], FERRY_SUM, 0,
				     (int)((ci + di + 1) % (size_t)c->n), salt++))
				return 1;
	}
	return 0;
}

static void run_matrix(enum ferry_coll_algo algo)
{
	for (int n = 1; n <= TC_MAX; n++) {
		struct matrix m = { .algo = algo, .big = n <= 3 || n == 5 || n == 8 };
		struct tc c;

		cr_assert_eq(tc_open(&c, n, NULL, 20000), 0, "open %d nodes", n);
		tc_run(&c, matrix_node, &m);
		tc_close(&c);
		cr_assert_eq(atomic_load(&m.sh.failures), 0, "%d nodes: %s", n, m.sh.why);
	}
}

Test(coll, every_collective_matches_the_reference_by_recursive_doubling, .timeout = 300)
{
	run_matrix(FERRY_COLL_ALGO_DOUBLING);
}

Test(coll, every_collective_matches_the_reference_on_the_ring, .timeout = 300)
{
	run_matrix(FERRY_COLL_ALGO_RING);
}

/* ---- puts by WRITE (lib/coll/put.c) ------------------------------------ */

/*
 * The ring's and the chain's segments go by one-sided WRITE where the
 * transport can (loop, rdma): with FERRY_COLL_ZCOPY_MIN=0 every size puts
 * (put_node: odd counts, one below the world, one past a segment, and 4 MiB
 * and a bit: several segments in one step), on
 * 1 .. 4 nodes, every type, operator and collective, bit-exact. @mode:
 * PUT_ON puts, by WRITE with immediate where the transport has it (loop;
 * rdma), else by WRITE + COLL_PUT, and some segments must have gone so
 * (none where the transport cannot WRITE); PUT_OFF FERRY_COLL_ZCOPY=0 (none
 * may); PUT_FAULTS FERRY_COLL_IMM=0 with loop's FERRY_LOOP_FAIL_WRITES=3:
 * every third WRITE fails after half its bytes, and those segments go by
 * message (some must have); PUT_IMM_FAULTS loop's FERRY_LOOP_FAIL_WRITES=3
 * with immediates: every third write_imm's first copy is cut off halfway
 * and written again whole before its notice (what rdma's replay after a
 * lost link does), and the results are still exact; PUT_NO_IMM
 * FERRY_COLL_IMM=0: WRITE + COLL_PUT only, no immediate.
 */
enum put_mode {
	PUT_ON,
	PUT_OFF,
	PUT_FAULTS,
	PUT_IMM_FAULTS,
	PUT_NO_IMM
};

/* every type, operator and collective on a few odd counts (one below the
 * world of 4, one not divisible, one past a segment): the matrix's shape,
 * lighter, for the puts' runs (the guest runs them over rdma) */
static int put_node(struct tc *c, int rank, void *arg)
{
	static const size_t pcounts[] = { 3, 1001, (1u << 17) + 3 };
	struct matrix *m = arg;
	struct ferry *fy = c->fy[rank];
	unsigned salt = 500;
	int rc = ferry_coll_algo_set(fy, m->algo);

	if (rc)
		return failf(&m->sh, "algo_set: %s", ferry_strerror(rc));
	for (size_t ci = 0; ci < 3; ci++)
		for (int di = 0; di < 3; di++) {
			int root = (int)((ci + di) % (size_t)c->n);

			for (int oi = 0; oi < 3; oi++)
				if (one_case(fy, &m->sh, rank, c->n, 0, pcounts[ci], dtypes[di],
					     ops[oi], (int)((ci + oi) % 2), 0, salt++))
					return 1;
			if (one_case(fy, &m->sh, rank, c->n, 1, pcounts[ci], dtypes[di],
				     ops[(ci + di) % 3], (int)(ci % 2), root, salt++) ||
			    one_case(fy, &m->sh, rank, c->n, 2, pcounts[ci], dtypes[di], FERRY_SUM,
				     0, (root + 1) % c->n, salt++))
				return 1;
		}
	/* several segments in one step's chunk (4 MiB and a bit: a ring chunk of
	 * 1 MiB or more for up to 4 nodes), where a segment's number in its step
	 * tells the receiver its place (big > 1; in the TCG guest only where the
	 * segments go with immediates: 40 s more per run there otherwise) */
	if (m->big > 1 && (one_case(fy, &m->sh, rank, c->n, 0, (1u << 20) + 3, FERRY_FLOAT32,
				    FERRY_SUM, 0, 0, salt++) ||
			   one_case(fy, &m->sh, rank, c->n, 2, (1u << 19) + 3, FERRY_FLOAT64,
				    FERRY_SUM, 0, c->n - 1, salt++)))
		return 1;
	return 0;
}

static void run_puts(enum put_mode mode)
{
	const char *tp = getenv("FERRY_TRANSPORT");
	bool loop = tp && !strcmp(tp, "loop");
	bool faults = mode == PUT_FAULTS || mode == PUT_IMM_FAULTS;

	if (faults && !loop)
		cr_skip_test("write faults are injected by the loop transport only");
	setenv("FERRY_COLL_ZCOPY_MIN", "0", 1);
	if (mode == PUT_OFF)
		setenv("FERRY_COLL_ZCOPY", "0", 1);
	if (faults)
		setenv("FERRY_LOOP_FAIL_WRITES", "3", 1);
	if (mode == PUT_FAULTS || mode == PUT_NO_IMM)
		setenv("FERRY_COLL_IMM", "0", 1);
	/* in the TCG guest the message path's run (the other matrices run it
	 * too) takes 2 nodes only */
	bool vm = getenv("FERRY_TEST_IN_VM") != NULL && mode == PUT_OFF;

	for (int n = vm ? 2 : 1; n <= (vm ? 2 : 4); n++) {
		struct matrix m = { .algo = FERRY_COLL_ALGO_RING,
				    .big = getenv("FERRY_TEST_IN_VM") && mode != PUT_ON ? 1 : 2 };
		unsigned long long puts = 0, fails = 0, imms = 0;
		bool can, imm;
		struct tc c;

		cr_assert_eq(tc_open(&c, n, NULL, 20000), 0, "open %d nodes", n);
		can = (c.fy[0]->tp->ops->caps & FERRY_TP_CAP_WRITE) != 0;
		imm = (c.fy[0]->tp->ops->caps & FERRY_TP_CAP_WRITE_IMM) != 0 &&
		      mode != PUT_FAULTS && mode != PUT_NO_IMM;
		tc_run(&c, put_node, &m);
		for (int r = 0; r < n; r++) {
			puts += ferry__coll_puts(c.fy[r]);
			fails += ferry__coll_put_fails(c.fy[r]);
			imms += ferry__coll_puts_imm(c.fy[r]);
		}
		tc_close(&c);
		cr_assert_eq(atomic_load(&m.sh.failures), 0, "%d nodes: %s", n, m.sh.why);
		if (n == 1 || !can || mode == PUT_OFF) {
			cr_expect_eq(
				puts + fails + imms, 0,
				"%d nodes: %llu segments put, %llu failed, %llu with immediate", n,
				puts, fails, imms);
			continue;
		}
		if (imm) {
			/* one op each, no COLL_PUT frame at all */
			cr_expect_gt(imms, 0, "%d nodes: no segment went by WRITE with immediate",
				     n);
			cr_expect_eq(puts, 0, "%d nodes: %llu segments went by WRITE + COLL_PUT", n,
				     puts);
		} else {
			cr_expect_gt(puts, 0, "%d nodes: no segment was put by WRITE", n);
			cr_expect_eq(imms, 0, "%d nodes: %llu segments went with immediate", n,
				     imms);
		}
		if (mode == PUT_FAULTS)
			cr_expect_gt(fails, 0, "%d nodes: no WRITE failed with faults injected", n);
		else
			cr_expect_eq(fails, 0, "%d nodes: %llu WRITEs failed", n, fails);
	}
	unsetenv("FERRY_COLL_ZCOPY_MIN");
	unsetenv("FERRY_COLL_ZCOPY");
	unsetenv("FERRY_LOOP_FAIL_WRITES");
	unsetenv("FERRY_COLL_IMM");
}

Test(coll, ring_and_chain_segments_go_by_write_where_the_transport_can, .timeout = 300)
{
	run_puts(PUT_ON);
}

Test(coll, with_zcopy_off_every_segment_goes_by_message, .timeout = 300)
{
	run_puts(PUT_OFF);
}

Test(coll, a_failed_write_sends_its_segment_by_message, .timeout = 300)
{
	run_puts(PUT_FAULTS);
}

Test(coll, a_write_imm_cut_off_and_posted_again_lands_whole, .timeout = 300)
{
	run_puts(PUT_IMM_FAULTS);
}

Test(coll, with_imm_off_segments_go_by_write_and_coll_put, .timeout = 300)
{
	run_puts(PUT_NO_IMM);
}

/* ---- WRITE with immediate across broken links (rdma) ----------------------- */

static atomic_long imm_resumed, imm_replayed, imm_failed_lines;

static void imm_log(enum ferry_log_level level, const char *msg, void *arg)
{
	const char *p;
	unsigned n = 0;

	(void)arg;
	if (level <= FERRY_LOG_WARN && !strstr(msg, "FERRY_RDMA_FAULT_BREAK_MS"))
		fprintf(stderr, "ferry: %s\n", msg);
	if (strstr(msg, "marking it failed"))
		atomic_fetch_add(&imm_failed_lines, 1);
	if (!strstr(msg, "resumed the session"))
		return;
	atomic_fetch_add(&imm_resumed, 1);
	if ((p = strstr(msg, "sent again (")) && sscanf(p, "sent again (%u of them", &n) == 1)
		atomic_fetch_add(&imm_replayed, (long)n);
}

struct imm_run {
	struct shared sh;
	int64_t until_ns;
	unsigned rounds[TC_MAX];
};

/* 1 MiB all-reduces and broadcasts on the ring and the chain until the time is up */
static int imm_storm_node(struct tc *c, int rank, void *arg)
{
	struct imm_run *m = arg;
	unsigned salt = 900;
	int rc = ferry_coll_algo_set(c->fy[rank], FERRY_COLL_ALGO_RING);

	if (rc)
		return failf(&m->sh, "algo_set: %s", ferry_strerror(rc));
	/* every node runs the same number of rounds: rank 0 decides, through the
	 * collective itself (a broadcast of its verdict) */
	for (;;) {
		int64_t go = now_ns() < m->until_ns;

		rc = ferry_broadcast(c->fy[rank], &go, 1, FERRY_INT64, 0);
		if (rc)
			return failf(&m->sh, "rank %d: broadcast: %s", rank, ferry_strerror(rc));
		if (!go)
			break;
		int root = (int)(salt % (unsigned)c->n);

		if (one_case(c->fy[rank], &m->sh, rank, c->n, 0, (1u << 18) + 5, FERRY_FLOAT32,
			     FERRY_SUM, 0, 0, salt) ||
		    one_case(c->fy[rank], &m->sh, rank, c->n, 2, (1u << 17) + 3, FERRY_FLOAT64,
			     FERRY_SUM, 0, root, salt + 1))
			return 1;
		salt += 2;
		m->rounds[rank]++;
	}
	return 0;
}

/*
 * Over rdma, with a link broken every 150 ms (FERRY_RDMA_FAULT_BREAK_MS):
 * 3 nodes run ring all-reduces and chain broadcasts of about 1 MiB for 4 s,
 * every segment one WRITE with immediate; every result is exact, no peer is
 * failed, links were resumed, and some WRITEs with immediate were posted
 * again on the new queue pair (the resumption's log line counts them).
 */
Test(coll, write_imms_posted_again_after_a_lost_link_keep_results_exact, .timeout = 180)
{
	const char *tp = getenv("FERRY_TRANSPORT");
	struct imm_run m = { 0 };
	unsigned long long imms = 0;
	struct tc c;

	if (!tp || strcmp(tp, "rdma"))
		cr_skip_test("links are broken on purpose by the rdma transport only");
	setenv("FERRY_COLL_ZCOPY_MIN", "0", 1);
	setenv("FERRY_RDMA_FAULT_BREAK_MS", "150", 1);
	ferry_log_set(FERRY_LOG_INFO, imm_log, NULL);
	cr_assert_eq(tc_open(&c, 3, NULL, 20000), 0);
	m.until_ns = now_ns() + 4000000000ll;
	tc_run(&c, imm_storm_node, &m);
	for (int r = 0; r < 3; r++)
		imms += ferry__coll_puts_imm(c.fy[r]);
	tc_close(&c);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	unsetenv("FERRY_RDMA_FAULT_BREAK_MS");
	unsetenv("FERRY_COLL_ZCOPY_MIN");
	cr_assert_eq(atomic_load(&m.sh.failures), 0, "%s", m.sh.why);
	fprintf(stderr,
		"write_imm storm: %u rounds, %llu segments with immediate, %ld resumptions, "
		"%ld WRITEs with immediate posted again\n",
		m.rounds[0], imms, atomic_load(&imm_resumed), atomic_load(&imm_replayed));
	cr_expect_gt(m.rounds[0], 0, "no round ran");
	cr_expect_gt(imms, 0, "no segment went by WRITE with immediate");
	cr_expect_gt(atomic_load(&imm_resumed), 0, "no link was broken and resumed");
	cr_expect_gt(atomic_load(&imm_replayed), 0,
		     "no WRITE with immediate was in flight when a link broke");
	cr_expect_eq(atomic_load(&imm_failed_lines), 0, "a peer was marked failed");
}

/* ---- back to back, started many at a time -------------------------------- */

#define BURST 16
#define ROUNDS 40

static int burst_node(struct tc *c, int rank, void *arg)
{
	struct shared *sh = arg;
	struct ferry *fy = c->fy[rank];
	unsigned salt = 1000;

	for (int round = 0; round < ROUNDS; round++) {
		struct ferry_coll *h[BURST];
		double *buf[BURST];
		size_t cnt[BURST];
		unsigned salts[BURST];

		for (int i = 0; i < BURST; i++) {
			/* both sides of the crossover (256 KiB = 32768 doubles) */
			cnt[i] = (size_t)((round * 7 + i * 131) % 5) == 0 ? 33000 + (size_t)i :
									    (size_t)(i * 3 + 1);
			salts[i] = salt++;
			buf[i] = malloc(cnt[i] * sizeof(double));
			fill(buf[i], FERRY_FLOAT64, cnt[i], rank, salts[i]);
			int rc = ferry_allreduce_start(fy, buf[i], buf[i], cnt[i], FERRY_FLOAT64,
						       FERRY_SUM, &h[i]);
			if (rc)
				return failf(sh, "rank %d: start %d of round %d: %s", rank, i,
					     round, ferry_strerror(rc));
		}
		/* collect in reverse order, half of them by polling */
		for (int i = BURST - 1; i >= 0; i--) {
			int rc;

			if (i % 2) {
				int64_t until = now_ns() + 20000000000ll;

				while ((rc = ferry_coll_test(h[i])) == -EAGAIN && now_ns() < until)
					sched_yield();
			} else {
				rc = ferry_coll_wait(h[i]);
			}
			if (rc)
				return failf(sh, "rank %d: collective %d of round %d: %s", rank, i,
					     round, ferry_strerror(rc));
			if (check(buf[i], FERRY_FLOAT64, cnt[i], c->n, FERRY_SUM, salts[i]) >= 0)
				return failf(sh, "rank %d: collective %d of round %d differs", rank,
					     i, round);
			free(buf[i]);
		}
	}
	return 0;
}

Test(coll, many_collectives_back_to_back_started_sixteen_at_a_time, .timeout = 300)
{
	for (int n = 2; n <= 5; n += 3) {
		struct shared sh = { 0 };
		struct tc c;

		cr_assert_eq(tc_open(&c, n, NULL, 20000), 0);
		tc_run(&c, burst_node, &sh);
		tc_close(&c);
		cr_assert_eq(atomic_load(&sh.failures), 0, "%d nodes: %s", n, sh.why);
	}
}

/* ---- the waiter polls the transport ------------------------------------- */

#define POLL_ROUNDS 400

static int poll_node(struct tc *c, int rank, void *arg)
{
	struct shared *sh = arg;
	float buf[16];
	int rc;

	for (int i = 0; i < POLL_ROUNDS; i++) {
		fill(buf, FERRY_FLOAT32, 16, rank, (unsigned)i);
		rc = ferry_allreduce(c->fy[rank], buf, buf, 16, FERRY_FLOAT32, FERRY_SUM);
		if (rc)
			return failf(sh, "rank %d: all-reduce %d: %s", rank, i, ferry_strerror(rc));
		if (check(buf, FERRY_FLOAT32, 16, c->n, FERRY_SUM, (unsigned)i) >= 0)
			return failf(sh, "rank %d: all-reduce %d differs", rank, i);
	}
	/* the progress threads are back on the sockets: a barrier needs them */
	rc = ferry_barrier(c->fy[rank]);
	return rc ? failf(sh, "rank %d: barrier after: %s", rank, ferry_strerror(rc)) : 0;
}

static double cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * Over tcp a waiting caller takes its collective's frames itself
 * (FERRY_TP_POLL_HOLD) while the progress thread stands aside; with
 * FERRY_COLL_POLL=0 it never does. Either way the results are right, the
 * progress threads serve a barrier afterwards, and the idle nodes use
 * (almost) no CPU: no thread spins once the collectives are over.
 */
static void run_poll(bool on)
{
	const char *tp = getenv("FERRY_TRANSPORT");
	bool tcp = !tp || !*tp || !strcmp(tp, "tcp");

	setenv("FERRY_COLL_POLL", on ? "1" : "0", 1);
	for (int n = 2; n <= 4; n += 2) {
		struct shared sh = { 0 };
		unsigned long long polled = 0;
		double cpu;
		struct tc c;

		cr_assert_eq(tc_open(&c, n, NULL, 20000), 0);
		tc_run(&c, poll_node, &sh);
		cr_assert_eq(atomic_load(&sh.failures), 0, "%d nodes: %s", n, sh.why);
		for (int r = 0; r < n; r++)
			polled += ferry__coll_polled(c.fy[r]);
		if (on && tcp)
			cr_expect_gt(polled, 0, "%d nodes: no frame was taken by its waiter", n);
		else
			cr_expect_eq(polled, 0, "%d nodes: %llu frames taken by waiters", n,
				     polled);
		cpu = cpu_s();
		usleep(500000);
		cpu = cpu_s() - cpu;
		cr_expect_lt(cpu, 0.05, "%d idle nodes used %.3f s of CPU in 0.5 s", n, cpu);
		tc_close(&c);
	}
	unsetenv("FERRY_COLL_POLL");
}

Test(coll, a_waiter_takes_its_frames_itself_and_nothing_spins_after, .timeout = 120)
{
	run_poll(true);
}

Test(coll, with_coll_poll_off_the_progress_thread_takes_every_frame, .timeout = 120)
{
	run_poll(false);
}

/* ---- bad arguments ------------------------------------------------------ */

static atomic_int log_errors;

static void count_errors(enum ferry_log_level level, const char *msg, void *arg)
{
	if (level == FERRY_LOG_ERROR)
		atomic_fetch_add(&log_errors, 1);
}

#define EXPECT_EINVAL(call)                                                                    \
	do {                                                                                   \
		int before = atomic_load(&log_errors);                                         \
		int rc_ = (call);                                                              \
		cr_expect_eq(rc_, -EINVAL, "%s: %d (%s)", #call, rc_, ferry_strerror(rc_));    \
		cr_expect_eq(atomic_load(&log_errors) - before, 1, "%s: log lines: %d", #call, \
			     atomic_load(&log_errors) - before);                               \
	} while (0)

Test(coll, bad_arguments_fail_with_einval_and_one_log_line)
{
	struct tc c;
	struct ferry *fy;
	struct ferry_coll *h[17];
	double a[8] = { 0 }, b[8];
	int rc;

	cr_assert_eq(tc_open(&c, 2, NULL, 20000), 0);
	fy = c.fy[0];
	ferry_log_set(FERRY_LOG_ERROR, count_errors, NULL);
	EXPECT_EINVAL(ferry_allreduce(NULL, a, b, 8, FERRY_FLOAT64, FERRY_SUM));
	EXPECT_EINVAL(ferry_allreduce(fy, a, b, 8, (enum ferry_dtype)9, FERRY_SUM));
	EXPECT_EINVAL(ferry_allreduce(fy, a, b, 8, FERRY_FLOAT64, (enum ferry_redop)0));
	EXPECT_EINVAL(ferry_allreduce(fy, NULL, b, 8, FERRY_FLOAT64, FERRY_SUM));
	EXPECT_EINVAL(ferry_allreduce(fy, a, NULL, 8, FERRY_FLOAT64, FERRY_SUM));
	EXPECT_EINVAL(ferry_allreduce(fy, (char *)a + 1, b, 4, FERRY_FLOAT64, FERRY_SUM));
	EXPECT_EINVAL(ferry_allreduce(fy, a, a + 1, 4, FERRY_FLOAT64, FERRY_SUM));
	EXPECT_EINVAL(ferry_allreduce(fy, a, b, SIZE_MAX / 4, FERRY_FLOAT64, FERRY_SUM));
	EXPECT_EINVAL(ferry_reduce(fy, a, b, 8, FERRY_FLOAT64, FERRY_SUM, 2));
	EXPECT_EINVAL(ferry_reduce(fy, a, b, 8, FERRY_FLOAT64, FERRY_SUM, -1));
	EXPECT_EINVAL(ferry_reduce(fy, a, NULL, 8, FERRY_FLOAT64, FERRY_SUM, 0));
	EXPECT_EINVAL(ferry_broadcast(fy, a, 8, FERRY_INT64, 5));
	EXPECT_EINVAL(ferry_broadcast(fy, NULL, 8, FERRY_INT64, 0));
	EXPECT_EINVAL(ferry_allreduce_start(fy, a, b, 8, FERRY_FLOAT64, FERRY_SUM, NULL));
	EXPECT_EINVAL(ferry_coll_wait(NULL));
	EXPECT_EINVAL(ferry_coll_algo_set(fy, (enum ferry_coll_algo)7));
	/* nothing was numbered: the two nodes are still in step */
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	tc_close(&c);

	/* one node: collectives finish at once, but stay counted until collected */
	cr_assert_eq(tc_open(&c, 1, NULL, 20000), 0);
	for (int i = 0; i < 16; i++)
		cr_assert_eq(ferry_allreduce_start(c.fy[0], a, b, 8, FERRY_FLOAT64, FERRY_MAX,
						   &h[i]),
			     0);
	/* the refused call leaves its output alone */
	for (int i = 0; i < 8; i++) {
		a[i] = i + 1;
		b[i] = -1;
	}
	rc = ferry_allreduce_start(c.fy[0], a, b, 8, FERRY_FLOAT64, FERRY_MAX, &h[16]);
	cr_expect_eq(rc, -EBUSY, "a 17th start: %s", ferry_strerror(rc));
	for (int i = 0; i < 8; i++)
		cr_expect_eq(b[i], -1, "a refused call wrote its output");
	for (int i = 0; i < 16; i++)
		cr_expect_eq(ferry_coll_test(h[i]), 0);
	cr_expect_eq(ferry_allreduce(c.fy[0], a, b, 8, FERRY_FLOAT64, FERRY_MAX), 0);
	tc_close(&c);
}

/* ---- different calls ------------------------------------------------------ */

static int mismatch_node(struct tc *c, int rank, void *arg)
{
	struct shared *sh = arg;
	float v[12] = { 0 };
	int rc;

	/* first an agreed one, then rank 1 passes another count */
	rc = ferry_allreduce(c->fy[rank], v, v, 10, FERRY_FLOAT32, FERRY_SUM);
	if (rc)
		return failf(sh, "rank %d: the agreed all-reduce: %s", rank, ferry_strerror(rc));
	rc = ferry_allreduce(c->fy[rank], v, v, rank == 1 ? 11 : 10, FERRY_FLOAT32, FERRY_SUM);
	if (rc != -FERRY_E_MISMATCH)
		return failf(sh, "rank %d: different counts gave %s", rank, ferry_strerror(rc));
	rc = ferry_broadcast(c->fy[rank], v, 4, FERRY_FLOAT32, 0);
	if (rc != -FERRY_E_MISMATCH)
		return failf(sh, "rank %d: the collective after a mismatch gave %s", rank,
			     ferry_strerror(rc));
	return 0;
}

Test(coll, nodes_that_call_different_collectives_get_a_mismatch, .timeout = 60)
{
	struct shared sh = { 0 };
	struct tc c;

	cr_assert_eq(tc_open(&c, 2, NULL, 5000), 0);
	ferry_log_set(FERRY_LOG_NONE, NULL, NULL);
	tc_run(&c, mismatch_node, &sh);
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	tc_close(&c);
	cr_assert_eq(atomic_load(&sh.failures), 0, "%s", sh.why);
}

/* ---- frames that break the protocol -------------------------------------- */

static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static char cap_last[1024];
static int cap_errors;

static void capture(enum ferry_log_level level, const char *msg, void *arg)
{
	pthread_mutex_lock(&cap_lock);
	if (level == FERRY_LOG_ERROR && strstr(msg, "proto:")) {
		cap_errors++;
		snprintf(cap_last, sizeof(cap_last), "%s", msg);
	}
	pthread_mutex_unlock(&cap_lock);
}

/* @from sends @to a COLL frame of 10 float32 at @off of a ring all-reduce
 * of 30: what rank 0's left neighbour would send at step 0 */
static void forge(struct tc *c, int from, int to, uint64_t seq, uint64_t off)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_coll m;
		float data[10];
	} f;

	memset(&f, 0, sizeof(f));
	f.m = (struct ferry_msg_coll){ .seq = seq,
				       .count = 30,
				       .off = off,
				       .n = 10,
				       .kind = FERRY_COLL_KIND_ALLREDUCE,
				       .dtype = FERRY_FLOAT32,
				       .op = FERRY_SUM,
				       .algo = FERRY_COLL_ALGO_RING };
	ferry__proto_hdr_init(&f.h, FERRY_MSG_COLL, sizeof(f), (uint32_t)from, 0);
	cr_assert_eq(ferry__send(c->fy[from], (uint32_t)to, &f, sizeof(f)), 0);
}

static int wait_proto_error(void)
{
	int n = 0;

	for (int i = 0; i < 300 && !n; i++) {
		usleep(10000);
		pthread_mutex_lock(&cap_lock);
		n = cap_errors;
		pthread_mutex_unlock(&cap_lock);
	}
	return n;
}

Test(coll, a_frame_from_a_rank_that_is_not_the_peer_of_that_step_drops_it, .timeout = 60)
{
	float v[30] = { 0 };
	struct ferry_coll *h;
	struct tc c;
	int rc;

	cr_assert_eq(tc_open(&c, 3, NULL, 5000), 0);
	for (int r = 0; r < 3; r++)
		cr_assert_eq(ferry_coll_algo_set(c.fy[r], FERRY_COLL_ALGO_RING), 0);
	ferry_log_set(FERRY_LOG_ERROR, capture, NULL);
	/* rank 0 starts; on the ring its step-0 chunk (2, from 20) comes from
	 * rank 2, and rank 1 sends it instead */
	cr_assert_eq(ferry_allreduce_start(c.fy[0], v, v, 30, FERRY_FLOAT32, FERRY_SUM, &h), 0);
	forge(&c, 1, 0, 0, 20);
	cr_assert_eq(wait_proto_error(), 1, "one error line, got %d", cap_errors);
	cr_assert(strstr(cap_last, "not this node's left neighbour"), "%s", cap_last);
	cr_assert(strstr(cap_last, "dropping rank 1"), "%s", cap_last);
	rc = ferry_coll_wait(h);
	cr_assert_eq(rc, -FERRY_E_PEER, "the all-reduce under way: %s", ferry_strerror(rc));
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	tc_close(&c);

	/* a frame 1000 collectives ahead of its receiver */
	cap_errors = 0;
	cr_assert_eq(tc_open(&c, 3, NULL, 5000), 0);
	ferry_log_set(FERRY_LOG_ERROR, capture, NULL);
	forge(&c, 2, 0, 1000, 20);
	cr_assert_eq(wait_proto_error(), 1, "one error line, got %d", cap_errors);
	cr_assert(strstr(cap_last, "too far ahead"), "%s", cap_last);
	cr_assert(strstr(cap_last, "dropping rank 2"), "%s", cap_last);
	rc = ferry_allreduce(c.fy[0], v, v, 30, FERRY_FLOAT32, FERRY_SUM);
	cr_assert_eq(rc, -FERRY_E_PEER, "the next all-reduce: %s", ferry_strerror(rc));
	ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
	tc_close(&c);
}

/* ---- WRITE with immediate: what a receiver refuses ----------------------- */

static void imm_done(struct ferry *fy, void *ctx, int status)
{
	(void)fy;
	(void)ctx;
	(void)status;
}

static struct ferry_rdma_ctx imm_ctx = { .done = imm_done };

/* rank @from writes 8 bytes with immediate @tag into a buffer of rank @to's */
static void forge_imm(struct tc *c, int from, int to, uint32_t tag, void *mem,
		      struct ferry_tp_mr *rmr, struct ferry_tp_mr *lmr)
{
	struct ferry_tp *tp = c->fy[from]->tp;

	cr_assert_eq(tp->ops->mem_reg(tp, (uint8_t *)mem + 64, 64, 0, lmr), 0);
	cr_assert_eq(c->fy[to]->tp->ops->mem_reg(c->fy[to]->tp, mem, 64,
						 FERRY_TP_ACCESS_REMOTE_WRITE, rmr),
		     0);
	cr_assert_eq(tp->ops->write_imm(tp, (uint32_t)to, (uint8_t *)mem + 64, lmr, (uintptr_t)mem,
					rmr->rkey, 8, tag, &imm_ctx),
		     0);
}

#define IMM_TAG(slot, step, seg)                             \
	(FERRY_TP_IMM_USER_COLL << FERRY_TP_IMM_USER_SHIFT | \
	 (uint32_t)(slot) << FERRY_COLL_IMM_SLOT_SHIFT |     \
	 (uint32_t)(step) << FERRY_COLL_IMM_STEP_SHIFT | (uint32_t)(seg))

/*
 * A WRITE with immediate that names what its receiver does not expect from
 * its writer drops the writer with one log line, and the collective under
 * way ends with -FERRY_E_PEER: from a node that is not the one the slot was
 * offered to, a step the collective does not take, a slot nobody offered,
 * a tag no module takes (loop; rdma in the VM).
 */
Test(coll, a_write_imm_the_receiver_does_not_expect_drops_its_writer, .timeout = 60)
{
	static const struct {
		int from;
		uint32_t tag;
		const char *why;
	} cases[] = {
		{ 1, IMM_TAG(0, 0, 0), "did not offer memory to" },
		{ 2, IMM_TAG(0, 200, 0), "a step this collective does not take" },
		{ 2, IMM_TAG(0, 0, 9), "a segment past its step's elements" },
		{ 2, IMM_TAG(100, 0, 0), "a slot no collective here offered" },
		{ 2, 5u << FERRY_TP_IMM_USER_SHIFT, "which no module of this node takes" },
	};
	const char *tp = getenv("FERRY_TRANSPORT");
	float v[30] = { 0 };

	if (!tp || (strcmp(tp, "loop") && strcmp(tp, "rdma")))
		cr_skip_test("tcp has no WRITE with immediate");
	setenv("FERRY_COLL_ZCOPY_MIN", "0", 1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		void *mem = aligned_alloc(64, 128);
		struct ferry_tp_mr *rmr, *lmr;
		struct ferry_coll *h;
		char want[32];
		struct tc c;
		int rc;

		cap_errors = 0;
		cr_assert_eq(tc_open(&c, 3, NULL, 5000), 0);
		rmr = calloc(1, c.fy[0]->tp->ops->mr_size);
		lmr = calloc(1, c.fy[0]->tp->ops->mr_size);
		for (int r = 0; r < 3; r++)
			cr_assert_eq(ferry_coll_algo_set(c.fy[r], FERRY_COLL_ALGO_RING), 0);
		ferry_log_set(FERRY_LOG_ERROR, capture, NULL);
		/* rank 0 offers slot 0 to rank 2, its left neighbour */
		cr_assert_eq(ferry_allreduce_start(c.fy[0], v, v, 30, FERRY_FLOAT32, FERRY_SUM, &h),
			     0);
		forge_imm(&c, cases[i].from, 0, cases[i].tag, mem, rmr, lmr);
		cr_assert_eq(wait_proto_error(), 1, "case %zu: one error line, got %d", i,
			     cap_errors);
		cr_assert(strstr(cap_last, cases[i].why), "case %zu: %s", i, cap_last);
		snprintf(want, sizeof(want), "dropping rank %d", cases[i].from);
		cr_assert(strstr(cap_last, want), "case %zu: %s", i, cap_last);
		rc = ferry_coll_wait(h);
		cr_assert_eq(rc, -FERRY_E_PEER, "case %zu: the all-reduce under way: %s", i,
			     ferry_strerror(rc));
		ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
		c.fy[0]->tp->ops->mem_dereg(c.fy[0]->tp, rmr);
		c.fy[cases[i].from]->tp->ops->mem_dereg(c.fy[cases[i].from]->tp, lmr);
		tc_close(&c);
		free(rmr);
		free(lmr);
		free(mem);
	}
	/* COLL_KEYS from rank 0's right neighbour offering slot 200 of 128 */
	{
		struct {
			struct ferry_msg_hdr h;
			struct ferry_msg_coll m;
			struct ferry_msg_coll_keys k;
		} f;
		struct ferry_coll *h;
		struct tc c;
		int rc;

		cap_errors = 0;
		cr_assert_eq(tc_open(&c, 3, NULL, 5000), 0);
		for (int r = 0; r < 3; r++)
			cr_assert_eq(ferry_coll_algo_set(c.fy[r], FERRY_COLL_ALGO_RING), 0);
		ferry_log_set(FERRY_LOG_ERROR, capture, NULL);
		cr_assert_eq(ferry_allreduce_start(c.fy[0], v, v, 30, FERRY_FLOAT32, FERRY_SUM, &h),
			     0);
		memset(&f, 0, sizeof(f));
		f.m = (struct ferry_msg_coll){ .count = 30,
					       .n = 201,
					       .kind = FERRY_COLL_KIND_ALLREDUCE,
					       .dtype = FERRY_FLOAT32,
					       .op = FERRY_SUM,
					       .algo = FERRY_COLL_ALGO_RING };
		f.k = (struct ferry_msg_coll_keys){ .buf_addr = 4096, .buf_rkey = 1 };
		ferry__proto_hdr_init(&f.h, FERRY_MSG_COLL_KEYS, sizeof(f), 1, 0);
		cr_assert_eq(ferry__send(c.fy[1], 0, &f, sizeof(f)), 0);
		cr_assert_eq(wait_proto_error(), 1, "keys: one error line, got %d", cap_errors);
		cr_assert(strstr(cap_last, "slot out of range"), "%s", cap_last);
		cr_assert(strstr(cap_last, "dropping rank 1"), "%s", cap_last);
		rc = ferry_coll_wait(h);
		cr_assert_eq(rc, -FERRY_E_PEER, "keys: %s", ferry_strerror(rc));
		ferry_log_set(FERRY_LOG_WARN, NULL, NULL);
		tc_close(&c);
	}
	unsetenv("FERRY_COLL_ZCOPY_MIN");
}

/* ---- a node dies mid-collective (forked processes) ------------------------ */

#define DNODES 3
#define DEAD 2
#define DCOUNT (4u << 20) /* floats: 16 MiB, the ring */

struct death {
	volatile int ready, inside, killed, finished;
	volatile int64_t kill_ns;
	struct shared sh;
};

static void wait_flag(volatile int *f, int want)
{
	for (int64_t until = now_ns() + 30000000000ll; *f < want && now_ns() < until;)
		usleep(1000);
}

static int death_child(int rank, struct ferry_params *p, struct death *d)
{
	struct ferry *fy;
	float *buf = calloc(DCOUNT, sizeof(float));
	int64_t t0;
	int rc;

	if (!buf || ferry_open(p, &fy))
		return 10;
	/* all three in step first */
	rc = ferry_allreduce(fy, buf, buf, 1000, FERRY_FLOAT32, FERRY_SUM);
	if (rc)
		return failf(&d->sh, "rank %d: first all-reduce: %s", rank, ferry_strerror(rc));
	__atomic_fetch_add(&d->ready, 1, __ATOMIC_SEQ_CST);
	if (rank == DEAD)
		for (;;)
			pause();	  /* stopped, then killed, by the parent */
	wait_flag(&d->ready, DNODES + 1); /* the parent stopped rank 2 */
	__atomic_fetch_add(&d->inside, 1, __ATOMIC_SEQ_CST);
	rc = ferry_allreduce(fy, buf, buf, DCOUNT, FERRY_FLOAT32, FERRY_SUM);
	t0 = now_ns();
	if (rc != -FERRY_E_PEER)
		return failf(&d->sh, "rank %d: the all-reduce across the death gave %s", rank,
			     ferry_strerror(rc));
	if (!d->killed || t0 - d->kill_ns > 2000000000ll)
		return failf(&d->sh, "rank %d: the all-reduce ended %.0f ms after the kill", rank,
			     (double)(t0 - d->kill_ns) / 1e6);
	t0 = now_ns();
	rc = ferry_broadcast(fy, buf, 10, FERRY_FLOAT32, 0);
	if (rc != -FERRY_E_PEER || now_ns() - t0 > 1000000000ll)
		return failf(&d->sh, "rank %d: the next collective should fail at once: %s", rank,
			     ferry_strerror(rc));
	__atomic_fetch_add(&d->finished, 1, __ATOMIC_SEQ_CST);
	wait_flag(&d->finished, DNODES - 1);
	ferry_close(fy);
	free(buf);
	return 0;
}

Test(coll, a_node_killed_mid_collective_ends_it_at_once_everywhere, .timeout = 120)
{
	struct death *d =
		mmap(NULL, sizeof(*d), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_params p;
	pid_t pids[DNODES];
	int rc;

	cr_assert_neq(d, MAP_FAILED);
	ferry_params_init(&p);
	/* processes: the loop transport works inside one process only */
	p.transport = getenv("FERRY_TRANSPORT") && strcmp(getenv("FERRY_TRANSPORT"), "loop") ?
			      FERRY_TRANSPORT_AUTO :
			      FERRY_TRANSPORT_TCP;
	p.timeout_ms = 20000;
	/* the node is stopped before it is killed: only the kill may fail it */
	p.heartbeat_ms = -1;
	rc = ferry_local_cluster_fork(DNODES, &p, pids);
	if (rc >= 0 && rc < DNODES)
		_exit(death_child(rc, &p, d));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	wait_flag(&d->ready, DNODES);
	cr_assert_eq(d->ready, DNODES, "the nodes did not start: %s", d->sh.why);
	tc_stop_proc(pids[DEAD]);
	__atomic_fetch_add(&d->ready, 1, __ATOMIC_SEQ_CST);
	wait_flag(&d->inside, DNODES - 1);
	usleep(300000); /* let them get into the ring */
	d->kill_ns = now_ns();
	d->killed = 1;
	kill(pids[DEAD], SIGKILL);
	tc_wait_procs(pids, DNODES, DEAD, d->sh.why);
	cr_assert_eq(atomic_load(&d->sh.failures), 0, "%s", d->sh.why);
}

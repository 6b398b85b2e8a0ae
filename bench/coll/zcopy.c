/* SPDX-License-Identifier: MIT */
/*
 * ferry-coll-zc - ferry_allreduce with its segments put by one-sided WRITE
 * (lib/coll/put.c) against the same all-reduce by another path, in one
 * process, the same nodes and buffers, interleaved:
 *
 *   FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1 ferry-coll-zc [--nodes 2]
 *          [--min 64K] [--max 16M] [--rounds 3] [--algo ring|auto]
 *          [--compare put-imm|msg-put]
 *
 * Nodes are threads (ferry_local_cluster_open). For each round and size,
 * both paths of --compare run, in an order that alternates per round:
 * "msg" with FERRY_COLL_ZCOPY_MIN set past every size (no keys are
 * exchanged: the path of earlier versions), "put" with every size putting
 * by WRITE and a COLL_PUT frame after each WRITE's completion
 * (FERRY_COLL_IMM off), "imm" with every size putting by WRITE with
 * immediate (the default where the transport has it). Default: put-imm,
 * the two one-sided paths. Each is warmed
 * up (2 calls, the first checked bit for bit against a reference) and timed
 * over max(3, min(10, 16 MiB / size)) calls, sizes from --min by 4x; a round's time is the
 * slowest node's mean ("# rounds" lines list them in the order run), and the table gives the
 * median over the rounds:
 *
 *   busbw = bytes / time x 2 (n - 1) / n          (GB/s, 10^9; nccl-tests')
 *   ratio = the second path's busbw / the first's (> 1: the second moves more)
 *
 * It also prints how many segments went by WRITE + COLL_PUT and by WRITE
 * with immediate (the paths were taken). The
 * program never passes or fails on speed; a wrong result exits 1.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ferry/ferry.h"
#include "lib/coll/coll.h"
#include "lib/core/core.h"
#include "util.h"

#define MAX_NODES 8
#define MAX_SIZES 32
#define MAX_ROUNDS 15

static struct {
	int nodes, rounds;
	size_t min, max;
	enum ferry_coll_algo algo;
	int imm; /* compare put with imm (1), or msg with put (0) */
} opt = { 2, 3, 64 << 10, 16 << 20, FERRY_COLL_ALGO_RING, 1 };

static const char *const mode_names[2][2] = { { "msg", "put" }, { "put", "imm" } };

static struct ferry *fys[MAX_NODES];
static pthread_barrier_t bar;
static double took[MAX_NODES];
static int bad;
/* per size, mode, round: the slowest node's mean seconds per call */
static double res[MAX_SIZES][2][MAX_ROUNDS];

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int iters_for(size_t bytes)
{
	size_t k = (16u << 20) / bytes;

	return k < 3 ? 3 : k > 10 ? 10 : (int)k;
}

static void fill(float *b, size_t n, int rank)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (float)((int)((rank * 7 + i * 13) % 41) - 20);
}

static void *node(void *arg)
{
	int rank = (int)(intptr_t)arg, si = 0;
	float *buf = malloc(opt.max);

	if (!buf) {
		fprintf(stderr, "ferry-coll-zc: no memory for %zu bytes\n", opt.max);
		exit(1);
	}
	ferry_coll_algo_set(fys[rank], opt.algo);
	for (size_t bytes = opt.min; bytes <= opt.max; bytes *= 4, si++) {
		size_t n = bytes / sizeof(float);
		int iters = iters_for(bytes);

		for (int r = 0; r < opt.rounds; r++)
			for (int k = 0; k < 2; k++) {
				int put = (r + k) % 2;
				double t0;

				pthread_barrier_wait(&bar);
				/* msg: no keys at all; put: every size puts, announced by
				 * COLL_PUT; imm: by WRITE with immediate */
				ferry__coll_zcopy_set(fys[rank], true,
						      put || opt.imm ? 0 : SIZE_MAX);
				ferry__coll_imm_set(fys[rank], opt.imm && put);
				pthread_barrier_wait(&bar);
				for (int i = 0; i < 2; i++) {
					int rc;

					fill(buf, n, rank);
					rc = ferry_allreduce(fys[rank], buf, buf, n, FERRY_FLOAT32,
							     FERRY_SUM);
					if (rc) {
						fprintf(stderr,
							"rank %d: all-reduce of %zu bytes: %s\n",
							rank, bytes, ferry_strerror(rc));
						exit(1);
					}
					for (size_t j = 0; j < n && i == 0; j++) {
						int64_t want = 0;

						for (int q = 0; q < opt.nodes; q++)
							want += (int)((q * 7 + j * 13) % 41) - 20;
						if (buf[j] != (float)want) {
							fprintf(stderr,
								"rank %d: %s all-reduce of %zu bytes: "
								"element %zu is %g, not %lld\n",
								rank, mode_names[opt.imm][put],
								bytes, j, (double)buf[j],
								(long long)want);
							__atomic_store_n(&bad, 1, __ATOMIC_RELAXED);
							break;
						}
					}
				}
				pthread_barrier_wait(&bar);
				t0 = coll_now_s();
				for (int i = 0; i < iters; i++)
					if (ferry_allreduce(fys[rank], buf, buf, n, FERRY_FLOAT32,
							    FERRY_SUM)) {
						fprintf(stderr,
							"rank %d: a timed all-reduce failed\n",
							rank);
						exit(1);
					}
				took[rank] = (coll_now_s() - t0) / iters;
				pthread_barrier_wait(&bar);
				if (rank == 0) {
					double m = 0;

					for (int q = 0; q < opt.nodes; q++)
						m = took[q] > m ? took[q] : m;
					res[si][put][r] = m;
				}
			}
	}
	free(buf);
	return NULL;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = { { "nodes", 1, 0, 'n' }, { "min", 1, 0, 'a' },
					    { "max", 1, 0, 'b' },   { "rounds", 1, 0, 'r' },
					    { "algo", 1, 0, 'g' },  { "compare", 1, 0, 'c' },
					    { 0, 0, 0, 0 } };
	pthread_t th[MAX_NODES];
	unsigned long long puts = 0, fails = 0, imms = 0;
	int c, si = 0;

	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		if (c == 'n')
			opt.nodes = atoi(optarg);
		else if (c == 'a')
			opt.min = coll_parse_size(optarg);
		else if (c == 'b')
			opt.max = coll_parse_size(optarg);
		else if (c == 'r')
			opt.rounds = atoi(optarg);
		else if (c == 'c' && (!strcmp(optarg, "put-imm") || !strcmp(optarg, "msg-put")))
			opt.imm = !strcmp(optarg, "put-imm");
		else if (c == 'g')
			opt.algo = !strcmp(optarg, "auto") ? FERRY_COLL_ALGO_AUTO :
							     FERRY_COLL_ALGO_RING;
		else
			return 2;
	}
	if (opt.nodes < 2 || opt.nodes > MAX_NODES || opt.rounds < 1 || opt.rounds > MAX_ROUNDS ||
	    opt.min < 64 || opt.max < opt.min) {
		fprintf(stderr,
			"usage: ferry-coll-zc [--nodes 2..%d] [--min 64K] [--max 16M] "
			"[--rounds 1..%d] [--algo ring|auto] [--compare put-imm|msg-put]\n",
			MAX_NODES, MAX_ROUNDS);
		return 2;
	}
	if (ferry_local_cluster_open(opt.nodes, NULL, fys)) {
		fprintf(stderr, "ferry-coll-zc: could not open %d nodes\n", opt.nodes);
		return 1;
	}
	printf("# ferry-coll-zc: %d nodes (threads), transport %s, float32 sum, %s, %d rounds "
	       "interleaved, %s against %s\n",
	       opt.nodes, fys[0]->tp->ops->name, opt.algo == FERRY_COLL_ALGO_RING ? "ring" : "auto",
	       opt.rounds, mode_names[opt.imm][1], mode_names[opt.imm][0]);
	pthread_barrier_init(&bar, NULL, (unsigned)opt.nodes);
	for (int i = 0; i < opt.nodes; i++)
		pthread_create(&th[i], NULL, node, (void *)(intptr_t)i);
	for (int i = 0; i < opt.nodes; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < opt.nodes; i++) {
		puts += ferry__coll_puts(fys[i]);
		fails += ferry__coll_put_fails(fys[i]);
		imms += ferry__coll_puts_imm(fys[i]);
	}
	/* every round's time, before the medians sort them: TCG figures are noisy */
	for (size_t bytes = opt.min; bytes <= opt.max; bytes *= 4, si++)
		for (int k = 0; k < 2; k++) {
			printf("# rounds %zu %s us:", bytes, mode_names[opt.imm][k]);
			for (int r = 0; r < opt.rounds; r++)
				printf(" %.1f", res[si][k][r] * 1e6);
			printf("\n");
		}
	{
		const char *a = mode_names[opt.imm][0], *b = mode_names[opt.imm][1];
		char h[6][24];

		snprintf(h[0], sizeof(h[0]), "%s_us", a);
		snprintf(h[1], sizeof(h[1]), "%s_us", b);
		snprintf(h[2], sizeof(h[2]), "%s_busbw", a);
		snprintf(h[3], sizeof(h[3]), "%s_busbw", b);
		snprintf(h[4], sizeof(h[4]), "%s/%s", b, a);
		printf("%10s %6s %12s %12s %10s %10s %8s\n", "bytes", "iters", h[0], h[1], h[2],
		       h[3], h[4]);
	}
	si = 0;
	for (size_t bytes = opt.min; bytes <= opt.max; bytes *= 4, si++) {
		double t[2], f = 2.0 * (opt.nodes - 1) / opt.nodes;

		for (int k = 0; k < 2; k++) {
			qsort(res[si][k], (size_t)opt.rounds, sizeof(double), cmp_double);
			t[k] = res[si][k][opt.rounds / 2];
		}
		printf("%10zu %6d %12.1f %12.1f %10.3f %10.3f %8.2f\n", bytes, iters_for(bytes),
		       t[0] * 1e6, t[1] * 1e6, bytes / t[0] * f / 1e9, bytes / t[1] * f / 1e9,
		       t[0] / t[1]);
	}
	printf("# segments put by WRITE + COLL_PUT: %llu; by WRITE with immediate: %llu; WRITEs "
	       "failed (sent by message): %llu\n",
	       puts, imms, fails);
	for (int i = 0; i < opt.nodes; i++)
		ferry_close(fys[i]);
	return bad;
}

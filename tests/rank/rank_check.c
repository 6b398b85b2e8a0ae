/* SPDX-License-Identifier: MIT */
/*
 * ferry-rank-check - one rank of a cluster started by a launcher (torchrun
 * variables, mpirun, explicit FERRY_*): everything comes from the
 * environment, as an application's would. Used where the nodes cannot be
 * forked from one test process: one rank per network namespace
 * (ci/netns-test.sh) and under mpirun through PMIx (ci/mpirun-test.sh).
 *
 * Each round, on a table of K keys per rank (4 floats each):
 *
 *   every rank pushes rank+1 to every key    barrier
 *   every rank pulls every key and checks    sum over ranks of (rank+1) x rounds so far
 *   every rank localizes the keys k with     (k + round) % world == rank, so keys
 *                                            move between the ranks every round
 *   barrier, then sleep --sleep-ms
 *
 * It prints one line per rank: "ok" with the slowest round, or "FAILED" with
 * what differed, and exits 0 or 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "common/args.h"

#define VLEN 4

static const char usage[] =
	"usage: ferry-rank-check [--rounds N] [--sleep-ms MS] [--keys-per-rank K]\n"
	"  One rank of a Ferry cluster, configured by the environment like an\n"
	"  application (FERRY_*, torchrun RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT,\n"
	"  mpirun through PMIx). Pushes, pulls and localizes on every rank, checks\n"
	"  every value, prints one line and exits 0 (ok) or 1 (FAILED).\n"
	"  --rounds N         rounds of push, pull, localize (default 3)\n"
	"  --sleep-ms MS      pause after each round (default 0)\n"
	"  --keys-per-rank K  keys homed on each rank (default 16)\n"
	"  --version          print Ferry's version\n";

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int fail(int rank, const char *what, int rc)
{
	printf("ferry-rank-check: rank %d: FAILED: %s: %s\n", rank, what, ferry_strerror(rc));
	fflush(stdout);
	return 1;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "rounds", required_argument, NULL, 'r' },
		{ "sleep-ms", required_argument, NULL, 's' },
		{ "keys-per-rank", required_argument, NULL, 'k' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	long rounds = 3, sleep_ms = 0, kpr = 16;
	struct ferry_table_params tp = { 0 };
	struct ferry_stats st;
	struct ferry_table *t;
	struct ferry_worker *w;
	struct ferry *fy;
	uint64_t *keys, *mine;
	float *vals, *deltas;
	int64_t slowest = 0;
	int rc, rank, world, o, bad = 0;
	size_t n;

	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		long *dst = o == 'r' ? &rounds : o == 's' ? &sleep_ms : &kpr;

		switch (o) {
		case 'r':
		case 's':
		case 'k':
			if (targ_num(optarg, o == 's' ? 0 : 1, o == 'k' ? 4096 : 100000, dst)) {
				fprintf(stderr, "ferry-rank-check: bad --%s '%s'\n%s",
					o == 'r' ? "rounds" :
					o == 's' ? "sleep-ms" :
						   "keys-per-rank",
					optarg, usage);
				return 2;
			}
			break;
		case 'V':
			printf("ferry-rank-check (Ferry %s)\n", ferry_version());
			return 0;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}

	rc = ferry_open(NULL, &fy);
	if (rc)
		return fail(-1, "ferry_open (the log says why)", rc);
	rank = ferry_rank(fy);
	world = ferry_world(fy);
	n = (size_t)kpr * (size_t)world;
	tp.num_keys = n;
	tp.value_len = VLEN;
	rc = ferry_table_create(fy, &tp, &t);
	if (rc)
		return fail(rank, "ferry_table_create", rc);
	rc = ferry_worker_create(fy, &w);
	if (rc)
		return fail(rank, "ferry_worker_create", rc);
	keys = calloc(n, sizeof(*keys));
	mine = calloc(n, sizeof(*mine));
	vals = calloc(n * VLEN, sizeof(*vals));
	deltas = calloc(n * VLEN, sizeof(*deltas));
	if (!keys || !mine || !vals || !deltas)
		return fail(rank, "calloc", -ENOMEM);
	for (size_t k = 0; k < n; k++)
		keys[k] = k;
	for (size_t i = 0; i < n * VLEN; i++)
		deltas[i] = (float)(rank + 1);

	for (long r = 0; r < rounds && !bad; r++) {
		float want = (float)((r + 1) * world * (world + 1) / 2);
		int64_t t0 = now_ms();
		size_t nmine = 0;

		rc = ferry_push(w, t, keys, n, deltas);
		if (rc)
			return fail(rank, "ferry_push", rc);
		rc = ferry_barrier(fy);
		if (rc)
			return fail(rank, "ferry_barrier after the pushes", rc);
		rc = ferry_pull(w, t, keys, n, vals);
		if (rc)
			return fail(rank, "ferry_pull", rc);
		for (size_t i = 0; i < n * VLEN && !bad; i++)
			if (vals[i] != want) {
				printf("ferry-rank-check: rank %d: FAILED: round %ld: key %zu holds %g, "
				       "not %g\n",
				       rank, r, i / VLEN, (double)vals[i], (double)want);
				bad = 1;
			}
		for (size_t k = 0; k < n; k++)
			if ((k + (size_t)r) % (size_t)world == (size_t)rank)
				mine[nmine++] = k;
		rc = ferry_localize(w, t, mine, nmine);
		if (rc)
			return fail(rank, "ferry_localize", rc);
		rc = ferry_barrier(fy);
		if (rc)
			return fail(rank, "ferry_barrier after the moves", rc);
		if (now_ms() - t0 > slowest)
			slowest = now_ms() - t0;
		if (sleep_ms)
			usleep((useconds_t)sleep_ms * 1000);
	}
	ferry_stats(fy, &st);
	if (!bad && world > 1 && (!st.relocations_in || !st.remote_ops)) {
		printf("ferry-rank-check: rank %d: FAILED: no key moved here (%llu) or no "
		       "operation left this node (%llu)\n",
		       rank, (unsigned long long)st.relocations_in,
		       (unsigned long long)st.remote_ops);
		bad = 1;
	}
	if (!bad)
		printf("ferry-rank-check: rank %d of %d: ok: %ld rounds of push, pull and localize "
		       "on %zu keys, values intact; slowest round %lld ms; %llu keys moved here, "
		       "%llu remote key operations\n",
		       rank, world, rounds, n, (long long)slowest,
		       (unsigned long long)st.relocations_in, (unsigned long long)st.remote_ops);
	fflush(stdout);
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	free(keys);
	free(mine);
	free(vals);
	free(deltas);
	return bad;
}

/* SPDX-License-Identifier: MIT */
/*
 * ferry-coll-mpi - ferry_allreduce against Open MPI's MPI_Allreduce, on the
 * same processes, buffers and sizes, as nccl-tests reports them:
 *
 *   mpirun -np 2 --bind-to core ferry-coll-mpi [--min 8] [--max 64M]
 *          [--json FILE] [--iters N] [--warmup N] [--algo auto|doubling|ring]
 *          [--dtype float32|float64|int64] [--op sum|max|min] [--quick]
 *
 * Ferry takes rank and world from Open MPI's environment and meets its
 * peers through mpirun's PMIx server (lib/core/config.c, pmix.c). For each
 * size (powers of two, in bytes), MPI first and then Ferry, each warmed up
 * and then timed over the same number of iterations; a row's time is the
 * slowest rank's mean (MPI_Allreduce of the times with MPI_MAX).
 *
 *   algbw = bytes / time                          (GB/s, 10^9)
 *   busbw = algbw x 2 (n - 1) / n                 (what each link carries)
 *   ratio = Ferry's busbw / MPI's (> 1: Ferry moves more), and time
 *           Ferry / MPI (< 1: Ferry is faster)
 *
 * Before timing, each size's results are compared: both reduce the same
 * small integers, so they must agree bit for bit; a difference exits 1.
 * The program never passes or fails on speed.
 */
#include <errno.h>
#include <getopt.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bjson.h"
#include "ferry/ferry.h"
#include "util.h"

struct row {
	size_t bytes;
	int iters;
	double mpi_us, ferry_us;
	double mpi_p50, ferry_p50; /* the slowest rank's median per call */
	const char *algo;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* the median of @n samples (sorts them) */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static size_t dt_size(enum ferry_dtype t)
{
	return t == FERRY_FLOAT32 ? 4 : 8;
}

static MPI_Datatype dt_mpi(enum ferry_dtype t)
{
	return t == FERRY_FLOAT32 ? MPI_FLOAT : t == FERRY_FLOAT64 ? MPI_DOUBLE : MPI_INT64_T;
}

static MPI_Op op_mpi(enum ferry_redop op)
{
	return op == FERRY_SUM ? MPI_SUM : op == FERRY_MAX ? MPI_MAX : MPI_MIN;
}

static void fill(void *buf, enum ferry_dtype t, size_t n, int rank)
{
	for (size_t i = 0; i < n; i++) {
		int64_t v = (int64_t)((rank * 7 + i * 13) % 41) - 20;

		if (t == FERRY_FLOAT32)
			((float *)buf)[i] = (float)v;
		else if (t == FERRY_FLOAT64)
			((double *)buf)[i] = (double)v;
		else
			((int64_t *)buf)[i] = v;
	}
}

static void usage(void)
{
	fprintf(stderr,
		"usage: mpirun -np N [--bind-to core] ferry-coll-mpi [--min BYTES] [--max BYTES]\n"
		"       [--iters N] [--warmup N] [--algo auto|doubling|ring]\n"
		"       [--dtype float32|float64|int64] [--op sum|max|min] [--json FILE] [--quick]\n");
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "min", required_argument, NULL, 'a' },
		{ "max", required_argument, NULL, 'b' },
		{ "iters", required_argument, NULL, 'n' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "algo", required_argument, NULL, 'g' },
		{ "dtype", required_argument, NULL, 't' },
		{ "op", required_argument, NULL, 'o' },
		{ "json", required_argument, NULL, 'j' },
		{ "quick", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	size_t min = 8, max = 64u << 20;
	int iters = 0, warmup = -1, quick = 0, rank, world, rc, opt, nrows = 0, bad = 0;
	double *samples = NULL;
	int nsamples = 0;
	enum ferry_coll_algo algo = FERRY_COLL_ALGO_AUTO;
	enum ferry_dtype dtype = FERRY_FLOAT32;
	enum ferry_redop op = FERRY_SUM;
	const char *json = NULL, *dname = "float32", *oname = "sum", *aname = "auto";
	struct row rows[64];
	struct ferry *fy;
	char cmd[1024] = "";
	void *src, *dst, *chk;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	for (int i = 0; i < argc; i++) {
		strncat(cmd, argv[i], sizeof(cmd) - strlen(cmd) - 2);
		strncat(cmd, i + 1 < argc ? " " : "", sizeof(cmd) - strlen(cmd) - 1);
	}
	while ((opt = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (opt) {
		case 'a':
			min = coll_parse_size(optarg);
			break;
		case 'b':
			max = coll_parse_size(optarg);
			break;
		case 'n':
			iters = atoi(optarg);
			break;
		case 'w':
			warmup = atoi(optarg);
			break;
		case 'g':
			aname = optarg;
			algo = !strcmp(optarg, "doubling") ? FERRY_COLL_ALGO_DOUBLING :
			       !strcmp(optarg, "ring")	   ? FERRY_COLL_ALGO_RING :
							     FERRY_COLL_ALGO_AUTO;
			break;
		case 't':
			dname = optarg;
			dtype = !strcmp(optarg, "float64") ? FERRY_FLOAT64 :
				!strcmp(optarg, "int64")   ? FERRY_INT64 :
							     FERRY_FLOAT32;
			break;
		case 'o':
			oname = optarg;
			op = !strcmp(optarg, "max") ? FERRY_MAX :
			     !strcmp(optarg, "min") ? FERRY_MIN :
						      FERRY_SUM;
			break;
		case 'j':
			json = optarg;
			break;
		case 'q':
			quick = 1;
			break;
		default:
			if (rank == 0)
				usage();
			MPI_Finalize();
			return opt == 'h' ? 0 : 2;
		}
	}
	if (quick) {
		if (max > (1u << 20))
			max = 1u << 20;
		if (!iters)
			iters = 20;
	}
	if (min < dt_size(dtype))
		min = dt_size(dtype);

	rc = ferry_open(NULL, &fy);
	if (rc) {
		fprintf(stderr, "ferry-coll-mpi: rank %d: ferry_open: %s\n", rank,
			ferry_strerror(rc));
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	if (ferry_rank(fy) != rank || ferry_world(fy) != world) {
		fprintf(stderr, "ferry-coll-mpi: Ferry says rank %d of %d, MPI %d of %d\n",
			ferry_rank(fy), ferry_world(fy), rank, world);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	ferry_coll_algo_set(fy, algo);
	src = aligned_alloc(64, max);
	dst = aligned_alloc(64, max);
	chk = aligned_alloc(64, max);
	if (!src || !dst || !chk)
		MPI_Abort(MPI_COMM_WORLD, 1);

	for (size_t bytes = min; bytes <= max && nrows < 64; bytes *= 2) {
		size_t n = bytes / dt_size(dtype);
		int it = iters		      ? iters :
			 bytes <= (64u << 10) ? 1000 :
						(int)((256ull << 20) / bytes);
		int wu = warmup >= 0 ? warmup : it / 10 + 2;
		double t0, t1, tm, tf, tmax, pm, pf;

		if (it < 5)
			it = 5;
		if (it > nsamples) {
			double *v = realloc(samples, (size_t)it * sizeof(*v));

			if (!v)
				MPI_Abort(MPI_COMM_WORLD, 1);
			samples = v;
			nsamples = it;
		}
		fill(src, dtype, n, rank);
		/* the same answer, bit for bit */
		MPI_Allreduce(src, chk, (int)n, dt_mpi(dtype), op_mpi(op), MPI_COMM_WORLD);
		rc = ferry_allreduce(fy, src, dst, n, dtype, op);
		if (rc || memcmp(chk, dst, bytes)) {
			fprintf(stderr, "ferry-coll-mpi: rank %d: %zu bytes: %s\n", rank, bytes,
				rc ? ferry_strerror(rc) : "Ferry's result differs from MPI's");
			bad = 1;
			break;
		}

		for (int i = 0; i < wu; i++)
			MPI_Allreduce(src, dst, (int)n, dt_mpi(dtype), op_mpi(op), MPI_COMM_WORLD);
		MPI_Barrier(MPI_COMM_WORLD);
		t0 = t1 = coll_now_s();
		for (int i = 0; i < it; i++) {
			double t2;

			MPI_Allreduce(src, dst, (int)n, dt_mpi(dtype), op_mpi(op), MPI_COMM_WORLD);
			t2 = coll_now_s();
			samples[i] = t2 - t1;
			t1 = t2;
		}
		tm = (t1 - t0) / it;
		pm = median(samples, it);

		for (int i = 0; i < wu && !rc; i++)
			rc = ferry_allreduce(fy, src, dst, n, dtype, op);
		MPI_Barrier(MPI_COMM_WORLD);
		t0 = t1 = coll_now_s();
		for (int i = 0; i < it && !rc; i++) {
			double t2;

			rc = ferry_allreduce(fy, src, dst, n, dtype, op);
			t2 = coll_now_s();
			samples[i] = t2 - t1;
			t1 = t2;
		}
		tf = (t1 - t0) / it;
		pf = rc ? 0 : median(samples, it);
		if (rc) {
			fprintf(stderr, "ferry-coll-mpi: rank %d: ferry_allreduce: %s\n", rank,
				ferry_strerror(rc));
			bad = 1;
			break;
		}

		MPI_Allreduce(&tm, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		tm = tmax;
		MPI_Allreduce(&tf, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		tf = tmax;
		MPI_Allreduce(&pm, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		pm = tmax;
		MPI_Allreduce(&pf, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		pf = tmax;
		rows[nrows++] = (struct row){
			.mpi_p50 = pm * 1e6,
			.ferry_p50 = pf * 1e6,
			.bytes = bytes,
			.iters = it,
			.mpi_us = tm * 1e6,
			.ferry_us = tf * 1e6,
			.algo = algo == FERRY_COLL_ALGO_RING	     ? "ring" :
				algo == FERRY_COLL_ALGO_DOUBLING     ? "doubling" :
				bytes < FERRY_COLL_CROSSOVER_DEFAULT ? "doubling" :
								       "ring",
		};
	}
	MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);

	if (rank == 0 && !bad) {
		const double bus = 2.0 * (world - 1) / world;
		struct utsname u;

		printf("# ferry-coll-mpi: %d ranks, %s %s, Ferry algorithm %s; times: the slowest "
		       "rank's mean, and its median per call (p50)\n",
		       world, dname, oname, aname);
		printf("# %10s %6s %9s | %11s %9s %9s | %11s %9s %9s | %7s %7s | %9s %9s %7s\n",
		       "bytes", "iters", "algo", "mpi_us", "mpi_alg", "mpi_bus", "ferry_us",
		       "ferry_alg", "ferry_bus", "t_f/m", "bus_f/m", "mpi_p50", "ferry_p50",
		       "p50_f/m");
		for (int i = 0; i < nrows; i++) {
			const struct row *r = &rows[i];
			double am = (double)r->bytes / r->mpi_us / 1e3,
			       af = (double)r->bytes / r->ferry_us / 1e3;

			printf("  %10zu %6d %9s | %11.2f %9.3f %9.3f | %11.2f %9.3f %9.3f | %7.2f "
			       "%7.2f | %9.2f %9.2f %7.2f\n",
			       r->bytes, r->iters, r->algo, r->mpi_us, am, am * bus, r->ferry_us,
			       af, af * bus, r->ferry_us / r->mpi_us, af / am, r->mpi_p50,
			       r->ferry_p50, r->ferry_p50 / r->mpi_p50);
		}
		if (json) {
			json_t *doc = json_object(), *res = json_array();
			char kern[2 * sizeof(u.release) + 2];

			uname(&u);
			snprintf(kern, sizeof(kern), "%s %s", u.sysname, u.release);
			bjson_set_str(doc, "program", "ferry-coll-mpi");
			bjson_set_str(doc, "ferry_version", ferry_version());
			bjson_set_str(doc, "kernel", kern);
			bjson_set_int(doc, "cores", sysconf(_SC_NPROCESSORS_ONLN));
			bjson_set_int(doc, "ranks", world);
			bjson_set_str(doc, "dtype", dname);
			bjson_set_str(doc, "op", oname);
			bjson_set_str(doc, "algo", aname);
			bjson_set_str(doc, "command", cmd);
			bjson_set(doc, "results", res);
			for (int i = 0; doc && i < nrows; i++) {
				const struct row *r = &rows[i];
				double am = (double)r->bytes / r->mpi_us / 1e3,
				       af = (double)r->bytes / r->ferry_us / 1e3;
				json_t *row = json_object();

				if (bjson_append(res, row))
					break;
				bjson_set_int(row, "bytes", (int64_t)r->bytes);
				bjson_set_int(row, "iters", r->iters);
				bjson_set_str(row, "ferry_algo", r->algo);
				bjson_set_num(row, "mpi_us", r->mpi_us);
				bjson_set_num(row, "mpi_algbw_gbs", am);
				bjson_set_num(row, "mpi_busbw_gbs", am * bus);
				bjson_set_num(row, "ferry_us", r->ferry_us);
				bjson_set_num(row, "ferry_algbw_gbs", af);
				bjson_set_num(row, "ferry_busbw_gbs", af * bus);
				bjson_set_num(row, "time_ratio_ferry_over_mpi",
					      r->ferry_us / r->mpi_us);
				bjson_set_num(row, "busbw_ratio_ferry_over_mpi", af / am);
				bjson_set_num(row, "mpi_p50_us", r->mpi_p50);
				bjson_set_num(row, "ferry_p50_us", r->ferry_p50);
				bjson_set_num(row, "p50_ratio_ferry_over_mpi",
					      r->ferry_p50 / r->mpi_p50);
			}
			if (bjson_write(doc, json, "ferry-coll-mpi"))
				bad = 1;
			json_decref(doc);
		}
	}
	ferry_close(fy);
	free(src);
	free(dst);
	free(chk);
	free(samples);
	MPI_Finalize();
	return bad;
}

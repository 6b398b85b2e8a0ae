/* SPDX-License-Identifier: MIT */
/*
 * ferry-microbench - the core's two headline figures, each with a baseline
 * taken in the same run on the same machine:
 *
 *   local   pull of a locally owned value   vs  memcpy of the same bytes from
 *                                              a random place in an equally
 *                                              large array
 *   remote  pull of one key over loopback   vs  a raw TCP ping-pong with the
 *           (2 nodes, tcp), p50 and p99         same request and reply sizes
 *
 * It prints a table with a ratio column (Ferry / baseline). It never passes
 * or fails on speed. The full suite is ferry-bench.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/*
 * Per-sample stamps of the remote figures. On x86 the time-stamp counter, as
 * perftest's ib_read_lat uses (-C): in a VM whose clock source is an emulated
 * HPET, clock_gettime() is a system call and a device read that costs
 * microseconds under emulation, and would be charged to every sample of
 * Ferry's and none of the baseline's. Scaled to ns by stamp_calibrate().
 */
static double stamp_ns_per_tick = 1.0;

static inline int64_t stamp(void)
{
#if defined(__x86_64__) || defined(__i386__)
	return (int64_t)__builtin_ia32_rdtsc();
#else
	return now_ns();
#endif
}

static void stamp_calibrate(void)
{
#if defined(__x86_64__) || defined(__i386__)
	int64_t t0 = now_ns(), c0 = stamp(), t1, c1;

	do
		t1 = now_ns();
	while (t1 - t0 < 50000000);
	c1 = stamp();
	if (c1 > c0)
		stamp_ns_per_tick = (double)(t1 - t0) / (double)(c1 - c0);
	printf("# remote samples stamped with the TSC: %.1f MHz against CLOCK_MONOTONIC\n",
	       1000.0 / stamp_ns_per_tick);
#endif
}

/* turn @n stamp differences into ns */
static void stamp_to_ns(int64_t *lat, long n)
{
	for (long i = 0; i < n; i++)
		lat[i] = (int64_t)((double)lat[i] * stamp_ns_per_tick);
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static double pct(int64_t *v, size_t n, double p)
{
	size_t i = (size_t)(p * (double)(n - 1));

	return (double)v[i] / 1000.0;
}

static uint64_t xorshift(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* ---- local ------------------------------------------------------------- */

static int bench_local(uint32_t len, uint64_t keys, long iters)
{
	struct ferry_table_params tp = { .num_keys = keys, .value_len = len };
	struct ferry *fy;
	struct ferry_table *t;
	struct ferry_worker *w;
	float *out = malloc(len * sizeof(float)), *arr;
	uint64_t seed = 88172645463325252ull, sink = 0;
	int64_t t0, t1, t2;
	int rc;

	rc = ferry_local_cluster_open(1, NULL, &fy);
	if (!rc)
		rc = ferry_table_create(fy, &tp, &t);
	if (!rc)
		rc = ferry_worker_create(fy, &w);
	if (rc) {
		fprintf(stderr, "local: %s\n", ferry_strerror(rc));
		return rc;
	}
	arr = calloc(keys, (len * sizeof(float) + 63) & ~(size_t)63);
	/* warm both */
	for (uint64_t k = 0; k < keys; k++)
		ferry_pull(w, t, &k, 1, out);
	memset(arr, 1, keys * ((len * sizeof(float) + 63) & ~(size_t)63));

	t0 = now_ns();
	for (long i = 0; i < iters; i++) {
		uint64_t k = xorshift(&seed) % keys;

		ferry_pull(w, t, &k, 1, out);
		sink += (uint64_t)out[0];
	}
	t1 = now_ns();
	for (long i = 0; i < iters; i++) {
		uint64_t k = xorshift(&seed) % keys;

		memcpy(out, (char *)arr + k * ((len * sizeof(float) + 63) & ~(size_t)63),
		       len * sizeof(float));
		__asm__ volatile("" ::"r"(out) : "memory");
		sink += (uint64_t)out[0];
	}
	t2 = now_ns();
	printf("%-8s %-14s %8u %10llu %10.1f %10s %14.1f %8.2f\n", "local", "pull(random)", len * 4,
	       (unsigned long long)keys, (double)(t1 - t0) / (double)iters, "-",
	       (double)(t2 - t1) / (double)iters, (double)(t1 - t0) / (double)(t2 - t1));
	/* same key again and again: the fast path's fixed cost */
	t0 = now_ns();
	for (long i = 0; i < iters; i++) {
		uint64_t k = 7 % keys;

		ferry_pull(w, t, &k, 1, out);
		__asm__ volatile("" ::"r"(out) : "memory");
	}
	t1 = now_ns();
	for (long i = 0; i < iters; i++) {
		memcpy(out, arr, len * sizeof(float));
		__asm__ volatile("" ::"r"(out) : "memory");
	}
	t2 = now_ns();
	printf("%-8s %-14s %8u %10llu %10.1f %10s %14.1f %8.2f\n", "local", "pull(hot)", len * 4,
	       (unsigned long long)keys, (double)(t1 - t0) / (double)iters, "-",
	       (double)(t2 - t1) / (double)iters, (double)(t1 - t0) / (double)(t2 - t1));
	if (sink == 42)
		printf(" ");
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	free(arr);
	free(out);
	return 0;
}

/* ---- remote, and the raw TCP ping-pong baseline ------------------------ */

struct pp_server {
	int lfd;
	size_t req, rep;
	long iters;
};

static int read_full(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void *pp_serve(void *arg)
{
	struct pp_server *s = arg;
	char *buf = calloc(1, s->req + s->rep);
	int fd = accept(s->lfd, NULL, NULL), one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	for (long i = 0; i < s->iters; i++) {
		if (read_full(fd, buf, s->req) || write(fd, buf, s->rep) != (ssize_t)s->rep)
			break;
	}
	close(fd);
	free(buf);
	return NULL;
}

/* raw TCP ping-pong over loopback: request @req bytes, reply @rep bytes */
static int pingpong(size_t req, size_t rep, long iters, int64_t *lat)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	struct pp_server s = { .req = req, .rep = rep, .iters = iters };
	pthread_t th;
	char *buf = calloc(1, req + rep);
	int fd, one = 1;

	s.lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (bind(s.lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(s.lfd, 1) ||
	    getsockname(s.lfd, (struct sockaddr *)&sa, &sl))
		return -errno;
	pthread_create(&th, NULL, pp_serve, &s);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		return -errno;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	for (long i = 0; i < iters; i++) {
		int64_t t0 = stamp();

		if (write(fd, buf, req) != (ssize_t)req || read_full(fd, buf, rep))
			break;
		lat[i] = stamp() - t0;
	}
	close(fd);
	pthread_join(th, NULL);
	close(s.lfd);
	free(buf);
	return 0;
}

struct create_arg {
	struct ferry *fy;
	struct ferry_table_params *tp;
	struct ferry_table **t;
	int rc;
};

static void *create_thread(void *arg)
{
	struct create_arg *a = arg;

	a->rc = ferry_table_create(a->fy, a->tp, a->t);
	return NULL;
}

static enum ferry_transport_kind remote_transport = FERRY_TRANSPORT_TCP;
static const char *remote_name = "tcp";

static int bench_remote(uint32_t len, long iters, int busy, uint32_t batch)
{
	struct ferry_table_params tp = { .num_keys = 1024, .value_len = len };
	struct ferry_params p;
	struct ferry *fy[2];
	struct ferry_table *t[2];
	struct ferry_worker *w;
	int64_t *lat = calloc((size_t)iters, sizeof(int64_t));
	int64_t *base = calloc((size_t)iters, sizeof(int64_t));
	struct ferry_stats s0, s1;
	char op[32];
	float *out = malloc((size_t)batch * len * sizeof(float));
	uint64_t keys[256], key = 1000; /* home: rank 1 */
	uint32_t nk = 0;
	/* the frames Ferry sends for this pull: OP (hdr + op + 1 key) and
	 * REPLY (hdr + reply + 1 index + value), padded to 8 */
	size_t req = 16 + 24 + 16 * (size_t)batch,
	       rep = (16 + 32 + (4 + len * 4) * (size_t)batch + 7) & ~(size_t)7;
	int rc;

	ferry_params_init(&p);
	p.transport = remote_transport;
	p.busy_poll = busy;
	rc = ferry_local_cluster_open(2, &p, fy);
	if (rc) {
		fprintf(stderr, "remote: %s\n", ferry_strerror(rc));
		return rc;
	}
	/* create on both nodes at once (collective) */
	{
		struct create_arg a = { fy[1], &tp, &t[1], 0 };
		pthread_t th;

		pthread_create(&th, NULL, create_thread, &a);
		rc = ferry_table_create(fy[0], &tp, &t[0]);
		pthread_join(th, NULL);
		if (rc || a.rc) {
			fprintf(stderr, "remote: table: %s\n", ferry_strerror(rc ? rc : a.rc));
			return -1;
		}
	}
	/* a batch: @batch keys homed on rank 1 */
	for (uint64_t k = 0; k < tp.num_keys && nk < batch; k++)
		if (k == key || ferry_table_home(t[0], k) == 1)
			keys[nk++] = k == key ? key : k;
	if (batch == 1)
		keys[0] = key;
	ferry_worker_create(fy[0], &w);
	for (long i = 0; i < 1000; i++)
		ferry_pull(w, t[0], keys, nk, out);
	ferry_stats(fy[0], &s0);
	for (long i = 0; i < iters; i++) {
		int64_t t0 = stamp();

		rc = ferry_pull(w, t[0], keys, nk, out);
		lat[i] = stamp() - t0;
		if (rc) {
			fprintf(stderr, "remote pull: %s\n", ferry_strerror(rc));
			return rc;
		}
	}
	ferry_stats(fy[0], &s1);
	pingpong(req, rep, iters, base);
	stamp_to_ns(lat, iters);
	stamp_to_ns(base, iters);
	qsort(lat, (size_t)iters, sizeof(*lat), cmp_i64);
	qsort(base, (size_t)iters, sizeof(*base), cmp_i64);
	snprintf(op, sizeof(op), "pull(%s%s)", remote_name, busy ? ",busy" : "");
	printf("%-8s %-14s %8u %10u %10.1f %10.1f %14.1f %8.2f   (p50)\n", "remote", op, len * 4,
	       nk, pct(lat, iters, 0.5) * 1000, pct(lat, iters, 0.99) * 1000,
	       pct(base, iters, 0.5) * 1000, pct(lat, iters, 0.5) / pct(base, iters, 0.5));
	printf("%-8s %-14s %8u %10s %10s %10s %14.1f %8.2f   (p99)\n", "", "", len * 4, "", "", "",
	       pct(base, iters, 0.99) * 1000, pct(lat, iters, 0.99) / pct(base, iters, 0.99));
	printf("# %s, %u keys: %.3f one-sided reads and %.3f messages per pull (%llu retries, %llu "
	       "fallbacks)\n",
	       op, nk, (double)(s1.onesided_reads - s0.onesided_reads) / (double)iters,
	       (double)(s1.msgs_sent - s0.msgs_sent) / (double)iters,
	       (unsigned long long)(s1.onesided_retries - s0.onesided_retries),
	       (unsigned long long)(s1.onesided_fallbacks - s0.onesided_fallbacks));
	ferry_worker_destroy(w);
	ferry_table_destroy(t[0]);
	ferry_table_destroy(t[1]);
	ferry_close(fy[0]);
	ferry_close(fy[1]);
	free(lat);
	free(base);
	free(out);
	return 0;
}

int main(int argc, char **argv)
{
	long iters = 2000000, riters = 20000;
	uint32_t len = 64;
	int opt;

	int only_remote = 0;

	uint32_t batch = 1;

	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};

	while ((opt = getopt_long(argc, argv, "n:r:l:t:b:Rh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'V':
			printf("ferry-microbench (Ferry %s)\n", ferry_version());
			return 0;
		case 'n':
			iters = atol(optarg);
			break;
		case 'r':
			riters = atol(optarg);
			break;
		case 'l':
			len = (uint32_t)atoi(optarg);
			break;
		case 't':
			remote_name = optarg;
			if (!strcmp(optarg, "tcp"))
				remote_transport = FERRY_TRANSPORT_TCP;
			else if (!strcmp(optarg, "rdma"))
				remote_transport = FERRY_TRANSPORT_RDMA;
			else if (!strcmp(optarg, "loop"))
				remote_transport = FERRY_TRANSPORT_LOOP;
			else {
				fprintf(stderr, "ferry-microbench: -t wants tcp, rdma or loop\n");
				return 2;
			}
			break;
		case 'R':
			only_remote = 1;
			break;
		case 'b':
			batch = (uint32_t)atoi(optarg);
			break;
		default:
			fprintf(stderr,
				"usage: %s [-n local iterations] [-r remote iterations] [-l floats] "
				"[-t tcp|rdma|loop (remote transport; rdma nodes listen on "
				"FERRY_BIND_ADDR)] [-b keys per remote pull (1-256)] [-R: remote "
				"only] [--version]\n",
				argv[0]);
			return opt == 'h' ? 0 : 2;
		}
	}
	if (iters <= 0 || riters <= 0 || len == 0 || batch == 0 || batch > 256) {
		fprintf(stderr, "ferry-microbench: -n, -r and -l must be positive, -b 1 to 256\n");
		return 2;
	}
	printf("%-8s %-14s %8s %10s %10s %10s %14s %8s\n", "scenario", "op", "bytes", "keys",
	       "ferry_ns", "p99_ns", "baseline_ns", "ratio");
	printf("# baselines: local = memcpy of the same bytes from an equally large array;\n"
	       "#            remote = raw TCP ping-pong over loopback, same frame sizes\n");
	if (!only_remote &&
	    (bench_local(len, 10000, iters) || bench_local(len, 1000000, iters / 2)))
		return 1;
	stamp_calibrate();
	if (bench_remote(len, riters, 0, batch) || bench_remote(len, riters, 1, batch))
		return 1;
	return 0;
}

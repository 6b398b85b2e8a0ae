/* SPDX-License-Identifier: MIT */
/*
 * fb.h - ferry-bench, the benchmark suite with same-run baselines.
 *
 * Every scenario is written once, SPMD style: one function that every node
 * runs (rank 0 measures, the others serve and join the collectives), and
 * fb_cluster_run() runs it on nodes that are threads of this process
 * (ferry_local_cluster_open), forked processes (ferry_local_cluster_fork) or
 * this process as one node of a cluster launched from outside (ferry_open
 * with FERRY_RANK, FERRY_WORLD, FERRY_RENDEZVOUS). Results go to a region
 * shared with the parent, so all three print the same table.
 *
 *   main.c      options, context (commit, kernel, CPU, load), table, JSON
 *   cluster.c   the three ways to run nodes; the per-node setup every
 *               scenario shares (exchange table, raw baseline server)
 *   raw.c       the raw TCP ping-pong and stream baselines; perftest output
 *   stats.c     clock, percentiles, random numbers, result records
 *   local.c remote.c localize.c memory.c faults.c   the scenarios
 *
 * It never passes or fails on speed: it exits 1 only when something broke
 * (an operation failed, a lost update in the hot-key scenario).
 */
#ifndef FERRY_BENCH_FB_H
#define FERRY_BENCH_FB_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/ferry.h"

#define FB_MAX_LIST 16
#define FB_MAX_RESULTS 1024
#define FB_TL_MAX_PAIRS 24
#define FB_TL_MAX_NODES 4

enum fb_scenario {
	FB_SCEN_LOCAL = 1u << 0,
	FB_SCEN_REMOTE = 1u << 1,
	FB_SCEN_MOVE = 1u << 2,	    /* localize: one key, owner = home and != home */
	FB_SCEN_LBATCH = 1u << 3,   /* localize: batches */
	FB_SCEN_HOT = 1u << 4,	    /* localize: the hot key */
	FB_SCEN_MEMORY = 1u << 5,   /* bytes per node against bytes held (not in all) */
	FB_SCEN_REPL = 1u << 6,	    /* push with replicas = 1, 2 against 0 (not in all) */
	FB_SCEN_FAILOVER = 1u << 7, /* kill to first success, 20 kills (not in all) */
	FB_SCEN_LOCALIZE = FB_SCEN_MOVE | FB_SCEN_LBATCH | FB_SCEN_HOT,
	FB_SCEN_ALL = FB_SCEN_LOCAL | FB_SCEN_REMOTE | FB_SCEN_LOCALIZE,
};

enum fb_nodes_as {
	FB_NODES_THREADS = 0,
	FB_NODES_PROCS,
	FB_NODES_EXTERNAL,
};

/* A perftest figure (ib_read_lat, ib_write_lat, ib_send_lat) used as a raw round trip. */
struct fb_perftest {
	int set;
	int is_write;  /* RDMA_Write or Send latency: perftest reports half a round trip */
	int is_send;   /* Send latency (SEND/RECV, as Ferry's frames) */
	int events;    /* measured sleeping on CQ events (-e): the floor of blocking waits */
	double p50_us; /* t_typical */
	double p99_us; /* 99% percentile; 0 when absent */
	uint32_t bytes;
	char source[96];
};

struct fb_opts {
	unsigned scenarios;
	enum ferry_mode mode;
	int no_fast_path;
	enum ferry_transport_kind transport;
	enum fb_nodes_as nodes_as;
	int busy_poll; /* this pass: 1 busy-poll, 0 blocking */
	int wait_both; /* --wait both: every scenario in both modes */
	int pin;       /* --pin: each node process on a CPU of its own */
	int timeline;  /* --timeline: step stamps on every node (timeline.c) */
	/* --hw-oneway: published one-way latencies (message bytes, us) for the
	 * timeline's projection, ascending by bytes; nhw 0: no projection */
	int nhw;
	uint32_t hw_bytes[8];
	double hw_us[8];
	int quick;
	int verbose;
	uint32_t sizes[FB_MAX_LIST]; /* value sizes in bytes, multiples of 4 */
	int nsizes;
	uint32_t lsizes[FB_MAX_LIST]; /* batch-localize value sizes */
	int nlsizes;
	uint64_t keys[FB_MAX_LIST]; /* local scenario: keys per node */
	int nkeys;
	uint64_t memkeys[FB_MAX_LIST]; /* memory scenario: keys of the whole table */
	int nmemkeys;
	int threads[FB_MAX_LIST]; /* local scenario: reader threads */
	int nthreads;
	int windows[FB_MAX_LIST]; /* remote scenario: requests in flight */
	int nwindows;
	long iters;	 /* remote / localize: timed operations per row */
	double cell_s;	 /* local: seconds per measured cell */
	double hot_s;	 /* hot key: seconds */
	int hot_nodes;	 /* hot key: nodes (threads / procs modes) */
	uint32_t batch;	 /* remote batch keys */
	uint32_t lbatch; /* batch localize keys */
	int lreps;	 /* batch localize repetitions */
	size_t mem_mb;	 /* local: cap on arena + baseline array */
	int timeout_ms;
	const char *bind_addr; /* threads / procs: address the nodes bind */
	const char *link;
	const char *json_path;
	struct fb_perftest pt_read, pt_write; /* rdma baselines given */
	struct fb_perftest pt_send;	      /* ib_send_lat, busy-polling */
	struct fb_perftest pt_events;	      /* --baseline-events: ib_send_lat -e */
	double given_us, given_p99_us;	      /* --baseline-us */
	const char *baseline_cmd;	      /* --baseline-cmd, {bytes} substituted */
	int pt_cycles;			      /* perftest figures are cycles (-C) */
	char cmdline[512];
};

/* One row of the table and one entry of the JSON results. */
struct fb_result {
	char scenario[12];
	char op[24];
	char baseline[24];
	char note[96];
	uint32_t value_bytes;
	uint32_t threads;
	uint64_t keys;
	int writer;
	double p50_us, p99_us, p999_us;
	double ops_per_s;
	double mb_per_s;    /* value bytes moved per second; 0: not meaningful */
	double base_p50_us; /* 0: no baseline */
	double base_p99_us;
	double base_ops_per_s;
	double ratio; /* Ferry time / baseline time; 0: none */
	double extra; /* scenario-specific (hot key: relocations/s) */
	char extra_name[20];
	/* beside the percentiles, as perftest prints them (0: not a latency row) */
	double min_us, mean_us, stdev_us;
	double base_min_us, base_mean_us, base_stdev_us; /* 0: not measured (perftest given) */
	int busy_poll; /* the wait mode of the pass that measured it (fb_shared.busy_poll) */
	int suspect;   /* Ferry below its physical floor (ratio < 1): the baseline is broken */
};

/* In memory shared with forked nodes (MAP_SHARED), written by rank 0. */
struct fb_shared {
	int busy_poll; /* the wait mode of the pass running now (--wait both runs two) */
	atomic_int nresults;
	atomic_int failures; /* something broke: exit 1 */
	atomic_int skipped;
	struct fb_result results[FB_MAX_RESULTS];
	char failure_msg[8][160];
	/* --timeline: each node's per-step medians of the run just ended */
	struct fb_tl_node {
		int set;
		double p50_us[FB_TL_MAX_PAIRS];
		long n[FB_TL_MAX_PAIRS];
		unsigned long long dropped;
	} tl[FB_TL_MAX_NODES];
};

/* What a scenario function gets on every node. */
struct fb_node {
	const struct fb_opts *o;
	struct fb_shared *sh;
	struct ferry *fy;
	int rank, world;
	struct ferry_worker *w;	  /* this node's main worker */
	struct ferry_table *xchg; /* world keys x 8 floats, for small exchanges */
	/* the raw baseline server of rank 1, as rank 0 reaches it */
	char raw_addr[48];
	int raw_port;
	void *raw_srv; /* rank 1: the server thread */
	long phase;    /* fb_phase_end() calls so far */
	void *arg;     /* the scenario's own */
};

typedef int (*fb_node_fn)(struct fb_node *n);

/* ---- cluster.c ---------------------------------------------------------- */

/*
 * fb_cluster_run - run @fn on every node of a cluster of @world nodes
 * @what: names the run in messages
 *
 * In external mode @world is the minimum the launched cluster must have (the
 * run is skipped with a note otherwise), and the cluster opened at the first
 * call is reused. Return: 0, or -1 when some node failed (already said).
 */
int fb_cluster_run(const struct fb_opts *o, struct fb_shared *sh, int world, fb_node_fn fn,
		   void *arg, const char *what);
void fb_cluster_close(void);
/* this process's rank: 0 unless it is a node of an external cluster */
int fb_cluster_rank(void);
/* a barrier that reports its failure; Return: 0 or -1 */
int fb_barrier(struct fb_node *n);
/*
 * fb_phase_end - every node calls it after a phase in which @leader worked
 * for as long as it needed (no Ferry timeout applies to the others' wait)
 * Return: 0 or -1
 */
int fb_phase_end(struct fb_node *n, int leader);
/* creates a table on every node (collective) and reports a failure */
int fb_table_create(struct fb_node *n, uint64_t num_keys, uint32_t value_bytes,
		    struct ferry_table **t_p);
/* the first @count keys (from @from) whose home is @rank; Return: how many */
size_t fb_keys_homed(struct ferry_table *t, uint64_t num_keys, int rank, uint64_t from,
		     uint64_t *keys, size_t count);
/* records a failure (rank, what, error) in the shared region and prints it */
void fb_fail(struct fb_node *n, const char *what, int err);
void fb_failf(struct fb_shared *sh, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- raw.c -------------------------------------------------------------- */

struct fb_raw_srv;
int fb_raw_srv_start(const char *addr, int busy, struct fb_raw_srv **srv_p, int *port_p);
void fb_raw_srv_stop(struct fb_raw_srv *srv);

/*
 * A raw TCP ping-pong connection: @req bytes there, @rep bytes back per round
 * trip. fb_rtt_run() times @n round trips into @lat (may be NULL: warm-up).
 * Return: 0 or a negative errno.
 */
struct fb_rtt {
	int fd;
	size_t req, rep;
	char *buf;
	int busy;
};
/*
 * @busy: 1 spins on non-blocking reads (--busy-poll, as Ferry's threads then
 * do); 0 spins for FB_RAW_SPIN_NS, then blocks, as a Ferry worker waits for
 * its reply in blocking mode (lib/ops/request.c) -- like for like
 */
#define FB_RAW_SPIN_NS 50000
int fb_rtt_open(struct fb_rtt *r, const char *addr, int port, size_t req, size_t rep, int busy);
int fb_rtt_run(struct fb_rtt *r, long n, int64_t *lat);
void fb_rtt_close(struct fb_rtt *r);
/* the same with @window requests in flight; *ops_p: round trips per second */
int fb_raw_stream(const char *addr, int port, size_t req, size_t rep, int window, long count,
		  int busy, double *ops_p);
/*
 * parses perftest output (ib_read_lat, ib_write_lat); @cycles: the figures
 * are cycles whatever the header says (perftest -C keeps "[usec]" there)
 */
int fb_perftest_parse(const char *text, int cycles, struct fb_perftest *pt);
int fb_perftest_file(const char *path, int cycles, struct fb_perftest *pt);
int fb_perftest_cmd(const char *cmd, uint32_t bytes, int cycles, struct fb_perftest *pt);

const char *fb_transport_name(enum ferry_transport_kind k);

/* report.c: the run's context, taken at the start (load0) and the end (load1) */
struct fb_context {
	char commit[64];
	char kernel[224];
	char cpu[128];
	long cores;
	char load0[64], load1[64];
	char date[32];
};
void fb_context_get(struct fb_context *c);
/* the load averages now, into @buf */
void fb_context_load(char *buf, size_t len);
/* rank 0, once every scenario ran: the table, goals, floors, and the JSON
 * file when asked. Return: 0, or nonzero when the JSON was not written */
int fb_report(const struct fb_opts *o, const struct fb_context *ctx, struct fb_shared *sh);

/* ---- stats.c ------------------------------------------------------------ */

int64_t fb_now_ns(void);
/* sorts @v; percentile @p (0..1) in microseconds */
void fb_sort(int64_t *v, size_t n);
double fb_pct_us(const int64_t *sorted, size_t n, double p);
double fb_pct_d(const double *sorted, size_t n, double p);
void fb_sort_d(double *v, size_t n);
static inline uint64_t fb_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}
/* appends a result (rank 0 only); fills in the ratio from p50 or ops/s */
void fb_result_add(struct fb_shared *sh, const struct fb_result *r);
/* the raw round trip for a row: ping-pong measured, or the perftest figure */
struct fb_base {
	char name[24];
	double p50_us, p99_us;
	double min_us, mean_us, stdev_us; /* 0 when given (perftest, --baseline-us) */
};
void fb_base_from_lat(struct fb_base *b, const char *name, int64_t *lat, long n);
/* a latency row's p50, p99, p99.9, min, mean and stdev from @n sorted samples (ns) */
void fb_result_lat(struct fb_result *r, const int64_t *sorted, size_t n);
void fb_result_lat_d(struct fb_result *r, const double *sorted, size_t n);
/* the row's baseline: name and figures of @b */
void fb_result_base(struct fb_result *r, const struct fb_base *b);

/* ---- the scenarios ------------------------------------------------------ */

int fb_local(const struct fb_opts *o, struct fb_shared *sh);
int fb_remote(const struct fb_opts *o, struct fb_shared *sh);
/* @parts: FB_SCEN_MOVE, FB_SCEN_LBATCH, FB_SCEN_HOT */
int fb_localize(const struct fb_opts *o, struct fb_shared *sh, unsigned parts);
int fb_memory(const struct fb_opts *o, struct fb_shared *sh);
/* faults.c */
int fb_replicas(const struct fb_opts *o, struct fb_shared *sh);
int fb_failover(const struct fb_opts *o, struct fb_shared *sh);

/* ---- timeline.c: --timeline ---------------------------------------------- */

enum fb_tl_kind {
	FB_TL_LOCALIZE,
	FB_TL_PUSH
};
/* node_setup's: this node stamps from now on; Return: 0 or -1 (said) */
int fb_tl_enable(struct fb_node *n);
/* every node: after the table's creation, forget the stamps; then a barrier */
int fb_tl_begin(struct fb_node *n);
/*
 * fb_tl_end - every node, once the measured phase ended on all: its
 * per-step medians into the shared region; rank 0 prints the table of
 * @kind under @title. Return: 0 or -1
 */
int fb_tl_end(struct fb_node *n, enum fb_tl_kind kind, const char *title, uint32_t bytes);
/* the bench's own stamps around a call (timeline.h's *_CALL and *_RETURN) */
enum fb_tl_mark {
	FB_TL_LOC_CALL,
	FB_TL_LOC_RETURN,
	FB_TL_PUSH_CALL,
	FB_TL_PUSH_RETURN
};
void fb_tl_mark(struct fb_node *n, enum fb_tl_mark m, uint64_t key);

/*
 * The baseline of a latency row, shared by remote and localize: perftest
 * figures when given, else raw TCP round trips with the row's frame sizes
 * between rank 0 and rank 1, taken in chunks between the row's own chunks
 * so that both see the same moments of a noisy machine:
 *
 *   fb_base_begin(...)                 connect, warm up
 *   loop: <k Ferry operations>; fb_base_chunk(m, k)
 *   fb_base_end(...)                   p50 / p99 into m->b, close
 */
#define FB_ROUNDS 50 /* rounds of a latency row, each followed by a baseline chunk */

struct fb_basemeter {
	struct fb_base b;
	struct fb_rtt rtt;
	int live; /* 1: TCP round trips to take; 0: figures given */
	int64_t *lat;
	long n, cap;
};
int fb_base_begin(struct fb_node *n, size_t req, size_t rep, long iters, int is_pull,
		  uint32_t bytes, struct fb_basemeter *m);
int fb_base_chunk(struct fb_node *n, struct fb_basemeter *m, long k);
int fb_base_end(struct fb_node *n, struct fb_basemeter *m);

#endif /* FERRY_BENCH_FB_H */

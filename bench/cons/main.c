/* SPDX-License-Identifier: MIT */
/*
 * ferry-cons-bench: push and pull throughput of each consistency model
 * (docs/consistency.md), on one local cluster, as ratios to SEQUENTIAL
 * measured in the same run.
 *
 * N nodes (threads of this process) x W workers. For each model, in turn and
 * for R rounds (so that every model sees the machine in the same states),
 * a table of K keys of L floats is created, twice: in the pull run every
 * worker runs I iterations of "pull B random keys", in the push run I
 * iterations of "push B random keys (+1 to every float)"; both call
 * ferry_clock() every C iterations. Afterwards a barrier,
 * and every node checks that each key's sum equals the pushes counted
 * (nothing lost, nothing doubled). Throughput: the key operations of all
 * workers over the time from the start until the last worker finished. Keys are placed by hash, so a random key
 * is remote with probability (N-1)/N.
 *
 * --zipf S draws keys from a Zipf law of exponent S (key k with weight
 * 1 / (k + 1)^S: key 0 is the most used) instead of uniformly. --hot H
 * measures hot keys (docs/consistency.md, "Hot keys") instead of the four
 * models: SEQUENTIAL and EVENTUAL, each without and with keys 0 .. H-1 hot
 * (the H most used under --zipf), the same keys and draws, ratios to
 * SEQUENTIAL without hot keys. --hot-sync-ms sets their interval. --hot-auto
 * (with --hot H) runs SEQUENTIAL without hot keys, with keys 0 .. H-1 hot,
 * and with hot_auto H: there every node's workers first run a quarter of
 * the iterations (not timed), then every node calls ferry_hot_update(), and
 * the timed run follows; it prints how many of the keys chosen are among
 * 0 .. H-1.
 *
 *   ferry-cons-bench [--nodes 4] [--workers 2] [--keys 100000] [--len 8]
 *                    [--batch 16] [--clock-every 10] [--iters 2000]
 *                    [--rounds 2] [--staleness 2] [--transport tcp|loop|rdma]
 *                    [--zipf S] [--hot H] [--hot-sync-ms MS] [--hot-auto]
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ferry/ferry.h>

#define MAXN 8

struct cb_cfg {
	int nodes, workers, batch, clock_every, rounds;
	uint64_t keys;
	uint32_t len, staleness;
	long iters;
	int push; /* this run: 1 pushes, 0 pulls */
	enum ferry_transport_kind transport;
	double zipf;  /* 0: uniform keys */
	double *cdf;  /* --zipf: keys' cumulative weights */
	uint32_t hot; /* --hot: keys 0 .. hot-1 hot in the runs that have them */
	uint32_t hot_sync_ms;
	uint64_t *hot_keys;
	int hot_auto; /* --hot-auto: the third run chooses its hot keys */
};

struct cb_node {
	const struct cb_cfg *cfg;
	struct ferry *fy;
	struct ferry_table *t;
	int rank;
	_Atomic uint64_t *pushed;    /* per key, all workers of all nodes */
	atomic_ullong pulls, pushes; /* key operations */
	atomic_int err;
	pthread_barrier_t *start;
	double t_end;	/* when its last worker finished */
	double t_start; /* when its timed workers were started */
	long warm;	/* hot_auto: iterations before ferry_hot_update(), 0: none */
	int chosen;	/* hot_auto: keys chosen among 0 .. hot-1 (-1: the call failed) */
};

struct cb_worker {
	struct cb_node *node;
	int w;
	int warm; /* the untimed warm-up before a ferry_hot_update() */
};

static double cb_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t cb_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* a key: uniform, or by the Zipf law's cumulative weights */
static uint64_t cb_key(const struct cb_cfg *cfg, uint64_t *seed)
{
	double u;
	uint64_t lo = 0, hi;

	if (!cfg->cdf)
		return cb_rand(seed) % cfg->keys;
	u = (double)(cb_rand(seed) >> 11) * 0x1p-53;
	hi = cfg->keys - 1;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (cfg->cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void *cb_worker_main(void *p)
{
	struct cb_worker *a = p;
	struct cb_node *nd = a->node;
	const struct cb_cfg *cfg = nd->cfg;
	uint64_t *keys = malloc((size_t)cfg->batch * sizeof(*keys));
	float *vals = malloc((size_t)cfg->batch * cfg->len * sizeof(float));
	float *ones = malloc((size_t)cfg->batch * cfg->len * sizeof(float));
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(nd->rank * 64 + a->w + 1);
	uint64_t pulls = 0, pushes = 0;
	struct ferry_worker *w = NULL;
	int rc;

	rc = ferry_worker_create(nd->fy, &w);
	pthread_barrier_wait(nd->start);
	if (rc || !keys || !vals || !ones)
		goto out;
	for (size_t i = 0; i < (size_t)cfg->batch * cfg->len; i++)
		ones[i] = 1;
	for (long it = 0, n = a->warm ? nd->warm : cfg->iters; it < n; it++) {
		for (int i = 0; i < cfg->batch; i++)
			keys[i] = cb_key(cfg, &seed);
		if (!cfg->push) {
			rc = ferry_pull(w, nd->t, keys, (size_t)cfg->batch, vals);
			if (rc)
				break;
			pulls += (uint64_t)cfg->batch;
		} else {
			rc = ferry_push(w, nd->t, keys, (size_t)cfg->batch, ones);
			if (rc)
				break;
			for (int i = 0; i < cfg->batch; i++)
				atomic_fetch_add_explicit(&nd->pushed[keys[i]], 1,
							  memory_order_relaxed);
			pushes += (uint64_t)cfg->batch;
		}
		if ((it + 1) % cfg->clock_every == 0) {
			rc = ferry_clock(w);
			if (rc)
				break;
		}
	}
	if (!a->warm) {
		atomic_fetch_add(&nd->pulls, pulls);
		atomic_fetch_add(&nd->pushes, pushes);
	}
out:
	if (rc || !keys || !vals || !ones) {
		fprintf(stderr, "ferry-cons-bench: node %d worker %d: %s\n", nd->rank, a->w,
			ferry_strerror(rc ? rc : -ENOMEM));
		atomic_store(&nd->err, 1);
	}
	if (w)
		ferry_worker_destroy(w);
	free(keys);
	free(vals);
	free(ones);
	return NULL;
}

/* hot_auto: the workers' warm-up, then every node's ferry_hot_update() */
static int cb_warm_up(struct cb_node *nd)
{
	const struct cb_cfg *cfg = nd->cfg;
	struct cb_worker wa[64];
	pthread_t th[64];
	struct ferry_worker *w;
	uint64_t *keys = malloc(cfg->hot * sizeof(*keys));
	int rc, n;

	for (int i = 0; i < cfg->workers; i++) {
		wa[i] = (struct cb_worker){ .node = nd, .w = i, .warm = 1 };
		pthread_create(&th[i], NULL, cb_worker_main, &wa[i]);
	}
	for (int i = 0; i < cfg->workers; i++)
		pthread_join(th[i], NULL);
	rc = keys ? ferry_barrier(nd->fy) : -ENOMEM;
	if (!rc)
		rc = ferry_worker_create(nd->fy, &w);
	if (!rc) {
		rc = ferry_hot_update(w, nd->t);
		ferry_worker_destroy(w);
	}
	n = rc ? 0 : ferry_hot_keys(nd->t, keys, cfg->hot);
	nd->chosen = rc ? -1 : 0;
	for (int i = 0; i < n && i < (int)cfg->hot; i++)
		nd->chosen += keys[i] < cfg->hot;
	free(keys);
	if (rc || atomic_load(&nd->err)) {
		fprintf(stderr, "ferry-cons-bench: node %d: hot_auto's update: %s\n", nd->rank,
			ferry_strerror(rc));
		atomic_store(&nd->err, 1);
		return -1;
	}
	return 0;
}

/* one node's part of one measurement: create, run the workers, check, destroy */
static void *cb_node_main(void *p)
{
	struct cb_node *nd = p;
	const struct cb_cfg *cfg = nd->cfg;
	struct cb_worker wa[64];
	pthread_t th[64];
	struct ferry_worker *w;
	uint64_t chunk = 4096;
	float *vals;
	uint64_t *keys;

	if (nd->warm && cb_warm_up(nd))
		return NULL;
	nd->t_start = cb_now();
	for (int i = 0; i < cfg->workers; i++) {
		wa[i] = (struct cb_worker){ .node = nd, .w = i };
		pthread_create(&th[i], NULL, cb_worker_main, &wa[i]);
	}
	for (int i = 0; i < cfg->workers; i++)
		pthread_join(th[i], NULL);
	nd->t_end = cb_now();
	/* every push anywhere is in every node's reads after the barrier */
	if (ferry_barrier(nd->fy)) {
		atomic_store(&nd->err, 1);
		return NULL;
	}
	vals = malloc(chunk * cfg->len * sizeof(float));
	keys = malloc(chunk * sizeof(*keys));
	if (!vals || !keys || ferry_worker_create(nd->fy, &w)) {
		atomic_store(&nd->err, 1);
		free(vals);
		free(keys);
		return NULL;
	}
	{
		/* each node checks a slice of the keys */
		uint64_t lo = (uint64_t)nd->rank * (cfg->keys / (uint64_t)cfg->nodes);
		uint64_t hi = nd->rank == cfg->nodes - 1 ? cfg->keys :
							   lo + cfg->keys / (uint64_t)cfg->nodes;

		for (uint64_t k = lo; k < hi; k += chunk) {
			uint64_t m = hi - k < chunk ? hi - k : chunk;

			for (uint64_t i = 0; i < m; i++)
				keys[i] = k + i;
			if (ferry_pull(w, nd->t, keys, m, vals)) {
				atomic_store(&nd->err, 1);
				break;
			}
			for (uint64_t i = 0; i < m; i++)
				if (vals[i * cfg->len] != (float)atomic_load(&nd->pushed[k + i])) {
					fprintf(stderr,
						"ferry-cons-bench: key %llu holds %g, %llu pushed\n",
						(unsigned long long)(k + i),
						(double)vals[i * cfg->len],
						(unsigned long long)atomic_load(
							&nd->pushed[k + i]));
					atomic_store(&nd->err, 1);
					break;
				}
		}
	}
	ferry_worker_destroy(w);
	free(vals);
	free(keys);
	if (ferry_barrier(nd->fy))
		atomic_store(&nd->err, 1);
	return NULL;
}

struct cb_create {
	struct cb_node *nd;
	const struct ferry_table_params *tp;
	int rc;
};

static void *cb_create_main(void *p)
{
	struct cb_create *c = p;

	c->rc = ferry_table_create(c->nd->fy, c->tp, &c->nd->t);
	return NULL;
}

/* one run of @model; *@rate_p: key operations per second (pulls or pushes) */
static int cb_measure(const struct cb_cfg *cfg, struct ferry **fys, enum ferry_consistency model,
		      int hot, double *rate_p, double *stale_mean_p, double *hit_p)
{
	struct ferry_table_params tp = {
		.num_keys = cfg->keys,
		.value_len = cfg->len,
		.placement = FERRY_PLACEMENT_HASH,
		.mode = FERRY_MODE_CLASSIC,
		.consistency = model,
		.staleness = model == FERRY_CONS_SSP || model == FERRY_CONS_ESSP ? cfg->staleness :
										   0,
		.hot_keys = hot == 1 ? cfg->hot_keys : NULL,
		.hot_count = hot == 1 ? cfg->hot : 0,
		.hot_sync_ms = hot ? cfg->hot_sync_ms : 0,
		.hot_auto = hot == 2 ? cfg->hot : 0,
	};
	struct cb_node nd[MAXN];
	struct cb_create cc[MAXN];
	pthread_t th[MAXN];
	pthread_barrier_t start;
	_Atomic uint64_t *pushed = calloc(cfg->keys, sizeof(*pushed));
	struct ferry_stats s0[MAXN], s1;
	double t0, t1, stale_sum = 0, stale_n = 0, hits = 0, misses = 0;
	unsigned long long pulls = 0, pushes = 0;
	int err = 0;

	if (!pushed)
		return -ENOMEM;
	pthread_barrier_init(&start, NULL, (unsigned)(cfg->nodes * cfg->workers));
	for (int i = 0; i < cfg->nodes; i++) {
		memset(&nd[i], 0, sizeof(nd[i]));
		nd[i] = (struct cb_node){ .cfg = cfg,
					  .fy = fys[i],
					  .rank = i,
					  .pushed = pushed,
					  .start = &start,
					  .warm = hot == 2 ? (cfg->iters + 3) / 4 : 0 };
		cc[i] = (struct cb_create){ .nd = &nd[i], .tp = &tp };
		pthread_create(&th[i], NULL, cb_create_main, &cc[i]);
	}
	for (int i = 0; i < cfg->nodes; i++) {
		pthread_join(th[i], NULL);
		if (cc[i].rc)
			err = cc[i].rc;
	}
	if (err) {
		fprintf(stderr, "ferry-cons-bench: table create: %s\n", ferry_strerror(err));
		free(pushed);
		return err;
	}
	for (int i = 0; i < cfg->nodes; i++)
		ferry_stats(fys[i], &s0[i]);
	t0 = cb_now();
	for (int i = 0; i < cfg->nodes; i++)
		pthread_create(&th[i], NULL, cb_node_main, &nd[i]);
	for (int i = 0; i < cfg->nodes; i++) {
		pthread_join(th[i], NULL);
		pulls += atomic_load(&nd[i].pulls);
		pushes += atomic_load(&nd[i].pushes);
		err |= atomic_load(&nd[i].err);
	}
	if (hot == 2) {
		/* from the first node's timed start: the warm-up is not timed */
		t0 = nd[0].t_start;
		for (int i = 1; i < cfg->nodes; i++)
			if (nd[i].t_start < t0)
				t0 = nd[i].t_start;
		printf("  hot_auto chose, per node, these many of the %u keys drawn most "
		       "(0 .. %u):",
		       cfg->hot, cfg->hot - 1);
		for (int i = 0; i < cfg->nodes; i++)
			printf(" %d", nd[i].chosen);
		printf("\n");
	}
	t1 = t0;
	for (int i = 0; i < cfg->nodes; i++)
		if (nd[i].t_end > t1)
			t1 = nd[i].t_end;
	for (int i = 0; i < cfg->nodes; i++) {
		ferry_stats(fys[i], &s1);
		/* the check's reads come after the barrier: counted too, at 0 */
		for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++) {
			double n = (double)(s1.staleness[b] - s0[i].staleness[b]);

			stale_sum += n * b;
			stale_n += n;
		}
		hits += (double)(s1.cons_hits - s0[i].cons_hits);
		misses += (double)(s1.cons_misses - s0[i].cons_misses);
		ferry_table_destroy(nd[i].t);
	}
	pthread_barrier_destroy(&start);
	free(pushed);
	if (err)
		return -EIO;
	*rate_p = (double)(pulls + pushes) / (t1 - t0);
	*stale_mean_p = stale_n > 0 ? stale_sum / stale_n : 0;
	*hit_p = hits + misses > 0 ? hits / (hits + misses) : 0;
	return 0;
}

static int cb_usage(void)
{
	fprintf(stderr, "usage: ferry-cons-bench [--nodes N] [--workers W] [--keys K] [--len L] "
			"[--batch B] [--clock-every C] [--iters I] [--rounds R] [--staleness S] "
			"[--transport tcp|loop|rdma] [--zipf S] [--hot H] [--hot-sync-ms MS] "
			"[--hot-auto]\n");
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "nodes", required_argument, NULL, 'n' },
		{ "workers", required_argument, NULL, 'w' },
		{ "keys", required_argument, NULL, 'k' },
		{ "len", required_argument, NULL, 'l' },
		{ "batch", required_argument, NULL, 'b' },
		{ "clock-every", required_argument, NULL, 'c' },
		{ "iters", required_argument, NULL, 't' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "staleness", required_argument, NULL, 's' },
		{ "transport", required_argument, NULL, 'T' },
		{ "zipf", required_argument, NULL, 'z' },
		{ "hot", required_argument, NULL, 'H' },
		{ "hot-sync-ms", required_argument, NULL, 'S' },
		{ "hot-auto", no_argument, NULL, 'A' },
		{ 0 },
	};
	static const char *const mnames[] = { "seq", "eventual", "ssp", "essp" };
	static const char *const hnames[] = { "seq", "seq+hot", "eventual", "eventual+hot" };
	/* the runs: the four models, or (--hot) two models without and with hot keys */
	static const int mmodel[] = { 0, 1, 2, 3 }, mhot[] = { 0, 0, 0, 0 };
	static const int hmodel[] = { 0, 0, 1, 1 }, hhot[] = { 0, 1, 0, 1 };
	/* --hot-auto: sequential without, with chosen and with automatic hot keys */
	static const char *const anames[] = { "seq", "seq+hot", "seq+auto" };
	static const int amodel[] = { 0, 0, 0 }, ahot[] = { 0, 1, 2 };
	int nruns;
	const char *const *names;
	const int *model, *hot;
	struct cb_cfg cfg = { .nodes = 4,
			      .workers = 2,
			      .batch = 16,
			      .clock_every = 10,
			      .rounds = 2,
			      .keys = 100000,
			      .len = 8,
			      .staleness = 2,
			      .iters = 2000,
			      .transport = FERRY_TRANSPORT_TCP };
	double pulls[4] = { 0 }, pushes[4] = { 0 }, stale[4] = { 0 };
	struct ferry *fys[MAXN];
	struct ferry_params fp;
	int opt, rc;

	setvbuf(stdout, NULL, _IOLBF, 0); /* each round as it ends, also into a pipe */
	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (opt) {
		case 'n':
			cfg.nodes = atoi(optarg);
			break;
		case 'w':
			cfg.workers = atoi(optarg);
			break;
		case 'k':
			cfg.keys = strtoull(optarg, NULL, 0);
			break;
		case 'l':
			cfg.len = (uint32_t)atoi(optarg);
			break;
		case 'b':
			cfg.batch = atoi(optarg);
			break;
		case 'c':
			cfg.clock_every = atoi(optarg);
			break;
		case 't':
			cfg.iters = atol(optarg);
			break;
		case 'r':
			cfg.rounds = atoi(optarg);
			break;
		case 's':
			cfg.staleness = (uint32_t)atoi(optarg);
			break;
		case 'z':
			cfg.zipf = atof(optarg);
			break;
		case 'H':
			cfg.hot = (uint32_t)atoi(optarg);
			break;
		case 'S':
			cfg.hot_sync_ms = (uint32_t)atoi(optarg);
			break;
		case 'A':
			cfg.hot_auto = 1;
			break;
		case 'T':
			if (!strcmp(optarg, "tcp"))
				cfg.transport = FERRY_TRANSPORT_TCP;
			else if (!strcmp(optarg, "loop"))
				cfg.transport = FERRY_TRANSPORT_LOOP;
			else if (!strcmp(optarg, "rdma"))
				cfg.transport = FERRY_TRANSPORT_RDMA;
			else
				return cb_usage();
			break;
		default:
			return cb_usage();
		}
	}
	if (cfg.nodes < 1 || cfg.nodes > MAXN || cfg.workers < 1 || cfg.workers > 64 ||
	    cfg.batch < 1 || cfg.clock_every < 1 || cfg.rounds < 1 || cfg.len < 1 ||
	    cfg.keys < (uint64_t)cfg.nodes || cfg.iters < 1 || cfg.zipf < 0 || cfg.hot > cfg.keys ||
	    (cfg.hot_auto && !cfg.hot))
		return cb_usage();
	names = cfg.hot_auto ? anames : cfg.hot ? hnames : mnames;
	model = cfg.hot_auto ? amodel : cfg.hot ? hmodel : mmodel;
	hot = cfg.hot_auto ? ahot : cfg.hot ? hhot : mhot;
	nruns = cfg.hot_auto ? 3 : 4;
	if (cfg.zipf > 0) {
		double sum = 0;

		cfg.cdf = malloc(cfg.keys * sizeof(*cfg.cdf));
		if (!cfg.cdf)
			return 1;
		for (uint64_t k = 0; k < cfg.keys; k++)
			cfg.cdf[k] = sum += pow((double)(k + 1), -cfg.zipf);
		for (uint64_t k = 0; k < cfg.keys; k++)
			cfg.cdf[k] /= sum;
	}
	if (cfg.hot) {
		cfg.hot_keys = malloc(cfg.hot * sizeof(*cfg.hot_keys));
		if (!cfg.hot_keys)
			return 1;
		for (uint32_t k = 0; k < cfg.hot; k++)
			cfg.hot_keys[k] = k;
	}
	ferry_params_init(&fp);
	fp.transport = cfg.transport;
	rc = ferry_local_cluster_open(cfg.nodes, &fp, fys);
	if (rc) {
		fprintf(stderr, "ferry-cons-bench: ferry_local_cluster_open: %s\n",
			ferry_strerror(rc));
		return 1;
	}
	printf("ferry-cons-bench: %d nodes x %d workers, %llu keys of %u floats (hash placed), "
	       "batches of %d, a clock every %d iterations, staleness %u, %ld iterations per "
	       "worker x %d rounds; keys %s (exponent %.2f); %u hot keys\n",
	       cfg.nodes, cfg.workers, (unsigned long long)cfg.keys, cfg.len, cfg.batch,
	       cfg.clock_every, cfg.staleness, cfg.iters, cfg.rounds,
	       cfg.zipf > 0 ? "Zipf" : "uniform", cfg.zipf, cfg.hot);
	for (int r = 0; r < cfg.rounds && !rc; r++)
		for (int m = 0; m < nruns && !rc; m++) {
			double pl, ps, st, st2, hit, hit2;

			cfg.push = 0;
			rc = cb_measure(&cfg, fys, (enum ferry_consistency)model[m], hot[m], &pl,
					&st, &hit);
			cfg.push = 1;
			if (!rc)
				rc = cb_measure(&cfg, fys, (enum ferry_consistency)model[m], hot[m],
						&ps, &st2, &hit2);
			if (rc)
				break;
			printf("  round %d %-12s pulls %10.0f keys/s  pushes %10.0f keys/s  pulls: "
			       "mean staleness %.2f clocks, %.0f%% from the copy (the check's "
			       "reads included)\n",
			       r + 1, names[m], pl, ps, st, 100 * hit);
			pulls[m] += pl / cfg.rounds;
			pushes[m] += ps / cfg.rounds;
			stale[m] += st / cfg.rounds;
		}
	if (!rc) {
		printf("%-12s %14s %14s %10s %10s %10s\n", "model", "pulls keys/s", "pushes keys/s",
		       "pull x seq", "push x seq", "staleness");
		for (int m = 0; m < nruns; m++)
			printf("%-12s %14.0f %14.0f %10.2f %10.2f %10.2f\n", names[m], pulls[m],
			       pushes[m], pulls[m] / pulls[0], pushes[m] / pushes[0], stale[m]);
		printf("every key's sum after each run equals the pushes counted\n");
	}
	for (int i = 0; i < cfg.nodes; i++)
		ferry_close(fys[i]);
	free(cfg.cdf);
	free(cfg.hot_keys);
	return rc ? 1 : 0;
}

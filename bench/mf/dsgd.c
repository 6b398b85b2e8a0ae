/* SPDX-License-Identifier: MIT */
/*
 * dsgd.c - distributed SGD for matrix factorization with parameter blocking.
 *
 * P = nodes x threads workers. Worker w owns the rows [rb[w], rb[w+1]) of the
 * training matrix; the columns are cut into P blocks [cb[b], cb[b+1]). The
 * entries fall into P x P cells (w, b). An epoch has P subepochs; in subepoch
 * s worker w trains on cell (w, (w + s) mod P), so no two workers touch the
 * same row factor or column factor at once:
 *
 *            block 0   block 1   block 2          subepoch 0: w0-b0 w1-b1 w2-b2
 *   rows w0  [ s=0 ]   [ s=1 ]   [ s=2 ]          subepoch 1: w0-b1 w1-b2 w2-b0
 *   rows w1  [ s=2 ]   [ s=0 ]   [ s=1 ]          subepoch 2: w0-b2 w1-b0 w2-b1
 *   rows w2  [ s=1 ]   [ s=2 ]   [ s=0 ]
 *
 * Ferry holds every factor in one table: key i < rows is W_i, key rows + j is
 * H_j, value_len = rank. In dynamic mode a worker localizes its W rows once
 * and the H block of each subepoch before it starts, so every pull and push
 * of the SGD pass is served in place. A barrier (the node's threads, then
 * ferry_barrier across nodes) ends each subepoch, which hands the blocks on.
 * Classic mode runs the same code on a FERRY_MODE_CLASSIC table: localize
 * does nothing, and keys stay at their home nodes.
 *
 * The SGD pass goes one row run at a time (the entries of one row in a cell):
 * one batched pull of [W_i, H_j1, ..., H_jn], the updates on the local copy,
 * one batched push of the deltas. Within a subepoch only this worker touches
 * those keys, so this is the same as pulling and pushing around every entry.
 *
 * Figures are summed across workers through a small Ferry table (one key per
 * epoch, additive pushes), so they work the same for threads and processes.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dsgd.h"
#include "mf.h"

/* async localize calls in flight */
#define MF_INFLIGHT 8

enum mf_stat {
	MF_ST_SQ_TRAIN,
	MF_ST_N_TRAIN,
	MF_ST_SQ_TEST,
	MF_ST_N_TEST,
	MF_ST_T_TOTAL,
	MF_ST_T_COMM,
	MF_ST_T_RELOC,
	MF_ST_T_WAIT,
	MF_ST_LOCAL_OPS,
	MF_ST_REMOTE_OPS,
	MF_ST_ELAPSED,	  /* seconds since the first epoch's start, summed over workers */
	MF_ST_BYTES_SENT, /* bytes the nodes sent in the epoch (thread 0 of each node) */
	MF_ST_HITS,
	MF_ST_MISSES,
	MF_ST_STALE0, /* FERRY_STALENESS_BUCKETS of them */
	MF_NSTAT = MF_ST_STALE0 + FERRY_STALENESS_BUCKETS
};

struct mf_node {
	struct ferry *fy;
	int rank;
	const struct mf_config *cfg;
	const struct mf_plan *plan;
	struct mf_result *res; /* written by rank 0, thread 0 */
	struct ferry_table *tab;
	struct ferry_table *stats;
	pthread_barrier_t bar;
	atomic_int abort; /* some thread failed: stop at the next barrier */
	int stop;	  /* abort as thread 0 saw it in the last barrier */
	int err;	  /* the first error; set together with abort */
	int no_start;	  /* a thread could not be created: the others return at once */
	pthread_mutex_t lock;
	struct ferry_stats last; /* counters at the previous epoch's end (thread 0) */
};

struct mf_worker {
	struct mf_node *node;
	int t; /* thread within the node */
	int w; /* global worker index: rank * threads + t */
	struct ferry_worker *fw;
	float *buf;	   /* (max_run + 1) * rank: a row run, or a chunk */
	float *w0;	   /* rank: W_i as pulled */
	uint64_t *rkeys;   /* max_run + 1 keys of a row run, or 2 * chunk */
	uint64_t *tickets; /* MF_INFLIGHT */
	double t_comm, t_reloc, t_wait;
	double sq_train;
	size_t n_train;
	double t_start;	     /* the first epoch's start */
	double prev_elapsed; /* --time-budget: the figure of the epoch before */
};

static double mf_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mf_config_init(struct mf_config *cfg)
{
	*cfg = (struct mf_config){
		.nodes = 2,
		.threads = 1,
		.transport = FERRY_TRANSPORT_AUTO,
		.mode = MF_MODE_DYNAMIC,
		.rank = 16,
		.lr = 0.05,
		.decay = 0.95,
		.reg = 0.02,
		.init = 0.5,
		.epochs = 10,
		.seed = 1,
	};
}

double mf_mean_epoch_seconds(const struct mf_result *res)
{
	double s = 0;

	for (int e = 0; e < res->epochs; e++)
		s += res->ep[e].seconds;
	return res->epochs ? s / res->epochs : 0;
}

/* ---- coordination ---------------------------------------------------------- */

static void mf_fail(struct mf_worker *wk, int rc, const char *what)
{
	struct mf_node *node = wk->node;

	pthread_mutex_lock(&node->lock);
	if (!node->err) {
		node->err = rc;
		fprintf(stderr, "ferry-mf: node %d worker %d: %s failed: %s\n", node->rank, wk->w,
			what, ferry_strerror(rc));
	}
	pthread_mutex_unlock(&node->lock);
	atomic_store(&node->abort, 1);
}

/*
 * The threads of the node meet, thread 0 meets the other nodes, the threads
 * meet again. Every thread calls it the same number of times whatever
 * happened, so a failure stops the whole node at the next barrier instead of
 * leaving its threads waiting for each other.
 *
 * All threads must take the same decision: they read node->stop, which
 * thread 0 wrote before the second meeting and can write again only after
 * every thread reached the next barrier; node->abort itself may be set by a
 * fast thread that already left.
 *
 * Return: 0, or -ECANCELED when this node gave up (the cause is in node->err).
 */
static int mf_barrier(struct mf_worker *wk)
{
	struct mf_node *node = wk->node;
	double t0 = mf_now();
	int rc;

	pthread_barrier_wait(&node->bar);
	if (wk->t == 0) {
		if (!atomic_load(&node->abort)) {
			rc = ferry_barrier(node->fy);
			if (rc)
				mf_fail(wk, rc, "ferry_barrier");
		}
		node->stop = atomic_load(&node->abort);
	}
	pthread_barrier_wait(&node->bar);
	wk->t_wait += mf_now() - t0;
	return node->stop ? -ECANCELED : 0;
}

/* Localize keys [first, first + n) in chunks, MF_INFLIGHT at a time. */
static int mf_localize_range(struct mf_worker *wk, uint64_t first, uint64_t n)
{
	const struct mf_plan *p = wk->node->plan;
	size_t head = 0, inflight = 0;
	uint64_t k = 0;
	int rc = 0, rc2;

	while (k < n || inflight) {
		if (k < n && inflight < MF_INFLIGHT) {
			size_t m = n - k < p->chunk ? n - k : p->chunk;
			uint64_t *t = &wk->tickets[(head + inflight) % MF_INFLIGHT];

			rc = ferry_localize_start(wk->fw, wk->node->tab, p->keys + first + k, m, t);
			if (rc) {
				k = n; /* issue no more; collect what is in flight */
			} else {
				inflight++;
				k += m;
			}
			continue;
		}
		rc2 = ferry_wait(wk->fw, wk->tickets[head]);
		head = (head + 1) % MF_INFLIGHT;
		inflight--;
		if (rc2 && !rc) {
			rc = rc2;
			k = n;
		}
	}
	return rc;
}

/* the initial value of @key: uniform in [-a, a), a per-key stream of @seed */
static void mf_init_value(const struct mf_config *cfg, uint64_t key, float *v)
{
	double a = cfg->init * pow((double)cfg->rank, -0.25);
	struct mf_rng r;

	mf_rng_init(&r, cfg->seed ^ 0x6d66696e6974ull, key);
	for (uint32_t d = 0; d < cfg->rank; d++)
		v[d] = (float)(a * (2.0 * mf_rng_uniform(&r) - 1.0));
}

/* the start of @key: the loaded factor when cfg->start holds it, else random */
static void mf_start_value(const struct mf_config *cfg, const struct mf_plan *p, uint64_t key,
			   float *v)
{
	const struct mf_factors *st = cfg->start;
	const float *src = NULL;

	if (st && key < p->rows && key < st->rows)
		src = st->w + key * cfg->rank;
	else if (st && key >= p->rows && key - p->rows < st->cols)
		src = st->h + (key - p->rows) * cfg->rank;
	if (src)
		memcpy(v, src, cfg->rank * sizeof(float));
	else
		mf_init_value(cfg, key, v);
}

static int mf_set_range(struct mf_worker *wk, uint64_t first, uint64_t n)
{
	const struct mf_plan *p = wk->node->plan;
	uint32_t rank = wk->node->cfg->rank;

	for (uint64_t k = 0; k < n;) {
		size_t m = n - k < p->chunk ? n - k : p->chunk;
		int rc;

		for (size_t q = 0; q < m; q++)
			mf_start_value(wk->node->cfg, p, first + k + q, wk->buf + q * rank);
		rc = ferry_set(wk->fw, wk->node->tab, p->keys + first + k, m, wk->buf);
		if (rc)
			return rc;
		k += m;
	}
	return 0;
}

/* ---- the SGD pass ----------------------------------------------------------- */

/* four floats: SSE2 and NEON have them everywhere, without -march flags */
typedef float mf_v4 __attribute__((vector_size(16)));

static inline mf_v4 mf_load4(const float *p)
{
	mf_v4 v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void mf_store4(float *p, mf_v4 v)
{
	memcpy(p, &v, sizeof(v));
}

/*
 * One SGD step on entry v = w.h + e: w moves along e*h - reg*w, and h is
 * replaced by its own delta lr*(e*w - reg*h) (taken from the old w), ready to
 * be pushed. Return: the error e before the step.
 */
static inline float mf_step(float *restrict w, float *restrict h, float v, float lr, float reg,
			    uint32_t rank)
{
	mf_v4 acc0 = { 0 }, acc1 = { 0 };
	uint32_t d = 0;
	float dot, e;

	for (; d + 8 <= rank; d += 8) {
		acc0 += mf_load4(w + d) * mf_load4(h + d);
		acc1 += mf_load4(w + d + 4) * mf_load4(h + d + 4);
	}
	for (; d + 4 <= rank; d += 4)
		acc0 += mf_load4(w + d) * mf_load4(h + d);
	acc0 += acc1;
	dot = acc0[0] + acc0[1] + acc0[2] + acc0[3];
	for (; d < rank; d++)
		dot += w[d] * h[d];
	e = v - dot;

	for (d = 0; d + 4 <= rank; d += 4) {
		mf_v4 wd = mf_load4(w + d), hd = mf_load4(h + d);

		mf_store4(w + d, wd + lr * (e * hd - reg * wd));
		mf_store4(h + d, lr * (e * wd - reg * hd));
	}
	for (; d < rank; d++) {
		float wd = w[d], hd = h[d];

		w[d] = wd + lr * (e * hd - reg * wd);
		h[d] = lr * (e * wd - reg * hd);
	}
	return e;
}

/* in classic mode: does a call on @keys leave this node? */
static int mf_remote(const struct mf_worker *wk, const uint64_t *keys, size_t n)
{
	for (size_t k = 0; k < n; k++)
		if (ferry_table_home(wk->node->tab, keys[k]) != wk->node->rank)
			return 1;
	return 0;
}

static int mf_cell_sgd(struct mf_worker *wk, int b, float lr)
{
	struct mf_node *node = wk->node;
	const struct mf_plan *p = node->plan;
	const uint32_t rank = node->cfg->rank;
	const float reg = (float)node->cfg->reg;
	const int classic = node->cfg->mode == MF_MODE_CLASSIC;
	const size_t c = (size_t)wk->w * (size_t)p->nw + (size_t)b;
	const struct mf_entry *e = p->train + p->cell[c];
	const struct mf_entry *end = p->train + p->cell[c + 1];
	uint64_t *keys = wk->rkeys;
	float *buf = wk->buf;
	double sq = 0, t0 = 0;
	int rc = 0, remote = 0;

	while (e < end) {
		const struct mf_entry *r = e;
		size_t n = 0;

		keys[0] = e->i;
		for (; r < end && r->i == e->i; r++)
			keys[++n] = p->rows + r->j;

		/* dynamic mode: every key of the pass is local by construction */
		if (classic) {
			remote = mf_remote(wk, keys, n + 1);
			if (remote)
				t0 = mf_now();
		}
		rc = ferry_pull(wk->fw, node->tab, keys, n + 1, buf);
		if (remote)
			wk->t_comm += mf_now() - t0;
		if (rc) {
			mf_fail(wk, rc, "ferry_pull");
			break;
		}

		memcpy(wk->w0, buf, rank * sizeof(float));
		for (size_t k = 0; k < n; k++) {
			float err = mf_step(buf, buf + (k + 1) * rank, e[k].v, lr, reg, rank);

			sq += (double)err * err;
		}
		for (uint32_t d = 0; d < rank; d++)
			buf[d] -= wk->w0[d];

		if (remote)
			t0 = mf_now();
		rc = ferry_push(wk->fw, node->tab, keys, n + 1, buf);
		if (remote)
			wk->t_comm += mf_now() - t0;
		if (rc) {
			mf_fail(wk, rc, "ferry_push");
			break;
		}
		wk->n_train += n;
		e = r;
	}
	wk->sq_train += sq;
	return rc;
}

/* Squared error over this worker's test entries, @p->chunk entries per pull. */
static int mf_eval(struct mf_worker *wk, double *sq_p)
{
	struct mf_node *node = wk->node;
	const struct mf_plan *p = node->plan;
	const uint32_t rank = node->cfg->rank;
	const struct mf_entry *e = p->test + p->tcell[wk->w];
	const struct mf_entry *end = p->test + p->tcell[wk->w + 1];
	size_t step = p->chunk / 2 ? p->chunk / 2 : 1;
	double sq = 0;

	while (e < end) {
		size_t m = (size_t)(end - e) < step ? (size_t)(end - e) : step;
		int rc;

		for (size_t k = 0; k < m; k++) {
			wk->rkeys[2 * k] = e[k].i;
			wk->rkeys[2 * k + 1] = p->rows + e[k].j;
		}
		rc = ferry_pull(wk->fw, node->tab, wk->rkeys, 2 * m, wk->buf);
		if (rc) {
			mf_fail(wk, rc, "ferry_pull (evaluation)");
			return rc;
		}
		for (size_t k = 0; k < m; k++) {
			const float *w = wk->buf + 2 * k * rank, *h = w + rank;
			float dot = 0;

			for (uint32_t d = 0; d < rank; d++)
				dot += w[d] * h[d];
			sq += ((double)e[k].v - dot) * ((double)e[k].v - dot);
		}
		e += m;
	}
	*sq_p = sq;
	return 0;
}

/* ---- one epoch's figures ------------------------------------------------------ */

static int mf_report(struct mf_worker *wk, int epoch, double seconds, double sq_test)
{
	struct mf_node *node = wk->node;
	const struct mf_plan *p = node->plan;
	uint64_t key = (uint64_t)epoch;
	float st[MF_NSTAT] = { 0 };
	int rc;

	st[MF_ST_SQ_TRAIN] = (float)wk->sq_train;
	st[MF_ST_N_TRAIN] = (float)wk->n_train;
	st[MF_ST_SQ_TEST] = (float)sq_test;
	st[MF_ST_N_TEST] = (float)(p->tcell[wk->w + 1] - p->tcell[wk->w]);
	st[MF_ST_T_TOTAL] = (float)seconds;
	st[MF_ST_T_COMM] = (float)(wk->t_comm + wk->t_reloc);
	st[MF_ST_T_RELOC] = (float)wk->t_reloc;
	st[MF_ST_T_WAIT] = (float)wk->t_wait;
	st[MF_ST_ELAPSED] = (float)(mf_now() - wk->t_start);
	if (wk->t == 0) {
		struct ferry_stats now;

		rc = ferry_stats(node->fy, &now);
		if (rc) {
			mf_fail(wk, rc, "ferry_stats");
			return rc;
		}
		st[MF_ST_LOCAL_OPS] = (float)(now.local_ops - node->last.local_ops);
		st[MF_ST_REMOTE_OPS] = (float)(now.remote_ops - node->last.remote_ops);
		st[MF_ST_BYTES_SENT] = (float)(now.bytes_sent - node->last.bytes_sent);
		for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++)
			st[MF_ST_STALE0 + b] = (float)(now.staleness[b] - node->last.staleness[b]);
		st[MF_ST_HITS] = (float)(now.cons_hits - node->last.cons_hits);
		st[MF_ST_MISSES] = (float)(now.cons_misses - node->last.cons_misses);
		node->last = now;
	}
	rc = ferry_push(wk->fw, node->stats, &key, 1, st);
	if (rc)
		mf_fail(wk, rc, "ferry_push (statistics)");
	return rc;
}

static int mf_collect(struct mf_worker *wk, int epoch, double seconds, float lr)
{
	struct mf_node *node = wk->node;
	const struct mf_config *cfg = node->cfg;
	struct mf_epoch *ep = &node->res->ep[epoch];
	uint64_t key = (uint64_t)epoch;
	float st[MF_NSTAT];
	double busy;
	int rc;

	rc = ferry_pull(wk->fw, node->stats, &key, 1, st);
	if (rc) {
		mf_fail(wk, rc, "ferry_pull (statistics)");
		return rc;
	}
	busy = st[MF_ST_T_TOTAL] > 0 ? st[MF_ST_T_TOTAL] : 1;
	*ep = (struct mf_epoch){
		.seconds = seconds,
		.comm_share = st[MF_ST_T_COMM] / busy,
		.reloc_share = st[MF_ST_T_RELOC] / busy,
		.wait_share = st[MF_ST_T_WAIT] / busy,
		.train_mse = st[MF_ST_N_TRAIN] > 0 ? st[MF_ST_SQ_TRAIN] / st[MF_ST_N_TRAIN] : NAN,
		.test_rmse = st[MF_ST_N_TEST] > 0 ? sqrt(st[MF_ST_SQ_TEST] / st[MF_ST_N_TEST]) :
						    NAN,
		.lr = lr,
		.local_ops = st[MF_ST_LOCAL_OPS],
		.remote_ops = st[MF_ST_REMOTE_OPS],
		.elapsed = st[MF_ST_ELAPSED] / node->plan->nw,
		.bytes_sent = st[MF_ST_BYTES_SENT],
	};
	for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++)
		ep->stale[b] = st[MF_ST_STALE0 + b];
	ep->copy_hits = st[MF_ST_HITS];
	ep->copy_misses = st[MF_ST_MISSES];
	node->res->epochs = epoch + 1;
	if (cfg->progress) {
		fprintf(cfg->progress,
			"%s%sepoch %3d  %8.3f s  comm+wait %5.1f%% (localize %4.1f%%, "
			"barrier %4.1f%%)  train loss %.5f  test RMSE %.5f\n",
			cfg->tag ? cfg->tag : "", cfg->tag ? " " : "", epoch + 1, ep->seconds,
			100 * (ep->comm_share + ep->wait_share), 100 * ep->reloc_share,
			100 * ep->wait_share, ep->train_mse, ep->test_rmse);
		fflush(cfg->progress);
	}
	return 0;
}

/*
 * --time-budget: after the epoch's figures are in, every worker reads the
 * same sums and so takes the same decision. Return: 1 to stop, 0 to go on,
 * or a negative errno.
 */
static int mf_budget_spent(struct mf_worker *wk, int epoch)
{
	struct mf_node *node = wk->node;
	uint64_t key = (uint64_t)epoch;
	float st[MF_NSTAT];
	double elapsed, last;
	int rc;

	rc = ferry_pull(wk->fw, node->stats, &key, 1, st);
	if (rc) {
		mf_fail(wk, rc, "ferry_pull (time budget)");
		return rc;
	}
	elapsed = st[MF_ST_ELAPSED] / node->plan->nw;
	/* the next epoch as long as the longer of this one and the mean, evaluation included */
	last = elapsed - wk->prev_elapsed;
	if (last < elapsed / (epoch + 1))
		last = elapsed / (epoch + 1);
	wk->prev_elapsed = elapsed;
	return elapsed + last > node->cfg->time_budget;
}

/* Pull every factor into cfg->out (rank 0, thread 0, after the last epoch). */
static int mf_fetch_factors(struct mf_worker *wk)
{
	struct mf_node *node = wk->node;
	const struct mf_plan *p = node->plan;
	struct mf_factors *out = node->cfg->out;
	const uint32_t rank = node->cfg->rank;

	for (uint64_t k = 0; k < p->rows + p->cols;) {
		uint64_t end = k < p->rows ? p->rows : p->rows + p->cols;
		size_t m = end - k < p->chunk ? end - k : p->chunk;
		float *dst = k < p->rows ? out->w + k * rank : out->h + (k - p->rows) * rank;
		int rc = ferry_pull(wk->fw, node->tab, p->keys + k, m, dst);

		if (rc) {
			mf_fail(wk, rc, "ferry_pull (the factors for --save)");
			return rc;
		}
		k += m;
	}
	return 0;
}

/* ---- a worker thread ----------------------------------------------------------- */

static int mf_worker_setup(struct mf_worker *wk)
{
	struct mf_node *node = wk->node;
	const struct mf_plan *p = node->plan;
	size_t nbuf = p->max_run + 1 > p->chunk ? p->max_run + 1 : p->chunk;
	size_t nkeys = nbuf > 2 * p->chunk ? nbuf : 2 * p->chunk;
	int rc;

	wk->buf = malloc(nkeys * node->cfg->rank * sizeof(float));
	wk->w0 = malloc(node->cfg->rank * sizeof(float));
	wk->rkeys = malloc(nkeys * sizeof(uint64_t));
	wk->tickets = malloc(MF_INFLIGHT * sizeof(uint64_t));
	if (!wk->buf || !wk->w0 || !wk->rkeys || !wk->tickets)
		return -ENOMEM;
	rc = ferry_worker_create(node->fy, &wk->fw);
	if (rc)
		mf_fail(wk, rc, "ferry_worker_create");
	return rc;
}

static void mf_worker_cleanup(struct mf_worker *wk)
{
	if (wk->fw)
		ferry_worker_destroy(wk->fw);
	free(wk->buf);
	free(wk->w0);
	free(wk->rkeys);
	free(wk->tickets);
}

static void *mf_worker_main(void *arg)
{
	struct mf_worker *wk = arg;
	struct mf_node *node = wk->node;
	const struct mf_config *cfg = node->cfg;
	const struct mf_plan *p = node->plan;
	const int dynamic = cfg->mode == MF_MODE_DYNAMIC;
	const int nw = p->nw, w = wk->w;
	double t0, t1, setup0 = mf_now();
	int rc;

	/* mf_node_run holds the lock until every thread exists, or gave up */
	pthread_mutex_lock(&node->lock);
	rc = node->no_start;
	pthread_mutex_unlock(&node->lock);
	if (rc)
		return NULL;

	rc = mf_worker_setup(wk);
	if (rc == -ENOMEM)
		mf_fail(wk, rc, "allocating buffers");

	/* own W rows and the first H block: localize (dynamic), then initialize */
	if (!rc && dynamic) {
		rc = mf_localize_range(wk, p->rb[w], p->rb[w + 1] - p->rb[w]);
		if (!rc)
			rc = mf_localize_range(wk, p->rows + p->cb[w], p->cb[w + 1] - p->cb[w]);
		if (rc)
			mf_fail(wk, rc, "ferry_localize (setup)");
	}
	if (!rc) {
		rc = mf_set_range(wk, p->rb[w], p->rb[w + 1] - p->rb[w]);
		if (!rc)
			rc = mf_set_range(wk, p->rows + p->cb[w], p->cb[w + 1] - p->cb[w]);
		if (rc)
			mf_fail(wk, rc, "ferry_set (initial values)");
	}
	if (mf_barrier(wk))
		goto out;
	if (wk->t == 0 && ferry_stats(node->fy, &node->last))
		memset(&node->last, 0, sizeof(node->last));
	if (node->rank == 0 && wk->t == 0)
		node->res->setup_seconds = mf_now() - setup0;

	for (int epoch = 0; epoch < cfg->epochs; epoch++) {
		float lr = (float)(cfg->lr * pow(cfg->decay, epoch));
		double sq_test = 0;

		wk->t_comm = wk->t_reloc = wk->t_wait = wk->sq_train = 0;
		wk->n_train = 0;
		t0 = mf_now();
		if (!epoch)
			wk->t_start = t0;
		for (int s = 0; s < nw; s++) {
			int b = (w + s) % nw;

			rc = 0;
			/* block w is here already at the very start */
			if (dynamic && (epoch || s)) {
				double tl = mf_now();

				rc = mf_localize_range(wk, p->rows + p->cb[b],
						       p->cb[b + 1] - p->cb[b]);
				wk->t_reloc += mf_now() - tl;
				if (rc)
					mf_fail(wk, rc, "ferry_localize");
			}
			if (!rc && !atomic_load(&node->abort))
				mf_cell_sgd(wk, b, lr);
			if (cfg->push_codec && !atomic_load(&node->abort)) {
				/* what the codec rounded away, exactly, before the
				 * block goes to the next worker */
				rc = ferry_flush(wk->fw, node->tab);
				if (rc)
					mf_fail(wk, rc, "ferry_flush");
			}
			if (cfg->consistency != FERRY_CONS_SEQUENTIAL) {
				/* a clock per block: no meeting, staleness bounded by the
				 * table's model; a failure stops the node at the epoch's
				 * barrier */
				double tw = mf_now();

				if (!atomic_load(&node->abort)) {
					rc = ferry_clock(wk->fw);
					if (rc)
						mf_fail(wk, rc, "ferry_clock");
				}
				wk->t_wait += mf_now() - tw;
			} else if (mf_barrier(wk)) {
				goto out;
			}
		}
		t1 = mf_now();
		rc = mf_eval(wk, &sq_test);
		if (!rc)
			mf_report(wk, epoch, t1 - t0, sq_test);
		if (mf_barrier(wk))
			goto out;
		if (node->rank == 0 && wk->t == 0)
			mf_collect(wk, epoch, t1 - t0, lr);
		if (cfg->time_budget > 0 && epoch + 1 < cfg->epochs) {
			/* a failed pull goes on: the next barrier stops the node */
			rc = mf_budget_spent(wk, epoch);
			if (rc > 0) {
				if (node->rank == 0 && wk->t == 0)
					node->res->budget_stop = 1;
				break;
			}
		}
	}
	if (cfg->out && node->rank == 0 && wk->t == 0)
		mf_fetch_factors(wk);
	/* rank 0 read the last figures (and factors) before anyone destroys the tables */
	mf_barrier(wk);
out:
	mf_worker_cleanup(wk);
	return NULL;
}

/* ---- a node -------------------------------------------------------------------------- */

/* Run one node's workers on @fy; the calling thread is worker 0. */
int mf_node_run(struct ferry *fy, const struct mf_config *cfg, const struct mf_plan *p,
		struct mf_result *res)
{
	struct ferry_table_params tp = {
		.num_keys = p->rows + p->cols,
		.value_len = cfg->rank,
		.placement = FERRY_PLACEMENT_RANGE,
		.mode = cfg->mode == MF_MODE_CLASSIC ? FERRY_MODE_CLASSIC : FERRY_MODE_DYNAMIC,
		.consistency = cfg->consistency,
		.staleness = cfg->staleness,
		.push_codec = cfg->push_codec,
	};
	struct ferry_table_params sp = {
		.num_keys = (uint64_t)cfg->epochs,
		.value_len = MF_NSTAT,
		.placement = FERRY_PLACEMENT_RANGE,
		.mode = FERRY_MODE_CLASSIC,
	};
	struct mf_node node = {
		.fy = fy,
		.rank = ferry_rank(fy),
		.cfg = cfg,
		.plan = p,
		.res = res,
	};
	struct mf_worker *wks;
	pthread_t *tids;
	int started = 1, rc;

	wks = calloc((size_t)cfg->threads, sizeof(*wks));
	tids = calloc((size_t)cfg->threads, sizeof(*tids));
	if (!wks || !tids) {
		rc = -ENOMEM;
		goto err_free;
	}
	rc = ferry_table_create(fy, &tp, &node.tab);
	if (rc) {
		fprintf(stderr, "ferry-mf: node %d: ferry_table_create (factors) failed: %s\n",
			node.rank, ferry_strerror(rc));
		goto err_free;
	}
	rc = ferry_table_create(fy, &sp, &node.stats);
	if (rc) {
		fprintf(stderr, "ferry-mf: node %d: ferry_table_create (statistics) failed: %s\n",
			node.rank, ferry_strerror(rc));
		goto err_destroy_tab;
	}
	rc = -pthread_barrier_init(&node.bar, NULL, (unsigned)cfg->threads);
	if (rc)
		goto err_destroy_stats;
	pthread_mutex_init(&node.lock, NULL);
	atomic_init(&node.abort, 0);

	for (int t = 0; t < cfg->threads; t++) {
		wks[t].node = &node;
		wks[t].t = t;
		wks[t].w = node.rank * cfg->threads + t;
	}
	/* the threads wait for the lock: with one missing, the rest would wait at a barrier */
	pthread_mutex_lock(&node.lock);
	for (; started < cfg->threads; started++) {
		rc = -pthread_create(&tids[started], NULL, mf_worker_main, &wks[started]);
		if (rc) {
			fprintf(stderr, "ferry-mf: node %d: pthread_create failed: %s\n", node.rank,
				strerror(-rc));
			node.err = rc;
			node.no_start = 1;
			break;
		}
	}
	pthread_mutex_unlock(&node.lock);
	if (!rc)
		mf_worker_main(&wks[0]);
	for (int t = 1; t < started; t++)
		pthread_join(tids[t], NULL);
	if (!rc)
		rc = node.err;

	pthread_mutex_destroy(&node.lock);
	pthread_barrier_destroy(&node.bar);
err_destroy_stats:
	ferry_table_destroy(node.stats);
err_destroy_tab:
	ferry_table_destroy(node.tab);
err_free:
	free(wks);
	free(tids);
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * ferry-dp - synchronous data-parallel SGD on Ferry (issue 18, items 3, 4):
 * softmax regression, one worker per node, every scheme on the same data,
 * the same global batch and the same straggler. The nodes are threads of this
 * process (ferry_local_cluster_open, --workers N), or, when a launcher gave
 * this process a rank and a world (mpirun, FERRY_RANK/FERRY_WORLD, torchrun:
 * dp_launched), this process is one node of that world (ferry_open), and
 * rank 0 prints and writes the JSON. The cluster is opened once, and the
 * schemes run on it one after the other.
 *
 *   allreduce  BSP: each worker's summed gradient over global / workers
 *              samples, ferry_allreduce (sum), every worker applies the same
 *              update (the lecture's algorithm)
 *   ps         BSP through the parameter store: barrier, push -lr g / global
 *              into a table of the weights, barrier, pull the weights
 *   lbbsp      LB-BSP: as allreduce, but at every iteration boundary each
 *              worker's batch is recomputed from its measured time per sample
 *              (a pluggable predictor, EMA here), the global batch fixed; the
 *              summed gradients divided by the global batch equal the full
 *              batch's mean gradient, whatever the split
 *
 *   ssp        SSP through the parameter store: as ps, on a table of
 *              consistency FERRY_CONS_SSP (--staleness S, 3 by default): the
 *              push is buffered, ferry_clock sends it and waits while the
 *              slowest worker is more than S clocks behind, the pull may
 *              return a copy up to S clocks old; no barrier
 *
 *   backup     BSP with backup workers: each update uses the first workers - B
 *              gradients to arrive (--backups B, 1 by default), through the
 *              parameter store, rank 0 coordinating (so rank 0 should not be
 *              the straggler)
 *
 * --straggler RANK:FACTOR[:FROM] slows one worker by FACTOR from iteration
 * FROM (it sleeps FACTOR - 1 times its compute time: a deterministic
 * straggler that costs no CPU); --jitter P:MS makes every worker pause a
 * random 0 .. MS ms with probability P per iteration; --duty D (< 1) runs
 * every worker as on a machine D times one core of this one (dp_pace()), so
 * that more workers than cores do not slow each other. Time is rank 0's wall
 * clock with evaluation taken out (every node waits at a barrier while rank
 * 0 evaluates on the test set). JSON with --json FILE.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bjson.h"
#include "dp.h"
#include "ferry/ferry.h"

enum dp_scheme {
	DP_ALLREDUCE,
	DP_PS,
	DP_LBBSP,
	DP_BACKUP,
	DP_SSP,
	DP_NSCHEMES
};
static const char *const scheme_names[] = { "allreduce", "ps", "lbbsp", "backup", "ssp" };

struct dp_opts {
	int workers, iters, eval_every;
	uint32_t batch;
	float lr;
	int strag_rank, strag_from;
	double strag_factor;
	double duty; /* --duty: 1 (off), or the speed emulated, as a share of a core */
	double jitter_p, jitter_ms;
	double target_loss;
	double ema_alpha; /* LB-BSP's predictor */
	int backups;	  /* backup workers: updates use the first workers - backups */
	size_t hidden;	  /* 0: softmax regression; else an MLP with this many ReLU units */
	unsigned schemes; /* bits of enum dp_scheme */
	const char *json;
	uint64_t seed;
	uint32_t staleness; /* ssp: the table's bound, in clocks */
};

struct dp_point {
	int iter;
	double time_s, loss, acc;
	uint32_t batch[DP_MAX_WORKERS];
};

struct dp_run {
	const struct dp_opts *o;
	const struct dp_data *train, *test;
	struct dp_model model;
	enum dp_scheme scheme;
	struct ferry **fys; /* indexed by rank; processes: only this node's */
	int me;		    /* processes: this node's rank; threads: -1 */
	struct dp_point *pts;
	int npts;
	double time_to_target; /* -1: never */
	int failed;
	char why[256];
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
	struct timespec ts;

	if (s <= 0)
		return;
	ts.tv_sec = (time_t)s;
	ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
	nanosleep(&ts, NULL);
}

static double cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * End a compute phase that began at wall time @t0 and thread CPU time @c0.
 * Without --duty its length is what it took; a straggler (@slow) then
 * sleeps FACTOR - 1 times that. With --duty D (< 1) its length is its CPU
 * time / D, FACTOR times that for a straggler, made up by sleeping: every
 * worker runs as on a machine D times one core here, whatever the other
 * workers on the same cores do, as long as W x D is at most the cores (so
 * 4 workers on 2 cores at D = 0.5). Without it, 4 workers on 2 cores slow
 * each other, and a straggler that sleeps frees a core the others then
 * use (docs/dp.md).
 */
static void dp_pace(const struct dp_opts *o, int slow, double t0, double c0)
{
	double base = o->duty < 1 ? (cpu_s() - c0) / o->duty : now_s() - t0;

	if (slow)
		base *= o->strag_factor;
	sleep_s(base - (now_s() - t0));
}

struct dp_arg {
	struct dp_run *run;
	int rank;
};

static int dp_fail(struct dp_run *run, int rank, const char *what, int rc)
{
	if (!__atomic_fetch_add(&run->failed, 1, __ATOMIC_SEQ_CST))
		snprintf(run->why, sizeof(run->why), "rank %d: %s: %s", rank, what,
			 ferry_strerror(rc));
	return 1;
}

/*
 * The parameter store holds the weights as keys of at most DP_KEY_LEN
 * floats, the last one shorter (and, for the backup scheme, one more key
 * of 1 float: the version). Return: the number of weight keys.
 */
#define DP_KEY_LEN 1024

static size_t dp_ps_layout(size_t P, uint32_t *lens, uint64_t *keys, int version)
{
	size_t n = (P + DP_KEY_LEN - 1) / DP_KEY_LEN;

	for (size_t k = 0; k < n; k++) {
		keys[k] = k;
		lens[k] = (uint32_t)(k + 1 < n ? DP_KEY_LEN : P - k * DP_KEY_LEN);
	}
	if (version) {
		keys[n] = n;
		lens[n] = 1;
	}
	return n;
}

static void *dp_worker(void *p)
{
	struct dp_arg *a = p;
	struct dp_run *run = a->run;
	const struct dp_opts *o = run->o;
	const struct dp_data *d = run->train;
	const int r = a->rank, W = o->workers;
	const size_t P = dp_params(&run->model);
	struct ferry *fy = run->fys[r];
	struct ferry_table *t = NULL;
	struct ferry_worker *wk = NULL;
	struct dp_predictor pred;
	uint32_t batch[DP_MAX_WORKERS], *idx = malloc(o->batch * sizeof(uint32_t));
	uint32_t *lens = malloc((P / DP_KEY_LEN + 2) * sizeof(uint32_t));
	float *w = calloc(P, sizeof(float)), *buf = calloc(P + 2 + DP_MAX_WORKERS, sizeof(float));
	uint64_t *keys = malloc((P / DP_KEY_LEN + 2) * sizeof(uint64_t));
	uint64_t rng = o->seed * 31 + (uint64_t)r;
	size_t nkeys = 0;
	size_t shard = (d->n - (size_t)r + (size_t)W - 1) / (size_t)W, cursor = 0;
	double clock0 = 0, paused = 0;
	int rc;

	if (!idx || !w || !buf || !lens || !keys) {
		dp_fail(run, r, "memory", -ENOMEM);
		goto out;
	}
	dp_predictor_ema_init(&pred, o->ema_alpha);
	dp_lb_split(NULL, W, o->batch, batch);
	dp_model_init(&run->model, w, o->seed);
	nkeys = dp_ps_layout(P, lens, keys, 0);
	if (run->scheme == DP_PS || run->scheme == DP_SSP) {
		struct ferry_table_params tp = { .num_keys = nkeys, .value_lens = lens };

		if (run->scheme == DP_SSP) {
			tp.consistency = FERRY_CONS_SSP;
			tp.staleness = o->staleness;
		}

		rc = ferry_table_create(fy, &tp, &t);
		if (!rc)
			rc = ferry_worker_create(fy, &wk);
		/* the starting weights (the table starts at zero) */
		if (!rc && r == 0)
			rc = ferry_set(wk, t, keys, nkeys, w);
		if (rc) {
			dp_fail(run, r, "table", rc);
			goto out;
		}
	}
	rc = ferry_barrier(fy);
	if (rc) {
		dp_fail(run, r, "barrier", rc);
		goto out;
	}
	clock0 = now_s();
	for (int it = 0; it <= o->iters; it++) {
		uint32_t b = batch[r];
		double t0, c0, step;

		if (it % o->eval_every == 0 || it == o->iters) {
			/* everybody waits while rank 0 evaluates: out of the clock */
			double e0 = now_s();

			rc = ferry_barrier(fy);
			if (!rc && r == 0) {
				struct dp_point *pt = &run->pts[run->npts++];

				pt->iter = it;
				pt->time_s = e0 - clock0 - paused;
				dp_eval(&run->model, run->test, w, &pt->loss, &pt->acc);
				memcpy(pt->batch, batch, sizeof(batch));
				if (run->time_to_target < 0 && pt->loss <= o->target_loss)
					run->time_to_target = pt->time_s;
			}
			if (!rc)
				rc = ferry_barrier(fy);
			if (rc) {
				dp_fail(run, r, "barrier", rc);
				goto out;
			}
			paused += now_s() - e0;
			if (it == o->iters)
				break;
		}
		/* the next b samples of this worker's shard (i = r, r + W, ...) */
		for (uint32_t k = 0; k < b; k++) {
			idx[k] = (uint32_t)((cursor % shard) * (size_t)W + (size_t)r);
			cursor++;
		}
		t0 = now_s();
		c0 = cpu_s();
		memset(buf, 0, (P + 2 + DP_MAX_WORKERS) * sizeof(float));
		buf[P] = (float)dp_grad(&run->model, d, w, idx, b, buf);
		buf[P + 1] = (float)b;
		dp_pace(o, r == o->strag_rank && it >= o->strag_from, t0, c0);
		if (o->jitter_p > 0 && (double)(rng = rng * 6364136223846793005ull + 1, rng >> 11) /
						       (double)(1ull << 53) <
					       o->jitter_p)
			sleep_s(o->jitter_ms * 1e-3 * (double)((rng >> 20) & 0xffff) / 65536.0);
		step = now_s() - t0;
		buf[P + 2 + r] = (float)(step / b);

		if (run->scheme == DP_PS) {
			/* the first barrier: every node pulled the last iteration's
			 * weights before anyone adds this one's gradient (without it a
			 * fast node's push can land before a slow node's pull, which
			 * then reads a weight from the future); the second: every
			 * push is applied before anyone pulls */
			for (size_t i = 0; i < P; i++)
				buf[i] *= -o->lr / (float)o->batch;
			rc = ferry_barrier(fy);
			if (!rc)
				rc = ferry_push(wk, t, keys, nkeys, buf);
			if (!rc)
				rc = ferry_barrier(fy);
			if (!rc)
				rc = ferry_pull(wk, t, keys, nkeys, w);
			if (rc) {
				dp_fail(run, r, "barrier, push, barrier, pull", rc);
				goto out;
			}
			continue;
		}
		if (run->scheme == DP_SSP) {
			/* buffered; ferry_clock sends it, then waits while the slowest
			 * worker is more than staleness clocks behind; the pull may be
			 * a copy that old, plus this node's own pushes */
			for (size_t i = 0; i < P; i++)
				buf[i] *= -o->lr / (float)o->batch;
			rc = ferry_push(wk, t, keys, nkeys, buf);
			if (!rc)
				rc = ferry_clock(wk);
			if (!rc)
				rc = ferry_pull(wk, t, keys, nkeys, w);
			if (rc) {
				dp_fail(run, r, "push, clock, pull", rc);
				goto out;
			}
			continue;
		}
		rc = ferry_allreduce(fy, buf, buf, P + 2 + (size_t)W, FERRY_FLOAT32, FERRY_SUM);
		if (rc) {
			dp_fail(run, r, "allreduce", rc);
			goto out;
		}
		for (size_t i = 0; i < P; i++)
			w[i] -= o->lr * buf[i] / buf[P + 1];
		if (run->scheme == DP_LBBSP) {
			for (int q = 0; q < W; q++)
				pred.observe(&pred, q, buf[P + 2 + q]);
			dp_lb_split(&pred, W, o->batch, batch);
		}
	}
out:
	if (wk)
		ferry_worker_destroy(wk);
	if (t)
		ferry_table_destroy(t);
	free(idx);
	free(lens);
	free(keys);
	free(w);
	free(buf);
	return NULL;
}

/*
 * Backup workers (Chen et al., "Revisiting distributed synchronous SGD"):
 * every iteration's update uses the gradients of the first W - b workers
 * that deliver; the others' come too late and are dropped. Over the
 * parameter store, rank 0 coordinating:
 *
 *   every worker: gradient at the weights of version t -> push into
 *                 accumulator key t mod K (the sums, then the sample count)
 *   rank 0:       pulls that key until it counts (W - b) batches, applies
 *                 the mean, zeroes key (t + K/2) mod K, sets the weights and
 *                 version t + 1
 *   the others:   poll the version (a 1-float key) until it passed t, pull
 *                 the weights, and go on from that version: a straggler
 *                 skips the iterations it missed
 *
 * A push that arrives more than K/2 - 1 iterations late would land in a
 * reused key: K = 16 leaves 7, where a 2x straggler is at most 1 behind.
 */
#define DP_ACC_KEYS 16

static void *dp_backup_worker(void *p)
{
	struct dp_arg *a = p;
	struct dp_run *run = a->run;
	const struct dp_opts *o = run->o;
	const struct dp_data *d = run->train;
	const int r = a->rank, W = o->workers;
	const size_t P = dp_params(&run->model);
	struct ferry *fy = run->fys[r];
	struct ferry_table *acc = NULL, *par = NULL;
	struct ferry_worker *wk = NULL;
	uint32_t batch[DP_MAX_WORKERS], *lens = malloc((P / DP_KEY_LEN + 3) * sizeof(uint32_t));
	uint32_t *idx = malloc(o->batch * sizeof(uint32_t));
	float *w = calloc(P + 1, sizeof(float)), *buf = calloc(P + 1, sizeof(float));
	uint64_t *keys = malloc((P / DP_KEY_LEN + 3) * sizeof(uint64_t));
	uint64_t rng = o->seed * 31 + (uint64_t)r;
	size_t nkeys = 0;
	size_t shard = (d->n - (size_t)r + (size_t)W - 1) / (size_t)W, cursor = 0;
	double clock0, paused = 0;
	int rc, t = 0;

	if (!idx || !w || !buf || !lens || !keys) {
		dp_fail(run, r, "memory", -ENOMEM);
		goto out;
	}
	dp_lb_split(NULL, W, o->batch, batch);
	dp_model_init(&run->model, w, o->seed);
	nkeys = dp_ps_layout(P, lens, keys, 1); /* key nkeys: the version */
	{
		struct ferry_table_params ap = { .num_keys = DP_ACC_KEYS,
						 .value_len = (uint32_t)P + 1 };
		struct ferry_table_params pp = { .num_keys = nkeys + 1, .value_lens = lens };

		rc = ferry_table_create(fy, &ap, &acc);
		if (!rc)
			rc = ferry_table_create(fy, &pp, &par);
		if (!rc)
			rc = ferry_worker_create(fy, &wk);
		if (!rc && r == 0)
			rc = ferry_set(wk, par, keys, nkeys, w);
		if (!rc)
			rc = ferry_barrier(fy);
		if (rc) {
			dp_fail(run, r, "tables", rc);
			goto out;
		}
	}
	clock0 = now_s();
	while (t <= o->iters) {
		uint64_t ak = (uint64_t)(t % DP_ACC_KEYS);
		double t0, c0;

		if (r == 0 && (t % o->eval_every == 0 || t == o->iters)) {
			double e0 = now_s();
			struct dp_point *pt = &run->pts[run->npts++];

			pt->iter = t;
			pt->time_s = e0 - clock0 - paused;
			dp_eval(&run->model, run->test, w, &pt->loss, &pt->acc);
			memcpy(pt->batch, batch, sizeof(batch));
			if (run->time_to_target < 0 && pt->loss <= o->target_loss)
				run->time_to_target = pt->time_s;
			paused += now_s() - e0;
		}
		if (t == o->iters)
			break;
		for (uint32_t k = 0; k < batch[r]; k++) {
			idx[k] = (uint32_t)((cursor % shard) * (size_t)W + (size_t)r);
			cursor++;
		}
		t0 = now_s();
		c0 = cpu_s();
		memset(buf, 0, (P + 1) * sizeof(float));
		dp_grad(&run->model, d, w, idx, batch[r], buf);
		buf[P] = (float)batch[r];
		dp_pace(o, r == o->strag_rank && t >= o->strag_from, t0, c0);
		if (o->jitter_p > 0 && (double)(rng = rng * 6364136223846793005ull + 1, rng >> 11) /
						       (double)(1ull << 53) <
					       o->jitter_p)
			sleep_s(o->jitter_ms * 1e-3 * (double)((rng >> 20) & 0xffff) / 65536.0);
		rc = ferry_push(wk, acc, &ak, 1, buf);
		if (rc) {
			dp_fail(run, r, "push of a gradient", rc);
			goto out;
		}
		if (r == 0) {
			uint64_t zk = (uint64_t)((t + DP_ACC_KEYS / 2) % DP_ACC_KEYS);
			const float need = (float)(W - o->backups) * (float)batch[0];

			do {
				rc = ferry_pull(wk, acc, &ak, 1, buf);
			} while (!rc && buf[P] < need && (sched_yield(), 1));
			for (size_t i = 0; i < P && !rc; i++)
				w[i] -= o->lr * buf[i] / buf[P];
			w[P] = (float)(t + 1); /* the version, key nkeys */
			memset(buf, 0, (P + 1) * sizeof(float));
			if (!rc)
				rc = ferry_set(wk, acc, &zk, 1, buf);
			/* the weights, then the version: a worker that sees the new
			 * version pulls after the weights' set completed, and sees them */
			if (!rc)
				rc = ferry_set(wk, par, keys, nkeys, w);
			if (!rc)
				rc = ferry_set(wk, par, &keys[nkeys], 1, &w[P]);
			t++;
		} else {
			uint64_t vk = nkeys;
			float v = 0;

			do {
				rc = ferry_pull(wk, par, &vk, 1, &v);
			} while (!rc && v < (float)(t + 1) && (sched_yield(), 1));
			if (!rc)
				rc = ferry_pull(wk, par, keys, nkeys + 1, w);
			t = (int)w[P];
		}
		if (rc) {
			dp_fail(run, r, "the update", rc);
			goto out;
		}
	}
	/* the others leave once rank 0 published the last version */
	rc = ferry_barrier(fy);
	if (rc)
		dp_fail(run, r, "last barrier", rc);
out:
	if (wk)
		ferry_worker_destroy(wk);
	if (par)
		ferry_table_destroy(par);
	if (acc)
		ferry_table_destroy(acc);
	free(lens);
	free(keys);
	free(idx);
	free(w);
	free(buf);
	return NULL;
}

/*
 * dp_launched - whether a launcher gave this process a rank in a world of
 * processes (the variables lib/core/config.c reads): then it is one node
 */
static int dp_launched(void)
{
	static const char *const vars[] = { "FERRY_WORLD", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE",
					    "PMI_SIZE" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *v = getenv(vars[i]);

		if (v && *v)
			return 1;
	}
	return 0;
}

/* run one scheme: every node of this process (threads) or this node alone */
static int dp_run_scheme(struct dp_run *run)
{
	const struct dp_opts *o = run->o;
	pthread_t th[DP_MAX_WORKERS];
	struct dp_arg args[DP_MAX_WORKERS];
	void *(*fn)(void *) = run->scheme == DP_BACKUP ? dp_backup_worker : dp_worker;
	int started = 0, rc;

	run->pts = calloc((size_t)o->iters / (size_t)o->eval_every + 2, sizeof(*run->pts));
	run->time_to_target = -1;
	if (!run->pts)
		return dp_fail(run, 0, "memory", -ENOMEM), -ENOMEM;
	if (run->me >= 0) {
		args[0] = (struct dp_arg){ .run = run, .rank = run->me };
		fn(&args[0]);
	} else {
		for (int r = 0; r < o->workers; r++) {
			args[r] = (struct dp_arg){ .run = run, .rank = r };
			rc = pthread_create(&th[r], NULL, fn, &args[r]);
			if (rc) {
				/* the others then fail at their first barrier (the timeout) */
				dp_fail(run, r, "pthread_create", -rc);
				break;
			}
			started++;
		}
		for (int r = 0; r < started; r++)
			pthread_join(th[r], NULL);
	}
	if (run->failed)
		fprintf(stderr, "ferry-dp: %s: %s\n", scheme_names[run->scheme], run->why);
	return run->failed ? -EIO : 0;
}

/* the document --json writes, through the tools' one writer (bench/common/bjson.h) */
static json_t *dp_json(const struct dp_opts *o, const char *data, struct dp_run *runs, int nruns,
		       int launched)
{
	json_t *root = json_object(), *strag = json_object(), *jit = json_object();
	json_t *jruns = json_array();

	if (!root || !strag || !jit || !jruns) {
		json_decref(root);
		json_decref(strag);
		json_decref(jit);
		json_decref(jruns);
		return NULL;
	}
	bjson_set_str(root, "program", "ferry-dp");
	bjson_set_str(root, "model", o->hidden ? "mlp" : "softmax regression");
	bjson_set_int(root, "hidden", (int64_t)o->hidden);
	bjson_set_str(root, "data", data);
	bjson_set_int(root, "workers", o->workers);
	bjson_set_int(root, "global_batch", o->batch);
	bjson_set_num(root, "lr", (double)o->lr);
	bjson_set_int(root, "iterations", o->iters);
	bjson_set(root, "straggler", strag);
	bjson_set_int(strag, "rank", o->strag_rank);
	bjson_set_num(strag, "factor", o->strag_factor);
	bjson_set_int(strag, "from", o->strag_from);
	bjson_set(root, "jitter", jit);
	bjson_set_num(jit, "p", o->jitter_p);
	bjson_set_num(jit, "ms", o->jitter_ms);
	bjson_set_num(root, "duty", o->duty);
	bjson_set_num(root, "target_loss", o->target_loss);
	bjson_set_num(root, "ema_alpha", o->ema_alpha);
	bjson_set_int(root, "staleness", o->staleness);
	bjson_set_str(root, "nodes", launched ? "processes" : "threads");
	bjson_set(root, "runs", jruns);
	for (int i = 0; i < nruns; i++) {
		const struct dp_run *run = &runs[i];
		json_t *jr = json_object(), *pts = json_array();

		if (bjson_append(jruns, jr)) {
			json_decref(pts);
			break;
		}
		bjson_set_str(jr, "scheme", scheme_names[run->scheme]);
		/* null: the target loss was never reached */
		bjson_set(jr, "time_to_target_s",
			  bjson_opt(run->time_to_target >= 0, run->time_to_target));
		bjson_set(jr, "points", pts);
		for (int k = 0; k < run->npts; k++) {
			const struct dp_point *pt = &run->pts[k];
			json_t *jp = json_object(), *batch = json_array();

			if (bjson_append(pts, jp)) {
				json_decref(batch);
				break;
			}
			bjson_set_int(jp, "iter", pt->iter);
			bjson_set_num(jp, "time_s", pt->time_s);
			bjson_set_num(jp, "test_loss", pt->loss);
			bjson_set_num(jp, "test_acc", pt->acc);
			bjson_set(jp, "batch", batch);
			for (int q = 0; q < o->workers; q++)
				bjson_append(batch, json_integer(pt->batch[q]));
		}
	}
	return root;
}

static void usage(void)
{
	printf("usage: ferry-dp [--scheme allreduce|ps|lbbsp|backup|ssp[,...]|all] [--workers N]\n"
	       "       [--iters N] [--batch GLOBAL] [--lr LR] [--eval-every N] [--target-loss L]\n"
	       "       [--data DIR | --images F --labels F --test-images F --test-labels F |\n"
	       "        --synthetic N] [--straggler RANK:FACTOR[:FROM]] [--jitter P:MS]\n"
	       "       [--duty D]\n"
	       "       [--ema-alpha A] [--backups B] [--model softmax|mlp] [--hidden N]\n"
	       "       [--staleness S] [--seed S] [--json FILE]\n"
	       "Defaults: all schemes, 4 workers, 1500 iterations, global batch 512, lr 0.2,\n"
	       "Fashion-MNIST from /usr/share/datasets/fashion-mnist (Debian's\n"
	       "dataset-fashion-mnist), no straggler, target test loss 0.5, evaluation every 50,\n"
	       "SSP staleness 3, --duty 1 (off; D < 1: every worker computes as on a machine D\n"
	       "times one core, its compute phases stretched by sleeping to CPU time / D). The workers are threads of this process, or, under a launcher\n"
	       "(mpirun, FERRY_RANK/FERRY_WORLD, torchrun), the launched processes (no --workers).\n");
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{ "scheme", required_argument, NULL, 's' },
		{ "workers", required_argument, NULL, 'w' },
		{ "iters", required_argument, NULL, 'i' },
		{ "batch", required_argument, NULL, 'b' },
		{ "lr", required_argument, NULL, 'l' },
		{ "eval-every", required_argument, NULL, 'e' },
		{ "target-loss", required_argument, NULL, 't' },
		{ "data", required_argument, NULL, 'd' },
		{ "images", required_argument, NULL, 'I' },
		{ "labels", required_argument, NULL, 'L' },
		{ "test-images", required_argument, NULL, 'J' },
		{ "test-labels", required_argument, NULL, 'K' },
		{ "synthetic", required_argument, NULL, 'S' },
		{ "straggler", required_argument, NULL, 'g' },
		{ "jitter", required_argument, NULL, 'j' },
		{ "duty", required_argument, NULL, 'D' },
		{ "seed", required_argument, NULL, 'r' },
		{ "ema-alpha", required_argument, NULL, 'a' },
		{ "backups", required_argument, NULL, 'B' },
		{ "model", required_argument, NULL, 'm' },
		{ "hidden", required_argument, NULL, 'H' },
		{ "json", required_argument, NULL, 'o' },
		{ "staleness", required_argument, NULL, 'T' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct dp_opts o = { .workers = 4,
			     .iters = 1500,
			     .eval_every = 50,
			     .batch = 512,
			     .lr = 0.2f,
			     .strag_rank = -1,
			     .strag_factor = 1,
			     .duty = 1,
			     .target_loss = 0.5,
			     .ema_alpha = 0.3,
			     .backups = 1,
			     .schemes = (1u << DP_NSCHEMES) - 1,
			     .seed = 1,
			     .staleness = 3 };
	const char *dir = "/usr/share/datasets/fashion-mnist";
	char ti[4096], tl[4096], vi[4096], vl[4096], data_name[4200];
	const char *images = NULL, *labels = NULL, *timages = NULL, *tlabels = NULL;
	size_t synthetic = 0;
	struct dp_data train, test;
	struct dp_run runs[DP_NSCHEMES];
	struct ferry *fys[DP_MAX_WORKERS] = { 0 };
	int opt, nruns = 0, bad = 0, me = -1, workers_set = 0, rc;

	while ((opt = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (opt) {
		case 's': /* a name, a comma-separated list of names, or all */
			o.schemes = 0;
			for (const char *q = optarg; *q;) {
				size_t len = strcspn(q, ",");
				unsigned before = o.schemes;

				for (int s = 0; s < DP_NSCHEMES; s++)
					if ((strlen(scheme_names[s]) == len &&
					     !strncmp(q, scheme_names[s], len)) ||
					    (len == 3 && !strncmp(q, "all", 3)))
						o.schemes |= 1u << s;
				if (o.schemes == before) {
					fprintf(stderr,
						"ferry-dp: --scheme: unknown scheme '%.*s'\n",
						(int)len, q);
					return 2;
				}
				q += len + (q[len] == ',');
			}
			break;
		case 'w':
			o.workers = atoi(optarg);
			workers_set = 1;
			break;
		case 'i':
			o.iters = atoi(optarg);
			break;
		case 'b':
			o.batch = (uint32_t)atoi(optarg);
			break;
		case 'l':
			o.lr = strtof(optarg, NULL);
			break;
		case 'e':
			o.eval_every = atoi(optarg);
			break;
		case 't':
			o.target_loss = strtod(optarg, NULL);
			break;
		case 'd':
			dir = optarg;
			break;
		case 'I':
			images = optarg;
			break;
		case 'L':
			labels = optarg;
			break;
		case 'J':
			timages = optarg;
			break;
		case 'K':
			tlabels = optarg;
			break;
		case 'S':
			synthetic = (size_t)atol(optarg);
			break;
		case 'g':
			if (sscanf(optarg, "%d:%lf:%d", &o.strag_rank, &o.strag_factor,
				   &o.strag_from) < 2) {
				fprintf(stderr, "ferry-dp: --straggler wants RANK:FACTOR[:FROM]\n");
				return 2;
			}
			break;
		case 'j':
			if (sscanf(optarg, "%lf:%lf", &o.jitter_p, &o.jitter_ms) != 2) {
				fprintf(stderr, "ferry-dp: --jitter wants P:MS\n");
				return 2;
			}
			break;
		case 'D':
			o.duty = strtod(optarg, NULL);
			break;
		case 'r':
			o.seed = strtoull(optarg, NULL, 10);
			break;
		case 'a':
			o.ema_alpha = strtod(optarg, NULL);
			break;
		case 'B':
			o.backups = atoi(optarg);
			break;
		case 'm':
			if (!strcmp(optarg, "mlp"))
				o.hidden = o.hidden ? o.hidden : 64;
			else if (!strcmp(optarg, "softmax"))
				o.hidden = 0;
			else {
				fprintf(stderr, "ferry-dp: --model wants softmax or mlp\n");
				return 2;
			}
			break;
		case 'H':
			o.hidden = (size_t)atol(optarg);
			break;
		case 'o':
			o.json = optarg;
			break;
		case 'T':
			o.staleness = (uint32_t)strtoul(optarg, NULL, 10);
			if (o.staleness > 1000000) {
				fprintf(stderr,
					"ferry-dp: --staleness wants 0 .. 1000000 clocks\n");
				return 2;
			}
			break;
		case 'h':
			usage();
			return 0;
		default:
			usage();
			return 2;
		}
	}
	if (dp_launched()) {
		/* one node of a launched world: its rank and size are the launcher's */
		struct ferry *node;

		rc = ferry_open(NULL, &node);
		if (rc) {
			fprintf(stderr, "ferry-dp: ferry_open: %s\n", ferry_strerror(rc));
			return 1;
		}
		if (ferry_world(node) > DP_MAX_WORKERS ||
		    (workers_set && o.workers != ferry_world(node))) {
			fprintf(stderr,
				"ferry-dp: the launcher started %d processes; at most %d, and "
				"leave --workers out under a launcher (it said %d)\n",
				ferry_world(node), DP_MAX_WORKERS, o.workers);
			ferry_close(node);
			return 2;
		}
		me = ferry_rank(node);
		fys[me] = node;
		o.workers = ferry_world(node);
	}
	if (o.workers < 1 || o.workers > DP_MAX_WORKERS || o.iters < 1 || o.eval_every < 1 ||
	    o.batch < (uint32_t)o.workers || !o.schemes || o.strag_factor < 1 ||
	    !(o.duty > 0 && o.duty <= 1) || o.strag_rank >= o.workers || o.ema_alpha <= 0 ||
	    o.ema_alpha > 1 || o.backups < 0 ||
	    (o.backups >= o.workers && (o.schemes & (1u << DP_BACKUP)))) {
		fprintf(stderr,
			"ferry-dp: bad options: 1 .. %d workers, a global batch of at least "
			"one sample per worker, a straggler factor >= 1 on a worker that "
			"exists, a duty in (0, 1], an EMA alpha in (0, 1], fewer backups than workers (backup)\n",
			DP_MAX_WORKERS);
		if (me >= 0)
			ferry_close(fys[me]);
		return 2;
	}
	if (synthetic) {
		dp_synthetic(&train, synthetic, 784, o.seed);
		dp_synthetic(&test, synthetic / 6 + 1, 784, o.seed);
		snprintf(data_name, sizeof(data_name), "synthetic %zu x 784", synthetic);
		if (!train.x || !test.x) {
			bad = 1;
			goto close;
		}
	} else {
		if (!images) {
			snprintf(ti, sizeof(ti), "%s/train-images-idx3-ubyte.gz", dir);
			snprintf(tl, sizeof(tl), "%s/train-labels-idx1-ubyte.gz", dir);
			snprintf(vi, sizeof(vi), "%s/t10k-images-idx3-ubyte.gz", dir);
			snprintf(vl, sizeof(vl), "%s/t10k-labels-idx1-ubyte.gz", dir);
			images = ti, labels = tl, timages = vi, tlabels = vl;
		}
		if (!labels || !timages || !tlabels) {
			fprintf(stderr, "ferry-dp: --images needs --labels, --test-images and "
					"--test-labels\n");
			bad = 2;
			goto close;
		}
		if (dp_load_idx(images, labels, &train) || dp_load_idx(timages, tlabels, &test)) {
			fprintf(stderr,
				"ferry-dp: no data; install Debian's dataset-fashion-mnist, "
				"give --data DIR or --images ..., or use --synthetic N\n");
			bad = 1;
			goto close;
		}
		snprintf(data_name, sizeof(data_name), "%s", images);
	}
	if (train.dim != test.dim || train.n < (size_t)o.workers) {
		fprintf(stderr, "ferry-dp: training and test sets differ in features, or too few "
				"samples\n");
		bad = 1;
		goto free_data;
	}
	if (me < 0) {
		struct ferry_params p;

		ferry_params_init(&p);
		p.transport = FERRY_TRANSPORT_TCP;
		rc = ferry_local_cluster_open(o.workers, &p, fys);
		if (rc) {
			fprintf(stderr, "ferry-dp: cluster: %s\n", ferry_strerror(rc));
			bad = 1;
			goto free_data;
		}
	}
	if (me > 0) /* rank 0 reports; the others only train */
		goto run;
	printf("# ferry-dp: %s, %s, %zu training / %zu test samples, %d workers, global batch %u, "
	       "lr %g, straggler %d x%g from %d, jitter %g:%gms, duty %g, LB-BSP EMA alpha %g, SSP "
	       "staleness %u, nodes as %s\n",
	       o.hidden ? "MLP" : "softmax regression", data_name, train.n, test.n, o.workers,
	       o.batch, (double)o.lr, o.strag_rank, o.strag_factor, o.strag_from, o.jitter_p,
	       o.jitter_ms, o.duty, o.ema_alpha, o.staleness, me >= 0 ? "processes" : "threads");
	printf("# %-10s %6s %9s %9s %8s  batches\n", "scheme", "iter", "time_s", "test_loss",
	       "test_acc");
	fflush(stdout);
run:
	for (int s = 0; s < DP_NSCHEMES; s++) {
		struct dp_run *run = &runs[nruns];

		if (!(o.schemes & (1u << s)))
			continue;
		memset(run, 0, sizeof(*run));
		run->o = &o;
		run->train = &train;
		run->model = (struct dp_model){ .dim = train.dim, .hidden = o.hidden };
		run->test = &test;
		run->scheme = (enum dp_scheme)s;
		run->fys = fys;
		run->me = me;
		nruns++;
		if (dp_run_scheme(run)) {
			/* the nodes are out of step now: the later schemes would fail too */
			bad = 1;
			break;
		}
		if (me > 0)
			continue;
		for (int k = 0; k < run->npts; k++) {
			const struct dp_point *pt = &run->pts[k];

			printf("  %-10s %6d %9.3f %9.4f %8.4f  [", scheme_names[s], pt->iter,
			       pt->time_s, pt->loss, pt->acc);
			for (int q = 0; q < o.workers; q++)
				printf("%u%s", pt->batch[q], q + 1 < o.workers ? " " : "]\n");
		}
		printf("# %s: test loss %.3f reached after %.3f s (-1: never)\n", scheme_names[s],
		       o.target_loss, run->time_to_target);
		fflush(stdout);
	}
	if (nruns > 1 && me <= 0) {
		double base = -1;

		for (int i = 0; i < nruns; i++)
			if (runs[i].scheme == DP_ALLREDUCE)
				base = runs[i].time_to_target;
		for (int i = 0; i < nruns && base > 0; i++)
			if (runs[i].time_to_target > 0)
				printf("# %s: %.2fx sooner than allreduce (BSP)\n",
				       scheme_names[runs[i].scheme], base / runs[i].time_to_target);
	}
	if (o.json && me <= 0) {
		json_t *doc = dp_json(&o, data_name, runs, nruns, me >= 0);

		if (bjson_write(doc, o.json, "ferry-dp"))
			bad = 1;
		json_decref(doc);
	}
	for (int i = 0; i < nruns; i++)
		free(runs[i].pts);
free_data:
	dp_data_free(&train);
	dp_data_free(&test);
close:
	for (int r = 0; r < o.workers; r++)
		if (fys[r])
			ferry_close(fys[r]);
	return bad;
}

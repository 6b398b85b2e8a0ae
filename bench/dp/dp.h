/* SPDX-License-Identifier: MIT */
/*
 * dp.h - ferry-dp, synchronous data-parallel training (issue 18, items 3
 * and 4): softmax regression on Fashion-MNIST (or any idx files, or a
 * generated set), trained by SGD with all-reduce, by SGD through the
 * parameter store (BSP and SSP), and by LB-BSP (batch sizes balanced from measured
 * speed), with a straggler injected on purpose.
 *
 *   model.c   data (idx files, gzip'd or not; a generated set), the model's
 *             gradient and its evaluation, the speed predictors, the LB-BSP
 *             batch split: no Ferry call (tests/unit/test_dp.c uses it)
 *   main.c    options, the schemes, the nodes as threads or processes, JSON
 */
#ifndef FERRY_BENCH_DP_H
#define FERRY_BENCH_DP_H

#include <stddef.h>
#include <stdint.h>

#define DP_CLASSES 10
#define DP_MAX_WORKERS 16

struct dp_data {
	size_t n;   /* samples */
	size_t dim; /* features per sample, the bias not included */
	float *x;   /* n x dim, in [0, 1] */
	uint8_t *y; /* n labels, < DP_CLASSES */
};

/*
 * The model: softmax regression (hidden 0: DP_CLASSES rows of dim + 1
 * weights, the last a bias) or a small MLP (hidden > 0: a ReLU layer of
 * hidden rows of dim + 1, then DP_CLASSES rows of hidden + 1), its
 * parameters one flat array.
 */
struct dp_model {
	size_t dim;
	size_t hidden;
};

static inline size_t dp_params(const struct dp_model *m)
{
	return m->hidden ? m->hidden * (m->dim + 1) + DP_CLASSES * (m->hidden + 1) :
			   DP_CLASSES * (m->dim + 1);
}

/* starting weights, the same on every worker for one @seed: zeros for the
 * softmax, Glorot-uniform for the MLP (zeros would keep its units alike) */
void dp_model_init(const struct dp_model *m, float *w, uint64_t seed);

/* read an idx3 image file and its idx1 label file (gzip'd when the name
 * ends in .gz; through gzip -dc); pixels scaled to [0, 1]. 0 or -errno with
 * a message on stderr */
int dp_load_idx(const char *images, const char *labels, struct dp_data *d);
/* a generated set: DP_CLASSES clusters in [0, 1]^dim, from @seed */
void dp_synthetic(struct dp_data *d, size_t n, size_t dim, uint64_t seed);
void dp_data_free(struct dp_data *d);

/*
 * dp_grad - add the gradient of the summed cross-entropy over samples
 * @idx[0 .. n) of @d at weights @w to @g (dp_params(m) floats), and return
 * the summed loss. The mean over a batch is g / n: the sum of per-worker
 * sums divided by the global batch is the full batch's mean gradient,
 * whatever the split (LB-BSP's weighting by batch size).
 */
double dp_grad(const struct dp_model *m, const struct dp_data *d, const float *w,
	       const uint32_t *idx, size_t n, float *g);
/* mean loss and accuracy of @w over the whole of @d */
void dp_eval(const struct dp_model *m, const struct dp_data *d, const float *w, double *loss_p,
	     double *acc_p);

/*
 * Speed predictors (pluggable): observe a worker's measured seconds per
 * sample after an iteration, predict the next. Every worker runs the same
 * predictor on the same (all-reduced) observations, so all agree.
 */
struct dp_predictor {
	const char *name;
	void (*observe)(struct dp_predictor *p, int worker, double sec_per_sample);
	double (*predict)(const struct dp_predictor *p, int worker); /* 0: no estimate yet */
	double alpha;
	double est[DP_MAX_WORKERS];
};

/* exponential moving average: est = alpha obs + (1 - alpha) est */
void dp_predictor_ema_init(struct dp_predictor *p, double alpha);

/* LB-BSP: split @global samples over @workers by predicted speed (1 / time
 * per sample), at least 1 each, summing exactly to @global (largest
 * remainders); an even split while any estimate is missing */
void dp_lb_split(const struct dp_predictor *p, int workers, uint32_t global, uint32_t *batch);

#endif /* FERRY_BENCH_DP_H */

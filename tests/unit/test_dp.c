/* SPDX-License-Identifier: MIT */
/*
 * Unit: ferry-dp's math (bench/dp/model.c). Both models' gradients against
 * finite differences of their loss. LB-BSP's weighted aggregation
 * (per-worker gradient sums over uneven batches, summed and divided by the
 * global batch) equals the full batch's mean gradient; the split sums to the
 * global batch and follows the workers' speeds; the EMA predictor converges.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"

Test(dp, lbbsp_weighted_aggregation_equals_the_full_batch_gradient)
{
	struct dp_data d;
	const struct dp_model m = { .dim = 64 };
	const size_t P = dp_params(&m);
	const uint32_t batch[4] = { 7, 61, 1, 31 }; /* 100 samples, unevenly split */
	float *w = malloc(P * sizeof(float)), *full = calloc(P, sizeof(float));
	float *agg = calloc(P, sizeof(float)), *part = malloc(P * sizeof(float));
	uint32_t idx[100];
	double loss_full, loss_agg = 0;
	uint32_t off = 0;

	dp_synthetic(&d, 500, 64, 7);
	cr_assert_not_null(d.x);
	for (size_t i = 0; i < P; i++)
		w[i] = (float)((int)(i % 13) - 6) * 0.01f;
	for (uint32_t i = 0; i < 100; i++)
		idx[i] = (i * 37) % 500;
	loss_full = dp_grad(&m, &d, w, idx, 100, full);
	for (int r = 0; r < 4; r++) {
		/* worker r: its own mean gradient, weighted by its share b_r / B */
		memset(part, 0, P * sizeof(float));
		loss_agg += dp_grad(&m, &d, w, idx + off, batch[r], part);
		for (size_t i = 0; i < P; i++)
			agg[i] += (part[i] / (float)batch[r]) * ((float)batch[r] / 100.0f);
		off += batch[r];
	}
	cr_assert_eq(off, 100);
	cr_assert(fabs(loss_full - loss_agg) < 1e-6 * fabs(loss_full), "loss %g vs %g", loss_full,
		  loss_agg);
	for (size_t i = 0; i < P; i++)
		cr_assert(fabsf(full[i] / 100.0f - agg[i]) <= 1e-5f + 1e-4f * fabsf(agg[i]),
			  "parameter %zu: full batch %g, weighted %g", i, full[i] / 100.0f, agg[i]);
	free(w);
	free(full);
	free(agg);
	free(part);
	dp_data_free(&d);
}

Test(dp, the_split_sums_to_the_global_batch_and_follows_speed)
{
	struct dp_predictor p;
	uint32_t b[4], sum = 0;

	dp_predictor_ema_init(&p, 0.5);
	dp_lb_split(&p, 4, 513, b); /* no estimate yet: even */
	cr_assert(b[0] == 129 && b[1] == 128 && b[2] == 128 && b[3] == 128);
	for (int it = 0; it < 20; it++)
		for (int r = 0; r < 4; r++)
			p.observe(&p, r, r == 3 ? 2e-5 : 1e-5); /* worker 3 twice as slow */
	cr_assert(fabs(p.predict(&p, 3) - 2e-5) < 1e-9, "the EMA converges: %g", p.predict(&p, 3));
	dp_lb_split(&p, 4, 512, b);
	for (int r = 0; r < 4; r++)
		sum += b[r];
	cr_assert_eq(sum, 512);
	/* speeds 1 : 1 : 1 : 0.5 -> 146.3 x 3 and 73.1 */
	cr_assert(b[3] >= 72 && b[3] <= 75, "the slow worker gets %u", b[3]);
	cr_assert(b[0] >= 145 && b[0] <= 148, "a fast worker gets %u", b[0]);
	dp_lb_split(&p, 4, 4, b); /* at least one each */
	cr_assert(b[0] == 1 && b[1] == 1 && b[2] == 1 && b[3] == 1);
}

/* the summed loss over @n samples at @w (dp_grad's return) */
static double loss_at(const struct dp_model *m, const struct dp_data *d, const float *w,
		      const uint32_t *idx, size_t n, float *scratch)
{
	return dp_grad(m, d, w, idx, n, scratch);
}

static void check_gradient(size_t hidden)
{
	struct dp_data d;
	const struct dp_model m = { .dim = 20, .hidden = hidden };
	const size_t P = dp_params(&m);
	float *w = malloc(P * sizeof(float)), *g = calloc(P, sizeof(float));
	float *scratch = calloc(P, sizeof(float));
	uint32_t idx[8] = { 0, 3, 5, 8, 13, 21, 34, 55 };
	int checked = 0;

	dp_synthetic(&d, 64, 20, 3);
	dp_model_init(&m, w, 11);
	for (size_t i = 0; i < P; i++)
		w[i] += 0.05f * (float)((int)(i % 7) - 3); /* away from zero: ReLUs both ways */
	dp_grad(&m, &d, w, idx, 8, g);
	for (size_t i = 0; i < P; i += 1 + P / 97) {
		const float h = 1e-2f, w0 = w[i];
		double up, down, num;

		w[i] = w0 + h;
		up = loss_at(&m, &d, w, idx, 8, scratch);
		w[i] = w0 - h;
		down = loss_at(&m, &d, w, idx, 8, scratch);
		w[i] = w0;
		num = (up - down) / (2 * h);
		cr_assert(fabs(num - g[i]) <= 2e-2 * (1 + fabs(num)),
			  "hidden %zu, parameter %zu of %zu: analytic %g, numeric %g", hidden, i, P,
			  (double)g[i], num);
		checked++;
	}
	cr_assert_gt(checked, 50);
	free(w);
	free(g);
	free(scratch);
	dp_data_free(&d);
}

Test(dp, the_softmax_gradient_matches_finite_differences)
{
	check_gradient(0);
}

Test(dp, the_mlp_gradient_matches_finite_differences)
{
	check_gradient(6);
}

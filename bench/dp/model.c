/* SPDX-License-Identifier: MIT */
/* model.c - ferry-dp's data, model, predictors and batch split (dp.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"

/* ---- data --------------------------------------------------------------- */

static FILE *dp_open(const char *path, int *piped)
{
	size_t len = strlen(path);
	char cmd[4200];

	*piped = len > 3 && !strcmp(path + len - 3, ".gz");
	if (!*piped)
		return fopen(path, "rb");
	if (strchr(path, '\'') || len > 4000)
		return NULL;
	snprintf(cmd, sizeof(cmd), "gzip -dc '%s'", path);
	return popen(cmd, "r");
}

static void dp_close(FILE *f, int piped)
{
	if (piped)
		pclose(f);
	else
		fclose(f);
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int dp_load_idx(const char *images, const char *labels, struct dp_data *d)
{
	uint8_t hdr[16], *buf = NULL;
	int pi, pl, rc = -EINVAL;
	FILE *fi = dp_open(images, &pi), *fl = dp_open(labels, &pl);
	size_t n, dim;

	memset(d, 0, sizeof(*d));
	if (!fi || !fl) {
		fprintf(stderr, "ferry-dp: cannot open %s or %s\n", images, labels);
		goto out;
	}
	if (fread(hdr, 1, 16, fi) != 16 || be32(hdr) != 0x803) {
		fprintf(stderr, "ferry-dp: %s is not an idx3 image file\n", images);
		goto out;
	}
	n = be32(hdr + 4);
	dim = (size_t)be32(hdr + 8) * be32(hdr + 12);
	if (!n || !dim || dim > (1u << 20) || n > (1u << 26)) {
		fprintf(stderr, "ferry-dp: %s: %zu images of %zu pixels?\n", images, n, dim);
		goto out;
	}
	if (fread(hdr, 1, 8, fl) != 8 || be32(hdr) != 0x801 || be32(hdr + 4) != n) {
		fprintf(stderr, "ferry-dp: %s is not the idx1 label file of %zu images\n", labels,
			n);
		goto out;
	}
	buf = malloc(n * dim);
	d->x = malloc(n * dim * sizeof(float));
	d->y = malloc(n);
	if (!buf || !d->x || !d->y) {
		rc = -ENOMEM;
		goto out;
	}
	if (fread(buf, 1, n * dim, fi) != n * dim || fread(d->y, 1, n, fl) != n) {
		fprintf(stderr, "ferry-dp: %s or %s is shorter than its header says\n", images,
			labels);
		goto out;
	}
	for (size_t i = 0; i < n * dim; i++)
		d->x[i] = (float)buf[i] / 255.0f;
	for (size_t i = 0; i < n; i++)
		if (d->y[i] >= DP_CLASSES) {
			fprintf(stderr, "ferry-dp: %s: label %u of image %zu is not below %d\n",
				labels, d->y[i], i, DP_CLASSES);
			goto out;
		}
	d->n = n;
	d->dim = dim;
	rc = 0;
out:
	free(buf);
	if (fi)
		dp_close(fi, pi);
	if (fl)
		dp_close(fl, pl);
	if (rc)
		dp_data_free(d);
	return rc;
}

static uint64_t dp_rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float dp_unit(uint64_t *s)
{
	return (float)(dp_rng(s) >> 40) / (float)(1u << 24);
}

void dp_synthetic(struct dp_data *d, size_t n, size_t dim, uint64_t seed)
{
	float *centers = malloc(DP_CLASSES * dim * sizeof(float));
	uint64_t s = seed;

	d->n = n;
	d->dim = dim;
	d->x = malloc(n * dim * sizeof(float));
	d->y = malloc(n);
	if (!centers || !d->x || !d->y) {
		free(centers);
		dp_data_free(d);
		return;
	}
	for (size_t i = 0; i < DP_CLASSES * dim; i++)
		centers[i] = dp_unit(&s);
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)(dp_rng(&s) % DP_CLASSES);

		d->y[i] = c;
		for (size_t j = 0; j < dim; j++) {
			float v = centers[c * dim + j] + (dp_unit(&s) - 0.5f) * 1.5f;

			d->x[i * dim + j] = v < 0 ? 0 : v > 1 ? 1 : v;
		}
	}
	free(centers);
}

void dp_data_free(struct dp_data *d)
{
	free(d->x);
	free(d->y);
	memset(d, 0, sizeof(*d));
}

/* ---- model -------------------------------------------------------------- */

void dp_model_init(const struct dp_model *m, float *w, uint64_t seed)
{
	size_t P = dp_params(m), n1;
	uint64_t s = seed ^ 0x5eed;
	float a1, a2;

	memset(w, 0, P * sizeof(float));
	if (!m->hidden)
		return;
	n1 = m->hidden * (m->dim + 1);
	a1 = sqrtf(6.0f / (float)(m->dim + m->hidden));
	a2 = sqrtf(6.0f / (float)(m->hidden + DP_CLASSES));
	for (size_t i = 0; i < P; i++)
		w[i] = (2 * dp_unit(&s) - 1) * (i < n1 ? a1 : a2);
}

/* probabilities of sample @x into @z (softmax of @DP_CLASSES rows of @in
 * inputs + bias at @w over @x); returns -log p[y] */
static double dp_softmax(const float *w, const float *x, size_t in, uint8_t y, float *z)
{
	float mx = -INFINITY, sum = 0;

	for (int c = 0; c < DP_CLASSES; c++) {
		const float *wc = w + (size_t)c * (in + 1);
		float acc = wc[in];

		for (size_t j = 0; j < in; j++)
			acc += wc[j] * x[j];
		z[c] = acc;
		if (acc > mx)
			mx = acc;
	}
	for (int c = 0; c < DP_CLASSES; c++) {
		z[c] = expf(z[c] - mx);
		sum += z[c];
	}
	for (int c = 0; c < DP_CLASSES; c++)
		z[c] /= sum;
	return -log((double)z[y] + 1e-30);
}

/* the MLP's hidden layer: h = relu(W1 x + b1) */
static void dp_hidden(const struct dp_model *m, const float *w, const float *x, float *h)
{
	for (size_t j = 0; j < m->hidden; j++) {
		const float *wj = w + j * (m->dim + 1);
		float acc = wj[m->dim];

		for (size_t k = 0; k < m->dim; k++)
			acc += wj[k] * x[k];
		h[j] = acc > 0 ? acc : 0;
	}
}

/* probabilities into @z, the hidden layer into @h (MLP); -log p[y] */
static double dp_forward(const struct dp_model *m, const float *w, const float *x, uint8_t y,
			 float *h, float *z)
{
	if (!m->hidden)
		return dp_softmax(w, x, m->dim, y, z);
	dp_hidden(m, w, x, h);
	return dp_softmax(w + m->hidden * (m->dim + 1), h, m->hidden, y, z);
}

/* g += the gradient of a softmax layer over input @x of @in (+ bias), its
 * output error @e; @dx (may be NULL) += the error back at the input */
static void dp_back_softmax(const float *w, const float *x, size_t in, const float *e, float *g,
			    float *dx)
{
	for (int c = 0; c < DP_CLASSES; c++) {
		float *gc = g + (size_t)c * (in + 1);
		const float *wc = w + (size_t)c * (in + 1);

		for (size_t j = 0; j < in; j++)
			gc[j] += e[c] * x[j];
		gc[in] += e[c];
		if (dx)
			for (size_t j = 0; j < in; j++)
				dx[j] += wc[j] * e[c];
	}
}

double dp_grad(const struct dp_model *m, const struct dp_data *d, const float *w,
	       const uint32_t *idx, size_t n, float *g)
{
	const size_t dim = d->dim, H = m->hidden, n1 = H * (dim + 1);
	float z[DP_CLASSES], e[DP_CLASSES];
	float *h = H ? malloc(2 * H * sizeof(float)) : NULL, *dh = h ? h + H : NULL;
	double loss = 0;

	if (H && !h)
		return NAN;
	for (size_t k = 0; k < n; k++) {
		const float *x = d->x + (size_t)idx[k] * dim;
		uint8_t y = d->y[idx[k]];

		loss += dp_forward(m, w, x, y, h, z);
		for (int c = 0; c < DP_CLASSES; c++)
			e[c] = z[c] - (c == y ? 1.0f : 0.0f);
		if (!H) {
			dp_back_softmax(w, x, dim, e, g, NULL);
			continue;
		}
		memset(dh, 0, H * sizeof(float));
		dp_back_softmax(w + n1, h, H, e, g + n1, dh);
		for (size_t j = 0; j < H; j++) {
			float *gj = g + j * (dim + 1);

			if (h[j] <= 0)
				continue; /* ReLU: no gradient through an inactive unit */
			for (size_t q = 0; q < dim; q++)
				gj[q] += dh[j] * x[q];
			gj[dim] += dh[j];
		}
	}
	free(h);
	return loss;
}

void dp_eval(const struct dp_model *m, const struct dp_data *d, const float *w, double *loss_p,
	     double *acc_p)
{
	float z[DP_CLASSES], *h = m->hidden ? malloc(m->hidden * sizeof(float)) : NULL;
	double loss = 0;
	size_t right = 0;

	for (size_t i = 0; i < d->n && (!m->hidden || h); i++) {
		int best = 0;

		loss += dp_forward(m, w, d->x + i * d->dim, d->y[i], h, z);
		for (int c = 1; c < DP_CLASSES; c++)
			if (z[c] > z[best])
				best = c;
		right += best == d->y[i];
	}
	free(h);
	*loss_p = d->n ? loss / (double)d->n : 0;
	*acc_p = d->n ? (double)right / (double)d->n : 0;
}

/* ---- predictors and the split ------------------------------------------ */

static void dp_ema_observe(struct dp_predictor *p, int worker, double t)
{
	if (t <= 0)
		return;
	p->est[worker] = p->est[worker] > 0 ? p->alpha * t + (1 - p->alpha) * p->est[worker] : t;
}

static double dp_ema_predict(const struct dp_predictor *p, int worker)
{
	return p->est[worker];
}

void dp_predictor_ema_init(struct dp_predictor *p, double alpha)
{
	memset(p, 0, sizeof(*p));
	p->name = "ema";
	p->alpha = alpha;
	p->observe = dp_ema_observe;
	p->predict = dp_ema_predict;
}

void dp_lb_split(const struct dp_predictor *p, int workers, uint32_t global, uint32_t *batch)
{
	double speed[DP_MAX_WORKERS], total = 0, frac[DP_MAX_WORKERS];
	uint32_t given = 0;

	for (int r = 0; r < workers; r++) {
		double t = p ? p->predict(p, r) : 0;

		if (t <= 0) {
			/* no estimate yet: even */
			for (int q = 0; q < workers; q++)
				batch[q] = global / (uint32_t)workers +
					   ((uint32_t)q < global % (uint32_t)workers);
			return;
		}
		speed[r] = 1.0 / t;
		total += speed[r];
	}
	for (int r = 0; r < workers; r++) {
		double share = (double)(global - (uint32_t)workers) * speed[r] / total;

		batch[r] = 1 + (uint32_t)share;
		frac[r] = share - floor(share);
		given += batch[r];
	}
	/* the samples left go to the largest remainders (lowest rank on a tie) */
	while (given < global) {
		int best = 0;

		for (int r = 1; r < workers; r++)
			if (frac[r] > frac[best])
				best = r;
		batch[best]++;
		frac[best] = -1;
		given++;
	}
}

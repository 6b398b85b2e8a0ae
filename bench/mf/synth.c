/* SPDX-License-Identifier: MIT */
/*
 * synth.c - synthetic low-rank matrices and the train/test split.
 *
 * Every random choice comes from a stream of its own (mf_rng_init(seed,
 * stream)): the factor row of W* for row i from stream i, H* from streams
 * after the rows, the entry positions and noise from one more stream each
 * for the training and the test set. So the output depends on the
 * parameters only, and the test set does not change with the training nnz.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "mf.h"

double mf_rng_normal(struct mf_rng *r)
{
	double u = 1.0 - mf_rng_uniform(r); /* (0, 1]: log() stays finite */
	double v = mf_rng_uniform(r);

	return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static int synth_fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int synth_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* an unsigned decimal at *s, at least 1, at most @max; advances *s */
static int synth_uint(const char **s, uint64_t max, uint64_t *v_p)
{
	unsigned long long v;
	char *end;

	if (**s < '0' || **s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(*s, &end, 10);
	if (errno || v < 1 || v > max)
		return -EINVAL;
	*s = end;
	*v_p = v;
	return 0;
}

int mf_synth_parse(const char *spec, struct mf_synth_params *p, char *err, size_t errlen)
{
	const char *s = spec;
	uint64_t rows, cols, nnz, rank = p->rank;
	double noise = p->noise;
	char *end;

	if (synth_uint(&s, MF_MAX_DIM, &rows) || (*s != 'x' && *s != 'X'))
		goto bad;
	s++;
	if (synth_uint(&s, MF_MAX_DIM, &cols) || *s != ':')
		goto bad;
	s++;
	if (synth_uint(&s, SIZE_MAX / sizeof(struct mf_entry), &nnz))
		goto bad;
	if (*s == ':') {
		s++;
		if (synth_uint(&s, 65536, &rank))
			goto bad;
	}
	if (*s == ':') {
		s++;
		errno = 0;
		noise = strtod(s, &end);
		if (end == s || errno || !isfinite(noise) || noise < 0)
			goto bad;
		s = end;
	}
	if (*s)
		goto bad;
	p->rows = rows;
	p->cols = cols;
	p->nnz = nnz;
	p->rank = (uint32_t)rank;
	p->noise = noise;
	return 0;
bad:
	return synth_fail(
		err, errlen,
		"bad synthetic spec '%s': expected ROWSxCOLS:NNZ[:RANK[:NOISE]] with "
		"positive integers (rows and columns at most %" PRIu64
		", rank at most 65536) and a noise stddev >= 0, e.g. 10000x1000:200000:8:0.1",
		spec, MF_MAX_DIM);
}

/* @n rows of @rank N(0, 1/sqrt(rank)) values, row k from stream @stream0 + k */
static float *synth_factors(uint64_t n, uint32_t rank, uint64_t seed, uint64_t stream0)
{
	double sd = pow((double)rank, -0.25);
	float *f = malloc(n * rank * sizeof(*f));
	struct mf_rng r;

	if (!f)
		return NULL;
	for (uint64_t k = 0; k < n; k++) {
		mf_rng_init(&r, seed, stream0 + k);
		for (uint32_t d = 0; d < rank; d++)
			f[k * rank + d] = (float)(sd * mf_rng_normal(&r));
	}
	return f;
}

static int synth_entries(const struct mf_synth_params *p, const float *w, const float *h,
			 size_t nnz, uint64_t stream, struct mf_matrix *m_p)
{
	struct mf_matrix m = { .rows = p->rows, .cols = p->cols, .nnz = nnz };
	struct mf_rng r;

	m.e = malloc((nnz ? nnz : 1) * sizeof(*m.e));
	if (!m.e)
		return -ENOMEM;
	mf_rng_init(&r, p->seed, stream);
	for (size_t k = 0; k < nnz; k++) {
		uint32_t i = (uint32_t)mf_rng_below(&r, p->rows);
		uint32_t j = (uint32_t)mf_rng_below(&r, p->cols);
		const float *wi = w + (size_t)i * p->rank, *hj = h + (size_t)j * p->rank;
		double dot = 0;

		for (uint32_t d = 0; d < p->rank; d++)
			dot += (double)wi[d] * hj[d];
		m.e[k].i = i;
		m.e[k].j = j;
		m.e[k].v = (float)(dot + p->noise * mf_rng_normal(&r));
	}
	*m_p = m;
	return 0;
}

int mf_synth_generate(const struct mf_synth_params *p, struct mf_matrix *train_p,
		      struct mf_matrix *test_p)
{
	struct mf_matrix train, test;
	float *w, *h;
	int rc = -ENOMEM;

	if (!p->rows || !p->cols || p->rows > MF_MAX_DIM || p->cols > MF_MAX_DIM || !p->rank ||
	    !p->nnz || !(p->noise >= 0))
		return -EINVAL;
	/* the streams: rows, then columns, then the two entry streams */
	w = synth_factors(p->rows, p->rank, p->seed, 0);
	h = synth_factors(p->cols, p->rank, p->seed, p->rows);
	if (!w || !h)
		goto out;
	rc = synth_entries(p, w, h, p->nnz, p->rows + p->cols, &train);
	if (rc)
		goto out;
	rc = synth_entries(p, w, h, p->test_nnz, p->rows + p->cols + 1, &test);
	if (rc) {
		mf_matrix_free(&train);
		goto out;
	}
	*train_p = train;
	*test_p = test;
out:
	free(w);
	free(h);
	return rc;
}

int mf_split(struct mf_matrix *all, size_t test_nnz, uint64_t seed, struct mf_matrix *train_p,
	     struct mf_matrix *test_p)
{
	struct mf_matrix test = { .rows = all->rows, .cols = all->cols, .nnz = test_nnz };
	struct mf_rng r;
	size_t n = all->nnz;

	if (test_nnz > n)
		return -EINVAL;
	test.e = malloc((test_nnz ? test_nnz : 1) * sizeof(*test.e));
	if (!test.e)
		return -ENOMEM;
	/* a partial Fisher-Yates shuffle moves the test entries to the tail */
	mf_rng_init(&r, seed, UINT64_MAX);
	for (size_t k = 0; k < test_nnz; k++) {
		size_t pick = (size_t)mf_rng_below(&r, n - k);
		struct mf_entry tmp = all->e[pick];

		all->e[pick] = all->e[n - k - 1];
		all->e[n - k - 1] = tmp;
		test.e[k] = tmp;
	}
	*train_p = (struct mf_matrix){
		.rows = all->rows, .cols = all->cols, .nnz = n - test_nnz, .e = all->e
	};
	*test_p = test;
	memset(all, 0, sizeof(*all));
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * mmio.c - MatrixMarket coordinate files: a strict reader and a writer.
 *
 * The reader accepts the subset ferry-mf needs,
 *
 *   %%MatrixMarket matrix coordinate real general     (or integer)
 *   % comments
 *   ROWS COLS NNZ
 *   I J VALUE                                         (NNZ lines, 1-based)
 *
 * and rejects anything else with "PATH:LINE: cause" in the caller's buffer:
 * a file is data from outside, so every field is checked before use.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mf.h"

void mf_matrix_free(struct mf_matrix *m)
{
	free(m->e);
	memset(m, 0, sizeof(*m));
}

int mf_parse_fail(struct mf_parse *c, int rc, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!c->err || !c->errlen)
		return rc;
	if (c->line)
		n = snprintf(c->err, c->errlen, "%s:%zu: ", c->path, c->line);
	else
		n = snprintf(c->err, c->errlen, "%s: ", c->path);
	if (n < 0 || (size_t)n >= c->errlen)
		return rc;
	va_start(ap, fmt);
	vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return rc;
}

/* Next token of *s (space separated), NUL-terminated in place; NULL at the end. */
static char *mmio_token(char **s)
{
	char *p = *s, *tok;

	while (*p && isspace((unsigned char)*p))
		p++;
	if (!*p)
		return NULL;
	tok = p;
	while (*p && !isspace((unsigned char)*p))
		p++;
	if (*p)
		*p++ = '\0';
	*s = p;
	return tok;
}

/* A decimal unsigned integer filling the whole token, at most @max. */
static int mmio_uint(const char *tok, uint64_t max, uint64_t *v_p)
{
	unsigned long long v;
	char *end;

	if (!tok || !isdigit((unsigned char)tok[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(tok, &end, 10);
	if (errno || *end || v > max)
		return -EINVAL;
	*v_p = v;
	return 0;
}

static int mmio_header(struct mf_parse *c, char *line)
{
	static const char *const want[] = { "%%MatrixMarket", "matrix", "coordinate" };
	char *s = line, *tok;

	for (size_t k = 0; k < 3; k++) {
		tok = mmio_token(&s);
		if (!tok || strcasecmp(tok, want[k]))
			return mf_parse_fail(
				c, -EINVAL,
				"not a MatrixMarket coordinate file: the first line must be "
				"'%%%%MatrixMarket matrix coordinate real general'");
	}
	tok = mmio_token(&s);
	if (!tok ||
	    (strcasecmp(tok, "real") && strcasecmp(tok, "integer") && strcasecmp(tok, "double")))
		return mf_parse_fail(
			c, -EINVAL,
			"field '%s' is not supported; ferry-mf reads 'real' or 'integer'",
			tok ? tok : "(missing)");
	tok = mmio_token(&s);
	if (!tok || strcasecmp(tok, "general"))
		return mf_parse_fail(c, -EINVAL,
				     "symmetry '%s' is not supported; ferry-mf reads 'general' "
				     "(expand the matrix first)",
				     tok ? tok : "(missing)");
	if (mmio_token(&s))
		return mf_parse_fail(c, -EINVAL, "unexpected text after the header's symmetry");
	return 0;
}

static int mmio_size(struct mf_parse *c, char *line, struct mf_matrix *m)
{
	char *s = line;
	uint64_t rows, cols, nnz;

	if (mmio_uint(mmio_token(&s), MF_MAX_DIM, &rows) ||
	    mmio_uint(mmio_token(&s), MF_MAX_DIM, &cols) ||
	    mmio_uint(mmio_token(&s), SIZE_MAX / sizeof(struct mf_entry), &nnz) || mmio_token(&s))
		return mf_parse_fail(
			c, -EINVAL,
			"malformed size line: expected 'ROWS COLS NNZ' (rows and columns "
			"at most %" PRIu64 ")",
			MF_MAX_DIM);
	if (!rows || !cols)
		return mf_parse_fail(c, -EINVAL, "the matrix has no rows or no columns");
	m->rows = rows;
	m->cols = cols;
	m->nnz = nnz;
	return 0;
}

static int mmio_entry(struct mf_parse *c, char *line, const struct mf_matrix *m, struct mf_entry *e)
{
	char *s = line, *ti, *tj, *tv, *end;
	uint64_t i, j;
	double v;

	ti = mmio_token(&s);
	tj = mmio_token(&s);
	tv = mmio_token(&s);
	if (!tv)
		return mf_parse_fail(c, -EINVAL, "truncated entry: expected 'ROW COL VALUE'");
	if (mmio_token(&s))
		return mf_parse_fail(c, -EINVAL, "malformed entry: more than 'ROW COL VALUE'");
	if (mmio_uint(ti, UINT64_MAX, &i) || mmio_uint(tj, UINT64_MAX, &j))
		return mf_parse_fail(c, -EINVAL, "malformed entry: '%s %s' are not indices", ti,
				     tj);
	if (i < 1 || i > m->rows)
		return mf_parse_fail(c, -EINVAL, "row index %" PRIu64 " out of range 1..%" PRIu64,
				     i, m->rows);
	if (j < 1 || j > m->cols)
		return mf_parse_fail(c, -EINVAL,
				     "column index %" PRIu64 " out of range 1..%" PRIu64, j,
				     m->cols);
	errno = 0;
	v = strtod(tv, &end);
	if (errno == ERANGE && fabs(v) > 1.0)
		return mf_parse_fail(c, -EINVAL, "value '%s' overflows", tv);
	if (*end || end == tv || !isfinite(v) || fabs(v) > 3.4e38)
		return mf_parse_fail(c, -EINVAL, "malformed value '%s'", tv);
	e->i = (uint32_t)(i - 1);
	e->j = (uint32_t)(j - 1);
	e->v = (float)v;
	return 0;
}

static int mmio_blank(const char *s)
{
	while (*s && isspace((unsigned char)*s))
		s++;
	return !*s;
}

int mf_mmio_read(const char *path, struct mf_matrix *m_p, char *err, size_t errlen)
{
	struct mf_parse c = { .path = path, .err = err, .errlen = errlen };
	struct mf_matrix m = { 0 };
	size_t cap = 0, got = 0, n = 0;
	int have_size = 0, rc;
	char *line = NULL;
	ssize_t len;
	FILE *f;

	if (err && errlen)
		err[0] = '\0';
	f = fopen(path, "r");
	if (!f) {
		rc = -errno;
		return mf_parse_fail(&c, rc, "cannot open: %s", strerror(-rc));
	}
	while ((len = getline(&line, &n, f)) >= 0) {
		c.line++;
		if ((size_t)len != strlen(line)) {
			rc = mf_parse_fail(&c, -EINVAL,
					   "a NUL byte inside the line; not a text file");
			goto err_free;
		}
		if (c.line == 1) {
			rc = mmio_header(&c, line);
			if (rc)
				goto err_free;
			continue;
		}
		if (line[0] == '%' || mmio_blank(line))
			continue;
		if (!have_size) {
			rc = mmio_size(&c, line, &m);
			if (rc)
				goto err_free;
			have_size = 1;
			/* grow as entries arrive: a lying header must not allocate for it */
			cap = m.nnz < 1024 ? m.nnz : 1024;
			m.e = malloc((cap ? cap : 1) * sizeof(*m.e));
			if (!m.e) {
				rc = mf_parse_fail(&c, -ENOMEM, "out of memory");
				goto err_free;
			}
			continue;
		}
		if (got == m.nnz) {
			rc = mf_parse_fail(&c, -EINVAL,
					   "more entries than the %zu the size line announced",
					   m.nnz);
			goto err_free;
		}
		if (got == cap) {
			size_t ncap = cap * 2 < m.nnz ? cap * 2 : m.nnz;
			struct mf_entry *ne = realloc(m.e, ncap * sizeof(*ne));

			if (!ne) {
				rc = mf_parse_fail(&c, -ENOMEM, "out of memory for %zu entries",
						   ncap);
				goto err_free;
			}
			m.e = ne;
			cap = ncap;
		}
		rc = mmio_entry(&c, line, &m, &m.e[got]);
		if (rc)
			goto err_free;
		got++;
	}
	if (ferror(f)) {
		rc = -EIO;
		mf_parse_fail(&c, rc, "read error");
		goto err_free;
	}
	if (c.line == 0) {
		rc = mf_parse_fail(&c, -EINVAL, "empty file; expected a MatrixMarket header");
		goto err_free;
	}
	if (!have_size) {
		rc = mf_parse_fail(&c, -EINVAL, "truncated file: no size line 'ROWS COLS NNZ'");
		goto err_free;
	}
	if (got < m.nnz) {
		rc = mf_parse_fail(&c, -EINVAL,
				   "truncated file: the size line announced %zu entries, found %zu",
				   m.nnz, got);
		goto err_free;
	}
	free(line);
	fclose(f);
	*m_p = m;
	return 0;

err_free:
	free(line);
	free(m.e);
	fclose(f);
	return rc;
}

int mf_mmio_write(const char *path, const struct mf_matrix *m)
{
	FILE *f = fopen(path, "w");
	int rc = 0;

	if (!f)
		return -errno;
	fprintf(f, "%%%%MatrixMarket matrix coordinate real general\n");
	fprintf(f, "%" PRIu64 " %" PRIu64 " %zu\n", m->rows, m->cols, m->nnz);
	for (size_t k = 0; k < m->nnz; k++)
		fprintf(f, "%u %u %.9g\n", m->e[k].i + 1, m->e[k].j + 1, (double)m->e[k].v);
	if (ferror(f))
		rc = -EIO;
	if (fclose(f) && !rc)
		rc = -errno;
	return rc;
}

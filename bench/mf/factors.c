/* SPDX-License-Identifier: MIT */
/*
 * factors.c - ferry-mf's factors on disk (--save DIR, --load DIR).
 *
 * A folder of four files (docs/mf.md, "Saved factors"):
 *
 *   factors.json  {"format": "ferry-mf-factors", "version": 1, "rank": R,
 *                  "rows": N, "cols": M, "ids": "raw" | "index",
 *                  "dtype": "float32", "byte_order": "little",
 *                  "w": "W.f32", "h": "H.f32",
 *                  "row_ids": "rows.txt", "col_ids": "cols.txt", ...}
 *   W.f32         N x R float32, little-endian, row-major: row k is the
 *                 factor of dense row k (numpy: fromfile(.., '<f4').reshape(N, R))
 *   H.f32         M x R, the same for the columns
 *   rows.txt      N lines: line k + 1 holds the raw id of dense row k (the
 *                 user id of a rating file; the 1-based index of a
 *                 MatrixMarket file, "ids": "index")
 *   cols.txt      M lines, the same for the columns (items)
 *
 * The loader checks every field and every file size before it trusts one:
 * a folder is data from outside.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bjson.h"
#include "mf.h"

#define FACTORS_VERSION 1

static int fx_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fx_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

int mf_factors_alloc(struct mf_factors *f, uint64_t rows, uint64_t cols, uint32_t rank)
{
	memset(f, 0, sizeof(*f));
	if (!rows || !cols || !rank || rows > MF_MAX_DIM || cols > MF_MAX_DIM)
		return -EINVAL;
	f->w = malloc(rows * rank * sizeof(float));
	f->h = malloc(cols * rank * sizeof(float));
	if (!f->w || !f->h) {
		mf_factors_free(f);
		return -ENOMEM;
	}
	f->rows = rows;
	f->cols = cols;
	f->rank = rank;
	return 0;
}

void mf_factors_free(struct mf_factors *f)
{
	free(f->w);
	free(f->h);
	memset(f, 0, sizeof(*f));
}

/* float32 in little-endian order, whatever the host's */
static void fx_le(float *v, size_t n)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	for (size_t k = 0; k < n; k++) {
		uint32_t u;

		memcpy(&u, &v[k], 4);
		u = __builtin_bswap32(u);
		memcpy(&v[k], &u, 4);
	}
#else
	(void)v;
	(void)n;
#endif
}

static int fx_path(char *buf, size_t len, const char *dir, const char *name)
{
	int n = snprintf(buf, len, "%s/%s", dir, name);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int fx_write_floats(const char *path, float *v, size_t n)
{
	FILE *f = fopen(path, "wb");
	int rc = 0;

	if (!f)
		return -errno;
	fx_le(v, n);
	if (fwrite(v, sizeof(float), n, f) != n)
		rc = -EIO;
	fx_le(v, n); /* back to the host's order */
	if (fclose(f) && !rc)
		rc = -errno;
	return rc;
}

/* @ids: the raw ids; NULL: the 1-based indices 1..n */
static int fx_write_ids(const char *path, const struct mf_ids *ids, uint64_t n)
{
	FILE *f = fopen(path, "w");
	int rc = 0;

	if (!f)
		return -errno;
	for (uint64_t k = 0; k < n; k++) {
		if (ids)
			fprintf(f, "%s\n", ids->names[k]);
		else
			fprintf(f, "%" PRIu64 "\n", k + 1);
	}
	if (ferror(f))
		rc = -EIO;
	if (fclose(f) && !rc)
		rc = -errno;
	return rc;
}

int mf_factors_save(const char *dir, struct mf_factors *fx, const struct mf_ids *users,
		    const struct mf_ids *items, json_t *extra, char *err, size_t errlen)
{
	char path[4096];
	json_t *meta;
	int rc;

	if (users && (users->n != fx->rows || items->n != fx->cols))
		return fx_fail(err, errlen, -EINVAL,
			       "%s: the id maps (%zu x %zu) do not match the factors (%" PRIu64
			       " x %" PRIu64 ")",
			       dir, users->n, items->n, fx->rows, fx->cols);
	if (mkdir(dir, 0777) && errno != EEXIST)
		return fx_fail(err, errlen, -errno, "cannot create the folder %s: %s", dir,
			       strerror(errno));
	rc = fx_path(path, sizeof(path), dir, "W.f32");
	if (!rc)
		rc = fx_write_floats(path, fx->w, fx->rows * fx->rank);
	if (!rc)
		rc = fx_path(path, sizeof(path), dir, "H.f32");
	if (!rc)
		rc = fx_write_floats(path, fx->h, fx->cols * fx->rank);
	if (!rc)
		rc = fx_path(path, sizeof(path), dir, "rows.txt");
	if (!rc)
		rc = fx_write_ids(path, users, fx->rows);
	if (!rc)
		rc = fx_path(path, sizeof(path), dir, "cols.txt");
	if (!rc)
		rc = fx_write_ids(path, items, fx->cols);
	if (rc)
		return fx_fail(err, errlen, rc, "cannot write %s: %s", path, strerror(-rc));

	meta = json_object();
	bjson_set_str(meta, "format", "ferry-mf-factors");
	bjson_set_int(meta, "version", FACTORS_VERSION);
	bjson_set_int(meta, "rank", fx->rank);
	bjson_set_int(meta, "rows", (int64_t)fx->rows);
	bjson_set_int(meta, "cols", (int64_t)fx->cols);
	bjson_set_str(meta, "ids", users ? "raw" : "index");
	bjson_set_str(meta, "dtype", "float32");
	bjson_set_str(meta, "byte_order", "little");
	bjson_set_str(meta, "w", "W.f32");
	bjson_set_str(meta, "h", "H.f32");
	bjson_set_str(meta, "row_ids", "rows.txt");
	bjson_set_str(meta, "col_ids", "cols.txt");
	if (extra)
		bjson_set(meta, "training", json_incref(extra));
	rc = fx_path(path, sizeof(path), dir, "factors.json");
	if (!rc)
		rc = bjson_write(meta, path, "ferry-mf");
	json_decref(meta);
	if (rc)
		return fx_fail(err, errlen, rc, "cannot write %s/factors.json: %s", dir,
			       strerror(-rc));
	return 0;
}

/* before allocating what factors.json announces: the file must hold exactly that */
static int fx_check_size(const char *path, uint64_t n, char *err, size_t errlen)
{
	struct stat st;

	if (stat(path, &st))
		return fx_fail(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
	if ((uint64_t)st.st_size != n * sizeof(float))
		return fx_fail(err, errlen, -EINVAL,
			       "%s holds %lld bytes; factors.json's rows x rank say %" PRIu64, path,
			       (long long)st.st_size, n * sizeof(float));
	return 0;
}

static int fx_read_floats(const char *path, float *v, size_t n, char *err, size_t errlen)
{
	struct stat st;
	FILE *f = fopen(path, "rb");
	int rc = 0;

	if (!f)
		return fx_fail(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
	if (fstat(fileno(f), &st) || (uint64_t)st.st_size != (uint64_t)n * sizeof(float)) {
		rc = fx_fail(err, errlen, -EINVAL,
			     "%s holds %lld bytes; factors.json's rows x rank say %zu", path,
			     (long long)st.st_size, n * sizeof(float));
	} else if (fread(v, sizeof(float), n, f) != n) {
		rc = fx_fail(err, errlen, -EIO, "read error in %s", path);
	}
	fclose(f);
	fx_le(v, n);
	for (size_t k = 0; !rc && k < n; k++)
		if (!isfinite(v[k]))
			rc = fx_fail(err, errlen, -EINVAL,
				     "%s: value %zu is not a finite number (a diverged run?)", path,
				     k);
	return rc;
}

/* into an empty @ids when @raw, else checks that line k is k + 1 */
static int fx_read_ids(const char *path, struct mf_ids *ids, int raw, uint64_t n, char *err,
		       size_t errlen)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	uint64_t k = 0;
	ssize_t len;
	int rc = 0;

	if (!f)
		return fx_fail(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
	while (!rc && (len = getline(&line, &cap, f)) >= 0) {
		uint32_t idx;

		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (k == n) {
			rc = fx_fail(err, errlen, -EINVAL,
				     "%s: more than the %" PRIu64 " ids of "
				     "factors.json",
				     path, n);
		} else if (!raw) {
			char want[24];

			snprintf(want, sizeof(want), "%" PRIu64, k + 1);
			if (strcmp(line, want))
				rc = fx_fail(err, errlen, -EINVAL,
					     "%s:%" PRIu64 ": '%s', expected the index %s", path,
					     k + 1, line, want);
		} else if (!len || (size_t)len != strlen(line)) {
			rc = fx_fail(err, errlen, -EINVAL, "%s:%" PRIu64 ": an empty id", path,
				     k + 1);
		} else {
			rc = mf_ids_get(ids, line, (size_t)len, 1, &idx);
			if (!rc && idx != k)
				rc = fx_fail(err, errlen, -EINVAL,
					     "%s:%" PRIu64 ": id '%s' appears twice", path, k + 1,
					     line);
			else if (rc)
				rc = fx_fail(err, errlen, rc, "%s: %s", path, strerror(-rc));
		}
		k++;
	}
	if (!rc && k != n)
		rc = fx_fail(err, errlen, -EINVAL,
			     "%s: %" PRIu64 " ids, factors.json says %" PRIu64, path, k, n);
	free(line);
	fclose(f);
	return rc;
}

static int fx_uint(json_t *meta, const char *key, uint64_t max, uint64_t *v_p)
{
	json_t *v = json_object_get(meta, key);

	if (!json_is_integer(v) || json_integer_value(v) < 1 ||
	    (uint64_t)json_integer_value(v) > max)
		return -EINVAL;
	*v_p = (uint64_t)json_integer_value(v);
	return 0;
}

int mf_factors_load(const char *dir, struct mf_factors *fx_p, struct mf_ids *users,
		    struct mf_ids *items, int *raw_p, char *err, size_t errlen)
{
	struct mf_factors fx = { 0 };
	uint64_t rows, cols, rank, version;
	const char *ids, *fmt;
	char path[4096];
	json_error_t jerr;
	json_t *meta;
	int rc, raw;

	if (fx_path(path, sizeof(path), dir, "factors.json"))
		return fx_fail(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
	meta = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!meta)
		return fx_fail(err, errlen, -EINVAL, "%s:%d: %s (not a folder --save wrote?)", path,
			       jerr.line, jerr.text);
	fmt = json_string_value(json_object_get(meta, "format"));
	ids = json_string_value(json_object_get(meta, "ids"));
	if (!fmt || strcmp(fmt, "ferry-mf-factors")) {
		rc = fx_fail(err, errlen, -EINVAL, "%s: \"format\" is not \"ferry-mf-factors\"",
			     path);
		goto out;
	}
	if (fx_uint(meta, "version", UINT32_MAX, &version) || version != FACTORS_VERSION) {
		rc = fx_fail(err, errlen, -EINVAL,
			     "%s: version is not %d; written by another ferry-mf?", path,
			     FACTORS_VERSION);
		goto out;
	}
	if (fx_uint(meta, "rows", MF_MAX_DIM - 1, &rows) ||
	    fx_uint(meta, "cols", MF_MAX_DIM - 1, &cols) || fx_uint(meta, "rank", 65536, &rank) ||
	    !ids || (strcmp(ids, "raw") && strcmp(ids, "index"))) {
		rc = fx_fail(err, errlen, -EINVAL,
			     "%s: rows, cols and rank must be integers (rank <= 65536) and ids "
			     "\"raw\" or \"index\"",
			     path);
		goto out;
	}
	raw = !strcmp(ids, "raw");
	rc = fx_path(path, sizeof(path), dir, "W.f32");
	if (!rc)
		rc = fx_check_size(path, rows * rank, err, errlen);
	if (!rc)
		rc = fx_path(path, sizeof(path), dir, "H.f32");
	if (!rc)
		rc = fx_check_size(path, cols * rank, err, errlen);
	if (rc)
		goto out;
	rc = mf_factors_alloc(&fx, rows, cols, (uint32_t)rank);
	if (rc) {
		rc = fx_fail(err, errlen, rc,
			     "%s: no memory for %" PRIu64 " x %" PRIu64 " factors of rank %" PRIu64,
			     dir, rows, cols, rank);
		goto out;
	}
	/* the fixed names: the folder's own strings never reach a path */
	rc = fx_path(path, sizeof(path), dir, "W.f32");
	if (!rc)
		rc = fx_read_floats(path, fx.w, rows * rank, err, errlen);
	if (!rc)
		rc = fx_path(path, sizeof(path), dir, "H.f32");
	if (!rc)
		rc = fx_read_floats(path, fx.h, cols * rank, err, errlen);
	if (!rc)
		rc = fx_path(path, sizeof(path), dir, "rows.txt");
	if (!rc)
		rc = fx_read_ids(path, users, raw, rows, err, errlen);
	if (!rc)
		rc = fx_path(path, sizeof(path), dir, "cols.txt");
	if (!rc)
		rc = fx_read_ids(path, items, raw, cols, err, errlen);
	if (rc) {
		mf_factors_free(&fx);
		goto out;
	}
	*fx_p = fx;
	*raw_p = raw;
out:
	json_decref(meta);
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * ratings.c - rating files as people have them, and the id maps.
 *
 * Three layouts, one rating per line, extra fields (MovieLens' timestamp)
 * ignored:
 *
 *   csv   user,item,rating[,...]      MovieLens ratings.csv: a header line
 *                                     "userId,movieId,rating,timestamp"
 *   tsv   user<TAB>item<TAB>rating    MovieLens 100k's u.data, generic TSV
 *   dat   user::item::rating[::...]   MovieLens 1M / 10M ratings.dat
 *
 * A first line whose rating field is not a number is a header and skipped;
 * blank lines and lines starting with '#' are skipped. CSV fields may be
 * quoted ("a,b", "" for a quote). Everything else is an error naming the
 * file and the line: the file comes from outside.
 *
 * Ids are strings (MovieLens' are integers, other data sets' are not); an
 * id map gives each its dense index in the order ids are first seen:
 *
 *   raw id  --hash (open addressing, at most half full)-->  dense index k
 *   names[k] = raw id
 *
 * Memory: the map holds one copy of every distinct id and 2 to 4 slots of 4
 * bytes per id; the matrix 12 bytes per rating.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mf.h"

/* ---- id maps ------------------------------------------------------------- */

void mf_ids_free(struct mf_ids *ids)
{
	for (size_t k = 0; k < ids->n; k++)
		free(ids->names[k]);
	free(ids->names);
	free(ids->slot);
	memset(ids, 0, sizeof(*ids));
}

/* FNV-1a, 64 bits: ids are short */
static uint64_t ids_hash(const char *s, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t k = 0; k < len; k++) {
		h ^= (unsigned char)s[k];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* the slot of @raw: its index + 1 there, or the empty slot where it would go */
static size_t ids_find(const struct mf_ids *ids, const char *raw, size_t len)
{
	size_t mask = ids->hcap - 1, s = (size_t)ids_hash(raw, len) & mask;

	for (;; s = (s + 1) & mask) {
		uint32_t v = ids->slot[s];

		if (!v)
			return s;
		if (!strncmp(ids->names[v - 1], raw, len) && !ids->names[v - 1][len])
			return s;
	}
}

static int ids_grow(struct mf_ids *ids)
{
	size_t ncap = ids->hcap ? 2 * ids->hcap : 1024;
	uint32_t *old = ids->slot;
	size_t ocap = ids->hcap;

	ids->slot = calloc(ncap, sizeof(*ids->slot));
	if (!ids->slot) {
		ids->slot = old;
		return -ENOMEM;
	}
	ids->hcap = ncap;
	for (size_t s = 0; s < ocap; s++) {
		uint32_t v = old[s];

		if (v) {
			const char *name = ids->names[v - 1];

			ids->slot[ids_find(ids, name, strlen(name))] = v;
		}
	}
	free(old);
	return 0;
}

int mf_ids_get(struct mf_ids *ids, const char *raw, size_t len, int add, uint32_t *idx_p)
{
	size_t s;
	char *name;

	if (ids->hcap) {
		s = ids_find(ids, raw, len);
		if (ids->slot[s]) {
			*idx_p = ids->slot[s] - 1;
			return 0;
		}
	}
	if (!add)
		return -ENOENT;
	if (ids->n >= MF_MAX_DIM - 1)
		return -E2BIG;
	/* at most half full: a probe ends after about 2 slots */
	if (2 * (ids->n + 1) > ids->hcap) {
		if (ids_grow(ids))
			return -ENOMEM;
	}
	if (ids->n == ids->cap) {
		size_t ncap = ids->cap ? 2 * ids->cap : 1024;
		char **nn = realloc(ids->names, ncap * sizeof(*nn));

		if (!nn)
			return -ENOMEM;
		ids->names = nn;
		ids->cap = ncap;
	}
	name = strndup(raw, len);
	if (!name)
		return -ENOMEM;
	s = ids_find(ids, raw, len);
	ids->names[ids->n] = name;
	ids->slot[s] = (uint32_t)++ids->n;
	*idx_p = (uint32_t)(ids->n - 1);
	return 0;
}

/* ---- reading ------------------------------------------------------------- */

const char *mf_format_name(enum mf_format fmt)
{
	static const char *const names[] = {
		[MF_FORMAT_AUTO] = "auto", [MF_FORMAT_MM] = "mm",   [MF_FORMAT_CSV] = "csv",
		[MF_FORMAT_TSV] = "tsv",   [MF_FORMAT_DAT] = "dat",
	};

	return (unsigned)fmt < sizeof(names) / sizeof(names[0]) ? names[fmt] : "?";
}

int mf_format_parse(const char *s, enum mf_format *fmt_p)
{
	for (int f = MF_FORMAT_AUTO; f <= MF_FORMAT_DAT; f++) {
		if (!strcmp(s, mf_format_name((enum mf_format)f))) {
			*fmt_p = (enum mf_format)f;
			return 0;
		}
	}
	return -EINVAL;
}

/* from the first line that is not blank or a comment */
static enum mf_format rt_guess(const char *line)
{
	if (!strncmp(line, "%%MatrixMarket", 14))
		return MF_FORMAT_MM;
	if (strstr(line, "::"))
		return MF_FORMAT_DAT;
	if (strchr(line, '\t'))
		return MF_FORMAT_TSV;
	if (strchr(line, ','))
		return MF_FORMAT_CSV;
	return MF_FORMAT_AUTO; /* cannot tell */
}

int mf_format_detect(const char *path, enum mf_format *fmt_p, char *err, size_t errlen)
{
	struct mf_parse c = { .path = path, .err = err, .errlen = errlen };
	enum mf_format fmt = MF_FORMAT_AUTO;
	char *line = NULL;
	size_t n = 0;
	FILE *f;
	int rc;

	f = fopen(path, "r");
	if (!f) {
		rc = -errno;
		return mf_parse_fail(&c, rc, "cannot open: %s", strerror(-rc));
	}
	while (getline(&line, &n, f) >= 0) {
		const char *s = line;

		c.line++;
		while (*s == ' ')
			s++;
		if (!strncmp(s, "%%", 2) || (*s != '#' && *s != '%' && *s != '\n' && *s != '\r')) {
			fmt = rt_guess(s);
			break;
		}
	}
	free(line);
	fclose(f);
	if (fmt == MF_FORMAT_AUTO)
		return mf_parse_fail(
			&c, -EINVAL,
			"cannot tell the format: no '%%%%MatrixMarket' header, '::', tab or "
			"comma; give --format mm|csv|tsv|dat");
	*fmt_p = fmt;
	return 0;
}

/*
 * Split @line in place into at most @max fields by @sep ("::" for dat);
 * CSV fields may be quoted. Fields are trimmed of spaces and the line end.
 * Return: the number of fields, or -EINVAL for an unclosed quote.
 */
static int rt_split(char *line, enum mf_format fmt, char **f, int max)
{
	char sep = fmt == MF_FORMAT_CSV ? ',' : fmt == MF_FORMAT_TSV ? '\t' : ':';
	char *p = line;
	int nf = 0;

	for (;;) {
		char *out, *start;

		while (*p == ' ')
			p++;
		start = out = p;
		if (fmt == MF_FORMAT_CSV && *p == '"') {
			p++;
			for (;;) {
				if (!*p)
					return -EINVAL;
				if (*p == '"' && p[1] == '"') {
					*out++ = '"';
					p += 2;
				} else if (*p == '"') {
					p++;
					break;
				} else {
					*out++ = *p++;
				}
			}
			while (*p == ' ')
				p++;
		} else {
			while (*p && *p != sep && *p != '\n' && *p != '\r')
				p++;
			out = p;
			while (out > start && out[-1] == ' ')
				out--;
		}
		/* the field ends at a separator or the line's end */
		if (nf < max)
			f[nf] = start;
		nf++;
		if (*p == sep && (fmt != MF_FORMAT_DAT || p[1] == ':')) {
			*out = '\0';
			p += fmt == MF_FORMAT_DAT ? 2 : 1;
			continue;
		}
		if (*p && *p != '\n' && *p != '\r')
			return -EINVAL; /* text after a closing quote, or a lone ':' */
		*out = '\0';
		return nf;
	}
}

static int rt_rating(const char *s, double *v_p)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || *end || errno || !isfinite(v) || fabs(v) > 3.4e38)
		return -EINVAL;
	*v_p = v;
	return 0;
}

static int rt_blank(const char *s)
{
	while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
		s++;
	return !*s || *s == '#';
}

int mf_ratings_read(const char *path, enum mf_format fmt, struct mf_ids *users,
		    struct mf_ids *items, int add, struct mf_matrix *m_p, size_t *unknown_p,
		    char *err, size_t errlen)
{
	struct mf_parse c = { .path = path, .err = err, .errlen = errlen };
	struct mf_matrix m = { 0 };
	size_t cap = 0, n = 0, unknown = 0, data_lines = 0;
	char *line = NULL, *fld[3];
	ssize_t len;
	FILE *f;
	int rc;

	if (err && errlen)
		err[0] = '\0';
	if (fmt != MF_FORMAT_CSV && fmt != MF_FORMAT_TSV && fmt != MF_FORMAT_DAT)
		return mf_parse_fail(&c, -EINVAL, "mf_ratings_read reads csv, tsv or dat, not %s",
				     mf_format_name(fmt));
	f = fopen(path, "r");
	if (!f) {
		rc = -errno;
		return mf_parse_fail(&c, rc, "cannot open: %s", strerror(-rc));
	}
	while ((len = getline(&line, &n, f)) >= 0) {
		uint32_t i, j;
		double v;
		int nf;

		c.line++;
		if ((size_t)len != strlen(line)) {
			rc = mf_parse_fail(&c, -EINVAL,
					   "a NUL byte inside the line; not a text file");
			goto err_free;
		}
		if (rt_blank(line))
			continue;
		nf = rt_split(line, fmt, fld, 3);
		if (nf < 0) {
			rc = mf_parse_fail(&c, -EINVAL,
					   fmt == MF_FORMAT_CSV ?
						   "malformed quoted field" :
						   "malformed line: a single ':' in a "
						   "'::'-separated line");
			goto err_free;
		}
		if (nf < 3) {
			rc = mf_parse_fail(
				&c, -EINVAL,
				"expected USER%sITEM%sRATING, found %d field%s (is the format "
				"%s right? --format mm|csv|tsv|dat)",
				fmt == MF_FORMAT_DAT ? "::" :
				fmt == MF_FORMAT_CSV ? "," :
						       "\\t",
				fmt == MF_FORMAT_DAT ? "::" :
				fmt == MF_FORMAT_CSV ? "," :
						       "\\t",
				nf, nf == 1 ? "" : "s", mf_format_name(fmt));
			goto err_free;
		}
		if (rt_rating(fld[2], &v)) {
			if (!data_lines++)
				continue; /* the header: userId,movieId,rating,timestamp */
			rc = mf_parse_fail(&c, -EINVAL, "rating '%s' is not a number", fld[2]);
			goto err_free;
		}
		data_lines++;
		if (!fld[0][0] || !fld[1][0]) {
			rc = mf_parse_fail(&c, -EINVAL, "empty %s id", fld[0][0] ? "item" : "user");
			goto err_free;
		}
		rc = mf_ids_get(users, fld[0], strlen(fld[0]), add, &i);
		if (!rc)
			rc = mf_ids_get(items, fld[1], strlen(fld[1]), add, &j);
		if (rc == -ENOENT) {
			unknown++; /* a test rating of a user or item training never saw */
			continue;
		}
		if (rc) {
			mf_parse_fail(&c, rc,
				      rc == -E2BIG ? "more than %" PRIu64 " distinct ids" :
						     "out of memory",
				      MF_MAX_DIM - 1);
			goto err_free;
		}
		if (m.nnz == cap) {
			size_t ncap = cap ? 2 * cap : 4096;
			struct mf_entry *ne = realloc(m.e, ncap * sizeof(*ne));

			if (!ne) {
				rc = mf_parse_fail(&c, -ENOMEM, "out of memory for %zu ratings",
						   ncap);
				goto err_free;
			}
			m.e = ne;
			cap = ncap;
		}
		m.e[m.nnz++] = (struct mf_entry){ .i = i, .j = j, .v = (float)v };
	}
	if (ferror(f)) {
		rc = mf_parse_fail(&c, -EIO, "read error");
		goto err_free;
	}
	if (!m.nnz && !unknown) {
		c.line = 0;
		rc = mf_parse_fail(&c, -EINVAL, "no ratings in the file");
		goto err_free;
	}
	free(line);
	fclose(f);
	m.rows = users->n;
	m.cols = items->n;
	*m_p = m;
	if (unknown_p)
		*unknown_p = unknown;
	return 0;

err_free:
	free(line);
	free(m.e);
	fclose(f);
	return rc;
}

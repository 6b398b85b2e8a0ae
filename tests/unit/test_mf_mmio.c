/* SPDX-License-Identifier: MIT */
/*
 * test_mf_mmio.c - ferry-mf's MatrixMarket reader and synthetic generator.
 *
 * The reader gets files from users: a bad one must be refused with -EINVAL
 * and a message that names the file and the line, never read half-way.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/mf/mf.h"

static char tmp_path[64];

/* write @text to a fresh temporary file; its name is in tmp_path */
static const char *write_tmp(const char *text)
{
	int fd;

	snprintf(tmp_path, sizeof(tmp_path), "/tmp/test_mf_mmio.XXXXXX");
	fd = mkstemp(tmp_path);
	cr_assert(fd >= 0, "mkstemp: %s", strerror(errno));
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return tmp_path;
}

static void cleanup_tmp(void)
{
	if (tmp_path[0])
		unlink(tmp_path);
}

TestSuite(mf_mmio, .fini = cleanup_tmp);

/* read @text: expect -EINVAL and a message "PATH:LINE: ..." containing @what */
static void expect_reject(const char *text, unsigned line, const char *what)
{
	struct mf_matrix m = { 0 };
	char err[512], where[128];
	const char *path = write_tmp(text);
	int rc;

	rc = mf_mmio_read(path, &m, err, sizeof(err));
	cr_assert_eq(rc, -EINVAL, "rc %d for a bad file; message: %s", rc, err);
	snprintf(where, sizeof(where), "%s:%u: ", path, line);
	cr_assert(strstr(err, where) == err, "message '%s' does not start with '%s'", err, where);
	cr_assert(strstr(err, what), "message '%s' does not say '%s'", err, what);
	cr_assert_null(m.e, "the output was written on failure");
}

Test(mf_mmio, reads_a_good_file)
{
	const char *path = write_tmp("%%MatrixMarket matrix coordinate real general\n"
				     "% a comment\n"
				     "%\n"
				     "3 4 3\n"
				     "1 1 1.5\n"
				     "\n"
				     "3 4 -2e-3\n"
				     "  2   3   7  \n");
	struct mf_matrix m;
	char err[256];
	int rc;

	rc = mf_mmio_read(path, &m, err, sizeof(err));
	cr_assert_eq(rc, 0, "rc %d: %s", rc, err);
	cr_assert_eq(m.rows, 3);
	cr_assert_eq(m.cols, 4);
	cr_assert_eq(m.nnz, 3);
	cr_assert(m.e[0].i == 0 && m.e[0].j == 0 && m.e[0].v == 1.5f);
	cr_assert(m.e[1].i == 2 && m.e[1].j == 3 && m.e[1].v == -2e-3f);
	cr_assert(m.e[2].i == 1 && m.e[2].j == 2 && m.e[2].v == 7.0f);
	mf_matrix_free(&m);
	cr_assert_null(m.e);
}

Test(mf_mmio, reads_integer_field_and_last_line_without_newline)
{
	const char *path = write_tmp("%%matrixmarket MATRIX Coordinate integer General\n"
				     "2 2 1\n"
				     "2 1 5");
	struct mf_matrix m;
	char err[256];

	cr_assert_eq(mf_mmio_read(path, &m, err, sizeof(err)), 0, "%s", err);
	cr_assert(m.nnz == 1 && m.e[0].i == 1 && m.e[0].j == 0 && m.e[0].v == 5.0f);
	mf_matrix_free(&m);
}

Test(mf_mmio, round_trips_through_the_writer)
{
	struct mf_synth_params p = {
		.rows = 50, .cols = 40, .nnz = 300, .rank = 3, .noise = 0.1, .seed = 7
	};
	struct mf_matrix a, t, b;
	char err[256];

	cr_assert_eq(mf_synth_generate(&p, &a, &t), 0);
	write_tmp("");
	cr_assert_eq(mf_mmio_write(tmp_path, &a), 0);
	cr_assert_eq(mf_mmio_read(tmp_path, &b, err, sizeof(err)), 0, "%s", err);
	cr_assert(b.rows == a.rows && b.cols == a.cols && b.nnz == a.nnz);
	for (size_t k = 0; k < a.nnz; k++)
		cr_assert(a.e[k].i == b.e[k].i && a.e[k].j == b.e[k].j && a.e[k].v == b.e[k].v,
			  "entry %zu differs", k);
	mf_matrix_free(&a);
	mf_matrix_free(&b);
	mf_matrix_free(&t);
}

Test(mf_mmio, rejects_a_wrong_header)
{
	expect_reject("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n", 1,
		      "not a MatrixMarket coordinate file");
	expect_reject("3 3 1\n1 1 1\n", 1, "not a MatrixMarket coordinate file");
	expect_reject("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n", 1,
		      "'complex' is not supported");
	expect_reject("%%MatrixMarket matrix coordinate real symmetric\n1 1 1\n1 1 1\n", 1,
		      "'symmetric' is not supported");
}

Test(mf_mmio, rejects_a_bad_size_line)
{
	expect_reject("%%MatrixMarket matrix coordinate real general\n% c\n3 x 1\n1 1 1\n", 3,
		      "malformed size line");
	expect_reject("%%MatrixMarket matrix coordinate real general\n0 3 1\n1 1 1\n", 2,
		      "no rows or no columns");
}

Test(mf_mmio, rejects_an_out_of_range_index)
{
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 2\n1 1 1\n4 1 1\n", 4,
		      "row index 4 out of range 1..3");
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 2\n1 5 1\n1 1 1\n", 3,
		      "column index 5 out of range 1..4");
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 1\n0 1 1\n", 3,
		      "row index 0 out of range");
}

Test(mf_mmio, rejects_a_truncated_line)
{
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 3\n1 1 1\n2 2\n3 3 3\n",
		      4, "truncated entry");
	/* a file cut off in the middle of its last line */
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 2\n1 1 1\n2 2", 4,
		      "truncated entry");
}

Test(mf_mmio, rejects_malformed_entries)
{
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 2\n1 1 1\n2 2 abc\n", 4,
		      "malformed value 'abc'");
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 1\n1 1 1 9\n", 3,
		      "more than 'ROW COL VALUE'");
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 1\n-1 1 1\n", 3,
		      "are not indices");
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 1\n1 1 nan\n", 3,
		      "malformed value");
}

Test(mf_mmio, rejects_missing_and_extra_entries)
{
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 3\n1 1 1\n2 2 2\n", 4,
		      "announced 3 entries, found 2");
	expect_reject("%%MatrixMarket matrix coordinate real general\n3 4 1\n1 1 1\n2 2 2\n", 4,
		      "more entries than the 1");
	expect_reject("%%MatrixMarket matrix coordinate real general\n% only comments\n", 2,
		      "no size line");
}

Test(mf_mmio, names_a_missing_file)
{
	struct mf_matrix m = { 0 };
	char err[256];

	cr_assert_eq(mf_mmio_read("/nonexistent/ferry.mtx", &m, err, sizeof(err)), -ENOENT);
	cr_assert(strstr(err, "/nonexistent/ferry.mtx") && strstr(err, "cannot open"), "%s", err);
}

/* ---- the generator ------------------------------------------------------- */

static int same(const struct mf_matrix *a, const struct mf_matrix *b)
{
	return a->rows == b->rows && a->cols == b->cols && a->nnz == b->nnz &&
	       !memcmp(a->e, b->e, a->nnz * sizeof(*a->e));
}

Test(mf_synth, is_deterministic_and_follows_the_seed)
{
	struct mf_synth_params p = { .rows = 300,
				     .cols = 200,
				     .nnz = 5000,
				     .test_nnz = 500,
				     .rank = 4,
				     .noise = 0.1,
				     .seed = 42 };
	struct mf_matrix a, at, b, bt, c, ct;

	cr_assert_eq(mf_synth_generate(&p, &a, &at), 0);
	cr_assert_eq(mf_synth_generate(&p, &b, &bt), 0);
	cr_assert(same(&a, &b) && same(&at, &bt), "the same seed gave different matrices");
	p.seed = 43;
	cr_assert_eq(mf_synth_generate(&p, &c, &ct), 0);
	cr_assert(!same(&a, &c) && !same(&at, &ct), "another seed gave the same matrix");
	cr_assert_eq(a.nnz, 5000);
	cr_assert_eq(at.nnz, 500);
	for (size_t k = 0; k < a.nnz; k++)
		cr_assert(a.e[k].i < 300 && a.e[k].j < 200 && isfinite(a.e[k].v));
	mf_matrix_free(&a);
	mf_matrix_free(&at);
	mf_matrix_free(&b);
	mf_matrix_free(&bt);
	mf_matrix_free(&c);
	mf_matrix_free(&ct);
}

Test(mf_synth, has_unit_variance_plus_noise)
{
	struct mf_synth_params p = {
		.rows = 1000, .cols = 1000, .nnz = 200000, .rank = 8, .noise = 0.5, .seed = 1
	};
	struct mf_matrix a, t;
	double s = 0, s2 = 0;

	cr_assert_eq(mf_synth_generate(&p, &a, &t), 0);
	for (size_t k = 0; k < a.nnz; k++) {
		s += a.e[k].v;
		s2 += (double)a.e[k].v * a.e[k].v;
	}
	s /= (double)a.nnz;
	s2 = s2 / (double)a.nnz - s * s;
	/* w*.h* has variance 1, the noise adds 0.25; the sample is large */
	cr_assert(fabs(s) < 0.1, "mean %f", s);
	cr_assert(s2 > 1.25 * 0.8 && s2 < 1.25 * 1.2, "variance %f, expected about 1.25", s2);
	mf_matrix_free(&a);
	mf_matrix_free(&t);
}

Test(mf_synth, parses_specs)
{
	struct mf_synth_params p = { .rank = 10, .noise = 0.1 };
	char err[256];

	cr_assert_eq(mf_synth_parse("100x20:300", &p, err, sizeof(err)), 0);
	cr_assert(p.rows == 100 && p.cols == 20 && p.nnz == 300 && p.rank == 10 && p.noise == 0.1);
	cr_assert_eq(mf_synth_parse("7X8:9:3:0.25", &p, err, sizeof(err)), 0);
	cr_assert(p.rows == 7 && p.cols == 8 && p.nnz == 9 && p.rank == 3 && p.noise == 0.25);
	cr_assert_eq(mf_synth_parse("100x20", &p, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "'100x20'") && strstr(err, "ROWSxCOLS:NNZ"), "%s", err);
	cr_assert_eq(mf_synth_parse("0x20:5", &p, err, sizeof(err)), -EINVAL);
	cr_assert_eq(mf_synth_parse("10x20:5:0", &p, err, sizeof(err)), -EINVAL);
	cr_assert_eq(mf_synth_parse("10x20:5:2:-1", &p, err, sizeof(err)), -EINVAL);
	cr_assert_eq(mf_synth_parse("10x20:5:2:0.1x", &p, err, sizeof(err)), -EINVAL);
}

Test(mf_synth, splits_a_matrix)
{
	struct mf_synth_params p = { .rows = 30, .cols = 30, .nnz = 100, .rank = 2, .seed = 3 };
	struct mf_matrix all, t0, train, test;
	double sum = 0, split_sum = 0;

	cr_assert_eq(mf_synth_generate(&p, &all, &t0), 0);
	for (size_t k = 0; k < all.nnz; k++)
		sum += all.e[k].v;
	cr_assert_eq(mf_split(&all, 101, 1, &train, &test), -EINVAL);
	cr_assert_eq(mf_split(&all, 10, 1, &train, &test), 0);
	cr_assert_null(all.e);
	cr_assert(train.nnz == 90 && test.nnz == 10 && train.rows == 30 && test.cols == 30);
	for (size_t k = 0; k < train.nnz; k++)
		split_sum += train.e[k].v;
	for (size_t k = 0; k < test.nnz; k++)
		split_sum += test.e[k].v;
	cr_assert(fabs(sum - split_sum) < 1e-3, "entries were lost or duplicated");
	mf_matrix_free(&train);
	mf_matrix_free(&test);
	mf_matrix_free(&t0);
}

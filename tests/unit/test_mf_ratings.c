/* SPDX-License-Identifier: MIT */
/*
 * test_mf_ratings.c - ferry-mf's rating files, id maps and saved factors.
 *
 * Rating files come from users: a bad line must be refused with -EINVAL and
 * a message naming the file and the line. The three MovieLens layouts of the
 * fixture in tests/data/movielens-tiny/ (made by its make.py; MovieLens itself
 * cannot be installed here) must give the same matrix, entry for entry.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/mf/mf.h"

#ifndef FERRY_SOURCE_DIR
#error "FERRY_SOURCE_DIR must name the source tree (tests/CMakeLists.txt sets it)"
#endif
#define FIXTURE FERRY_SOURCE_DIR "/tests/data/movielens-tiny/"

static char tmp_path[64];
static char tmp_dir[64];

static const char *write_tmp(const char *text)
{
	int fd;

	if (tmp_path[0])
		unlink(tmp_path);
	snprintf(tmp_path, sizeof(tmp_path), "/tmp/test_mf_ratings.XXXXXX");
	fd = mkstemp(tmp_path);
	cr_assert(fd >= 0, "mkstemp: %s", strerror(errno));
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return tmp_path;
}

static void cleanup(void)
{
	if (tmp_path[0])
		unlink(tmp_path);
	if (tmp_dir[0]) {
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_dir);
		cr_assert_eq(system(cmd), 0);
	}
}

TestSuite(mf_ratings, .fini = cleanup);

struct parsed {
	struct mf_ids users, items;
	struct mf_matrix m;
	size_t unknown;
	char err[512];
};

static int parse(const char *path, enum mf_format fmt, struct parsed *p)
{
	return mf_ratings_read(path, fmt, &p->users, &p->items, 1, &p->m, &p->unknown, p->err,
			       sizeof(p->err));
}

static void parsed_free(struct parsed *p)
{
	mf_ids_free(&p->users);
	mf_ids_free(&p->items);
	mf_matrix_free(&p->m);
}

Test(mf_ratings, reads_movielens_csv_with_header_and_remaps_ids)
{
	const char *f = write_tmp("userId,movieId,rating,timestamp\n"
				  "1,31,2.5,1260759144\n"
				  "1,1029,3.0,1260759179\n"
				  "7,31,4.5,1260759185\n"
				  "\n"
				  "# a comment\n"
				  "42,1172,5,1260759205");
	struct parsed p = { 0 };

	cr_assert_eq(parse(f, MF_FORMAT_CSV, &p), 0, "%s", p.err);
	cr_assert_eq(p.m.nnz, 4);
	cr_assert_eq(p.m.rows, 3);
	cr_assert_eq(p.m.cols, 3);
	/* dense indices in the order first seen */
	cr_assert_str_eq(p.users.names[0], "1");
	cr_assert_str_eq(p.users.names[1], "7");
	cr_assert_str_eq(p.users.names[2], "42");
	cr_assert_str_eq(p.items.names[2], "1172");
	cr_assert_eq(p.m.e[2].i, 1);
	cr_assert_eq(p.m.e[2].j, 0);
	cr_assert_float_eq(p.m.e[2].v, 4.5f, 1e-6);
	cr_assert_eq(p.m.e[3].i, 2);
	cr_assert_eq(p.m.e[3].j, 2);
	cr_assert_float_eq(p.m.e[3].v, 5.0f, 1e-6);
	parsed_free(&p);
}

Test(mf_ratings, reads_dat_tsv_and_quoted_csv)
{
	struct parsed p = { 0 };

	cr_assert_eq(parse(write_tmp("1::1193::5::978300760\n2::1193::3.5::978298413\n"),
			   MF_FORMAT_DAT, &p),
		     0, "%s", p.err);
	cr_assert_eq(p.m.nnz, 2);
	cr_assert_eq(p.m.rows, 2);
	cr_assert_eq(p.m.cols, 1);
	cr_assert_float_eq(p.m.e[1].v, 3.5f, 1e-6);
	parsed_free(&p);

	memset(&p, 0, sizeof(p));
	cr_assert_eq(parse(write_tmp("196\t242\t3\t881250949\r\n186\t302\t3\t891717742\r\n"),
			   MF_FORMAT_TSV, &p),
		     0, "%s", p.err);
	cr_assert_eq(p.m.nnz, 2);
	cr_assert_str_eq(p.items.names[1], "302");
	parsed_free(&p);

	/* string ids, quoted, with a comma and a doubled quote inside */
	memset(&p, 0, sizeof(p));
	cr_assert_eq(parse(write_tmp("user,item,rating\n"
				     "\"alice\",\"The Good, the Bad\",4\n"
				     "bob , \"say \"\"hi\"\"\" , 1.5\n"),
			   MF_FORMAT_CSV, &p),
		     0, "%s", p.err);
	cr_assert_eq(p.m.nnz, 2);
	cr_assert_str_eq(p.users.names[0], "alice");
	cr_assert_str_eq(p.users.names[1], "bob");
	cr_assert_str_eq(p.items.names[0], "The Good, the Bad");
	cr_assert_str_eq(p.items.names[1], "say \"hi\"");
	cr_assert_float_eq(p.m.e[1].v, 1.5f, 1e-6);
	parsed_free(&p);
}

Test(mf_ratings, the_three_movielens_layouts_give_the_same_matrix)
{
	static const char *const files[] = { FIXTURE "ratings.csv", FIXTURE "ratings.dat",
					     FIXTURE "u.data" };
	static const enum mf_format fmts[] = { MF_FORMAT_CSV, MF_FORMAT_DAT, MF_FORMAT_TSV };
	struct parsed p[3] = { 0 };

	for (int k = 0; k < 3; k++) {
		enum mf_format fmt;
		char err[512];

		cr_assert_eq(mf_format_detect(files[k], &fmt, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(fmt, fmts[k], "%s detected as %s", files[k], mf_format_name(fmt));
		cr_assert_eq(parse(files[k], fmt, &p[k]), 0, "%s", p[k].err);
	}
	cr_assert_gt(p[0].m.nnz, 1000);
	for (int k = 1; k < 3; k++) {
		cr_assert_eq(p[k].m.nnz, p[0].m.nnz);
		cr_assert_eq(p[k].m.rows, p[0].m.rows);
		cr_assert_eq(p[k].m.cols, p[0].m.cols);
		cr_assert_eq(memcmp(p[k].m.e, p[0].m.e, p[0].m.nnz * sizeof(struct mf_entry)), 0);
	}
	/* every dense index maps back to its raw id */
	for (size_t u = 0; u < p[0].users.n; u++) {
		uint32_t idx;

		cr_assert_eq(mf_ids_get(&p[0].users, p[0].users.names[u],
					strlen(p[0].users.names[u]), 0, &idx),
			     0);
		cr_assert_eq(idx, u);
	}
	for (int k = 0; k < 3; k++)
		parsed_free(&p[k]);
}

Test(mf_ratings, a_test_file_keeps_the_training_ids_and_counts_unknown_ones)
{
	struct parsed tr = { 0 };
	struct mf_matrix test;
	size_t unknown = 99;
	char err[512];

	cr_assert_eq(parse(FIXTURE "ratings.csv", MF_FORMAT_CSV, &tr), 0, "%s", tr.err);
	cr_assert_eq(mf_ratings_read(FIXTURE "test.csv", MF_FORMAT_CSV, &tr.users, &tr.items, 0,
				     &test, &unknown, err, sizeof(err)),
		     0, "%s", err);
	/* make.py appends one rating of an unknown user and one of an unknown movie */
	cr_assert_eq(unknown, 2);
	cr_assert_eq(test.rows, tr.m.rows);
	cr_assert_eq(test.cols, tr.m.cols);
	cr_assert_gt(test.nnz, 100);
	for (size_t k = 0; k < test.nnz; k++)
		cr_assert(test.e[k].i < test.rows && test.e[k].j < test.cols);
	mf_matrix_free(&test);
	parsed_free(&tr);
}

static void expect_error(const char *text, enum mf_format fmt, const char *want)
{
	struct parsed p = { 0 };
	int rc = parse(write_tmp(text), fmt, &p);

	cr_assert_eq(rc, -EINVAL, "accepted %s", text);
	cr_assert(strstr(p.err, want), "message '%s' lacks '%s'", p.err, want);
	cr_assert(strstr(p.err, tmp_path), "message '%s' does not name the file", p.err);
	parsed_free(&p);
}

Test(mf_ratings, rejects_bad_lines_naming_file_and_line)
{
	expect_error("u,i,r\n1,2,3\n1,2,x\n", MF_FORMAT_CSV, ":3: rating 'x' is not a number");
	expect_error("1,2,3\n1,2\n", MF_FORMAT_CSV, ":2: expected USER,ITEM,RATING, found 2");
	expect_error("1::2::3\n1:2::3\n", MF_FORMAT_DAT, ":2: malformed line");
	expect_error("1,\"2,3\n", MF_FORMAT_CSV, ":1: malformed quoted field");
	expect_error("1,2,3\n,2,3\n", MF_FORMAT_CSV, ":2: empty user id");
	expect_error("1,2,nan\n1,2,3\n1,2,inf\n", MF_FORMAT_CSV, ":3: rating 'inf'");
	expect_error("userId,movieId,rating\n", MF_FORMAT_CSV, "no ratings");
}

Test(mf_ratings, detects_formats_and_says_when_it_cannot)
{
	enum mf_format fmt;
	char err[512];

	cr_assert_eq(mf_format_detect(write_tmp("%%MatrixMarket matrix coordinate real general\n"),
				      &fmt, err, sizeof(err)),
		     0);
	cr_assert_eq(fmt, MF_FORMAT_MM);
	cr_assert_eq(mf_format_detect(write_tmp("# c\n\n1 2 3\n"), &fmt, err, sizeof(err)),
		     -EINVAL);
	cr_assert(strstr(err, "--format"), "%s", err);
	cr_assert_eq(mf_format_detect("/nonexistent/x.csv", &fmt, err, sizeof(err)), -ENOENT);
	cr_assert_eq(mf_format_parse("dat", &fmt), 0);
	cr_assert_eq(fmt, MF_FORMAT_DAT);
	cr_assert_eq(mf_format_parse("xls", &fmt), -EINVAL);
}

Test(mf_ratings, the_id_map_grows_and_keeps_every_id)
{
	struct mf_ids ids = { 0 };
	char buf[32];
	uint32_t idx;

	for (int k = 0; k < 100000; k++) {
		int n = snprintf(buf, sizeof(buf), "id-%d", k * 7919);

		cr_assert_eq(mf_ids_get(&ids, buf, (size_t)n, 1, &idx), 0);
		cr_assert_eq(idx, (uint32_t)k);
	}
	cr_assert_eq(ids.n, 100000);
	cr_assert_leq(2 * ids.n, ids.hcap, "the table is over half full");
	for (int k = 0; k < 100000; k += 997) {
		int n = snprintf(buf, sizeof(buf), "id-%d", k * 7919);

		cr_assert_eq(mf_ids_get(&ids, buf, (size_t)n, 0, &idx), 0);
		cr_assert_eq(idx, (uint32_t)k);
	}
	/* a prefix of a known id is another id */
	cr_assert_eq(mf_ids_get(&ids, "id-7", 4, 0, &idx), -ENOENT);
	mf_ids_free(&ids);
}

static void make_dir(void)
{
	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/test_mf_factors.XXXXXX");
	cr_assert(mkdtemp(tmp_dir), "mkdtemp: %s", strerror(errno));
}

Test(mf_ratings, factors_round_trip_with_their_ids)
{
	struct mf_ids u = { 0 }, it = { 0 }, u2 = { 0 }, it2 = { 0 };
	struct mf_factors fx, back;
	char err[512];
	uint32_t idx;
	int raw = -1;

	make_dir();
	cr_assert_eq(mf_ids_get(&u, "alice", 5, 1, &idx), 0);
	cr_assert_eq(mf_ids_get(&u, "bob", 3, 1, &idx), 0);
	cr_assert_eq(mf_ids_get(&it, "1193", 4, 1, &idx), 0);
	cr_assert_eq(mf_factors_alloc(&fx, 2, 1, 3), 0);
	for (int k = 0; k < 6; k++)
		fx.w[k] = (float)k * 0.25f - 1.0f;
	for (int k = 0; k < 3; k++)
		fx.h[k] = (float)k + 0.5f;
	cr_assert_eq(mf_factors_save(tmp_dir, &fx, &u, &it, NULL, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(mf_factors_load(tmp_dir, &back, &u2, &it2, &raw, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(raw, 1);
	cr_assert_eq(back.rows, 2);
	cr_assert_eq(back.cols, 1);
	cr_assert_eq(back.rank, 3);
	cr_assert_eq(memcmp(back.w, fx.w, 6 * sizeof(float)), 0);
	cr_assert_eq(memcmp(back.h, fx.h, 3 * sizeof(float)), 0);
	cr_assert_eq(u2.n, 2);
	cr_assert_str_eq(u2.names[1], "bob");
	cr_assert_str_eq(it2.names[0], "1193");
	mf_factors_free(&back);
	mf_ids_free(&u2);
	mf_ids_free(&it2);

	/* MatrixMarket indices: no id maps, rows.txt holds 1..rows */
	cr_assert_eq(mf_factors_save(tmp_dir, &fx, NULL, NULL, NULL, err, sizeof(err)), 0);
	cr_assert_eq(mf_factors_load(tmp_dir, &back, &u2, &it2, &raw, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_eq(raw, 0);
	cr_assert_eq(u2.n, 0);
	mf_factors_free(&back);
	mf_factors_free(&fx);
	mf_ids_free(&u);
	mf_ids_free(&it);
}

/* write @text into tmp_dir/@name */
static void put(const char *name, const char *text, size_t len)
{
	char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmp_dir, name);
	f = fopen(path, "w");
	cr_assert(f);
	cr_assert_eq(fwrite(text, 1, len, f), len);
	fclose(f);
}

static void expect_load_error(const char *want)
{
	struct mf_ids u = { 0 }, it = { 0 };
	struct mf_factors fx;
	char err[512] = "";
	int raw;

	cr_assert_eq(mf_factors_load(tmp_dir, &fx, &u, &it, &raw, err, sizeof(err)), -EINVAL,
		     "loaded a bad folder (want '%s')", want);
	cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
	mf_ids_free(&u);
	mf_ids_free(&it);
}

Test(mf_ratings, refuses_a_folder_that_does_not_match_its_factors_json)
{
	static const float w[4] = { 1, 2, 3, 4 }, h[2] = { 5, 6 };
	const char *meta = "{\"format\": \"ferry-mf-factors\", \"version\": 1, \"rank\": 2, "
			   "\"rows\": 2, \"cols\": 1, \"ids\": \"raw\"}";
	const float nanv[2] = { NAN, 1 };

	make_dir();
	put("factors.json", meta, strlen(meta));
	put("W.f32", (const char *)w, sizeof(w));
	put("H.f32", (const char *)h, sizeof(h));
	put("rows.txt", "a\nb\n", 4);
	put("cols.txt", "x\n", 2);
	{
		struct mf_ids u = { 0 }, it = { 0 };
		struct mf_factors fx;
		char err[512];
		int raw;

		cr_assert_eq(mf_factors_load(tmp_dir, &fx, &u, &it, &raw, err, sizeof(err)), 0,
			     "%s", err);
		mf_factors_free(&fx);
		mf_ids_free(&u);
		mf_ids_free(&it);
	}
	put("rows.txt", "a\na\n", 4);
	expect_load_error("appears twice");
	put("rows.txt", "a\nb\nc\n", 6);
	expect_load_error("more than the 2 ids");
	put("rows.txt", "a\nb\n", 4);
	put("W.f32", (const char *)w, 3 * sizeof(float));
	expect_load_error("holds 12 bytes");
	put("W.f32", (const char *)w, sizeof(w));
	put("H.f32", (const char *)nanv, sizeof(nanv));
	expect_load_error("not a finite number");
	put("factors.json", "{\"format\": \"x\"}", 15);
	expect_load_error("ferry-mf-factors");
	put("factors.json", "{\"format\": ", 11);
	expect_load_error("factors.json:");
}

/*
 * Random files of lines made of ids, ratings and separators, some of them
 * broken (an empty field, a lone quote, a wrong separator, a rating that is
 * no number): the reader returns 0 or -EINVAL with a message, never crashes,
 * and what it accepts is in range.
 */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

Test(mf_ratings, random_files_are_read_or_refused_never_crash)
{
	static const char *const toks[] = { "1",    "42",  "a b", "\"q,\"\"x\"", "",	 "3.5",
					    "-2e3", "nan", "x:y", "\"",		 "7\t8", "1e999",
					    "::",   ",",   "0",	  "userId" };
	static const char *const seps[] = { ",", "\t", "::" };
	static const enum mf_format fmts[] = { MF_FORMAT_CSV, MF_FORMAT_TSV, MF_FORMAT_DAT };
	uint64_t seed = 0x9e3779b97f4a7c15ull;
	int accepted = 0, refused = 0;
	char text[2048];

	for (int round = 0; round < 900; round++) {
		int f = round % 3, lines = 1 + (int)(rnd(&seed) % 6);
		struct parsed p = { 0 };
		size_t len = 0;
		int rc;

		for (int l = 0; l < lines; l++) {
			int nf = 2 + (int)(rnd(&seed) % 3);

			for (int k = 0; k < nf; k++) {
				/* mostly good fields: a number id, a number rating */
				const char *t = rnd(&seed) % 4 ? (k == 2 ? "4.5" : "17") :
								 toks[rnd(&seed) % 16];
				const char *sep = rnd(&seed) % 10 ? seps[f] : seps[rnd(&seed) % 3];

				len += (size_t)snprintf(text + len, sizeof(text) - len, "%s%s", t,
							k + 1 < nf ? sep : "");
			}
			len += (size_t)snprintf(text + len, sizeof(text) - len, "%s",
						rnd(&seed) % 5 ? "\n" : "\r\n");
		}
		rc = parse(write_tmp(text), fmts[f], &p);
		cr_assert(rc == 0 || rc == -EINVAL, "rc %d for '%s'", rc, text);
		if (!rc) {
			accepted++;
			cr_assert_eq(p.m.rows, p.users.n);
			for (size_t k = 0; k < p.m.nnz; k++)
				cr_assert(p.m.e[k].i < p.m.rows && p.m.e[k].j < p.m.cols &&
					  isfinite(p.m.e[k].v));
		} else {
			refused++;
			cr_assert(p.err[0], "refused without a message: '%s'", text);
		}
		parsed_free(&p);
	}
	cr_log_info("%d random files accepted, %d refused", accepted, refused);
	cr_assert(accepted > 50 && refused > 50, "the generator is off: %d accepted, %d refused",
		  accepted, refused);
}

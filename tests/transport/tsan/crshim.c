/* SPDX-License-Identifier: MIT */
/*
 * crshim.c - the runner behind criterion.h (TSan runs of the suites).
 *
 * Runs every registered test once per parameter, each in a forked child
 * (the parent stays single-threaded, so fork is safe under TSan), bounded by
 * the test's .timeout. Exit status 77 from a child means skipped.
 * Usage: test_xxx [options] [substring of the test names to run]; Criterion's
 * options (--jobs 1 -S, as ctest passes them) are accepted and ignored.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "criterion/criterion.h"

#define CRSHIM_MAX_TESTS 128
#define CRSHIM_SKIPPED 77

struct crshim_test {
	const char *suite, *name;
	void (*fn)(void *);
	struct crshim_params (*params)(void);
	const struct crshim_opts *opts;
};

static struct crshim_test crshim_tests[CRSHIM_MAX_TESTS];
static int crshim_ntests;
static int crshim_failed; /* in a child: an expectation failed */

void crshim_register(const char *suite, const char *name, void (*fn)(void *),
		     struct crshim_params (*params)(void), const struct crshim_opts *opts)
{
	if (crshim_ntests == CRSHIM_MAX_TESTS) {
		fprintf(stderr, "crshim: more than %d tests\n", CRSHIM_MAX_TESTS);
		exit(2);
	}
	crshim_tests[crshim_ntests++] = (struct crshim_test){ suite, name, fn, params, opts };
}

void crshim_fail(int fatal, const char *file, int line, const char *expr, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[FAIL] %s:%d: %s: ", file, line, expr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	crshim_failed = 1;
	if (fatal)
		_exit(1);
}

void crshim_log(const char *level, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[%s] ", level);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

struct crshim_params crshim_no_params(void)
{
	static char one;

	return (struct crshim_params){ .base = &one, .elem = 0, .n = 1 };
}

void crshim_skip(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "[SKIP] ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	_exit(CRSHIM_SKIPPED);
}

static int crshim_run(const struct crshim_test *t, void *param)
{
	pid_t pid = fork();
	int st;

	if (pid < 0) {
		perror("crshim: fork");
		return -1;
	}
	if (!pid) {
		alarm(t->opts->timeout ? (unsigned)t->opts->timeout : 60);
		if (t->opts->init)
			t->opts->init();
		t->fn(param);
		exit(crshim_failed); /* exit(): TSan reports and sets the status at exit */
	}
	if (waitpid(pid, &st, 0) < 0) {
		perror("crshim: waitpid");
		return -1;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == CRSHIM_SKIPPED)
		return 1;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	fprintf(stderr, "[FAIL] %s::%s: %s %d\n", t->suite, t->name,
		WIFSIGNALED(st) ? "killed by signal" : "exit status",
		WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	return -1;
}

int main(int argc, char **argv)
{
	int pass = 0, fail = 0, skip = 0;
	const char *only = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--jobs") || !strcmp(argv[i], "-j"))
			i++; /* and its value */
		else if (argv[i][0] != '-')
			only = argv[i];
	}
	for (int i = 0; i < crshim_ntests; i++) {
		const struct crshim_test *t = &crshim_tests[i];
		struct crshim_params p = t->params();

		if (only && !strstr(t->name, only))
			continue;
		for (size_t k = 0; k < p.n; k++) {
			struct timespec t0, t1;
			int rc;

			clock_gettime(CLOCK_MONOTONIC, &t0);
			rc = crshim_run(t, (char *)p.base + k * p.elem);
			clock_gettime(CLOCK_MONOTONIC, &t1);
			if (!rc)
				fprintf(stderr, "[PASS] %s::%s[%zu]: (%.2fs)\n", t->suite, t->name,
					k,
					(double)(t1.tv_sec - t0.tv_sec) +
						(double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
			pass += rc == 0;
			skip += rc == 1;
			fail += rc < 0;
		}
	}
	fprintf(stderr, "crshim: Tested: %d | Passing: %d | Failing: %d | Skipped: %d\n",
		pass + fail + skip, pass, fail, skip);
	return fail ? 1 : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * criterion.h - a stand-in for the part of Criterion's API that the suites
 * run under ThreadSanitizer use (tests/transport/test_transport.c, and the
 * threaded suites test_store, test_cluster and test_onesided, which
 * tests/CMakeLists.txt builds against it in a -DFERRY_SANITIZE=thread tree).
 *
 * Criterion 2.4 cannot start under TSan: its BoxFort arena probes for free
 * addresses inside the ranges TSan reserves and aborts with "Could not
 * initialize inheritable arena" (Snaipe/Criterion#274). run.sh compiles the
 * suite against this header and crshim.c instead: each test (and each
 * parameter of a parameterized one) runs in a forked child with an alarm()
 * timeout, as Criterion would run it.
 */
#ifndef FERRY_TESTS_CRSHIM_H
#define FERRY_TESTS_CRSHIM_H

#include <stddef.h>
#include <string.h>

struct crshim_params {
	void *base;
	size_t elem;
	size_t n;
};

struct crshim_opts {
	void (*init)(void);
	int timeout; /* seconds */
};

void crshim_register(const char *suite, const char *name, void (*fn)(void *),
		     struct crshim_params (*params)(void), const struct crshim_opts *opts);
void crshim_fail(int fatal, const char *file, int line, const char *expr, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
void crshim_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void crshim_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* the parameter list of a plain Test(): one run, no parameter */
struct crshim_params crshim_no_params(void);

#define CRSHIM_CHECK(fatal, cond, ...)                                                 \
	do {                                                                           \
		if (!(cond))                                                           \
			crshim_fail(fatal, __FILE__, __LINE__, #cond, "" __VA_ARGS__); \
	} while (0)

#define cr_assert(cond, ...) CRSHIM_CHECK(1, cond, __VA_ARGS__)
#define cr_expect(cond, ...) CRSHIM_CHECK(0, cond, __VA_ARGS__)
#define cr_assert_not(cond, ...) cr_assert(!(cond), __VA_ARGS__)
#define cr_assert_eq(a, b, ...) cr_assert((a) == (b), __VA_ARGS__)
#define cr_expect_eq(a, b, ...) cr_expect((a) == (b), __VA_ARGS__)
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b), __VA_ARGS__)
#define cr_assert_lt(a, b, ...) cr_assert((a) < (b), __VA_ARGS__)
#define cr_assert_leq(a, b, ...) cr_assert((a) <= (b), __VA_ARGS__)
#define cr_assert_gt(a, b, ...) cr_assert((a) > (b), __VA_ARGS__)
#define cr_assert_geq(a, b, ...) cr_assert((a) >= (b), __VA_ARGS__)
#define cr_expect_lt(a, b, ...) cr_expect((a) < (b), __VA_ARGS__)
#define cr_expect_fail(...) cr_expect(0, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) cr_expect((a) > (b), __VA_ARGS__)
#define cr_assert_null(p, ...) cr_assert((p) == NULL, __VA_ARGS__)
#define cr_assert_not_null(p, ...) cr_assert((p) != NULL, __VA_ARGS__)
#define cr_assert_arr_eq(a, b, size, ...) cr_assert(!memcmp((a), (b), (size)), __VA_ARGS__)
#define cr_skip_test(...) crshim_skip(__VA_ARGS__)
#define cr_log_info(...) crshim_log("INFO", __VA_ARGS__)
#define cr_log_error(...) crshim_log("ERROR", __VA_ARGS__)

#define cr_make_param_array(type, arr, count) \
	((struct crshim_params){ .base = (arr), .elem = sizeof(type), .n = (count) })

#define ParameterizedTestParameters(suite, name) \
	static struct crshim_params suite##_##name##_params(void)

#define ParameterizedTest(decl, suite, name, ...)                                       \
	static void suite##_##name##_impl(decl);                                        \
	__attribute__((constructor)) static void suite##_##name##_reg(void)             \
	{                                                                               \
		static const struct crshim_opts opts_ = { __VA_ARGS__ };                \
		crshim_register(#suite, #name, (void (*)(void *))suite##_##name##_impl, \
				suite##_##name##_params, &opts_);                       \
	}                                                                               \
	static void suite##_##name##_impl(decl)

#define Test(suite, name, ...)                                                                  \
	static void suite##_##name##_impl(void);                                                \
	static void suite##_##name##_run(void *unused_)                                         \
	{                                                                                       \
		(void)unused_;                                                                  \
		suite##_##name##_impl();                                                        \
	}                                                                                       \
	__attribute__((constructor)) static void suite##_##name##_reg(void)                     \
	{                                                                                       \
		static const struct crshim_opts opts_ = { __VA_ARGS__ };                        \
		crshim_register(#suite, #name, suite##_##name##_run, crshim_no_params, &opts_); \
	}                                                                                       \
	static void suite##_##name##_impl(void)

#endif /* FERRY_TESTS_CRSHIM_H */

/* SPDX-License-Identifier: MIT */
/*
 * test_fuzz_regress.c - every input a fuzz target (fuzz/) crashed on, replayed
 * through the function that failed, with what it must do instead. The
 * inputs themselves are kept in fuzz/regress/ (run a target on one to see).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "ferry/ferry.h"
#include "lib/core/bootstrap.h"

/*
 * fuzz_bootstrap, fuzz/regress/bootstrap-strerror-int-min: rank 0 (or
 * whoever answers on the rendezvous port) refuses a node with status
 * INT_MIN; the node's log line named it with ferry_strerror(), which negated
 * it (undefined: UBSan aborts; in a plain build it printed strerror of a
 * negative number).
 */
Test(fuzz_regress, a_bootstrap_refusal_with_status_int_min_is_named_safely)
{
	struct ferry_bs_list raw = { .magic = FERRY_BS_MAGIC, .status = INT_MIN, .world = 4 };
	struct ferry_bs_list list;
	struct ferry_config c = { .rank = 2, .world = 4, .rdv_port = 29500, .rank_src = "test" };
	char why[512] = "";

	snprintf(c.rdv_host, sizeof(c.rdv_host), "127.0.0.1");
	cr_assert_eq(ferry__bs_list_parse(&c, &raw, sizeof(raw), &list, why, sizeof(why)), INT_MIN);
	cr_assert(strstr(why, "rank 0 refused rank 2: unknown Ferry error"), "%s", why);
	cr_assert_str_eq(ferry_strerror(INT_MIN), "unknown Ferry error");
	cr_assert_str_eq(ferry_strerror(-FERRY_E_PEER), "a peer failed or disconnected");
	cr_assert_str_eq(ferry_strerror(FERRY_E_PEER), "a peer failed or disconnected");
	cr_assert_str_eq(ferry_strerror(-ENOENT), strerror(ENOENT));
}

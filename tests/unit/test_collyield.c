/* SPDX-License-Identifier: MIT */
/*
 * test_collyield.c - when a collective's waiter yields the CPU at once
 * (lib/coll/base.c, ferry__coll_yield_decide): FERRY_COLL_YIELD forces
 * it either way; auto follows Open MPI's oversubscription flag, else the
 * ranks on this host against its CPUs.
 */
#include <criterion/criterion.h>
#include <stdbool.h>

#include "lib/coll/coll.h"

Test(collyield, the_setting_forces_either_way)
{
	cr_assert(ferry__coll_yield_decide("1", "0", "1", 64));
	cr_assert(!ferry__coll_yield_decide("0", "1", "64", 2));
}

Test(collyield, auto_follows_open_mpi_oversubscription)
{
	cr_assert(ferry__coll_yield_decide(NULL, "1", NULL, 64));
	cr_assert(ferry__coll_yield_decide("auto", "1", "2", 64));
	cr_assert(!ferry__coll_yield_decide(NULL, "0", NULL, 2));
}

Test(collyield, auto_compares_the_ranks_here_with_the_cpus)
{
	cr_assert(ferry__coll_yield_decide(NULL, NULL, "4", 2));
	cr_assert(!ferry__coll_yield_decide(NULL, NULL, "2", 2));
	cr_assert(!ferry__coll_yield_decide(NULL, NULL, "1", 2));
	/* nothing known: spin first, as before */
	cr_assert(!ferry__coll_yield_decide(NULL, NULL, NULL, 2));
	cr_assert(!ferry__coll_yield_decide(NULL, NULL, "4", -1));
}

Test(collyield, bad_values_count_as_auto)
{
	/* a bad setting warns and decides as auto would */
	cr_assert(ferry__coll_yield_decide("yes", NULL, "8", 2));
	cr_assert(!ferry__coll_yield_decide("yes", NULL, "1", 2));
	/* a local size that is not a number is not known */
	cr_assert(!ferry__coll_yield_decide(NULL, NULL, "4x", 2));
	cr_assert(!ferry__coll_yield_decide(NULL, NULL, "", 2));
	cr_assert(!ferry__coll_yield_decide(NULL, NULL, "99999999999999999999999", 2));
}

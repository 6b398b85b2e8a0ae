/* SPDX-License-Identifier: MIT */
/*
 * Unit: a table's per-node map of the consistency models (lib/cons/map.c):
 * the memory bound, deltas never evicted, a flush's deltas added to the
 * copies taken before it, and dropped copies when it failed.
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "lib/cons/cons.h"

Test(consmap, copies_stay_within_the_bound_and_deltas_are_never_evicted)
{
	struct ferry_cons_map m;
	float v[16] = { 0 }, d[16], out[16];
	const uint64_t limit = 64 << 10;

	cr_assert_eq(ferry__cons_map_init(&m, limit), 0);
	for (int i = 0; i < 16; i++)
		d[i] = 1;
	/* 100 keys with unsent deltas first: they must survive every eviction */
	for (uint64_t k = 0; k < 100; k++)
		cr_assert_eq(ferry__cons_map_pend_add(&m, ferry__cons_map_get(&m, k, 16), d), 0);
	for (uint64_t k = 0; k < 20000; k++) {
		struct ferry_cons_ent *e = ferry__cons_map_get(&m, k, 16);

		v[0] = (float)k;
		cr_assert_not_null(e);
		cr_assert_eq(ferry__cons_map_set_val(&m, e, v, k), 0);
		ferry__cons_map_evict(&m);
		cr_assert_leq(m.bytes, limit, "%llu bytes after key %llu",
			      (unsigned long long)m.bytes, (unsigned long long)k);
	}
	/* the newest copies are kept, the oldest went */
	cr_assert_not_null(ferry__cons_map_find(&m, 19999));
	cr_assert(ferry__cons_map_find(&m, 19999)->have_val);
	cr_assert(!ferry__cons_map_find(&m, 150) || !ferry__cons_map_find(&m, 150)->have_val);
	/* every delta is still there */
	cr_assert_eq(m.npend, 100);
	for (uint64_t k = 0; k < 100; k++) {
		struct ferry_cons_ent *e = ferry__cons_map_find(&m, k);

		cr_assert_not_null(e);
		cr_assert_not_null(e->pend);
		cr_assert_eq(e->pend[3], 1.0f);
	}
	/* a key with neither copy nor delta costs nothing */
	cr_assert_lt(m.n, 20000);
	ferry__cons_map_fini(&m);
	(void)out;
}

Test(consmap, a_flush_adds_its_deltas_to_older_copies_or_drops_them_when_it_failed)
{
	struct ferry_cons_map m;
	float v[2] = { 10, 20 }, d[2] = { 1, 2 }, out[2];
	struct ferry_cons_ent *a, *b;
	uint64_t *keys;
	float *deltas;
	size_t n;

	cr_assert_eq(ferry__cons_map_init(&m, 1 << 20), 0);
	a = ferry__cons_map_get(&m, 7, 2);
	cr_assert_eq(ferry__cons_map_set_val(&m, a, v, 3), 0);
	cr_assert_eq(ferry__cons_map_pend_add(&m, a, d), 0);
	cr_assert_eq(ferry__cons_map_pend_add(&m, a, d), 0); /* coalesced: +2, +4 */
	ferry__cons_map_read(a, out);
	cr_assert(out[0] == 12 && out[1] == 24, "%g %g", (double)out[0], (double)out[1]);

	/* the flush takes the sums; a read during it still sees them (in flight) */
	cr_assert_eq(ferry__cons_map_flush_take(&m, &keys, &deltas, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert(keys[0] == 7 && deltas[0] == 2 && deltas[1] == 4);
	cr_assert_null(a->pend);
	ferry__cons_map_read(a, out);
	cr_assert(out[0] == 12 && out[1] == 24);
	/* a push during the flush is unsent again, beside the one in flight */
	cr_assert_eq(ferry__cons_map_pend_add(&m, a, d), 0);
	ferry__cons_map_read(a, out);
	cr_assert(out[0] == 13 && out[1] == 26);
	ferry__cons_map_flush_done(&m); /* out: APPLIED, the default */
	free(keys);
	free(deltas);
	/* applied: the copy holds it now, the later push is still unsent */
	cr_assert_eq(a->val[0], 12.0f);
	ferry__cons_map_read(a, out);
	cr_assert(out[0] == 13 && out[1] == 26);

	/* unanswered (the batch keeps the deltas): the copy may or may not hold
	 * them, so it goes; a key with deltas only, and no copy, stays for
	 * nothing else */
	b = ferry__cons_map_get(&m, 8, 2);
	cr_assert_eq(ferry__cons_map_pend_add(&m, b, d), 0);
	cr_assert_eq(ferry__cons_map_flush_take(&m, &keys, &deltas, &n), 0);
	cr_assert_eq(n, 2);
	a->out = FERRY_CONS_OUT_UNKNOWN;
	b->out = FERRY_CONS_OUT_UNKNOWN;
	ferry__cons_map_flush_done(&m);
	free(keys);
	free(deltas);
	cr_assert_null(ferry__cons_map_find(&m, 7));
	cr_assert_null(ferry__cons_map_find(&m, 8));
	cr_assert_eq(m.n, 0);

	/* not applied (HELD): the deltas are unsent again, summed with a push
	 * made during the flush; the copy stays and reads do not change */
	a = ferry__cons_map_get(&m, 9, 2);
	cr_assert_eq(ferry__cons_map_set_val(&m, a, v, 3), 0);
	cr_assert_eq(ferry__cons_map_pend_add(&m, a, d), 0);
	cr_assert_eq(ferry__cons_map_flush_take(&m, &keys, &deltas, &n), 0);
	cr_assert_eq(ferry__cons_map_pend_add(&m, a, d), 0);
	a->out = FERRY_CONS_OUT_HELD;
	ferry__cons_map_flush_done(&m);
	free(keys);
	free(deltas);
	cr_assert_null(a->infl);
	cr_assert(a->pend && a->pend[0] == 2 && a->pend[1] == 4);
	cr_assert_eq(m.npend, 1);
	cr_assert_eq(m.pend_floats, 2);
	cr_assert_eq(a->val[0], 10.0f);
	ferry__cons_map_read(a, out);
	cr_assert(out[0] == 12 && out[1] == 24, "%g %g", (double)out[0], (double)out[1]);
	/* and go in the next flush */
	cr_assert_eq(ferry__cons_map_flush_take(&m, &keys, &deltas, &n), 0);
	cr_assert(n == 1 && keys[0] == 9 && deltas[0] == 2 && deltas[1] == 4);
	ferry__cons_map_flush_done(&m);
	free(keys);
	free(deltas);
	cr_assert_eq(a->val[0], 12.0f);
	ferry__cons_map_fini(&m);
}

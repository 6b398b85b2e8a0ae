/* SPDX-License-Identifier: MIT */
/*
 * check.c - the checks every call on a table with a model or hot keys makes
 * first (cons.h): one function for cons.c and hotops.c, which call nothing
 * else of each other's, so it stays a leaf (ci/check-layers.sh).
 */
#include <errno.h>

#include "lib/cons/cons.h"

int ferry__cons_check_call(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			   size_t n, const void *buf, const char *what)
{
	if (!w || w->fy != t->fy) {
		ferry_err("%s: %s worker for table %u; pass a worker of the table's node", what,
			  w ? "another node's" : "a NULL", t->id);
		return -EINVAL;
	}
	if (n && (!keys || !buf)) {
		ferry_err("%s: NULL %s for %zu keys", what, keys ? "values" : "keys", n);
		return -EINVAL;
	}
	if (atomic_load(&t->fy->closed))
		return -FERRY_E_CLOSED;
	for (size_t i = 0; i < n; i++)
		if (!ferry__key_ok(t, keys[i])) {
			ferry_err("%s: key %llu is out of range; table %u has keys 0 .. %llu", what,
				  (unsigned long long)keys[i], t->id,
				  (unsigned long long)t->params.num_keys - 1);
			return -ERANGE;
		}
	return 0;
}

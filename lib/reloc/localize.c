/* SPDX-License-Identifier: MIT */
/*
 * localize.c - the public entry points of relocation: ferry_localize() and
 * its started form hand a request of the ops machinery reloc.c's start hook
 * (ferry__reloc_start), and the table's teardown of moves that never ended.
 * Apart from reloc.c so that file stays within the size rule; it calls
 * reloc.c, never the other way.
 */
#include "lib/dir/pend.h"
#include "lib/ops/ops.h"
#include "lib/reloc/inbox.h"
#include "lib/reloc/reloc.h"

int ferry_localize(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n)
{
	return ferry__ops_sync(w, t, FERRY_REQ_LOCALIZE, keys, n, NULL, NULL, ferry__reloc_start);
}

int ferry_localize_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			 size_t n, uint64_t *ticket_p)
{
	return ferry__ops_async(w, t, FERRY_REQ_LOCALIZE, keys, n, NULL, NULL, ferry__reloc_start,
				ticket_p);
}

/* moves that never ended: their landing entries go back (the inbox goes next) */
static void reloc_pend_drop(void *arg, struct ferry_pend *e)
{
	ferry__inbox_put(arg, e->landing);
}

void ferry__reloc_table_fini(struct ferry_table *t)
{
	ferry__pend_fini(&t->pend, reloc_pend_drop, t);
}

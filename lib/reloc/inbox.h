/* SPDX-License-Identifier: MIT */
/* inbox.h - the landing inbox of a table (inbox.c). */
#ifndef FERRY_LIB_RELOC_INBOX_H
#define FERRY_LIB_RELOC_INBOX_H

#include "lib/core/core.h"

/* create and register the table's landing inbox where the transport writes
 * one-sided (table build; none is not an error); 0 or -ENOMEM */
int ferry__reloc_inbox_init(struct ferry *fy, struct ferry_table *t);
/* table free: no handler sees the table any more */
void ferry__reloc_inbox_fini(struct ferry *fy, struct ferry_table *t);
/* tests: entries and free entries of the inbox; any thread */
void ferry__reloc_inbox_usage(struct ferry_table *t, uint32_t *entries_p, uint32_t *nfree_p);
/* reserve an entry in @writer's region, or FERRY_LANDING_NONE; t->pend.lock held */
uint32_t ferry__inbox_get(struct ferry_table *t, uint32_t writer);
/* send each peer the rkey of its region, to it alone (create, once it succeeded) */
void ferry__reloc_inbox_grant(struct ferry *fy, struct ferry_table *t);
/* may this node write entry @idx of @owner's inbox of @entries (its region)? */
int ferry__reloc_inbox_writable(const struct ferry_table *t, uint32_t owner, uint32_t entries,
				uint32_t idx);
/* give a reserved entry back (FERRY_LANDING_NONE: nothing); t->pend.lock held */
void ferry__inbox_put(struct ferry_table *t, uint32_t idx);
/* the value written into entry @idx */
const float *ferry__inbox_entry(const struct ferry_table *t, uint32_t idx);

#endif /* FERRY_LIB_RELOC_INBOX_H */

/* SPDX-License-Identifier: MIT */
/* reloc.h - what the relocation module (lib/reloc/) offers the layers above. */
#ifndef FERRY_LIB_RELOC_H
#define FERRY_LIB_RELOC_H

#include "lib/core/core.h"
#include "lib/reloc/inbox.h"

/* register the LOCALIZE, HANDOVER_REQ, HANDOVER, HANDOVER_DONE and LOC_ACK
 * handlers; before the node starts */
int ferry__reloc_attach(struct ferry *fy);
/* stuck.c: the peer-failure listener (moves whose home failed) */
void ferry__reloc_on_peer_failed(struct ferry *fy, uint32_t rank);
/* table free: drop moves that never ended, with their landing entries.
 * The calling thread is RCU-registered and outside a read-side section. */
void ferry__reloc_table_fini(struct ferry_table *t);

#endif /* FERRY_LIB_RELOC_H */

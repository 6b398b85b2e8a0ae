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
/* replicas, lib/reloc/stuck.c: a LOCALIZE at the new home of a failed home's
 * key it holds nothing of (true: handled), and a hand-over request to itself
 * for one (the takeover ends the move). Progress thread, pend.lock not held */
bool ferry__reloc_failed_home_move(struct ferry_table *t, uint64_t key, uint32_t src);
void ferry__reloc_failed_home_want(struct ferry_table *t, uint64_t key, uint32_t requester);
/* replicas, lib/reloc/stuck.c: the key's home dropped the move of entry @e
 * (pend.lock held): it stays for a hand-over still in flight; returns its
 * waiters, for ferry__reloc_wake_list outside the lock */
struct ferry_pend_waiter *ferry__reloc_drop(struct ferry_table *t, struct ferry_pend *e);
void ferry__reloc_wake_list(struct ferry *fy, struct ferry_pend_waiter *wt, int status);
/* a dropped move past its grace with nothing queued goes now (a localize of
 * its key, when no heartbeat ticks); pend.lock held. true: @e is gone */
bool ferry__reloc_drop_expired(struct ferry_table *t, struct ferry_pend *e);
/* the heartbeat's tick: dropped moves past their grace go */
void ferry__reloc_on_tick(struct ferry *fy);
/* table free: drop moves that never ended, with their landing entries.
 * The calling thread is RCU-registered and outside a read-side section. */
void ferry__reloc_table_fini(struct ferry_table *t);
/* the start hook of a localize request (ops' ferry_req_start_fn): sends its
 * LOCALIZE frames; the worker's thread. Return: 0 or a negative errno. */
int ferry__reloc_start(struct ferry_worker *w, struct ferry_table *t, struct ferry_req *r,
		       uint64_t ticket);

#endif /* FERRY_LIB_RELOC_H */

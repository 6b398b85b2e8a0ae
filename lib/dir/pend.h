/* SPDX-License-Identifier: MIT */
/*
 * pend.h - keys on their way to this node: the requester's record of a
 * localize under way, with what arrived for the key before its value did.
 *
 *   ferry__pend_add (requester starts a move) -> entry {key, slot, landing}
 *   an OP for the key arrives first   -> ferry__pend_queue_op: queued, in order
 *   a HANDOVER_REQ arrives first      -> ferry__pend_append: queued, in order
 *   the value arrives                 -> ferry__pend_del, replay, wake, free
 *
 * A liburcu lock-free hash table (cds_lfht, resized automatically) maps key
 * to entry, so a localize of a million keys stays O(1) per key. Bound: one
 * entry per key moving to this node (at most the arena's capacity, as each
 * holds a reserved slot) plus what queued behind it.
 *
 * Locking: every function but init and fini is called with the table's
 * lock (struct ferry_pend_table.lock) held and rcu_read_lock held (the
 * memb flavor; workers and the progress thread are registered). The lock
 * serializes changes and also covers the table's landing inbox
 * (lib/reloc/inbox.c); it is never taken on the local read path. An
 * unlinked entry is its caller's; ferry__pend_free frees what queued at
 * once and the entry itself after a grace period (a concurrent lookup may
 * still traverse it).
 */
#ifndef FERRY_LIB_DIR_PEND_H
#define FERRY_LIB_DIR_PEND_H

#include <pthread.h>
#include <stdint.h>

#include <urcu/urcu-memb.h>
#include <urcu/rculfhash.h>

#include "lib/core/proto.h"

enum ferry_pend_kind {
	FERRY_PEND_OP = 1,  /* an operation that reached us before the value */
	FERRY_PEND_HANDOVER /* the home moved the key on before it got here */
};

struct ferry_pend_item {
	struct ferry_pend_item *next;
	enum ferry_pend_kind kind;
	struct ferry_msg_op op;		   /* FERRY_PEND_OP */
	struct ferry_msg_key key;	   /* FERRY_PEND_OP */
	uint32_t requester, slot, landing; /* FERRY_PEND_HANDOVER */
	uint32_t ticket;		   /* FERRY_PEND_HANDOVER: the requester's */
	float vals[];			   /* FERRY_PEND_OP push/set */
};

struct ferry_pend_waiter {
	struct ferry_pend_waiter *next;
	uint32_t worker;
	uint64_t ticket;
	uint32_t idx;
};

struct ferry_pend {
	uint64_t key;
	uint32_t slot;			     /* the slot reserved for the value */
	uint32_t landing;		     /* landing entry reserved, or FERRY_LANDING_NONE */
	uint32_t ticket;		     /* the move's tag: its frames must echo it */
	struct ferry_pend_item *head, *tail; /* arrived early, in order */
	struct ferry_pend_waiter *waiters;   /* localize requests to wake */
	uint32_t nqueued;		     /* items at head..tail: at most FERRY_PEND_QUEUE_MAX */
	int stuck;			     /* the move cannot end (its home failed): 0 or why */
	int64_t dropped_ns;		     /* dropped by the key's home, kept for a hand-over
					      * still in flight (lib/reloc/stuck.c): when, or 0 */
	struct cds_lfht_node node;
	struct rcu_head rcu;
	struct ferry_pend *retired_next; /* in the table's batch of freed entries */
};

/* operations queued behind one key's move, at most: more are refused with
 * -EAGAIN (a move that takes long must not queue without bound) */
#define FERRY_PEND_QUEUE_MAX 4096u

struct ferry_pend_table {
	pthread_mutex_t lock;
	struct cds_lfht *ht; /* key -> struct ferry_pend */
	uint64_t n;	     /* entries (lock) */
	/* freed entries waiting to be handed to RCU together: at most
	 * FERRY_PEND_RETIRE_BATCH - 1 of them (retire_lock) */
	pthread_mutex_t retire_lock;
	struct ferry_pend *retired;
	uint32_t nretired;
};

/* freed entries go to call_rcu in batches of this many: one call per key
 * cost a localize of 1000 keys 5% of its progress threads' time, and woke
 * liburcu's call_rcu thread for each */
#define FERRY_PEND_RETIRE_BATCH 64u

/* Return: 0 or -ENOMEM. Context: table build. */
int ferry__pend_init(struct ferry_pend_table *pt);
/*
 * Tear down: unlink every entry left (moves that never ended), hand each to
 * @each (may be NULL) to give back what it holds, free it. Context: no other
 * user of the table is left; the calling thread must be RCU-registered and
 * outside a read-side section.
 */
void ferry__pend_fini(struct ferry_pend_table *pt, void (*each)(void *arg, struct ferry_pend *e),
		      void *arg);

struct ferry_pend *ferry__pend_find(struct ferry_pend_table *pt, uint64_t key);
/* a new entry for @key (which has none); NULL on -ENOMEM */
struct ferry_pend *ferry__pend_add(struct ferry_pend_table *pt, uint64_t key, uint32_t slot,
				   uint32_t landing, uint32_t ticket);
/* unlink @e; it is the caller's to replay and free */
void ferry__pend_del(struct ferry_pend_table *pt, struct ferry_pend *e);
/* call @fn on every entry; pt->lock and rcu_read_lock held (@fn must not
 * add or remove entries) */
void ferry__pend_for_each(struct ferry_pend_table *pt, void (*fn)(void *arg, struct ferry_pend *e),
			  void *arg);
/* free an unlinked entry of @pt, its queue and its waiters (the entry
 * itself after a grace period, with others: FERRY_PEND_RETIRE_BATCH).
 * Context: any RCU-registered thread; pt->lock need not be held. */
void ferry__pend_free(struct ferry_pend_table *pt, struct ferry_pend *e);
/* queue @it behind what arrived for @e before */
void ferry__pend_append(struct ferry_pend *e, struct ferry_pend_item *it);
/*
 * ferry__pend_queue_op - queue an arriving operation on a key on its way here
 * Takes and releases pt->lock itself (rcu_read_lock held by the caller).
 * Return: 1 queued, 0 the key is not expected here, or (not queued) -ENOMEM,
 * -EAGAIN (FERRY_PEND_QUEUE_MAX queued already), or the entry's stuck status
 * (its move cannot end).
 */
int ferry__pend_queue_op(struct ferry_pend_table *pt, const struct ferry_msg_op *op,
			 const struct ferry_msg_key *k, const float *vals);

#endif /* FERRY_LIB_DIR_PEND_H */

/* SPDX-License-Identifier: MIT */
/*
 * ops.h - what the operations module (lib/ops/) offers the layers above it
 * (reloc, table, ferry.c): its attach, the request machinery that localize
 * reuses, and serving key operations.
 */
#ifndef FERRY_LIB_OPS_H
#define FERRY_LIB_OPS_H

#include "lib/core/timeline.h" /* the step stamps of ferry-bench --timeline */
#include "lib/core/core.h"

/* register the OP and REPLY handlers (serve.c); before the node starts */
int ferry__ops_attach(struct ferry *fy);

/*
 * Run an operation as a request of @w (request.c). @op is enum ferry_op, or
 * FERRY_REQ_LOCALIZE with @start: the function that sends the request's
 * remote part instead of the OP frames of a pull, push or set (so a module
 * above, reloc, reuses tickets, holding and waiting without ops calling it
 * by name). Synchronous: returns when done, 0 or a negative errno; async:
 * the ticket in *@ticket_p. Context: @w's thread.
 */
int ferry__ops_sync(struct ferry_worker *w, struct ferry_table *t, uint8_t op, const uint64_t *keys,
		    size_t n, const float *in, float *out, ferry_req_start_fn start);
int ferry__ops_async(struct ferry_worker *w, struct ferry_table *t, uint8_t op,
		     const uint64_t *keys, size_t n, const float *in, float *out,
		     ferry_req_start_fn start, uint64_t *ticket_p);

/* note that request @r sent something to @dst: its wait ends with
 * -FERRY_E_PEER if @dst fails. The worker's thread. */
static inline void ferry__ops_req_dst(struct ferry_req *r, uint32_t dst)
{
	for (uint8_t i = 0; i < r->ndsts; i++)
		if (r->dsts[i] == dst)
			return;
	if (r->ndsts < sizeof(r->dsts) / sizeof(r->dsts[0]))
		r->dsts[r->ndsts++] = dst;
	else
		r->dsts_many = true;
}

/* mark keys @idx of a ticket done with @status (and pulled @vals); progress
 * thread or a worker, rcu_read_lock held (serve.c) */
void ferry__ops_complete(struct ferry *fy, uint32_t worker, uint64_t ticket, const uint32_t *idx,
			 uint32_t count, int status, const float *vals, size_t nvals);
/* send results of an operation to its origin (or complete it, if ours) */
void ferry__ops_send_reply(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			   int status, const uint32_t *idx, uint32_t count, const float *vals,
			   size_t nvals);
/* pass one key operation on toward its owner; progress thread */
void ferry__ops_forward_one(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			    const struct ferry_msg_key *k, const float *in);
/* apply one key operation to a live slot here; 0 or -EAGAIN (not live);
 * rcu_read_lock held */
int ferry__ops_apply(struct ferry_table *t, uint8_t op, uint64_t key, const float *in, float *out);

/*
 * ferry__ops_materialize - a sparse key homed and owned here that has no
 * slot yet gets one, with its initial value, published (lib/ops/sparse.c).
 * Return: 0 with *@s_p its live slot (made now, or there already);
 * -EAGAIN: not such a key (not sparse, not homed here, owned elsewhere, or
 * a move to here is under way); -ENOSPC: the table is full here (logged
 * once); -ENOMEM. Context: the progress thread (the home's owner records
 * are its own), rcu_read_lock held. _locked: t->pend.lock held, and the
 * owner is not checked: for the home that hands the key over itself (it
 * recorded the requester as owner already).
 */
int ferry__ops_materialize(struct ferry_table *t, uint64_t key, struct ferry_slot **s_p);

/* the arena's on_chunk hook on transports that register memory: registers
 * chunk @c for remote reads (lib/ops/chunks.c); @arg is the table */
int ferry__ops_chunk_reg(void *arg, struct ferry_arena *a, uint32_t c);
/* this node's registration of the chunk that holds @slot, or NULL */
struct ferry_tp_mr *ferry__ops_chunk_mr(const struct ferry_table *t, uint32_t slot);
int ferry__ops_materialize_locked(struct ferry_table *t, uint64_t key, struct ferry_slot **s_p);

/* send one key operation to @dst as an OP frame (a hop more); progress thread */
void ferry__ops_send_to(struct ferry *fy, struct ferry_table *t, const struct ferry_msg_op *op,
			const struct ferry_msg_key *k, const float *in, uint32_t dst);

/*
 * repl.c: replicas (docs/faults.md). Context: the progress thread, except
 * the table's init and fini (table create and free).
 */
int ferry__repl_attach(struct ferry *fy);
int ferry__repl_table_init(struct ferry_table *t);
int ferry__repl_table_seed(struct ferry_table *t);
void ferry__repl_table_fini(struct ferry_table *t);
/* backups per key at most (a table's `replicas`, checked at creation) */
#define FERRY_REPL_MAX 2
/* the ranks that keep the backups of @key while @owner owns it (repl.c has
 * the rule); Return: how many, 0 .. FERRY_REPL_MAX */
uint32_t ferry__repl_backups(const struct ferry_table *t, uint64_t key, uint32_t owner,
			     uint32_t out[FERRY_REPL_MAX]);
/* old owner, before a move of @key (its live slot @s) to @requester: the
 * value goes to the requester's backup first */
void ferry__repl_handoff(struct ferry_table *t, uint64_t key, const struct ferry_slot *s,
			 uint32_t requester);
/* a key installed here after its home failed: its backup, at the new home,
 * records this node as its owner */
void ferry__repl_adopt(struct ferry_table *t, uint64_t key, const struct ferry_slot *s);
/* a move of @key to @requester cannot reach its old owner (failed, or the
 * key's failed home's, before the takeover): the coming takeover ends it.
 * 0, or -ENOENT (no replicas, or no takeover to come) / -ENOMEM */
int ferry__repl_want(struct ferry_table *t, uint64_t key, uint32_t requester);
/* the same for a failed home's key the new home recorded @requester as the
 * owner of (it held nothing of the key): the head of the chain of moves
 * asked there after the failure, which the takeover ends first */
int ferry__repl_want_head(struct ferry_table *t, uint64_t key, uint32_t requester);
/* a move of @key to this node was dropped (its failed old owner's home ended
 * it so), and @requester's move of the key waited behind it here: tell the
 * key's home, which ends @requester's move or drops it too. 0, or a
 * negative errno (logged) */
int ferry__repl_want_pass(struct ferry_table *t, uint64_t key, uint32_t requester);
/* copies kept here, and their bytes (ferry_table_stats) */
uint64_t ferry__repl_count(const struct ferry_table *t);
uint64_t ferry__repl_bytes(const struct ferry_table *t);

/* the copies of one OP frame's updates, and the reply held until the backups
 * have them: _new (NULL without replicas, or out of memory: logged), _add
 * after each update applied here, _any, _hold (takes the built REPLY frame;
 * -ENOMEM: the caller sends it with an error), _free */
struct ferry_repl_batch;
struct ferry_repl_batch *ferry__repl_batch_new(struct ferry_table *t);
int ferry__repl_batch_add(struct ferry_table *t, struct ferry_repl_batch *b, uint64_t key);
bool ferry__repl_batch_any(const struct ferry_repl_batch *b);
int ferry__repl_batch_hold(struct ferry_table *t, struct ferry_repl_batch *b, uint32_t origin,
			   struct ferry_frame *reply);
void ferry__repl_batch_free(struct ferry_table *t, struct ferry_repl_batch *b);

#endif /* FERRY_LIB_OPS_H */

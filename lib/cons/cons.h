/* SPDX-License-Identifier: MIT */
/*
 * cons.h - consistency models other than SEQUENTIAL (lib/cons/), what the
 * layers above (table, ferry.c) call, and what the files of lib/cons/ share.
 * The files call one way:
 *
 *   cons.c  --> clock.c   node clocks: workers' clocks, the node's, every
 *      \                  rank's (CLOCK frames), waits for the slowest
 *       \---> map.c       a table's per-node entries: cached values with the
 *        \                clock each is fresh to, unsent deltas, deltas in
 *         \               flight
 *         |--> push.c     numbered push batches (CONS_PUSH, CONS_ACK): each
 *         |               delta applied once, held until acknowledged
 *         |--> essp.c     ESSP: owners push values to the nodes that
 *         |               read them (ESSP_SUB, ESSP_VAL, ESSP_KICK)
 *          --> hot.c      hot keys (NuPS): a replica on every node, deltas
 *               \         synced in the background (HOT_PUSH, HOT_ACK)
 *                --> hotops.c  their pulls, pushes, sets; the hooks wrap the
 *                         model's (or the sequential path) for the other keys
 *   hotauto.c --> hot.c   hot_auto: ferry_hot_update() chooses the hot keys
 *                         again from the counts hotops.c keeps (topk.c, a
 *                         leaf, as hot.c and hotops.c call it)
 *
 * cons.c and hotops.c both begin each call with check.c's
 * ferry__cons_check_call (a leaf).
 *
 * docs/consistency.md ("Models") states each model's guarantee and cost.
 */
#ifndef FERRY_LIB_CONS_H
#define FERRY_LIB_CONS_H

#include "lib/core/core.h"

/* ---- for the layers above ---- */

/* register the CLOCK handler and the node's clock state; before start */
int ferry__cons_attach(struct ferry *fy);
/* a table of model EVENTUAL, SSP or ESSP gets its state and hooks (nothing
 * for SEQUENTIAL). Context: table creation, before the table is handed out.
 * Return: 0 or -ENOMEM. */
int ferry__cons_table_init(struct ferry_table *t);
/* the table is created everywhere (its id is known): clocks flush it */
void ferry__cons_table_publish(struct ferry_table *t);
/* the table's state goes (unsent deltas are dropped, with a warning); any
 * number of times. Context: the application thread that destroys the table,
 * after this node's workers stopped using it. */
void ferry__cons_table_fini(struct ferry_table *t);

/*
 * The checks every pull, push, set and flush of a table with a model or hot
 * keys makes first (cons.c; hotops.c): a worker of the table's node, keys
 * and values given, the node open, every key in range. Return: 0;
 * -EINVAL, -ERANGE (logged); -FERRY_E_CLOSED. Context: the caller's thread.
 */
int ferry__cons_check_call(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			   size_t n, const void *buf, const char *what);

/* ---- map.c: one table's entries on this node (caller holds the table's
 * cons lock for every call) ---- */

struct ferry_cons_ent {
	uint64_t key;
	uint32_t len;		     /* floats */
	bool have_val;		     /* val holds a copy of the owner's value ... */
	uint64_t fresh;		     /* ... with every update of clocks below this (SSP) */
	uint64_t last_read;	     /* reader clock of its last read (ESSP subscription) */
	float *val;		     /* the copy, NULL without one */
	float *pend;		     /* deltas pushed here and not sent yet, or NULL */
	float *infl;		     /* deltas sent by the flush under way, or NULL */
	struct ferry_cons_ent *next; /* hash chain */
	struct ferry_cons_ent *fprev, *fnext; /* entries with a copy, oldest first */
	struct ferry_cons_ent *pnext;	      /* entries with pend */
	struct ferry_cons_ent *inext;	      /* entries with infl */
	uint8_t out;			      /* end of a flush: enum ferry_cons_out */
	/* ESSP (essp.c): this node's last applied batch that held the key's
	 * deltas, or a later one (the last settled when the copy was pulled):
	 * a pushed value must hold it */
	uint64_t sent_seq;
	/* subscribed under sub_id (0: not), at sub_rank: the rank its first
	 * pushed value came from (sub_conf), before that the one asked */
	uint32_t sub_rank, sub_id;
	bool sub_conf;
};

/* what became of a key's in-flight deltas when a flush ended */
enum ferry_cons_out {
	FERRY_CONS_OUT_APPLIED = 0, /* applied at the owner, once */
	FERRY_CONS_OUT_HELD,	    /* not applied: back to the unsent deltas */
	FERRY_CONS_OUT_UNKNOWN,	    /* sent, unanswered: kept by the batch (push.c) */
};

/*
 * Bound: entries exist only for keys with a copy, unsent or in-flight
 * deltas. `bytes` counts entries and their floats; copies are evicted, oldest
 * first, past `limit`; deltas are never evicted: a push that takes the unsent
 * deltas past limit / 2 sends them at once (lib/cons/cons.c), so at most
 * limit / 2 of unsent deltas plus the same in flight, and limit in all, plus
 * the last batch's keys (a single call may exceed it; then it is sent).
 */
struct ferry_cons_map {
	struct ferry_cons_ent **b;
	uint64_t nb, n;
	struct ferry_cons_ent *fhead, *ftail;
	struct ferry_cons_ent *phead; /* unsent deltas */
	struct ferry_cons_ent *ihead; /* deltas of the flush under way */
	uint64_t npend, ninfl;	      /* entries on each list */
	uint64_t pend_floats, infl_floats;
	uint64_t bytes, limit;
};

int ferry__cons_map_init(struct ferry_cons_map *m, uint64_t limit);
void ferry__cons_map_fini(struct ferry_cons_map *m);
struct ferry_cons_ent *ferry__cons_map_find(struct ferry_cons_map *m, uint64_t key);
/* find or make the entry of @key (@len floats); NULL when out of memory */
struct ferry_cons_ent *ferry__cons_map_get(struct ferry_cons_map *m, uint64_t key, uint32_t len);
/* copy @val into @e's copy, fresh to @fresh; it becomes the newest; 0 or -ENOMEM */
int ferry__cons_map_set_val(struct ferry_cons_map *m, struct ferry_cons_ent *e, const float *val,
			    uint64_t fresh);
/* forget @e's copy (the entry goes when nothing else holds it) */
void ferry__cons_map_drop_val(struct ferry_cons_map *m, struct ferry_cons_ent *e);
void ferry__cons_map_drop_all_vals(struct ferry_cons_map *m);
/* evict copies, oldest first, while bytes > limit */
void ferry__cons_map_evict(struct ferry_cons_map *m);
/* add @delta to @e's unsent deltas; 0 or -ENOMEM */
int ferry__cons_map_pend_add(struct ferry_cons_map *m, struct ferry_cons_ent *e,
			     const float *delta);
/* what a read returns: @e's copy plus its unsent and in-flight deltas */
void ferry__cons_map_read(const struct ferry_cons_ent *e, float *out);
/*
 * Start a flush: the unsent deltas become the in-flight ones; @keys_p and
 * @deltas_p receive them (malloc'd, the caller frees), @n_p their count.
 * Return: 0 or -ENOMEM (nothing changed then).
 */
int ferry__cons_map_flush_take(struct ferry_cons_map *m, uint64_t **keys_p, float **deltas_p,
			       size_t *n_p);
/* end a flush; each in-flight entry's `out` says what became of its deltas:
 * APPLIED, they are added to the copy taken before the flush began (copies
 * taken during it are not kept); HELD, they go back to the unsent deltas;
 * UNKNOWN, they leave the map (the batch keeps them) with the copy */
void ferry__cons_map_flush_done(struct ferry_cons_map *m);

/* ---- push.c: numbered push batches ---- */

/*
 * One batch of a table's buffered deltas, sent as CONS_PUSH frames, one or
 * more per owner. Each key is routed to one rank at a time; only an answer
 * from that rank ends it: applied, or not live there (it is routed anew,
 * with attempt + 1), or an error (not applied). Bound: one batch per table
 * and node runs or waits (cons_table.out) at a time.
 */
enum {
	FERRY_CONS_B_NEW,
	FERRY_CONS_B_SENT,
	FERRY_CONS_B_DONE,
	FERRY_CONS_B_FAIL
};

struct ferry_cons_batch {
	uint64_t seq;
	size_t n, left; /* keys, keys not DONE or FAIL */
	uint64_t *keys;
	float *deltas;
	uint64_t *offs;	   /* n + 1: each key's deltas in deltas */
	uint32_t *dst;	   /* the rank the key is (or is to be) sent to */
	uint32_t *attempt; /* routes so far */
	int32_t *err;	   /* FAIL: why */
	uint8_t *st;	   /* FERRY_CONS_B_* */
	uint8_t *again;	   /* this route was sent before: it may be applied */
	uint64_t reroutes; /* -EAGAIN answers */
};

/* receiver side: the answers given to one sender's latest batch; 4 bytes
 * per key of that batch (attempt << 2 | answer) */
struct ferry_cons_rx {
	uint64_t seq;
	uint32_t total;
	uint32_t *rec;
};

/* a table with a model on this node (cons.c; push.c reads it) */
struct cons_table {
	struct ferry_table *t;
	struct ferry_cons_node *cn;
	enum ferry_consistency model;
	uint32_t s;
	pthread_mutex_t lock; /* m, gen, refreshed, run */
	pthread_cond_t cond;  /* gen moved, an answer came */
	pthread_mutex_t flush_mu;
	uint64_t gen;	    /* + 1 when a flush starts and when it ends; + 2 when copies go */
	uint64_t refreshed; /* ESSP: the global clock of the last eager refresh */
	struct ferry_cons_map m;
	bool published; /* in cn->tabs */
	/* push.c: the batch being sent (lock), the one left unresolved by a
	 * failed flush (flush_mu), the last batch number (flush_mu) */
	struct ferry_cons_batch *run, *out;
	uint64_t seq;
	/* push.c, receiver side: one entry per sender rank (rx_lock) */
	pthread_mutex_t rx_lock;
	struct ferry_cons_rx *rx;
	/* essp.c: the last batch number taken (lock; ct->seq's copy readable
	 * by the progress thread), subscription ids (lock), the owner's
	 * records (their own lock; NULL unless ESSP without replicas; the
	 * progress thread's handlers read the pointer under RCU), the
	 * global clock last pushed for (the node's essp_mu) */
	uint64_t bseq;
	uint32_t sub_next;
	struct ferry_essp_own *own;
	uint64_t pushed_g;
};

/* make a batch of @n keys with their deltas (taken over; freed with it) */
struct ferry_cons_batch *ferry__cons_batch_new(struct ferry_table *t, uint64_t seq, uint64_t *keys,
					       float *deltas, size_t n);
void ferry__cons_batch_free(struct ferry_cons_batch *b);
/*
 * Send every unresolved key of @b and wait for the answers, routing keys
 * anew as owners say they moved, until all are answered or the node's
 * timeout; then mark each key's map entry (APPLIED, HELD, UNKNOWN).
 * Return: 0 when every key was applied; else the first error
 * (-ETIMEDOUT, -FERRY_E_PEER, ...), logged. Context: a worker's thread,
 * the table's flush_mu held, no other lock.
 */
int ferry__cons_batch_run(struct cons_table *ct, struct ferry_cons_batch *b);
int ferry__cons_push_attach(struct ferry *fy);
/* the receiver state of a table (cons_table_init / _fini) */
int ferry__cons_rx_init(struct cons_table *ct);
void ferry__cons_rx_fini(struct cons_table *ct);

/* ---- essp.c: ESSP's owner pushes ---- */

/* the owner's records of a new ESSP table (none for other models or with
 * replicas); 0 or -ENOMEM */
int ferry__essp_table_init(struct cons_table *ct);
void ferry__essp_table_fini(struct cons_table *ct);
/* reader: subscribe @keys, just kept as copies, at their owners (one
 * ESSP_SUB per owner). Context: a worker's thread, no lock held. */
void ferry__essp_subscribe(struct cons_table *ct, const uint64_t *keys, size_t n);
/* owner: rank @src's batch @seq was applied to @key here (push.c); the
 * progress thread */
void ferry__essp_applied(struct cons_table *ct, uint64_t key, uint32_t src, uint64_t seq);
/* owner: push every recorded key to its subscribers, fresh to @g (a global
 * clock this node saw), once per table and global clock. The progress
 * thread. (clock.c calls essp.c, never the other way: check-layers.sh) */
void ferry__essp_push_all(struct ferry_cons_node *cn, uint64_t g);
/* the global clock moved on by this node's own announcement: push from the
 * progress thread (ESSP_KICK to self). Any thread. */
void ferry__essp_kick(struct ferry_cons_node *cn, uint64_t g);
int ferry__essp_attach(struct ferry *fy);

/* ---- hot.c: hot keys (docs/consistency.md, "Hot keys") ---- */

/* what one node's hot keys of a table did (tests, bench) */
struct ferry_hot_stats {
	uint64_t keys, bytes;	 /* hot keys; bytes held for them here */
	uint64_t reads, pushes;	 /* keys read from / pushed to the replicas */
	uint64_t batches;	 /* batches of deltas this node sent */
	uint64_t frames_sent;	 /* their frames, each sent to every other node */
	uint64_t frames_resent;	 /* frames sent again (unanswered) */
	uint64_t frames_applied; /* other nodes' frames applied here */
	uint64_t frames_again;	 /* ... that came again and were not applied again */
	uint64_t updates;	 /* hot_auto: ferry_hot_update()s done here */
};

/* table parameters: 0, or -EINVAL / -ENOMEM with a log line */
int ferry__hot_check(const struct ferry_table_params *p);
/* what every node must agree on: count and keys, in any order */
uint64_t ferry__hot_hash(const struct ferry_table_params *p);
int ferry__hot_attach(struct ferry *fy);
/* replicas at their initial values, the hooks wrapped (creation) */
int ferry__hot_table_init(struct ferry_table *t);
/* the table exists everywhere: the sync thread starts */
int ferry__hot_table_publish(struct ferry_table *t);
/* stop the sync thread (its unsent deltas stay, a flush then waits in
 * vain); the application thread that closes or destroys */
void ferry__hot_stop(struct ferry_table *t);
/* stop the sync thread, free (after an RCU grace period); any number of times */
void ferry__hot_table_fini(struct ferry_table *t);
/* send this node's hot deltas now and wait until every live node applied
 * them. Return: 0, -ETIMEDOUT (kept, sent again), -FERRY_E_CLOSED. Context:
 * an application thread. */
int ferry__hot_flush(struct ferry_table *t);
int ferry__hot_stats(struct ferry_table *t, struct ferry_hot_stats *st);

/* ---- clock.c: the node's clocks ---- */

struct ferry_cons_node {
	struct ferry *fy;
	pthread_mutex_t lock; /* everything below but the flush lock */
	pthread_cond_t cond;  /* a rank's clock moved, a peer failed, a flush ended */
	/* one node-wide flush and announcement at a time; held while the
	 * flush's pushes run (never by the progress thread) */
	pthread_mutex_t flush_lock;
	uint64_t wclock[FERRY_MAX_WORKERS]; /* clock of each joined worker */
	uint8_t joined[FERRY_MAX_WORKERS];
	uint32_t njoined;
	uint64_t local;	    /* the least joined worker's clock; never goes down */
	uint64_t announced; /* the clock this node flushed for and sent (flush_lock) */
	uint64_t *peer;	    /* world entries: each rank's announced clock */
	/* this node's tables with a model: flushes walk them (flush_lock and
	 * lock to change; lock to read) */
	struct ferry_table *tabs[FERRY_MAX_TABLES];
	/* this node's tables with hot keys (hot.c): barriers flush them (lock) */
	struct ferry_table *hot[FERRY_MAX_TABLES];
	/* push.c: keys answered from the record (a batch's key that came
	 * again and was not applied again); FERRY_CONS_FAULT_EVERY (tests):
	 * N, and the CONS_PUSH frames received and sent so far */
	_Atomic uint64_t replayed;
	uint32_t fault_every;
	_Atomic uint64_t fault_rx, fault_tx;
	/* essp.c: held while owners push (the progress thread) and by a table's
	 * teardown before it frees the table's state; ESSP tables here */
	pthread_mutex_t essp_mu;
	_Atomic uint32_t nessp;
};

struct ferry_cons_node *ferry__cons_node(struct ferry *fy);
/* @w's clock: its own once it joined, else the node's */
uint64_t ferry__cons_wclock(struct ferry_cons_node *cn, const struct ferry_worker *w);
/* @w joins the clocks at the node's clock (worker creation) */
void ferry__cons_join(struct ferry_cons_node *cn, struct ferry_worker *w);
/* @w ticks; *@c_p its new clock. Return: true when the node's clock moved on */
bool ferry__cons_tick(struct ferry_cons_node *cn, struct ferry_worker *w, uint64_t *c_p);
/* @w leaves the clocks; true when the node's clock moved on */
bool ferry__cons_leave(struct ferry_cons_node *cn, struct ferry_worker *w);
/* the node's clock, to flush for: the caller holds flush_lock */
uint64_t ferry__cons_local(struct ferry_cons_node *cn);
/* record and send CLOCK @clock to every other rank; flush_lock held, after
 * every push of this node for clocks below @clock was applied */
int ferry__cons_announce(struct ferry_cons_node *cn, uint64_t clock);
/* the least clock any rank announced */
uint64_t ferry__cons_global(struct ferry_cons_node *cn);
/*
 * Wait until every rank announced at least @need (the reader at clock @c of
 * a table with bound @s, for the log). Return: 0; -ETIMEDOUT, -FERRY_E_PEER,
 * -FERRY_E_CLOSED (logged). Context: an application thread.
 */
int ferry__cons_wait_global(struct ferry_cons_node *cn, uint64_t need, uint64_t c, uint32_t s);
int ferry__cons_clock_attach(struct ferry *fy, struct ferry_cons_node *cn);

#endif /* FERRY_LIB_CONS_H */

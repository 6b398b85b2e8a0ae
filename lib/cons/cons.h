/* SPDX-License-Identifier: MIT */
/*
 * cons.h - consistency models other than SEQUENTIAL (lib/cons/), what the
 * layers above (table, ferry.c) call, and what the files of lib/cons/ share.
 * The files call one way:
 *
 *   cons.c  --> clock.c   node clocks: workers' clocks, the node's, every
 *      \                  rank's (CLOCK frames), waits for the slowest
 *       ----> map.c       a table's per-node entries: cached values with the
 *                         clock each is fresh to, unsent deltas, deltas in
 *                         flight
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
/* end a flush: @applied, the in-flight deltas are in every copy taken
 * before the flush began (copies taken during it are not kept); else
 * those copies are dropped */
void ferry__cons_map_flush_done(struct ferry_cons_map *m, bool applied);

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

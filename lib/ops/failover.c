/* SPDX-License-Identifier: MIT */
/*
 * failover.c - what a table with replicas does when a node fails: the
 * listener, the SYNC / ECHO exchange, the takeover, and the REPL handler
 * (copies, and the WANTs and MOVEs of moves a failure cuts). The protocol
 * is described at the top of repl.c and in docs/faults.md. Progress thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lib/ops/repl.h"

struct repl_walk {
	struct ferry *fy;
	struct ferry_table *t;
	uint32_t dead;
	struct repl_out o;
	uint32_t n;
	int rc;
};

/*
 * A key owned here: a copy (ADOPT) to each new backup the failure gave it,
 * and to its new home (which records this node as the owner). A backup that
 * stays (r >= 2) holds the value already, and a home that stays has the
 * record: an ADOPT there could put back a record a move under way changed.
 */
static void repl_walk_owned(struct repl_walk *w, uint64_t key, const struct ferry_slot *s)
{
	struct ferry_table *t = w->t;
	uint32_t self = w->fy->rank, ho, hn = ferry__home(t, key);
	uint32_t bo[FERRY_REPL_MAX], bn[FERRY_REPL_MAX];
	uint32_t no = ferry__repl_backups_as(t, key, self, w->dead, bo, &ho);
	uint32_t nn = ferry__repl_backups(t, key, self, bn);

	for (uint32_t i = 0; i < nn && !w->rc; i++) {
		if (ferry__repl_in(bo, no, bn[i]) && !(bn[i] == hn && ho != hn))
			continue;
		w->rc = ferry__repl_out_copy(w->fy, t, &w->o, bn[i], key, self, FERRY_COPY_ADOPT, s,
					     NULL, NULL);
		w->n++;
	}
}

/* a move to here waits: the key's home learns it (WANT), to end it if the
 * failure stops it; pend.lock held */
static void repl_walk_want(void *arg, struct ferry_pend *e)
{
	struct repl_walk *w = arg;
	uint32_t h = ferry__home(w->t, e->key);
	struct ferry_msg_copy *c;

	if (h >= w->fy->world)
		return;
	if (h == w->fy->rank) {
		if (ferry__repl_want_add(w->t, e->key, h, false))
			w->rc = -ENOMEM;
		return;
	}
	c = ferry__repl_out_add(w->fy, w->t, &w->o, h, NULL);
	if (c)
		*c = (struct ferry_msg_copy){ .key = e->key,
					      .kind = FERRY_COPY_WANT,
					      .owner = w->fy->rank };
}

static void repl_walk_map(void *arg, uint64_t key, void *slot)
{
	repl_walk_owned(arg, key, slot);
}

/* a live key of this node, taken over from a backup */
static int repl_install(struct ferry_table *t, uint64_t key, const struct repl_copy *c)
{
	struct ferry_slot *s;
	uint32_t idx;
	int rc = ferry__arena_alloc(&t->arena, &idx);

	if (rc)
		return rc;
	s = ferry__arena_slot(&t->arena, idx);
	ferry__slot_install(&t->arena, s, key, c->v, c->len);
	rc = ferry__dir_own_set(&t->dir, key, s);
	if (rc) {
		ferry__arena_free(&t->arena, idx); /* never published */
		return rc;
	}
	(void)ferry__dir_owner_set(&t->dir, key, t->fy->rank);
	ferry__loc_set(t, key, t->fy->rank);
	return 0;
}

struct repl_take {
	struct ferry *fy;
	struct ferry_table *t;
	uint32_t dead;
	uint64_t *keys; /* to take over */
	size_t n, cap;
};

static void repl_take_collect(void *arg, uint64_t key, uint64_t val)
{
	struct repl_take *tk = arg;
	const struct repl_copy *c = (const void *)(uintptr_t)val;

	(void)c;
	if (ferry__home(tk->t, key) != tk->fy->rank)
		return;
	if (tk->n == tk->cap) {
		size_t cap = tk->cap ? 2 * tk->cap : 256;
		uint64_t *k = realloc(tk->keys, cap * sizeof(*k));

		if (!k)
			return; /* logged by the caller: fewer keys taken over */
		tk->keys = k;
		tk->cap = cap;
	}
	tk->keys[tk->n++] = key;
}

/*
 * Moves whose home failed wait at their requesters (WANT): the new home
 * ends each. A key it has no record or copy of is being handed over (the
 * old owner gave it before it knew: the value still lands, and the
 * requester tells this home then, lib/reloc/). A key a live node owns (it
 * said so with an ADOPT): the requester drops its move. A key that was at
 * the failed home: the requester finishes its move with the backup.
 */
/* the move of @key to @req ends with @val */
static void repl_fill(struct ferry *fy, struct ferry_table *t, struct repl_out *mv, uint64_t key,
		      uint32_t req, const float *val, uint32_t len, bool keep)
{
	if (req == fy->rank) {
		if (fy->move_fill)
			(void)fy->move_fill(t, key, val, len, keep);
		return;
	}
	(void)ferry__repl_out_copy(fy, t, mv, req, key, keep ? req : fy->rank, FERRY_COPY_MOVE,
				   NULL, val, NULL);
}

/*
 * Several live requesters wait for a key that was at the failed node, and
 * none of them is known to be the one its hand-over would have gone to (the
 * home knows only the last of a chain, and that one failed, or a failed
 * home's records are gone): the winner's install could hand the key on to
 * one of them whose move was dropped. Every move is dropped instead (they
 * pass on what queued behind them), and the home installs the key from its
 * backup; the requesters' localizes fail with -FERRY_E_PEER, and a retry
 * moves the key from here. Return: 1 when the key is live here.
 */
static uint32_t repl_end_here(struct ferry *fy, struct ferry_table *t, struct repl_out *mv,
			      uint64_t key, struct repl_copy *c)
{
	struct ferry_slot *s;

	if (repl_install(t, key, c)) {
		ferry_err("repl: table %u: key %llu could not be taken over on rank %u (no free "
			  "slot or memory); raise the table's capacity",
			  t->id, (unsigned long long)key, fy->rank);
		return 0;
	}
	s = ferry__own(t, key);
	ferry__repl_copy_del(t, key);
	if (s)
		(void)ferry__repl_out_backups(fy, t, mv, key, fy->rank, FERRY_COPY_VALUE, s, NULL,
					      fy->world, NULL, NULL);
	return 1;
}

static int repl_want_cmp(const void *a, const void *b)
{
	const struct repl_want *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->req < y->req ? -1 : x->req > y->req;
}

static bool repl_failed(struct ferry *fy, uint32_t rank)
{
	return atomic_load_explicit(&fy->failed[rank], memory_order_relaxed);
}

/*
 * The home of @key died with the failures ended now (t->repl->gone): its
 * home as it was while they were alive is one of them (ferry__home_as, for
 * several ranks at once)
 */
static bool repl_home_died(struct ferry *fy, struct ferry_table *t, uint64_t key)
{
	uint32_t h = ferry__home_orig(t, key);
	const uint8_t *gone = t->repl->gone;

	for (uint32_t i = 0; i < fy->world && h != fy->rank && !gone[h] && repl_failed(fy, h); i++)
		h = (h + 1) % fy->world;
	return gone[h];
}

/*
 * Moves that wait (WANT, from every node with a move under way when @dead
 * failed, after everything @dead sent it was handled): the home ends those
 * the failure stopped, and only those, one key at a time (@w: the WANTs of
 * one key, sorted by requester; several in a chain of moves).
 *
 * When the dead node had handed the key to a requester (its hand-over copy
 * names it) and the hand-over may never arrive, that requester gets the
 * backup; those behind it in a chain wait for it, as they did.
 *
 * Home alive (its records are whole): a key a live node holds, or hands
 * over, is left alone; a key that was at the dead node goes to the
 * requester recorded last, and the other requesters drop their moves.
 *
 * Home dead (this is the new home; its records were rebuilt from the
 * ADOPTs): a key this node owns, or a live node owns (its record, and the
 * copy names no failed node: an ADOPT made both), makes the requesters
 * drop their moves, unless the record is one of them (it asked here after
 * the failure: this node asked the live owner). A record of a live node
 * beside a copy naming a failed one is a requester that asked here after
 * the failure and waits behind one of @w: the chain goes on from the
 * winner below, whose install hands the key on to it; a key no
 * copy of which is here, or whose copy names a live node, is being handed
 * over (the value still lands, and the requester tells this home then,
 * lib/reloc/); a key that was at the failed home goes to the head of the
 * chain asked here after the failure (the requester this home first
 * recorded, ferry__repl_want_head), or else to the requester recorded
 * here, or else to the first, and the others drop their moves.
 *
 * The record then names the winner, which keeps the key: requesters queued
 * behind its move are passed back to this home and dropped (a chain a
 * failure cut is known here only by its last requester, so a hand-over
 * along it would leave the record behind the key).
 * Return: the moves ended with a value.
 */
static uint32_t repl_end_moves(struct ferry *fy, struct ferry_table *t, struct repl_out *mv,
			       const struct repl_want *w, size_t n)
{
	uint64_t key = w[0].key;
	uint32_t rec = ferry__owner(t, key), win = UINT32_MAX, head = UINT32_MAX, head_seq = 0;
	uint32_t live = UINT32_MAX, nlive = 0;
	struct repl_copy *c = (void *)(uintptr_t)ferry__keymap_get(&t->repl->copies, key);
	bool home_died = repl_home_died(fy, t, key), drop = false, rec_asked = false;
	bool here = false;

	if (ferry__home(t, key) != fy->rank)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (c && c->owner == w[i].req && repl_failed(fy, c->from))
			win = w[i].req; /* the dead node's hand-over to it never came */
		rec_asked |= w[i].req == rec;
		if (w[i].head > head_seq) {
			head_seq = w[i].head;
			head = w[i].req;
		}
		if (!repl_failed(fy, w[i].req) && (!i || w[i].req != w[i - 1].req)) {
			live = w[i].req; /* sorted by requester: each counted once */
			nlive++;
		}
	}
	if (ferry__own(t, key)) {
		drop = home_died; /* it lives here */
		win = UINT32_MAX;
	} else if (!c || win != UINT32_MAX) {
		/* nothing known here (a hand-over lands), or a winner above */
	} else if (!home_died) {
		if (repl_failed(fy, c->owner)) {
			/* it was at the dead node: to the last requester, or to
			 * the one left when the last failed too */
			win = !repl_failed(fy, rec) ? rec : nlive == 1 ? live : UINT32_MAX;
			here = win == UINT32_MAX && nlive > 1;
			drop = true;
		}
	} else if (rec != fy->rank && !repl_failed(fy, rec) && !rec_asked &&
		   !repl_failed(fy, c->owner)) {
		drop = true; /* a live owner */
	} else if (repl_failed(fy, c->owner)) {
		/* it was at the dead home: the chain asked here starts at its head */
		win = head != UINT32_MAX ? head : rec_asked ? rec : nlive == 1 ? live : UINT32_MAX;
		here = win == UINT32_MAX && nlive > 1;
		drop = true;
	}
	ferry_dbg("move: table %u: key %llu: %zu moves wait (first to rank %u, head %d); record "
		  "%u, copy of rank %d from %d, home %s; the winner %d, the others %s",
		  t->id, (unsigned long long)key, n, w[0].req, head == UINT32_MAX ? -1 : (int)head,
		  rec, c ? (int)c->owner : -1, c ? (int)c->from : -1,
		  home_died ? "failed" : "alive",
		  here		    ? (int)fy->rank :
		  win == UINT32_MAX ? -1 :
				      (int)win,
		  drop ? "dropped" : "wait");
	for (size_t i = 0; i < n; i++) {
		uint32_t req = w[i].req;

		if (drop && req != win && !repl_failed(fy, req) && (!i || req != w[i - 1].req))
			repl_fill(fy, t, mv, key, req, NULL, 0, false);
	}
	if (here) /* after the drops: this node's own move is gone */
		return repl_end_here(fy, t, mv, key, c);
	if (win == UINT32_MAX || repl_failed(fy, win))
		return 0;
	/* the winner keeps the key: what queued behind its move is passed
	 * back here (lib/reloc/, reloc_move_fill) and dropped */
	repl_fill(fy, t, mv, key, win, c->v, c->len, true);
	if (win == fy->rank) {
		(void)ferry__dir_owner_set(&t->dir, key, fy->rank); /* no record */
		ferry__repl_copy_del(t, key); /* live here: the main loop copies it */
	} else if (!ferry__dir_owner_set(&t->dir, key, win)) {
		c->owner = win; /* the requester's backup, here */
		c->from = fy->rank;
		c->adopt = 0;
		/* r >= 2: its other backups get the value too (ahead of the
		 * winner's own copies on every link but theirs) */
		(void)ferry__repl_out_backups(fy, t, mv, key, win, FERRY_COPY_VALUE, NULL, c->v,
					      win, NULL, NULL);
	}
	return 1;
}

static uint32_t repl_take_wanted(struct ferry *fy, struct ferry_table *t, struct repl_out *mv)
{
	struct ferry_repl *rp = t->repl;
	struct repl_want *w = rp->wants;
	size_t n = rp->nwants;
	uint32_t ended = 0;

	rp->wants = NULL;
	rp->nwants = rp->wants_cap = 0;
	if (n)
		qsort(w, n, sizeof(*w), repl_want_cmp);
	for (size_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n && w[j].key == w[i].key;)
			j++;
		ended += repl_end_moves(fy, t, mv, w + i, j - i);
	}
	free(w);
	return ended;
}

static int repl_want(struct ferry_table *t, uint64_t key, uint32_t requester, bool head)
{
	struct ferry *fy = t->fy;
	struct repl_want w = { .key = key, .req = requester, .head = head };
	struct repl_copy *c;
	struct repl_out mv;
	uint32_t ended = 0;

	if (!t->repl)
		return -ENOENT;
	for (uint32_t d = 0; d < fy->world; d++)
		if (t->repl->synced[d] && !t->repl->done[d]) {
			ferry_dbg("move: table %u: the move of key %llu to rank %u waits for "
				  "the takeover of rank %u",
				  t->id, (unsigned long long)key, requester, d);
			return ferry__repl_want_add(t, key, requester, head);
		}
	/*
	 * No takeover to come: it is over, and the request came after it (a
	 * LOCALIZE at the new home recorded before the takeover and handled
	 * after, or sent after it). A key that was at the failed node is
	 * ended now, from its backup, as the takeover would, and so is one
	 * whose copy names the requester and a failed sender (the hand-over
	 * to it died). One whose copy names the requester and a live sender
	 * is on its way to it (a live old owner hands it over, or this home
	 * ended the move: a move passed on, ferry__repl_want_pass, can come
	 * after that). Any other is on its way to a live node (an old owner handed it over before it knew
	 * of the failure; the receiver's ADOPT will record it here): the move
	 * is dropped, its localize fails with -FERRY_E_PEER, and a retry finds
	 * the key where the ADOPT put it.
	 */
	if (ferry__repl_out_init(&mv, fy->world))
		return -ENOMEM;
	c = (void *)(uintptr_t)ferry__keymap_get(&t->repl->copies, key);
	/* (the decision may free the copy: the rank is kept apart) */
	if (c && repl_failed(fy, c->owner)) {
		uint32_t d = c->owner;

		t->repl->gone[d] = 1;
		ended = repl_end_moves(fy, t, &mv, &w, 1);
		t->repl->gone[d] = 0;
	} else if (c && c->owner == requester && repl_failed(fy, c->from)) {
		uint32_t d = c->from;

		t->repl->gone[d] = 1; /* its hand-over died */
		ended = repl_end_moves(fy, t, &mv, &w, 1);
		t->repl->gone[d] = 0;
	} else if (c && c->owner == requester)
		ended = 1; /* its value is on its way (a live node hands it over, or this
			    * home ended the move with the backup) */
	if (!ended) {
		/* (a key this home holds: a move passed on to it, whose chain
		 * the takeover dropped, repl_end_here) */
		if (ferry__owner(t, key) == requester && !ferry__own(t, key))
			/* the copy's live owner holds it, or it is nowhere */
			(void)ferry__dir_owner_set(&t->dir, key,
						   c && !repl_failed(fy, c->owner) ? c->owner :
										     fy->rank);
		repl_fill(fy, t, &mv, key, requester, NULL, 0, false);
		ferry_dbg("repl: table %u: the move of key %llu to rank %u found no value at its "
			  "new home rank %u; it is dropped (the key is on its way elsewhere)",
			  t->id, (unsigned long long)key, requester, fy->rank);
	}
	for (uint32_t r = 0; r < fy->world; r++)
		(void)ferry__repl_out_send(fy, t, &mv, r);
	ferry__repl_out_fini(&mv, fy->world);
	return 0;
}

int ferry__repl_want(struct ferry_table *t, uint64_t key, uint32_t requester)
{
	return repl_want(t, key, requester, false);
}

int ferry__repl_want_head(struct ferry_table *t, uint64_t key, uint32_t requester)
{
	return repl_want(t, key, requester, true);
}

int ferry__repl_want_pass(struct ferry_table *t, uint64_t key, uint32_t requester)
{
	struct ferry *fy = t->fy;
	uint32_t h = ferry__home(t, key);
	struct ferry_msg_copy *c;
	struct repl_out o;
	int rc;

	if (!t->repl || h >= fy->world)
		return -ENOENT;
	rc = ferry__repl_out_init(&o, fy->world);
	if (!rc) {
		c = ferry__repl_out_add(fy, t, &o, h, NULL);
		if (c) {
			/* a frame also to this node: the home decides after
			 * the takeover step that dropped the move is over */
			*c = (struct ferry_msg_copy){ .key = key,
						      .kind = FERRY_COPY_WANT,
						      .owner = requester };
			rc = ferry__repl_out_send(fy, t, &o, h);
		} else {
			rc = -ENOMEM;
		}
		ferry__repl_out_fini(&o, fy->world);
	}
	if (rc)
		ferry_err("repl: table %u: cannot tell rank %u that rank %u's move of key %llu "
			  "waited behind a dropped one (%s); that localize waits out its timeout",
			  t->id, h, requester, (unsigned long long)key, ferry_strerror(rc));
	else
		ferry_dbg("move: table %u: rank %u's move of key %llu waited behind a dropped "
			  "one here; its home rank %u ends it",
			  t->id, requester, (unsigned long long)key, h);
	return rc;
}

/* every live node sent its copies after @dead failed: take over, as the
 * home, each key backed up here that no live node owns */
static void repl_take_over(struct ferry *fy, struct ferry_table *t, uint32_t dead)
{
	struct repl_take tk = { .fy = fy, .t = t, .dead = dead };
	struct repl_out o, mv;
	uint32_t taken = 0, moved = 0, lost = 0;

	if (ferry__repl_out_init(&o, fy->world))
		return;
	if (ferry__repl_out_init(&mv, fy->world)) {
		ferry__repl_out_fini(&o, fy->world);
		return;
	}
	moved = repl_take_wanted(fy, t, &mv);
	ferry__keymap_each(&t->repl->copies, repl_take_collect, &tk);
	for (size_t i = 0; i < tk.n; i++) {
		uint64_t key = tk.keys[i];
		struct repl_copy *c = (void *)(uintptr_t)ferry__keymap_get(&t->repl->copies, key);
		uint32_t rec = ferry__owner(t, key);
		struct ferry_slot *s;
		bool owner_dead, rec_live;

		if (!c)
			continue;
		if (ferry__own(t, key)) {
			ferry__repl_copy_del(t, key); /* it lives here: the copy is old */
			continue;
		}
		owner_dead = atomic_load_explicit(&fy->failed[c->owner], memory_order_relaxed);
		rec_live = !atomic_load_explicit(&fy->failed[rec], memory_order_relaxed);
		if (rec != fy->rank && rec_live) {
			continue; /* a live node owns it, or waits for it (WANT above) */
		} else if (rec == fy->rank && !owner_dead) {
			/* a live owner's copy and no record: its ADOPT made the
			 * record (repl_rec_from_copy, ferry__repl_on_repl), and a
			 * move to here since removed it; or a hand-over to here
			 * is on its way */
			continue;
		}
		if (repl_install(t, key, c)) {
			lost++;
			continue;
		}
		s = ferry__own(t, key);
		ferry__repl_copy_del(t, key);
		taken++;
		if (s)
			(void)ferry__repl_out_backups(fy, t, &o, key, fy->rank, FERRY_COPY_VALUE, s,
						      NULL, fy->world, NULL, NULL);
	}
	for (uint32_t r = 0; r < fy->world; r++) {
		(void)ferry__repl_out_send(fy, t, &o, r);
		(void)ferry__repl_out_send(fy, t, &mv, r);
	}
	ferry__repl_out_fini(&o, fy->world);
	ferry__repl_out_fini(&mv, fy->world);
	free(tk.keys);
	if (taken && ferry__table_onesided(t))
		ferry__ops_chunks_announce(fy, t);
	if (taken || moved)
		ferry_warn("repl: table %u: rank %u failed; this node took over %u of its keys "
			   "from their backups and ended %u moves it had stopped",
			   t->id, dead, taken, moved);
	if (lost)
		ferry_err("repl: table %u: %u keys of failed rank %u could not be taken over on "
			  "rank %u (no free slot or memory); raise the table's capacity",
			  t->id, lost, dead, fy->rank);
}

/* synced[dead][rank] bits */
#define REPL_SYNC_GOT 1u  /* rank's SYNC arrived */
#define REPL_ECHO_GOT 2u  /* rank's ECHO arrived: it handled everything we sent before */
#define REPL_ECHO_SENT 4u /* we answered rank's SYNC */

/* every live node echoed the failure of @dead, and its lease ran out */
static bool repl_ready(struct ferry *fy, struct ferry_table *t, uint32_t dead)
{
	struct ferry_repl *rp = t->repl;
	struct timespec ts;
	int64_t now, wait = (int64_t)ferry__lease_takeover_ms(fy) * 1000000;

	for (uint32_t r = 0; r < fy->world; r++)
		if (r != fy->rank && !(rp->synced[dead][r] & REPL_ECHO_GOT) &&
		    !atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			return false;
	/*
	 * Fencing: every live node has failed @dead, so none echoes its beats
	 * any more, and the live nodes are a quorum (else this node is fenced,
	 * repl_on_peer_failed), so no quorum is left to echo them. @dead's
	 * lease ran out within the lease of the last echo; the takeover waits
	 * that and a margin from now, by when @dead acknowledges nothing (the
	 * heartbeat's tick comes back here).
	 */
	if (ferry__lease_is_gone(fy, dead))
		wait = 0; /* its process is gone: nothing to fence */
	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
	if (!rp->ready_ns[dead])
		rp->ready_ns[dead] = now;
	return now - rp->ready_ns[dead] >= wait;
}

static bool repl_pending(struct ferry *fy, struct ferry_table *t, uint32_t dead)
{
	return !t->repl->done[dead] && t->repl->synced[dead] &&
	       atomic_load_explicit(&fy->failed[dead], memory_order_relaxed);
}

static void repl_try_take_over(struct ferry *fy, struct ferry_table *t, uint32_t dead)
{
	struct ferry_repl *rp = t->repl;

	if (!repl_pending(fy, t, dead) || atomic_load_explicit(&fy->fenced, memory_order_relaxed))
		return;
	if (!repl_ready(fy, t, dead))
		return;
	if (t->params.replicas < 2) {
		rp->done[dead] = true;
		rp->gone[dead] = 1;
		repl_take_over(fy, t, dead);
		rp->gone[dead] = 0;
		atomic_fetch_add_explicit(&rp->takeovers, 1, memory_order_release);
		return;
	}
	/*
	 * r >= 2: a second failure within this one's takeover is taken over
	 * with it, once its own round is over too. A node that echoed @dead
	 * before it knew of the second failure may still owe this node the
	 * ADOPTs of that one (a key homed at the second node that it owns, and
	 * whose copy here names @dead: without its record this home would
	 * install the key beside its live owner); its ECHO of the second comes
	 * after them.
	 */
	for (uint32_t d = 0; d < fy->world; d++)
		if (d != dead && repl_pending(fy, t, d) && !repl_ready(fy, t, d))
			return;
	for (uint32_t d = 0; d < fy->world; d++)
		rp->gone[d] = repl_pending(fy, t, d);
	/* the first takeover ends every move that waits (the homes that died
	 * are those of rp->gone), the others what their copies name */
	for (uint32_t d = 0; d < fy->world; d++)
		if (rp->gone[d]) {
			rp->done[d] = true;
			repl_take_over(fy, t, d);
			atomic_fetch_add_explicit(&rp->takeovers, 1, memory_order_release);
		}
	memset(rp->gone, 0, fy->world);
}

static uint8_t *repl_synced(struct ferry *fy, struct ferry_table *t, uint32_t dead)
{
	if (!t->repl->synced[dead])
		t->repl->synced[dead] = calloc(fy->world, 1);
	return t->repl->synced[dead];
}

static void repl_send_sync(struct ferry *fy, struct ferry_table *t, uint32_t dst, uint32_t dead,
			   uint32_t flags)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_repl_sync s;
	} f;

	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, FERRY_MSG_REPL_SYNC, sizeof(f), fy->rank, t->id);
	f.s.dead = dead;
	f.s.flags = flags | (ferry__lease_is_gone(fy, dead) ? FERRY_SYNC_F_GONE : 0);
	(void)ferry__send(fy, dst, &f, sizeof(f));
}

/* answer the SYNCs about @dead that arrived, once this node sent its own */
static void repl_echo(struct ferry *fy, struct ferry_table *t, uint32_t dead)
{
	uint8_t *synced = t->repl->synced[dead];

	for (uint32_t r = 0; synced && r < fy->world; r++)
		if ((synced[r] & (REPL_SYNC_GOT | REPL_ECHO_SENT)) == REPL_SYNC_GOT) {
			synced[r] |= REPL_ECHO_SENT;
			repl_send_sync(fy, t, r, dead, FERRY_SYNC_F_ECHO);
		}
}

/*
 * SYNC{dead}: the sender knows of the failure and sent its copies; this node
 * answers with an ECHO once it knows too (a peer's word is enough: it is
 * failed here as well). ECHO: the sender has handled everything this node
 * sent before its SYNC (hand-over requests above all), and its copies came
 * before the ECHO: with every live node's ECHO in, the takeover can decide.
 */
static void repl_on_sync(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v)
{
	const struct ferry_msg_repl_sync *m = v->body;
	uint8_t *synced;

	if (!t->repl)
		return;
	if (m->dead == fy->rank) {
		/* the others failed this node: it may have been stopped or cut
		 * off while they took its keys over (fencing) */
		char why[96];

		snprintf(why, sizeof(why), "rank %u reports that the others failed it", src);
		ferry__node_fence(fy, why);
		return;
	}
	synced = repl_synced(fy, t, m->dead);
	if (!synced) {
		ferry_err("repl: out of memory taking note of rank %u's copies; table %u's keys "
			  "of rank %u are not taken over",
			  src, t->id, m->dead);
		return;
	}
	synced[src] |= m->flags & FERRY_SYNC_F_ECHO ? REPL_ECHO_GOT : REPL_SYNC_GOT;
	if (m->flags & FERRY_SYNC_F_GONE)
		ferry__lease_gone(fy, m->dead); /* the sender found its process gone */
	if (!atomic_load_explicit(&fy->failed[m->dead], memory_order_relaxed)) {
		ferry_warn("repl: rank %u reports rank %u failed; failing it here too", src,
			   m->dead);
		ferry__node_peer_failed(fy, m->dead); /* our listener echoes */
		return;
	}
	repl_echo(fy, t, m->dead);
	repl_try_take_over(fy, t, m->dead);
}

struct repl_recs {
	struct ferry_table *t;
	uint32_t dead;
};

/* a copy of a live owner's key, at its new home, sent by the owner: an
 * ADOPT that came before this node knew of the failure, when the record was
 * not this node's to keep. It is now: operations and moves of the key go to
 * that owner. (A copy another node sent, a hand-over's, may be old: the key
 * may have moved on since; it makes no record) */
static void repl_rec_from_copy(void *arg, uint64_t key, uint64_t val)
{
	struct repl_recs *r = arg;
	struct ferry_table *t = r->t;
	const struct repl_copy *c = (const void *)(uintptr_t)val;
	uint32_t self = t->fy->rank;

	/* (r = 1: only an ADOPT's copy here comes from its live owner; r >= 2:
	 * the updates' copies too, which a move may have overtaken since) */
	if (ferry__home_as(t, key, r->dead) == r->dead && ferry__home(t, key) == self &&
	    c->owner != self && c->from == c->owner && !repl_failed(t->fy, c->owner) &&
	    (t->params.replicas < 2 || c->adopt) && ferry__owner(t, key) == self &&
	    !ferry__own(t, key))
		(void)ferry__dir_owner_set(&t->dir, key, c->owner);
}

static void repl_table_failed(struct ferry *fy, struct ferry_table *t, uint32_t dead)
{
	struct repl_recs recs = { .t = t, .dead = dead };
	struct ferry_repl *rp = t->repl;
	struct repl_walk w = { .fy = fy, .t = t, .dead = dead };
	uint32_t failed_replies = 0;

	/* 0. the records of the keys homed here now */
	ferry__keymap_each(&rp->copies, repl_rec_from_copy, &recs);

	/* 1. replies that waited for the dead backup */
	for (struct repl_held **pp = &rp->held; *pp;) {
		struct repl_held *h = *pp;

		if (!h->wait[dead]) {
			pp = &h->next;
			continue;
		}
		((struct ferry_msg_reply *)(h->f.buf + sizeof(struct ferry_msg_hdr)))->status =
			-FERRY_E_PEER;
		failed_replies++;
		h->nwait -= h->wait[dead];
		h->wait[dead] = 0;
		if (!h->nwait)
			ferry__repl_release(fy, t, pp);
		else
			pp = &h->next;
	}
	if (failed_replies)
		ferry_warn("repl: table %u: %u updates applied here fail with -FERRY_E_PEER: "
			   "their backup, rank %u, failed before it acknowledged them",
			   t->id, failed_replies, dead);

	/* 2. copies of the keys owned here whose backup or home changed */
	if (ferry__repl_out_init(&w.o, fy->world) == 0) {
		ferry__dir_own_lock(&t->dir);
		ferry__dir_own_each(&t->dir, repl_walk_map, &w);
		ferry__dir_own_unlock(&t->dir);
		for (uint32_t r = 0; r < fy->world && !w.rc; r++)
			w.rc = ferry__repl_out_send(fy, t, &w.o, r);
		ferry__repl_out_fini(&w.o, fy->world);
	} else {
		w.rc = -ENOMEM;
	}
	if (w.rc && w.rc != -FERRY_E_PEER)
		ferry_err("repl: table %u: could not send every new backup after rank %u failed "
			  "(%s); some keys have a single copy",
			  t->id, dead, ferry_strerror(w.rc));

	/* 2b. moves to here whose home failed: the new home must know them */
	if (ferry__repl_out_init(&w.o, fy->world) == 0) {
		w.rc = 0;
		pthread_mutex_lock(&t->pend.lock);
		ferry__pend_for_each(&t->pend, repl_walk_want, &w);
		pthread_mutex_unlock(&t->pend.lock);
		for (uint32_t r = 0; r < fy->world; r++)
			(void)ferry__repl_out_send(fy, t, &w.o, r);
		ferry__repl_out_fini(&w.o, fy->world);
	}

	/* 3. SYNC: this node's copies are on their way (before it, on each link) */
	for (uint32_t r = 0; r < fy->world; r++)
		if (r != fy->rank && !atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			repl_send_sync(fy, t, r, dead, 0);
	if (!repl_synced(fy, t, dead))
		ferry_err("repl: out of memory on table %u after rank %u failed", t->id, dead);
	repl_echo(fy, t, dead);
	/* every failure so far may be waiting for this rank's ECHO, which will
	 * not come now */
	for (uint32_t d = 0; d < fy->world; d++)
		if (rp->synced[d])
			repl_try_take_over(fy, t, d);
}

/* the heartbeat's tick: takeovers that wait out the lease */
static void repl_on_tick(struct ferry *fy)
{
	urcu_memb_read_lock();
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t = rcu_dereference(fy->tables[id]);

		for (uint32_t d = 0; t && t->repl && d < fy->world; d++)
			if (t->repl->synced[d] && !t->repl->done[d])
				repl_try_take_over(fy, t, d);
	}
	urcu_memb_read_unlock();
}

/*
 * Does a takeover of @rank still wait here, in any table with replicas?
 * A replacement for @rank is not judged before every live node ended it
 * (lib/core/rejoin.c asks). Progress thread, rcu_read_lock held.
 */
static bool repl_takeover_pending(struct ferry *fy, uint32_t rank)
{
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t = rcu_dereference(fy->tables[id]);

		if (t && t->repl && rank < fy->world && t->repl->synced[rank] &&
		    !t->repl->done[rank])
			return true;
	}
	return false;
}

static void repl_on_peer_failed(struct ferry *fy, uint32_t rank)
{
	bool any = false;

	urcu_memb_read_lock();
	for (uint32_t id = 0; id < FERRY_MAX_TABLES && !any; id++) {
		struct ferry_table *t = rcu_dereference(fy->tables[id]);

		any = t && t->repl;
	}
	if (any && ferry__lease_ms(fy) && !ferry__quorum(fy, NULL)) {
		/* a minority: the other side may be a quorum that takes over */
		char why[96];

		snprintf(why, sizeof(why),
			 "with rank %u failed, the ranks it can reach are no quorum", rank);
		ferry__node_fence(fy, why);
	}
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t = rcu_dereference(fy->tables[id]);

		if (t && t->repl)
			repl_table_failed(fy, t, rank);
	}
	urcu_memb_read_unlock();
}

/* the REPL handler: copies to keep, moves that wait (WANT), moves a home
 * ends (MOVE) */
void ferry__repl_on_repl(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v)
{
	const struct ferry_msg_repl *m = v->body;
	const uint8_t *p = (const uint8_t *)v->copies;
	int rc = 0;

	if (!t->repl) {
		ferry_err("proto: rank %u sent copies for table %u, which has no replicas; "
			  "dropping rank %u",
			  src, t->id, src);
		ferry__node_peer_failed(fy, src);
		return;
	}
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_copy *c = (const void *)p;
		const float *val = (const float *)(c + 1);

		p += ferry__copy_size(c->len);
		if (c->kind == FERRY_COPY_WANT && c->owner != src) {
			/* passed on by a node whose move was dropped: @owner's
			 * waited behind it (ferry__repl_want_pass) */
			if (c->owner >= fy->world || ferry__home(t, c->key) != fy->rank) {
				ferry_err("proto: rank %u passed on a move of key %llu to rank "
					  "%u, which rank %u is not the home of or which is no "
					  "rank; ignored",
					  src, (unsigned long long)c->key, c->owner, fy->rank);
				continue;
			}
			ferry_dbg("move: table %u: rank %u passes on rank %u's move of key "
				  "%llu",
				  t->id, src, c->owner, (unsigned long long)c->key);
			if (!atomic_load_explicit(&fy->failed[c->owner], memory_order_relaxed) &&
			    ferry__repl_want(t, c->key, c->owner) == -ENOMEM)
				ferry_err("repl: out of memory noting rank %u's move of key %llu; "
					  "it waits out its timeout",
					  c->owner, (unsigned long long)c->key);
			continue;
		}
		if (c->kind == FERRY_COPY_WANT) {
			ferry_dbg("move: table %u: rank %u waits for key %llu", t->id, src,
				  (unsigned long long)c->key);
			if (ferry__repl_want_add(t, c->key, src, false))
				ferry_err("repl: out of memory noting rank %u's move of key %llu; "
					  "it fails",
					  src, (unsigned long long)c->key);
			continue;
		}
		if (c->kind == FERRY_COPY_MOVE) {
			/* only the key's home ends a move with its backup */
			if (ferry__home(t, c->key) != src) {
				ferry_err(
					"repl: rank %u sent a move of key %llu it is not the home "
					"of; ignored",
					src, (unsigned long long)c->key);
				continue;
			}
			if (fy->move_fill)
				(void)fy->move_fill(t, c->key, val, c->len, c->owner == fy->rank);
			continue;
		}
		/*
		 * A copy of a key another node owns. One naming a failed owner is
		 * kept too: a live old owner that had not seen the failure sent
		 * its value ahead of a hand-over to it (ferry__repl_handoff),
		 * and that value may be the newest anywhere (the dead node's own
		 * frames are dropped by the dispatcher).
		 */
		if (c->owner == fy->rank || ferry__own(t, c->key)) {
			/* stale: the key lives here now (the copies that made it so
			 * were sent after this one) */
			continue;
		}
		if (c->kind == FERRY_COPY_ADOPT && ferry__home(t, c->key) == fy->rank &&
		    ferry__dir_owner_set(&t->dir, c->key, c->owner))
			rc = -ENOMEM;
		if (!rc)
			rc = ferry__repl_copy_put(t, c->key, c->owner, src, val, c->len,
						  c->kind == FERRY_COPY_ADOPT);
		if (rc)
			break;
	}
	if (rc) {
		/* not acknowledged: the owner's updates fail when this node does */
		ferry_err("repl: out of memory keeping copies of rank %u's keys on table %u; "
			  "free memory on rank %u",
			  src, t->id, fy->rank);
		return;
	}
	if (m->token) {
		struct {
			struct ferry_msg_hdr h;
			struct ferry_msg_repl_ack a;
		} f;

		memset(&f, 0, sizeof(f));
		ferry__proto_hdr_init(&f.h, FERRY_MSG_REPL_ACK, sizeof(f), fy->rank, t->id);
		f.a.token = m->token;
		(void)ferry__send(fy, src, &f, sizeof(f));
	}
}

int ferry__repl_attach(struct ferry *fy)
{
	int rc = ferry__dispatch_register(fy, FERRY_MSG_REPL, FERRY_DISPATCH_TABLE,
					  ferry__repl_on_repl);

	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_REPL_ACK, FERRY_DISPATCH_TABLE,
					      ferry__repl_on_ack);
	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_REPL_SYNC, FERRY_DISPATCH_TABLE,
					      repl_on_sync);
	if (!rc)
		rc = ferry__heartbeat_on_tick(fy, repl_on_tick);
	fy->takeover_pending = repl_takeover_pending;
	return rc ? rc : ferry__node_on_peer_failed(fy, repl_on_peer_failed);
}

/* SPDX-License-Identifier: MIT */
/*
 * repl.c - replicas (a table's `replicas` r = 1 or 2): a backup copy of every
 * key on r other nodes, updates acknowledged only once every backup holds
 * them, and failover when a node fails. Progress thread only: every function
 * here runs in a handler or a peer-failure listener, so the state needs no
 * lock.
 *
 * Where a key's backups live: the first r live ranks of [home, succ(home),
 * succ^2(home), ...] that are not its owner (ferry__repl_backups_as); with
 * r = 1, at its home, or, while the key lives at its home, at the home's
 * successor. The home keeps the owner records of its keys already, so with
 * a backup there one node knows both who owns a key and what its value was;
 * and when a home fails, its keys pass to its successor (ferry__home), which
 * holds a backup of every key the dead home held itself.
 *
 *   origin            owner O                      backup B (= home, or
 *                                                  the home's successor)
 *   OP push/set ----> apply to the slot
 *                     REPL{token, copies} -------> keep the values
 *                     hold the REPLY   <---------- REPL_ACK{token}
 *   REPLY <---------- send it
 *
 * A move (lib/reloc/) keeps the invariant: before the old owner lets a key go
 * it sends the value to the new owner's backup (ferry__repl_handoff), so the
 * backup holds the value before the new owner serves it.
 *
 * When rank D fails, every survivor, in its listener:
 *   1. fails the replies it holds for D's acknowledgement (-FERRY_E_PEER:
 *      applied here, maybe not backed up: the rule "a push that failed with
 *      -FERRY_E_PEER may or may not have been applied");
 *   2. sends a copy of each key it owns whose backup or home changed with D
 *      to the key's new backup (ADOPT: the new home records the owner), so
 *      every live key has its backup again and every new home its records;
 *   3. sends WANT to the key's home for each move to it under way;
 *   4. sends REPL_SYNC{D} to every live node, and answers each SYNC with an
 *      ECHO once its own copies went.
 * Once a node has every live node's ECHO for D (failover.c), everything the
 * others sent before it, and everything it sent them before its SYNC, has
 * been handled: it takes over, as the home, each key it holds a backup of
 * that no live node owns (its record names a failed node, or there is no
 * record and no slot: the home was D), and ends the moves the failure
 * stopped (MOVE copies). docs/faults.md has the rules.
 *
 * Survived: failures one after the other (each after every survivor ended
 * the previous one's takeover: its ADOPTs gave every key r backups again),
 * and with r = 2 two failures within one takeover (taken over together,
 * failover.c). Not survived with r = 1: a key's owner and its backup failing
 * together (both copies gone): its operations keep failing with
 * -FERRY_E_PEER; with r = 2, three of a key's owner and backups.
 *
 * Memory: one copy (a 16 B header and the value) per key backed up here: with
 * r = 1 the keys of which this node is home and that live elsewhere, and, as
 * the successor, the keys its predecessor holds at home; with r = 2 also
 * those of which it is the second backup (about 2 copies per key it homes);
 * plus copies left behind by moves (at most one per key homed here or at
 * its r predecessors), a held reply per update frame in flight to a backup,
 * and per failed rank a byte per rank.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/ops/repl.h"
/* ---- where the backup lives -------------------------------------------- */

/*
 * The backups of @key while @owner owns it, as it was while @spare was alive
 * (world: as now): the first `replicas` live ranks of [home, succ(home),
 * succ^2(home), ...] that are not @owner. With r = 1: the home, or, while
 * the key lives at its home, the home's successor. The home is a backup of
 * every key it does not own, and its successor of every key it does not own
 * itself, so the node that becomes a key's home when the home fails (the
 * successor, ferry__home) holds a copy; and after at most r failures among
 * the owner and the backups, the first live rank of that list (the new home)
 * is the owner or one of the backups. Return: how many (0 .. FERRY_REPL_MAX)
 */
uint32_t ferry__repl_backups_as(const struct ferry_table *t, uint64_t key, uint32_t owner,
				uint32_t spare, uint32_t out[FERRY_REPL_MAX], uint32_t *home_p)
{
	struct ferry *fy = t->fy;
	uint32_t h = ferry__home_as(t, key, spare), r = h, n = 0;

	if (home_p)
		*home_p = h;
	if (h >= fy->world)
		return 0;
	for (uint32_t i = 0; i < fy->world && n < t->params.replicas && n < FERRY_REPL_MAX; i++) {
		if (r != owner)
			out[n++] = r;
		r = ferry__node_live_after(fy, r, spare);
		if (r >= fy->world || r == h)
			break;
	}
	return n;
}

uint32_t ferry__repl_backups(const struct ferry_table *t, uint64_t key, uint32_t owner,
			     uint32_t out[FERRY_REPL_MAX])
{
	return ferry__repl_backups_as(t, key, owner, t->fy->world, out, NULL);
}

bool ferry__repl_in(const uint32_t *set, uint32_t n, uint32_t rank)
{
	for (uint32_t i = 0; i < n; i++)
		if (set[i] == rank)
			return true;
	return false;
}

/* ---- frames of copies ---------------------------------------------------- */

int ferry__repl_out_init(struct repl_out *o, uint32_t world)
{
	o->f = calloc(world, sizeof(*o->f));
	o->count = calloc(world, sizeof(*o->count));
	o->token = 0;
	if (!o->f || !o->count) {
		free(o->f);
		free(o->count);
		return -ENOMEM;
	}
	return 0;
}

int ferry__repl_out_send(struct ferry *fy, struct ferry_table *t, struct repl_out *o, uint32_t dst)
{
	struct ferry_frame *f = &o->f[dst];
	struct ferry_msg_repl *m;
	int rc;

	if (!o->count[dst])
		return 0;
	m = (struct ferry_msg_repl *)(f->buf + sizeof(struct ferry_msg_hdr));
	m->count = o->count[dst];
	m->token = o->token;
	rc = ferry__frame_finish(f, FERRY_MSG_REPL, fy->rank, t->id);
	if (!rc)
		rc = ferry__send(fy, dst, f->buf, f->len);
	ferry__frame_free(f);
	o->count[dst] = 0;
	return rc;
}

/* room for one copy of @len floats to @dst: the value is written by the
 * caller; NULL when out of memory (logged by the caller) */
struct ferry_msg_copy *ferry__repl_out_add(struct ferry *fy, struct ferry_table *t,
					   struct repl_out *o, uint32_t dst, uint32_t *sent_p)
{
	struct ferry_frame *f = &o->f[dst];
	size_t sz = ferry__copy_size(t->max_len);

	if (o->count[dst] && f->len + sz + FERRY_MSG_ALIGN > FERRY_MSG_MAX) {
		if (!ferry__repl_out_send(fy, t, o, dst) && sent_p)
			sent_p[dst]++;
	}
	if (!o->count[dst]) {
		ferry__frame_begin(f);
		if (!ferry__frame_put(f, sizeof(struct ferry_msg_repl)))
			return NULL;
	}
	o->count[dst]++;
	return ferry__frame_put(f, sizeof(struct ferry_msg_copy));
}

/* append @key's copy with its value: from @val, or read from @s */
int ferry__repl_out_copy(struct ferry *fy, struct ferry_table *t, struct repl_out *o, uint32_t dst,
			 uint64_t key, uint32_t owner, uint32_t kind, const struct ferry_slot *s,
			 const float *val, uint32_t *sent_p)
{
	uint32_t len = ferry__value_len(t, key);
	struct ferry_msg_copy *c = ferry__repl_out_add(fy, t, o, dst, sent_p);
	float *v;

	if (!c)
		return -ENOMEM;
	c->key = key;
	c->len = len;
	c->owner = owner;
	c->kind = kind;
	v = ferry__frame_put(&o->f[dst], ferry__copy_size(len) - sizeof(*c));
	if (!v)
		return -ENOMEM;
	if (val || !s) {
		/* no value (a dropped move's MOVE): zeros, never read */
		if (val)
			memcpy(v, val, (size_t)len * sizeof(float));
		else
			memset(v, 0, (size_t)len * sizeof(float));
		return 0;
	}
	/* the progress thread is the only writer of a replicated table's slots
	 * (local updates go through it), so this read sees the value just
	 * written; a retry covers a reader that met a one-sided reader's
	 * nothing (readers never make the version odd) */
	return ferry__slot_read(s, key, v, len);
}

int ferry__repl_out_backups(struct ferry *fy, struct ferry_table *t, struct repl_out *o,
			    uint64_t key, uint32_t owner, uint32_t kind, const struct ferry_slot *s,
			    const float *val, uint32_t skip, uint32_t *sent_p, uint32_t *n_p)
{
	uint32_t b[FERRY_REPL_MAX], nb = ferry__repl_backups(t, key, owner, b), n = 0;
	int rc = 0;

	for (uint32_t i = 0; i < nb && !rc; i++) {
		if (b[i] == fy->rank || b[i] == skip)
			continue;
		rc = ferry__repl_out_copy(fy, t, o, b[i], key, owner, kind, s, val, sent_p);
		n += !rc;
	}
	if (n_p)
		*n_p = n;
	return rc;
}

void ferry__repl_out_fini(struct repl_out *o, uint32_t world)
{
	for (uint32_t r = 0; r < world; r++)
		ferry__frame_free(&o->f[r]);
	free(o->f);
	free(o->count);
}

/* ---- the owner: copies of updates, replies held ------------------------- */

struct ferry_repl_batch {
	struct repl_out o;
	uint32_t *sent; /* per rank: frames sent with this batch's token */
	bool any;
	bool broken; /* out of memory: the updates are not backed up */
};

struct ferry_repl_batch *ferry__repl_batch_new(struct ferry_table *t)
{
	struct ferry_repl_batch *b;

	if (!t->repl)
		return NULL;
	b = calloc(1, sizeof(*b));
	if (b && ferry__repl_out_init(&b->o, t->fy->world)) {
		free(b);
		b = NULL;
	}
	if (b && !(b->sent = calloc(t->fy->world, sizeof(*b->sent)))) {
		ferry__repl_out_fini(&b->o, t->fy->world);
		free(b);
		b = NULL;
	}
	if (!b)
		ferry_err("repl: out of memory replicating updates on table %u; they fail with "
			  "-ENOMEM",
			  t->id);
	else
		b->o.token = ++t->repl->next_token;
	return b;
}

int ferry__repl_batch_add(struct ferry_table *t, struct ferry_repl_batch *b, uint64_t key)
{
	struct ferry *fy = t->fy;
	const struct ferry_slot *s = ferry__own(t, key);
	uint32_t n = 0;
	int rc;

	if (!s)
		return 0;
	/* to every backup; none live: one copy, as with r = 0 */
	rc = ferry__repl_out_backups(fy, t, &b->o, key, fy->rank, FERRY_COPY_VALUE, s, NULL,
				     fy->world, b->sent, &n);
	if (rc) {
		b->broken = true;
		return rc;
	}
	b->any |= n > 0;
	return 0;
}

bool ferry__repl_batch_any(const struct ferry_repl_batch *b)
{
	return b && (b->any || b->broken);
}

int ferry__repl_batch_hold(struct ferry_table *t, struct ferry_repl_batch *b, uint32_t origin,
			   struct ferry_frame *reply)
{
	struct ferry *fy = t->fy;
	struct repl_held *h;
	int rc = 0;

	if (b->broken)
		return -ENOMEM;
	h = calloc(1, sizeof(*h));
	if (!h || !(h->wait = calloc(fy->world, sizeof(*h->wait)))) {
		free(h);
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < fy->world; r++) {
		if (b->o.count[r]) {
			int src = ferry__repl_out_send(fy, t, &b->o, r);

			if (src)
				rc = src;
			else
				b->sent[r]++;
		}
		h->wait[r] = b->sent[r];
		h->nwait += b->sent[r];
		b->sent[r] = 0;
	}
	if (rc) {
		/* applied here, not backed up: the rule for -FERRY_E_PEER */
		ferry_err("repl: table %u: cannot send copies to a backup (%s); the updates "
			  "fail with -FERRY_E_PEER",
			  t->id, ferry_strerror(rc));
		((struct ferry_msg_reply *)(reply->buf + sizeof(struct ferry_msg_hdr)))->status =
			-FERRY_E_PEER;
		rc = 0;
	}
	b->any = false;
	h->token = b->o.token;
	h->origin = origin;
	h->f = *reply;
	*reply = (struct ferry_frame){ 0 };
	b->o.token = ++t->repl->next_token; /* the next part of the same OP */
	if (!h->nwait) {
		/* every backup failed meanwhile: one copy, as with r = 0 */
		rc = ferry__send(fy, origin, h->f.buf, h->f.len);
		ferry__frame_free(&h->f);
		free(h->wait);
		free(h);
		return rc;
	}
	h->next = t->repl->held;
	t->repl->held = h;
	return 0;
}

void ferry__repl_batch_free(struct ferry_table *t, struct ferry_repl_batch *b)
{
	if (!b)
		return;
	ferry__repl_out_fini(&b->o, t->fy->world);
	free(b->sent);
	free(b);
}

void ferry__repl_release(struct ferry *fy, struct ferry_table *t, struct repl_held **pp)
{
	struct repl_held *h = *pp;
	int rc;

	struct ferry_msg_reply *rep = (void *)(h->f.buf + sizeof(struct ferry_msg_hdr));

	*pp = h->next;
	/* fencing: acknowledged only under the lease (docs/faults.md) */
	if (!rep->status && ferry__lease_check(fy, "repl: an update"))
		rep->status = -FERRY_E_PEER;
	rc = ferry__send(fy, h->origin, h->f.buf, h->f.len);
	if (rc)
		ferry_err("repl: cannot send a reply to rank %u: %s", h->origin,
			  ferry_strerror(rc));
	ferry__frame_free(&h->f);
	free(h->wait);
	free(h);
}

void ferry__repl_on_ack(struct ferry *fy, struct ferry_table *t, uint32_t src,
			const struct ferry_proto_view *v)
{
	const struct ferry_msg_repl_ack *a = v->body;
	struct repl_held **pp;

	if (!t->repl)
		goto bad;
	for (pp = &t->repl->held; *pp; pp = &(*pp)->next)
		if ((*pp)->token == a->token)
			break;
	if (!*pp || !(*pp)->wait[src])
		goto bad;
	(*pp)->wait[src]--;
	if (!--(*pp)->nwait)
		ferry__repl_release(fy, t, pp);
	return;
bad:
	ferry_err("proto: rank %u acknowledged copies this node never sent it (table %u); "
		  "dropping rank %u",
		  src, t->id, src);
	ferry__node_peer_failed(fy, src);
}

/* ---- the backup: keeping copies ----------------------------------------- */

int ferry__repl_want_add(struct ferry_table *t, uint64_t key, uint32_t req, bool head)
{
	struct ferry_repl *rp = t->repl;

	if (rp->nwants == rp->wants_cap) {
		size_t cap = rp->wants_cap ? 2 * rp->wants_cap : 64;
		struct repl_want *w = realloc(rp->wants, cap * sizeof(*w));

		if (!w)
			return -ENOMEM;
		rp->wants = w;
		rp->wants_cap = cap;
	}
	rp->wants[rp->nwants++] =
		(struct repl_want){ .key = key, .req = req, .head = head ? ++rp->head_seq : 0 };
	return 0;
}

void ferry__repl_copy_del(struct ferry_table *t, uint64_t key)
{
	struct repl_copy *c = (void *)(uintptr_t)ferry__keymap_get(&t->repl->copies, key);

	if (!c)
		return;
	ferry__keymap_del(&t->repl->copies, key);
	__atomic_sub_fetch(&t->repl->copy_bytes, sizeof(*c) + (size_t)c->len * sizeof(float),
			   __ATOMIC_RELAXED);
	free(c);
}

int ferry__repl_copy_put(struct ferry_table *t, uint64_t key, uint32_t owner, uint32_t from,
			 const float *val, uint32_t len, bool adopt)
{
	struct repl_copy *c = (void *)(uintptr_t)ferry__keymap_get(&t->repl->copies, key);

	if (!c) {
		c = malloc(sizeof(*c) + (size_t)len * sizeof(float));
		if (!c)
			return -ENOMEM;
		if (ferry__keymap_put(&t->repl->copies, key, (uint64_t)(uintptr_t)c)) {
			free(c);
			return -ENOMEM;
		}
		__atomic_add_fetch(&t->repl->copy_bytes, sizeof(*c) + (size_t)len * sizeof(float),
				   __ATOMIC_RELAXED);
	}
	c->owner = owner;
	c->from = from;
	c->len = len;
	c->adopt = adopt;
	if (val)
		memcpy(c->v, val, (size_t)len * sizeof(float));
	else
		ferry__init_value(&t->init, key, 0, c->v, len);
	return 0;
}

/* ---- moves: the new owner's backup first -------------------------------- */

void ferry__repl_handoff(struct ferry_table *t, uint64_t key, const struct ferry_slot *s,
			 uint32_t requester)
{
	struct ferry *fy = t->fy;
	uint32_t bk[FERRY_REPL_MAX], nb, dst, len = ferry__value_len(t, key);
	struct repl_out o;
	int rc = 0;

	if (!t->repl)
		return;
	nb = ferry__repl_backups(t, key, requester, bk);
	if (ferry__repl_in(bk, nb, fy->rank)) {
		float *v = malloc((size_t)len * sizeof(float));

		rc = v ? ferry__slot_read(s, key, v, len) : -ENOMEM;
		if (!rc)
			rc = ferry__repl_copy_put(t, key, requester, fy->rank, v, len, false);
		free(v);
	}
	if (!rc && (nb > 1 || (nb == 1 && bk[0] != fy->rank))) {
		rc = ferry__repl_out_init(&o, fy->world);
		if (!rc) {
			rc = ferry__repl_out_backups(fy, t, &o, key, requester, FERRY_COPY_VALUE, s,
						     NULL, fy->world, NULL, NULL);
			for (uint32_t i = 0; i < nb && !rc; i++)
				rc = ferry__repl_out_send(fy, t, &o, bk[i]);
			ferry__repl_out_fini(&o, fy->world);
		}
	}
	if (rc)
		ferry_err("repl: key %llu of table %u moves to rank %u without all its backups: "
			  "%s",
			  (unsigned long long)key, t->id, requester, ferry_strerror(rc));
	/*
	 * A key leaves its home: its successor kept the backup while it lived
	 * here, and that copy must not go on naming this home, which keeps the
	 * new backup itself. Were this home to fail before its hand-over
	 * arrived, the successor (the new home) would take the key for one
	 * that was at the dead home and install it, while a live node may hold
	 * it or be handing it on. The copy is updated instead: it names the
	 * requester, sent by this home, so the new home knows the move and,
	 * if the requester still waits, ends it with this value
	 * (lib/ops/failover.c: the dead node's hand-over never came). With
	 * r >= 2 the successor is one of the requester's backups (or the
	 * requester) and has just had that copy above.
	 */
	dst = ferry__node_live_after(fy, fy->rank, fy->world);
	if (ferry__home(t, key) == fy->rank && dst < fy->world && dst != fy->rank &&
	    !ferry__repl_in(bk, nb, dst) && !ferry__repl_out_init(&o, fy->world)) {
		if (!ferry__repl_out_copy(fy, t, &o, dst, key, requester, FERRY_COPY_VALUE, s, NULL,
					  NULL))
			(void)ferry__repl_out_send(fy, t, &o, dst);
		ferry__repl_out_fini(&o, fy->world);
	}
}

void ferry__repl_adopt(struct ferry_table *t, uint64_t key, const struct ferry_slot *s)
{
	struct ferry *fy = t->fy;
	struct repl_out o;

	if (!t->repl)
		return;
	/*
	 * Installed at its home (a hand-over that came after the move was
	 * dropped, or stuck): the record here may still name the live owner an
	 * ADOPT named before it handed the key on, and a LOCALIZE would be sent
	 * there, where nothing is left. The home's own key has no record.
	 */
	if (ferry__home(t, key) == fy->rank)
		(void)ferry__dir_owner_set(&t->dir, key, fy->rank);
	if (ferry__repl_out_init(&o, fy->world))
		return;
	/* to every backup: the home records the owner, the others keep a copy */
	if (!ferry__repl_out_backups(fy, t, &o, key, fy->rank, FERRY_COPY_ADOPT, s, NULL, fy->world,
				     NULL, NULL))
		for (uint32_t r = 0; r < fy->world; r++)
			(void)ferry__repl_out_send(fy, t, &o, r);
	ferry__repl_out_fini(&o, fy->world);
}

/* ---- the table's state --------------------------------------------------- */

/*
 * The backups of the keys at their homes at creation: each node keeps those
 * of the home before it, with the initial values it computes itself (from
 * the table's seed and the key alone: no message). Table build, after the
 * placement and the initial values are known.
 */
int ferry__repl_table_seed(struct ferry_table *t)
{
	struct ferry *fy = t->fy;

	if (!t->repl || fy->world < 2)
		return 0;
	ferry__rcu_enter(); /* a keymap that grows frees its old array by call_rcu */
	for (uint64_t k = 0; k < t->params.num_keys; k++) {
		uint32_t h = ferry__home(t, k), b[FERRY_REPL_MAX];
		uint32_t nb = ferry__repl_backups(t, k, h, b);

		if (ferry__repl_in(b, nb, fy->rank) &&
		    ferry__repl_copy_put(t, k, h, h, NULL, ferry__value_len(t, k), false)) {
			ferry__rcu_leave();
			ferry_err("table: out of memory for the backups of rank %u's keys on rank "
				  "%u (replicas = %u keeps %u copies of each key); use fewer "
				  "replicas or more memory",
				  h, fy->rank, t->params.replicas, t->params.replicas);
			return -ENOMEM;
		}
	}
	ferry__rcu_leave();
	return 0;
}

int ferry__repl_table_init(struct ferry_table *t)
{
	struct ferry_repl *rp;

	if (!t->params.replicas)
		return 0;
	rp = calloc(1, sizeof(*rp));
	if (!rp)
		return -ENOMEM;
	rp->synced = calloc(t->fy->world, sizeof(*rp->synced));
	rp->done = calloc(t->fy->world, sizeof(*rp->done));
	rp->ready_ns = calloc(t->fy->world, sizeof(*rp->ready_ns));
	rp->gone = calloc(t->fy->world, 1);
	if (!rp->synced || !rp->done || !rp->ready_ns || !rp->gone ||
	    ferry__keymap_init(&rp->copies)) {
		free(rp->synced);
		free(rp->done);
		free(rp->ready_ns);
		free(rp->gone);
		free(rp);
		return -ENOMEM;
	}
	t->repl = rp;
	return 0;
}

static void repl_free_copy(void *arg, uint64_t key, uint64_t val)
{
	free((void *)(uintptr_t)val);
}

void ferry__repl_table_fini(struct ferry_table *t)
{
	struct ferry_repl *rp = t->repl;

	if (!rp)
		return;
	ferry__keymap_each(&rp->copies, repl_free_copy, NULL);
	ferry__keymap_fini(&rp->copies);
	free(rp->wants);
	while (rp->held) {
		struct repl_held *h = rp->held;

		rp->held = h->next;
		ferry__frame_free(&h->f);
		free(h->wait);
		free(h);
	}
	for (uint32_t r = 0; r < t->fy->world; r++)
		free(rp->synced[r]);
	free(rp->synced);
	free(rp->done);
	free(rp->ready_ns);
	free(rp->gone);
	free(rp);
	t->repl = NULL;
}

uint64_t ferry__repl_bytes(const struct ferry_table *t)
{
	if (!t->repl)
		return 0;
	return __atomic_load_n(&t->repl->copy_bytes, __ATOMIC_RELAXED) +
	       ferry__keymap_bytes(&t->repl->copies);
}

uint64_t ferry__repl_count(const struct ferry_table *t)
{
	return t->repl ? ferry__keymap_count(&t->repl->copies) : 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * essp.c - ESSP's owner-pushed updates (docs/consistency.md, "ESSP"): the
 * owner of a key pushes its value to every node that reads it, each time the
 * global clock moves on, so readers find fresh copies without asking.
 *
 *   reader R (worker, after it pulled keys    owner O (progress thread)
 *   and kept them as copies)
 *   ESSP_SUB{id, done = R's last settled
 *            batch, keys} ----------------->  live here: record (key, R):
 *                                             id, tag = max(tag, done)
 *                                             R's batch b applied to key:
 *                                             tag = max(tag, b)
 *   global clock moves on at O (a CLOCK came, or O announced: ESSP_KICK to
 *   itself); for every recorded key still live here, read its value:
 *                     <------------------  ESSP_VAL{fresh = g, (key, id,
 *                                          tag = max(tag, R's batch seen
 *                                          last - 1), value)...}
 *   R takes the value as its copy, fresh to g, only when
 *     - it holds subscription id at O (else: ESSP_SUB{UNSUB, id} back),
 *     - the key has no deltas in flight and no batch is unsettled,
 *     - tag >= the copy's sent_seq (R's last applied batch that held the
 *       key, or the last batch settled when the copy was pulled): the value
 *       holds every delta of R's that R's own copy must hold,
 *     - g > the copy's freshness.
 *
 * Why the tag is sound: R starts batch b only once b - 1 is settled, so a
 * value read at O after O applied b (or saw any frame of b, or R's SUB with
 * done = b) holds every applied delta of R's batches up to b (pulls and
 * pushes of a key are linearizable, wherever it lives: guarantee 1). A tag
 * only ever lags what the value holds; R refuses a value whose tag lags its
 * own acknowledged deltas (the case where O's push is overtaken by an
 * acknowledgement from the key's next owner), and one that may hold deltas
 * it still has in flight (they would count twice).
 *
 * Relocation: the records stay where they were made. When a key leaves O,
 * O's next push finds it not live, drops its records and pushes nothing;
 * R's copy then falls behind by a global clock, and R's clock boundary
 * re-reads it from the key's new owner and subscribes there (cons.c,
 * cons_refresh), with its own batch number in the SUB: no hand-over carries
 * subscriptions, and a record is never ahead of the value it tags.
 *
 * Who may send what: a SUB comes from any rank (it asks for its own
 * reads), or passed on, at most twice, by a rank where the key is not live
 * (toward its home, then the owner the home records); a VAL is taken only
 * under the id of R's latest subscription of the key, and from one rank:
 * the first that pushes under it (one rank at a time holds a record, where
 * the key is live), and its clock may not exceed the
 * clock R itself announced, nor its tag a batch R made (else the sender is
 * dropped as broken); a KICK only from this node.
 *
 * Bound, per table at an owner: one record of 16 bytes per (key live here,
 * subscribed node), in an array per key that doubles (so at most twice
 * that), plus 32 bytes per key, counted, at most a quarter of the
 * table's cons_bytes (default 64 MiB: 16 MiB); past it subscriptions are
 * refused (logged once) and those readers refresh their copies themselves
 * at clock boundaries. A reader's subscriptions are its copies, bounded by
 * cons_bytes already.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cons/cons.h"
#include "lib/ops/ops.h"

#define ESSP_FRAME_BYTES (4u << 20) /* a frame is sent when it grows past this */
#define ESSP_BUCKETS0 1024

struct essp_sub {
	uint32_t rank, id;
	uint64_t tag;
};

struct essp_key {
	uint64_t key;
	uint32_t n, cap;
	struct essp_sub *subs;
	struct essp_key *next;
};

struct ferry_essp_own {
	pthread_mutex_t lock; /* everything below */
	struct essp_key **b;
	uint64_t nb, nkeys, bytes, limit;
	bool warned;
};

/* ---- the owner's records ------------------------------------------------ */

static uint64_t essp_hash(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return k;
}

int ferry__essp_table_init(struct cons_table *ct)
{
	struct ferry_essp_own *o;

	if (ct->model != FERRY_CONS_ESSP || ct->t->params.replicas)
		return 0; /* replicas: flushes go through ops, untagged (cons.c) */
	o = calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	o->b = calloc(ESSP_BUCKETS0, sizeof(*o->b));
	if (!o->b) {
		free(o);
		return -ENOMEM;
	}
	o->nb = ESSP_BUCKETS0;
	o->limit = ct->m.limit / 4;
	pthread_mutex_init(&o->lock, NULL);
	ct->own = o;
	return 0;
}

void ferry__essp_table_fini(struct cons_table *ct)
{
	struct ferry_essp_own *o = ct->own;

	if (!o)
		return;
	/* the progress thread's handlers (SUB, CONS_PUSH applies) read it
	 * under RCU: detach, and wait for them */
	__atomic_store_n(&ct->own, NULL, __ATOMIC_RELEASE);
	urcu_memb_synchronize_rcu();
	/* nobody takes it any more; taken so that TSan, which cannot see a
	 * grace period, sees the handlers' last writes ordered before */
	pthread_mutex_lock(&o->lock);
	for (uint64_t i = 0; i < o->nb; i++)
		for (struct essp_key *k = o->b[i], *next; k; k = next) {
			next = k->next;
			free(k->subs);
			free(k);
		}
	free(o->b);
	pthread_mutex_unlock(&o->lock);
	pthread_mutex_destroy(&o->lock);
	free(o);
}

/* o->lock held */
static struct essp_key **essp_slot(struct ferry_essp_own *o, uint64_t key)
{
	struct essp_key **pp = &o->b[essp_hash(key) & (o->nb - 1)];

	while (*pp && (*pp)->key != key)
		pp = &(*pp)->next;
	return pp;
}

/* o->lock held: twice the buckets once the keys outnumber them (a failed
 * allocation keeps the chains longer) */
static void essp_grow(struct ferry_essp_own *o)
{
	uint64_t nb = o->nb * 2;
	struct essp_key **b;

	if (o->nkeys <= o->nb)
		return;
	b = calloc(nb, sizeof(*b));
	if (!b)
		return;
	for (uint64_t i = 0; i < o->nb; i++)
		for (struct essp_key *k = o->b[i], *next; k; k = next) {
			next = k->next;
			k->next = b[essp_hash(k->key) & (nb - 1)];
			b[essp_hash(k->key) & (nb - 1)] = k;
		}
	free(o->b);
	o->b = b;
	o->nb = nb;
}

/* o->lock held: remove @k's record of subscriber @i (its room stays, counted,
 * until the key goes) */
static void essp_sub_del(struct essp_key *k, uint32_t i)
{
	k->subs[i] = k->subs[--k->n];
}

/* o->lock held: unlink and free *@pp */
static void essp_key_del(struct ferry_essp_own *o, struct essp_key **pp)
{
	struct essp_key *k = *pp;

	*pp = k->next;
	o->bytes -= sizeof(*k) + (uint64_t)k->cap * sizeof(struct essp_sub);
	o->nkeys--;
	free(k->subs);
	free(k);
}

struct essp_pair {
	uint32_t rank, id;
	uint64_t key;
};

static void essp_send_subs(struct ferry *fy, struct ferry_table *t, struct essp_pair *p, size_t n,
			   uint64_t done, uint32_t flags, uint32_t origin);

/* the rank a key not live here is passed on to (push.c's route) */
static uint32_t essp_hint(struct ferry_table *t, uint64_t key)
{
	uint32_t home = ferry__home(t, key);

	return home == t->fy->rank ? ferry__owner(t, key) : home;
}

/* SUB and UNSUB from @src, for node m->origin: the progress thread
 * (rcu_read_lock held) */
static void essp_on_sub(struct ferry *fy, struct ferry_table *t, uint32_t src,
			const struct ferry_proto_view *v)
{
	const struct ferry_msg_essp_sub *m = v->body;
	const uint64_t *keys = v->data;
	struct cons_table *ct = __atomic_load_n((struct cons_table **)&t->cons, __ATOMIC_ACQUIRE);
	struct ferry_essp_own *o = ct ? __atomic_load_n(&ct->own, __ATOMIC_ACQUIRE) : NULL;
	uint32_t refused = 0, who = m->origin, hops = FERRY_ESSP_HOPS(m->flags);
	struct essp_pair *fwd = NULL;
	size_t nfwd = 0;

	if (!ct && t->params.consistency == FERRY_CONS_ESSP)
		return; /* destroyed here (ferry__cons_table_fini) */
	if (!o) {
		ferry_err("cons: rank %u subscribed to keys of table %u, which is not an ESSP "
			  "table here (or has replicas); ignored (do all nodes create the table "
			  "alike?)",
			  src, t->id);
		return;
	}
	if (who != src && !hops) {
		ferry_err(
			"cons: rank %u sent an ESSP subscription for rank %u; only a subscription "
			"passed on names another rank; ignored",
			src, who);
		return;
	}
	pthread_mutex_lock(&o->lock);
	for (uint32_t i = 0; i < v->count; i++) {
		struct essp_key **pp = essp_slot(o, keys[i]), *k = *pp;
		uint32_t j = 0;

		while (k && j < k->n && k->subs[j].rank != who)
			j++;
		if (m->flags & FERRY_ESSP_UNSUB) {
			/* only the subscription named: a newer one stays */
			if (k && j < k->n && k->subs[j].id == m->id) {
				essp_sub_del(k, j);
				if (!k->n)
					essp_key_del(o, pp);
			}
			continue;
		}
		if (!ferry__own(t, keys[i])) {
			uint32_t to = essp_hint(t, keys[i]);

			/* toward the owner: the hint's home, then its owner record;
			 * a key still not found is re-read and subscribed again at
			 * the reader's clock boundary */
			if (hops >= FERRY_ESSP_HOPS_MAX || to == fy->rank || to >= fy->world)
				continue;
			if (!fwd)
				fwd = malloc(v->count * sizeof(*fwd));
			if (fwd)
				fwd[nfwd++] = (struct essp_pair){ .rank = to,
								  .id = m->id,
								  .key = keys[i] };
			continue;
		}
		if (k && j < k->n) {
			k->subs[j].id = m->id;
			if (m->done > k->subs[j].tag)
				k->subs[j].tag = m->done;
			continue;
		}
		/* room: the key's entry, and its records' array doubled */
		if (o->bytes + (k ? 0 : sizeof(*k)) +
			    (!k		    ? 2 :
			     k->n == k->cap ? k->cap :
					      0) *
				    sizeof(struct essp_sub) >
		    o->limit) {
			refused++;
			continue;
		}
		if (!k) {
			k = calloc(1, sizeof(*k));
			if (!k) {
				refused++;
				continue;
			}
			k->key = keys[i];
			*pp = k;
			o->nkeys++;
			o->bytes += sizeof(*k);
		}
		if (k->n == k->cap) {
			uint32_t cap = k->cap ? 2 * k->cap : 2;
			struct essp_sub *s = realloc(k->subs, cap * sizeof(*s));

			if (!s) {
				refused++;
				if (!k->n)
					essp_key_del(o, pp);
				continue;
			}
			o->bytes += (uint64_t)(cap - k->cap) * sizeof(*s);
			k->subs = s;
			k->cap = cap;
		}
		k->subs[k->n++] = (struct essp_sub){ .rank = who, .id = m->id, .tag = m->done };
	}
	essp_grow(o);
	if (refused && !o->warned) {
		o->warned = true;
		ferry_warn("cons: table %u: %u ESSP subscriptions of rank %u refused: the "
			   "records here reached %llu bytes (a quarter of cons_bytes) or memory "
			   "ran out; those keys are refreshed by their readers at clock "
			   "boundaries instead (raise cons_bytes); logged once",
			   t->id, refused, who, (unsigned long long)o->limit);
	}
	pthread_mutex_unlock(&o->lock);
	if (nfwd)
		essp_send_subs(fy, t, fwd, nfwd, m->done, (hops + 1) << 8, who);
	free(fwd);
}

void ferry__essp_applied(struct cons_table *ct, uint64_t key, uint32_t src, uint64_t seq)
{
	struct ferry_essp_own *o = __atomic_load_n(&ct->own, __ATOMIC_ACQUIRE);
	struct essp_key *k;

	if (!o)
		return;
	pthread_mutex_lock(&o->lock);
	k = *essp_slot(o, key);
	for (uint32_t j = 0; k && j < k->n; j++)
		if (k->subs[j].rank == src && k->subs[j].tag < seq)
			k->subs[j].tag = seq;
	pthread_mutex_unlock(&o->lock);
}

/* ---- the owner pushes (progress thread) ----------------------------------- */

struct essp_out {
	struct ferry_frame f, vals;
	uint32_t count;
};

static void essp_out_send(struct ferry *fy, struct ferry_table *t, struct essp_out *o, uint32_t dst,
			  uint64_t fresh)
{
	struct ferry_msg_essp_val *m;
	int rc;

	if (!o->count)
		return;
	if (o->vals.len == SIZE_MAX || o->f.len == SIZE_MAX) {
		ferry_err("cons: table %u: out of memory for a push of %u values to rank %u; it "
			  "refreshes them itself at its next clock",
			  t->id, o->count, dst);
		goto out;
	}
	m = (struct ferry_msg_essp_val *)(o->f.buf ? o->f.buf + sizeof(struct ferry_msg_hdr) :
						     NULL);
	if (m) {
		m->fresh = fresh;
		m->count = o->count;
	}
	if (o->vals.len && o->vals.buf) {
		void *v = ferry__frame_put(&o->f, o->vals.len);

		if (v)
			memcpy(v, o->vals.buf, o->vals.len);
	}
	rc = ferry__frame_finish(&o->f, FERRY_MSG_ESSP_VAL, fy->rank, t->id);
	if (!rc)
		rc = ferry__send(fy, dst, o->f.buf, o->f.len);
	if (!rc)
		atomic_fetch_add_explicit(&fy->essp_pushed, o->count, memory_order_relaxed);
	else if (rc != -FERRY_E_PEER && rc != -FERRY_E_CLOSED)
		ferry_err("cons: table %u: pushing %u values to rank %u failed (%s); it refreshes "
			  "them itself at its next clock",
			  t->id, o->count, dst, ferry_strerror(rc));
out:
	ferry__frame_free(&o->f);
	ferry__frame_free(&o->vals);
	o->count = 0;
}

/* push every recorded key of @ct still live here, fresh to @g; essp_mu held */
static void essp_push_table(struct cons_table *ct, uint64_t g)
{
	struct ferry_table *t = ct->t;
	struct ferry *fy = t->fy;
	struct ferry_essp_own *o = ct->own;
	struct essp_out *out;
	uint64_t *done;
	float *buf = NULL;
	uint32_t bufcap = 0;

	if (g <= ct->pushed_g)
		return;
	ct->pushed_g = g;
	out = calloc(fy->world, sizeof(*out));
	done = calloc(fy->world, sizeof(*done));
	if (!out || !done) {
		free(out);
		free(done);
		ferry_err("cons: table %u: out of memory to push values to subscribers; readers "
			  "refresh them themselves",
			  t->id);
		return;
	}
	/* a frame of batch b from rank r came: r's batches below b are settled */
	pthread_mutex_lock(&ct->rx_lock);
	for (uint32_t r = 0; r < fy->world; r++)
		done[r] = ct->rx[r].seq ? ct->rx[r].seq - 1 : 0;
	pthread_mutex_unlock(&ct->rx_lock);
	pthread_mutex_lock(&o->lock);
	for (uint64_t i = 0; i < o->nb; i++) {
		struct essp_key **pp = &o->b[i];

		while (*pp) {
			struct essp_key *k = *pp;
			uint32_t len = ferry__value_len(t, k->key);

			if (len > bufcap) {
				float *nb = realloc(buf, (size_t)len * sizeof(float));

				if (!nb) {
					pp = &k->next;
					continue;
				}
				buf = nb;
				bufcap = len;
			}
			if (ferry__ops_apply(t, FERRY_OP_PULL, k->key, NULL, buf)) {
				essp_key_del(o, pp); /* moved away: its readers follow it */
				continue;
			}
			for (uint32_t j = 0; j < k->n;) {
				struct essp_sub *s = &k->subs[j];
				struct essp_out *w = &out[s->rank];
				struct ferry_msg_essp_ent *e;
				float *v;

				if (atomic_load_explicit(&fy->failed[s->rank],
							 memory_order_relaxed)) {
					essp_sub_del(k, j);
					continue;
				}
				if (!w->count) {
					ferry__frame_begin(&w->f);
					(void)ferry__frame_put(&w->f,
							       sizeof(struct ferry_msg_essp_val));
				}
				e = ferry__frame_put(&w->f, sizeof(*e));
				v = ferry__frame_put(&w->vals, (size_t)len * sizeof(float));
				if (e) {
					e->key = k->key;
					e->tag = s->tag > done[s->rank] ? s->tag : done[s->rank];
					e->id = s->id;
					e->len = len;
				}
				if (v)
					memcpy(v, buf, (size_t)len * sizeof(float));
				w->count++;
				if (w->f.len == SIZE_MAX || w->vals.len == SIZE_MAX ||
				    w->f.len + w->vals.len >= ESSP_FRAME_BYTES)
					essp_out_send(fy, t, w, s->rank, g);
				j++;
			}
			if (!k->n) {
				essp_key_del(o, pp);
				continue;
			}
			pp = &k->next;
		}
	}
	pthread_mutex_unlock(&o->lock);
	for (uint32_t r = 0; r < fy->world; r++)
		essp_out_send(fy, t, &out[r], r, g);
	free(buf);
	free(out);
	free(done);
}

void ferry__essp_push_all(struct ferry_cons_node *cn, uint64_t g)
{
	if (!atomic_load_explicit(&cn->nessp, memory_order_relaxed))
		return;
	pthread_mutex_lock(&cn->essp_mu);
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t;

		pthread_mutex_lock(&cn->lock);
		t = cn->tabs[id];
		pthread_mutex_unlock(&cn->lock);
		if (t && ((struct cons_table *)t->cons)->own)
			essp_push_table(t->cons, g);
	}
	pthread_mutex_unlock(&cn->essp_mu);
}

/* KICK: only from this node (ferry__cons_announce) */
static void essp_on_kick(struct ferry *fy, struct ferry_table *unused, uint32_t src,
			 const struct ferry_proto_view *v)
{
	(void)unused;
	if (src != fy->rank) {
		ferry_err("cons: rank %u sent an ESSP kick, which a node only sends itself; "
			  "dropped as broken (a peer with another library version?)",
			  src);
		ferry__node_peer_failed(fy, src);
		return;
	}
	ferry__essp_push_all(fy->cons, ((const struct ferry_msg_essp_kick *)v->body)->clock);
}

void ferry__essp_kick(struct ferry_cons_node *cn, uint64_t g)
{
	struct ferry *fy = cn->fy;
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_essp_kick k;
	} msg;

	if (!atomic_load_explicit(&cn->nessp, memory_order_relaxed))
		return;
	memset(&msg, 0, sizeof(msg));
	ferry__proto_hdr_init(&msg.h, FERRY_MSG_ESSP_KICK, sizeof(msg), fy->rank, 0);
	msg.k.clock = g;
	(void)ferry__send(fy, fy->rank, &msg, sizeof(msg)); /* fails only when closing */
}

/* ---- the reader ------------------------------------------------------------- */

static int essp_pair_cmp(const void *a, const void *b)
{
	const struct essp_pair *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return x->key < y->key ? -1 : x->key > y->key;
}

/* send SUB (or UNSUB) frames for @p[0 .. n), sorted: one per (rank, id) and
 * at most ESSP_FRAME_BYTES each; the caller's thread, no lock held */
static void essp_send_subs(struct ferry *fy, struct ferry_table *t, struct essp_pair *p, size_t n,
			   uint64_t done, uint32_t flags, uint32_t origin)
{
	qsort(p, n, sizeof(*p), essp_pair_cmp);
	for (size_t i = 0; i < n;) {
		struct ferry_frame f;
		struct ferry_msg_essp_sub *m;
		uint32_t count = 0;
		size_t j = i;
		int rc;

		ferry__frame_begin(&f);
		(void)ferry__frame_put(&f, sizeof(*m));
		for (; j < n && p[j].rank == p[i].rank && p[j].id == p[i].id &&
		       f.len < ESSP_FRAME_BYTES;
		     j++) {
			uint64_t *k = ferry__frame_put(&f, sizeof(*k));

			if (k)
				*k = p[j].key;
			count++;
		}
		m = (struct ferry_msg_essp_sub *)(f.buf ? f.buf + sizeof(struct ferry_msg_hdr) :
							  NULL);
		if (m) {
			m->done = done;
			m->id = p[i].id;
			m->count = count;
			m->flags = flags;
			m->origin = origin;
		}
		rc = ferry__frame_finish(&f, FERRY_MSG_ESSP_SUB, fy->rank, t->id);
		if (!rc)
			rc = ferry__send(fy, p[i].rank, f.buf, f.len);
		if (!rc && !flags && origin == fy->rank)
			atomic_fetch_add_explicit(&fy->essp_subscribed, count,
						  memory_order_relaxed);
		ferry__frame_free(&f);
		/* a lost SUB: the copy falls behind and is re-read and
		 * subscribed again at a clock boundary; a lost UNSUB: one more
		 * push, answered again */
		i = j;
	}
}

void ferry__essp_subscribe(struct cons_table *ct, const uint64_t *keys, size_t n)
{
	struct ferry_table *t = ct->t;
	struct essp_pair *p;
	uint64_t done;
	size_t np = 0;
	uint32_t id, at;

	if (ct->model != FERRY_CONS_ESSP || t->params.replicas || !n)
		return;
	p = malloc(n * sizeof(*p));
	if (!p)
		return; /* not subscribed: refreshed at clock boundaries */
	pthread_mutex_lock(&ct->lock);
	id = ++ct->sub_next ? ct->sub_next : ++ct->sub_next;
	done = ct->bseq;
	for (size_t i = 0; i < n; i++) {
		struct ferry_cons_ent *e = ferry__cons_map_find(&ct->m, keys[i]);

		if (!e || !e->have_val || e->sub_id == id)
			continue;
		/* live here: an owner's push to itself would be a frame to
		 * itself per clock; the clock boundary's refresh re-reads the
		 * copy with a local pull instead (cons.c, cons_refresh) */
		at = ferry__loc_get(t, keys[i]);
		if (at == t->fy->rank)
			continue;
		e->sub_rank = at;
		e->sub_id = id;
		e->sub_conf = false;
		p[np++] = (struct essp_pair){ .rank = e->sub_rank, .id = id, .key = keys[i] };
	}
	pthread_mutex_unlock(&ct->lock);
	essp_send_subs(t->fy, t, p, np, done, 0, t->fy->rank);
	free(p);
}

/* VAL from @src: the progress thread (rcu_read_lock held) */
static void essp_on_val(struct ferry *fy, struct ferry_table *t, uint32_t src,
			const struct ferry_proto_view *v)
{
	const struct ferry_msg_essp_val *m = v->body;
	const struct ferry_msg_essp_ent *es = v->data;
	struct cons_table *ct = __atomic_load_n((struct cons_table **)&t->cons, __ATOMIC_ACQUIRE);
	struct ferry_cons_node *cn = fy->cons;
	struct essp_pair *stale = NULL;
	uint64_t own, taken = 0, refused = 0, off = 0;
	size_t nstale = 0;
	const char *bad = NULL;

	if (!ct && t->params.consistency == FERRY_CONS_ESSP)
		return; /* destroyed here (ferry__cons_table_fini) */
	if (!ct || ct->model != FERRY_CONS_ESSP) {
		ferry_err("cons: rank %u pushed values of table %u, which is not an ESSP table "
			  "here; dropped (do all nodes create the table alike?)",
			  src, t->id);
		return;
	}
	pthread_mutex_lock(&cn->lock);
	own = cn->peer[fy->rank];
	pthread_mutex_unlock(&cn->lock);
	if (m->fresh > own) {
		bad = "fresh to a clock this node has not announced yet";
		goto broken;
	}
	pthread_mutex_lock(&ct->lock);
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_essp_ent *x = &es[i];
		struct ferry_cons_ent *e = ferry__cons_map_find(&ct->m, x->key);

		off += x->len;
		if (x->tag > ct->bseq) {
			pthread_mutex_unlock(&ct->lock);
			bad = "tagged with a batch this node never sent";
			goto broken;
		}
		/* one rank at a time holds subscription id: the first that
		 * pushes under it (the SUB may have been passed on) */
		if (e && e->have_val && e->sub_id == x->id && !e->sub_conf) {
			e->sub_rank = src;
			e->sub_conf = true;
		}
		if (!e || !e->have_val || e->sub_rank != src || e->sub_id != x->id) {
			/* not (or no longer) subscribed there under that id */
			if (!stale)
				stale = malloc(v->count * sizeof(*stale));
			if (stale)
				stale[nstale++] = (struct essp_pair){ .rank = src,
								      .id = x->id,
								      .key = x->key };
			refused++;
			continue;
		}
		if (e->infl || ct->out || x->tag < e->sent_seq || m->fresh <= e->fresh ||
		    ferry__cons_map_set_val(&ct->m, e, v->vals + off - x->len, m->fresh)) {
			refused++;
			continue;
		}
		taken++;
	}
	pthread_mutex_unlock(&ct->lock);
	if (taken)
		atomic_fetch_add_explicit(&fy->essp_taken, taken, memory_order_relaxed);
	if (refused)
		atomic_fetch_add_explicit(&fy->essp_refused, refused, memory_order_relaxed);
	if (nstale)
		essp_send_subs(fy, t, stale, nstale, 0, FERRY_ESSP_UNSUB, fy->rank);
	free(stale);
	return;
broken:
	free(stale);
	ferry_err("cons: rank %u pushed values of table %u %s; dropped as broken (a peer with "
		  "another library version?)",
		  src, t->id, bad);
	ferry__node_peer_failed(fy, src);
}

int ferry__essp_attach(struct ferry *fy)
{
	int rc =
		ferry__dispatch_register(fy, FERRY_MSG_ESSP_SUB, FERRY_DISPATCH_TABLE, essp_on_sub);

	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_ESSP_VAL, FERRY_DISPATCH_TABLE,
					      essp_on_val);
	return rc ? rc :
		    ferry__dispatch_register(fy, FERRY_MSG_ESSP_KICK, FERRY_DISPATCH_NODE,
					     essp_on_kick);
}

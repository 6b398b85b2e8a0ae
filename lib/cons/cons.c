/* SPDX-License-Identifier: MIT */
/*
 * cons.c - tables with a consistency model other than SEQUENTIAL: their
 * pulls, pushes and sets (ops calls these through the table's hooks), the
 * node-wide flush at a clock boundary, and the public ferry_clock(),
 * ferry_flush() (docs/consistency.md, "Models").
 *
 * A node keeps, per such table, a map (map.c) of copies of owners' values
 * and of deltas its workers pushed:
 *
 *   push   -> pend[key] += delta                          (no message)
 *   pull   -> copy + pend + infl, when the copy is fresh enough; else a
 *             pull from the owner (ops, sequentially consistent), kept as
 *             the copy, fresh to the global clock read before it started
 *   clock  -> the node's clock moved on: every table's pend goes to the
 *             owners as one push batch (infl meanwhile), applied there,
 *             then CLOCK{c} to every node (clock.c)
 *
 * A copy is kept only when no flush of this node's overlapped its pull (the
 * table's gen, odd while a flush runs, is the same before and after): then
 * it holds exactly the flushes done before, and pend (+ infl) are what it
 * lacks of this node's own pushes. A flush adds infl to the copies taken
 * before it began, so they stay whole.
 *
 * Locks: the table's cons lock (map, gen) is never held across a message;
 * the table's flush mutex makes its flushes one at a time; the node's
 * flush_lock orders node-wide flushes with their CLOCK and with table
 * teardown. Order: flush_lock -> flush mutex -> cons lock -> node lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cons/cons.h"
#include "lib/ops/codec.h"
#include "lib/ops/ops.h"

#define CONS_BYTES_DEFAULT (64ull << 20)
#define CONS_SMALL 64 /* keys of a pull whose bookkeeping fits on the stack */

static bool cons_ssp(const struct cons_table *ct)
{
	return ct->model == FERRY_CONS_SSP || ct->model == FERRY_CONS_ESSP;
}

/* the histogram bucket of a read at clock @c of a copy fresh to @fresh */
static unsigned cons_stale_bucket(uint64_t c, uint64_t fresh)
{
	uint64_t b = c > fresh ? c - fresh : 0;

	return b >= FERRY_STALENESS_BUCKETS ? FERRY_STALENESS_BUCKETS - 1 : (unsigned)b;
}

/* @n reads into bucket @b: once per call, not per key (the counters are
 * the node's, shared by its workers) */
static void cons_count_stale(struct ferry *fy, unsigned b, uint64_t n)
{
	if (n)
		atomic_fetch_add_explicit(&fy->staleness[b], n, memory_order_relaxed);
}

/* offsets of each key's value in the caller's buffer; NULL when out of memory */
static uint64_t *cons_offsets(struct ferry_table *t, const uint64_t *keys, size_t n,
			      uint64_t *total_p)
{
	uint64_t *offs = malloc((n + 1) * sizeof(*offs));

	if (!offs)
		return NULL;
	offs[0] = 0;
	for (size_t i = 0; i < n; i++)
		offs[i + 1] = offs[i] + ferry__value_len(t, keys[i]);
	*total_p = offs[n];
	return offs;
}

/* lock held: wait until no flush of the table runs; bounded by @ts */
static int cons_wait_even(struct cons_table *ct, const struct timespec *ts)
{
	while (ct->gen & 1)
		if (ferry__cond_wait_until(&ct->cond, &ct->lock, ts) == ETIMEDOUT &&
		    (ct->gen & 1)) {
			ferry_err("cons: table %u: a flush of this node's pushes took more than %d "
				  "ms; an owner does not answer (see the log for a failed rank)",
				  ct->t->id, ct->t->fy->timeout_ms);
			return -ETIMEDOUT;
		}
	return 0;
}

/*
 * Pull the keys @miss[0 .. nm) of @keys from their owners and keep them as
 * copies: the worker's thread, no lock held. @c: the reader's clock; @need:
 * the copy must hold every update of clocks below it (SSP).
 */
static int cons_fetch(struct cons_table *ct, struct ferry_worker *w, uint64_t c, uint64_t need,
		      const uint64_t *keys, const uint32_t *miss, size_t nm, const uint64_t *offs,
		      float *vals)
{
	struct ferry_table *t = ct->t;
	struct timespec ts;
	uint64_t *mkeys, total = 0, g0 = 0, gen0;
	float *buf;
	int rc;

	mkeys = malloc(nm * sizeof(*mkeys));
	for (size_t j = 0; mkeys && j < nm; j++) {
		mkeys[j] = keys[miss[j]];
		total += offs[miss[j] + 1] - offs[miss[j]];
	}
	buf = mkeys ? malloc(total * sizeof(float) + 1) : NULL;
	if (!buf) {
		free(mkeys);
		ferry_err("cons: table %u: out of memory for a pull of %zu keys", t->id, nm);
		return -ENOMEM;
	}
	ferry__deadline_ms(t->fy->timeout_ms, &ts);
	for (;;) {
		if (cons_ssp(ct)) {
			rc = ferry__cons_wait_global(ct->cn, need, c, ct->s);
			if (rc)
				break;
			g0 = ferry__cons_global(ct->cn);
		}
		pthread_mutex_lock(&ct->lock);
		rc = cons_wait_even(ct, &ts);
		gen0 = ct->gen;
		pthread_mutex_unlock(&ct->lock);
		if (rc)
			break;
		rc = ferry__ops_sync(w, t, FERRY_OP_PULL, mkeys, nm, NULL, buf, NULL);
		if (rc)
			break;
		pthread_mutex_lock(&ct->lock);
		if (ct->gen != gen0) {
			struct timespec now;

			/* a flush (or a set) overlapped: the value may or may not
			 * hold it; pull again */
			pthread_mutex_unlock(&ct->lock);
			clock_gettime(CLOCK_MONOTONIC, &now);
			if (now.tv_sec > ts.tv_sec ||
			    (now.tv_sec == ts.tv_sec && now.tv_nsec >= ts.tv_nsec)) {
				ferry_err("cons: table %u: every pull for %d ms overlapped a flush "
					  "of this node's pushes; flushes come too often (raise "
					  "cons_bytes)",
					  t->id, t->fy->timeout_ms);
				rc = -ETIMEDOUT;
				break;
			}
			continue;
		}
		for (size_t j = 0, off = 0; j < nm; j++) {
			size_t i = miss[j];
			uint32_t len = (uint32_t)(offs[i + 1] - offs[i]);
			struct ferry_cons_ent *e = ferry__cons_map_get(&ct->m, keys[i], len);

			if (e && !ferry__cons_map_set_val(&ct->m, e, buf + off, g0)) {
				e->last_read = c;
				e->sent_seq = ct->bseq; /* every batch before is settled */
				ferry__cons_map_read(e, vals + offs[i]);
			} else {
				/* no room for a copy: the value, and what this node
				 * has not sent (pend, infl) */
				memcpy(vals + offs[i], buf + off, (size_t)len * sizeof(float));
				if (e && e->pend)
					for (uint32_t k = 0; k < len; k++)
						vals[offs[i] + k] += e->pend[k];
			}
			off += len;
		}
		if (cons_ssp(ct))
			cons_count_stale(t->fy, cons_stale_bucket(c, g0), nm);
		ferry__cons_map_evict(&ct->m);
		pthread_mutex_unlock(&ct->lock);
		/* ESSP: the owners push these from now on (essp.c) */
		ferry__essp_subscribe(ct, mkeys, nm);
		break;
	}
	free(buf);
	free(mkeys);
	return rc;
}

static int cons_pull(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		     float *vals)
{
	struct cons_table *ct = t->cons;
	uint64_t c, need = 0, total, hist[FERRY_STALENESS_BUCKETS] = { 0 };
	uint64_t offs_small[CONS_SMALL + 1], *offs = offs_small;
	uint32_t miss_small[CONS_SMALL], *miss = miss_small;
	size_t nm = 0;
	int rc = ferry__cons_check_call(w, t, keys, n, vals, "pull");

	if (rc || !n)
		return rc;
	c = ferry__cons_wclock(ct->cn, w);
	if (cons_ssp(ct) && c > ct->s)
		need = c - ct->s;
	if (n > CONS_SMALL) {
		offs = cons_offsets(t, keys, n, &total);
		miss = malloc(n * sizeof(*miss));
	} else {
		offs[0] = 0;
		for (size_t i = 0; i < n; i++)
			offs[i + 1] = offs[i] + ferry__value_len(t, keys[i]);
	}
	if (!offs || !miss) {
		if (offs != offs_small)
			free(offs);
		if (miss != miss_small)
			free(miss);
		ferry_err("cons: table %u: out of memory for a pull of %zu keys", t->id, n);
		return -ENOMEM;
	}
	pthread_mutex_lock(&ct->lock);
	for (size_t i = 0; i < n; i++) {
		struct ferry_cons_ent *e = ferry__cons_map_find(&ct->m, keys[i]);

		if (e && e->have_val && (!cons_ssp(ct) || e->fresh >= need)) {
			ferry__cons_map_read(e, vals + offs[i]);
			e->last_read = c;
			hist[cons_stale_bucket(c, e->fresh)]++;
		} else {
			miss[nm++] = (uint32_t)i;
		}
	}
	pthread_mutex_unlock(&ct->lock);
	if (cons_ssp(ct))
		for (unsigned b = 0; b < FERRY_STALENESS_BUCKETS; b++)
			cons_count_stale(t->fy, b, hist[b]);
	atomic_fetch_add_explicit(&t->fy->cons_hits, n - nm, memory_order_relaxed);
	if (nm)
		atomic_fetch_add_explicit(&t->fy->cons_misses, nm, memory_order_relaxed);
	if (nm)
		rc = cons_fetch(ct, w, c, need, keys, miss, nm, offs, vals);
	if (offs != offs_small)
		free(offs);
	if (miss != miss_small)
		free(miss);
	return rc;
}

/* the old way, for tables with replicas (a CONS_PUSH would bypass the
 * copies to the backups): one push through ops; on failure its deltas are
 * dropped, logged, as they may be applied in part (docs/consistency.md) */
static int cons_flush_ops(struct cons_table *ct, struct ferry_worker *w, uint64_t *keys,
			  float *deltas, size_t n)
{
	int prc = ferry__ops_sync(w, ct->t, FERRY_OP_PUSH, keys, n, deltas, NULL, NULL);

	pthread_mutex_lock(&ct->lock);
	for (struct ferry_cons_ent *e = ct->m.ihead; e; e = e->inext)
		e->out = prc ? FERRY_CONS_OUT_UNKNOWN : FERRY_CONS_OUT_APPLIED;
	pthread_mutex_unlock(&ct->lock);
	if (prc)
		ferry_err("cons: table %u (with replicas): sending %zu keys' buffered deltas of "
			  "this node failed (%s); they may be applied in part and are not sent "
			  "again",
			  ct->t->id, n, ferry_strerror(prc));
	free(keys);
	free(deltas);
	return prc;
}

/*
 * flush_mu held: send again the keys a failed flush left unanswered
 * (ct->out), before any newer batch. Keys answered "not applied" go back
 * to the unsent deltas. Return: 0 when none is left unanswered.
 */
static int cons_resolve_out(struct cons_table *ct)
{
	struct ferry_cons_batch *b = ct->out;
	size_t sent = 0;
	int rc;

	if (!b)
		return 0;
	rc = ferry__cons_batch_run(ct, b);
	pthread_mutex_lock(&ct->lock);
	for (size_t i = 0; i < b->n; i++) {
		uint32_t len = (uint32_t)(b->offs[i + 1] - b->offs[i]);
		struct ferry_cons_ent *e;

		if (b->st[i] == FERRY_CONS_B_SENT) {
			sent++;
			continue;
		}
		if (b->st[i] == FERRY_CONS_B_DONE)
			continue;
		/* not applied: unsent again (never sent twice under this number) */
		e = ferry__cons_map_get(&ct->m, b->keys[i], len);
		if (!e || ferry__cons_map_pend_add(&ct->m, e, b->deltas + b->offs[i])) {
			sent++; /* no memory: it stays with the batch, retried */
			b->st[i] = FERRY_CONS_B_SENT;
			continue;
		}
		b->st[i] = FERRY_CONS_B_DONE;
	}
	b->left = sent;
	if (!sent)
		ct->out = NULL;
	ct->gen += 2; /* copies taken meanwhile may or may not hold these */
	ferry__cons_map_drop_all_vals(&ct->m);
	pthread_cond_broadcast(&ct->cond);
	pthread_mutex_unlock(&ct->lock);
	if (!sent) {
		ferry__cons_batch_free(b);
		return 0;
	}
	return rc ? rc : -ETIMEDOUT;
}

/*
 * Send the table's unsent deltas as one numbered batch (push.c) and wait
 * until the owners applied them; @drop: then forget every copy too. The
 * worker's thread, no lock held. Return: 0, or the error; then no delta
 * is lost: those not applied stay unsent, those unanswered stay with the
 * batch and go again, under the same number, at the next flush.
 */
static int cons_table_flush(struct cons_table *ct, struct ferry_worker *w, bool drop)
{
	struct ferry_table *t = ct->t;
	struct ferry_cons_batch *b = NULL;
	uint64_t *keys;
	float *deltas;
	size_t n;
	int rc, prc = 0;

	pthread_mutex_lock(&ct->flush_mu);
	rc = cons_resolve_out(ct);
	if (rc) {
		pthread_mutex_unlock(&ct->flush_mu);
		return rc;
	}
	pthread_mutex_lock(&ct->lock);
	rc = ferry__cons_map_flush_take(&ct->m, &keys, &deltas, &n);
	if (!rc && n)
		ct->gen++;
	pthread_mutex_unlock(&ct->lock);
	if (rc) {
		pthread_mutex_unlock(&ct->flush_mu);
		ferry_err("cons: table %u: out of memory to send this node's buffered pushes; "
			  "they stay buffered (lower cons_bytes)",
			  t->id);
		return rc;
	}
	if (n && t->params.replicas) {
		prc = cons_flush_ops(ct, w, keys, deltas, n);
	} else if (n) {
		b = ferry__cons_batch_new(t, ct->seq + 1, keys, deltas, n);
		if (!b) {
			free(keys);
			free(deltas);
			pthread_mutex_lock(&ct->lock);
			for (struct ferry_cons_ent *e = ct->m.ihead; e; e = e->inext)
				e->out = FERRY_CONS_OUT_HELD;
			pthread_mutex_unlock(&ct->lock);
			ferry_err("cons: table %u: out of memory for a batch of %zu keys; they "
				  "stay buffered",
				  t->id, n);
			prc = -ENOMEM;
		} else {
			ct->seq++;
			prc = ferry__cons_batch_run(ct, b);
		}
	}
	pthread_mutex_lock(&ct->lock);
	if (n) {
		ferry__cons_map_flush_done(&ct->m);
		ct->gen++;
	}
	if (b) {
		size_t sent = 0;

		/* the unanswered keys stay with the batch; the rest is settled */
		for (size_t i = 0; i < b->n; i++) {
			if (b->st[i] == FERRY_CONS_B_SENT)
				sent++;
			else
				b->st[i] = FERRY_CONS_B_DONE;
		}
		b->left = sent;
		if (sent)
			ct->out = b;
		else
			ferry__cons_batch_free(b);
	}
	if (drop) {
		ferry__cons_map_drop_all_vals(&ct->m);
		ct->gen += 2;
	}
	pthread_cond_broadcast(&ct->cond);
	pthread_mutex_unlock(&ct->lock);
	pthread_mutex_unlock(&ct->flush_mu);
	return prc;
}

static int cons_push(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		     const float *deltas)
{
	struct cons_table *ct = t->cons;
	uint64_t off = 0;
	bool over;
	int rc = ferry__cons_check_call(w, t, keys, n, deltas, "push");

	if (rc || !n)
		return rc;
	pthread_mutex_lock(&ct->lock);
	for (size_t i = 0; i < n && !rc; i++) {
		uint32_t len = ferry__value_len(t, keys[i]);
		struct ferry_cons_ent *e = ferry__cons_map_get(&ct->m, keys[i], len);

		rc = e ? ferry__cons_map_pend_add(&ct->m, e, deltas + off) : -ENOMEM;
		if (rc)
			ferry_err("push: table %u: out of memory to buffer key %llu; the %zu keys "
				  "before it in the batch are buffered, the rest is not",
				  t->id, (unsigned long long)keys[i], i);
		off += len;
	}
	over = ct->m.pend_floats * sizeof(float) > ct->m.limit / 2;
	pthread_mutex_unlock(&ct->lock);
	/* early: only ever adds. This call's deltas are buffered whatever the
	 * flush does (a failed one keeps them, logged, and the next sends
	 * them): the push succeeded, and an error would invite a retry that
	 * doubles them */
	if (!rc && over)
		(void)cons_table_flush(ct, w, false);
	return rc;
}

static int cons_set(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		    const float *vals)
{
	struct cons_table *ct = t->cons;
	int rc = ferry__cons_check_call(w, t, keys, n, vals, "set");

	if (rc || !n)
		return rc;
	/* this node's earlier pushes first, then the set, at the owner */
	rc = cons_table_flush(ct, w, false);
	if (!rc)
		rc = ferry__ops_sync(w, t, FERRY_OP_SET, keys, n, vals, NULL, NULL);
	pthread_mutex_lock(&ct->lock);
	for (size_t i = 0; i < n; i++) {
		struct ferry_cons_ent *e = ferry__cons_map_find(&ct->m, keys[i]);

		if (e)
			ferry__cons_map_drop_val(&ct->m, e);
	}
	ct->gen += 2; /* a pull that overlapped may hold the old value */
	pthread_cond_broadcast(&ct->cond);
	pthread_mutex_unlock(&ct->lock);
	return rc;
}

static const struct ferry_cons_hooks cons_hooks = {
	.pull = cons_pull,
	.push = cons_push,
	.set = cons_set,
};

/*
 * ESSP: re-read, in one batch, the copies this node's workers read in the
 * last s + 1 clocks that are older than the global clock; forget the
 * others (the key is no longer read). Once per table and global clock.
 * The worker's thread, flush_lock held (the table stays).
 */
static int cons_refresh(struct cons_table *ct, struct ferry_worker *w, uint64_t c)
{
	uint64_t g = ferry__cons_global(ct->cn), window = (uint64_t)ct->s + 1, gen0, total = 0;
	uint64_t *keys = NULL;
	uint32_t *lens = NULL;
	float *buf = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;

	pthread_mutex_lock(&ct->lock);
	if (g <= ct->refreshed || (ct->gen & 1)) {
		pthread_mutex_unlock(&ct->lock);
		return 0;
	}
	ct->refreshed = g;
	for (struct ferry_cons_ent *e = ct->m.fhead, *next; e; e = next) {
		next = e->fnext;
		if (e->last_read + window < c) {
			ferry__cons_map_drop_val(&ct->m, e); /* unsubscribed */
			continue;
		}
		/* subscribed (essp.c): the owner pushes it at each global
		 * clock; re-read only when a push is missing for a whole
		 * clock (the key moved, a subscription was refused or lost) */
		if (e->fresh >= g || (ct->own && e->sub_id && e->fresh + 1 >= g))
			continue;
		if (n == cap) {
			size_t ncap = cap ? 2 * cap : 256;
			uint64_t *nk = realloc(keys, ncap * sizeof(*keys));
			uint32_t *nl = nk ? realloc(lens, ncap * sizeof(*lens)) : NULL;

			if (nk)
				keys = nk;
			if (!nl)
				break; /* refresh what fits */
			lens = nl;
			cap = ncap;
		}
		keys[n] = e->key;
		lens[n++] = e->len;
		total += e->len;
	}
	gen0 = ct->gen;
	pthread_mutex_unlock(&ct->lock);
	if (!n)
		goto out;
	buf = malloc(total * sizeof(float));
	if (!buf)
		goto out;
	rc = ferry__ops_sync(w, ct->t, FERRY_OP_PULL, keys, n, NULL, buf, NULL);
	if (rc)
		goto out;
	atomic_fetch_add_explicit(&ct->t->fy->cons_refreshed, n, memory_order_relaxed);
	pthread_mutex_lock(&ct->lock);
	if (ct->gen == gen0) {
		uint64_t off = 0;

		for (size_t i = 0; i < n; i++) {
			struct ferry_cons_ent *e = ferry__cons_map_find(&ct->m, keys[i]);

			if (e && e->have_val && e->fresh < g) {
				uint64_t last = e->last_read;

				ferry__cons_map_set_val(&ct->m, e, buf + off, g);
				e->last_read = last;
				e->sent_seq = ct->bseq;
			}
			off += lens[i];
		}
	}
	pthread_mutex_unlock(&ct->lock);
	/* subscribe again, where the keys are now */
	ferry__essp_subscribe(ct, keys, n);
out:
	free(buf);
	free(keys);
	free(lens);
	return rc;
}

/* the node's clock moved on: flush every table, then announce. The worker's
 * thread. */
static int cons_advance(struct ferry_cons_node *cn, struct ferry_worker *w)
{
	uint64_t target;
	int rc = 0;

	pthread_mutex_lock(&cn->flush_lock);
	target = ferry__cons_local(cn);
	if (target > cn->announced) {
		for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
			struct ferry_table *t;
			int trc;

			pthread_mutex_lock(&cn->lock);
			t = cn->tabs[id];
			pthread_mutex_unlock(&cn->lock);
			if (!t)
				continue;
			trc = cons_table_flush(t->cons, w,
					       ((struct cons_table *)t->cons)->model ==
						       FERRY_CONS_EVENTUAL);
			/* SSP, ESSP: hot deltas of the clocks below target are
			 * applied at every replica before the CLOCK goes */
			if (!trc && t->hot && cons_ssp(t->cons))
				trc = ferry__hot_flush(t);
			if (trc && !rc)
				rc = trc;
		}
		/* announced even after a failed flush (its deltas are kept,
		 * logged): the others must not wait for them */
		int arc = ferry__cons_announce(cn, target);

		if (arc && !rc)
			rc = arc;
	}
	pthread_mutex_unlock(&cn->flush_lock);
	return rc;
}

int ferry_clock(struct ferry_worker *w)
{
	struct ferry_cons_node *cn;
	uint32_t s = UINT32_MAX;
	uint64_t c;
	int rc = 0;

	if (!w)
		return -EINVAL;
	cn = w->fy->cons;
	if (atomic_load(&w->fy->closed))
		return -FERRY_E_CLOSED;
	if (ferry__cons_tick(cn, w, &c))
		rc = cons_advance(cn, w);
	if (rc)
		return rc;
	pthread_mutex_lock(&cn->lock);
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t = cn->tabs[id];

		if (t && cons_ssp(t->cons) && ((struct cons_table *)t->cons)->s < s)
			s = ((struct cons_table *)t->cons)->s;
	}
	pthread_mutex_unlock(&cn->lock);
	if (s == UINT32_MAX)
		return 0;
	/* more than s clocks ahead of the slowest: wait */
	if (c > s)
		rc = ferry__cons_wait_global(cn, c - s, c, s);
	if (rc)
		return rc;
	pthread_mutex_lock(&cn->flush_lock);
	for (uint32_t id = 0; id < FERRY_MAX_TABLES && !rc; id++) {
		struct ferry_table *t;

		pthread_mutex_lock(&cn->lock);
		t = cn->tabs[id];
		pthread_mutex_unlock(&cn->lock);
		if (t && ((struct cons_table *)t->cons)->model == FERRY_CONS_ESSP)
			rc = cons_refresh(t->cons, w, c);
	}
	pthread_mutex_unlock(&cn->flush_lock);
	return rc;
}

uint64_t ferry_clock_get(const struct ferry_worker *w)
{
	struct ferry_cons_node *cn = w ? w->fy->cons : NULL;

	if (!cn)
		return 0;
	return ferry__cons_wclock(cn, w);
}

int ferry_flush(struct ferry_worker *w, struct ferry_table *t)
{
	int rc;

	if (!t)
		return -EINVAL;
	if (t->params.push_codec)
		return ferry__codec_flush(w, t); /* SEQUENTIAL only (codec.h) */
	if (!t->hot && !t->cons)
		return 0;
	rc = ferry__cons_check_call(w, t, NULL, 0, NULL, "flush");
	if (rc)
		return rc;
	if (t->hot) {
		rc = ferry__hot_flush(t);
		if (rc)
			return rc;
	}
	return t->cons ? cons_table_flush(t->cons, w, true) : 0;
}

static void cons_worker_new(struct ferry_worker *w)
{
	ferry__cons_join(w->fy->cons, w);
}

/* a worker goes: its clock stops holding the node's back */
static void cons_worker_gone(struct ferry_worker *w)
{
	struct ferry_cons_node *cn = w->fy->cons;

	if (ferry__cons_leave(cn, w) && !atomic_load(&w->fy->closed))
		cons_advance(cn, w);
}

/* ferry_barrier(): before, every buffered push goes (through a worker of
 * our own: the caller may have none); after, copies go, so that every read
 * after the barrier sees every push flushed before it anywhere */
static int cons_barrier(struct ferry *fy, int after)
{
	struct ferry_cons_node *cn = fy->cons;
	struct ferry_worker *tw = NULL;
	int rc = 0;

	pthread_mutex_lock(&cn->flush_lock);
	for (uint32_t id = 0; id < FERRY_MAX_TABLES && !rc && !after; id++) {
		struct ferry_table *t;

		pthread_mutex_lock(&cn->lock);
		t = cn->hot[id];
		pthread_mutex_unlock(&cn->lock);
		if (t)
			rc = ferry__hot_flush(t);
	}
	for (uint32_t id = 0; id < FERRY_MAX_TABLES && !rc; id++) {
		struct ferry_table *t;
		struct cons_table *ct;
		bool pend;

		pthread_mutex_lock(&cn->lock);
		t = cn->tabs[id];
		pthread_mutex_unlock(&cn->lock);
		if (!t)
			continue;
		ct = t->cons;
		if (after) {
			pthread_mutex_lock(&ct->lock);
			ferry__cons_map_drop_all_vals(&ct->m);
			ct->gen += 2;
			pthread_cond_broadcast(&ct->cond);
			pthread_mutex_unlock(&ct->lock);
			continue;
		}
		pthread_mutex_lock(&ct->lock);
		pend = ct->m.npend != 0 || ct->out;
		pthread_mutex_unlock(&ct->lock);
		if (!pend)
			continue;
		if (!tw)
			rc = ferry_worker_create(fy, &tw);
		if (!rc)
			rc = cons_table_flush(ct, tw, false);
	}
	pthread_mutex_unlock(&cn->flush_lock);
	if (tw)
		ferry_worker_destroy(tw);
	return rc;
}

/* ferry_close(): the hot keys' sync threads stop before the transport goes
 * (a table not destroyed yet is freed after it) */
static void cons_close(struct ferry *fy)
{
	struct ferry_cons_node *cn = fy->cons;

	pthread_mutex_lock(&cn->flush_lock);
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t;

		pthread_mutex_lock(&cn->lock);
		t = cn->hot[id];
		pthread_mutex_unlock(&cn->lock);
		if (t)
			ferry__hot_stop(t);
	}
	pthread_mutex_unlock(&cn->flush_lock);
}

static void cons_node_free(void *p)
{
	struct ferry_cons_node *cn = p;

	if (!cn)
		return;
	free(cn->peer);
	pthread_mutex_destroy(&cn->lock);
	pthread_mutex_destroy(&cn->flush_lock);
	pthread_mutex_destroy(&cn->essp_mu);
	pthread_cond_destroy(&cn->cond);
	free(cn);
}

int ferry__cons_attach(struct ferry *fy)
{
	struct ferry_cons_node *cn = calloc(1, sizeof(*cn));
	int rc;

	if (!cn || !(cn->peer = calloc(fy->world, sizeof(*cn->peer)))) {
		free(cn);
		return -ENOMEM;
	}
	cn->fy = fy;
	pthread_mutex_init(&cn->lock, NULL);
	pthread_mutex_init(&cn->flush_lock, NULL);
	pthread_mutex_init(&cn->essp_mu, NULL);
	ferry__cond_init_monotonic(&cn->cond);
	fy->cons_free = cons_node_free;
	fy->cons_worker_new = cons_worker_new;
	fy->cons_worker_gone = cons_worker_gone;
	fy->cons_barrier = cons_barrier;
	fy->cons_close = cons_close;
	rc = ferry__cons_clock_attach(fy, cn);
	if (!rc)
		rc = ferry__hot_attach(fy);
	if (!rc)
		rc = ferry__essp_attach(fy);
	return rc ? rc : ferry__cons_push_attach(fy);
}

static int cons_model_init(struct ferry_table *t)
{
	struct cons_table *ct;
	int rc;

	if (t->params.consistency == FERRY_CONS_SEQUENTIAL)
		return 0;
	ct = calloc(1, sizeof(*ct));
	if (!ct)
		return -ENOMEM;
	rc = ferry__cons_map_init(&ct->m,
				  t->params.cons_bytes ? t->params.cons_bytes : CONS_BYTES_DEFAULT);
	if (rc) {
		free(ct);
		return rc;
	}
	ct->t = t;
	ct->cn = t->fy->cons;
	ct->model = t->params.consistency;
	ct->s = t->params.staleness;
	pthread_mutex_init(&ct->lock, NULL);
	pthread_mutex_init(&ct->flush_mu, NULL);
	ferry__cond_init_monotonic(&ct->cond);
	rc = ferry__cons_rx_init(ct);
	if (!rc) {
		rc = ferry__essp_table_init(ct);
		if (rc)
			ferry__cons_rx_fini(ct);
	}
	if (rc) {
		ferry__cons_map_fini(&ct->m);
		pthread_mutex_destroy(&ct->lock);
		pthread_mutex_destroy(&ct->flush_mu);
		pthread_cond_destroy(&ct->cond);
		free(ct);
		return rc;
	}
	t->cons = ct;
	t->cons_hooks = &cons_hooks;
	return 0;
}

int ferry__cons_table_init(struct ferry_table *t)
{
	int rc = cons_model_init(t);

	/* hot keys wrap the model's hooks: after them */
	return rc ? rc : ferry__hot_table_init(t);
}

void ferry__cons_table_publish(struct ferry_table *t)
{
	struct cons_table *ct = t->cons;

	if (t->hot && !ferry__hot_table_publish(t)) {
		struct ferry_cons_node *cn = t->fy->cons;

		pthread_mutex_lock(&cn->lock);
		cn->hot[t->id] = t;
		pthread_mutex_unlock(&cn->lock);
	}
	if (!ct)
		return;
	pthread_mutex_lock(&ct->cn->flush_lock);
	pthread_mutex_lock(&ct->cn->lock);
	ct->cn->tabs[t->id] = t;
	ct->published = true;
	if (ct->own)
		atomic_fetch_add(&ct->cn->nessp, 1);
	pthread_mutex_unlock(&ct->cn->lock);
	pthread_mutex_unlock(&ct->cn->flush_lock);
}

void ferry__cons_table_fini(struct ferry_table *t)
{
	struct cons_table *ct;

	if (t->hot) {
		struct ferry_cons_node *cn = t->fy->cons;

		/* flush_lock: a barrier's flush of the table is not under way */
		pthread_mutex_lock(&cn->flush_lock);
		pthread_mutex_lock(&cn->lock);
		if (cn->hot[t->id] == t)
			cn->hot[t->id] = NULL;
		pthread_mutex_unlock(&cn->lock);
		pthread_mutex_unlock(&cn->flush_lock);
		ferry__hot_table_fini(t);
	}
	ct = t->cons;
	if (!ct)
		return;
	if (ct->published) {
		pthread_mutex_lock(&ct->cn->flush_lock);
		pthread_mutex_lock(&ct->cn->lock);
		if (ct->cn->tabs[t->id] == t)
			ct->cn->tabs[t->id] = NULL;
		if (ct->own)
			atomic_fetch_sub(&ct->cn->nessp, 1);
		pthread_mutex_unlock(&ct->cn->lock);
		pthread_mutex_unlock(&ct->cn->flush_lock);
		/* an owner's push of this table (the progress thread) is over */
		pthread_mutex_lock(&ct->cn->essp_mu);
		pthread_mutex_unlock(&ct->cn->essp_mu);
	}
	/* the table is served on until it is released (lib/table/), and the
	 * progress thread's handlers read t->cons under RCU: none may hold ct
	 * when it is freed. They find NULL after this, and drop the frame */
	__atomic_store_n(&t->cons, NULL, __ATOMIC_RELEASE);
	urcu_memb_synchronize_rcu();
	if (ct->m.npend)
		ferry_warn("cons: table %u destroyed with %llu keys' pushes of this node never "
			   "sent; call ferry_flush() or ferry_barrier() before "
			   "ferry_table_destroy()",
			   t->id, (unsigned long long)ct->m.npend);
	if (ct->out)
		ferry_warn("cons: table %u destroyed with %zu keys' pushes of this node never "
			   "answered by their owners (a failed flush; they may or may not be "
			   "applied)",
			   t->id, ct->out->left);
	ferry__cons_batch_free(ct->out);
	ferry__essp_table_fini(ct);
	ferry__cons_rx_fini(ct);
	ferry__cons_map_fini(&ct->m);
	pthread_mutex_destroy(&ct->lock);
	pthread_mutex_destroy(&ct->flush_mu);
	pthread_cond_destroy(&ct->cond);
	free(ct);
	t->cons_hooks = NULL;
}

/* SPDX-License-Identifier: MIT */
/*
 * push.c - a table's buffered deltas leave in numbered batches, and each
 * delta is applied at most once and never dropped (docs/consistency.md,
 * "Flushes: nothing lost, nothing twice").
 *
 *   node (flush, a worker's thread)            owner (progress thread)
 *   batch seq: keys, deltas, idx 0 .. n-1
 *   CONS_PUSH{seq, (key, idx, attempt)...} -->  first time (seq, idx,
 *                                               attempt) from this node?
 *                                               live here: apply; else not
 *                                               here; record the answer
 *                                               a copy: the recorded answer
 *                                 <-- CONS_ACK{seq, (idx, attempt, status,
 *                                              hint)...}
 *   applied: done; not here: route to hint with attempt + 1 (the rank that
 *   said so will never apply this attempt); an error: not applied
 *
 * A key goes to one rank at a time and is routed anew only on that rank's
 * answer, so at most one rank can apply it. When the node's timeout ends a
 * flush with keys unanswered (an owner slow, or failed), their deltas stay
 * with the batch (cons_table.out): the table's next flush sends them again,
 * same number, same rank, same attempt, and the rank answers from its
 * record before any newer batch of this node starts. Keys answered "not
 * applied" go back to the node's unsent deltas.
 *
 * FERRY_CONS_FAULT_EVERY=N (tests): of the CONS_PUSH frames a node
 * receives, the Nth, 2Nth, ... is dropped unapplied and unanswered, and the
 * (N/2)th, (N/2 + N)th, ... is applied but its answer dropped; of those it
 * sends, the Nth, 2Nth, ... fails as if the link broke.
 *
 * Receiver bound: per table and sender rank, the answers to its latest
 * batch, 4 bytes per key of that batch (a batch is at most about half the
 * table's cons_bytes of deltas); replaced when the sender's next batch
 * arrives, freed with the table.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/cons/cons.h"
#include "lib/ops/ops.h"

#define PUSH_FRAME_BYTES (4u << 20) /* a frame is sent when it grows past this */
#define PUSH_CN(fy) ((struct ferry_cons_node *)(fy)->cons)

/* recorded answers (low 2 bits of ferry_cons_rx.rec) */
enum {
	REC_NONE,
	REC_APPLIED,
	REC_NOT_HERE,
	REC_ERROR
};

struct ferry_cons_batch *ferry__cons_batch_new(struct ferry_table *t, uint64_t seq, uint64_t *keys,
					       float *deltas, size_t n)
{
	struct ferry_cons_batch *b = calloc(1, sizeof(*b));

	if (!b)
		return NULL;
	b->seq = seq;
	b->n = b->left = n;
	b->keys = keys;
	b->deltas = deltas;
	b->offs = malloc((n + 1) * sizeof(*b->offs));
	b->dst = malloc(n * sizeof(*b->dst) + 1);
	b->attempt = calloc(n + 1, sizeof(*b->attempt));
	b->err = calloc(n + 1, sizeof(*b->err));
	b->st = calloc(n + 1, sizeof(*b->st));
	b->again = calloc(n + 1, sizeof(*b->again));
	if (!b->offs || !b->dst || !b->attempt || !b->err || !b->st || !b->again) {
		b->keys = NULL; /* the caller still owns them */
		b->deltas = NULL;
		ferry__cons_batch_free(b);
		return NULL;
	}
	b->offs[0] = 0;
	for (size_t i = 0; i < n; i++) {
		b->offs[i + 1] = b->offs[i] + ferry__value_len(t, keys[i]);
		b->dst[i] = ferry__loc_get(t, keys[i]);
	}
	return b;
}

void ferry__cons_batch_free(struct ferry_cons_batch *b)
{
	if (!b)
		return;
	free(b->keys);
	free(b->deltas);
	free(b->offs);
	free(b->dst);
	free(b->attempt);
	free(b->err);
	free(b->st);
	free(b->again);
	free(b);
}

/* ---- sending ---------------------------------------------------------- */

/* FERRY_CONS_FAULT_EVERY: is this frame (counted by @ctr) the one to
 * fail, at phase @phase (0 or N / 2) of every N? */
static bool push_fault(struct ferry *fy, _Atomic uint64_t *ctr, int phase)
{
	uint32_t every = PUSH_CN(fy)->fault_every;
	uint64_t k;

	if (!every)
		return false;
	k = atomic_load(ctr);
	if (!phase)
		k = atomic_fetch_add(ctr, 1) + 1;
	return phase ? every > 1 && k % every == every / 2 : k % every == 0;
}

struct push_out {
	struct ferry_frame f, vals;
	uint32_t count;
};

static int push_out_send(struct ferry *fy, struct ferry_table *t, struct push_out *o, uint32_t dst,
			 uint64_t seq, uint32_t total)
{
	struct ferry_msg_cons_push *m;
	int rc;

	if (!o->count)
		return 0;
	if (o->vals.len == SIZE_MAX) {
		ferry__frame_free(&o->f);
		ferry__frame_free(&o->vals);
		o->count = 0;
		return -ENOMEM;
	}
	m = (struct ferry_msg_cons_push *)(o->f.buf ? o->f.buf + sizeof(struct ferry_msg_hdr) :
						      NULL);
	if (m) {
		m->seq = seq;
		m->total = total;
		m->count = o->count;
	}
	if (o->vals.len && o->vals.buf) {
		void *v = ferry__frame_put(&o->f, o->vals.len);

		if (v)
			memcpy(v, o->vals.buf, o->vals.len);
	}
	rc = ferry__frame_finish(&o->f, FERRY_MSG_CONS_PUSH, fy->rank, t->id);
	if (!rc && push_fault(fy, &PUSH_CN(fy)->fault_tx, 0)) {
		ferry_warn("cons: fault injection (FERRY_CONS_FAULT_EVERY): a send of %u keys "
			   "to rank %u fails",
			   o->count, dst);
		rc = -ECONNRESET;
	}
	if (!rc)
		rc = ferry__send(fy, dst, o->f.buf, o->f.len);
	ferry__frame_free(&o->f);
	ferry__frame_free(&o->vals);
	o->count = 0;
	return rc;
}

/* mark keys [@from, @to) of @b's list @idx, sent to @dst, failed with @rc
 * (their frame never left: not applied, unless an earlier copy of the same
 * route was: then they stay unanswered) */
static void push_fail_sent(struct cons_table *ct, struct ferry_cons_batch *b, const uint32_t *idx,
			   size_t from, size_t to, int rc)
{
	pthread_mutex_lock(&ct->lock);
	for (size_t j = from; j < to; j++)
		if (b->st[idx[j]] == FERRY_CONS_B_SENT && !b->again[idx[j]]) {
			b->st[idx[j]] = FERRY_CONS_B_FAIL;
			b->err[idx[j]] = rc;
			b->left--;
		}
	pthread_mutex_unlock(&ct->lock);
}

/* send the keys @idx[0 .. n) of @b, all to @dst (their state is SENT) */
static void push_send_to(struct cons_table *ct, struct ferry_cons_batch *b, uint32_t dst,
			 const uint32_t *idx, size_t n)
{
	struct ferry *fy = ct->t->fy;
	struct push_out o = { .count = 0 };
	size_t first = 0;
	int rc = 0;

	for (size_t j = 0; j < n; j++) {
		uint32_t i = idx[j];
		uint32_t len = (uint32_t)(b->offs[i + 1] - b->offs[i]);
		struct ferry_msg_cons_key *k;
		float *v;

		if (!o.count) {
			ferry__frame_begin(&o.f);
			(void)ferry__frame_put(&o.f, sizeof(struct ferry_msg_cons_push));
			o.vals.buf = NULL;
			o.vals.len = o.vals.cap = 0;
			first = j;
		}
		k = ferry__frame_put(&o.f, sizeof(*k));
		v = len ? ferry__frame_put(&o.vals, (size_t)len * sizeof(float)) : NULL;
		if (k) {
			k->key = b->keys[i];
			k->idx = i;
			k->len = len;
			k->attempt = b->attempt[i];
		}
		if (v)
			memcpy(v, b->deltas + b->offs[i], (size_t)len * sizeof(float));
		o.count++;
		if (o.f.len + o.vals.len >= PUSH_FRAME_BYTES || j + 1 == n) {
			rc = push_out_send(fy, ct->t, &o, dst, b->seq, (uint32_t)b->n);
			if (rc) {
				ferry_err(
					"cons: table %u: sending batch %llu of buffered pushes to "
					"rank %u failed (%s); its %zu keys' deltas stay buffered "
					"here",
					ct->t->id, (unsigned long long)b->seq, dst,
					ferry_strerror(rc), j + 1 - first);
				push_fail_sent(ct, b, idx, first, j + 1, rc);
			}
		}
	}
}

/* send every NEW key of @b, grouped by destination; the worker's thread */
static int push_send_new(struct cons_table *ct, struct ferry_cons_batch *b)
{
	struct ferry *fy = ct->t->fy;
	uint32_t *idx, *cnt;
	size_t nnew = 0;

	idx = malloc(b->n * sizeof(*idx) + 1);
	cnt = calloc(fy->world + 1, sizeof(*cnt));
	if (!idx || !cnt) {
		free(idx);
		free(cnt);
		return -ENOMEM;
	}
	/* count per destination, then place: one list grouped by rank */
	pthread_mutex_lock(&ct->lock);
	for (size_t i = 0; i < b->n; i++)
		if (b->st[i] == FERRY_CONS_B_NEW) {
			if (b->dst[i] >= fy->world)
				b->dst[i] = ferry__home(ct->t, b->keys[i]);
			cnt[b->dst[i] + 1]++;
			nnew++;
		}
	for (uint32_t r = 0; r < fy->world; r++)
		cnt[r + 1] += cnt[r];
	for (size_t i = 0; i < b->n; i++)
		if (b->st[i] == FERRY_CONS_B_NEW) {
			idx[cnt[b->dst[i]]++] = (uint32_t)i;
			b->st[i] = FERRY_CONS_B_SENT;
		}
	pthread_mutex_unlock(&ct->lock);
	/* cnt[r] is now the end of rank r's run */
	for (uint32_t r = 0, from = 0; r < fy->world && nnew; r++) {
		if (cnt[r] > from)
			push_send_to(ct, b, r, idx + from, cnt[r] - from);
		from = cnt[r];
	}
	free(idx);
	free(cnt);
	return 0;
}

/* lock held: some key of @b is NEW (to send), and is not all SENT to
 * failed ranks */
static bool push_any_new(const struct ferry_cons_batch *b)
{
	for (size_t i = 0; i < b->n; i++)
		if (b->st[i] == FERRY_CONS_B_NEW)
			return true;
	return false;
}

/* lock held: every unanswered key was sent to a failed rank */
static bool push_all_at_failed(struct ferry *fy, const struct ferry_cons_batch *b)
{
	for (size_t i = 0; i < b->n; i++)
		if (b->st[i] == FERRY_CONS_B_SENT &&
		    !atomic_load_explicit(&fy->failed[b->dst[i]], memory_order_relaxed))
			return false;
	return true;
}

int ferry__cons_batch_run(struct cons_table *ct, struct ferry_cons_batch *b)
{
	struct ferry *fy = ct->t->fy;
	struct timespec ts;
	size_t nunknown = 0, nheld = 0, napplied = 0;
	uint32_t dead = fy->world;
	int rc = 0, why = 0;

	ferry__deadline_ms(fy->timeout_ms, &ts);
	pthread_mutex_lock(&ct->lock);
	ct->run = b;
	if (b->seq > ct->bseq)
		ct->bseq = b->seq;
	/* unanswered keys of an earlier run go again, as they were: they may
	 * have been applied, so a failure to send them again settles nothing */
	for (size_t i = 0; i < b->n; i++)
		if (b->st[i] == FERRY_CONS_B_SENT) {
			b->st[i] = FERRY_CONS_B_NEW;
			b->again[i] = 1;
		}
	for (unsigned round = 0;; round++) {
		if (!b->left)
			break;
		if (push_any_new(b)) {
			struct timespec now;

			clock_gettime(CLOCK_MONOTONIC, &now);
			if (now.tv_sec > ts.tv_sec ||
			    (now.tv_sec == ts.tv_sec && now.tv_nsec >= ts.tv_nsec)) {
				rc = -ETIMEDOUT; /* keys kept moving away */
				break;
			}
			pthread_mutex_unlock(&ct->lock);
			if (round > 4) {
				/* a key on its way between ranks: let it land */
				struct timespec nap = { 0, 100000 };

				nanosleep(&nap, NULL);
			}
			rc = push_send_new(ct, b);
			pthread_mutex_lock(&ct->lock);
			if (rc)
				break;
			continue;
		}
		if (atomic_load(&fy->closed)) {
			rc = -FERRY_E_CLOSED;
			break;
		}
		if (push_all_at_failed(fy, b)) {
			rc = -FERRY_E_PEER;
			break;
		}
		/* slices of 10 ms: a failed rank does not signal this condition */
		{
			struct timespec slice;

			ferry__deadline_ms(10, &slice);
			if (slice.tv_sec > ts.tv_sec ||
			    (slice.tv_sec == ts.tv_sec && slice.tv_nsec > ts.tv_nsec))
				slice = ts;
			if (ferry__cond_wait_until(&ct->cond, &ct->lock, &slice) == ETIMEDOUT &&
			    slice.tv_sec == ts.tv_sec && slice.tv_nsec == ts.tv_nsec && b->left &&
			    !push_any_new(b)) {
				rc = -ETIMEDOUT;
				break;
			}
		}
	}
	ct->run = NULL;
	/* what became of each key; the entries are marked for flush_done */
	for (size_t i = 0; i < b->n; i++) {
		struct ferry_cons_ent *e = ferry__cons_map_find(&ct->m, b->keys[i]);
		uint8_t out;

		if (b->st[i] == FERRY_CONS_B_NEW && b->again[i])
			b->st[i] = FERRY_CONS_B_SENT; /* not sent again: still unanswered */
		switch (b->st[i]) {
		case FERRY_CONS_B_DONE:
			out = FERRY_CONS_OUT_APPLIED;
			napplied++;
			break;
		case FERRY_CONS_B_SENT:
			out = FERRY_CONS_OUT_UNKNOWN;
			nunknown++;
			if (atomic_load_explicit(&fy->failed[b->dst[i]], memory_order_relaxed))
				dead = b->dst[i];
			break;
		case FERRY_CONS_B_FAIL:
			if (!why)
				why = b->err[i];
			/* fall through */
		default: /* NEW: never sent */
			out = FERRY_CONS_OUT_HELD;
			nheld++;
			break;
		}
		if (e && e->infl) {
			e->out = out;
			if (out == FERRY_CONS_OUT_APPLIED)
				e->sent_seq = b->seq; /* ESSP: a pushed value must hold it */
		}
	}
	pthread_mutex_unlock(&ct->lock);
	if (!rc && why)
		rc = why;
	if (nunknown || nheld)
		ferry_err("cons: table %u: batch %llu of this node's buffered pushes: %zu keys "
			  "applied, %zu not applied (%s; their deltas stay buffered), %zu not "
			  "answered%s%s (their deltas are kept and sent again, under the same "
			  "number, by the next flush: never applied twice)",
			  ct->t->id, (unsigned long long)b->seq, napplied, nheld,
			  ferry_strerror(why ? why : rc), nunknown,
			  dead < fy->world ? ", some by failed rank " : "",
			  dead < fy->world ? "(its keys are unreachable until it is back)" : "");
	if (!rc && (nunknown || nheld))
		rc = -EIO;
	(void)dead;
	return rc;
}

/* ---- receiving (progress thread) --------------------------------------- */

int ferry__cons_rx_init(struct cons_table *ct)
{
	ct->rx = calloc(ct->t->fy->world, sizeof(*ct->rx));
	if (!ct->rx)
		return -ENOMEM;
	pthread_mutex_init(&ct->rx_lock, NULL);
	return 0;
}

void ferry__cons_rx_fini(struct cons_table *ct)
{
	if (!ct->rx)
		return;
	for (uint32_t r = 0; r < ct->t->fy->world; r++)
		free(ct->rx[r].rec);
	free(ct->rx);
	ct->rx = NULL;
	pthread_mutex_destroy(&ct->rx_lock);
}

/* the rank a key not live here should be tried at next */
static uint32_t push_hint(struct ferry_table *t, uint64_t key)
{
	uint32_t home = ferry__home(t, key);

	return home == t->fy->rank ? ferry__owner(t, key) : home;
}

/* apply one delta here; 0, -EAGAIN (not live here) or an error */
static int push_apply(struct ferry_table *t, uint64_t key, const float *delta)
{
	int rc = ferry__ops_apply(t, FERRY_OP_PUSH, key, delta, NULL);

	if (rc == -EAGAIN && t->params.sparse) {
		struct ferry_slot *s;

		/* a sparse key's first use, here at its home */
		if (!ferry__ops_materialize(t, key, &s))
			rc = ferry__ops_apply(t, FERRY_OP_PUSH, key, delta, NULL);
	}
	return rc;
}

static void push_on_msg(struct ferry *fy, struct ferry_table *t, uint32_t src,
			const struct ferry_proto_view *v)
{
	const struct ferry_msg_cons_push *m = v->body;
	const struct ferry_msg_cons_key *ks = v->data;
	struct cons_table *ct = __atomic_load_n((struct cons_table **)&t->cons, __ATOMIC_ACQUIRE);
	struct ferry_cons_rx *rx;
	struct ferry_frame f;
	struct ferry_msg_cons_ack *a;
	uint32_t nans = 0;
	size_t off = 0;
	int rc;

	if (!ct && t->params.consistency != FERRY_CONS_SEQUENTIAL)
		return; /* destroyed here (ferry__cons_table_fini): the sender flushes
			 * no more once it destroyed it too */
	if (!ct || !ct->rx) {
		ferry_err("cons: rank %u sent buffered pushes for table %u, which has no "
			  "consistency model here; dropped (do all nodes create the table alike?)",
			  src, t->id);
		return;
	}
	if (push_fault(fy, &PUSH_CN(fy)->fault_rx, 0)) {
		ferry_warn("cons: fault injection (FERRY_CONS_FAULT_EVERY): batch %llu of rank "
			   "%u (%u keys) is dropped unapplied, unanswered",
			   (unsigned long long)m->seq, src, v->count);
		return;
	}
	ferry__frame_begin(&f);
	a = ferry__frame_put(&f, sizeof(*a));
	pthread_mutex_lock(&ct->rx_lock);
	rx = &ct->rx[src];
	if (m->seq < rx->seq) {
		/* a batch the sender resolved already: nobody waits for it */
		pthread_mutex_unlock(&ct->rx_lock);
		ferry__frame_free(&f);
		return;
	}
	if (m->seq > rx->seq) {
		uint32_t *rec = calloc(m->total, sizeof(*rec));

		if (!rec) {
			/* answer every key "not applied": the sender keeps them */
			pthread_mutex_unlock(&ct->rx_lock);
			ferry_err("cons: table %u: out of memory for the record of rank %u's "
				  "batch of %u keys; not applied, it keeps them",
				  t->id, src, m->total);
			rc = -ENOMEM;
			goto answer_all;
		}
		free(rx->rec);
		rx->rec = rec;
		rx->seq = m->seq;
		rx->total = m->total;
	} else if (m->total != rx->total) {
		pthread_mutex_unlock(&ct->rx_lock);
		ferry_err("cons: rank %u sent batch %llu of table %u with %u keys, after %u; "
			  "dropped (a peer with another library version?)",
			  src, (unsigned long long)m->seq, t->id, m->total, rx->total);
		ferry__frame_free(&f);
		return;
	}
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_cons_key *k = &ks[i];
		uint32_t rec = rx->rec[k->idx], att = rec >> 2, what = rec & 3;
		struct ferry_msg_cons_st *st;

		off += k->len;
		if (what != REC_NONE && att > (k->attempt & 0x3fffffffu))
			continue; /* an older route of this key: answered already */
		if (what == REC_NONE || att < (k->attempt & 0x3fffffffu)) {
			int arc = push_apply(t, k->key, v->vals + off - k->len);

			what = !arc ? REC_APPLIED : arc == -EAGAIN ? REC_NOT_HERE : REC_ERROR;
			if (!arc)
				ferry__essp_applied(ct, k->key, src, m->seq);
			rx->rec[k->idx] = (k->attempt & 0x3fffffffu) << 2 | what;
		} else if (what == REC_APPLIED) {
			atomic_fetch_add_explicit(&PUSH_CN(fy)->replayed, 1, memory_order_relaxed);
		}
		st = ferry__frame_put(&f, sizeof(*st));
		if (!st)
			break; /* the frame fails below: the sender asks again */
		st->idx = k->idx;
		st->attempt = k->attempt;
		st->status = what == REC_APPLIED ? 0 : what == REC_NOT_HERE ? -EAGAIN : -EIO;
		st->hint = what == REC_NOT_HERE ? push_hint(t, k->key) : fy->world;
		nans++;
	}
	pthread_mutex_unlock(&ct->rx_lock);
	goto send;
answer_all:
	for (uint32_t i = 0; i < v->count; i++) {
		struct ferry_msg_cons_st *st = ferry__frame_put(&f, sizeof(*st));

		if (!st)
			break;
		st->idx = ks[i].idx;
		st->attempt = ks[i].attempt;
		st->status = rc;
		st->hint = fy->world;
		nans++;
	}
send:
	if (nans && push_fault(fy, &PUSH_CN(fy)->fault_rx, 1)) {
		ferry_warn("cons: fault injection (FERRY_CONS_FAULT_EVERY): the answer to batch "
			   "%llu of rank %u (%u keys) is dropped",
			   (unsigned long long)m->seq, src, nans);
		nans = 0;
	}
	if (!nans) {
		ferry__frame_free(&f);
		return;
	}
	a = (struct ferry_msg_cons_ack *)(f.buf ? f.buf + sizeof(struct ferry_msg_hdr) : NULL);
	if (a) {
		a->seq = m->seq;
		a->count = nans;
	}
	rc = ferry__frame_finish(&f, FERRY_MSG_CONS_ACK, fy->rank, t->id);
	if (!rc)
		rc = ferry__send(fy, src, f.buf, f.len);
	if (rc && rc != -FERRY_E_PEER && rc != -FERRY_E_CLOSED)
		ferry_err("cons: table %u: cannot answer rank %u's batch %llu (%s); it sends "
			  "the keys again and gets the same answers",
			  t->id, src, (unsigned long long)m->seq, ferry_strerror(rc));
	ferry__frame_free(&f);
}

static void push_on_ack(struct ferry *fy, struct ferry_table *t, uint32_t src,
			const struct ferry_proto_view *v)
{
	const struct ferry_msg_cons_ack *m = v->body;
	const struct ferry_msg_cons_st *sts = v->data;
	struct cons_table *ct = __atomic_load_n((struct cons_table **)&t->cons, __ATOMIC_ACQUIRE);
	struct ferry_cons_batch *b;

	if (!ct)
		return; /* the table went back to SEQUENTIAL? not possible: ignore */
	pthread_mutex_lock(&ct->lock);
	b = ct->run;
	if (!b || b->seq != m->seq) {
		/* a late answer: the run ended; the key is asked again */
		pthread_mutex_unlock(&ct->lock);
		return;
	}
	for (uint32_t i = 0; i < v->count; i++) {
		const struct ferry_msg_cons_st *st = &sts[i];
		uint32_t idx = st->idx;

		if (idx >= b->n) {
			pthread_mutex_unlock(&ct->lock);
			ferry_err("cons: rank %u answered key %u of batch %llu of table %u, which "
				  "has %zu keys; dropped as broken",
				  src, idx, (unsigned long long)m->seq, t->id, b->n);
			ferry__node_peer_failed(fy, src);
			return;
		}
		/* only the rank the key was sent to, for its latest route */
		if (b->st[idx] != FERRY_CONS_B_SENT || b->dst[idx] != src ||
		    b->attempt[idx] != st->attempt)
			continue;
		if (!st->status) {
			b->st[idx] = FERRY_CONS_B_DONE;
			b->left--;
		} else if (st->status == -EAGAIN) {
			b->st[idx] = FERRY_CONS_B_NEW;
			b->again[idx] = 0; /* a new route: never sent */
			b->attempt[idx]++;
			b->dst[idx] = st->hint < fy->world ? st->hint : fy->world;
			b->reroutes++;
		} else {
			b->st[idx] = FERRY_CONS_B_FAIL;
			b->err[idx] = st->status;
			b->left--;
		}
	}
	pthread_cond_broadcast(&ct->cond);
	pthread_mutex_unlock(&ct->lock);
}

int ferry__cons_push_attach(struct ferry *fy)
{
	const char *every = getenv("FERRY_CONS_FAULT_EVERY");
	int rc;

	if (every && *every) {
		char *end;
		unsigned long n = strtoul(every, &end, 10);

		if (*end || n > 1000000) {
			ferry_err("FERRY_CONS_FAULT_EVERY=%s: not a count of frames (0 .. 1000000)",
				  every);
			return -EINVAL;
		}
		PUSH_CN(fy)->fault_every = (uint32_t)n;
		if (n)
			ferry_warn("cons: FERRY_CONS_FAULT_EVERY=%lu: every %luth push batch frame "
				   "fails (a test setting)",
				   n, n);
	}
	rc = ferry__dispatch_register(fy, FERRY_MSG_CONS_PUSH, FERRY_DISPATCH_TABLE, push_on_msg);

	return rc ? rc :
		    ferry__dispatch_register(fy, FERRY_MSG_CONS_ACK, FERRY_DISPATCH_TABLE,
					     push_on_ack);
}

/* SPDX-License-Identifier: MIT */
/*
 * hot.c - hot keys (NuPS): a table's chosen keys have a replica on every
 * node (docs/consistency.md, "Hot keys").
 *
 *   pull  -> this node's replica                          (no message)
 *   push  -> replica += delta; pend += delta              (no message)
 *   sync thread, every hot_sync_ms (or at once for ferry_flush):
 *         pend (one sum per key) -> frames seq a .. b, sent to every other
 *         node; pend starts again from 0
 *   receiver (progress thread): frame seq of sender r is applied to the
 *         replicas only when it is r's next (seq == last + 1), else not
 *         applied (a copy: answered again; a gap: an earlier frame was
 *         lost, nothing answered); HOT_ACK{last applied}
 *   sender: the batch is done once every live node acknowledged b; frames
 *         not acknowledged go again, the same bytes under the same numbers,
 *         every max(hot_sync_ms, 50 ms)
 *
 * So every delta is applied once at every replica: a frame is applied only
 * in order, once, and kept by the sender until acknowledged. A replica is
 * the initial value plus this node's pushes plus every frame applied here.
 *
 * Bound, per table and node: replicas, pend and the batch in flight: 3 x the
 * hot keys' values (hot_count <= FERRY_HOT_MAX), plus 17 bytes per hot key
 * (sorted keys, offsets, dirty flag; 8 more in a frame in flight) and 16
 * bytes per rank; one sync thread.
 *
 * FERRY_CONS_FAULT_EVERY=N (tests, as push.c): of the HOT_PUSH frames a node
 * receives, every Nth is dropped unapplied, and the answer to every (N/2)th
 * is dropped; of those it sends, every Nth is not sent.
 *
 * Locks: hot.lock guards everything but the frames of the batch in flight,
 * which only the sync thread touches (and sends without the lock).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/cons/cons.h"
#include "lib/cons/hot.h"
#include "lib/cons/topk.h"
#include "lib/dir/placement.h"
#include "lib/ops/ops.h"
#include "lib/store/init.h"

#define HOT_SYNC_MS_DEFAULT 10
#define HOT_SYNC_MS_MAX 60000
#define HOT_RESEND_MS 50	   /* least time before a frame goes again */
#define HOT_FRAME_BYTES (4u << 20) /* a frame's entries and values, at most */

/* ---- parameters ---------------------------------------------------------- */

static int hot_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int ferry__hot_check(const struct ferry_table_params *p)
{
	uint64_t *s;

	if (p->hot_auto) {
		const char *bad =
			p->hot_count ?
				"with hot_keys; give one of them" :
			p->hot_auto > FERRY_HOT_MAX ?
				"is above FERRY_HOT_MAX" :
			p->consistency != FERRY_CONS_SEQUENTIAL &&
					p->consistency != FERRY_CONS_EVENTUAL ?
				"needs SEQUENTIAL or EVENTUAL consistency (not yet SSP, ESSP)" :
			p->sparse			 ? "needs a dense table (not yet sparse)" :
			p->push_codec			 ? "goes without a push_codec" :
			p->hot_sync_ms > HOT_SYNC_MS_MAX ? "with hot_sync_ms above 60000" :
							   NULL;

		if (bad) {
			ferry_err("table: hot_auto %u %s (docs/consistency.md, \"Hot keys\")",
				  p->hot_auto, bad);
			return -EINVAL;
		}
		return 0;
	}
	if (!p->hot_count) {
		if (p->hot_sync_ms) {
			ferry_err("table: hot_sync_ms %u without hot keys; set hot_count and "
				  "hot_keys, or hot_sync_ms to 0",
				  p->hot_sync_ms);
			return -EINVAL;
		}
		return 0;
	}
	if (p->hot_count > FERRY_HOT_MAX || !p->hot_keys) {
		ferry_err("table: hot_count %u %s; give at most %u keys in hot_keys", p->hot_count,
			  p->hot_keys ? "is above the limit" : "with a NULL hot_keys",
			  FERRY_HOT_MAX);
		return -EINVAL;
	}
	if (p->sparse || p->push_codec) {
		ferry_err("table: hot keys go with dense tables without a push_codec (not yet "
			  "with %s); drop hot_keys or that option",
			  p->sparse ? "sparse" : "push_codec");
		return -EINVAL;
	}
	if (p->hot_sync_ms > HOT_SYNC_MS_MAX) {
		ferry_err("table: hot_sync_ms %u is above the limit of %u ms", p->hot_sync_ms,
			  HOT_SYNC_MS_MAX);
		return -EINVAL;
	}
	s = malloc(p->hot_count * sizeof(*s));
	if (!s) {
		ferry_err("table: out of memory to check %u hot keys", p->hot_count);
		return -ENOMEM;
	}
	memcpy(s, p->hot_keys, p->hot_count * sizeof(*s));
	qsort(s, p->hot_count, sizeof(*s), hot_cmp);
	for (uint32_t i = 0; i < p->hot_count; i++) {
		const char *bad = s[i] >= p->num_keys	? "is out of range" :
				  i && s[i] == s[i - 1] ? "is given twice" :
							  NULL;

		if (bad) {
			ferry_err("table: hot key %llu %s; give distinct keys 0 .. %llu",
				  (unsigned long long)s[i], bad,
				  (unsigned long long)p->num_keys - 1);
			free(s);
			return -EINVAL;
		}
	}
	free(s);
	return 0;
}

uint64_t ferry__hot_hash(const struct ferry_table_params *p)
{
	uint64_t h = p->hot_count + ferry__hash64(p->hot_auto ^ 0x5bd1e995ull);

	/* a sum: the order the keys are given in need not agree */
	for (uint32_t i = 0; p->hot_keys && i < p->hot_count; i++)
		h += ferry__hash64(p->hot_keys[i] ^ 0x9e3779b97f4a7c15ull);
	return h;
}

/* ---- faults (tests) -------------------------------------------------------- */

static bool hot_fault(struct ferry_hot *h, _Atomic uint64_t *ctr, int phase)
{
	uint32_t every = ((struct ferry_cons_node *)h->t->fy->cons)->fault_every;
	uint64_t k;

	if (!every)
		return false;
	k = phase ? atomic_load(ctr) : atomic_fetch_add(ctr, 1) + 1;
	return phase ? every > 1 && k % every == every / 2 : k % every == 0;
}

/* ---- the sync thread --------------------------------------------------------- */

/* lock held: every live rank applied the batch in flight */
static bool hot_all_acked(const struct ferry_hot *h)
{
	struct ferry *fy = h->t->fy;

	for (uint32_t r = 0; r < fy->world; r++)
		if (r != fy->rank && h->acked[r] < h->last_seq &&
		    !atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			return false;
	return true;
}

/* lock held: when the batch in flight is applied everywhere, say so */
static void hot_settle(struct ferry_hot *h)
{
	if (h->done < h->taken && hot_all_acked(h)) {
		h->done = h->taken;
		pthread_cond_broadcast(&h->cond);
	}
}

/* lock held: pend becomes the frames of a new batch. Return: 0 or -ENOMEM
 * (then pend is kept for the next try) */
static int hot_take(struct ferry_hot *h)
{
	struct ferry *fy = h->t->fy;
	struct hot_frame *fr = NULL;
	uint32_t nfr = 0, cap = 0;

	for (uint32_t i = 0; i < h->n;) {
		uint32_t cnt = 0, j;
		uint64_t floats = 0;
		struct ferry_msg_hot_push *m;
		struct ferry_msg_hot_ent *es;
		float *v;
		struct hot_frame *x;

		for (j = i; j < h->n; j++) {
			uint64_t len = h->offs[j + 1] - h->offs[j];

			if (!h->dirty[j])
				continue;
			if (cnt && (cnt + 1) * sizeof(*es) + (floats + len) * sizeof(float) >
					   HOT_FRAME_BYTES)
				break;
			cnt++;
			floats += len;
		}
		if (!cnt)
			break;
		if (nfr == cap) {
			uint32_t ncap = cap ? 2 * cap : 4;

			x = realloc(fr, ncap * sizeof(*fr));
			if (!x)
				goto nomem;
			fr = x;
			cap = ncap;
		}
		x = &fr[nfr];
		ferry__frame_begin(&x->f);
		m = ferry__frame_put(&x->f, sizeof(*m));
		es = m ? ferry__frame_put(&x->f, cnt * sizeof(*es)) : NULL;
		v = es ? ferry__frame_put(&x->f, floats * sizeof(float)) : NULL;
		if (!v || ferry__frame_finish(&x->f, FERRY_MSG_HOT_PUSH, fy->rank, h->t->id)) {
			ferry__frame_free(&x->f);
			goto nomem;
		}
		/* the pointers again: the buffer may have moved */
		m = (struct ferry_msg_hot_push *)(x->f.buf + sizeof(struct ferry_msg_hdr));
		es = (struct ferry_msg_hot_ent *)(m + 1);
		v = (float *)(es + cnt);
		m->count = cnt;
		nfr++;
		for (uint32_t k = i, e = 0; k < j; k++) {
			uint32_t len = (uint32_t)(h->offs[k + 1] - h->offs[k]);

			if (!h->dirty[k])
				continue;
			es[e].idx = k;
			es[e++].len = len;
			memcpy(v, h->pend + h->offs[k], len * sizeof(float));
			v += len;
		}
		i = j;
	}
	/* every frame is made: only now does pend change, and the numbers */
	for (uint32_t k = 0; k < nfr; k++) {
		struct ferry_msg_hot_push *m =
			(struct ferry_msg_hot_push *)(fr[k].f.buf + sizeof(struct ferry_msg_hdr));

		fr[k].seq = m->seq = ++h->last_seq;
	}
	for (uint32_t k = 0; k < h->n; k++)
		if (h->dirty[k]) {
			memset(h->pend + h->offs[k], 0,
			       (h->offs[k + 1] - h->offs[k]) * sizeof(float));
			h->dirty[k] = 0;
		}
	h->ndirty = 0;
	h->fr = fr;
	h->nfr = nfr;
	h->taken++;
	h->st.batches++;
	h->st.frames_sent += nfr;
	return 0;
nomem:
	for (uint32_t k = 0; k < nfr; k++)
		ferry__frame_free(&fr[k].f);
	free(fr);
	ferry_err("cons: table %u: out of memory for a batch of hot-key deltas; they stay "
		  "here and go at the next sync",
		  h->t->id);
	return -ENOMEM;
}

/* send the batch's frames each live rank has not acknowledged (@from:
 * their acked numbers, copied under the lock); no lock held */
static void hot_send(struct ferry_hot *h, const uint64_t *from, bool again)
{
	struct ferry *fy = h->t->fy;
	uint64_t resent = 0;

	for (uint32_t r = 0; r < fy->world; r++) {
		if (r == fy->rank || atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			continue;
		for (uint32_t k = 0; k < h->nfr; k++) {
			int rc;

			if (h->fr[k].seq <= from[r])
				continue;
			if (hot_fault(h, &h->fault_tx, 0)) {
				ferry_warn(
					"cons: fault injection (FERRY_CONS_FAULT_EVERY): hot frame "
					"%llu of table %u to rank %u is not sent",
					(unsigned long long)h->fr[k].seq, h->t->id, r);
				continue;
			}
			rc = ferry__send(fy, r, h->fr[k].f.buf, h->fr[k].f.len);
			if (rc && rc != -FERRY_E_PEER && rc != -FERRY_E_CLOSED)
				ferry_err(
					"cons: table %u: sending hot frame %llu to rank %u failed "
					"(%s); it goes again in %u ms",
					h->t->id, (unsigned long long)h->fr[k].seq, r,
					ferry_strerror(rc),
					h->sync_ms > HOT_RESEND_MS ? h->sync_ms : HOT_RESEND_MS);
			if (rc)
				break; /* the later frames wait for this one anyway */
			resent += again;
		}
	}
	if (resent) {
		pthread_mutex_lock(&h->lock);
		h->st.frames_resent += resent;
		pthread_mutex_unlock(&h->lock);
	}
}

static void hot_ts_add_ms(struct timespec *ts, uint32_t ms)
{
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static bool hot_ts_past(const struct timespec *now, const struct timespec *ts)
{
	return now->tv_sec > ts->tv_sec ||
	       (now->tv_sec == ts->tv_sec && now->tv_nsec >= ts->tv_nsec);
}

static void *hot_main(void *arg)
{
	struct ferry_hot *h = arg;
	struct ferry *fy = h->t->fy;
	uint32_t resend_ms = h->sync_ms > HOT_RESEND_MS ? h->sync_ms : HOT_RESEND_MS;
	uint64_t *from = calloc(fy->world, sizeof(*from));
	struct timespec next_take, next_send, now;

	clock_gettime(CLOCK_MONOTONIC, &next_take);
	hot_ts_add_ms(&next_take, h->sync_ms);
	pthread_mutex_lock(&h->lock);
	while (!h->stop && from) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (h->nfr) {
			hot_settle(h);
			if (h->done == h->taken) {
				/* applied everywhere: the frames go */
				for (uint32_t k = 0; k < h->nfr; k++)
					ferry__frame_free(&h->fr[k].f);
				free(h->fr);
				h->fr = NULL;
				h->nfr = 0;
				continue;
			}
			if (hot_ts_past(&now, &next_send)) {
				memcpy(from, h->acked, fy->world * sizeof(*from));
				pthread_mutex_unlock(&h->lock);
				hot_send(h, from, true);
				pthread_mutex_lock(&h->lock);
				clock_gettime(CLOCK_MONOTONIC, &next_send);
				hot_ts_add_ms(&next_send, resend_ms);
				continue;
			}
			/* slices of 10 ms: a failed rank does not signal */
			{
				struct timespec slice = now;

				hot_ts_add_ms(&slice, 10);
				if (hot_ts_past(&slice, &next_send))
					slice = next_send;
				ferry__cond_wait_until(&h->cond, &h->lock, &slice);
			}
			continue;
		}
		if (h->ndirty && (hot_ts_past(&now, &next_take) || h->want > h->taken)) {
			next_take = now;
			hot_ts_add_ms(&next_take, h->sync_ms);
			if (hot_take(h)) {
				/* out of memory: at the next tick */
				ferry__cond_wait_until(&h->cond, &h->lock, &next_take);
				continue;
			}
			memcpy(from, h->acked, fy->world * sizeof(*from));
			pthread_mutex_unlock(&h->lock);
			hot_send(h, from, false);
			pthread_mutex_lock(&h->lock);
			clock_gettime(CLOCK_MONOTONIC, &next_send);
			hot_ts_add_ms(&next_send, resend_ms);
			continue;
		}
		if (!h->ndirty) {
			next_take = now;
			hot_ts_add_ms(&next_take, h->sync_ms);
			ferry__cond_wait_until(&h->cond, &h->lock, &next_take);
			continue;
		}
		ferry__cond_wait_until(&h->cond, &h->lock, &next_take);
	}
	pthread_mutex_unlock(&h->lock);
	if (!from)
		ferry_err("cons: table %u: out of memory for the hot-key sync; this node's hot "
			  "deltas are not sent (recreate the table)",
			  h->t->id);
	free(from);
	return NULL;
}

/* ---- receiving (progress thread) -------------------------------------------- */

static void hot_ack(struct ferry_hot *h, uint32_t dst, uint64_t seq)
{
	struct ferry *fy = h->t->fy;
	struct {
		struct ferry_msg_hdr hdr;
		struct ferry_msg_hot_ack m;
	} a;
	int rc;

	if (hot_fault(h, &h->fault_rx, 1)) {
		ferry_warn("cons: fault injection (FERRY_CONS_FAULT_EVERY): the answer %llu to "
			   "rank %u's hot frames is dropped",
			   (unsigned long long)seq, dst);
		return;
	}
	memset(&a, 0, sizeof(a));
	ferry__proto_hdr_init(&a.hdr, FERRY_MSG_HOT_ACK, sizeof(a), fy->rank, h->t->id);
	a.m.seq = seq;
	rc = ferry__send(fy, dst, &a, sizeof(a));
	if (rc && rc != -FERRY_E_PEER && rc != -FERRY_E_CLOSED)
		ferry_err("cons: table %u: cannot answer rank %u's hot frames (%s); it sends them "
			  "again and gets the answer then",
			  h->t->id, dst, ferry_strerror(rc));
}

static void hot_on_push(struct ferry *fy, struct ferry_table *t, uint32_t src,
			const struct ferry_proto_view *v)
{
	const struct ferry_msg_hot_push *m = v->body;
	const struct ferry_msg_hot_ent *es = v->data;
	struct ferry_hot *h = __atomic_load_n((struct ferry_hot **)&t->hot, __ATOMIC_ACQUIRE);
	uint64_t last;
	const float *d = v->vals;

	if (!h) {
		/* destroyed here (the sender retries until it is too): quiet */
		if (!t->params.hot_count)
			ferry_err("cons: rank %u sent hot-key deltas for table %u, which has no "
				  "hot keys here; dropped (do all nodes create the table alike?)",
				  src, t->id);
		return;
	}
	if (src == fy->rank)
		return; /* never sent to itself */
	if (hot_fault(h, &h->fault_rx, 0)) {
		ferry_warn("cons: fault injection (FERRY_CONS_FAULT_EVERY): hot frame %llu of rank "
			   "%u is dropped unapplied, unanswered",
			   (unsigned long long)m->seq, src);
		return;
	}
	pthread_mutex_lock(&h->lock);
	if (m->seq == h->rx[src] + 1) {
		/* checked only now: a copy of an old frame may name the hot keys
		 * before a ferry_hot_update() (hotauto.c), whose numbers go on */
		for (uint32_t i = 0; i < v->count; i++)
			if (es[i].idx >= h->n ||
			    es[i].len != h->offs[es[i].idx + 1] - h->offs[es[i].idx]) {
				pthread_mutex_unlock(&h->lock);
				ferry_err(
					"cons: rank %u sent hot frame %llu of table %u with entry "
					"%u (index %u, %u floats) that is not one of the %u hot "
					"keys; the sender is dropped (a peer with other hot keys "
					"or version?)",
					src, (unsigned long long)m->seq, t->id, i, es[i].idx,
					es[i].len, h->n);
				ferry__node_peer_failed(fy, src);
				return;
			}
		for (uint32_t i = 0; i < v->count; i++) {
			float *r = h->val + h->offs[es[i].idx];

			for (uint32_t k = 0; k < es[i].len; k++)
				r[k] += d[k];
			d += es[i].len;
		}
		h->rx[src] = m->seq;
		h->st.frames_applied++;
	} else if (m->seq <= h->rx[src]) {
		h->st.frames_again++; /* applied before: answered again */
	} else {
		/* an earlier frame was lost: the sender sends it again first */
		pthread_mutex_unlock(&h->lock);
		return;
	}
	last = h->rx[src];
	pthread_mutex_unlock(&h->lock);
	hot_ack(h, src, last);
}

static void hot_on_ack(struct ferry *fy, struct ferry_table *t, uint32_t src,
		       const struct ferry_proto_view *v)
{
	const struct ferry_msg_hot_ack *m = v->body;
	struct ferry_hot *h = __atomic_load_n((struct ferry_hot **)&t->hot, __ATOMIC_ACQUIRE);

	if (!h || src == fy->rank)
		return;
	pthread_mutex_lock(&h->lock);
	if (m->seq > h->last_seq) {
		pthread_mutex_unlock(&h->lock);
		ferry_err("cons: rank %u acknowledged hot frame %llu of table %u, which was never "
			  "sent (the last is %llu); the sender is dropped",
			  src, (unsigned long long)m->seq, t->id, (unsigned long long)h->last_seq);
		ferry__node_peer_failed(fy, src);
		return;
	}
	if (m->seq > h->acked[src])
		h->acked[src] = m->seq;
	hot_settle(h);
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

int ferry__hot_attach(struct ferry *fy)
{
	int rc =
		ferry__dispatch_register(fy, FERRY_MSG_HOT_PUSH, FERRY_DISPATCH_TABLE, hot_on_push);

	return rc ? rc :
		    ferry__dispatch_register(fy, FERRY_MSG_HOT_ACK, FERRY_DISPATCH_TABLE,
					     hot_on_ack);
}

/* ---- flush, life ------------------------------------------------------------ */

int ferry__hot_flush(struct ferry_table *t)
{
	struct ferry_hot *h = t->hot;
	struct ferry *fy = t->fy;
	struct timespec ts;
	uint64_t want;
	int rc = 0;

	if (!h)
		return 0;
	ferry__deadline_ms(fy->timeout_ms, &ts);
	pthread_mutex_lock(&h->lock);
	want = h->taken + (h->ndirty ? 1 : 0);
	if (want > h->want)
		h->want = want;
	pthread_cond_broadcast(&h->cond);
	while (h->done < want) {
		struct timespec slice, now;

		if (atomic_load(&fy->closed)) {
			rc = -FERRY_E_CLOSED;
			break;
		}
		hot_settle(h);
		if (h->done >= want)
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (hot_ts_past(&now, &ts)) {
			uint32_t slow = fy->world;

			for (uint32_t r = 0; r < fy->world && slow == fy->world; r++)
				if (r != fy->rank && h->acked[r] < h->last_seq &&
				    !atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
					slow = r;
			rc = -ETIMEDOUT;
			ferry_err("flush: table %u: rank %u has not applied this node's hot-key "
				  "deltas within %d ms; they are kept and sent again until it "
				  "does (or fails)",
				  t->id, slow, fy->timeout_ms);
			break;
		}
		slice = now;
		hot_ts_add_ms(&slice, 10); /* a failed rank does not signal */
		if (hot_ts_past(&slice, &ts))
			slice = ts;
		ferry__cond_wait_until(&h->cond, &h->lock, &slice);
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

int ferry__hot_stats(struct ferry_table *t, struct ferry_hot_stats *st)
{
	struct ferry_hot *h = t ? t->hot : NULL;

	if (!h || !st)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	*st = h->st;
	st->keys = h->n;
	st->bytes = 3 * h->offs[h->n] * sizeof(float) + h->n * (sizeof(uint64_t) * 2 + 1) +
		    h->t->fy->world * 2 * sizeof(uint64_t);
	pthread_mutex_unlock(&h->lock);
	return 0;
}

void ferry__hot_free(struct ferry_hot *h)
{
	for (uint32_t k = 0; k < h->nfr; k++)
		ferry__frame_free(&h->fr[k].f);
	free(h->fr);
	free(h->keys);
	free(h->offs);
	free(h->val);
	free(h->pend);
	free(h->dirty);
	free(h->acked);
	free(h->rx);
	if (h->count) {
		ferry__topk_fini(&h->count->s);
		pthread_mutex_destroy(&h->count->lock);
		free(h->count);
	}
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->cond);
	free(h);
}

int ferry__hot_count_init(struct ferry_hot *h, uint32_t hot_auto)
{
	struct ferry_hot_count *c = calloc(1, sizeof(*c));

	if (!c || ferry__topk_init(&c->s, hot_auto < 16 ? 64 : 4 * hot_auto)) {
		free(c);
		return -ENOMEM;
	}
	pthread_mutex_init(&c->lock, NULL);
	c->max = hot_auto;
	h->count = c;
	return 0;
}

struct ferry_hot *ferry__hot_new(struct ferry_table *t, const uint64_t *keys, uint32_t n)
{
	const struct ferry_table_params *p = &t->params;
	struct ferry_hot *h = calloc(1, sizeof(*h));
	uint64_t floats = 0;

	if (!h)
		return NULL;
	h->t = t;
	h->n = n;
	h->sync_ms = p->hot_sync_ms ? p->hot_sync_ms : HOT_SYNC_MS_DEFAULT;
	h->ssp = p->consistency == FERRY_CONS_SSP || p->consistency == FERRY_CONS_ESSP;
	pthread_mutex_init(&h->lock, NULL);
	ferry__cond_init_monotonic(&h->cond);
	/* n + 1: no allocation of 0 bytes (hot_auto starts with no hot key) */
	h->keys = malloc((n + 1) * sizeof(*h->keys));
	h->offs = malloc((n + 1) * sizeof(*h->offs));
	h->dirty = calloc(n + 1, 1);
	h->acked = calloc(t->fy->world, sizeof(*h->acked));
	h->rx = calloc(t->fy->world, sizeof(*h->rx));
	if (!h->keys || !h->offs || !h->dirty || !h->acked || !h->rx)
		goto nomem;
	if (n) {
		memcpy(h->keys, keys, n * sizeof(*h->keys));
		qsort(h->keys, n, sizeof(*h->keys), hot_cmp);
	}
	h->offs[0] = 0;
	for (uint32_t i = 0; i < n; i++)
		h->offs[i + 1] = floats += ferry__value_len(t, h->keys[i]);
	h->val = malloc((floats + 1) * sizeof(float));
	h->pend = calloc(floats + 1, sizeof(float));
	if (!h->val || !h->pend)
		goto nomem;
	/* every replica starts at the key's initial value, as its slot does */
	for (uint32_t i = 0; i < n; i++)
		ferry__init_value(&t->init, h->keys[i], 0, h->val + h->offs[i],
				  (uint32_t)(h->offs[i + 1] - h->offs[i]));
	return h;
nomem:
	ferry__hot_free(h);
	return NULL;
}

int ferry__hot_table_init(struct ferry_table *t)
{
	const struct ferry_table_params *p = &t->params;
	struct ferry_hot *h;

	if (!p->hot_count && !p->hot_auto)
		return 0;
	h = ferry__hot_new(t, p->hot_keys, p->hot_count);
	if (h && p->hot_auto && ferry__hot_count_init(h, p->hot_auto)) {
		ferry__hot_free(h);
		h = NULL;
	}
	if (!h) {
		ferry_err("table: out of memory for %u hot keys' replicas", p->hot_count);
		return -ENOMEM;
	}
	h->inner = t->cons_hooks;
	t->params.hot_keys = NULL; /* the caller's array: copied */
	t->cons_hooks = &ferry__hot_hooks;
	t->hot = h;
	return 0;
}

int ferry__hot_table_publish(struct ferry_table *t)
{
	struct ferry_hot *h = t->hot;
	int rc;

	if (!h || h->running)
		return 0;
	rc = pthread_create(&h->thr, NULL, hot_main, h);
	if (rc) {
		ferry_err("table %u: cannot start the hot-key sync thread (%s); hot deltas stay "
			  "on this node",
			  t->id, strerror(rc));
		return -rc;
	}
	h->running = true;
	return 0;
}

void ferry__hot_stop(struct ferry_table *t)
{
	struct ferry_hot *h = t->hot;

	if (!h || !h->running)
		return;
	pthread_mutex_lock(&h->lock);
	h->stop = true;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	pthread_join(h->thr, NULL);
	h->running = false;
}

void ferry__hot_table_fini(struct ferry_table *t)
{
	struct ferry_hot *h = t->hot;

	if (!h)
		return;
	ferry__hot_stop(t);
	if (h->ndirty || h->done < h->taken)
		ferry_warn("cons: table %u destroyed with hot-key deltas of this node not applied "
			   "everywhere; call ferry_flush() or ferry_barrier() before "
			   "ferry_table_destroy()",
			   t->id);
	t->cons_hooks = h->inner;
	__atomic_store_n((struct ferry_hot **)&t->hot, NULL, __ATOMIC_RELEASE);
	/* the progress thread reads t->hot under RCU: wait for it */
	urcu_memb_synchronize_rcu();
	ferry__hot_free(h);
}

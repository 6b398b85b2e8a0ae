/* SPDX-License-Identifier: MIT */
/*
 * hotops.c - pulls, pushes and sets of a table with hot keys (docs/
 * consistency.md, "Hot keys"): the hot keys of a call are served from this
 * node's replicas (a pull copies, a push adds to the replica and to the
 * unsent deltas hot.c's sync thread sends), the other keys go to the
 * table's model (inner hooks) or the sequential path. Calls nothing of
 * hot.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cons/hot.h"
#include "lib/ops/ops.h"

#define HOT_SMALL 64 /* keys of a call whose bookkeeping fits on the stack */

/* ---- pulls, pushes, sets ------------------------------------------------------ */

/* the call's keys split: hot ones (@hi: their index among the hot keys, or
 * -1), the others gathered into @ok, @ov (their values), and each key's
 * offset in the caller's buffer */
struct hot_split {
	int64_t small_hi[HOT_SMALL];
	uint64_t small_offs[HOT_SMALL + 1], small_ok[HOT_SMALL];
	int64_t *hi;
	uint64_t *offs, *ok; /* ok: the other keys */
	size_t nhot, nother;
	uint64_t other_floats;
};

static void hot_split_free(struct hot_split *s)
{
	if (s->hi != s->small_hi)
		free(s->hi);
	if (s->offs != s->small_offs)
		free(s->offs);
	if (s->ok != s->small_ok)
		free(s->ok);
}

static int hot_split(const struct ferry_hot *h, const uint64_t *keys, size_t n, struct hot_split *s)
{
	s->hi = s->small_hi;
	s->offs = s->small_offs;
	s->ok = s->small_ok;
	if (n > HOT_SMALL) {
		s->hi = malloc(n * sizeof(*s->hi));
		s->offs = malloc((n + 1) * sizeof(*s->offs));
		s->ok = malloc(n * sizeof(*s->ok));
		if (!s->hi || !s->offs || !s->ok) {
			hot_split_free(s);
			ferry_err("cons: table %u: out of memory for a call of %zu keys", h->t->id,
				  n);
			return -ENOMEM;
		}
	}
	s->nhot = s->nother = 0;
	s->other_floats = 0;
	s->offs[0] = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t len = ferry__value_len(h->t, keys[i]);

		s->hi[i] = hot_index(h, keys[i]);
		s->offs[i + 1] = s->offs[i] + len;
		if (s->hi[i] >= 0) {
			s->nhot++;
		} else {
			s->ok[s->nother++] = keys[i];
			s->other_floats += len;
		}
	}
	return 0;
}

/* hot_auto counts one call in this many of each thread (a power of 2): a
 * sample, so that counting costs a local pull little (docs/consistency.md) */
#define HOT_COUNT_EVERY 8

/* hot_auto: count the call's keys (hot ones too, so that they stay) */
static void hot_note(struct ferry_hot *h, const uint64_t *keys, size_t n)
{
	static __thread uint32_t tick;
	struct ferry_hot_count *c = h->count;

	if (!c || (++tick & (HOT_COUNT_EVERY - 1)))
		return;
	pthread_mutex_lock(&c->lock);
	for (size_t i = 0; i < n; i++)
		ferry__topk_add(&c->s, keys[i], 1);
	pthread_mutex_unlock(&c->lock);
}

/* the other keys' operation: through the model's hooks, or the sequential path */
static int hot_inner(struct ferry_hot *h, struct ferry_worker *w, uint8_t op, const uint64_t *keys,
		     size_t n, const float *in, float *out)
{
	if (h->inner)
		return op == FERRY_OP_PULL ? h->inner->pull(w, h->t, keys, n, out) :
		       op == FERRY_OP_PUSH ? h->inner->push(w, h->t, keys, n, in) :
					     h->inner->set(w, h->t, keys, n, in);
	return ferry__ops_sync(w, h->t, op, keys, n, in, out, NULL);
}

/*
 * SSP, ESSP: a reader at clock c needs every update of clocks below c - s.
 * Every node applied its hot deltas of clocks below g at every replica
 * before it announced g (cons.c's clock advance flushes them), so the
 * replica holds every update of clocks below the global clock g: wait until
 * g >= c - s (ferry_clock has mostly waited already), and count the read
 * c - g clocks behind.
 */
static int hot_ssp_read(struct ferry_hot *h, struct ferry_worker *w, size_t nhot)
{
	struct ferry_cons_node *cn = h->t->fy->cons;
	uint32_t s = h->t->params.staleness;
	uint64_t c = ferry__cons_wclock(cn, w), need = c > s ? c - s : 0, g, b;
	int rc = 0;

	if (ferry__cons_global(cn) < need)
		rc = ferry__cons_wait_global(cn, need, c, s);
	if (rc)
		return rc;
	g = ferry__cons_global(cn);
	b = c > g ? c - g : 0;
	if (b >= FERRY_STALENESS_BUCKETS)
		b = FERRY_STALENESS_BUCKETS - 1;
	atomic_fetch_add_explicit(&h->t->fy->staleness[b], nhot, memory_order_relaxed);
	return 0;
}

static int hot_pull(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		    float *vals)
{
	struct ferry_hot *h = t->hot;
	struct hot_split s;
	float *tmp = NULL;
	int rc = ferry__cons_check_call(w, t, keys, n, vals, "pull");

	if (rc || !n)
		return rc;
	hot_note(h, keys, n);
	rc = hot_split(h, keys, n, &s);
	if (rc)
		return rc;
	if (!s.nhot) {
		hot_split_free(&s);
		return hot_inner(h, w, FERRY_OP_PULL, keys, n, NULL, vals);
	}
	if (s.nother) {
		tmp = malloc(s.other_floats * sizeof(float));
		rc = tmp ? hot_inner(h, w, FERRY_OP_PULL, s.ok, s.nother, NULL, tmp) : -ENOMEM;
		if (rc == -ENOMEM && !tmp)
			ferry_err("pull: table %u: out of memory for %zu keys", t->id, s.nother);
		for (size_t i = 0, off = 0; !rc && i < n; i++)
			if (s.hi[i] < 0) {
				uint64_t len = s.offs[i + 1] - s.offs[i];

				memcpy(vals + s.offs[i], tmp + off, len * sizeof(float));
				off += len;
			}
		free(tmp);
	}
	if (!rc && h->ssp)
		rc = hot_ssp_read(h, w, s.nhot);
	if (!rc) {
		pthread_mutex_lock(&h->lock);
		for (size_t i = 0; i < n; i++)
			if (s.hi[i] >= 0)
				memcpy(vals + s.offs[i], h->val + h->offs[s.hi[i]],
				       (s.offs[i + 1] - s.offs[i]) * sizeof(float));
		h->st.reads += s.nhot;
		pthread_mutex_unlock(&h->lock);
	}
	hot_split_free(&s);
	return rc;
}

static int hot_push(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		    const float *deltas)
{
	struct ferry_hot *h = t->hot;
	struct hot_split s;
	float *tmp = NULL;
	int rc = ferry__cons_check_call(w, t, keys, n, deltas, "push");

	if (rc || !n)
		return rc;
	hot_note(h, keys, n);
	rc = hot_split(h, keys, n, &s);
	if (rc)
		return rc;
	if (!s.nhot) {
		hot_split_free(&s);
		return hot_inner(h, w, FERRY_OP_PUSH, keys, n, deltas, NULL);
	}
	/* the other keys first: when they fail, the hot ones are not pushed */
	if (s.nother) {
		tmp = malloc(s.other_floats * sizeof(float));
		if (!tmp) {
			ferry_err("push: table %u: out of memory for %zu keys", t->id, s.nother);
			rc = -ENOMEM;
		}
		for (size_t i = 0, off = 0; tmp && i < n; i++)
			if (s.hi[i] < 0) {
				uint64_t len = s.offs[i + 1] - s.offs[i];

				memcpy(tmp + off, deltas + s.offs[i], len * sizeof(float));
				off += len;
			}
		if (tmp)
			rc = hot_inner(h, w, FERRY_OP_PUSH, s.ok, s.nother, tmp, NULL);
		free(tmp);
	}
	if (!rc) {
		pthread_mutex_lock(&h->lock);
		for (size_t i = 0; i < n; i++) {
			uint64_t len = s.offs[i + 1] - s.offs[i], o;
			const float *d = deltas + s.offs[i];

			if (s.hi[i] < 0)
				continue;
			o = h->offs[s.hi[i]];
			for (uint64_t k = 0; k < len; k++) {
				h->val[o + k] += d[k];
				h->pend[o + k] += d[k];
			}
			if (!h->dirty[s.hi[i]]) {
				h->dirty[s.hi[i]] = 1;
				h->ndirty++;
			}
		}
		h->st.pushes += s.nhot;
		pthread_mutex_unlock(&h->lock);
	}
	hot_split_free(&s);
	return rc;
}

static int hot_set(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		   const float *vals)
{
	struct ferry_hot *h = t->hot;
	int rc = ferry__cons_check_call(w, t, keys, n, vals, "set");

	if (rc || !n)
		return rc;
	for (size_t i = 0; i < n; i++)
		if (hot_index(h, keys[i]) >= 0) {
			ferry_err(
				"set: key %llu of table %u is hot; hot keys change by pushes only "
				"(they start at the table's init); nothing of this call is set",
				(unsigned long long)keys[i], t->id);
			return -EINVAL;
		}
	return hot_inner(h, w, FERRY_OP_SET, keys, n, vals, NULL);
}

const struct ferry_cons_hooks ferry__hot_hooks = {
	.pull = hot_pull,
	.push = hot_push,
	.set = hot_set,
};

/* SPDX-License-Identifier: MIT */
/*
 * codec.c - compressed pushes with error feedback (see codec.h).
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/core.h"
#include "lib/dir/keymap.h"
#include "lib/ops/codec.h"
#include "lib/ops/ops.h"
#include "transport/base/log.h"

#define CODEC_KEYS_DEFAULT 65536u

static float codec_round(uint16_t flag, float x)
{
	return flag == FERRY_OP_F_BF16 ? ferry__codec_bf16_val(ferry__codec_bf16(x)) :
					 ferry__codec_fp16_val(ferry__codec_fp16(x));
}

int ferry__codec_check(const struct ferry_table_params *p)
{
	if (p->push_codec == FERRY_CODEC_NONE)
		return 0;
	if (p->push_codec != FERRY_CODEC_BF16 && p->push_codec != FERRY_CODEC_FP16) {
		ferry_err("table: push_codec %d is not one of FERRY_CODEC_NONE, _BF16, _FP16",
			  (int)p->push_codec);
		return -EINVAL;
	}
	if (p->value_lens) {
		ferry_err("table: a push_codec with per-key value lengths is not supported yet; "
			  "use one value_len, or FERRY_CODEC_NONE");
		return -EINVAL;
	}
	if (p->consistency != FERRY_CONS_SEQUENTIAL) {
		ferry_err("table: a push_codec with a consistency model other than SEQUENTIAL is "
			  "not supported yet; use FERRY_CODEC_NONE there");
		return -EINVAL;
	}
	return 0;
}

/* ---- residuals ---------------------------------------------------------- */

/* one worker's residuals of one table; only that worker's thread uses it */
struct codec_store {
	struct ferry_keymap map; /* key -> slot index + 1 */
	float *pool;		 /* slots of len floats, used from 0 up */
	uint64_t used, cap;	 /* slots in use, slots allocated */
};

struct codec_table {
	_Atomic(struct codec_store *) w[FERRY_MAX_WORKERS];
};

static struct codec_store *codec_store(struct ferry_worker *w, struct ferry_table *t)
{
	struct codec_table *ct =
		atomic_load_explicit((_Atomic(void *) *)&t->codec, memory_order_acquire);
	struct codec_store *s;

	if (!ct) {
		void *want = NULL;

		ct = calloc(1, sizeof(*ct));
		if (!ct)
			return NULL;
		if (!atomic_compare_exchange_strong((_Atomic(void *) *)&t->codec, &want, ct)) {
			free(ct);
			ct = want;
		}
	}
	s = atomic_load_explicit(&ct->w[w->id], memory_order_relaxed);
	if (s)
		return s;
	s = calloc(1, sizeof(*s));
	if (!s || ferry__keymap_init(&s->map)) {
		free(s);
		return NULL;
	}
	atomic_store_explicit(&ct->w[w->id], s, memory_order_release);
	return s;
}

static void codec_store_clear(struct codec_store *s)
{
	ferry__keymap_fini(&s->map);
	if (ferry__keymap_init(&s->map)) {
		/* no memory for an empty map: keep none; every lookup misses
		 * and the next push tries again */
		s->map.arr = NULL;
	}
	s->used = 0;
}

struct codec_collect {
	const struct codec_store *s;
	uint32_t len;
	uint64_t *keys;
	float *vals;
	uint64_t n;
};

static void codec_collect_one(void *arg, uint64_t key, uint64_t val)
{
	struct codec_collect *c = arg;

	c->keys[c->n] = key;
	memcpy(c->vals + c->n * c->len, c->s->pool + (val - 1) * c->len, c->len * sizeof(float));
	c->n++;
}

static int codec_store_flush(struct ferry_worker *w, struct ferry_table *t, struct codec_store *s)
{
	uint32_t len = t->params.value_len;
	struct codec_collect c = { .s = s, .len = len };
	int rc;

	if (!s->used)
		return 0;
	c.keys = malloc(s->used * sizeof(*c.keys));
	c.vals = malloc(s->used * len * sizeof(float));
	if (!c.keys || !c.vals) {
		free(c.keys);
		free(c.vals);
		ferry_err("push: out of memory sending the residuals of %llu keys of table %u",
			  (unsigned long long)s->used, t->id);
		return -ENOMEM;
	}
	ferry__keymap_each(&s->map, codec_collect_one, &c);
	/* exact floats: w->op_flags is 0 here */
	rc = ferry__ops_sync(w, t, FERRY_OP_PUSH, c.keys, c.n, c.vals, NULL, NULL);
	if (!rc)
		codec_store_clear(s);
	free(c.keys);
	free(c.vals);
	return rc;
}

/* a slot for @key's residual (zeroed when new, *fresh = 1), or NULL */
static float *codec_slot(struct codec_store *s, uint32_t len, uint64_t key, int *fresh)
{
	uint64_t v = s->map.arr ? ferry__keymap_get(&s->map, key) : 0;

	*fresh = 0;
	if (v)
		return s->pool + (v - 1) * len;
	if (!s->map.arr)
		return NULL;
	if (s->used == s->cap) {
		uint64_t cap = s->cap ? s->cap * 2 : 256;
		float *p = realloc(s->pool, cap * len * sizeof(float));

		if (!p)
			return NULL;
		s->pool = p;
		s->cap = cap;
	}
	if (ferry__keymap_put(&s->map, key, s->used + 1))
		return NULL;
	*fresh = 1;
	memset(s->pool + s->used * len, 0, len * sizeof(float));
	return s->pool + s->used++ * len;
}

/* put back the residuals of keys[0 .. @n) as @undo holds them, last first
 * (a key twice in the batch ends with its first copy), and forget the keys
 * this call made (@fresh): the store is as the call found it */
static void codec_undo(struct codec_store *s, uint32_t len, const uint64_t *keys, size_t n,
		       const float *undo, const uint8_t *fresh, uint64_t used0)
{
	for (size_t j = n; j-- > 0;) {
		float *r = s->pool + (ferry__keymap_get(&s->map, keys[j]) - 1) * len;

		memcpy(r, undo + j * len, len * sizeof(float));
		if (fresh[j])
			ferry__keymap_del(&s->map, keys[j]);
	}
	s->used = used0;
}

int ferry__codec_push(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		      const float *deltas)
{
	uint16_t flag = ferry__codec_flag(t->params.push_codec);
	uint32_t len = t->params.value_len, limit;
	struct codec_store *s;
	float *q = NULL, *undo = NULL;
	uint8_t *fresh = NULL;
	uint64_t used0, unknown = 0;
	int rc = 0;

	if (!w || !keys || !deltas || !n || w->fy != t->fy)
		return ferry__ops_sync(w, t, FERRY_OP_PUSH, keys, n, deltas, NULL, NULL);
	for (size_t i = 0; i < n; i++)
		if (!ferry__key_ok(t, keys[i]))
			return ferry__ops_sync(w, t, FERRY_OP_PUSH, keys, n, deltas, NULL, NULL);
	s = codec_store(w, t);
	if (!s) {
		ferry_err("push: out of memory for the residuals of table %u", t->id);
		return -ENOMEM;
	}
	limit = t->params.codec_keys ? t->params.codec_keys : CODEC_KEYS_DEFAULT;
	for (size_t i = 0; i < n; i++)
		unknown += !(s->map.arr && ferry__keymap_get(&s->map, keys[i]));
	if (s->used + unknown > limit && (rc = codec_store_flush(w, t, s)))
		return rc;
	q = malloc(n * len * sizeof(float));
	undo = malloc(n * len * sizeof(float));
	fresh = calloc(n, 1);
	if (!q || !undo || !fresh) {
		rc = -ENOMEM;
		goto out;
	}
	used0 = s->used;
	/* in array order, so a key twice in the batch sees its own residual */
	for (size_t i = 0; i < n; i++) {
		int f;
		float *r = codec_slot(s, len, keys[i], &f);

		if (!r) {
			codec_undo(s, len, keys, i, undo, fresh, used0);
			rc = -ENOMEM;
			goto out;
		}
		fresh[i] = (uint8_t)f;
		memcpy(undo + i * len, r, len * sizeof(float));
		for (uint32_t k = 0; k < len; k++) {
			float d = deltas[i * len + k] + r[k], v = codec_round(flag, d);

			q[i * len + k] = v;
			r[k] = d - v;
		}
	}
	w->op_flags = flag;
	rc = ferry__ops_sync(w, t, FERRY_OP_PUSH, keys, n, q, NULL, NULL);
	w->op_flags = 0;
	if (rc) {
		/* the residuals go back to what they were: the caller still has
		 * its deltas, and may push them again */
		codec_undo(s, len, keys, n, undo, fresh, used0);
	}
out:
	if (rc == -ENOMEM)
		ferry_err("push: out of memory compressing %zu keys of table %u; nothing of the "
			  "push was sent",
			  n, t->id);
	free(q);
	free(undo);
	free(fresh);
	return rc;
}

int ferry__codec_flush(struct ferry_worker *w, struct ferry_table *t)
{
	struct codec_store *s;

	if (!w || !t || w->fy != t->fy) {
		ferry_err("flush: NULL worker or table, or a table of another node");
		return -EINVAL;
	}
	if (t->params.push_codec == FERRY_CODEC_NONE)
		return 0;
	s = codec_store(w, t);
	if (!s)
		return -ENOMEM;
	return codec_store_flush(w, t, s);
}

uint64_t ferry__codec_count(struct ferry_table *t)
{
	struct codec_table *ct =
		atomic_load_explicit((_Atomic(void *) *)&t->codec, memory_order_acquire);
	uint64_t n = 0;

	for (uint32_t i = 0; ct && i < FERRY_MAX_WORKERS; i++) {
		struct codec_store *s = atomic_load_explicit(&ct->w[i], memory_order_acquire);

		n += s ? s->used : 0;
	}
	return n;
}

void ferry__codec_table_fini(struct ferry_table *t)
{
	struct codec_table *ct = t->codec;
	uint64_t kept = 0;

	if (!ct)
		return;
	for (uint32_t i = 0; i < FERRY_MAX_WORKERS; i++) {
		struct codec_store *s = ct->w[i];

		if (!s)
			continue;
		kept += s->used;
		if (s->map.arr)
			ferry__keymap_fini(&s->map);
		free(s->pool);
		free(s);
	}
	if (kept)
		ferry_warn("table %u: residuals of %llu keys of compressed pushes were never "
			   "sent; call ferry_flush() before ferry_table_destroy()",
			   t->id, (unsigned long long)kept);
	free(ct);
	t->codec = NULL;
}

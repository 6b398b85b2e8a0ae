/* SPDX-License-Identifier: MIT */
/*
 * topk.c - Misra-Gries counting of a table's accesses (topk.h).
 *
 * At most cap keys have a counter. An access of a key with a counter adds
 * to it; one of a key without takes a free counter. When all cap are in
 * use, every counter is lowered by the least of them (and the new key's
 * count), and those at 0 go: Misra and Gries' "decrement all", by the
 * minimum at once. Each lowering removes at least one counter and at least
 * cap counts in all, so its O(cap) rebuild costs O(1) per access, amortized.
 * The counters live in an open-addressed table of 2 x cap entries or more
 * (linear probing, at most half full), rebuilt whenever counters go.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cons/topk.h"

static uint64_t topk_mix(uint64_t x)
{
	/* splitmix64's finalizer: keys are often small and dense */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

int ferry__topk_init(struct ferry_topk *s, uint32_t cap)
{
	uint32_t size = 4;

	memset(s, 0, sizeof(*s));
	if (!cap || cap > (1u << 30))
		return -EINVAL;
	while (size < 2 * cap)
		size *= 2;
	s->e = calloc(size, sizeof(*s->e));
	s->tmp = malloc(cap * sizeof(*s->tmp));
	if (!s->e || !s->tmp) {
		free(s->e);
		free(s->tmp);
		s->e = s->tmp = NULL;
		return -ENOMEM;
	}
	s->cap = cap;
	s->mask = size - 1;
	return 0;
}

void ferry__topk_fini(struct ferry_topk *s)
{
	free(s->e);
	free(s->tmp);
	memset(s, 0, sizeof(*s));
}

static struct ferry_topk_ent *topk_slot(const struct ferry_topk *s, uint64_t k1)
{
	uint32_t i = (uint32_t)topk_mix(k1) & s->mask;

	while (s->e[i].key && s->e[i].key != k1)
		i = (i + 1) & s->mask;
	return &s->e[i];
}

/* lower every counter by @by; those at 0 go. The survivors are set aside
 * in tmp and the table refilled: linear probing leaves no holes */
static void topk_lower(struct ferry_topk *s, uint64_t by)
{
	uint32_t size = s->mask + 1, kept = 0;

	for (uint32_t i = 0; i < size; i++)
		if (s->e[i].key && s->e[i].cnt > by) {
			s->tmp[kept].key = s->e[i].key;
			s->tmp[kept++].cnt = s->e[i].cnt - by;
		}
	memset(s->e, 0, size * sizeof(*s->e));
	for (uint32_t j = 0; j < kept; j++)
		*topk_slot(s, s->tmp[j].key) = s->tmp[j];
	s->n = kept;
	s->cuts += by;
}

void ferry__topk_add(struct ferry_topk *s, uint64_t key, uint64_t by)
{
	uint64_t k1 = key + 1, least = by;
	struct ferry_topk_ent *d;

	if (!s->e || !by || !k1)
		return; /* key 2^64 - 1 is not counted: no dense table holds it */
	d = topk_slot(s, k1);
	if (d->key) {
		d->cnt += by;
		return;
	}
	if (s->n < s->cap) {
		d->key = k1;
		d->cnt = by;
		s->n++;
		return;
	}
	/* full: lower every counter, and the new access, by the least of them */
	for (uint32_t i = 0; i <= s->mask; i++)
		if (s->e[i].key && s->e[i].cnt < least)
			least = s->e[i].cnt;
	topk_lower(s, least);
	if (by > least) {
		d = topk_slot(s, k1);
		d->key = k1;
		d->cnt = by - least;
		s->n++;
	}
}

static int topk_cmp(const void *a, const void *b)
{
	const struct ferry_topk_ent *x = a, *y = b;

	if (x->cnt != y->cnt)
		return x->cnt > y->cnt ? -1 : 1;
	return x->key < y->key ? -1 : x->key > y->key;
}

uint32_t ferry__topk_top(const struct ferry_topk *s, uint32_t k, uint64_t *keys, uint64_t *cnts)
{
	struct ferry_topk_ent *v;
	uint32_t n = 0;

	if (!s->e || !k || !s->n)
		return 0;
	v = malloc(s->n * sizeof(*v));
	if (!v)
		return 0; /* the caller sees no candidates, and says so */
	for (uint32_t i = 0; i <= s->mask; i++)
		if (s->e[i].key)
			v[n++] = s->e[i];
	qsort(v, n, sizeof(*v), topk_cmp);
	if (k > n)
		k = n;
	for (uint32_t i = 0; i < k; i++) {
		keys[i] = v[i].key - 1;
		cnts[i] = v[i].cnt;
	}
	free(v);
	return k;
}

void ferry__topk_decay(struct ferry_topk *s)
{
	uint32_t size = s->mask + 1;
	uint64_t cuts;

	if (!s->e)
		return;
	for (uint32_t i = 0; i < size; i++)
		if (s->e[i].key)
			s->e[i].cnt = s->e[i].cnt / 2 + 1; /* +1: kept; lowered by 1 below */
	cuts = s->cuts / 2;
	topk_lower(s, 1);
	s->cuts = cuts;
}

/* SPDX-License-Identifier: MIT */
/*
 * map.c - one table's entries on this node (lib/cons/cons.h): a chained hash
 * of keys, each with a copy of the owner's value, unsent deltas and deltas in
 * flight. Copies form a list, oldest first, that eviction takes from; deltas
 * are never evicted (cons.c sends them when they grow past half the limit).
 * The caller holds the table's cons lock for every call.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cons/cons.h"

static uint64_t map_hash(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	k ^= k >> 33;
	return k;
}

int ferry__cons_map_init(struct ferry_cons_map *m, uint64_t limit)
{
	memset(m, 0, sizeof(*m));
	m->nb = 1024;
	m->b = calloc(m->nb, sizeof(*m->b));
	if (!m->b)
		return -ENOMEM;
	m->limit = limit;
	m->bytes = m->nb * sizeof(*m->b);
	return 0;
}

static void map_ent_free(struct ferry_cons_ent *e)
{
	free(e->val);
	free(e->pend);
	free(e->infl);
	free(e);
}

void ferry__cons_map_fini(struct ferry_cons_map *m)
{
	for (uint64_t i = 0; m->b && i < m->nb; i++) {
		struct ferry_cons_ent *e = m->b[i], *next;

		for (; e; e = next) {
			next = e->next;
			map_ent_free(e);
		}
	}
	free(m->b);
	memset(m, 0, sizeof(*m));
}

struct ferry_cons_ent *ferry__cons_map_find(struct ferry_cons_map *m, uint64_t key)
{
	struct ferry_cons_ent *e = m->b[map_hash(key) & (m->nb - 1)];

	while (e && e->key != key)
		e = e->next;
	return e;
}

/* twice the buckets when the chains grow past 1 on average; a failed
 * allocation keeps the old ones (longer chains, still correct) */
static void map_grow(struct ferry_cons_map *m)
{
	uint64_t nb = m->nb * 2;
	struct ferry_cons_ent **b = calloc(nb, sizeof(*b));

	if (!b)
		return;
	for (uint64_t i = 0; i < m->nb; i++) {
		struct ferry_cons_ent *e = m->b[i], *next;

		for (; e; e = next) {
			uint64_t h = map_hash(e->key) & (nb - 1);

			next = e->next;
			e->next = b[h];
			b[h] = e;
		}
	}
	free(m->b);
	m->bytes += (nb - m->nb) * sizeof(*b);
	m->b = b;
	m->nb = nb;
}

struct ferry_cons_ent *ferry__cons_map_get(struct ferry_cons_map *m, uint64_t key, uint32_t len)
{
	struct ferry_cons_ent *e = ferry__cons_map_find(m, key);
	uint64_t h;

	if (e)
		return e;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->key = key;
	e->len = len;
	if (m->n >= m->nb)
		map_grow(m);
	h = map_hash(key) & (m->nb - 1);
	e->next = m->b[h];
	m->b[h] = e;
	m->n++;
	m->bytes += sizeof(*e);
	return e;
}

/* an entry that holds nothing goes */
static void map_maybe_del(struct ferry_cons_map *m, struct ferry_cons_ent *e)
{
	struct ferry_cons_ent **pp;

	if (e->have_val || e->pend || e->infl)
		return;
	pp = &m->b[map_hash(e->key) & (m->nb - 1)];
	while (*pp != e)
		pp = &(*pp)->next;
	*pp = e->next;
	m->n--;
	m->bytes -= sizeof(*e);
	map_ent_free(e);
}

static void map_fifo_unlink(struct ferry_cons_map *m, struct ferry_cons_ent *e)
{
	if (e->fprev)
		e->fprev->fnext = e->fnext;
	else
		m->fhead = e->fnext;
	if (e->fnext)
		e->fnext->fprev = e->fprev;
	else
		m->ftail = e->fprev;
	e->fprev = e->fnext = NULL;
}

int ferry__cons_map_set_val(struct ferry_cons_map *m, struct ferry_cons_ent *e, const float *val,
			    uint64_t fresh)
{
	if (!e->val) {
		e->val = malloc((size_t)e->len * sizeof(float));
		if (!e->val)
			return -ENOMEM;
		m->bytes += (uint64_t)e->len * sizeof(float);
	}
	if (e->have_val)
		map_fifo_unlink(m, e);
	memcpy(e->val, val, (size_t)e->len * sizeof(float));
	e->have_val = true;
	e->fresh = fresh;
	e->fprev = m->ftail;
	if (m->ftail)
		m->ftail->fnext = e;
	else
		m->fhead = e;
	m->ftail = e;
	return 0;
}

void ferry__cons_map_drop_val(struct ferry_cons_map *m, struct ferry_cons_ent *e)
{
	if (!e->have_val)
		return;
	map_fifo_unlink(m, e);
	free(e->val);
	e->val = NULL;
	e->have_val = false;
	m->bytes -= (uint64_t)e->len * sizeof(float);
	map_maybe_del(m, e);
}

void ferry__cons_map_drop_all_vals(struct ferry_cons_map *m)
{
	while (m->fhead)
		ferry__cons_map_drop_val(m, m->fhead);
}

void ferry__cons_map_evict(struct ferry_cons_map *m)
{
	while (m->bytes > m->limit && m->fhead)
		ferry__cons_map_drop_val(m, m->fhead);
}

int ferry__cons_map_pend_add(struct ferry_cons_map *m, struct ferry_cons_ent *e, const float *delta)
{
	if (!e->pend) {
		e->pend = calloc(e->len, sizeof(float));
		if (!e->pend)
			return -ENOMEM;
		m->bytes += (uint64_t)e->len * sizeof(float);
		m->pend_floats += e->len;
		e->pnext = m->phead;
		m->phead = e;
		m->npend++;
	}
	for (uint32_t i = 0; i < e->len; i++)
		e->pend[i] += delta[i];
	return 0;
}

void ferry__cons_map_read(const struct ferry_cons_ent *e, float *out)
{
	memcpy(out, e->val, (size_t)e->len * sizeof(float));
	if (e->pend)
		for (uint32_t i = 0; i < e->len; i++)
			out[i] += e->pend[i];
	if (e->infl)
		for (uint32_t i = 0; i < e->len; i++)
			out[i] += e->infl[i];
}

int ferry__cons_map_flush_take(struct ferry_cons_map *m, uint64_t **keys_p, float **deltas_p,
			       size_t *n_p)
{
	uint64_t *keys;
	float *deltas;
	size_t i = 0, off = 0;

	*n_p = 0;
	*keys_p = NULL;
	*deltas_p = NULL;
	if (!m->npend)
		return 0;
	keys = malloc(m->npend * sizeof(*keys));
	deltas = malloc(m->pend_floats * sizeof(*deltas));
	if (!keys || !deltas) {
		free(keys);
		free(deltas);
		return -ENOMEM;
	}
	/* one flush at a time (cons.c's per-table flush mutex): infl is empty */
	for (struct ferry_cons_ent *e = m->phead, *next; e; e = next) {
		next = e->pnext;
		keys[i++] = e->key;
		memcpy(deltas + off, e->pend, (size_t)e->len * sizeof(float));
		off += e->len;
		e->infl = e->pend;
		e->pend = NULL;
		e->pnext = NULL;
		e->inext = m->ihead;
		m->ihead = e;
	}
	m->ninfl = m->npend;
	m->infl_floats = m->pend_floats;
	m->phead = NULL;
	m->npend = 0;
	m->pend_floats = 0;
	*keys_p = keys;
	*deltas_p = deltas;
	*n_p = i;
	return 0;
}

void ferry__cons_map_flush_done(struct ferry_cons_map *m)
{
	for (struct ferry_cons_ent *e = m->ihead, *next; e; e = next) {
		uint8_t out = e->out;

		next = e->inext;
		e->inext = NULL;
		e->out = FERRY_CONS_OUT_APPLIED;
		if (out == FERRY_CONS_OUT_HELD) {
			/* not applied anywhere: unsent again, with what came since */
			if (e->pend) {
				for (uint32_t i = 0; i < e->len; i++)
					e->pend[i] += e->infl[i];
				free(e->infl);
				m->bytes -= (uint64_t)e->len * sizeof(float);
			} else {
				e->pend = e->infl;
				e->pnext = m->phead;
				m->phead = e;
				m->npend++;
				m->pend_floats += e->len;
			}
			e->infl = NULL;
			continue;
		}
		if (e->have_val && out == FERRY_CONS_OUT_APPLIED)
			for (uint32_t i = 0; i < e->len; i++)
				e->val[i] += e->infl[i];
		free(e->infl);
		e->infl = NULL;
		m->bytes -= (uint64_t)e->len * sizeof(float);
		if (out == FERRY_CONS_OUT_UNKNOWN && e->have_val)
			ferry__cons_map_drop_val(m, e); /* may free e */
		else
			map_maybe_del(m, e);
	}
	m->ihead = NULL;
	m->ninfl = 0;
	m->infl_floats = 0;
}

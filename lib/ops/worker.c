/* SPDX-License-Identifier: MIT */
/*
 * worker.c - workers: create and destroy, the in-flight key set
 * (open addressing, the worker's thread only) and request slots.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "lib/ops/internal.h"

/* ---- in-flight key set (open addressing, worker thread only) ----------- */

static uint32_t inflight_slot(const struct ferry_worker *w, uint64_t key)
{
	uint32_t mask = w->inflight_cap - 1, i = (uint32_t)ferry__hash64(key) & mask;

	while (w->inflight_cnt[i] && w->inflight_keys[i] != key)
		i = (i + 1) & mask;
	return i;
}

int ferry__ops_inflight_has(const struct ferry_worker *w, uint64_t key)
{
	return w->inflight_n && w->inflight_cnt[inflight_slot(w, key)];
}

static int inflight_grow(struct ferry_worker *w)
{
	uint32_t old_cap = w->inflight_cap, cap = old_cap ? old_cap * 2 : 256;
	uint64_t *old_keys = w->inflight_keys;
	uint32_t *old_cnt = w->inflight_cnt;

	w->inflight_keys = calloc(cap, sizeof(uint64_t));
	w->inflight_cnt = calloc(cap, sizeof(uint32_t));
	if (!w->inflight_keys || !w->inflight_cnt) {
		free(w->inflight_keys);
		free(w->inflight_cnt);
		w->inflight_keys = old_keys;
		w->inflight_cnt = old_cnt;
		return -ENOMEM;
	}
	w->inflight_cap = cap;
	for (uint32_t i = 0; i < old_cap; i++)
		if (old_cnt[i]) {
			uint32_t j = inflight_slot(w, old_keys[i]);

			w->inflight_keys[j] = old_keys[i];
			w->inflight_cnt[j] = old_cnt[i];
		}
	free(old_keys);
	free(old_cnt);
	return 0;
}

int ferry__ops_inflight_add(struct ferry_worker *w, uint64_t key)
{
	uint32_t i;

	if ((w->inflight_n + 1) * 2 > w->inflight_cap && inflight_grow(w))
		return -ENOMEM;
	i = inflight_slot(w, key);
	if (!w->inflight_cnt[i]) {
		w->inflight_keys[i] = key;
		w->inflight_n++;
	}
	w->inflight_cnt[i]++;
	return 0;
}

/* deletion with backward shift keeps probe chains whole */
void ferry__ops_inflight_del(struct ferry_worker *w, uint64_t key)
{
	uint32_t mask = w->inflight_cap - 1, i = inflight_slot(w, key), j;

	if (!w->inflight_cnt[i] || --w->inflight_cnt[i])
		return;
	w->inflight_n--;
	j = i;
	for (;;) {
		uint32_t home;

		j = (j + 1) & mask;
		if (!w->inflight_cnt[j])
			break;
		home = (uint32_t)ferry__hash64(w->inflight_keys[j]) & mask;
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			w->inflight_keys[i] = w->inflight_keys[j];
			w->inflight_cnt[i] = w->inflight_cnt[j];
			w->inflight_cnt[j] = 0;
			i = j;
		}
	}
}

/* ---- workers ---------------------------------------------------------- */

int ferry_worker_create(struct ferry *fy, struct ferry_worker **worker_p)
{
	struct ferry_worker *w;
	int id = -1;

	if (!fy || !worker_p)
		return -EINVAL;
	if (atomic_load(&fy->closed))
		return -FERRY_E_CLOSED;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_lock(&fy->lock);
	for (int i = 0; i < FERRY_MAX_WORKERS; i++)
		if (!fy->workers[i]) {
			id = i;
			break;
		}
	if (id < 0) {
		pthread_mutex_unlock(&fy->lock);
		free(w);
		ferry_err("worker: this node has %d workers, the limit; destroy unused ones",
			  FERRY_MAX_WORKERS);
		return -ENOSPC;
	}
	w->fy = fy;
	w->id = (uint32_t)id;
	pthread_mutex_init(&w->lock, NULL);
	ferry__cond_init_monotonic(&w->cond);
	for (uint32_t i = 0; i < FERRY_MAX_INFLIGHT; i++)
		w->free_idx[i] = FERRY_MAX_INFLIGHT - 1 - i;
	w->nfree = FERRY_MAX_INFLIGHT;
	w->gen = 1;
	rcu_assign_pointer(fy->workers[id], w);
	atomic_fetch_add(&fy->refs, 1);
	pthread_mutex_unlock(&fy->lock);
	if (fy->cons_worker_new)
		fy->cons_worker_new(w);
	ferry__rcu_enter();
	*worker_p = w;
	return 0;
}

void ferry_worker_destroy(struct ferry_worker *w)
{
	struct ferry *fy;

	if (!w)
		return;
	fy = w->fy;
	/* its clock stops holding the node's back (it may send a last flush) */
	if (fy->cons_worker_gone)
		fy->cons_worker_gone(w);
	pthread_mutex_lock(&fy->lock);
	rcu_assign_pointer(fy->workers[w->id], NULL);
	pthread_mutex_unlock(&fy->lock);
	/* after this no progress thread can be inside the worker */
	urcu_memb_synchronize_rcu();
	for (uint32_t i = 0; i < FERRY_MAX_INFLIGHT; i++)
		if (w->reqs[i].ticket)
			ferry__ops_req_free(w, &w->reqs[i]);
	ferry__ops_rd_fini(w);
	atomic_fetch_add(&fy->gone_local_ops, w->local_ops);
	atomic_fetch_add(&fy->gone_remote_ops, w->remote_ops);
	ferry__rcu_leave();
	free(w->inflight_keys);
	free(w->inflight_cnt);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	free(w);
	ferry__node_put(fy);
}
/* forget the in-flight marks of a request's remote keys */
void ferry__ops_untrack(struct ferry_worker *w, struct ferry_req *r)
{
	const uint8_t *remote = r->done + (r->n + 7) / 8;

	if (!r->tracked)
		return;
	for (size_t i = 0; i < r->n; i++)
		if (remote[i / 8] & (1u << (i % 8)))
			ferry__ops_inflight_del(w, r->keys[i]);
	r->tracked = false;
}

void ferry__ops_req_free(struct ferry_worker *w, struct ferry_req *r)
{
	uint32_t idx = (uint32_t)r->ticket;

	ferry__ops_untrack(w, r);
	pthread_mutex_lock(&w->lock);
	r->ticket = 0;
	pthread_mutex_unlock(&w->lock);
	free(r->done);
	r->done = NULL;
	w->free_idx[w->nfree++] = idx;
}

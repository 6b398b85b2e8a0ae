/* SPDX-License-Identifier: MIT */
/*
 * pend.c - keys on their way to this node, in a cds_lfht (see pend.h for
 * the contract of each function and the bound).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/dir/pend.h"
#include "lib/dir/placement.h"

static int pend_match(struct cds_lfht_node *node, const void *key)
{
	const struct ferry_pend *e = caa_container_of(node, struct ferry_pend, node);

	return e->key == *(const uint64_t *)key;
}

int ferry__pend_init(struct ferry_pend_table *pt)
{
	pt->ht = cds_lfht_new_flavor(64, 64, 0, CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING,
				     &urcu_memb_flavor, NULL);
	if (!pt->ht)
		return -ENOMEM;
	pthread_mutex_init(&pt->lock, NULL);
	pthread_mutex_init(&pt->retire_lock, NULL);
	pt->n = 0;
	pt->retired = NULL;
	pt->nretired = 0;
	return 0;
}

/* a batch of freed entries, chained by retired_next from the one whose
 * rcu head was queued */
static void pend_free_rcu(struct rcu_head *head)
{
	struct ferry_pend *e = caa_container_of(head, struct ferry_pend, rcu);

	while (e) {
		struct ferry_pend *next = e->retired_next;

		free(e);
		e = next;
	}
}

/* queue @e (NULL: none) for freeing after a grace period; the batch goes
 * to call_rcu when it is full, or at once when @e is NULL (teardown) */
static void pend_retire(struct ferry_pend_table *pt, struct ferry_pend *e)
{
	struct ferry_pend *batch = NULL;

	pthread_mutex_lock(&pt->retire_lock);
	if (e) {
		e->retired_next = pt->retired;
		pt->retired = e;
		pt->nretired++;
	}
	if (!e || pt->nretired == FERRY_PEND_RETIRE_BATCH) {
		batch = pt->retired;
		pt->retired = NULL;
		pt->nretired = 0;
	}
	pthread_mutex_unlock(&pt->retire_lock);
	if (batch)
		urcu_memb_call_rcu(&batch->rcu, pend_free_rcu);
}

void ferry__pend_free(struct ferry_pend_table *pt, struct ferry_pend *e)
{
	while (e->head) {
		struct ferry_pend_item *it = e->head;

		e->head = it->next;
		free(it);
	}
	e->tail = NULL;
	while (e->waiters) {
		struct ferry_pend_waiter *wt = e->waiters;

		e->waiters = wt->next;
		free(wt);
	}
	/* a lookup may still traverse it (and cds_lfht's resize): after a
	 * grace period, with the batch it completes */
	pend_retire(pt, e);
}

void ferry__pend_fini(struct ferry_pend_table *pt, void (*each)(void *arg, struct ferry_pend *e),
		      void *arg)
{
	struct cds_lfht_node *node;
	struct cds_lfht_iter it;

	if (!pt->ht)
		return;
	urcu_memb_read_lock();
	/* not cds_lfht_for_each_entry: it forms container_of(NULL) at the end,
	 * which UBSan rightly reports */
	for (cds_lfht_first(pt->ht, &it); (node = cds_lfht_iter_get_node(&it));
	     cds_lfht_next(pt->ht, &it)) {
		struct ferry_pend *e = caa_container_of(node, struct ferry_pend, node);

		cds_lfht_del(pt->ht, node);
		pt->n--;
		if (each)
			each(arg, e);
		ferry__pend_free(pt, e);
	}
	urcu_memb_read_unlock();
	pend_retire(pt, NULL);
	cds_lfht_destroy(pt->ht, NULL);
	pt->ht = NULL;
	pthread_mutex_destroy(&pt->lock);
	pthread_mutex_destroy(&pt->retire_lock);
}

void ferry__pend_for_each(struct ferry_pend_table *pt, void (*fn)(void *arg, struct ferry_pend *e),
			  void *arg)
{
	struct cds_lfht_node *node;
	struct cds_lfht_iter it;

	for (cds_lfht_first(pt->ht, &it); (node = cds_lfht_iter_get_node(&it));
	     cds_lfht_next(pt->ht, &it))
		fn(arg, caa_container_of(node, struct ferry_pend, node));
}

struct ferry_pend *ferry__pend_find(struct ferry_pend_table *pt, uint64_t key)
{
	struct cds_lfht_iter it;
	struct cds_lfht_node *node;

	cds_lfht_lookup(pt->ht, ferry__hash64(key), pend_match, &key, &it);
	node = cds_lfht_iter_get_node(&it);
	return node ? caa_container_of(node, struct ferry_pend, node) : NULL;
}

struct ferry_pend *ferry__pend_add(struct ferry_pend_table *pt, uint64_t key, uint32_t slot,
				   uint32_t landing, uint32_t ticket)
{
	struct ferry_pend *e = calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	e->key = key;
	e->slot = slot;
	e->landing = landing;
	e->ticket = ticket;
	cds_lfht_node_init(&e->node);
	/* the caller checked that @key has no entry, under pt->lock */
	cds_lfht_add(pt->ht, ferry__hash64(key), &e->node);
	pt->n++;
	return e;
}

void ferry__pend_del(struct ferry_pend_table *pt, struct ferry_pend *e)
{
	cds_lfht_del(pt->ht, &e->node);
	pt->n--;
}

void ferry__pend_append(struct ferry_pend *e, struct ferry_pend_item *it)
{
	e->nqueued++;
	it->next = NULL;
	if (e->tail)
		e->tail->next = it;
	else
		e->head = it;
	e->tail = it;
}

int ferry__pend_queue_op(struct ferry_pend_table *pt, const struct ferry_msg_op *op,
			 const struct ferry_msg_key *k, const float *vals)
{
	struct ferry_pend_item *it;
	struct ferry_pend *e;
	size_t nv = vals ? k->len : 0;

	pthread_mutex_lock(&pt->lock);
	e = ferry__pend_find(pt, k->key);
	if (!e) {
		pthread_mutex_unlock(&pt->lock);
		return 0;
	}
	if (e->stuck || e->nqueued >= FERRY_PEND_QUEUE_MAX) {
		int rc = e->stuck ? e->stuck : -EAGAIN;

		pthread_mutex_unlock(&pt->lock);
		return rc;
	}
	it = malloc(sizeof(*it) + nv * sizeof(float));
	if (!it) {
		pthread_mutex_unlock(&pt->lock);
		return -ENOMEM;
	}
	it->kind = FERRY_PEND_OP;
	it->op = *op;
	it->key = *k;
	if (nv)
		memcpy(it->vals, vals, nv * sizeof(float));
	ferry__pend_append(e, it);
	pthread_mutex_unlock(&pt->lock);
	return 1;
}

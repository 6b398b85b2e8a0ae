/* SPDX-License-Identifier: MIT */
/*
 * hotauto.c - hot_auto: a table's hot keys chosen from what the nodes
 * access (docs/consistency.md, "Hot keys"). hotops.c counts every pull and
 * push per key (topk.c, Misra-Gries); ferry_hot_update(), a collective,
 * makes the keys counted most across the nodes the new hot keys:
 *
 *   1. flush (ferry_flush): this node's hot deltas are applied at every
 *      replica, and on an EVENTUAL table its buffered deltas at the owners
 *   2. all-reduce of every node's hot_auto most counted (key, count): the
 *      sum over a world x hot_auto array, each node filling its own row.
 *      Every node is past step 1 once it returns, so every replica holds
 *      every hot delta; every node merges the same rows the same way
 *   3. a key that stops being hot: its home sets the replica's value in
 *      its slot (the sequential path); one that becomes hot: every node
 *      pulls its slot's value into the new replica (the sequential path)
 *   4. the new state replaces the old (frame numbers, acknowledgements and
 *      stats go on), after an RCU grace period; counts are halved
 *   5. barrier: no node pushes to a new hot key before every node has it;
 *      on an EVENTUAL table the barrier also drops every node's copies, so
 *      none read before the update (of a key that was hot since) is served
 *
 * So every push made before the call is in the value after it, once: a hot
 * key's replica holds every delta (1), a slot every sequential push (the
 * caller lets none be under way), and each value moves between the two
 * exactly once (3). A copy of an old HOT_PUSH frame that arrives after 4 is
 * below the receiver's number and only answered (hot.c checks the entries
 * of the frames it applies, after the number).
 *
 * Bound: transient, 16 x world x hot_auto bytes for step 2, and the new
 * state (hot.c's bound) beside the old one until 4.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cons/hot.h"
#include "lib/ops/ops.h"

/* rows of step 2 above this are refused: 64 MiB */
#define HOTAUTO_ROWS_MAX (64ull << 20)

struct hotauto_cand {
	uint64_t key, cnt;
};

static int cand_by_key(const void *a, const void *b)
{
	const struct hotauto_cand *x = a, *y = b;

	return x->key < y->key ? -1 : x->key > y->key;
}

static int cand_by_count(const void *a, const void *b)
{
	const struct hotauto_cand *x = a, *y = b;

	if (x->cnt != y->cnt)
		return x->cnt > y->cnt ? -1 : 1;
	return x->key < y->key ? -1 : x->key > y->key;
}

static int key_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* step 2: every node's rows, summed into @rows; the new hot keys into
 * @keys (ascending). Return: their number, or a negative errno */
static int hotauto_choose(struct ferry_table *t, struct ferry_hot_count *c, int64_t *rows,
			  uint64_t *keys)
{
	struct ferry *fy = t->fy;
	uint32_t k = c->max, m, n = 0, out = 0;
	uint64_t *mk = (uint64_t *)rows + (size_t)fy->rank * k * 2, *mc;
	struct hotauto_cand *cand;
	int rc;

	/* this node's row: keys + 1 (0: none) then counts */
	mc = mk + k;
	pthread_mutex_lock(&c->lock);
	m = ferry__topk_top(&c->s, k, mk, mc);
	pthread_mutex_unlock(&c->lock);
	for (uint32_t i = 0; i < m; i++)
		mk[i]++;
	rc = ferry_allreduce(fy, rows, rows, (size_t)fy->world * k * 2, FERRY_INT64, FERRY_SUM);
	if (rc) {
		ferry_err("hot_update: table %u: the nodes' counts did not meet (%s); the hot "
			  "keys are unchanged here",
			  t->id, ferry_strerror(rc));
		return rc;
	}
	cand = malloc((size_t)fy->world * k * sizeof(*cand));
	if (!cand) {
		ferry_err("hot_update: table %u: out of memory for %u nodes' candidates", t->id,
			  fy->world);
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < fy->world; r++) {
		const uint64_t *rk = (const uint64_t *)rows + (size_t)r * k * 2, *rc2 = rk + k;

		for (uint32_t i = 0; i < k && rk[i]; i++)
			if (rk[i] - 1 < t->params.num_keys && rc2[i]) /* a peer's row: checked */
				cand[n++] =
					(struct hotauto_cand){ .key = rk[i] - 1, .cnt = rc2[i] };
	}
	/* the same rows on every node: the same choice */
	qsort(cand, n, sizeof(*cand), cand_by_key);
	for (uint32_t i = 0; i < n; i++) {
		if (out && cand[out - 1].key == cand[i].key)
			cand[out - 1].cnt += cand[i].cnt;
		else
			cand[out++] = cand[i];
	}
	qsort(cand, out, sizeof(*cand), cand_by_count);
	if (out > k)
		out = k;
	for (uint32_t i = 0; i < out; i++)
		keys[i] = cand[i].key;
	free(cand);
	qsort(keys, out, sizeof(*keys), key_cmp);
	return (int)out;
}

/* step 3: the values move. @nh: the new state, its replicas at init */
static int hotauto_move(struct ferry_worker *w, struct ferry_hot *old, struct ferry_hot *nh)
{
	struct ferry_table *t = old->t;
	uint64_t *ks = malloc(((size_t)old->n + nh->n + 1) * sizeof(*ks));
	uint32_t nk = 0;
	int rc = 0;

	if (!ks)
		return -ENOMEM;
	/* stays hot: the replica goes on */
	for (uint32_t i = 0; i < nh->n; i++) {
		int64_t o = hot_index(old, nh->keys[i]);

		if (o >= 0)
			memcpy(nh->val + nh->offs[i], old->val + old->offs[o],
			       (nh->offs[i + 1] - nh->offs[i]) * sizeof(float));
	}
	/* no longer hot, homed here: the replica's value into the slot. One set
	 * per key: sets of several keys may need a buffer as large as theirs */
	for (uint32_t i = 0; i < old->n && !rc; i++) {
		uint64_t key = old->keys[i];

		if (hot_index(nh, key) >= 0 || ferry__home(t, key) != t->fy->rank)
			continue;
		rc = ferry__ops_sync(w, t, FERRY_OP_SET, &key, 1, old->val + old->offs[i], NULL,
				     NULL);
		if (rc)
			ferry_err("hot_update: table %u: key %llu stops being hot, and setting its "
				  "value failed (%s); it stays hot here",
				  t->id, (unsigned long long)key, ferry_strerror(rc));
	}
	/* newly hot: the slot's value into the replica */
	for (uint32_t i = 0; i < nh->n && !rc; i++)
		if (hot_index(old, nh->keys[i]) < 0)
			ks[nk++] = nh->keys[i];
	for (uint32_t i = 0, j = 0; i < nk && !rc; i++) {
		while (nh->keys[j] != ks[i])
			j++;
		rc = ferry__ops_sync(w, t, FERRY_OP_PULL, &ks[i], 1, NULL, nh->val + nh->offs[j],
				     NULL);
		if (rc)
			ferry_err("hot_update: table %u: key %llu becomes hot, and reading its "
				  "value failed (%s); the hot keys are unchanged here",
				  t->id, (unsigned long long)ks[i], ferry_strerror(rc));
	}
	free(ks);
	return rc;
}

/* step 4: @nh takes @old's place */
static void hotauto_swap(struct ferry_table *t, struct ferry_hot *old, struct ferry_hot *nh)
{
	struct ferry_cons_node *cn = t->fy->cons;
	uint32_t world = t->fy->world;

	ferry__hot_stop(t);
	pthread_mutex_lock(&old->lock);
	nh->last_seq = old->last_seq;
	nh->taken = nh->done = old->taken;
	nh->want = old->want;
	memcpy(nh->acked, old->acked, world * sizeof(*nh->acked));
	memcpy(nh->rx, old->rx, world * sizeof(*nh->rx));
	nh->st = old->st;
	nh->st.updates++;
	pthread_mutex_unlock(&old->lock);
	nh->inner = old->inner;
	nh->count = old->count;
	old->count = NULL;
	/* a barrier's flush reads t->hot under flush_lock */
	pthread_mutex_lock(&cn->flush_lock);
	/* the progress thread applies frames to t->hot, under RCU: between the
	 * store and the grace period it may apply a copy of an old frame to
	 * old, which changes nothing (its number is below rx) */
	__atomic_store_n((struct ferry_hot **)&t->hot, nh, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&cn->flush_lock);
	urcu_memb_synchronize_rcu();
	ferry__hot_free(old);
	pthread_mutex_lock(&nh->count->lock);
	ferry__topk_decay(&nh->count->s);
	pthread_mutex_unlock(&nh->count->lock);
}

int ferry_hot_update(struct ferry_worker *w, struct ferry_table *t)
{
	struct ferry_hot *h = t ? t->hot : NULL, *nh;
	struct ferry *fy;
	int64_t *rows;
	uint64_t *keys;
	size_t bytes;
	int n, rc;

	if (!h || !h->count) {
		ferry_err("hot_update: %s; create the table with hot_auto",
			  t ? "the table has no hot_auto" : "no table");
		return -EINVAL;
	}
	rc = ferry__cons_check_call(w, t, NULL, 0, NULL, "hot_update");
	if (rc)
		return rc;
	fy = t->fy;
	bytes = (size_t)fy->world * h->count->max * 2 * sizeof(*rows);
	if (bytes > HOTAUTO_ROWS_MAX) {
		ferry_err("hot_update: table %u: %u nodes x hot_auto %u need %zu bytes of counts, "
			  "above %llu; give a smaller hot_auto",
			  t->id, fy->world, h->count->max, bytes,
			  (unsigned long long)HOTAUTO_ROWS_MAX);
		return -EINVAL;
	}
	/* hot deltas, and on an EVENTUAL table the buffered ones too */
	rc = ferry_flush(w, t);
	if (rc)
		return rc;
	rows = calloc(1, bytes);
	keys = malloc(((size_t)h->count->max + 1) * sizeof(*keys));
	if (!rows || !keys) {
		free(rows);
		free(keys);
		ferry_err("hot_update: table %u: out of memory for %zu bytes of counts", t->id,
			  bytes);
		return -ENOMEM;
	}
	n = hotauto_choose(t, h->count, rows, keys);
	free(rows);
	if (n < 0) {
		free(keys);
		return n;
	}
	nh = ferry__hot_new(t, keys, (uint32_t)n);
	free(keys);
	if (!nh) {
		ferry_err("hot_update: table %u: out of memory for %d hot keys' replicas", t->id,
			  n);
		return -ENOMEM;
	}
	rc = hotauto_move(w, h, nh);
	if (rc) {
		ferry__hot_free(nh);
		return rc;
	}
	hotauto_swap(t, h, nh);
	rc = ferry__hot_table_publish(t);
	if (!rc)
		rc = ferry_barrier(fy);
	return rc;
}

int ferry_hot_keys(struct ferry_table *t, uint64_t *keys, uint32_t cap)
{
	struct ferry_hot *h;
	uint32_t n;

	if (!t || (!keys && cap)) {
		ferry_err("hot_keys: %s", t ? "keys is NULL with cap > 0" : "no table");
		return -EINVAL;
	}
	h = t->hot;
	if (!h)
		return 0;
	n = h->n;
	if (cap)
		memcpy(keys, h->keys, (cap < n ? cap : n) * sizeof(*keys));
	return (int)n;
}

/* SPDX-License-Identifier: MIT */
/*
 * test_dir.c - the directory under RCU, and the home lookups users see.
 *
 * The own-slot table (struct ferry_slot **own) is published with
 * rcu_assign_pointer() and the entries it drops are freed with call_rcu():
 * the first test runs that pattern with a publisher that swaps entries as
 * fast as it can and poisons what it frees, against readers that must never
 * see a poisoned entry. The others go through the public API.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <urcu/urcu-memb.h>

#include "common/cluster.h"
#include "ferry/ferry.h"

/* ---- the RCU publication pattern ------------------------------------------ */

#define ENTRY_LIVE 0x4c495645u /* "LIVE" */
#define ENTRY_DEAD 0xdeadu

struct entry {
	uint32_t magic;
	uint32_t slot;	     /* which array index it was made for */
	uint64_t serial;     /* increasing per publication */
	uint32_t payload[8]; /* all equal to the low bits of serial */
	uint32_t magic2;
	struct rcu_head rcu;
};

#define NENTRIES 64

struct pub_ctx {
	struct entry *arr[NENTRIES]; /* RCU-protected */
	long reads_per_reader;
	long min_newer;		  /* keep reading until this many new entries were seen */
	struct timespec deadline; /* ... or until then */
	int stop;		  /* atomic */
	uint64_t swaps;		  /* publisher */
	uint64_t freed;		  /* atomic, by the call_rcu callbacks */
};

static struct pub_ctx *g_pub; /* for the callback */

static void entry_free_rcu(struct rcu_head *head)
{
	struct entry *e = caa_container_of(head, struct entry, rcu);

	/* poison, so a reader that still looks sees it (ASan builds also
	 * catch the use after free itself) */
	e->magic = ENTRY_DEAD;
	e->magic2 = ENTRY_DEAD;
	for (int i = 0; i < 8; i++)
		e->payload[i] = ENTRY_DEAD;
	__atomic_fetch_add(&g_pub->freed, 1, __ATOMIC_RELAXED);
	free(e);
}

static struct entry *entry_new(uint32_t slot, uint64_t serial)
{
	struct entry *e = malloc(sizeof(*e));

	if (!e)
		abort(); /* called on the publisher thread too: no cr_assert there */
	e->magic = ENTRY_LIVE;
	e->slot = slot;
	e->serial = serial;
	for (int i = 0; i < 8; i++)
		e->payload[i] = (uint32_t)serial;
	e->magic2 = ENTRY_LIVE;
	return e;
}

static void *rcu_entry_publisher(void *p)
{
	struct pub_ctx *c = p;
	uint64_t serial = NENTRIES;

	urcu_memb_register_thread();
	while (!__atomic_load_n(&c->stop, __ATOMIC_RELAXED)) {
		uint32_t i = (uint32_t)(serial % NENTRIES);
		struct entry *old = c->arr[i]; /* the only writer: plain load */
		struct entry *e = entry_new(i, ++serial);

		rcu_assign_pointer(c->arr[i], e);
		urcu_memb_call_rcu(&old->rcu, entry_free_rcu);
		c->swaps++;
		/* bound the memory waiting for grace periods */
		if (c->swaps - __atomic_load_n(&c->freed, __ATOMIC_RELAXED) > 200000)
			urcu_memb_barrier();
	}
	urcu_memb_unregister_thread();
	return NULL;
}

static int past(const struct timespec *t)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

struct reader_res {
	struct pub_ctx *c;
	long poisoned, wrong_slot, torn, newer;
};

static void *rcu_entry_reader(void *p)
{
	struct reader_res *r = p;
	struct pub_ctx *c = r->c;
	uint64_t seen[NENTRIES] = { 0 };

	urcu_memb_register_thread();
	/* on a loaded machine the publisher may seldom run beside a reader:
	 * read on until enough publications were seen (bounded by the deadline) */
	for (long n = 0; n < c->reads_per_reader || r->newer < c->min_newer; n++) {
		uint32_t i = (uint32_t)(n % NENTRIES);
		struct entry *e;

		if (n >= c->reads_per_reader && (n & 1023) == 0 && past(&c->deadline))
			break;

		urcu_memb_read_lock();
		e = rcu_dereference(c->arr[i]);
		if (e->magic != ENTRY_LIVE)
			r->poisoned++;
		if (e->slot != i)
			r->wrong_slot++;
		for (int j = 0; j < 8; j++)
			if (e->payload[j] != (uint32_t)e->serial) {
				r->torn++;
				break;
			}
		/* read it again at the end of the section: still not freed */
		if (__atomic_load_n(&e->magic2, __ATOMIC_RELAXED) != ENTRY_LIVE ||
		    __atomic_load_n(&e->magic, __ATOMIC_RELAXED) != ENTRY_LIVE)
			r->poisoned++;
		if (e->serial > seen[i])
			r->newer++;
		seen[i] = e->serial;
		urcu_memb_read_unlock();
	}
	urcu_memb_unregister_thread();
	return NULL;
}

#define NREADERS 2
Test(dir, rcu_readers_never_see_an_entry_freed_by_call_rcu, .timeout = 60)
{
	struct pub_ctx *c = calloc(1, sizeof(*c));
	struct reader_res r[NREADERS];
	pthread_t pt, rt[NREADERS];
	long newer = 0;

	cr_assert_not_null(c);
	g_pub = c;
	urcu_memb_register_thread();
	for (uint32_t i = 0; i < NENTRIES; i++)
		c->arr[i] = entry_new(i, i);
	c->reads_per_reader = 3000000;
	c->min_newer = 20000;
	clock_gettime(CLOCK_MONOTONIC, &c->deadline);
	c->deadline.tv_sec += 4;

	cr_assert_eq(pthread_create(&pt, NULL, rcu_entry_publisher, c), 0);
	for (int i = 0; i < NREADERS; i++) {
		r[i] = (struct reader_res){ .c = c };
		cr_assert_eq(pthread_create(&rt[i], NULL, rcu_entry_reader, &r[i]), 0);
	}
	for (int i = 0; i < NREADERS; i++)
		pthread_join(rt[i], NULL);
	__atomic_store_n(&c->stop, 1, __ATOMIC_RELAXED);
	pthread_join(pt, NULL);

	for (int i = 0; i < NREADERS; i++) {
		cr_assert_eq(r[i].poisoned, 0, "reader %d saw %ld freed entries", i, r[i].poisoned);
		cr_assert_eq(r[i].wrong_slot, 0, "reader %d saw %ld entries of another index", i,
			     r[i].wrong_slot);
		cr_assert_eq(r[i].torn, 0, "reader %d saw %ld half-initialised entries", i,
			     r[i].torn);
		newer += r[i].newer;
	}
	cr_assert_gt(c->swaps, 0, "the publisher never ran");
	cr_assert_gt(newer, 0, "the readers never saw a new entry (%llu swaps)",
		     (unsigned long long)c->swaps);

	/* every deferred free runs once the callbacks are flushed */
	urcu_memb_barrier();
	cr_assert_eq(__atomic_load_n(&c->freed, __ATOMIC_RELAXED), c->swaps,
		     "%llu entries freed for %llu swaps",
		     (unsigned long long)__atomic_load_n(&c->freed, __ATOMIC_RELAXED),
		     (unsigned long long)c->swaps);
	cr_log_info("%llu swaps, %ld new entries seen by the readers", (unsigned long long)c->swaps,
		    newer);
	for (uint32_t i = 0; i < NENTRIES; i++)
		free(c->arr[i]);
	urcu_memb_unregister_thread();
	free(c);
}

/* call_rcu waits for a reader already inside its section */
struct slow_reader {
	struct entry *e;
	int entered, leave; /* atomic */
	uint32_t magic_at_exit;
};

static void *slow_reader_thread(void *p)
{
	struct slow_reader *s = p;

	urcu_memb_register_thread();
	urcu_memb_read_lock();
	__atomic_store_n(&s->entered, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&s->leave, __ATOMIC_ACQUIRE))
		sched_yield();
	s->magic_at_exit = __atomic_load_n(&s->e->magic, __ATOMIC_RELAXED);
	urcu_memb_read_unlock();
	urcu_memb_unregister_thread();
	return NULL;
}

Test(dir, call_rcu_waits_for_a_reader_inside_its_section)
{
	struct pub_ctx *c = calloc(1, sizeof(*c));
	struct slow_reader s = { 0 };
	struct timespec ts = { 0, 2000000 };
	pthread_t th;

	cr_assert_not_null(c);
	g_pub = c;
	urcu_memb_register_thread();
	s.e = entry_new(0, 1);
	cr_assert_eq(pthread_create(&th, NULL, slow_reader_thread, &s), 0);
	while (!__atomic_load_n(&s.entered, __ATOMIC_ACQUIRE))
		sched_yield();
	urcu_memb_call_rcu(&s.e->rcu, entry_free_rcu);
	for (int i = 0; i < 50; i++) {
		nanosleep(&ts, NULL);
		cr_assert_eq(__atomic_load_n(&c->freed, __ATOMIC_RELAXED), 0,
			     "freed while a reader was inside its read-side section");
	}
	__atomic_store_n(&s.leave, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	cr_assert_eq(s.magic_at_exit, ENTRY_LIVE);
	urcu_memb_barrier();
	cr_assert_eq(__atomic_load_n(&c->freed, __ATOMIC_RELAXED), 1);
	urcu_memb_unregister_thread();
	free(c);
}

/* ---- home lookups through the public API ------------------------------------ */

static void table_params(struct ferry_table_params *tp, uint64_t n, enum ferry_placement pl)
{
	memset(tp, 0, sizeof(*tp));
	tp->num_keys = n;
	tp->value_len = 4;
	tp->placement = pl;
	tp->mode = FERRY_MODE_CLASSIC;
}

Test(dir, one_node_is_home_of_every_key_and_refuses_keys_out_of_range, .timeout = 60)
{
	struct ferry_table_params tp;
	struct ferry_params p;
	struct ferry_table *t = NULL;
	struct ferry *fy[1] = { NULL };
	int rc;

	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL);
	ferry_params_init(&p);
	p.transport = FERRY_TRANSPORT_TCP;
	p.timeout_ms = 20000;
	rc = ferry_local_cluster_open(1, &p, fy);
	cr_assert_eq(rc, 0, "local cluster of 1: %s", ferry_strerror(rc));
	table_params(&tp, 1000, FERRY_PLACEMENT_RANGE);
	rc = ferry_table_create(fy[0], &tp, &t);
	cr_assert_eq(rc, 0, "table: %s", ferry_strerror(rc));

	for (uint64_t k = 0; k < 1000; k++)
		cr_assert_eq(ferry_table_home(t, k), 0, "key %llu: home %d", (unsigned long long)k,
			     ferry_table_home(t, k));
	cr_assert_eq(ferry_table_home(t, 1000), -ERANGE);
	cr_assert_eq(ferry_table_home(t, 1001), -ERANGE);
	cr_assert_eq(ferry_table_home(t, UINT64_MAX), -ERANGE);
	cr_assert_eq(ferry_table_home(NULL, 0), -EINVAL);
	cr_assert_eq(ferry_table_value_len(t, 999), 4);
	cr_assert_eq(ferry_table_value_len(t, 1000), 0);

	ferry_table_destroy(t);
	ferry_close(fy[0]);
}

#define HOME_NODES 3
#define HOME_KEYS 1000
Test(dir, every_node_agrees_on_homes_range_and_hash, .timeout = 60)
{
	struct ferry_table_params tp;
	struct tc c;
	int rc;

	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL); /* peers closing at the end warn */
	/* range: node r holds the r-th of HOME_NODES blocks of 333 or 334 keys */
	table_params(&tp, HOME_KEYS, FERRY_PLACEMENT_RANGE);
	rc = tc_open(&c, HOME_NODES, &tp, 20000);
	cr_assert_eq(rc, 0, "cluster: %s", ferry_strerror(rc));
	{
		int count[HOME_NODES] = { 0 }, prev = 0;

		for (uint64_t k = 0; k < HOME_KEYS; k++) {
			int h = ferry_table_home(c.t[0], k);

			cr_assert(h >= 0 && h < HOME_NODES, "key %llu: home %d",
				  (unsigned long long)k, h);
			cr_assert_geq(h, prev, "range homes not in rank order at key %llu",
				      (unsigned long long)k);
			prev = h;
			count[h]++;
			for (int r = 1; r < HOME_NODES; r++)
				cr_assert_eq(ferry_table_home(c.t[r], k), h,
					     "rank %d says key %llu is on %d, rank 0 says %d", r,
					     (unsigned long long)k, ferry_table_home(c.t[r], k), h);
		}
		for (int r = 0; r < HOME_NODES; r++)
			cr_assert(count[r] == HOME_KEYS / HOME_NODES ||
					  count[r] == HOME_KEYS / HOME_NODES + 1,
				  "rank %d is home of %d keys", r, count[r]);
		for (int r = 0; r < HOME_NODES; r++)
			cr_assert_eq(ferry_table_home(c.t[r], HOME_KEYS), -ERANGE);
	}
	tc_close(&c);

	/* hash: every node resolves the ring the same way, and uses all nodes */
	table_params(&tp, HOME_KEYS, FERRY_PLACEMENT_HASH);
	rc = tc_open(&c, HOME_NODES, &tp, 20000);
	cr_assert_eq(rc, 0, "cluster: %s", ferry_strerror(rc));
	{
		int count[HOME_NODES] = { 0 };

		for (uint64_t k = 0; k < HOME_KEYS; k++) {
			int h = ferry_table_home(c.t[0], k);

			cr_assert(h >= 0 && h < HOME_NODES, "key %llu: home %d",
				  (unsigned long long)k, h);
			count[h]++;
			for (int r = 1; r < HOME_NODES; r++)
				cr_assert_eq(ferry_table_home(c.t[r], k), h,
					     "hash: rank %d and rank 0 disagree on key %llu", r,
					     (unsigned long long)k);
		}
		for (int r = 0; r < HOME_NODES; r++)
			cr_assert_gt(count[r], HOME_KEYS / HOME_NODES / 2,
				     "hash: rank %d is home of %d keys", r, count[r]);
		cr_assert_eq(ferry_table_home(c.t[1], UINT64_MAX), -ERANGE);
	}
	tc_close(&c);
}

/* SPDX-License-Identifier: MIT */
/*
 * test_store.c - the slot store: seqlocked slots and their arena.
 *
 * What the core relies on: a reader never copies half of one write and half
 * of another; a slot that moved away or holds another key says -EAGAIN on
 * both paths; a freed slot comes back only after a grace period and with a
 * new epoch, so a reader still holding the old pointer notices.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <urcu/urcu-memb.h>

#include "lib/store/store.h"

/* a fresh arena and one LIVE slot holding @key with @len floats */
static struct ferry_slot *live_slot(struct ferry_arena *a, uint32_t capacity, uint32_t len,
				    uint64_t key)
{
	struct ferry_slot *s;
	uint32_t idx;
	int rc;

	rc = ferry__arena_init(a, capacity, len);
	cr_assert_eq(rc, 0, "arena_init: %d", rc);
	rc = ferry__arena_alloc(a, &idx);
	cr_assert_eq(rc, 0, "arena_alloc: %d", rc);
	s = ferry__arena_slot(a, idx);
	cr_assert_eq(s->state, FERRY_SLOT_INCOMING, "a fresh slot is not INCOMING");
	s->key = key;
	s->len = len;
	s->state = FERRY_SLOT_LIVE;
	return s;
}

static uint64_t head_version(const struct ferry_slot *s)
{
	return __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
}

static uint64_t tail_version(const struct ferry_arena *a, struct ferry_slot *s)
{
	return __atomic_load_n(ferry__slot_tail(a, s), __ATOMIC_ACQUIRE);
}

/* ---- layout ------------------------------------------------------------ */

Test(store, stride_is_a_multiple_of_64_and_holds_value_and_tail)
{
	static const uint32_t lens[] = { 1, 2, 3, 4, 7, 8, 16, 64, 1000, 1024 };

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		struct ferry_arena a;
		size_t need = FERRY_SLOT_HDR + lens[i] * sizeof(float) + sizeof(uint64_t);

		cr_assert_eq(ferry__arena_init(&a, 4, lens[i]), 0);
		cr_assert_eq(a.stride % 64, 0, "len %u: stride %zu", lens[i], a.stride);
		cr_assert_geq(a.stride, need, "len %u: stride %zu < %zu", lens[i], a.stride, need);
		cr_assert_lt(a.stride, need + 64, "len %u: stride %zu wastes a line", lens[i],
			     a.stride);
		/* slots and their tails do not overlap the next slot */
		cr_assert_eq((uint8_t *)ferry__arena_slot(&a, 1) -
				     (uint8_t *)ferry__arena_slot(&a, 0),
			     (ptrdiff_t)a.stride);
		cr_assert_eq(ferry__arena_idx(&a, ferry__arena_slot(&a, 3)), 3);
		ferry__arena_fini(&a);
	}
	cr_assert_eq(FERRY_SLOT_HDR, 32, "the header is documented as 32 bytes");
}

Test(store, update_publishes_equal_even_head_and_tail)
{
	struct ferry_arena a;
	struct ferry_slot *s = live_slot(&a, 2, 5, 42);
	float in[5] = { 1, 2, 3, 4, 5 }, out[5];
	uint64_t v0 = head_version(s);

	cr_assert_eq(v0 % 2, 0);
	for (int i = 1; i <= 3; i++) {
		cr_assert_eq(ferry__slot_update(&a, s, 42, in, 5, 0), 0);
		cr_assert_eq(head_version(s), v0 + 2 * (uint64_t)i, "update %d: version %llu", i,
			     (unsigned long long)head_version(s));
		cr_assert_eq(tail_version(&a, s), head_version(s), "update %d: tail %llu head %llu",
			     i, (unsigned long long)tail_version(&a, s),
			     (unsigned long long)head_version(s));
	}
	cr_assert_eq(ferry__slot_read(s, 42, out, 5), 0);
	cr_assert_arr_eq(out, in, sizeof(in));
	ferry__arena_fini(&a);
}

/* ---- set, push, -EAGAIN -------------------------------------------------- */

Test(store, set_then_push_adds)
{
	struct ferry_arena a;
	struct ferry_slot *s = live_slot(&a, 1, 4, 7);
	const float set[4] = { 1.0f, -2.0f, 0.5f, 100.0f };
	const float d1[4] = { 0.25f, 2.0f, 0.5f, -100.0f };
	const float d2[4] = { 1.0f, 1.0f, 1.0f, 1.0f };
	const float want1[4] = { 1.25f, 0.0f, 1.0f, 0.0f };
	const float want2[4] = { 2.25f, 1.0f, 2.0f, 1.0f };
	float out[4];

	/* values start at zero */
	cr_assert_eq(ferry__slot_read(s, 7, out, 4), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(out[i], 0.0f, "fresh slot val[%d] = %g", i, out[i]);

	cr_assert_eq(ferry__slot_update(&a, s, 7, set, 4, 0), 0);
	cr_assert_eq(ferry__slot_read(s, 7, out, 4), 0);
	cr_assert_arr_eq(out, set, sizeof(set), "set did not replace the value");

	cr_assert_eq(ferry__slot_update(&a, s, 7, d1, 4, 1), 0);
	cr_assert_eq(ferry__slot_read(s, 7, out, 4), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(out[i], want1[i], "push 1: val[%d] = %g, want %g", i, out[i],
			     want1[i]);

	cr_assert_eq(ferry__slot_update(&a, s, 7, d2, 4, 1), 0);
	cr_assert_eq(ferry__slot_read(s, 7, out, 4), 0);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(out[i], want2[i], "push 2: val[%d] = %g, want %g", i, out[i],
			     want2[i]);

	/* set after push replaces, it does not add */
	cr_assert_eq(ferry__slot_update(&a, s, 7, set, 4, 0), 0);
	cr_assert_eq(ferry__slot_read(s, 7, out, 4), 0);
	cr_assert_arr_eq(out, set, sizeof(set));
	ferry__arena_fini(&a);
}

/* read and update of @key on @s must say -EAGAIN and change nothing */
static void expect_eagain(struct ferry_arena *a, struct ferry_slot *s, uint64_t key,
			  const char *what)
{
	const float in[3] = { 9, 9, 9 };
	float before[3], out[3] = { -1, -1, -1 };
	uint64_t v = head_version(s);

	memcpy(before, s->val, sizeof(before));
	cr_assert_eq(ferry__slot_read(s, key, out, 3), -EAGAIN, "%s: read did not say -EAGAIN",
		     what);
	cr_assert_eq(ferry__slot_update(a, s, key, in, 3, 0), -EAGAIN,
		     "%s: set did not say -EAGAIN", what);
	cr_assert_eq(ferry__slot_update(a, s, key, in, 3, 1), -EAGAIN,
		     "%s: push did not say -EAGAIN", what);
	cr_assert_arr_eq(s->val, before, sizeof(before), "%s: a refused update wrote", what);
	cr_assert_eq(head_version(s), v, "%s: a refused update moved the version %llu -> %llu",
		     what, (unsigned long long)v, (unsigned long long)head_version(s));
	cr_assert_eq(head_version(s) % 2, 0, "%s: the slot was left locked", what);
}

Test(store, moved_freed_or_other_key_says_eagain)
{
	struct ferry_arena a;
	struct ferry_slot *s = live_slot(&a, 1, 3, 11);
	const float val[3] = { 1, 2, 3 };
	float out[3];

	cr_assert_eq(ferry__slot_update(&a, s, 11, val, 3, 0), 0);

	expect_eagain(&a, s, 12, "other key");
	expect_eagain(&a, s, 11ull | (1ull << 40), "key differing in high bits");

	s->state = FERRY_SLOT_MOVED;
	expect_eagain(&a, s, 11, "MOVED");
	s->state = FERRY_SLOT_INCOMING;
	expect_eagain(&a, s, 11, "INCOMING");
	s->state = FERRY_SLOT_FREE;
	expect_eagain(&a, s, 11, "FREE");

	/* back to LIVE: the value survived every refusal */
	s->state = FERRY_SLOT_LIVE;
	cr_assert_eq(ferry__slot_read(s, 11, out, 3), 0);
	cr_assert_arr_eq(out, val, sizeof(val));
	cr_assert_eq(ferry__slot_update(&a, s, 11, val, 3, 1), 0);
	cr_assert_eq(ferry__slot_read(s, 11, out, 3), 0);
	cr_assert_eq(out[2], 6.0f);
	ferry__arena_fini(&a);
}

/* ---- concurrent reads never torn ---------------------------------------- */

/*
 * The writer stores a counter's bits into every float of the value (set, so
 * the bits travel unchanged); a reader's copy is torn when two elements
 * differ. Each reader also checks that the counter never goes backwards and
 * that it sees it move.
 */
struct torn_ctx {
	struct ferry_arena *a;
	struct ferry_slot *s;
	uint64_t key;
	uint32_t len;
	long reads_per_reader;
	long min_changes;	  /* keep reading until this many changes were seen */
	struct timespec deadline; /* ... or until then */
	int stop;		  /* atomic */
	uint64_t writes;
};

struct torn_reader {
	struct torn_ctx *c;
	long reads, torn, backwards, eagain, distinct;
	uint32_t first, last;
};

static int past(const struct timespec *t)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

static void *torn_writer(void *p)
{
	struct torn_ctx *c = p;
	uint32_t *buf = malloc(c->len * sizeof(uint32_t));
	uint32_t n = 0;

	if (!buf)
		abort(); /* no cr_assert off the test's thread */
	urcu_memb_register_thread();
	while (!__atomic_load_n(&c->stop, __ATOMIC_RELAXED)) {
		n++;
		for (uint32_t i = 0; i < c->len; i++)
			buf[i] = n;
		urcu_memb_read_lock();
		if (ferry__slot_update(c->a, c->s, c->key, (const float *)buf, c->len, 0))
			abort(); /* the slot is LIVE with this key throughout */
		urcu_memb_read_unlock();
	}
	c->writes = n;
	urcu_memb_unregister_thread();
	free(buf);
	return NULL;
}

static void *torn_read(void *p)
{
	struct torn_reader *r = p;
	struct torn_ctx *c = r->c;
	uint32_t *out = malloc(c->len * sizeof(uint32_t));

	if (!out)
		abort();
	urcu_memb_register_thread();
	/*
	 * On a loaded machine the writer and a reader may seldom run at the
	 * same time: read on past the quota until the value has changed often
	 * enough under this reader (bounded by the deadline).
	 */
	for (long i = 0; i < c->reads_per_reader || r->distinct < c->min_changes; i++) {
		int rc;

		if (i >= c->reads_per_reader && (i & 1023) == 0 && past(&c->deadline))
			break;
		r->reads++;

		urcu_memb_read_lock();
		rc = ferry__slot_read(c->s, c->key, (float *)out, c->len);
		urcu_memb_read_unlock();
		if (rc) {
			r->eagain++;
			continue;
		}
		for (uint32_t j = 1; j < c->len; j++)
			if (out[j] != out[0]) {
				r->torn++;
				break;
			}
		if (i == 0)
			r->first = r->last = out[0];
		if (out[0] < r->last)
			r->backwards++;
		if (out[0] != r->last)
			r->distinct++;
		r->last = out[0];
	}
	urcu_memb_unregister_thread();
	free(out);
	return NULL;
}

static void run_torn(uint32_t len, int nreaders, long total_reads)
{
	struct ferry_arena a;
	struct torn_ctx c = { 0 };
	struct torn_reader r[2] = { 0 };
	pthread_t wt, rt[2];
	long torn = 0, distinct = 0, reads = 0;

	cr_assert_leq(nreaders, 2);
	c.a = &a;
	c.s = live_slot(&a, 1, len, 1234567);
	c.key = 1234567;
	c.len = len;
	c.reads_per_reader = total_reads / nreaders;
	c.min_changes = 5000;
	clock_gettime(CLOCK_MONOTONIC, &c.deadline);
	c.deadline.tv_sec += 4;

	cr_assert_eq(pthread_create(&wt, NULL, torn_writer, &c), 0);
	/* let the writer get going so readers race with it from the start */
	while (__atomic_load_n(&c.s->version, __ATOMIC_RELAXED) < 200)
		sched_yield();
	for (int i = 0; i < nreaders; i++) {
		r[i].c = &c;
		cr_assert_eq(pthread_create(&rt[i], NULL, torn_read, &r[i]), 0);
	}
	for (int i = 0; i < nreaders; i++)
		pthread_join(rt[i], NULL);
	__atomic_store_n(&c.stop, 1, __ATOMIC_RELAXED);
	pthread_join(wt, NULL);

	for (int i = 0; i < nreaders; i++) {
		cr_assert_eq(r[i].eagain, 0, "reader %d: %ld reads said -EAGAIN on a live slot", i,
			     r[i].eagain);
		cr_assert_eq(r[i].backwards, 0, "reader %d: the value went backwards %ld times", i,
			     r[i].backwards);
		cr_assert_gt(
			r[i].last, r[i].first,
			"reader %d saw no progress: first %u last %u (writer made %llu writes)", i,
			r[i].first, r[i].last, (unsigned long long)c.writes);
		cr_assert_geq(r[i].reads, c.reads_per_reader);
		torn += r[i].torn;
		distinct += r[i].distinct;
		reads += r[i].reads;
	}
	cr_assert_eq(torn, 0, "%ld of %ld reads of %u floats were torn", torn, reads, len);
	cr_log_info("len %u: %ld reads, %ld value changes seen, %llu writes", len, reads, distinct,
		    (unsigned long long)c.writes);
	/* quiescent: the last write left head == tail, even, one step per write */
	cr_assert_eq(head_version(c.s), tail_version(&a, c.s));
	cr_assert_eq(head_version(c.s), 2 * c.writes, "version %llu after %llu writes",
		     (unsigned long long)head_version(c.s), (unsigned long long)c.writes);
	ferry__arena_fini(&a);
}

Test(store, read_under_writer_never_torn_64_floats, .timeout = 60)
{
	run_torn(64, 2, 1000000);
}

Test(store, read_under_writer_never_torn_1024_floats, .timeout = 60)
{
	run_torn(1024, 2, 1000000);
}

Test(store, read_under_writer_never_torn_one_reader, .timeout = 60)
{
	run_torn(61, 1, 1000000);
}

/* ---- arena --------------------------------------------------------------- */

#define CAP 8
Test(store, alloc_until_enospc_then_free_reuses_with_new_epoch)
{
	struct ferry_arena a;
	uint32_t idx[CAP], again, extra;
	int seen[CAP] = { 0 };
	uint32_t epoch;

	cr_assert_eq(ferry__arena_init(&a, CAP, 4), 0);
	cr_assert_eq(ferry__arena_avail(&a), CAP);
	for (uint32_t i = 0; i < CAP; i++) {
		cr_assert_eq(ferry__arena_alloc(&a, &idx[i]), 0, "alloc %u of %u failed", i, CAP);
		cr_assert_lt(idx[i], CAP);
		cr_assert_eq(seen[idx[i]]++, 0, "slot %u handed out twice", idx[i]);
		cr_assert_eq(ferry__arena_slot(&a, idx[i])->state, FERRY_SLOT_INCOMING);
		cr_assert_eq(ferry__arena_avail(&a), CAP - i - 1);
	}
	extra = 0xdeadbeef;
	cr_assert_eq(ferry__arena_alloc(&a, &extra), -ENOSPC);
	cr_assert_eq(extra, 0xdeadbeef, "idx_p written on failure");
	cr_assert_eq(ferry__arena_avail(&a), 0);

	epoch = ferry__arena_slot(&a, idx[3])->epoch;
	ferry__arena_free(&a, idx[3]);
	cr_assert_eq(ferry__arena_slot(&a, idx[3])->state, FERRY_SLOT_FREE);
	cr_assert_eq(ferry__arena_avail(&a), 1);
	cr_assert_eq(ferry__arena_alloc(&a, &again), 0);
	cr_assert_eq(again, idx[3], "got slot %u back instead of the freed %u", again, idx[3]);
	cr_assert_neq(ferry__arena_slot(&a, again)->epoch, epoch, "reused slot kept its epoch");
	cr_assert_eq(ferry__arena_slot(&a, again)->state, FERRY_SLOT_INCOMING);
	cr_assert_eq(ferry__arena_alloc(&a, &extra), -ENOSPC);

	/* several frees come back, each once */
	ferry__arena_free(&a, idx[0]);
	ferry__arena_free(&a, idx[7]);
	cr_assert_eq(ferry__arena_avail(&a), 2);
	memset(seen, 0, sizeof(seen));
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(ferry__arena_alloc(&a, &again), 0);
		cr_assert(again == idx[0] || again == idx[7], "slot %u was not freed", again);
		cr_assert_eq(seen[again]++, 0, "slot %u handed out twice", again);
	}
	cr_assert_eq(ferry__arena_alloc(&a, &extra), -ENOSPC);
	ferry__arena_fini(&a);
}
#undef CAP

Test(store, zero_capacity_arena_has_nothing_to_give)
{
	struct ferry_arena a;
	uint32_t idx;

	cr_assert_eq(ferry__arena_init(&a, 0, 4), 0);
	cr_assert_eq(ferry__arena_avail(&a), 0);
	cr_assert_eq(ferry__arena_alloc(&a, &idx), -ENOSPC);
	ferry__arena_fini(&a);
}

/* an RCU reader that holds its read-side section until told to leave */
struct holder {
	struct ferry_slot *s;
	uint64_t key;
	int entered, leave; /* atomic */
	int rc_before, rc_after;
	uint32_t epoch_seen;
};

static void *holder_thread(void *p)
{
	struct holder *h = p;
	float v[2];

	urcu_memb_register_thread();
	urcu_memb_read_lock();
	h->rc_before = ferry__slot_read(h->s, h->key, v, 2);
	h->epoch_seen = h->s->epoch;
	__atomic_store_n(&h->entered, 1, __ATOMIC_RELEASE);
	while (!__atomic_load_n(&h->leave, __ATOMIC_ACQUIRE))
		usleep(1000);
	/* the slot was unpublished and freed (deferred) meanwhile: still
	 * mapped, not reused, and it says so */
	h->rc_after = ferry__slot_read(h->s, h->key, v, 2);
	urcu_memb_read_unlock();
	urcu_memb_unregister_thread();
	return NULL;
}

#define CAP 4
Test(store, deferred_free_waits_for_a_grace_period)
{
	struct ferry_arena a;
	struct holder h = { 0 };
	struct ferry_slot *s;
	pthread_t th;
	uint32_t idx[CAP], again;
	uint32_t epoch;

	urcu_memb_register_thread();
	cr_assert_eq(ferry__arena_init(&a, CAP, 2), 0);
	for (int i = 0; i < CAP; i++)
		cr_assert_eq(ferry__arena_alloc(&a, &idx[i]), 0);
	s = ferry__arena_slot(&a, idx[1]);
	s->key = 77;
	s->len = 2;
	s->state = FERRY_SLOT_LIVE;
	epoch = s->epoch;

	h.s = s;
	h.key = 77;
	cr_assert_eq(pthread_create(&th, NULL, holder_thread, &h), 0);
	while (!__atomic_load_n(&h.entered, __ATOMIC_ACQUIRE))
		usleep(1000);
	cr_assert_eq(h.rc_before, 0);

	/* what the core does when a key leaves: MOVED under the lock, then free */
	{
		uint64_t v = ferry__slot_lock(&a, s);

		s->state = FERRY_SLOT_MOVED;
		ferry__slot_unlock(&a, s, v);
	}
	ferry__arena_free_deferred(&a, idx[1]);
	cr_assert_eq(__atomic_load_n(&a.ndeferred, __ATOMIC_RELAXED), 1);

	/* the reader is still inside: the slot must not come back */
	for (int i = 0; i < 50; i++) {
		cr_assert_eq(ferry__arena_avail(&a), 0,
			     "slot freed while a reader is in its read-side section");
		usleep(2000);
	}
	cr_assert_eq(ferry__arena_alloc(&a, &again), -ENOSPC);
	cr_assert_eq(s->state, FERRY_SLOT_MOVED, "slot recycled under a reader");
	cr_assert_eq(s->epoch, epoch);

	__atomic_store_n(&h.leave, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	cr_assert_eq(h.rc_after, -EAGAIN, "stale reader of a MOVED slot got %d", h.rc_after);
	cr_assert_eq(h.epoch_seen, epoch);

	urcu_memb_barrier(); /* run every callback queued so far */
	cr_assert_eq(__atomic_load_n(&a.ndeferred, __ATOMIC_RELAXED), 0);
	cr_assert_eq(ferry__arena_avail(&a), 1);
	cr_assert_eq(ferry__arena_alloc(&a, &again), 0);
	cr_assert_eq(again, idx[1]);
	cr_assert_neq(ferry__arena_slot(&a, again)->epoch, epoch,
		      "slot came back from a deferred free with its old epoch");
	cr_assert_eq(ferry__arena_avail(&a), 0);
	ferry__arena_fini(&a);
	urcu_memb_unregister_thread();
}
#undef CAP

#define CAP 64
Test(store, reclaim_returns_every_deferred_slot)
{
	struct ferry_arena a;
	uint32_t idx[CAP];
	int freed[CAP] = { 0 };

	urcu_memb_register_thread();
	cr_assert_eq(ferry__arena_init(&a, CAP, 8), 0);
	for (int i = 0; i < CAP; i++)
		cr_assert_eq(ferry__arena_alloc(&a, &idx[i]), 0);
	cr_assert_eq(ferry__arena_avail(&a), 0);
	for (int i = 0; i < CAP; i += 2) {
		ferry__arena_free_deferred(&a, idx[i]);
		freed[idx[i]] = 1;
	}
	ferry__arena_free(&a, idx[1]); /* an immediate one counts at once */
	freed[idx[1]] = 1;
	ferry__arena_reclaim(&a);
	cr_assert_eq(__atomic_load_n(&a.ndeferred, __ATOMIC_RELAXED), 0);
	cr_assert_eq(ferry__arena_avail(&a), CAP / 2 + 1);
	for (int i = 0; i < CAP / 2 + 1; i++) {
		uint32_t got;

		cr_assert_eq(ferry__arena_alloc(&a, &got), 0, "alloc %d after reclaim", i);
		cr_assert_lt(got, CAP);
		cr_assert_eq(freed[got], 1, "slot %u was never freed or came back twice", got);
		freed[got] = 2;
	}
	cr_assert_eq(ferry__arena_avail(&a), 0);
	ferry__arena_reclaim(&a); /* nothing deferred: returns at once */
	ferry__arena_fini(&a);
	urcu_memb_unregister_thread();
}
#undef CAP

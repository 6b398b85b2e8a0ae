/* SPDX-License-Identifier: MIT */
/*
 * test_store.c - the slot store: seqlocked slots and their arena.
 *
 * What the core relies on: a reader never copies half of one write and half
 * of another, whether it copies in address order (a CPU) or in any order (a
 * NIC's READ: the seal decides); every change of a slot, header or value,
 * gives it a new version and seal; a slot that moved away or holds another
 * key says -EAGAIN on both paths; a freed slot comes back only after a grace
 * period and with a new epoch, so a reader still holding the old pointer
 * notices; nothing that may run inside an RCU read-side section waits for a
 * grace period.
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

/* ThreadSanitizer runs (ci/test.sh's tsan stage) are 5-15x slower: fewer reads */
#ifdef __SANITIZE_THREAD__
#define SCALE 20
#else
#define SCALE 1
#endif

/* a fresh arena and one LIVE slot holding @key with @len floats */
static struct ferry_slot *live_slot(struct ferry_arena *a, uint32_t capacity, uint32_t len,
				    uint64_t key)
{
	struct ferry_slot *s;
	uint32_t idx;
	int rc;

	rc = ferry__arena_init(a, capacity, len, NULL);
	cr_assert_eq(rc, 0, "arena_init: %d", rc);
	rc = ferry__arena_alloc(a, &idx);
	cr_assert_eq(rc, 0, "arena_alloc: %d", rc);
	s = ferry__arena_slot(a, idx);
	cr_assert_eq(s->state, FERRY_SLOT_INCOMING, "a fresh slot is not INCOMING");
	ferry__slot_install(a, s, key, NULL, len);
	return s;
}

static uint64_t head_version(const struct ferry_slot *s)
{
	return __atomic_load_n(&s->version, __ATOMIC_ACQUIRE);
}

/* a header change the way the core makes one: under the slot's lock */
static void set_state(struct ferry_arena *a, struct ferry_slot *s, enum ferry_slot_state st)
{
	uint64_t v = ferry__slot_lock(a, s);

	ferry__slot_set_state(s, st);
	ferry__slot_unlock(a, s, v);
}

/*
 * What a one-sided reader decides about the slot as it is now: copy it whole
 * (as a READ would, here while nobody writes) and check the copy by its seal.
 * 0: whole and @key live; -EAGAIN: whole, not @key live; -EBUSY: torn.
 */
static int image_check(const struct ferry_arena *a, const struct ferry_slot *s, uint64_t key,
		       uint32_t len)
{
	struct ferry_slot *img = aligned_alloc(64, a->stride);
	int rc;

	cr_assert_not_null(img);
	memcpy(img, s, a->stride);
	rc = ferry__slot_check(img, img->val, a->max_len, *ferry__slot_seal_p(img, a->stride),
			       FERRY_SLOT_BY_SEAL, key, FERRY_SLOT_ANY_EPOCH, len);
	free(img);
	return rc;
}

/* ---- layout ------------------------------------------------------------ */

Test(store, stride_is_a_multiple_of_64_and_holds_value_and_seal)
{
	static const uint32_t lens[] = { 1, 2, 3, 4, 7, 8, 16, 64, 1000, 1024 };

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		struct ferry_arena a;
		size_t need = FERRY_SLOT_HDR + lens[i] * sizeof(float) + sizeof(uint64_t);

		cr_assert_eq(ferry__arena_init(&a, 4, lens[i], NULL), 0);
		cr_assert_eq(a.stride % 64, 0, "len %u: stride %zu", lens[i], a.stride);
		cr_assert_geq(a.stride, need, "len %u: stride %zu < %zu", lens[i], a.stride, need);
		cr_assert_lt(a.stride, need + 64, "len %u: stride %zu wastes a line", lens[i],
			     a.stride);
		/* slots and their seals do not overlap the next slot */
		cr_assert_eq((uint8_t *)ferry__arena_slot(&a, 1) -
				     (uint8_t *)ferry__arena_slot(&a, 0),
			     (ptrdiff_t)a.stride);
		cr_assert_eq(ferry__arena_idx(&a, ferry__arena_slot(&a, 3)), 3);
		ferry__arena_fini(&a);
	}
	cr_assert_eq(FERRY_SLOT_HDR, 32, "the header is documented as 32 bytes");
}

Test(store, update_publishes_an_even_version_and_a_matching_seal)
{
	struct ferry_arena a;
	struct ferry_slot *s = live_slot(&a, 2, 5, 42);
	float in[5] = { 1, 2, 3, 4, 5 }, out[5];
	uint64_t v0 = head_version(s), seal0 = *ferry__slot_seal_p(s, a.stride);

	cr_assert_eq(v0 % 2, 0);
	cr_assert_eq(image_check(&a, s, 42, 5), 0, "a freshly installed slot does not validate");
	for (int i = 1; i <= 3; i++) {
		cr_assert_eq(ferry__slot_update(&a, s, 42, in, 5, 0), 0);
		cr_assert_eq(head_version(s), v0 + 2 * (uint64_t)i, "update %d: version %llu", i,
			     (unsigned long long)head_version(s));
		cr_assert_eq(image_check(&a, s, 42, 5), 0, "update %d: the seal does not match", i);
		cr_assert_neq(*ferry__slot_seal_p(s, a.stride), seal0,
			      "update %d: the same value under a new version kept its seal", i);
		seal0 = *ferry__slot_seal_p(s, a.stride);
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
	cr_assert_neq(image_check(a, s, key, 3), -EBUSY,
		      "%s: a refused update left the slot looking torn", what);
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

	set_state(&a, s, FERRY_SLOT_MOVED);
	expect_eagain(&a, s, 11, "MOVED");
	set_state(&a, s, FERRY_SLOT_INCOMING);
	expect_eagain(&a, s, 11, "INCOMING");
	set_state(&a, s, FERRY_SLOT_FREE);
	expect_eagain(&a, s, 11, "FREE");

	/* back to LIVE: the value survived every refusal */
	set_state(&a, s, FERRY_SLOT_LIVE);
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
	uint64_t v0;		  /* the version before the writer */
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
	c.v0 = head_version(c.s);
	c.key = 1234567;
	c.len = len;
	c.reads_per_reader = total_reads / nreaders;
	c.min_changes = 5000;
	clock_gettime(CLOCK_MONOTONIC, &c.deadline);
	c.deadline.tv_sec += 4;

	cr_assert_eq(pthread_create(&wt, NULL, torn_writer, &c), 0);
	/* let the writer get going so readers race with it from the start */
	while (__atomic_load_n(&c.s->version, __ATOMIC_RELAXED) < c.v0 + 200)
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
	/* quiescent: the last write left an even version and its seal, one step
	 * per write */
	cr_assert_eq(image_check(&a, c.s, c.key, len), 0);
	cr_assert_eq(head_version(c.s), c.v0 + 2 * c.writes, "version %llu after %llu writes",
		     (unsigned long long)head_version(c.s), (unsigned long long)c.writes);
	ferry__arena_fini(&a);
}

Test(store, read_under_writer_never_torn_64_floats, .timeout = 60)
{
	run_torn(64, 2, 1000000 / SCALE);
}

Test(store, read_under_writer_never_torn_1024_floats, .timeout = 60)
{
	run_torn(1024, 2, 1000000 / SCALE);
}

Test(store, read_under_writer_never_torn_one_reader, .timeout = 60)
{
	run_torn(61, 1, 1000000 / SCALE);
}

/* ---- arena --------------------------------------------------------------- */

#define CAP 8
Test(store, alloc_until_enospc_then_free_reuses_with_new_epoch)
{
	struct ferry_arena a;
	uint32_t idx[CAP], again, extra;
	int seen[CAP] = { 0 };
	uint32_t epoch;

	cr_assert_eq(ferry__arena_init(&a, CAP, 4, NULL), 0);
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

	cr_assert_eq(ferry__arena_init(&a, 0, 4, NULL), 0);
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
	cr_assert_eq(ferry__arena_init(&a, CAP, 2, NULL), 0);
	for (int i = 0; i < CAP; i++)
		cr_assert_eq(ferry__arena_alloc(&a, &idx[i]), 0);
	s = ferry__arena_slot(&a, idx[1]);
	ferry__slot_install(&a, s, 77, NULL, 2);
	epoch = s->epoch;

	h.s = s;
	h.key = 77;
	cr_assert_eq(pthread_create(&th, NULL, holder_thread, &h), 0);
	while (!__atomic_load_n(&h.entered, __ATOMIC_ACQUIRE))
		usleep(1000);
	cr_assert_eq(h.rc_before, 0);

	/* what the core does when a key leaves: MOVED under the lock, then free */
	set_state(&a, s, FERRY_SLOT_MOVED);
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
	cr_assert_eq(ferry__arena_init(&a, CAP, 8, NULL), 0);
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

/* ---- every header change: a new version and seal --------------------------- */

/* the slot after @what: one step of the version, even, and a seal that matches */
static void expect_new_version(const struct ferry_arena *a, const struct ferry_slot *s,
			       uint64_t v_before, uint64_t seal_before, const char *what)
{
	uint64_t v = head_version(s);

	cr_assert_eq(v, v_before + 2, "%s: version %llu -> %llu, want one step", what,
		     (unsigned long long)v_before, (unsigned long long)v);
	cr_assert_neq(*ferry__slot_seal_p(s, a->stride), seal_before, "%s kept the seal", what);
	/* whole, whatever it holds (a FREE or INCOMING slot is not live) */
	cr_assert_neq(image_check(a, s, s->key, s->len), -EBUSY,
		      "%s: the seal does not match the slot", what);
}

Test(store, alloc_gives_the_slot_a_new_version_and_seal)
{
	struct ferry_arena a;
	struct ferry_slot *s;
	uint32_t idx, again;
	uint64_t v, seal;

	cr_assert_eq(ferry__arena_init(&a, 1, 4, NULL), 0);
	s = ferry__arena_slot(&a, 0);
	/* a fresh slot: zero memory, no seal yet */
	v = head_version(s);
	seal = *ferry__slot_seal_p(s, a.stride);
	cr_assert_eq(ferry__arena_alloc(&a, &idx), 0);
	cr_assert_eq(idx, 0);
	expect_new_version(&a, s, v, seal, "alloc of a fresh slot");
	cr_assert_eq(s->state, FERRY_SLOT_INCOMING);
	/* a reused one */
	ferry__slot_install(&a, s, 3, NULL, 4);
	ferry__arena_free(&a, idx);
	v = head_version(s);
	seal = *ferry__slot_seal_p(s, a.stride);
	cr_assert_eq(ferry__arena_alloc(&a, &again), 0);
	cr_assert_eq(again, idx);
	expect_new_version(&a, s, v, seal, "alloc of a reused slot");
	cr_assert_eq(s->state, FERRY_SLOT_INCOMING);
	ferry__arena_fini(&a);
}

Test(store, install_gives_the_slot_a_new_version_and_seal)
{
	struct ferry_arena a;
	struct ferry_slot *s;
	const float val[5] = { 1, 2, 3, 4, 5 };
	float out[5];
	uint32_t idx;
	uint64_t v, seal;

	cr_assert_eq(ferry__arena_init(&a, 1, 5, NULL), 0);
	cr_assert_eq(ferry__arena_alloc(&a, &idx), 0);
	s = ferry__arena_slot(&a, idx);
	v = head_version(s);
	seal = *ferry__slot_seal_p(s, a.stride);
	ferry__slot_install(&a, s, 77, val, 5);
	expect_new_version(&a, s, v, seal, "install");
	cr_assert_eq(image_check(&a, s, 77, 5), 0, "an installed slot is not live for its key");
	cr_assert_eq(ferry__slot_read(s, 77, out, 5), 0);
	cr_assert_arr_eq(out, val, sizeof(val));
	ferry__arena_fini(&a);
}

Test(store, moved_gives_the_slot_a_new_version_and_seal)
{
	struct ferry_arena a;
	struct ferry_slot *s = live_slot(&a, 1, 6, 12);
	uint64_t v = head_version(s), seal = *ferry__slot_seal_p(s, a.stride);

	/* what reloc_take does */
	set_state(&a, s, FERRY_SLOT_MOVED);
	expect_new_version(&a, s, v, seal, "MOVED");
	cr_assert_eq(image_check(&a, s, 12, 6), -EAGAIN, "a MOVED slot still reads as live");
	ferry__arena_fini(&a);
}

Test(store, free_gives_the_slot_a_new_version_epoch_and_seal)
{
	struct ferry_arena a;
	struct ferry_slot *s = live_slot(&a, 2, 3, 21);
	uint32_t idx = ferry__arena_idx(&a, s), epoch = s->epoch;
	uint64_t v = head_version(s), seal = *ferry__slot_seal_p(s, a.stride);

	ferry__arena_free(&a, idx);
	expect_new_version(&a, s, v, seal, "free");
	cr_assert_eq(s->state, FERRY_SLOT_FREE);
	cr_assert_eq(s->epoch, epoch + 1);

	/* the deferred free makes the same change, after the grace period */
	urcu_memb_register_thread();
	cr_assert_eq(ferry__arena_alloc(&a, &idx), 0);
	ferry__slot_install(&a, s, 22, NULL, 3);
	epoch = s->epoch;
	v = head_version(s);
	seal = *ferry__slot_seal_p(s, a.stride);
	ferry__arena_free_deferred(&a, idx);
	urcu_memb_barrier();
	expect_new_version(&a, s, v, seal, "deferred free");
	cr_assert_eq(s->epoch, epoch + 1);
	urcu_memb_unregister_thread();
	ferry__arena_fini(&a);
}

/* ---- one-sided images: validity that does not depend on read order ---------- */

#define LINE 64

/* image @dst takes line i from @b when bit i of @mask is set, else from @a */
static void mix_lines(uint8_t *dst, const uint8_t *a, const uint8_t *b, size_t stride,
		      unsigned mask)
{
	for (size_t i = 0; i < stride / LINE; i++)
		memcpy(dst + i * LINE, (mask >> i & 1 ? b : a) + i * LINE, LINE);
}

/* the check ops_rd_done made before seals: head and tail versions equal and
 * even, then key, state, epoch and length */
static int old_check_accepts(const uint8_t *img, size_t stride, uint64_t key, uint32_t epoch16,
			     uint32_t len)
{
	const struct ferry_slot *h = (const void *)img;
	uint64_t tail;

	memcpy(&tail, img + stride - 8, 8);
	return !(h->version & 1) && h->version == tail && h->key == key &&
	       h->state == FERRY_SLOT_LIVE && (h->epoch & 0xffff) == epoch16 && h->len == len;
}

static int seal_accepts(const struct ferry_arena *a, const uint8_t *img, uint64_t key,
			uint32_t epoch16, uint32_t len)
{
	const struct ferry_slot *h = (const void *)img;

	return !ferry__slot_check(h, h->val, a->max_len, *ferry__slot_seal_p(h, a->stride),
				  FERRY_SLOT_BY_SEAL, key, epoch16, len);
}

/* are the @len floats of an image's value all equal (not torn)? */
static int value_whole(const uint8_t *img, uint32_t len)
{
	const struct ferry_slot *h = (const void *)img;

	for (uint32_t i = 1; i < len; i++)
		if (h->val[i] != h->val[0])
			return 0;
	return 1;
}

Test(store, a_torn_image_passes_the_old_check_but_not_the_seal)
{
	struct ferry_arena a;
	const uint32_t len = 48; /* 32 + 192 + 8 bytes: a stride of 4 lines */
	struct ferry_slot *s = live_slot(&a, 1, len, 5);
	uint8_t *A = aligned_alloc(64, a.stride), *B = aligned_alloc(64, a.stride);
	uint8_t *C = aligned_alloc(64, a.stride), *M = aligned_alloc(64, a.stride);
	uint32_t e16 = s->epoch & 0xffff, idx = ferry__arena_idx(&a, s);
	unsigned lines = (unsigned)(a.stride / LINE), all = (1u << lines) - 1;
	float ones[48], twos[48], threes[48];
	uint64_t v;

	cr_assert(A && B && C && M);
	cr_assert_eq(lines, 4);
	for (uint32_t i = 0; i < len; i++) {
		ones[i] = 1;
		twos[i] = 2;
		threes[i] = 3;
	}

	/*
	 * 1. A write overlaps a READ whose packets come back out of order: its
	 * head and tail lines were fetched before the write, the middle after.
	 * The old slot format kept a trailing version: rebuild it for the old
	 * check. Head == tail, even, key, epoch and state right: accepted, with
	 * a value that is half one write and half the other.
	 */
	cr_assert_eq(ferry__slot_update(&a, s, 5, ones, len, 0), 0);
	memcpy(A, s, a.stride);
	cr_assert_eq(ferry__slot_update(&a, s, 5, twos, len, 0), 0);
	memcpy(B, s, a.stride);
	v = ((struct ferry_slot *)A)->version;
	memcpy(A + a.stride - 8, &v, 8);
	v = ((struct ferry_slot *)B)->version;
	memcpy(B + a.stride - 8, &v, 8);
	mix_lines(M, A, B, a.stride, 0x6); /* lines 1 and 2 (the value) from after */
	cr_assert(old_check_accepts(M, a.stride, 5, e16, len),
		  "the old check rejects the mixed image");
	cr_assert_not(value_whole(M, len), "the mixed image is not torn");

	/* the same two states sealed: every mix of their lines is rejected */
	memcpy(A, s, a.stride); /* state 2 (twos) */
	cr_assert_eq(ferry__slot_update(&a, s, 5, ones, len, 0), 0);
	memcpy(B, s, a.stride); /* state 3 (ones) */
	cr_assert(seal_accepts(&a, A, 5, e16, len) && seal_accepts(&a, B, 5, e16, len));
	for (unsigned mask = 1; mask < all; mask++) {
		mix_lines(M, A, B, a.stride, mask);
		cr_assert_not(seal_accepts(&a, M, 5, e16, len),
			      "a mix of two writes (lines %#x from the later) passed the seal",
			      mask);
		/* and with either image's version word at the head */
		mix_lines(M, B, A, a.stride, mask);
		cr_assert_not(seal_accepts(&a, M, 5, e16, len),
			      "a mix of two writes (lines %#x from the earlier) passed the seal",
			      mask);
	}

	/*
	 * 2. One key's header over another key's value. Before seals, free,
	 * alloc and install changed key, epoch, state and value without a new
	 * version: an image of the slot as key 5 and one of it reused for key 9
	 * carried the same version, and a READ that fetched the header after the
	 * reuse and the value before it passed the old check as key 9 holding
	 * key 5's value.
	 */
	memcpy(A, s, a.stride); /* key 5, ones */
	{
		uint8_t *old = M;
		struct ferry_slot *o = (void *)old;

		memcpy(old, A, a.stride); /* the old code's key 9: same version */
		o->key = 9;
		o->epoch++;
		for (uint32_t i = 0; i < len; i++)
			o->val[i] = 3;
		v = o->version;
		memcpy(old + a.stride - 8, &v, 8);
		memcpy(C, A, a.stride);
		memcpy(C + a.stride - 8, &v, 8);
		mix_lines(C, C, old, a.stride, 0x1); /* the header line from after */
		cr_assert(old_check_accepts(C, a.stride, 9, (e16 + 1) & 0xffff, len),
			  "the old check rejects key 9's header over key 5's value");
		/* line 0 holds the header and the value's first 8 floats */
		cr_assert_eq(((struct ferry_slot *)C)->val[len - 1], 1.0f);
	}
	/* now: free, alloc, install each give a new version and seal */
	ferry__arena_free(&a, idx);
	cr_assert_eq(ferry__arena_alloc(&a, &idx), 0);
	ferry__slot_install(&a, s, 9, threes, len);
	memcpy(B, s, a.stride); /* key 9, threes */
	cr_assert(seal_accepts(&a, B, 9, (e16 + 1) & 0xffff, len));
	for (unsigned mask = 1; mask < all; mask++) {
		mix_lines(M, A, B, a.stride, mask);
		cr_assert_not(seal_accepts(&a, M, 9, (e16 + 1) & 0xffff, len) ||
				      seal_accepts(&a, M, 5, e16, len),
			      "a mix of key 5 and key 9 (lines %#x of key 9) passed the seal",
			      mask);
	}
	free(A);
	free(B);
	free(C);
	free(M);
	ferry__arena_fini(&a);
}

/* copy a slot as an adversarial NIC might: its lines in a random order, the
 * words of a line in order, a pause between two lines */
static void copy_shuffled(uint8_t *dst, const struct ferry_slot *s, size_t stride, uint64_t *rnd)
{
	unsigned order[128], n = (unsigned)(stride / LINE);

	cr_assert_leq(n, 128);
	for (unsigned i = 0; i < n; i++)
		order[i] = i;
	for (unsigned i = n - 1; i > 0; i--) {
		unsigned j, x;

		*rnd ^= *rnd << 13;
		*rnd ^= *rnd >> 7;
		*rnd ^= *rnd << 17;
		j = (unsigned)(*rnd % (i + 1));
		x = order[i];
		order[i] = order[j];
		order[j] = x;
	}
	for (unsigned i = 0; i < n; i++) {
		const uint64_t *src = (const uint64_t *)((const uint8_t *)s + order[i] * LINE);
		uint64_t *d = (uint64_t *)(dst + order[i] * LINE);

		for (unsigned w = 0; w < LINE / 8; w++)
			d[w] = __atomic_load_n(&src[w], __ATOMIC_RELAXED);
		if (*rnd & 1)
			sched_yield();
	}
}

struct img_ctx {
	struct ferry_arena *a;
	struct ferry_slot *s;
	uint64_t key;
	uint32_t len;
	int writer_mode; /* 0: sets whole values; 1: updates that fail */
	int stop;	 /* atomic */
	long writes;
};

static void *img_writer(void *p)
{
	struct img_ctx *c = p;
	float *buf = malloc(c->len * sizeof(float));
	uint32_t n = 0;

	if (!buf)
		abort();
	while (!__atomic_load_n(&c->stop, __ATOMIC_RELAXED)) {
		n++;
		for (uint32_t i = 0; i < c->len; i++)
			buf[i] = (float)(n & 0xffffff);
		if (c->writer_mode == 0 && ferry__slot_update(c->a, c->s, c->key, buf, c->len, 0))
			abort();
		/* a wrong key, or the key of a slot that is not live: refused */
		if (c->writer_mode == 1 && ferry__slot_update(c->a, c->s, c->key + 1 + (n & 1), buf,
							      c->len, n & 2) != -EAGAIN)
			abort();
		if (c->writer_mode == 1 && (n & 7) == 0)
			sched_yield();
	}
	__atomic_fetch_add(&c->writes, (long)n, __ATOMIC_RELAXED);
	free(buf);
	return NULL;
}

/*
 * The store's side of the adversarial READ: images copied line by line in a
 * random order while a writer sets whole values (all floats equal). The seal
 * must reject every torn image, and there must be torn ones to reject.
 */
Test(store, images_copied_in_any_order_are_never_accepted_torn, .timeout = 120)
{
	static const uint32_t lens[] = { 2, 61, 1024 };

	for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++) {
		struct ferry_arena a;
		struct img_ctx c = { .a = &a, .len = lens[li], .key = 4242 };
		uint8_t *img;
		long images = 0, accepted = 0, rejected = 0, torn_accepted = 0, torn_seen = 0;
		uint64_t rnd = 0x9e3779b97f4a7c15ull + li;
		struct timespec end;
		pthread_t th;

		c.s = live_slot(&a, 1, c.len, c.key);
		img = aligned_alloc(64, a.stride);
		cr_assert_not_null(img);
		clock_gettime(CLOCK_MONOTONIC, &end);
		end.tv_sec += 3;
		cr_assert_eq(pthread_create(&th, NULL, img_writer, &c), 0);
		for (; images < 200000 / SCALE && (images < 2000 || !past(&end)); images++) {
			const struct ferry_slot *h = (const void *)img;
			int rc;

			copy_shuffled(img, c.s, a.stride, &rnd);
			rc = ferry__slot_check(h, h->val, a.max_len,
					       *ferry__slot_seal_p(h, a.stride), FERRY_SLOT_BY_SEAL,
					       c.key, FERRY_SLOT_ANY_EPOCH, c.len);
			cr_assert(rc == 0 || rc == -EBUSY, "len %u: a live slot said %d", c.len,
				  rc);
			if (!value_whole(img, c.len))
				torn_seen++;
			if (rc == 0) {
				accepted++;
				torn_accepted += !value_whole(img, c.len);
			} else {
				rejected++;
			}
		}
		__atomic_store_n(&c.stop, 1, __ATOMIC_RELAXED);
		pthread_join(th, NULL);
		cr_log_info("len %u: %ld images, %ld accepted, %ld rejected, %ld with a torn "
			    "value, %ld of them accepted; %ld writes",
			    c.len, images, accepted, rejected, torn_seen, torn_accepted, c.writes);
		cr_assert_eq(torn_accepted, 0, "len %u: %ld torn images passed the seal", c.len,
			     torn_accepted);
		cr_assert_gt(accepted, 0, "len %u: no image was ever whole", c.len);
		if (c.len > 2)
			cr_assert_gt(torn_seen, 0,
				     "len %u: no copy overlapped a write: the test proves nothing",
				     c.len);
		free(img);
		ferry__arena_fini(&a);
	}
}

/*
 * Updates refused because the slot does not hold the key live (a wrong key,
 * then a MOVED slot) while images are copied: the slot never looks torn
 * afterwards (before seals, the refusal left the trailing version odd, and
 * every one-sided read of the slot failed until the next write), and no
 * image is ever accepted with a changed value.
 */
Test(store, failed_updates_leave_the_slot_clean, .timeout = 60)
{
	for (int moved = 0; moved < 2; moved++) {
		struct ferry_arena a;
		struct img_ctx c = { .a = &a, .len = 40, .key = 99, .writer_mode = 1 };
		const float val[40] = { 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
					7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7 };
		uint64_t rnd = 88172645463325252ull, v0;
		long images = 0, whole = 0;
		pthread_t th[2];
		uint8_t *img;
		float out[40];

		c.s = live_slot(&a, 1, c.len, moved ? c.key : c.key + 100);
		cr_assert_eq(ferry__slot_update(&a, c.s, c.s->key, val, c.len, 0), 0);
		if (moved) /* the key left: every update of it is refused */
			set_state(&a, c.s, FERRY_SLOT_MOVED);
		c.key = moved ? c.key - 1 : c.key; /* img_writer tries key + 1 and key + 2 */
		v0 = head_version(c.s);
		img = aligned_alloc(64, a.stride);
		cr_assert_not_null(img);
		for (int i = 0; i < 2; i++)
			cr_assert_eq(pthread_create(&th[i], NULL, img_writer, &c), 0);
		for (; images < 100000 / SCALE; images++) {
			const struct ferry_slot *h = (const void *)img;
			int rc;

			copy_shuffled(img, c.s, a.stride, &rnd);
			rc = ferry__slot_check(h, h->val, a.max_len,
					       *ferry__slot_seal_p(h, a.stride), FERRY_SLOT_BY_SEAL,
					       h->key, FERRY_SLOT_ANY_EPOCH, c.len);
			if (rc == -EBUSY)
				continue; /* caught while a refused writer held the lock */
			whole++;
			cr_assert_eq(h->version, v0, "a refused update changed the version");
			cr_assert_arr_eq(h->val, val, sizeof(val), "a refused update wrote");
		}
		__atomic_store_n(&c.stop, 1, __ATOMIC_RELAXED);
		for (int i = 0; i < 2; i++)
			pthread_join(th[i], NULL);
		cr_log_info("%s: %ld refused updates, %ld images, %ld whole",
			    moved ? "MOVED" : "LIVE", c.writes, images, whole);
		cr_assert_gt(whole, 0);
		/* afterwards: the version as it was, even, and the seal matches */
		cr_assert_eq(head_version(c.s), v0);
		cr_assert_eq(image_check(&a, c.s, c.s->key, c.len), moved ? -EAGAIN : 0,
			     "the slot reads torn after refused updates");
		if (!moved) {
			cr_assert_eq(ferry__slot_read(c.s, c.s->key, out, c.len), 0);
			cr_assert_arr_eq(out, val, sizeof(val));
		}
		free(img);
		ferry__arena_fini(&a);
	}
}
#undef LINE

/* ---- nothing inside a read-side section waits for a grace period ------------ */

#define CAP 8
Test(store, reclaim_inside_a_read_side_section_returns_without_waiting, .timeout = 20)
{
	struct ferry_arena a;
	uint32_t idx[CAP];

	urcu_memb_register_thread();
	cr_assert_eq(ferry__arena_init(&a, CAP, 2, NULL), 0);
	for (int i = 0; i < CAP; i++)
		cr_assert_eq(ferry__arena_alloc(&a, &idx[i]), 0);
	/* what a handler on the progress thread may do: free, then ask for room */
	urcu_memb_read_lock();
	for (int i = 0; i < CAP; i++)
		ferry__arena_free_deferred(&a, idx[i]);
	/* a wait here would be for this very section (liburcu's rcu_barrier
	 * refuses with an error line; synchronize_rcu would hang) */
	cr_assert_eq(ferry__arena_reclaim(&a), -EAGAIN);
	cr_assert_eq(ferry__arena_alloc(&a, &idx[0]), -ENOSPC,
		     "a slot came back inside the read-side section that may still see it");
	urcu_memb_read_unlock();
	/* outside: it waits, and every slot is back */
	cr_assert_eq(ferry__arena_reclaim(&a), 0);
	cr_assert_eq(ferry__arena_avail(&a), CAP);
	ferry__arena_fini(&a);
	urcu_memb_unregister_thread();
}
#undef CAP

/* SPDX-License-Identifier: MIT */
/*
 * One-sided pulls: a remote pull of a key whose slot is known is one read of
 * the slot, checked with its seal, key, epoch and state. Runs on the
 * transport FERRY_TRANSPORT names when it can read one-sided (rdma in the
 * SoftRoCE VM), else on the loop transport (one-sided access emulated in
 * this process). The adversarial cases always run on the loop transport with
 * FERRY_LOOP_ADVERSARIAL=1: each READ's cache lines in a random order.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"
#include "common/torn.h"
#include "lib/core/core.h"

#define VLEN 64

/* ThreadSanitizer runs (ci/test.sh's tsan stage) are 5-15x slower: fewer reads */
#ifdef __SANITIZE_THREAD__
#define SCALE 20
#else
#define SCALE 1
#endif

static void use_onesided_transport(void)
{
	const char *tr = getenv("FERRY_TRANSPORT");

	if (!tr || !strcmp(tr, "tcp"))
		setenv("FERRY_TRANSPORT", "loop", 1);
}

struct torn_arg {
	struct tc *c;
	int stop; /* atomic */
	long writes;
	int rc;
};

/* the owner writes values that carry their own check: element i = c + i */
static void *writer_thread(void *p)
{
	struct torn_arg *a = p;
	struct ferry_worker *w;
	float v[VLEN];
	long c = 0;

	a->rc = ferry_worker_create(a->c->fy[0], &w);
	if (a->rc)
		return NULL;
	while (!__atomic_load_n(&a->stop, __ATOMIC_RELAXED)) {
		uint64_t key = (uint64_t)(c % 4);

		c++;
		for (int i = 0; i < VLEN; i++) /* exact in a float: below 2^24 */
			v[i] = (float)(c % 1000000 + 1 + i);
		a->rc = ferry_set(w, a->c->t[0], &key, 1, v);
		if (a->rc)
			break;
	}
	a->writes = c;
	ferry_worker_destroy(w);
	return NULL;
}

Test(onesided, remote_pulls_never_see_a_torn_value, .timeout = 300)
{
	struct ferry_table_params tp = { .num_keys = 8, .value_len = VLEN };
	struct torn_arg a = { 0 };
	struct ferry_worker *w;
	struct ferry_stats before, after;
	const long reads = 100000;
	long torn = 0, seen_changes = 0, nreads = 0;
	float v[VLEN], last = -1;
	pthread_t th;
	struct tc c;
	int rc;

	use_onesided_transport();
	/* range placement: keys 0..3 live on node 0, the writer's */
	rc = tc_open(&c, 2, &tp, 20000);
	cr_assert_eq(rc, 0, "%s", ferry_strerror(rc));
	a.c = &c;
	cr_assert_eq(ferry_worker_create(c.fy[1], &w), 0);
	ferry_stats(c.fy[1], &before);
	cr_assert_eq(pthread_create(&th, NULL, writer_thread, &a), 0);
	/* values start at zero (all elements equal), then carry c + i */
	/* at least 10^5 reads, and on until the writer was seen at work (bounded) */
	for (long n = 0; n < reads || (seen_changes < 1000 && n < 50 * reads); n++) {
		uint64_t key = (uint64_t)(n % 4);

		if (n >= reads)
			sched_yield(); /* on a loaded machine, let the writer run */
		nreads = n + 1;

		rc = ferry_pull(w, c.t[1], &key, 1, v);
		cr_assert_eq(rc, 0, "pull: %s", ferry_strerror(rc));
		for (int i = 1; i < VLEN && (v[0] != 0 || v[VLEN - 1] != 0); i++)
			if (v[i] != v[0] + (float)i) {
				if (!torn)
					cr_log_info("torn: key %llu v[0]=%g v[%d]=%g v[63]=%g",
						    (unsigned long long)key, v[0], i, v[i], v[63]);
				torn++;
				break;
			}
		if (key == 0 && v[0] != last) {
			seen_changes++;
			last = v[0];
		}
	}
	__atomic_store_n(&a.stop, 1, __ATOMIC_RELAXED);
	pthread_join(th, NULL);
	cr_assert_eq(a.rc, 0, "writer: %s", ferry_strerror(a.rc));
	ferry_stats(c.fy[1], &after);
	cr_log_info("%ld reads, %ld writes, %llu one-sided reads, %llu retries, %llu fallbacks, "
		    "%ld changes seen",
		    nreads, a.writes,
		    (unsigned long long)(after.onesided_reads - before.onesided_reads),
		    (unsigned long long)(after.onesided_retries - before.onesided_retries),
		    (unsigned long long)(after.onesided_fallbacks - before.onesided_fallbacks),
		    seen_changes);
	cr_assert_eq(torn, 0, "%ld torn values in %ld reads", torn, nreads);
	cr_assert_geq(after.onesided_reads - before.onesided_reads, (unsigned long long)nreads,
		      "pulls did not go one-sided");
	cr_assert_geq(seen_changes, 1000, "the reader saw the writer's progress only %ld times",
		      seen_changes);
	ferry_worker_destroy(w);
	tc_close(&c);
}

Test(onesided, a_moved_key_falls_back_then_reads_one_sided_again, .timeout = 120)
{
	struct ferry_table_params tp = { .num_keys = 8, .value_len = VLEN };
	struct ferry_worker *w0, *w1, *w2;
	struct ferry_stats s0, s1;
	uint64_t key = 1; /* home: node 0 */
	float v[VLEN], one[VLEN];
	struct tc c;

	use_onesided_transport();
	cr_assert_eq(tc_open(&c, 3, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	cr_assert_eq(ferry_worker_create(c.fy[2], &w2), 0);
	for (int i = 0; i < VLEN; i++)
		one[i] = 1;
	cr_assert_eq(ferry_push(w0, c.t[0], &key, 1, one), 0);
	/* node 1 has no hint yet (the directory holds none for keys it never
	 * saw): the first pull asks the home, whose reply names the slot */
	ferry_stats(c.fy[1], &s0);
	cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
	ferry_stats(c.fy[1], &s1);
	cr_assert_eq(v[0], 1.0f);
	cr_assert_eq(s1.onesided_reads - s0.onesided_reads, 0);
	cr_assert_neq(s1.msgs_sent, s0.msgs_sent, "a pull with no hint read blindly");
	/* from then on: one read, no message */
	ferry_stats(c.fy[1], &s0);
	cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
	ferry_stats(c.fy[1], &s1);
	cr_assert_eq(v[0], 1.0f);
	cr_assert_eq(s1.onesided_reads - s0.onesided_reads, 1);
	cr_assert_eq(s1.msgs_sent, s0.msgs_sent, "a one-sided pull sent a message");
	/* move it to node 2: node 1's hint is stale, the read sees MOVED or a reused slot */
	cr_assert_eq(ferry_localize(w2, c.t[2], &key, 1), 0);
	cr_assert_eq(ferry_push(w2, c.t[2], &key, 1, one), 0);
	ferry_stats(c.fy[1], &s0);
	cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
	ferry_stats(c.fy[1], &s1);
	cr_assert_eq(v[0], 2.0f, "read %g after the move", v[0]);
	cr_assert_eq(s1.onesided_fallbacks - s0.onesided_fallbacks, 1);
	/* the reply taught node 1 the new slot: one read again */
	ferry_stats(c.fy[1], &s0);
	cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
	ferry_stats(c.fy[1], &s1);
	cr_assert_eq(v[0], 2.0f);
	cr_assert_eq(s1.onesided_reads - s0.onesided_reads, 1);
	cr_assert_eq(s1.msgs_sent, s0.msgs_sent);
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	ferry_worker_destroy(w2);
	tc_close(&c);
}

/*
 * While a worker polls the completion queue for its reads, the rdma transport
 * leaves that queue unarmed, so the progress thread is not woken per read.
 * Completions must still be taken once nobody polls: here node 0's worker
 * pulls one-sided (the queue goes unarmed), then idles, and node 1 localizes
 * node 0's keys. Node 0 hands them over by RDMA WRITE and sends HANDOVER_DONE
 * only once the writes completed, and nothing else reaches node 0: without
 * the progress thread re-arming the queue on its own, the localize hangs
 * until it times out. (On the loop transport completions are inline.)
 */
Test(onesided, a_hand_over_completes_after_the_readers_stopped_polling, .timeout = 120)
{
	struct ferry_table_params tp = { .num_keys = 8, .value_len = VLEN };
	uint64_t remote = 5, mine[4] = { 0, 1, 2, 3 }; /* range placement: 0..3 on node 0 */
	struct ferry_worker *w0, *w1;
	float v[4 * VLEN], one[4 * VLEN];
	struct ferry_stats s0, s1;
	struct tc c;

	use_onesided_transport();
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	for (int i = 0; i < 4 * VLEN; i++)
		one[i] = 1;
	cr_assert_eq(ferry_set(w0, c.t[0], mine, 4, one), 0);
	cr_assert_eq(ferry_pull(w0, c.t[0], &remote, 1, v), 0); /* learns the slot */
	ferry_stats(c.fy[0], &s0);
	for (int i = 0; i < 1000; i++)
		cr_assert_eq(ferry_pull(w0, c.t[0], &remote, 1, v), 0);
	ferry_stats(c.fy[0], &s1);
	cr_assert_eq(s1.onesided_reads - s0.onesided_reads, 1000);
	/* node 0's worker is idle from here on */
	cr_assert_eq(ferry_localize(w1, c.t[1], mine, 4), 0,
		     "the hand-over never completed on the node whose readers stopped polling");
	cr_assert_eq(ferry_pull(w1, c.t[1], mine, 4, v), 0);
	for (int i = 0; i < 4 * VLEN; i++)
		cr_assert_eq(v[i], 1.0f, "value %d: %g after the move", i, v[i]);
	ferry_stats(c.fy[1], &s1);
	cr_assert_geq(s1.relocations_in, 4);
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	tc_close(&c);
}

/* ---- adversarial READs: any line order -------------------------------------- */

static void use_adversarial_loop(void)
{
	setenv("FERRY_TRANSPORT", "loop", 1);
	setenv("FERRY_LOOP_ADVERSARIAL", "1", 1);
}

/*
 * Writers on node 0 keep setting whole values (every float the same number)
 * while node 1 pulls them one-sided, and the loop transport serves each READ
 * line by line in a random order with pauses between lines. An image whose
 * lines straddle a write must be read again, never returned: 0 torn values
 * in 10^6 READs, over values of one line, of 5 and of 65 (4 KiB). And the
 * adversary must have torn images for the check to reject (retries), or the
 * run proves nothing. bench/torn (ferry-torn) runs the same for 10^8 READs.
 */
Test(onesided, adversarial_reads_never_return_a_torn_value, .timeout = 300)
{
	/* many-line values first, each bounded in time; then one-line values
	 * make up the 10^6 READs (cheap: millions a second, even under load) */
	struct torn_cfg cfgs[] = {
		{ .value_len = 1024,
		  .keys = 8,
		  .writers = 2,
		  .batch = 4,
		  .reads = 200000 / SCALE,
		  .max_seconds = 20,
		  .pause_ns = 20000 },
		{ .value_len = 64,
		  .keys = 16,
		  .writers = 2,
		  .batch = 8,
		  .reads = 200000 / SCALE,
		  .max_seconds = 15,
		  .pause_ns = 4000 },
		{ .value_len = 2,
		  .keys = 16,
		  .writers = 2,
		  .batch = 8,
		  .reads = 600000 / SCALE,
		  .max_seconds = 60,
		  .pause_ns = 2000 },
	};
	/* what a loaded machine must still manage of the many-line ones */
	const long least[] = { 10000 / SCALE, 20000 / SCALE, 0 };
	const long want = 1000000 / SCALE;
	uint64_t reads = 0, retries = 0;
	long torn = 0;

	use_adversarial_loop();
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		struct torn_result r;
		int rc;

		if (cfgs[i].value_len == 2 && (long)reads + cfgs[i].reads < want)
			cfgs[i].reads = want - (long)reads;
		rc = torn_run(&cfgs[i], &r);
		cr_log_info("%4u floats: %llu one-sided READs, %llu retries (torn images caught), "
			    "%llu fallbacks; %ld values read, %ld torn, %ld changes seen, %ld "
			    "writes; %.1f s",
			    cfgs[i].value_len, (unsigned long long)r.onesided_reads,
			    (unsigned long long)r.retries, (unsigned long long)r.fallbacks,
			    r.values, r.torn, r.changes, r.writes, r.seconds);
		cr_assert_eq(rc, 0, "%u floats: %s (%s)", cfgs[i].value_len, ferry_strerror(rc),
			     r.why);
		cr_assert_eq(r.torn, 0, "%u floats: %ld torn values in %ld: %s", cfgs[i].value_len,
			     r.torn, r.values, r.why);
		cr_assert_geq((long)r.onesided_reads, least[i],
			      "%u floats: only %llu READs in %.0f s", cfgs[i].value_len,
			      (unsigned long long)r.onesided_reads, cfgs[i].max_seconds);
		cr_assert_gt(r.changes, 100,
			     "%u floats: the reader saw the writers' work %ld times",
			     cfgs[i].value_len, r.changes);
		cr_assert_lt(r.fallbacks, (uint64_t)r.values / 2,
			     "%u floats: most pulls went by message", cfgs[i].value_len);
		if (cfgs[i].value_len > 2)
			cr_assert_gt(r.retries, 0,
				     "%u floats: no READ straddled a write: the run proves nothing",
				     cfgs[i].value_len);
		reads += r.onesided_reads;
		retries += r.retries;
		torn += r.torn;
	}
	cr_log_info("in all: %llu one-sided READs, %llu torn images rejected, %ld torn values",
		    (unsigned long long)reads, (unsigned long long)retries, torn);
	cr_assert_geq(reads, (uint64_t)want, "only %llu READs in the time given",
		      (unsigned long long)reads);
}

struct refuse_arg {
	struct ferry_table *t;
	uint64_t key;
	uint32_t len;
	int stop; /* atomic */
	long refused;
	int bad;
};

/* updates of a slot that does not hold their key live: all refused */
static void *refuse_thread(void *p)
{
	struct refuse_arg *a = p;
	float *v = calloc(a->len, sizeof(float));
	struct ferry_slot *s = NULL;

	urcu_memb_register_thread();
	urcu_memb_read_lock();
	s = ferry__own(a->t, a->key);
	urcu_memb_read_unlock();
	while (v && s && !__atomic_load_n(&a->stop, __ATOMIC_RELAXED)) {
		/* wrong keys, as a set and as a push */
		if (ferry__slot_update(&a->t->arena, s, a->key + 1 + (a->refused & 1), v, a->len,
				       (int)(a->refused & 2)) != -EAGAIN)
			a->bad++;
		if ((++a->refused & 63) == 0)
			sched_yield(); /* two cores: let the reader run too */
	}
	if (!v || !s)
		a->bad++;
	urcu_memb_unregister_thread();
	free(v);
	return NULL;
}

/*
 * Updates refused on a slot (wrong key) interleaved with one-sided reads of
 * it. Before seals, a refused update restored the head version but left the
 * trailing one odd: every one-sided read of the slot looked torn, 16 times,
 * then went by message, until the next write. Now the refusal changes
 * nothing, and afterwards a pull is one READ, accepted at once.
 */
Test(onesided, refused_updates_leave_the_slot_readable_one_sided, .timeout = 120)
{
	struct ferry_table_params tp = { .num_keys = 8, .value_len = VLEN };
	struct refuse_arg a[2];
	struct ferry_worker *w0, *w1;
	struct ferry_stats s0, s1;
	float v[VLEN], seven[VLEN];
	uint64_t key = 2; /* range placement: node 0 */
	pthread_t th[2];
	struct tc c;
	long pulls = 0;

	use_adversarial_loop();
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	cr_assert_eq(ferry_worker_create(c.fy[0], &w0), 0);
	cr_assert_eq(ferry_worker_create(c.fy[1], &w1), 0);
	for (int i = 0; i < VLEN; i++)
		seven[i] = 7;
	cr_assert_eq(ferry_set(w0, c.t[0], &key, 1, seven), 0);
	for (int i = 0; i < 2; i++) {
		a[i] = (struct refuse_arg){ .t = c.t[0], .key = key, .len = VLEN };
		cr_assert_eq(pthread_create(&th[i], NULL, refuse_thread, &a[i]), 0);
	}
	ferry_stats(c.fy[1], &s0);
	for (; pulls < 20000 / SCALE; pulls++) {
		cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
		cr_assert_arr_eq(v, seven, sizeof(seven), "pull %ld: a refused update wrote",
				 pulls);
	}
	ferry_stats(c.fy[1], &s1);
	for (int i = 0; i < 2; i++) {
		__atomic_store_n(&a[i].stop, 1, __ATOMIC_RELAXED);
		pthread_join(th[i], NULL);
		cr_assert_eq(a[i].bad, 0, "thread %d: an update of a wrong key was not refused", i);
	}
	cr_log_info("%ld pulls under %ld refused updates: %llu READs, %llu retries, %llu "
		    "fallbacks",
		    pulls, a[0].refused + a[1].refused,
		    (unsigned long long)(s1.onesided_reads - s0.onesided_reads),
		    (unsigned long long)(s1.onesided_retries - s0.onesided_retries),
		    (unsigned long long)(s1.onesided_fallbacks - s0.onesided_fallbacks));
	cr_assert_gt(a[0].refused + a[1].refused, 1000);
	/* afterwards: whole at once, one READ each, no retry, no message */
	for (int i = 0; i < 100; i++) {
		ferry_stats(c.fy[1], &s0);
		cr_assert_eq(ferry_pull(w1, c.t[1], &key, 1, v), 0);
		ferry_stats(c.fy[1], &s1);
		cr_assert_arr_eq(v, seven, sizeof(seven));
		cr_assert_eq(s1.onesided_reads - s0.onesided_reads, 1,
			     "the slot reads torn after refused updates (%llu READs for one pull)",
			     (unsigned long long)(s1.onesided_reads - s0.onesided_reads));
		cr_assert_eq(s1.onesided_fallbacks, s0.onesided_fallbacks);
	}
	ferry_worker_destroy(w0);
	ferry_worker_destroy(w1);
	tc_close(&c);
}

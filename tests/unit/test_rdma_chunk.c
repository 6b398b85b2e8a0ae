/* SPDX-License-Identifier: MIT */
/*
 * Unit: the rdma transport's chunk header and the RESUME count
 * (transport/rdma/rdma.h, "Messages"; transport/rdma/session.c). These run
 * without a device: the session's whole exchange runs in the SoftRoCE guest
 * (test_reconnect with FERRY_TRANSPORT=rdma, ci/softroce-vm.sh).
 *
 * - a data chunk's immediate carries the tag, its number modulo 128 and the
 *   credits it returns, and never the credit-only or RESUME flags;
 * - a RESUME's carries both flags and the count modulo 2^16;
 * - the count a RESUME names is found again from its 16 bits for every
 *   window of unacknowledged chunks (up to RDMA_CREDITS), across the 2^16
 *   wrap, and a count beyond what was sent is refused;
 * - a RESUME read from a lost link's queue pair while it drains resumes
 *   nothing (ferry__rdma_resume_got on a bare peer: nothing is posted);
 * - a connection cut loose is destroyed on the reaper, not on the thread
 *   that cut it (the progress thread), with its cm_id naming it no more;
 *   stopping the reaper destroys every one queued; past RDMA_REAP_MAX
 *   waiting, the caller destroys it itself (reap.c);
 * - the rdma settings read from the environment fall back to their default
 *   when out of range (progress.c). rdma_destroy_id() and
 *   rdma_destroy_qp() are replaced below by slow fakes that need no device.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#ifdef FERRY_HAVE_RDMA
#include "transport/rdma/rdma.h"

Test(rdma_chunk, a_data_chunk_carries_its_number_and_credits)
{
	for (uint64_t seq = 0; seq < 1000; seq += 7)
		for (uint32_t owed = 0; owed <= RDMA_CREDITS; owed += 8) {
			uint32_t imm = rdma_imm_data(seq, owed);

			cr_assert_eq(imm >> 24, RDMA_IMM_TAG);
			cr_assert_eq(imm & RDMA_IMM_CREDIT_ONLY, 0);
			cr_assert_eq(imm >> RDMA_IMM_SEQ_SHIFT & RDMA_IMM_SEQ_MASK, seq % 128,
				     "chunk %llu", (unsigned long long)seq);
			cr_assert_eq(imm & 0xffff, owed);
		}
}

Test(rdma_chunk, a_resume_carries_its_count_and_both_flags)
{
	const uint64_t counts[] = { 0, 1, 65535, 65536, 65537, 1ull << 40 };

	for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
		uint32_t imm = rdma_imm_resume(counts[i]);

		cr_assert_eq(imm >> 24, RDMA_IMM_TAG);
		cr_assert(imm & RDMA_IMM_CREDIT_ONLY);
		cr_assert(imm & RDMA_IMM_RESUME);
		cr_assert_eq(imm & 0x3f0000, 0, "bits 21-16 are 0 in a RESUME");
		cr_assert_eq(imm & 0xffff, counts[i] & 0xffff);
	}
}

Test(rdma_chunk, the_resume_count_is_found_again_across_the_wrap)
{
	const uint64_t bases[] = { 0, 5, 65500, 65535, 65536, 131000, (1ull << 33) - 3 };

	for (size_t b = 0; b < sizeof(bases) / sizeof(bases[0]); b++)
		for (uint64_t unacked = 0; unacked <= RDMA_CREDITS; unacked++) {
			uint64_t acked = bases[b], posted = acked + unacked, from = ~0ull;

			for (uint64_t d = acked; d <= posted; d++) {
				cr_assert_eq(rdma_resume_from(acked, posted,
							      rdma_imm_resume(d) & 0xffff, &from),
					     0);
				cr_assert_eq(from, d, "acked %llu posted %llu: %llu read as %llu",
					     (unsigned long long)acked, (unsigned long long)posted,
					     (unsigned long long)d, (unsigned long long)from);
			}
			/* a count past what was sent (and short of a whole wrap) */
			for (uint64_t d = posted + 1; d < posted + 100 && d < acked + 65536; d++)
				cr_assert_eq(rdma_resume_from(acked, posted, d & 0xffff, &from), -1,
					     "acked %llu posted %llu took %llu",
					     (unsigned long long)acked, (unsigned long long)posted,
					     (unsigned long long)d);
		}
}

/*
 * A RESUME that the peer sent on a queue pair before the link was lost, read
 * while that queue pair drains, resumes nothing: the session stays lost (and
 * so is redialed, or failed when its grace ends). It once resumed the
 * session on the dead queue pair, which left the link away for good.
 */
Test(rdma_chunk, a_resume_read_from_a_draining_queue_pair_resumes_nothing)
{
	struct rdma_tp *t = calloc(1, sizeof(*t));
	struct rdma_peer *p;
	const char *why = NULL;

	cr_assert_not_null(t);
	t->base.cfg.rank = 0;
	t->base.cfg.world = 2;
	t->reconnect_ms = 1000;
	t->peers = calloc(2, sizeof(*t->peers));
	cr_assert_not_null(t->peers);
	p = &t->peers[1];
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->q_drained, NULL);
	p->rank = 1;
	p->ever_up = 1;
	p->lost = 1;
	p->draining = 1; /* qp is the lost link's, and is NULL: nothing may be posted */
	p->state = RDMA_PEER_LOST;
	p->rsm_sent = 1; /* our RESUME went out on that queue pair before the loss */
	p->tx_acked = 70000;
	p->s_posted = 70010;

	cr_assert_eq(ferry__rdma_resume_got(t, p, (70004u) & 0xffff, &why), 0);
	cr_assert_null(why, "a good RESUME refused: %s", why);
	cr_assert_eq(p->rsm_got, 1, "the chunks after it on that queue pair are taken");
	cr_assert_eq(p->lost, 1, "the session resumed on a dead queue pair");
	cr_assert_eq(p->state, RDMA_PEER_LOST);
	cr_assert_eq(p->credits, 0, "credits given for a dead queue pair");

	/* a second one on the same queue pair is still a protocol error */
	cr_assert_eq(ferry__rdma_resume_got(t, p, (70004u) & 0xffff, &why), 0);
	cr_assert_not_null(why);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->q_drained);
	free(t->peers);
	free(t);
}

/* ---- the reaper (reap.c), with fake destroy calls ------------------------ */

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_cond = PTHREAD_COND_INITIALIZER;
static pthread_t fake_main;    /* the test's thread: plays the progress thread */
static int fake_delay_ms;      /* each destroy of an id takes this long */
static int fake_gate;	       /* 1: the reaper's destroys wait until it opens (0) */
static int fake_ids, fake_qps; /* destroyed */
static int fake_on_main;       /* ... of them on the test's thread */
static int fake_named;	       /* ... while their context still named a connection */

/* librdmacm's, replaced for this binary: the executable's definition wins */
int rdma_destroy_id(struct rdma_cm_id *id)
{
	int on_main = pthread_equal(pthread_self(), fake_main);

	pthread_mutex_lock(&fake_lock);
	while (fake_gate && !on_main)
		pthread_cond_wait(&fake_cond, &fake_lock);
	pthread_mutex_unlock(&fake_lock);
	if (fake_delay_ms)
		usleep((useconds_t)fake_delay_ms * 1000);
	pthread_mutex_lock(&fake_lock);
	fake_ids++;
	fake_on_main += on_main;
	fake_named += id->context != NULL;
	pthread_mutex_unlock(&fake_lock);
	free(id);
	return 0;
}

void rdma_destroy_qp(struct rdma_cm_id *id)
{
	(void)id;
	pthread_mutex_lock(&fake_lock);
	fake_qps++;
	pthread_mutex_unlock(&fake_lock);
}

static struct rdma_tp *fake_tp(void)
{
	struct rdma_tp *t = calloc(1, sizeof(*t));

	cr_assert_not_null(t);
	t->base.cfg.rank = 0;
	t->base.cfg.world = 2;
	t->peers = calloc(2, sizeof(*t->peers));
	cr_assert_not_null(t->peers);
	for (uint32_t r = 0; r < 2; r++) {
		pthread_mutex_init(&t->peers[r].lock, NULL);
		t->peers[r].rank = r;
	}
	fake_main = pthread_self();
	fake_ids = fake_qps = fake_on_main = fake_named = 0;
	return t;
}

/* a connection accepted from rank 1 with a (fake) cm_id, in t->conns */
static struct rdma_conn *fake_conn(struct rdma_tp *t)
{
	struct rdma_conn *c = ferry__rdma_conn_new(t, RDMA_CONN_ACCEPT);

	cr_assert_not_null(c);
	c->rank = 1;
	c->id = calloc(1, sizeof(*c->id));
	cr_assert_not_null(c->id);
	c->id->context = c;
	return c;
}

static void fake_tp_free(struct rdma_tp *t)
{
	cr_assert_null(t->conns, "a connection was left linked");
	for (uint32_t r = 0; r < 2; r++)
		pthread_mutex_destroy(&t->peers[r].lock);
	free(t->peers);
	free(t);
}

static int64_t ms_since(int64_t t0)
{
	return rdma_now_ms() - t0;
}

/*
 * rdma_destroy_id() took up to 539 ms in the TCG guest: on the progress
 * thread that was as long without a delivery or a credit. Cutting a
 * connection loose must not wait for it.
 */
Test(rdma_chunk, a_connection_is_destroyed_on_the_reaper_not_on_the_progress_thread)
{
	enum {
		N = 6,
		DELAY_MS = 150
	};
	struct rdma_tp *t = fake_tp();
	struct rdma_conn *c[N];
	uint8_t gen;
	int64_t t0, took;

	fake_delay_ms = DELAY_MS;
	setenv("FERRY_RDMA_REAPER", "1", 1); /* opt-in (reap.c) */
	cr_assert_eq(ferry__rdma_reaper_start(t), 0);
	for (int i = 0; i < N; i++)
		c[i] = fake_conn(t);
	t->peers[1].conn = c[0]; /* the peer's queue pair is c[0]'s */
	t->peers[1].live = 1;
	gen = t->peers[1].gen;

	t0 = rdma_now_ms();
	for (int i = 0; i < N; i++)
		ferry__rdma_conn_destroy(t, c[i]);
	took = ms_since(t0);
	cr_expect_lt(took, DELAY_MS,
		     "cutting %d connections loose took %lld ms: the caller "
		     "waited for their destroy",
		     N, (long long)took);
	cr_expect_null(t->peers[1].conn, "the peer still names the connection");
	cr_expect_eq(t->peers[1].live, 0);
	cr_expect_neq(t->peers[1].gen, gen, "the old queue pair's completions would be taken");

	ferry__rdma_reaper_stop(t); /* waits for every one queued */
	cr_expect_geq(ms_since(t0), N * DELAY_MS, "the reaper stopped before its queue was empty");
	cr_expect_eq(fake_ids, N, "%d of %d cm_ids destroyed", fake_ids, N);
	cr_expect_eq(fake_on_main, 0, "%d destroyed on the progress thread", fake_on_main);
	cr_expect_eq(fake_named, 0, "%d cm_ids still named their connection when destroyed",
		     fake_named);
	cr_expect_eq(t->reaped, (uint64_t)N);
	cr_expect_eq(t->reap_n, 0);
	fake_delay_ms = 0;
	fake_tp_free(t);
}

/* a flood of connections faster than the kernel destroys them: RDMA_REAP_MAX wait at most */
Test(rdma_chunk, the_reaper_queue_is_bounded)
{
	enum {
		EXTRA = 3
	};
	struct rdma_tp *t = fake_tp();

	fake_gate = 1; /* the reaper's destroys wait: nothing leaves the queue */
	setenv("FERRY_RDMA_REAPER", "1", 1); /* opt-in (reap.c) */
	cr_assert_eq(ferry__rdma_reaper_start(t), 0);
	for (int i = 0; i < RDMA_REAP_MAX + EXTRA; i++)
		ferry__rdma_conn_destroy(t, fake_conn(t));
	pthread_mutex_lock(&t->reap_lock);
	cr_expect_eq(t->reap_n, RDMA_REAP_MAX, "%u wait for the reaper", t->reap_n);
	pthread_mutex_unlock(&t->reap_lock);
	pthread_mutex_lock(&fake_lock);
	cr_expect_eq(fake_on_main, EXTRA, "%d past the bound destroyed by the caller",
		     fake_on_main);
	fake_gate = 0;
	pthread_cond_broadcast(&fake_cond);
	pthread_mutex_unlock(&fake_lock);
	ferry__rdma_reaper_stop(t);
	cr_expect_eq(fake_ids, RDMA_REAP_MAX + EXTRA);
	cr_expect_eq(fake_named, 0);
	fake_tp_free(t);
}

/*
 * The settings FERRY_RDMA_INLINE, FERRY_RDMA_CORK, FERRY_RDMA_SPIN_US and
 * FERRY_RDMA_RX_SPIN_US are read through ferry__rdma_env_int: unset or empty
 * gives the default, a number in range is taken, anything else (out of
 * range, trailing text, overflow) gives the default.
 */
Test(rdma_chunk, a_setting_out_of_range_falls_back_to_its_default)
{
	static const struct {
		const char *val; /* NULL: unset */
		long want;
	} cases[] = {
		{ NULL, 7 },	  { "", 7 },
		{ "0", 0 },	  { "256", 256 },
		{ "4096", 4096 }, { "4097", 7 },
		{ "-1", 7 },	  { "12x", 7 },
		{ "x", 7 },	  { "99999999999999999999", 7 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (cases[i].val)
			setenv("FERRY_TEST_RDMA_KNOB", cases[i].val, 1);
		else
			unsetenv("FERRY_TEST_RDMA_KNOB");
		cr_expect_eq(ferry__rdma_env_int("FERRY_TEST_RDMA_KNOB", 0, 4096, 7), cases[i].want,
			     "'%s'", cases[i].val ? cases[i].val : "(unset)");
	}
	unsetenv("FERRY_TEST_RDMA_KNOB");
}

#else
Test(rdma_chunk, needs_the_rdma_transport)
{
	cr_skip_test("this build has no rdma transport");
}
#endif

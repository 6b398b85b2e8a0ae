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
 *   nothing (ferry__rdma_resume_got on a bare peer: nothing is posted).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

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

#else
Test(rdma_chunk, needs_the_rdma_transport)
{
	cr_skip_test("this build has no rdma transport");
}
#endif

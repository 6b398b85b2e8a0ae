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
 *   wrap, and a count beyond what was sent is refused.
 */
#include <criterion/criterion.h>
#include <stdint.h>

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

#else
Test(rdma_chunk, needs_the_rdma_transport)
{
	cr_skip_test("this build has no rdma transport");
}
#endif

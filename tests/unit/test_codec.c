/* SPDX-License-Identifier: MIT */
/*
 * test_codec.c - the 16-bit value codes of compressed pushes
 * (lib/ops/codes.c):
 *
 * - bfloat16 and IEEE half: exact values, rounding to nearest even at the
 *   ties, saturation of finite values (never an infinity from a finite
 *   delta), subnormal halves, infinities and NaN;
 * - half against the compiler's own _Float16 conversion over 10^6 random
 *   floats of every magnitude (where the compiler has the type);
 * - the error-feedback identity the push path relies on: the rounded value
 *   plus the residual is the input, so over a run of pushes the sum sent
 *   plus the residual left equals the sum of the deltas.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/cluster.h"
#include "lib/core/proto.h"
#include "lib/ops/codec.h"

static float f_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

Test(codec, bf16_rounds_to_nearest_even_and_saturates)
{
	cr_assert_eq(ferry__codec_bf16(1.0f), 0x3f80);
	cr_assert_eq(ferry__codec_bf16(-2.5f), 0xc020);
	cr_assert_eq(ferry__codec_bf16(0.0f), 0x0000);
	cr_assert_eq(ferry__codec_bf16(-0.0f), 0x8000);
	/* ties: to the even code */
	cr_assert_eq(ferry__codec_bf16(f_of(0x3f808000u)), 0x3f80);
	cr_assert_eq(ferry__codec_bf16(f_of(0x3f818000u)), 0x3f82);
	/* above a tie: up; below: down */
	cr_assert_eq(ferry__codec_bf16(f_of(0x3f808001u)), 0x3f81);
	cr_assert_eq(ferry__codec_bf16(f_of(0x3f807fffu)), 0x3f80);
	/* finite stays finite */
	cr_assert_eq(ferry__codec_bf16(FLT_MAX), 0x7f7f);
	cr_assert_eq(ferry__codec_bf16(-FLT_MAX), 0xff7f);
	cr_assert_eq(ferry__codec_bf16(INFINITY), 0x7f80);
	cr_assert(isnan(ferry__codec_bf16_val(ferry__codec_bf16(NAN))));
	cr_assert_eq(ferry__codec_bf16_val(0x3f80), 1.0f);
}

Test(codec, fp16_exact_ties_saturation_and_subnormals)
{
	cr_assert_eq(ferry__codec_fp16(1.0f), 0x3c00);
	cr_assert_eq(ferry__codec_fp16(-2.0f), 0xc000);
	cr_assert_eq(ferry__codec_fp16(65504.0f), 0x7bff);
	cr_assert_eq(ferry__codec_fp16(65519.0f), 0x7bff);
	cr_assert_eq(ferry__codec_fp16(65520.0f), 0x7bff); /* would round to inf */
	cr_assert_eq(ferry__codec_fp16(1e9f), 0x7bff);
	cr_assert_eq(ferry__codec_fp16(-1e9f), 0xfbff);
	cr_assert_eq(ferry__codec_fp16(INFINITY), 0x7c00);
	cr_assert(isnan(ferry__codec_fp16_val(ferry__codec_fp16(NAN))));
	/* the smallest normal, the subnormals, and their ties */
	cr_assert_eq(ferry__codec_fp16(0x1p-14f), 0x0400);
	cr_assert_eq(ferry__codec_fp16(0x1p-24f), 0x0001);
	cr_assert_eq(ferry__codec_fp16(0x1p-25f), 0x0000);     /* 0.5 ulp: to even 0 */
	cr_assert_eq(ferry__codec_fp16(0x3p-25f), 0x0002);     /* 1.5 ulp: to even 2 */
	cr_assert_eq(ferry__codec_fp16(0x1.ff8p-15f), 0x03ff); /* the largest subnormal */
	cr_assert_eq(ferry__codec_fp16(0x1.ffcp-15f), 0x0400); /* a tie: up, to the even code */
	/* a normal tie: 1 + 2^-11 lies between 1 and 1 + 2^-10 */
	cr_assert_eq(ferry__codec_fp16(1.0f + 0x1p-11f), 0x3c00);
	cr_assert_eq(ferry__codec_fp16(1.0f + 0x3p-11f), 0x3c02);
	for (uint32_t c = 0; c < 0x7c00; c++)
		cr_assert_eq(ferry__codec_fp16(ferry__codec_fp16_val((uint16_t)c)), c, "code %x",
			     c);
}

#ifdef __FLT16_MANT_DIG__
Test(codec, fp16_agrees_with_the_compilers_conversion)
{
	uint64_t s = 0x2545f4914f6cdd1dull;

	for (int i = 0; i < 1000000; i++) {
		/* every exponent from 2^-30 to 2^17 (past the saturation) */
		int e = (int)(tc_rand(&s) % 48) - 30;
		float f = ldexpf(1.0f + (float)(tc_rand(&s) % (1u << 23)) * 0x1p-23f, e);
		_Float16 h;
		uint16_t ref;

		if (tc_rand(&s) & 1)
			f = -f;
		if (fabsf(f) >= 65520.0f)
			continue; /* ours saturates where the type goes to infinity */
		h = (_Float16)f;
		memcpy(&ref, &h, sizeof(ref));
		cr_assert_eq(ferry__codec_fp16(f), ref, "%a: %04x, the compiler %04x", (double)f,
			     ferry__codec_fp16(f), ref);
	}
}
#endif

Test(codec, rounded_value_plus_residual_is_the_sum_of_the_deltas)
{
	const uint16_t flags[] = { FERRY_OP_F_BF16, FERRY_OP_F_FP16 };
	uint64_t s = 88172645463325252ull;

	for (int f = 0; f < 2; f++) {
		double sent = 0, exact = 0;
		float r = 0;

		for (int i = 0; i < 100000; i++) {
			float d = (float)((double)(tc_rand(&s) % 2000001) / 1e6 - 1.0) * 1e-3f,
			      x = d + r, q;
			uint16_t c;

			ferry__codec_encode(flags[f], &x, &c, 1);
			ferry__codec_decode(flags[f], &c, &q, 1);
			r = x - q;
			sent += q;
			exact += d;
		}
		/* only float rounding of the running residual is between them */
		cr_assert_lt(fabs(sent + r - exact), 1e-6, "codec %d: sent %.9g + %.9g, exact %.9g",
			     flags[f], sent, (double)r, exact);
		cr_assert_lt(fabsf(r), 1e-5f);
	}
}

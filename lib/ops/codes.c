/* SPDX-License-Identifier: MIT */
/*
 * codes.c - 16-bit value codes of compressed pushes (bfloat16, IEEE half),
 * shared by the push path (codec.c) and the frames' builder and reader
 * (serve.c); it calls nothing, so neither depends on the other through it.
 */
#include <math.h>
#include <string.h>

#include "lib/core/proto.h"
#include "lib/ops/codec.h"

/* ---- value codes ------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float f32_of(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

uint16_t ferry__codec_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)(u >> 16 | 0x40); /* NaN: stays one, quiet */
	if ((u & 0x7fffffffu) == 0x7f800000u)
		return (uint16_t)(u >> 16); /* infinity */
	/* round to nearest even on the 16 bits dropped */
	u += 0x7fffu + ((u >> 16) & 1u);
	if ((u & 0x7f800000u) == 0x7f800000u)
		return (uint16_t)(((u >> 16) & 0x8000u) | 0x7f7fu); /* saturate: largest finite */
	return (uint16_t)(u >> 16);
}

float ferry__codec_bf16_val(uint16_t c)
{
	return f32_of((uint32_t)c << 16);
}

uint16_t ferry__codec_fp16(float f)
{
	uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;

	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00u); /* NaN */
	if (a == 0x7f800000u)
		return (uint16_t)(sign | 0x7c00u); /* infinity */
	if (a >= 0x477ff000u)
		return (uint16_t)(sign | 0x7bffu); /* 65520 and up would round to inf: 65504 */
	if (a < 0x38800000u) {
		/* under 2^-14: a half subnormal, m x 2^-24 (m = 1024 is the
		 * smallest normal, which is also its code) */
		return (uint16_t)(sign | (uint32_t)lrintf(fabsf(f) * 16777216.0f));
	}
	a -= 0x38000000u; /* exponent bias 127 -> 15 */
	a += 0xfffu + ((a >> 13) & 1u);
	return (uint16_t)(sign | (a >> 13));
}

float ferry__codec_fp16_val(uint16_t c)
{
	uint32_t sign = (uint32_t)(c & 0x8000u) << 16, e = (c >> 10) & 0x1fu, m = c & 0x3ffu;

	if (!e)
		return sign ? -(float)m * 0x1p-24f : (float)m * 0x1p-24f;
	if (e == 31)
		return f32_of(sign | 0x7f800000u | m << 13);
	return f32_of(sign | (e + 112) << 23 | m << 13);
}

uint16_t ferry__codec_flag(enum ferry_push_codec codec)
{
	return codec == FERRY_CODEC_BF16 ? FERRY_OP_F_BF16 :
	       codec == FERRY_CODEC_FP16 ? FERRY_OP_F_FP16 :
					   0;
}

void ferry__codec_encode(uint16_t flag, const float *in, uint16_t *out, size_t n)
{
	if (flag == FERRY_OP_F_BF16)
		for (size_t i = 0; i < n; i++)
			out[i] = ferry__codec_bf16(in[i]);
	else
		for (size_t i = 0; i < n; i++)
			out[i] = ferry__codec_fp16(in[i]);
}

void ferry__codec_decode(uint16_t flag, const uint16_t *in, float *out, size_t n)
{
	if (flag == FERRY_OP_F_BF16)
		for (size_t i = 0; i < n; i++)
			out[i] = ferry__codec_bf16_val(in[i]);
	else
		for (size_t i = 0; i < n; i++)
			out[i] = ferry__codec_fp16_val(in[i]);
}

/* SPDX-License-Identifier: MIT */
/* init.c - initial values from (seed, key, index); see init.h. */
#include <math.h>
#include <string.h>

#include "ferry/ferry.h"
#include "lib/store/init.h"

static uint64_t init_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

/* uniform in [0, 1), 24 bits: exact in a float */
static float init_u01(uint64_t seed, uint64_t key, uint32_t j)
{
	uint64_t x = init_mix(init_mix(seed ^ init_mix(key)) + 0x9e3779b97f4a7c15ull * (j + 1));

	return (float)(x >> 40) * (1.0f / 16777216.0f);
}

void ferry__init_value(const struct ferry_init_spec *spec, uint64_t key, uint32_t first, float *out,
		       uint32_t n)
{
	switch (spec->kind) {
	case FERRY_INIT_UNIFORM:
		for (uint32_t i = 0; i < n; i++)
			out[i] = spec->a +
				 (spec->b - spec->a) * init_u01(spec->seed, key, first + i);
		return;
	case FERRY_INIT_NORMAL:
		for (uint32_t i = 0; i < n; i += 2) {
			uint32_t j = first + i; /* even: floats j and j + 1 are one pair */
			/* u1 in (0, 1]: log never sees 0 */
			double u1 = 1.0 - init_u01(spec->seed, key, j);
			double u2 = init_u01(spec->seed, key, j + 1);
			double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;

			out[i] = (float)(spec->a + spec->b * r * cos(th));
			if (i + 1 < n)
				out[i + 1] = (float)(spec->a + spec->b * r * sin(th));
		}
		return;
	default:
		memset(out, 0, (size_t)n * sizeof(float));
	}
}

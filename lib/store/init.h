/* SPDX-License-Identifier: MIT */
/*
 * init.h - the value a key has before its first write, computed from the
 * table's seed and the key alone: every node (and every run) that needs it
 * gets the same floats without asking anyone. A sparse key is created at
 * its home from it on first use; a dense table's keys start from it.
 *
 * Float j of key k comes from the 64-bit mix of (seed, k, j) (splitmix64's
 * finalizer, twice): uniform takes its top 24 bits as u in [0, 1); normal
 * pairs floats (2i, 2i + 1) through Box-Muller. The normal draw uses libm's
 * log, sqrt, cos and sin: identical on every node that runs the same libm
 * (the same distribution), which a cluster does.
 */
#ifndef FERRY_LIB_STORE_INIT_H
#define FERRY_LIB_STORE_INIT_H

#include <stdint.h>

struct ferry_init_spec {
	uint32_t kind; /* enum ferry_init */
	float a, b;
	uint64_t seed;
};

/* floats @first .. @first + @n - 1 of @key's initial value into @out
 * (@first even). Pure: any thread. */
void ferry__init_value(const struct ferry_init_spec *spec, uint64_t key, uint32_t first, float *out,
		       uint32_t n);

#endif /* FERRY_LIB_STORE_INIT_H */

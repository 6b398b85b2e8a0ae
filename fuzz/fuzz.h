/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h - what the fuzz targets (fuzz/fuzz_*.c) and their seed generator
 * (gen_seeds.c) share: the layout of each target's input. Every input starts
 * with a few bytes of configuration (the limits a node would check against),
 * then the bytes off the wire. docs/security.md says how to run them.
 *
 *   fuzz_frame      [mode u8][world u8] frame...
 *                   mode & 3: 0 dense table, one value length; 1 dense, a
 *                   length per key; 2 sparse (any key); 3 no table (NULL)
 *   fuzz_handshake  [world u8][rank u8][flags u8][0 u8] HELLO (32) RESUME (40)
 *                   flags & 1: we dialed rank (flags >> 1) % world, else the
 *                   peer dialed; flags & 0x80: a session exists (RESUME must
 *                   show FUZZ_INCARNATION)
 *   fuzz_bootstrap  [kind u8][world u8][rank u8][0 u8] message...
 *                   kind & 1: 0 a BS_HELLO to rank 0, 1 a BS_LIST (header
 *                   and addresses) to rank `rank`
 *   fuzz_table      [world u8][type u8] body... (the header is made up:
 *                   type & 1: 0 TABLE, 1 TABLE_ACK; the body padded to 8)
 */
#ifndef FERRY_FUZZ_FUZZ_H
#define FERRY_FUZZ_FUZZ_H

#include <stdint.h>

#include "lib/core/proto.h"

#define FUZZ_NKEYS 100
#define FUZZ_VLEN 3
#define FUZZ_CLUSTER 0x1122334455667788ull
#define FUZZ_INCARNATION 0x0badc0ffee0ddf00ull

/* world sizes stay small: a TABLE_ACK trailer or an address list has one
 * entry per rank */
static inline uint32_t fuzz_world(uint8_t b)
{
	return 1u + b % 8u;
}

/* per-key lengths of the dense table with a length per key: 1 + key % 5 */
static inline void fuzz_key_lens(uint32_t *lens)
{
	for (uint32_t k = 0; k < FUZZ_NKEYS; k++)
		lens[k] = 1 + k % 5;
}

#endif

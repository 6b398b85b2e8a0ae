/* SPDX-License-Identifier: MIT */
/*
 * ckpt.h - checkpoints of a table (lib/ckpt/): the files' layout, shared by
 * the writer (ckpt.c) and the reader (restore.c).
 *
 *   <dir>/shard-<rank>-of-<world>.fck     one per node, written by that node
 *   +----------------------------------+
 *   | header (64 bytes, little endian) |  magic "FERRYCK1", version, rank,
 *   +----------------------------------+  world, keys, num_keys, value_len
 *   | key u64 | len u32 | 0 u32 | len  |  one record per key the node owned
 *   | floats                           |  at the mark, in no special order
 *   +----------------------------------+
 *   <dir>/manifest.json                   rank 0, once every shard is
 *                                         written: the table's parameters,
 *                                         the node count, per shard its
 *                                         file, keys, bytes and the XXH3-64
 *                                         of the whole file
 *
 * The manifest is written last (to a temporary name, fsynced, renamed), and
 * rank 0 removes an old one first, so a folder with a manifest holds a whole
 * checkpoint; the checksums make a truncated or changed shard visible.
 */
#ifndef FERRY_LIB_CKPT_H
#define FERRY_LIB_CKPT_H

#include <stdint.h>

#define FERRY_CKPT_MAGIC "FERRYCK1"
#define FERRY_CKPT_VERSION 1u
#define FERRY_CKPT_MANIFEST "manifest.json"
#define FERRY_CKPT_FORMAT "ferry-checkpoint"

struct ferry_ckpt_hdr {
	char magic[8];
	uint32_t version;
	uint32_t rank;
	uint32_t world;
	uint32_t value_len; /* the table's value_len (0 with value_lens) */
	uint64_t keys;	    /* records that follow */
	uint64_t num_keys;  /* the table's */
	uint64_t lens_hash; /* the table's (proto: struct ferry_msg_table) */
	uint8_t pad[16];
};

struct ferry_ckpt_rec {
	uint64_t key;
	uint32_t len; /* floats that follow */
	uint32_t zero;
};

_Static_assert(sizeof(struct ferry_ckpt_hdr) == 64, "shard header is 64 bytes");
_Static_assert(sizeof(struct ferry_ckpt_rec) == 16, "record header is 16 bytes");

#endif /* FERRY_LIB_CKPT_H */

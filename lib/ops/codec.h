/* SPDX-License-Identifier: MIT */
/*
 * codec.h - compressed pushes: 16-bit values on the wire with error feedback
 * (struct ferry_table_params.push_codec; docs/compression.md).
 *
 * A push on a table with a codec adds each key's residual (what earlier
 * pushes of this worker rounded away) to the delta, rounds the sum to a
 * value the codec holds exactly, pushes that, and keeps the difference as
 * the new residual. The frames carry 16-bit codes (FERRY_OP_F_BF16/FP16 in
 * the OP header) and the receiver decodes them to the same floats, so a
 * forward or a queued replay re-encodes them without loss. The residuals
 * change only when the push succeeded: a failed push leaves them, and the
 * caller's deltas, as they were.
 *
 * Memory, per worker and table with a codec: the residuals of at most
 * codec_keys keys, or of one push's keys when a single push has more
 * (value_len floats each, in a pool that doubles as keys come, plus their
 * keymap: 32-43 B per key); a push that would pass it first sends every
 * residual (exact floats) and empties the store. Plus, per table,
 * FERRY_MAX_WORKERS pointers once any worker pushed.
 */
#ifndef FERRY_LIB_OPS_CODEC_H
#define FERRY_LIB_OPS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/ferry.h"

struct ferry_table;
struct ferry_worker;

/* value codes: round to nearest even; FP16 saturates finite values at
 * +-65504 (the residual keeps the rest); NaN stays NaN */
uint16_t ferry__codec_bf16(float f);
float ferry__codec_bf16_val(uint16_t c);
uint16_t ferry__codec_fp16(float f);
float ferry__codec_fp16_val(uint16_t c);

/* the OP flag of @codec (0 for NONE) */
uint16_t ferry__codec_flag(enum ferry_push_codec codec);
/* encode / decode @n values for OP flag @flag (FERRY_OP_F_BF16 or _FP16) */
void ferry__codec_encode(uint16_t flag, const float *in, uint16_t *out, size_t n);
void ferry__codec_decode(uint16_t flag, const uint16_t *in, float *out, size_t n);

/* Return: 0 or -EINVAL (logged) for a codec the table cannot have */
int ferry__codec_check(const struct ferry_table_params *p);

/* ferry_push() on a table with a codec. Context: @w's thread. */
int ferry__codec_push(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		      const float *deltas);
/* send @w's residuals of @t, exactly; empty them on success */
int ferry__codec_flush(struct ferry_worker *w, struct ferry_table *t);
/* residual keys held for @t (all workers; for stats and tests) */
uint64_t ferry__codec_count(struct ferry_table *t);
/* free the table's residual stores (logs what was never flushed).
 * Context: table release, no worker pushing. */
void ferry__codec_table_fini(struct ferry_table *t);

#endif /* FERRY_LIB_OPS_CODEC_H */

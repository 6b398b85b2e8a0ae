/* SPDX-License-Identifier: MIT */
/*
 * fuzz_frame - the frame decoder as a node runs it on bytes off the wire:
 * ferry__proto_check_hdr() (the transport, before len is trusted), then
 * ferry__proto_parse() on a frame of exactly its header's length (the core's
 * dispatcher) with a table's limits: dense with one value length, dense with
 * a length per key, sparse (lim.num_keys 0: any key), or none. Every view a
 * parse hands out is read to its last byte, so AddressSanitizer catches a
 * view that reaches past the frame; what parse promises (counts that fit,
 * keys in range, lengths that match the table) is checked and aborts when
 * broken. parse also runs alone on the raw input (it must refuse what the
 * header check would).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "fuzz/fuzz.h"

static uint32_t key_lens[FUZZ_NKEYS];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(enum ferry_log_level level, const char *msg, void *arg)
{
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_key_lens(key_lens);
	ferry_log_set(FERRY_LOG_ERROR, quiet, NULL);
	return 0;
}

/* within [buf, buf + len)? */
static void in_frame(const uint8_t *buf, size_t len, const void *p, size_t bytes)
{
	const uint8_t *q = p;

	if (q < buf || q > buf + len || bytes > (size_t)(buf + len - q))
		abort();
}

/* read every byte a view points at; check what parse promises */
static volatile uint64_t sink;

static void walk(const uint8_t *buf, size_t len, const struct ferry_proto_limits *lim,
		 const struct ferry_proto_view *v)
{
	const struct ferry_msg_hdr *hdr = v->hdr;
	uint64_t sum = 0;
	size_t nvals = 0;

	if ((const uint8_t *)hdr != buf || !v->body)
		abort();
	if (v->keys) {
		in_frame(buf, len, v->keys, (size_t)v->count * sizeof(*v->keys));
		for (uint32_t i = 0; i < v->count; i++) {
			if (lim->num_keys && v->keys[i].key >= lim->num_keys)
				abort();
			if (v->keys[i].len != ferry__proto_value_len(lim, v->keys[i].key))
				abort();
			sum += v->keys[i].key + v->keys[i].idx;
			nvals += v->keys[i].len;
		}
		if (((const struct ferry_msg_op *)v->body)->op != FERRY_OP_PULL &&
		    v->nvals != nvals)
			abort();
	}
	if (v->mvs) {
		in_frame(buf, len, v->mvs, (size_t)v->count * sizeof(*v->mvs));
		for (uint32_t i = 0; i < v->count; i++) {
			if (lim->num_keys && v->mvs[i].key >= lim->num_keys)
				abort();
			if (hdr->type == FERRY_MSG_HANDOVER &&
			    v->mvs[i].len != ferry__proto_value_len(lim, v->mvs[i].key))
				abort();
			sum += v->mvs[i].key + v->mvs[i].slot + v->mvs[i].landing;
		}
	}
	if (v->idx) {
		in_frame(buf, len, v->idx, (size_t)v->count * sizeof(*v->idx));
		for (uint32_t i = 0; i < v->count; i++)
			sum += v->idx[i];
	}
	if (v->slots) {
		in_frame(buf, len, v->slots, (size_t)v->count * sizeof(*v->slots));
		for (uint32_t i = 0; i < v->count; i++)
			sum += v->slots[i];
	}
	if (v->arenas) {
		if (v->count != lim->world)
			abort();
		in_frame(buf, len, v->arenas, (size_t)v->count * sizeof(*v->arenas));
		for (uint32_t i = 0; i < v->count; i++)
			sum += v->arenas[i].addr + v->arenas[i].inbox_entries;
	}
	if (hdr->type == FERRY_MSG_HOT_PUSH) {
		/* hot-key deltas (lib/cons/hot.c): entries ascending, values after */
		const struct ferry_msg_hot_ent *es = v->data;

		in_frame(buf, len, es, (size_t)v->count * sizeof(*es));
		for (uint32_t i = 0; i < v->count; i++) {
			if ((i && es[i].idx <= es[i - 1].idx) || !es[i].len)
				abort();
			nvals += es[i].len;
		}
		if (nvals != v->nvals)
			abort();
	}
	if (v->nvals && v->codes) {
		/* a compressed push: 16-bit codes instead of floats */
		if (v->vals || hdr->type != FERRY_MSG_OP ||
		    ((const struct ferry_msg_op *)v->body)->op != FERRY_OP_PUSH)
			abort();
		in_frame(buf, len, v->codes, v->nvals * sizeof(uint16_t));
		for (size_t i = 0; i < v->nvals; i++)
			sum += v->codes[i];
	} else if (v->nvals) {
		in_frame(buf, len, v->vals, v->nvals * sizeof(float));
		for (size_t i = 0; i < v->nvals; i++) {
			uint32_t bits;

			memcpy(&bits, &v->vals[i], sizeof(bits));
			sum += bits;
		}
	}
	sink = sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ferry_proto_limits lims[4] = {
		{ .num_keys = FUZZ_NKEYS, .value_len = FUZZ_VLEN },
		{ .num_keys = FUZZ_NKEYS, .value_lens = key_lens },
		{ .num_keys = 0, .value_len = FUZZ_VLEN },
		{ 0 },
	};
	const struct ferry_proto_limits *lim;
	struct ferry_proto_view v;
	struct ferry_msg_hdr hdr;
	const char *why = NULL;
	uint8_t *frame;
	uint32_t world;
	int mode;

	if (size < 2)
		return 0;
	mode = data[0] & 3;
	world = fuzz_world(data[1]);
	for (int i = 0; i < 4; i++)
		lims[i].world = world;
	lim = mode == 3 ? NULL : &lims[mode];
	data += 2;
	size -= 2;

	/* parse alone, on the whole input, in a buffer of exactly its size */
	frame = malloc(size ? size : 1);
	memcpy(frame, data, size);
	if (!ferry__proto_parse(frame, size, lim, &v, &why)) {
		if (ferry__proto_check_hdr(v.hdr, world, &why) && v.hdr->src < world &&
		    v.hdr->magic == FERRY_MSG_MAGIC && v.hdr->version == FERRY_PROTO_VERSION &&
		    v.hdr->len % FERRY_MSG_ALIGN == 0)
			abort(); /* parse took a type the header check refuses */
		walk(frame, size, lim ? lim : &lims[3], &v);
	} else if (!why) {
		abort(); /* a refusal must say why */
	}
	free(frame);

	/* as a node: the header first, then the frame of its stated length */
	if (size < sizeof(hdr))
		return 0;
	memcpy(&hdr, data, sizeof(hdr));
	if (ferry__proto_check_hdr(&hdr, world, &why))
		return 0;
	if (hdr.len > size)
		return 0; /* the transport would wait for the rest */
	frame = malloc(hdr.len);
	memcpy(frame, data, hdr.len);
	why = NULL;
	if (!ferry__proto_parse(frame, hdr.len, lim, &v, &why))
		walk(frame, hdr.len, lim ? lim : &lims[3], &v);
	else if (!why)
		abort();
	free(frame);
	return 0;
}

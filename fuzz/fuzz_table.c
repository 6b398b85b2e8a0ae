/* SPDX-License-Identifier: MIT */
/*
 * fuzz_table - the table-create exchange: a TABLE (node -> rank 0: the
 * parameters that must agree, the sender's arena and landing inbox) or a
 * TABLE_ACK (rank 0 -> every node: the verdict, and for one-sided transports
 * a trailer of one arena and inbox per rank) through the header check and
 * ferry__proto_parse() as the dispatcher runs them (node limits: the world
 * only). The input is the body; the header is made up to fit it, so every
 * execution reaches the body checks. A parse that succeeds is held to its
 * promises: a known initializer, sparse 0 or 1, every announced inbox
 * within the limits (docs/protocol.md, "Landing inboxes"), and a trailer of
 * exactly world entries inside the frame, which is then read whole (the
 * node copies it).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(enum ferry_log_level level, const char *msg, void *arg)
{
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	ferry_log_set(FERRY_LOG_ERROR, quiet, NULL);
	return 0;
}

/* an inbox parse let through: none, or within every limit */
static void inbox_ok(uint64_t addr, uint64_t rkey, uint32_t entries, uint32_t stride)
{
	uint64_t bytes = (uint64_t)entries * stride;

	if (!entries) {
		if (addr || rkey || stride)
			abort();
		return;
	}
	if (entries > FERRY_INBOX_MAX_ENTRIES || !addr || !stride || stride % 64 ||
	    stride > FERRY_INBOX_MAX_STRIDE || (entries > 1 && bytes > FERRY_INBOX_BYTES) ||
	    addr + bytes < addr)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ferry_proto_limits lim = { 0 };
	const struct ferry_msg_table *m;
	struct ferry_proto_view v;
	struct ferry_msg_arena *copy;
	size_t len, body;
	const char *why = NULL;
	uint8_t type, *frame;

	if (size < 2 || size > FERRY_MSG_MAX / 2)
		return 0;
	lim.world = fuzz_world(data[0]);
	type = data[1] & 1 ? FERRY_MSG_TABLE_ACK : FERRY_MSG_TABLE;
	body = size - 2;
	len = sizeof(struct ferry_msg_hdr) + body;
	len = (len + FERRY_MSG_ALIGN - 1) / FERRY_MSG_ALIGN * FERRY_MSG_ALIGN;
	frame = calloc(1, len);
	ferry__proto_hdr_init((struct ferry_msg_hdr *)frame, type, (uint32_t)len, lim.world - 1, 0);
	memcpy(frame + sizeof(struct ferry_msg_hdr), data + 2, body);
	if (ferry__proto_check_hdr((const struct ferry_msg_hdr *)frame, lim.world, &why))
		abort(); /* the made-up header is a good one */
	if (ferry__proto_parse(frame, len, &lim, &v, &why)) {
		if (!why)
			abort();
		free(frame);
		return 0;
	}
	m = v.body;
	if (m->init > 2 || m->sparse > 1)
		abort();
	inbox_ok(m->inbox_addr, m->inbox_rkey, m->inbox_entries, m->inbox_stride);
	if (v.arenas) {
		if (type != FERRY_MSG_TABLE_ACK || v.count != lim.world ||
		    (const uint8_t *)(v.arenas + lim.world) > frame + len)
			abort();
		/* the node keeps a copy of the trailer (lib/table) */
		copy = malloc(lim.world * sizeof(*copy));
		memcpy(copy, v.arenas, lim.world * sizeof(*copy));
		for (uint32_t r = 0; r < lim.world; r++)
			inbox_ok(copy[r].inbox_addr, copy[r].inbox_rkey, copy[r].inbox_entries,
				 copy[r].inbox_stride);
		free(copy);
	}
	free(frame);
	return 0;
}

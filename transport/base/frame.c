/* SPDX-License-Identifier: MIT */
/*
 * frame.c - the header checks every transport and the core share. Nothing
 * here trusts a field before checking it.
 */
#include <stdio.h>
#include <string.h>

#include "ferry/ferry.h"
#include "transport/base/frame.h"

void ferry__proto_hdr_init(struct ferry_msg_hdr *hdr, uint8_t type, uint32_t len, uint32_t src,
			   uint32_t table)
{
	hdr->magic = FERRY_MSG_MAGIC;
	hdr->version = FERRY_PROTO_VERSION;
	hdr->type = type;
	hdr->len = len;
	hdr->src = src;
	hdr->table = table;
}

int ferry__proto_check_hdr(const struct ferry_msg_hdr *hdr, uint32_t world, const char **why_p)
{
	const char *why = NULL;

	if (hdr->magic != FERRY_MSG_MAGIC)
		why = "bad magic";
	else if (hdr->version != FERRY_PROTO_VERSION)
		why = "unsupported protocol version";
	else if (hdr->type == 0 || hdr->type >= FERRY_MSG_TYPE_MAX)
		why = "unknown message type";
	else if (hdr->len < sizeof(*hdr) || hdr->len > FERRY_MSG_MAX)
		why = "frame length out of range";
	else if (hdr->len % FERRY_MSG_ALIGN)
		why = "frame length not a multiple of 8";
	else if (hdr->src >= world)
		why = "source rank out of range";
	if (!why)
		return 0;
	if (why_p)
		*why_p = why;
	return -FERRY_E_PROTO;
}

int ferry__proto_check_hello(const void *frame, size_t len, uint64_t cluster_id, uint32_t world,
			     uint32_t rank, int dialed, char *why, size_t wlen)
{
	const size_t need = sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_hello);
	struct ferry_msg_hello hello;
	struct ferry_msg_hdr hdr;
	const char *bad = "invalid header";

	if (len < need) {
		snprintf(why, wlen, "its first %zu bytes are not a HELLO", len);
		return -1;
	}
	memcpy(&hdr, frame, sizeof(hdr));
	memcpy(&hello, (const uint8_t *)frame + sizeof(hdr), sizeof(hello));
	if (hdr.magic == FERRY_MSG_MAGIC && hdr.type == FERRY_MSG_AUTH) {
		snprintf(why, wlen,
			 "it opens with a token proof: it was started with FERRY_TOKEN and this "
			 "node without; give every node the same token");
		return -1;
	}
	if (ferry__proto_check_hdr(&hdr, world, &bad)) {
		snprintf(why, wlen, "not a Ferry HELLO (%s)", bad);
		return -1;
	}
	if (hdr.type != FERRY_MSG_HELLO || hdr.len != need) {
		snprintf(why, wlen, "its first frame is of type %u and %u bytes, not a HELLO",
			 hdr.type, hdr.len);
		return -1;
	}
	if (hello.cluster_id != cluster_id) {
		snprintf(why, wlen,
			 "cluster id %#llx is not ours (%#llx): a node of another cluster, or a "
			 "stale one",
			 (unsigned long long)hello.cluster_id, (unsigned long long)cluster_id);
		return -1;
	}
	if (hello.world != world) {
		snprintf(why, wlen, "world size %u is not ours (%u)", hello.world, world);
		return -1;
	}
	if (hello.rank != hdr.src || hello.rank >= world || hello.rank == rank) {
		snprintf(why, wlen, "it claims rank %u (header src %u)", hello.rank, hdr.src);
		return -1;
	}
	if (dialed >= 0 && hello.rank != (uint32_t)dialed) {
		snprintf(why, wlen, "we dialed rank %d but rank %u answered", dialed, hello.rank);
		return -1;
	}
	if (dialed < 0 && hello.rank < rank) {
		snprintf(why, wlen, "rank %u is lower than ours and should wait for our dial",
			 hello.rank);
		return -1;
	}
	return (int)hello.rank;
}

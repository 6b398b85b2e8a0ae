/* SPDX-License-Identifier: MIT */
/*
 * fuzz_handshake - the transports' handshake checks on what a connection
 * sends first: ferry__proto_check_hello() (every transport: the HELLO, its
 * header, cluster id, world and rank, who may dial whom) on however many
 * bytes came, then, as the tcp transport does once TCP_HS_LEN bytes are in
 * and the HELLO passed, ferry__tcp_resume_parse() on the RESUME after it
 * (header, sender, incarnation of an existing session or none). Each check
 * runs on a buffer of exactly the bytes it may read.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "fuzz/fuzz.h"
#include "transport/tcp/tcp.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void quiet(enum ferry_log_level level, const char *msg, void *arg)
{
}

static struct tcp_tp tp; /* only base.cfg.world is read */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	ferry_log_set(FERRY_LOG_ERROR, quiet, NULL);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t world, rank;
	struct ferry_msg_resume r;
	size_t hello_len;
	uint8_t *buf;
	char why[200];
	int dialed, peer;
	uint8_t flags;

	if (size < 4)
		return 0;
	world = 1 + fuzz_world(data[0]); /* at least 2: someone to talk to */
	rank = data[1] % world;
	flags = data[2];
	dialed = flags & 1 ? (int)((flags >> 1) % world) : -1;
	data += 4;
	size -= 4;

	hello_len = size < TCP_HELLO_LEN ? size : TCP_HELLO_LEN;
	buf = malloc(hello_len ? hello_len : 1);
	memcpy(buf, data, hello_len);
	why[0] = '\0';
	peer = ferry__proto_check_hello(buf, hello_len, FUZZ_CLUSTER, world, rank, dialed, why,
					sizeof(why));
	free(buf);
	if (peer < 0) {
		if (!why[0])
			abort(); /* a refusal is logged with its cause */
		return 0;
	}
	/* what the check promises the transport */
	if ((uint32_t)peer >= world || (uint32_t)peer == rank || (dialed >= 0 && peer != dialed) ||
	    (dialed < 0 && (uint32_t)peer < rank))
		abort();
	if (size < TCP_HS_LEN)
		return 0;
	buf = malloc(TCP_RESUME_LEN);
	memcpy(buf, data + TCP_HELLO_LEN, TCP_RESUME_LEN);
	tp.base.cfg.world = world;
	why[0] = '\0';
	if (ferry__tcp_resume_parse(&tp, buf, (uint32_t)peer, flags & 0x80 ? FUZZ_INCARNATION : 0,
				    &r, why, sizeof(why))) {
		if (!why[0])
			abort();
	} else if ((flags & 0x80) && r.incarnation != FUZZ_INCARNATION) {
		abort();
	} else if (!(flags & 0x80) && (r.delivered || r.sent)) {
		abort(); /* a first connection resumes nothing */
	}
	free(buf);
	return 0;
}

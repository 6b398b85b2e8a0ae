/* SPDX-License-Identifier: MIT */
/*
 * fuzz_bootstrap - the rendezvous messages (lib/core/bootstrap.c), which
 * arrive before any cluster exists, from anyone who reaches the port:
 * rank 0's ferry__bs_hello_parse() on a BS_HELLO, and a joining node's
 * ferry__bs_list_parse() on rank 0's BS_LIST (including the line it would
 * log for a refusal) and ferry__bs_addrs_check() on the addresses after it;
 * and, once the cluster runs, rank 0's ferry__bs_rejoin_parse() on a
 * replacement's rejoin hello (lib/core/rejoin.c).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "fuzz/fuzz.h"
#include "lib/core/bootstrap.h"

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

static int fuzz_hello(const uint8_t *data, size_t size, uint32_t world)
{
	struct ferry_bs_hello h;
	uint8_t *buf = malloc(size ? size : 1);
	int rc;

	memcpy(buf, data, size);
	rc = ferry__bs_hello_parse(buf, size, world, &h);
	free(buf);
	if (rc && rc != -FERRY_E_PROTO && rc != -FERRY_E_MISMATCH)
		abort();
	/* rank 0 files the node's address under its rank: both must fit */
	if (!rc && (h.rank == 0 || h.rank >= world || h.addr.len > FERRY_TP_ADDR_MAX))
		abort();
	return 0;
}

static int fuzz_list(const uint8_t *data, size_t size, uint32_t world, uint32_t rank)
{
	struct ferry_config c;
	struct ferry_bs_list list;
	struct ferry_addr *addrs;
	size_t hdr = size < sizeof(list) ? size : sizeof(list);
	uint8_t *buf = malloc(hdr ? hdr : 1);
	char why[512];
	int rc;

	memset(&c, 0, sizeof(c));
	c.world = (int)world;
	c.rank = (int)(rank % world);
	snprintf(c.rdv_host, sizeof(c.rdv_host), "127.0.0.1");
	c.rdv_port = 29500;
	c.rank_src = "the fuzzer";
	c.rdv_var = "FERRY_RENDEZVOUS";
	memcpy(buf, data, hdr);
	why[0] = '\0';
	rc = ferry__bs_list_parse(&c, buf, hdr, &list, why, sizeof(why));
	free(buf);
	if (rc) {
		if (rc > 0 || !why[0])
			abort();
		return 0;
	}
	if (list.world != world || list.nmissing > FERRY_BS_MISSING_MAX)
		abort();
	if (size - hdr < world * sizeof(*addrs))
		return 0; /* the node would time out waiting for the rest */
	addrs = malloc(world * sizeof(*addrs));
	memcpy(addrs, data + hdr, world * sizeof(*addrs));
	rc = ferry__bs_addrs_check(addrs, world, why, sizeof(why));
	if (!rc)
		for (uint32_t r = 0; r < world; r++)
			if (addrs[r].len > FERRY_TP_ADDR_MAX)
				abort();
	free(addrs);
	return 0;
}

static int fuzz_rejoin(const uint8_t *data, size_t size, uint32_t world)
{
	struct ferry_bs_hello h;
	uint8_t *buf = malloc(size ? size : 1);
	int rc;

	memcpy(buf, data, size);
	rc = ferry__bs_rejoin_parse(buf, size, world, &h);
	free(buf);
	if (rc && rc != -FERRY_E_PROTO && rc != -FERRY_E_MISMATCH && rc != -EINVAL)
		abort();
	/* rank 0 reads fy->failed[h.rank]: it must be a rank of the world, not 0 */
	if (!rc && (h.rank == 0 || h.rank >= world || h.addr.len > FERRY_TP_ADDR_MAX))
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t world;

	if (size < 4)
		return 0;
	world = fuzz_world(data[1]);
	if (data[0] & 2)
		return fuzz_rejoin(data + 4, size - 4, world);
	if (data[0] & 1)
		return fuzz_list(data + 4, size - 4, world, data[2]);
	return fuzz_hello(data + 4, size - 4, world);
}

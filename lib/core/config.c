/* SPDX-License-Identifier: MIT */
/*
 * config.c - where rank, world and the rendezvous come from, in order:
 * params, FERRY_* variables, torchrun (RANK WORLD_SIZE MASTER_ADDR
 * MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*), PMI (PMI_RANK PMI_SIZE), Slurm
 * (SLURM_PROCID SLURM_NTASKS). The log says which source was used.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/core/config.h"
#include "transport/base/log.h"

const struct ferry_option ferry__options[] = {
	{ "FERRY_RANK", "rank", "launcher's", "this node's rank, 0 .. world-1" },
	{ "FERRY_WORLD", "world", "launcher's, else 1", "number of nodes" },
	{ "FERRY_RENDEZVOUS", "rendezvous", "MASTER_ADDR:MASTER_PORT+1",
	  "host:port where rank 0 gathers the nodes' addresses" },
	{ "FERRY_BIND_ADDR", "bind_addr", "rendezvous host", "address this node listens on" },
	{ "FERRY_TRANSPORT", "transport", "auto",
	  "auto, tcp or rdma (loop: tests, one-sided access emulated in one process)" },
	{ "FERRY_TIMEOUT_MS", "timeout_ms", "30000", "bound on every wait, in milliseconds" },
	{ "FERRY_BUSY_POLL", "busy_poll", "0", "1: spin instead of sleeping (lower latency)" },
	{ "FERRY_RECONNECT_MS", "-", "1000",
	  "tcp: bound on re-establishing a broken link; 0: it fails the peer" },
	{ "FERRY_LOG_LEVEL", "ferry_log_set()", "warn", "none, error, warn, info, debug" },
	{ "FERRY_TCP_FAULT_RESET_MS", "-", "0", "tests: break a tcp connection every N ms" },
	{ "FERRY_RDMA_DEVICE", "-", "first with an active port", "RDMA device to use" },
	{ "FERRY_RDMA_GID_INDEX", "-", "the RoCE v2 GID of the IPv4 address",
	  "GID index for RoCE" },
	{ NULL, NULL, NULL, NULL },
};

void ferry_params_init(struct ferry_params *p)
{
	memset(p, 0, sizeof(*p));
	p->rank = -1;
	p->rendezvous_fd = -1;
	p->busy_poll = -1;
}

/* a whole non-negative decimal int, or -1 */
static int config_int(const char *s)
{
	char *end;
	long v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < 0 || v > INT_MAX)
		return -1;
	return (int)v;
}

struct config_src {
	const char *rank, *world, *name;
};

static const struct config_src config_srcs[] = {
	{ "FERRY_RANK", "FERRY_WORLD", "FERRY_RANK/FERRY_WORLD" },
	{ "RANK", "WORLD_SIZE", "torchrun RANK/WORLD_SIZE" },
	{ "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI OMPI_COMM_WORLD_RANK/SIZE" },
	{ "PMI_RANK", "PMI_SIZE", "PMI_RANK/PMI_SIZE" },
	{ "SLURM_PROCID", "SLURM_NTASKS", "Slurm SLURM_PROCID/SLURM_NTASKS" },
};

static int config_split_hostport(const char *s, struct ferry_config *c)
{
	const char *colon = strrchr(s, ':');
	size_t hl;
	int port;

	if (!colon || colon == s)
		return -EINVAL;
	hl = (size_t)(colon - s);
	if (hl >= sizeof(c->rdv_host))
		return -EINVAL;
	port = config_int(colon + 1);
	if (port < 0 || port > 65535)
		return -EINVAL;
	memcpy(c->rdv_host, s, hl);
	c->rdv_host[hl] = '\0';
	c->rdv_port = port;
	return 0;
}

int ferry__config_resolve(const struct ferry_params *params, struct ferry_config *c)
{
	struct ferry_params dflt;
	const char *s;
	int v;

	if (!params) {
		ferry_params_init(&dflt);
		params = &dflt;
	}
	memset(c, 0, sizeof(*c));
	c->rank = params->rank;
	c->world = params->world;
	c->rdv_fd = params->rendezvous_fd;
	c->rank_src = "params";

	if (c->rank < 0 || c->world <= 0) {
		for (size_t i = 0; i < sizeof(config_srcs) / sizeof(config_srcs[0]); i++) {
			const char *r = getenv(config_srcs[i].rank);
			const char *w = getenv(config_srcs[i].world);

			if (!r && !w)
				continue;
			if (c->rank < 0)
				c->rank = config_int(r);
			if (c->world <= 0)
				c->world = config_int(w);
			c->rank_src = config_srcs[i].name;
			if (c->rank < 0 || c->world <= 0) {
				ferry_err(
					"config: %s is set but not a valid rank and world (%s=%s, "
					"%s=%s); set both to whole numbers",
					c->rank_src, config_srcs[i].rank, r ? r : "(unset)",
					config_srcs[i].world, w ? w : "(unset)");
				return -EINVAL;
			}
			break;
		}
	}
	if (c->rank < 0 && c->world <= 0) {
		c->rank = 0;
		c->world = 1;
		c->rank_src = "default (a single node)";
	}
	if (c->rank < 0 || c->world <= 0 || c->rank >= c->world || c->world > 65535) {
		ferry_err("config: rank %d of world %d (from %s) is invalid; rank must be 0 .. "
			  "world-1 and world 1 .. 65535",
			  c->rank, c->world, c->rank_src);
		return -EINVAL;
	}

	s = params->rendezvous;
	c->rdv_src = "params";
	if (!s) {
		s = getenv("FERRY_RENDEZVOUS");
		c->rdv_src = "FERRY_RENDEZVOUS";
	}
	if (s) {
		if (config_split_hostport(s, c)) {
			ferry_err("config: rendezvous '%s' (from %s) is not host:port", s,
				  c->rdv_src);
			return -EINVAL;
		}
	} else if (getenv("MASTER_ADDR") && getenv("MASTER_PORT")) {
		/* torch's own store listens on MASTER_PORT: take the next one */
		v = config_int(getenv("MASTER_PORT"));
		if (v < 0 || v >= 65535 || strlen(getenv("MASTER_ADDR")) >= sizeof(c->rdv_host)) {
			ferry_err("config: MASTER_ADDR/MASTER_PORT are not a usable address; set "
				  "FERRY_RENDEZVOUS=host:port");
			return -EINVAL;
		}
		snprintf(c->rdv_host, sizeof(c->rdv_host), "%s", getenv("MASTER_ADDR"));
		c->rdv_port = v + 1;
		c->rdv_src = "torchrun MASTER_ADDR/MASTER_PORT+1";
	} else if (c->world > 1 && !(c->rank == 0 && c->rdv_fd >= 0)) {
		ferry_err("config: rank %d of %d has no rendezvous address; set "
			  "FERRY_RENDEZVOUS=host:port (where rank 0 listens) or MASTER_ADDR and "
			  "MASTER_PORT",
			  c->rank, c->world);
		return -EINVAL;
	} else {
		snprintf(c->rdv_host, sizeof(c->rdv_host), "127.0.0.1");
		c->rdv_src = "default";
	}

	s = params->bind_addr ? params->bind_addr : getenv("FERRY_BIND_ADDR");
	snprintf(c->bind_addr, sizeof(c->bind_addr), "%s", s && *s ? s : c->rdv_host);

	c->transport = params->transport;
	if (c->transport < FERRY_TRANSPORT_AUTO || c->transport > FERRY_TRANSPORT_LOOP) {
		ferry_err("config: transport %d is not FERRY_TRANSPORT_AUTO, _TCP, _RDMA or _LOOP",
			  (int)c->transport);
		return -EINVAL;
	}
	if (c->transport == FERRY_TRANSPORT_AUTO && (s = getenv("FERRY_TRANSPORT"))) {
		if (!strcasecmp(s, "tcp"))
			c->transport = FERRY_TRANSPORT_TCP;
		else if (!strcasecmp(s, "rdma"))
			c->transport = FERRY_TRANSPORT_RDMA;
		else if (!strcasecmp(s, "loop"))
			c->transport = FERRY_TRANSPORT_LOOP;
		else if (strcasecmp(s, "auto")) {
			ferry_err("config: FERRY_TRANSPORT=%s is not auto, tcp, rdma or loop", s);
			return -EINVAL;
		}
	}

	c->timeout_ms = params->timeout_ms;
	if (c->timeout_ms <= 0) {
		s = getenv("FERRY_TIMEOUT_MS");
		c->timeout_ms = s ? config_int(s) : 30000;
		if (c->timeout_ms <= 0) {
			ferry_err("config: FERRY_TIMEOUT_MS=%s is not a positive number of ms", s);
			return -EINVAL;
		}
	}
	c->busy_poll = params->busy_poll;
	if (c->busy_poll > 1) {
		ferry_err("config: busy_poll %d is not -1 (from FERRY_BUSY_POLL), 0 or 1",
			  c->busy_poll);
		return -EINVAL;
	}
	if (c->busy_poll < 0) {
		s = getenv("FERRY_BUSY_POLL");
		c->busy_poll = s ? config_int(s) : 0;
		if (c->busy_poll < 0 || c->busy_poll > 1) {
			ferry_err("config: FERRY_BUSY_POLL=%s is not 0 or 1", s);
			return -EINVAL;
		}
	}
	ferry_info("config: rank %d of %d (from %s), rendezvous %s:%d (from %s)", c->rank, c->world,
		   c->rank_src, c->rdv_host, c->rdv_port, c->rdv_src);
	return 0;
}

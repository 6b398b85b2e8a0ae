/* SPDX-License-Identifier: MIT */
/* bootstrap.h - rank 0 gathers every node's transport address and hands out the list. */
#ifndef FERRY_LIB_BOOTSTRAP_H
#define FERRY_LIB_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "lib/core/config.h"
#include "transport/transport.h"

struct ferry_addr {
	uint32_t len;
	uint8_t buf[FERRY_TP_ADDR_MAX];
};

/*
 * ferry__bootstrap - exchange transport addresses through rank 0
 * @c: rank, world, rendezvous, timeout
 * @mine: this node's address
 * @addrs: receives world entries, rank r at index r
 * @cluster_id_p: receives the id rank 0 chose for this cluster
 *
 * Every wait ends by c->timeout_ms. Return: 0; -FERRY_E_NOJOIN when a rank
 * never arrived (the log names it); -ETIMEDOUT when rank 0 never answered;
 * -FERRY_E_MISMATCH when nodes disagree on the world size; -errno.
 */
int ferry__bootstrap(const struct ferry_config *c, const struct ferry_addr *mine,
		     struct ferry_addr *addrs, uint64_t *cluster_id_p);

/* listening TCP socket on host:port (port 0: the OS picks); -errno */
int ferry__listen_tcp(const char *host, int port, int backlog);
/* the port a bound socket has */
int ferry__socket_port(int fd);

#endif

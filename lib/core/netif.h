/* SPDX-License-Identifier: MIT */
/* netif.h - which address a node listens on, which it advertises, and why. */
#ifndef FERRY_LIB_NETIF_H
#define FERRY_LIB_NETIF_H

#include "lib/core/config.h"

/*
 * ferry__netif_pick - fill c->bind_addr, c->adv_addr and c->bind_why
 * @c: resolved but for those; c->rdv_host/rdv_port/rdv_src/rdv_var are read
 * @given: FERRY_BIND_ADDR or params->bind_addr, or NULL
 * @given_src: the name of where @given came from, for the log
 * @have_rdv: 0 when there is no rendezvous address to route to (PMIx)
 *
 * netif.c's header has the rules. Return: 0, or a negative errno after one
 * log line that names the setting to fix.
 */
int ferry__netif_pick(struct ferry_config *c, const char *given, const char *given_src,
		      int have_rdv);

#endif

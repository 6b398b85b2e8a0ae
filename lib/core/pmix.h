/* SPDX-License-Identifier: MIT */
/* pmix.h - the address exchange through a PMIx launcher (pmix.c). */
#ifndef FERRY_LIB_PMIX_H
#define FERRY_LIB_PMIX_H

#include <stdint.h>

#include "lib/core/bootstrap.h"
#include "lib/core/config.h"

#ifdef FERRY_HAVE_PMIX
/*
 * ferry__pmix_bootstrap - ferry__bootstrap() through the launcher's PMIx
 * server instead of a rendezvous: the same arguments and results
 *
 * Every wait ends by c->timeout_ms. Return: 0; -FERRY_E_NOJOIN when the
 * fence or a rank's address timed out; -FERRY_E_MISMATCH when rank or world
 * disagree with PMIx's; -ECONNREFUSED without a PMIx server; -errno.
 */
int ferry__pmix_bootstrap(const struct ferry_config *c, const struct ferry_addr *mine,
			  struct ferry_addr *addrs, uint64_t *cluster_id_p);
#endif

#endif

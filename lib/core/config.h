/* SPDX-License-Identifier: MIT */
/* config.h - a node's effective configuration: params, then FERRY_*, then launchers. */
#ifndef FERRY_LIB_CONFIG_H
#define FERRY_LIB_CONFIG_H

/* the failure detector's timeout when nothing sets it: long enough to ride
 * out a link down for a few seconds (ci/netns-test.sh's outage run: 3 s)
 * and a sanitizer's or an emulator's stalls; tests that need a quick
 * detector set their own (test_repl: 250 ms) */
#define FERRY_HEARTBEAT_MS_DEFAULT 5000

#include "ferry/ferry.h"
#include "transport/base/auth.h"

struct ferry_config {
	int rank;
	int world;
	char rdv_host[256];
	int rdv_port;
	int rdv_fd;
	char bind_addr[256]; /* what the transport binds (0.0.0.0: every interface) */
	char adv_addr[256];  /* what peers are told to dial: never a wildcard */
	char bind_why[256];  /* which rule chose them (netif.c) */
	enum ferry_transport_kind transport;
	int timeout_ms;
	int busy_poll;
	uint64_t mem_limit;   /* bytes; 0: none */
	int heartbeat_ms;     /* failure detector's timeout; -1: off */
	int rejoin;	      /* 1: replace a failed node of a running cluster (rejoin.c) */
	const char *rank_src; /* where rank and world came from */
	const char *rdv_src;  /* where the rendezvous came from */
	const char *rdv_var;  /* the variable to fix when it is wrong */
	int use_pmix;	      /* no rendezvous: exchange addresses through PMIx (pmix.c) */
	int auth;	      /* a token was given: auth_key is its key */
	uint8_t auth_key[FERRY_AUTH_KEY_LEN];
	const char *auth_src; /* where the token came from */
};

/* one row of the options table that README and ferry-info print */
struct ferry_option {
	const char *env;
	const char *param;
	const char *def;
	const char *what;
};

extern const struct ferry_option ferry__options[];

/* Return: 0, or -EINVAL after one log line that names the bad setting. */
int ferry__config_resolve(const struct ferry_params *params, struct ferry_config *c);

#endif

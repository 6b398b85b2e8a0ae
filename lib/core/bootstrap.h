/* SPDX-License-Identifier: MIT */
/* bootstrap.h - rank 0 gathers every node's transport address and hands out the list. */
#ifndef FERRY_LIB_BOOTSTRAP_H
#define FERRY_LIB_BOOTSTRAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lib/core/config.h"
#include "transport/transport.h"

struct ferry_addr {
	uint32_t len;
	uint8_t buf[FERRY_TP_ADDR_MAX];
};

/*
 * The rendezvous messages (docs/protocol.md, "bootstrap"), host order on
 * every supported machine (little-endian):
 *   rank r -> rank 0: struct ferry_bs_hello
 *   rank 0 -> rank r: struct ferry_bs_list, then (status 0) world
 *                     struct ferry_addr, rank order
 */
#define FERRY_BS_MAGIC 0x46594253u /* "FYBS" */
#define FERRY_BS_VERSION 1
#define FERRY_BS_MISSING_MAX 16

struct ferry_bs_hello {
	uint32_t magic;
	uint32_t version;
	uint32_t rank;
	uint32_t world;
	struct ferry_addr addr;
};

struct ferry_bs_list {
	uint32_t magic;
	int32_t status; /* 0, or a negative errno: the node may not join */
	uint64_t cluster_id;
	uint32_t world;
	uint32_t nmissing;
	uint32_t missing[FERRY_BS_MISSING_MAX];
	/* then world struct ferry_addr */
};

/*
 * ferry__bs_hello_parse - rank 0's check of a BS_HELLO (pure: no I/O, no log)
 * @buf, @len: what the connection sent (len < sizeof(struct ferry_bs_hello):
 *             not a hello)
 * @world: rank 0's world size
 * @h_p: the hello, written on 0 and on -FERRY_E_MISMATCH
 *
 * Whether a second node claims the same rank is the caller's to check.
 * Context: any thread. Return: 0; -FERRY_E_PROTO when it is not a Ferry
 * node's hello (magic, version, address length); -FERRY_E_MISMATCH when it is
 * one that cannot join this world (its world size differs, or its rank is 0
 * or not below the world size).
 */
int ferry__bs_hello_parse(const void *buf, size_t len, uint32_t world, struct ferry_bs_hello *h_p);

/*
 * ferry__bs_list_parse - a node's check of rank 0's BS_LIST header (pure)
 * @c: the node's configuration (rank, world, rendezvous: for the message)
 * @buf, @len: the header rank 0 sent (sizeof(struct ferry_bs_list) bytes)
 * @list_p: the header, written when the return is 0
 * @why, @wlen: on failure, the line to log (cause and fix)
 *
 * Context: any thread. Return: 0 when world addresses follow and should be
 * read (then ferry__bs_addrs_check() them); -FERRY_E_PROTO (garbage), the
 * refusal's status (-FERRY_E_NOJOIN, -FERRY_E_MISMATCH, another negative
 * errno) or -FERRY_E_MISMATCH (rank 0 runs another world size).
 */
int ferry__bs_list_parse(const struct ferry_config *c, const void *buf, size_t len,
			 struct ferry_bs_list *list_p, char *why, size_t wlen);

/* ferry__bs_addrs_check - @world addresses from rank 0 each fit their buffer.
 * Return: 0 or -FERRY_E_PROTO with @why. Context: any thread. */
int ferry__bs_addrs_check(const struct ferry_addr *addrs, uint32_t world, char *why, size_t wlen);

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
/*
 * ferry__bootstrap_keep - ferry__bootstrap(), and at rank 0 (@lfd_p not
 * NULL) the rendezvous listener handed back for the rejoin service instead
 * of closed (*@lfd_p: -1 when there is none). A node started with rejoin
 * asks rank 0 instead (ferry__bs_rejoin): that never returns 0 yet.
 */
int ferry__bootstrap_keep(const struct ferry_config *c, const struct ferry_addr *mine,
			  struct ferry_addr *addrs, uint64_t *cluster_id_p, int *lfd_p);

/* ---- rejoin: a replacement node asks a running cluster's rank 0 (its side here,
 * rank 0's in rejoin.c) ---- */

#define FERRY_BS_REJOIN_MAGIC 0x46594252u /* "FYBR": a rejoin's hello (struct ferry_bs_hello) */

/*
 * ferry__bs_rejoin_parse - check a rejoin hello against rank 0's world.
 * Return: 0; -FERRY_E_PROTO not a rejoin hello; -FERRY_E_MISMATCH another
 * world (*@h_p written); -EINVAL rank 0 or out of range (*@h_p written).
 */
int ferry__bs_rejoin_parse(const void *buf, size_t len, uint32_t world, struct ferry_bs_hello *h_p);

/*
 * ferry__bs_rejoin - the joiner's side: one hello to rank 0's rendezvous,
 * rank 0's verdict back. Return: a negative errno, logged with the fix (no
 * replacement is admitted yet: a failed rank gets -EOPNOTSUPP).
 */
int ferry__bs_rejoin(const struct ferry_config *c, const struct ferry_addr *mine);

struct ferry;
struct ferry_rejoin_srv;

/*
 * ferry__rejoin_srv_start - rank 0 answers rejoin hellos on @lfd (taken:
 * closed by stop, or here on failure) on a thread of its own, until
 * ferry__rejoin_srv_stop(); the service goes in fy->rejoin_srv.
 * Context: ferry__node_start, once connected. Return: 0 or a negative errno.
 */
int ferry__rejoin_srv_start(struct ferry *fy, const struct ferry_config *c, int lfd);
/* stop the thread (at most one connection's hello and views: about 2 s),
 * close the listener; the memory stays for a VIEW being handled */
void ferry__rejoin_srv_stop(struct ferry_rejoin_srv *srv);
/* free it (stopped first if it was not); once no handler runs */
void ferry__rejoin_srv_free(struct ferry_rejoin_srv *srv);
/* register the REJOIN_ASK and REJOIN_VIEW handlers. Context: before start */
int ferry__rejoin_attach(struct ferry *fy);

/* bootstrap.c's helpers, for rank 0's side in rejoin.c */
int64_t ferry__bs_now_ms(void);
int ferry__bs_io(int fd, void *buf, size_t len, int64_t deadline, int out);
/* the token exchange on @fd as @role (FERRY_AUTH_DIALER or _ACCEPTOR), @a
 * started here: 1 proved, -ETIMEDOUT past @deadline (ms, ferry__bs_now_ms),
 * or what ferry__auth_hs_step() returned (@a->why says why) */
struct ferry_auth_hs;
int ferry__bs_auth_run(struct ferry_auth_hs *a, const uint8_t *key, int role, int fd,
		       int64_t deadline);

int ferry__listen_tcp(const char *host, int port, int backlog);
/* the port a bound socket has */
int ferry__socket_port(int fd);

#endif

/* SPDX-License-Identifier: MIT */
/*
 * mgr.h - the membership manager: who holds the cluster's view of which
 * nodes are members, and its epoch (docs/membership.md).
 *
 * Embedded (the default): the cluster manages itself from rank 0, which
 * runs the rendezvous (lib/core/bootstrap.c), counts the barrier and
 * decides table creation and destruction; liveness comes from the
 * transports (a connection that breaks and cannot be re-established, a
 * peer that leaves). No state here, epoch 0.
 *
 * etcd (lib/mgr/etcd.c, when libcurl was found at build time): chosen by
 * params.etcd_endpoints or FERRY_ETCD_ENDPOINTS. Each node keeps a key under
 * the cluster's prefix, held by a lease it renews from a thread of its own;
 * the same thread watches the prefix, and a key that goes (its lease ended:
 * the node stopped renewing) makes this node declare that rank failed.
 *
 * A manager runs on a thread of its own, and ferry__node_peer_failed() is
 * for the progress thread only: the cfg's declare_dead() sends the node a
 * MGR_DEAD frame of its own (proto.h), whose handler makes the call.
 */
#ifndef FERRY_LIB_MGR_H
#define FERRY_LIB_MGR_H

#include <stddef.h>
#include <stdint.h>

struct ferry;
struct ferry_params;

struct ferry_mgr_cfg {
	const char *endpoints; /* comma-separated URLs */
	int ttl;	       /* seconds */
	const char *prefix;    /* key prefix of every Ferry cluster */
	/* what the manager's thread calls when it sees @rank's membership end
	 * at @epoch: hands it to the progress thread (a MGR_DEAD frame to
	 * self). A callback, so that a manager never calls mgr.c by name. */
	int (*declare_dead)(struct ferry *fy, uint32_t rank, uint64_t epoch);
};

struct ferry_mgr_ops {
	size_t size; /* of this table, so it can grow */
	const char *name;
	/* register this node, wait (bounded by the node's timeout) until every
	 * rank is a member, then keep watching. Context: ferry_open's thread,
	 * after the node started. Return: 0 or a negative errno (logged) */
	int (*start)(struct ferry *fy, const struct ferry_mgr_cfg *cfg, void **state_p);
	/* the epoch seen; any thread */
	uint64_t (*epoch)(const void *state);
	/* stop watching: no later departure is declared. Context: ferry_close,
	 * before the node stops */
	void (*quiesce)(void *state);
	/* give the membership up at once and free @state; never touches the
	 * node (gone by then). Context: ferry_close, after the node stopped, so
	 * the others hear the node's own goodbye first */
	void (*leave)(void *state);
};

#ifdef FERRY_HAVE_ETCD
extern const struct ferry_mgr_ops ferry__mgr_etcd_ops;
#endif

/* register the MGR_DEAD handler. Context: before the node starts. */
int ferry__mgr_attach(struct ferry *fy);
/* choose the manager from @params (may be NULL) and the environment, and
 * start it. Return: 0 or a negative errno (logged). Context: ferry_open. */
int ferry__mgr_start(struct ferry *fy, const struct ferry_params *params);
struct ferry_mgr;
/* stop the manager's watching and take it from the node (NULL: embedded).
 * Context: ferry_close, before the node closes. */
struct ferry_mgr *ferry__mgr_detach(struct ferry *fy);
/* leave the membership and free @m (NULL: nothing). Context: ferry_close,
 * after the node closed. */
void ferry__mgr_leave(struct ferry_mgr *m);

#endif /* FERRY_LIB_MGR_H */

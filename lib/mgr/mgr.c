/* SPDX-License-Identifier: MIT */
/*
 * mgr.c - the choice of membership manager, and the hand-off of a death it
 * saw to the progress thread (mgr.h).
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/core.h"
#include "lib/mgr/mgr.h"

struct ferry_mgr {
	const struct ferry_mgr_ops *ops;
	void *state;
};

#define MGR_TTL_DEFAULT 5
#define MGR_TTL_MAX 3600

static void mgr_on_dead(struct ferry *fy, struct ferry_table *unused, uint32_t src,
			const struct ferry_proto_view *v)
{
	const struct ferry_msg_mgr *m = v->body;

	if (src != fy->rank) {
		/* only a node's own manager may say who left */
		ferry_err("membership: rank %u sent a MGR_DEAD frame for rank %u; only a node "
			  "itself may: dropping rank %u",
			  src, m->rank, src);
		ferry__node_peer_failed(fy, src);
		return;
	}
	if (atomic_load(&fy->failed[m->rank]))
		return;
	ferry_warn("membership: rank %u left the cluster at epoch %llu (its manager's key is "
		   "gone): declaring it failed",
		   m->rank, (unsigned long long)m->epoch);
	ferry__node_peer_failed(fy, m->rank);
}

int ferry__mgr_attach(struct ferry *fy)
{
	return ferry__dispatch_register(fy, FERRY_MSG_MGR_DEAD, FERRY_DISPATCH_NODE, mgr_on_dead);
}

/* @rank's membership ended at @epoch: have the progress thread declare it
 * failed. Context: the manager's thread. Return: 0 or a negative errno. */
static int mgr_declare_dead(struct ferry *fy, uint32_t rank, uint64_t epoch)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_mgr m;
	} f;

	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, FERRY_MSG_MGR_DEAD, sizeof(f), fy->rank, 0);
	f.m.epoch = epoch;
	f.m.rank = rank;
	return ferry__send(fy, fy->rank, &f, sizeof(f));
}

static int mgr_ttl(const struct ferry_params *p)
{
	const char *s = getenv("FERRY_ETCD_TTL");
	char *end;
	long v;

	if (p && p->etcd_ttl > 0)
		return p->etcd_ttl > MGR_TTL_MAX ? MGR_TTL_MAX : p->etcd_ttl;
	if (!s || !*s)
		return MGR_TTL_DEFAULT;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < 1 || v > MGR_TTL_MAX) {
		ferry_warn("membership: FERRY_ETCD_TTL=%s is not a number of seconds in 1..%d; "
			   "using %d",
			   s, MGR_TTL_MAX, MGR_TTL_DEFAULT);
		return MGR_TTL_DEFAULT;
	}
	return (int)v;
}

int ferry__mgr_start(struct ferry *fy, const struct ferry_params *params)
{
	struct ferry_mgr_cfg cfg = { .declare_dead = mgr_declare_dead };
	struct ferry_mgr *m;
	int rc;

	cfg.endpoints = params && params->etcd_endpoints ? params->etcd_endpoints :
							   getenv("FERRY_ETCD_ENDPOINTS");
	if (!cfg.endpoints || !*cfg.endpoints)
		return 0; /* embedded: rank 0 */
#ifndef FERRY_HAVE_ETCD
	ferry_err("membership: etcd endpoints are set (%s), but this libferry was built without "
		  "libcurl, so it has no etcd manager; install libcurl4-openssl-dev and rebuild, "
		  "or unset FERRY_ETCD_ENDPOINTS",
		  cfg.endpoints);
	return -EOPNOTSUPP;
#else
	cfg.ttl = mgr_ttl(params);
	cfg.prefix = getenv("FERRY_ETCD_PREFIX");
	if (!cfg.prefix || !*cfg.prefix)
		cfg.prefix = "/ferry";
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->ops = &ferry__mgr_etcd_ops;
	rc = m->ops->start(fy, &cfg, &m->state);
	if (rc) {
		free(m);
		return rc;
	}
	__atomic_store_n(&fy->mgr, m, __ATOMIC_RELEASE);
	return 0;
#endif
}

struct ferry_mgr *ferry__mgr_detach(struct ferry *fy)
{
	struct ferry_mgr *m = __atomic_exchange_n(&fy->mgr, NULL, __ATOMIC_ACQ_REL);

	if (m)
		m->ops->quiesce(m->state);
	return m;
}

void ferry__mgr_leave(struct ferry_mgr *m)
{
	if (!m)
		return;
	m->ops->leave(m->state);
	free(m);
}

uint64_t ferry_epoch(const struct ferry *fy)
{
	const struct ferry_mgr *m;

	if (!fy)
		return 0;
	m = __atomic_load_n(&fy->mgr, __ATOMIC_ACQUIRE);
	return m ? m->ops->epoch(m->state) : 0;
}

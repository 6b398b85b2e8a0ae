/* SPDX-License-Identifier: MIT */
/*
 * ferry.c - the top of the library: ferry_open() makes a node (lib/core),
 * lets every module register its frame handlers with the dispatcher, and
 * only then starts the transport, so no frame arrives before its handler.
 *
 *   lib/ferry.c, lib/cluster.c      open/close, local clusters
 *     lib/table/                    collective create/destroy
 *       lib/reloc/ lib/ckpt/        localize protocol, landing inbox; checkpoints
 *         lib/ops/ lib/coll/        pull/push/set, requests, one-sided pulls;
 *         lib/mgr/                  broadcast, reduce, all-reduce; membership (etcd)
 *           lib/core/               node, dispatcher, barrier, proto, bootstrap
 *             lib/dir/ lib/store/   placement, pending moves; arenas and slots
 *               transport/          tcp, rdma, loop over transport/base
 *
 * Each layer calls only those below it (ci/check-layers.sh checks it).
 */
#include <errno.h>

#include "lib/coll/coll.h"
#include "lib/cons/cons.h"
#include "lib/core/bootstrap.h"
#include "lib/core/core.h"
#include "lib/mgr/mgr.h"
#include "lib/ops/ops.h"
#include "lib/reloc/reloc.h"
#include "lib/table/table.h"

int ferry_open(const struct ferry_params *params, struct ferry **fy_p)
{
	struct ferry *fy;
	int rc;

	if (!fy_p)
		return -EINVAL;
	rc = ferry__node_create(params, &fy);
	if (rc)
		return rc;
	rc = ferry__barrier_attach(fy);
	if (!rc)
		rc = ferry__ops_attach(fy);
	if (!rc)
		rc = ferry__reloc_attach(fy);
	if (!rc)
		rc = ferry__table_attach(fy);
	if (!rc)
		rc = ferry__coll_attach(fy);
	if (!rc)
		rc = ferry__mgr_attach(fy);
	if (!rc)
		rc = ferry__cons_attach(fy);
	if (!rc)
		rc = ferry__heartbeat_attach(fy);
	if (!rc)
		rc = ferry__rejoin_attach(fy);
	if (rc) {
		ferry__node_put(fy);
		return rc;
	}
	rc = ferry__node_start(fy, &ferry__dispatch_handler);
	if (rc)
		return rc;
	/* the membership manager, once the rendezvous gave the cluster its id */
	rc = ferry__mgr_start(fy, params);
	if (rc) {
		ferry_close(fy);
		return rc;
	}
	rc = ferry__heartbeat_start(fy);
	if (rc) {
		ferry_err("node: cannot start the failure detector: %s", ferry_strerror(rc));
		ferry_close(fy);
		return rc;
	}
	*fy_p = fy;
	return 0;
}

void ferry_close(struct ferry *fy)
{
	struct ferry_mgr *m;

	if (!fy)
		return;
	/* stop watching the membership: the others' departures are theirs */
	m = ferry__mgr_detach(fy);
	/* no heartbeat goes once the node starts to leave */
	ferry__heartbeat_stop(fy);
	/* hot keys' sync threads send; they stop before the transport goes */
	if (fy->cons_close)
		fy->cons_close(fy);
	/* destroyed tables still registered with the transport go first */
	ferry__table_close(fy);
	ferry__node_close(fy);
	/* the others heard this node's goodbye; now its key goes */
	ferry__mgr_leave(m);
}

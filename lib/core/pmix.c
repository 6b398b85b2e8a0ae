/* SPDX-License-Identifier: MIT */
/*
 * pmix.c - the address exchange through the launcher's PMIx server, for a
 * node started by mpirun (Open MPI) or srun --mpi=pmix with no rendezvous
 * given (config.c decides; bootstrap.c calls in):
 *
 *   every rank                               the launcher's PMIx server
 *     PMIx_Init                 ------------> (rank, namespace)
 *     PMIx_Put ferry.addr.N = transport address (rank 0: ferry.cid.N = cluster id)
 *     PMIx_Commit, PMIx_Fence (collect data, bounded by the timeout)
 *     PMIx_Get ferry.addr.N of every rank, ferry.cid.N of rank 0
 *     PMIx_Finalize (PMIx counts inits: an MPI library in the same process
 *                    keeps its own)
 *
 * N counts the exchanges of this process, so a node opened again in the
 * same job reads the new addresses, never the last ones.
 *
 * Context: ferry_open's thread. Built only with libpmix (FERRY_HAVE_PMIX).
 */
#ifdef FERRY_HAVE_PMIX
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <pmix.h>

#include "lib/core/bootstrap.h"
#include "lib/core/pmix.h"
#include "transport/base/log.h"

static unsigned pmix_seq; /* exchanges in this process, atomic */

/* @val's byte object as an address; 0 or -FERRY_E_PROTO */
static int pmix_addr_from(const pmix_value_t *val, struct ferry_addr *a)
{
	if (val->type != PMIX_BYTE_OBJECT || val->data.bo.size > FERRY_TP_ADDR_MAX)
		return -FERRY_E_PROTO;
	memset(a, 0, sizeof(*a));
	a->len = (uint32_t)val->data.bo.size;
	memcpy(a->buf, val->data.bo.bytes, a->len);
	return 0;
}

int ferry__pmix_bootstrap(const struct ferry_config *c, const struct ferry_addr *mine,
			  struct ferry_addr *addrs, uint64_t *cluster_id_p)
{
	unsigned seq = __atomic_fetch_add(&pmix_seq, 1, __ATOMIC_RELAXED);
	int secs = (c->timeout_ms + 999) / 1000;
	char akey[PMIX_MAX_KEYLEN], ckey[PMIX_MAX_KEYLEN];
	pmix_proc_t me, all, peer;
	pmix_value_t v, *val = NULL;
	pmix_info_t info[2];
	bool collect = true;
	uint64_t id = 0;
	pmix_status_t st;
	int rc = 0;

	st = PMIx_Init(&me, NULL, 0);
	if (st != PMIX_SUCCESS) {
		ferry_err("bootstrap: PMIx_Init failed: %s; the launcher's PMIx server cannot be "
			  "reached (set FERRY_RENDEZVOUS=host:port or MASTER_ADDR/MASTER_PORT to "
			  "meet without it)",
			  PMIx_Error_string(st));
		return -ECONNREFUSED;
	}
	if (me.rank != (pmix_rank_t)c->rank) {
		ferry_err("bootstrap: this node has rank %d (from %s) but PMIx says rank %u; unset "
			  "the variable that disagrees with the launcher",
			  c->rank, c->rank_src, me.rank);
		rc = -FERRY_E_MISMATCH;
		goto out_finalize;
	}
	PMIX_LOAD_PROCID(&all, me.nspace, PMIX_RANK_WILDCARD);
	st = PMIx_Get(&all, PMIX_JOB_SIZE, NULL, 0, &val);
	if (st == PMIX_SUCCESS && val->type == PMIX_UINT32 &&
	    val->data.uint32 != (uint32_t)c->world) {
		ferry_err(
			"bootstrap: this node has a world of %d (from %s) but the PMIx job has %u "
			"processes; unset the variable that disagrees with the launcher",
			c->world, c->rank_src, val->data.uint32);
		rc = -FERRY_E_MISMATCH;
	}
	if (val)
		PMIX_VALUE_RELEASE(val);
	val = NULL;
	if (rc)
		goto out_finalize;

	snprintf(akey, sizeof(akey), "ferry.addr.%u", seq);
	snprintf(ckey, sizeof(ckey), "ferry.cid.%u", seq);
	v.type = PMIX_BYTE_OBJECT;
	v.data.bo.bytes = (char *)mine->buf;
	v.data.bo.size = mine->len;
	st = PMIx_Put(PMIX_GLOBAL, akey, &v);
	if (st == PMIX_SUCCESS && c->rank == 0) {
		if (getrandom(&id, sizeof(id), 0) != sizeof(id))
			id = (uint64_t)time(NULL) ^ ((uint64_t)me.rank << 32);
		v.type = PMIX_UINT64;
		v.data.uint64 = id;
		st = PMIx_Put(PMIX_GLOBAL, ckey, &v);
	}
	if (st == PMIX_SUCCESS)
		st = PMIx_Commit();
	if (st != PMIX_SUCCESS) {
		ferry_err("bootstrap: PMIx could not publish this node's address: %s",
			  PMIx_Error_string(st));
		rc = -EIO;
		goto out_finalize;
	}
	PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
	PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &secs, PMIX_INT);
	st = PMIx_Fence(&all, 1, info, 2);
	if (st != PMIX_SUCCESS) {
		ferry_err("bootstrap: the PMIx fence of rank %d of %d ended with %s after at most "
			  "%d s; check that every rank of the job calls ferry_open",
			  c->rank, c->world, PMIx_Error_string(st), secs);
		rc = st == PMIX_ERR_TIMEOUT ? -FERRY_E_NOJOIN : -EIO;
		goto out_finalize;
	}
	for (int r = 0; r < c->world && !rc; r++) {
		PMIX_LOAD_PROCID(&peer, me.nspace, (pmix_rank_t)r);
		st = PMIx_Get(&peer, akey, &info[1], 1, &val);
		if (st != PMIX_SUCCESS || pmix_addr_from(val, &addrs[r])) {
			ferry_err("bootstrap: PMIx has no usable address of rank %d (%s)", r,
				  st != PMIX_SUCCESS ? PMIx_Error_string(st) : "malformed");
			rc = st != PMIX_SUCCESS ? -FERRY_E_NOJOIN : -FERRY_E_PROTO;
		}
		if (val)
			PMIX_VALUE_RELEASE(val);
		val = NULL;
	}
	if (!rc && c->rank != 0) {
		PMIX_LOAD_PROCID(&peer, me.nspace, 0);
		st = PMIx_Get(&peer, ckey, &info[1], 1, &val);
		if (st == PMIX_SUCCESS && val->type == PMIX_UINT64) {
			id = val->data.uint64;
		} else {
			ferry_err("bootstrap: PMIx has no cluster id from rank 0 (%s)",
				  st != PMIX_SUCCESS ? PMIx_Error_string(st) : "malformed");
			rc = -FERRY_E_PROTO;
		}
		if (val)
			PMIX_VALUE_RELEASE(val);
	}
	if (!rc) {
		*cluster_id_p = id;
		ferry_info("bootstrap: addresses of the %d ranks exchanged through PMIx (namespace "
			   "%s, this is rank %d)",
			   c->world, me.nspace, c->rank);
	}
	PMIX_INFO_DESTRUCT(&info[0]);
	PMIX_INFO_DESTRUCT(&info[1]);
out_finalize:
	PMIx_Finalize(NULL, 0);
	return rc;
}
#endif

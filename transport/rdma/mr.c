/* SPDX-License-Identifier: MIT */
/*
 * mr.c - memory registration for the core: mem_reg() with the least access
 * asked for, mem_dereg(), and at fini what the core left registered. The
 * registrations are also the list against which rma.c checks one-sided
 * operations on our own memory (under mr_lock).
 *
 * Context: any thread, after init(); ferry__rdma_mrs_fini() in fini().
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "transport/rdma/rdma.h"

/* was @rkey handed out before (among the last RDMA_RKEY_HIST)? mr_lock held */
static int rdma_rkey_seen(const struct rdma_tp *t, uint32_t rkey)
{
	uint32_t n = t->rkey_hist_n < RDMA_RKEY_HIST ? t->rkey_hist_n : RDMA_RKEY_HIST;

	for (uint32_t i = 0; i < n; i++)
		if (t->rkey_hist[i] == rkey)
			return 1;
	return 0;
}

#define RDMA_REG_TRIES 8 /* registrations held aside while looking for a new rkey */

/*
 * ferry__rdma_mem_reg - register @len bytes at @addr with the least access needed
 *
 * Local write always (the buffer may be the target of a READ), remote read
 * and remote write only as @access asks. The rkey of one with a remote right
 * is one this transport never handed out before (of its last RDMA_RKEY_HIST): a device may reuse a freed
 * registration's key (ReDMArk), so one that does is registered again, with
 * the repeated registration held until a new key comes. Context: any thread,
 * after init().
 * Return: 0 (@mr filled), -EINVAL, -ENOMEM when the memlock limit is too
 * small (logged with the fix), or ibv_reg_mr's errno.
 */
int ferry__rdma_mem_reg(struct ferry_tp *tp, void *addr, size_t len, unsigned access,
			struct ferry_tp_mr *mr)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_mr *m = to_rdma_mr(mr);
	int flags = IBV_ACCESS_LOCAL_WRITE, ret, reg_err = 0;
	char what[64];

	if (!addr || !len)
		return -EINVAL;
	if (access & FERRY_TP_ACCESS_REMOTE_READ)
		flags |= IBV_ACCESS_REMOTE_READ;
	if (access & FERRY_TP_ACCESS_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	snprintf(what, sizeof(what), "a region of %zu bytes", len);
	ret = ferry__rdma_memlock_check(tp->cfg.rank, len, what);
	if (ret)
		return ret;
	{
		struct ibv_mr *aside[RDMA_REG_TRIES];
		int naside = 0, seen;

		for (;;) {
			m->mr = ibv_reg_mr(t->pd, addr, len, flags);
			if (!m->mr) {
				reg_err = errno;
				break;
			}
			/* without remote rights no peer can use the key (rxe
			 * reports 0 for every such registration): nothing to
			 * keep apart */
			if (!(flags & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)))
				break;
			pthread_mutex_lock(&t->mr_lock);
			seen = rdma_rkey_seen(t, m->mr->rkey);
			if (!seen || naside == RDMA_REG_TRIES)
				t->rkey_hist[t->rkey_hist_n++ % RDMA_RKEY_HIST] = m->mr->rkey;
			pthread_mutex_unlock(&t->mr_lock);
			if (!seen)
				break;
			if (naside == RDMA_REG_TRIES) {
				ferry_warn("rdma: rank %u: the device handed out rkey %#x again "
					   "%d times; using it",
					   tp->cfg.rank, m->mr->rkey, RDMA_REG_TRIES);
				break;
			}
			aside[naside++] = m->mr;
		}
		while (naside--)
			ibv_dereg_mr(aside[naside]);
	}
	if (!m->mr) {
		ret = reg_err ? -reg_err : -ENOMEM;
		ferry_err(
			"rdma: rank %u: registering %zu bytes at %p failed: %s%s", tp->cfg.rank,
			len, addr, strerror(-ret),
			ret == -ENOMEM || ret == -EPERM || ret == -EAGAIN ?
				"; check the memlock limit (`ulimit -l`; raise it with `ulimit -l "
				"unlimited`, or memlock in /etc/security/limits.conf)" :
				"");
		return ret;
	}
	__atomic_add_fetch(&ferry__rdma_pinned, len, __ATOMIC_RELAXED);
	m->access = flags;
	mr->addr = addr;
	mr->len = len;
	mr->rkey = m->mr->rkey;
	pthread_mutex_lock(&t->mr_lock);
	m->next = t->mrs;
	t->mrs = m;
	pthread_mutex_unlock(&t->mr_lock);
	return 0;
}

/* Context: any thread; no read()/write() on @mr may be in flight. */
void ferry__rdma_mem_dereg(struct ferry_tp *tp, struct ferry_tp_mr *mr)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_mr *m = to_rdma_mr(mr), **pp;

	if (!m->mr)
		return;
	pthread_mutex_lock(&t->mr_lock);
	for (pp = &t->mrs; *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	}
	pthread_mutex_unlock(&t->mr_lock);
	ibv_dereg_mr(m->mr);
	__atomic_sub_fetch(&ferry__rdma_pinned, mr->len, __ATOMIC_RELAXED);
	m->mr = NULL;
}

/*
 * ferry__rdma_mrs_fini - deregister the memory the core registered and did not
 * deregister
 *
 * Context: fini(), after the progress thread stopped.
 */
void ferry__rdma_mrs_fini(struct rdma_tp *t)
{
	struct rdma_mr *mr;

	for (mr = t->mrs; mr; mr = mr->next) {
		ferry_dbg("rdma: rank %u: deregistering %zu bytes at %p the core left registered",
			  t->base.cfg.rank, mr->base.len, mr->base.addr);
		__atomic_sub_fetch(&ferry__rdma_pinned, mr->base.len, __ATOMIC_RELAXED);
		ibv_dereg_mr(mr->mr);
		mr->mr = NULL;
	}
	t->mrs = NULL;
}

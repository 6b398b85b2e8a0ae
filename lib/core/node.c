/* SPDX-License-Identifier: MIT */
/*
 * node.c - one process (or thread group) = one node: create, start and close
 * it, send a frame, let a waiting worker poll the transport, statistics.
 *
 * The bottom of the core: the modules above (ops, reloc, table, barrier)
 * call it and register their frame handlers with the dispatcher
 * (dispatch.c, which ferry_open hands to ferry__node_start); nothing here
 * calls a module, or the dispatcher, by name. lib/ferry.c composes
 * them in ferry_open().
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/core/bootstrap.h"
#include "lib/core/config.h"
#include "lib/core/core.h"
#include "lib/core/timeline.h"

/* pthread_cond_timedwait on a CLOCK_MONOTONIC condvar; 0 or ETIMEDOUT */
int ferry__cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *ts)
{
	return pthread_cond_timedwait(c, m, ts);
}

int ferry__sendv(struct ferry *fy, uint32_t dst, const struct iovec *iov, int iovcnt)
{
	size_t len = 0;
	int rc;

	if (atomic_load_explicit(&fy->closed, memory_order_acquire))
		return -FERRY_E_CLOSED;
	if (dst != fy->rank && atomic_load_explicit(&fy->failed[dst], memory_order_relaxed))
		return -FERRY_E_PEER;
	rc = fy->tp->ops->send(fy->tp, dst, iov, iovcnt);
	if (rc)
		return rc;
	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	atomic_fetch_add_explicit(&fy->msgs_sent, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&fy->bytes_sent, len, memory_order_relaxed);
	return 0;
}

int ferry__send(struct ferry *fy, uint32_t dst, const void *frame, size_t len)
{
	struct iovec iov = { .iov_base = (void *)frame, .iov_len = len };

	return ferry__sendv(fy, dst, &iov, 1);
}

/* ---- open / close ----------------------------------------------------- */

static const struct ferry_tp_ops *node_pick_transport(enum ferry_transport_kind kind)
{
	const char *why = "this build has no RDMA transport (libibverbs/librdmacm missing)";

	if (kind == FERRY_TRANSPORT_LOOP) {
		ferry_info("transport: loop (tcp messages, one-sided access emulated in-process)");
		return &ferry__loop_ops;
	}
#ifdef FERRY_HAVE_RDMA
	if (kind != FERRY_TRANSPORT_TCP) {
		int rc = ferry__rdma_ops.probe ? ferry__rdma_ops.probe(&why) : 0;

		if (!rc) {
			ferry_info("transport: rdma (a usable device with an active port)");
			return &ferry__rdma_ops;
		}
	}
#endif
	if (kind == FERRY_TRANSPORT_RDMA) {
		ferry_err("transport: rdma was asked for but cannot run: %s; use "
			  "FERRY_TRANSPORT=tcp or fix the device (see ferry-info)",
			  why ? why : "no usable device");
		return NULL;
	}
	if (kind == FERRY_TRANSPORT_AUTO)
		ferry_info("transport: tcp (auto: %s)", why ? why : "no RDMA device");
	return &ferry__tcp_ops;
}

static void node_free(struct ferry *fy)
{
	if (fy->coll_free)
		fy->coll_free(fy->coll);
	if (fy->cfg)
		ferry__auth_wipe(fy->cfg->auth_key, sizeof(fy->cfg->auth_key));
	if (fy->cons_free)
		fy->cons_free(fy->cons);
	free(fy->cfg);
	free(fy->tp);
	free(fy->failed);
	free(fy->heard);
	free(fy->gone);
	if (fy->hb_free)
		fy->hb_free(fy->hb);
	free(fy->barrier_arrived);
	free(fy->fastrd);
	ferry__tl_free(fy);
	for (int i = 0; i < FERRY_MAX_TABLES; i++) {
		free(fy->table_seen[i]);
		free(fy->table_arenas[i]);
		free(fy->table_freeing[i]);
	}
	pthread_mutex_destroy(&fy->lock);
	pthread_cond_destroy(&fy->cond);
	free(fy);
}

void ferry__node_get(struct ferry *fy)
{
	atomic_fetch_add(&fy->refs, 1);
}

void ferry__node_put(struct ferry *fy)
{
	if (atomic_fetch_sub(&fy->refs, 1) == 1)
		node_free(fy);
}

int ferry__node_create(const struct ferry_params *params, struct ferry **fy_p)
{
	const struct ferry_tp_ops *ops;
	struct ferry_config *c;
	struct ferry *fy;
	int rc;

	if (!fy_p)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	rc = ferry__config_resolve(params, c);
	if (rc) {
		free(c);
		return rc;
	}
	ops = node_pick_transport(c->transport);
	if (!ops) {
		free(c);
		return -FERRY_E_NODEV;
	}
	fy = calloc(1, sizeof(*fy));
	if (!fy) {
		free(c);
		return -ENOMEM;
	}
	fy->cfg = c;
	fy->rank = (uint32_t)c->rank;
	fy->world = (uint32_t)c->world;
	fy->timeout_ms = c->timeout_ms;
	ferry__auth_random(fy->move_key, sizeof(fy->move_key));
	fy->heartbeat_ms = c->heartbeat_ms;
	fy->busy_poll = c->busy_poll;
	fy->budget.limit = c->mem_limit;
	atomic_init(&fy->refs, 1);
	pthread_mutex_init(&fy->lock, NULL);
	ferry__cond_init_monotonic(&fy->cond);
	fy->failed = calloc(fy->world, sizeof(*fy->failed));
	fy->heard = calloc(fy->world, sizeof(*fy->heard));
	fy->gone = calloc(fy->world, sizeof(*fy->gone));
	fy->barrier_arrived = calloc(fy->world, sizeof(*fy->barrier_arrived));
	fy->tp = calloc(1, ops->tp_size);
	fy->fastrd = aligned_alloc(64, sizeof(*fy->fastrd)); /* 64 KiB: one line per worker */
	if (fy->fastrd) {
		memset(fy->fastrd, 0, sizeof(*fy->fastrd));
		ferry__fastrd_init(fy->fastrd);
	}
	if (!fy->failed || !fy->heard || !fy->gone || !fy->barrier_arrived || !fy->tp ||
	    !fy->fastrd) {
		free(fy->tp);
		fy->tp = NULL;
		node_free(fy);
		return -ENOMEM;
	}
	fy->tp->ops = ops;
	fy->tp_polls = ops->poll != NULL;
	*fy_p = fy;
	return 0;
}

int ferry__node_start(struct ferry *fy, const struct ferry_tp_handler *handler)
{
	const struct ferry_tp_ops *ops = fy->tp->ops;
	struct ferry_config *c = fy->cfg;
	struct ferry_tp_config tcfg;
	struct ferry_addr mine, *addrs = NULL;
	const void **blobs = NULL;
	size_t *lens = NULL, alen;
	int rc, lfd = -1;

	addrs = calloc(fy->world, sizeof(*addrs));
	blobs = calloc(fy->world, sizeof(*blobs));
	lens = calloc(fy->world, sizeof(*lens));
	if (!addrs || !blobs || !lens) {
		rc = -ENOMEM;
		goto err_free;
	}
	tcfg = (struct ferry_tp_config){
		.rank = fy->rank,
		.world = fy->world,
		.bind_addr = c->bind_addr,
		.adv_addr = c->adv_addr,
		.busy_poll = c->busy_poll,
		.timeout_ms = c->timeout_ms,
		.handler = handler,
		.core = fy,
		.auth = c->auth,
	};
	memcpy(tcfg.auth_key, c->auth_key, sizeof(tcfg.auth_key));
	rc = ops->init(fy->tp, &tcfg);
	ferry__auth_wipe(tcfg.auth_key, sizeof(tcfg.auth_key));
	if (rc) {
		ferry_err("transport: %s failed to start: %s", ops->name, ferry_strerror(rc));
		goto err_free;
	}
	/* the whole struct goes to the rendezvous: no stack bytes past the address */
	memset(&mine, 0, sizeof(mine));
	alen = sizeof(mine.buf);
	rc = ops->addr_get(fy->tp, mine.buf, &alen);
	if (rc)
		goto err_fini;
	mine.len = (uint32_t)alen;
	rc = ferry__bootstrap_keep(c, &mine, addrs, &fy->cluster_id, fy->rank == 0 ? &lfd : NULL);
	if (rc)
		goto err_fini;
	for (uint32_t r = 0; r < fy->world; r++) {
		blobs[r] = addrs[r].buf;
		lens[r] = addrs[r].len;
	}
	fy->tp->cfg.cluster_id = fy->cluster_id;
	rc = ops->connect(fy->tp, blobs, lens);
	if (rc)
		goto err_close_lfd;
	/* rank 0 keeps answering at the rendezvous: a replacement asks there */
	if (lfd >= 0 && !fy->rejoin_start)
		close(lfd); /* a node composed without lib/core/rejoin.c */
	else if (lfd >= 0 && fy->rejoin_start(fy, c, lfd))
		ferry_warn("node: rank 0 cannot start its rejoin service; a replacement node "
			   "will find no answer at the rendezvous");
	ferry_info("node: rank %u of %u up over %s", fy->rank, fy->world, ops->name);
	free(addrs);
	free(blobs);
	free(lens);
	ferry__auth_wipe(fy->cfg->auth_key, sizeof(fy->cfg->auth_key));
	free(fy->cfg);
	fy->cfg = NULL;
	return 0;

err_close_lfd:
	if (lfd >= 0)
		close(lfd);
err_fini:
	ops->fini(fy->tp);
err_free:
	free(addrs);
	free(blobs);
	free(lens);
	node_free(fy);
	return rc;
}

void ferry__node_close(struct ferry *fy)
{
	if (!fy || atomic_exchange(&fy->closed, true))
		return;
	/* its thread sends: it stops before the transport goes */
	if (fy->rejoin_srv)
		fy->rejoin_stop(fy->rejoin_srv);
	/* a worker inside the transport's poll() leaves it first */
	while (atomic_load(&fy->pollers))
		sched_yield();
	/* no handler runs after fini: replies stop, workers see CLOSED */
	fy->tp->ops->fini(fy->tp);
	free(fy->tp);
	fy->tp = NULL;
	/* no VIEW handler runs any more */
	if (fy->rejoin_srv)
		fy->rejoin_free(fy->rejoin_srv);
	fy->rejoin_srv = NULL;
	pthread_mutex_lock(&fy->lock);
	pthread_cond_broadcast(&fy->cond);
	pthread_mutex_unlock(&fy->lock);
	ferry__node_put(fy);
}

void ferry__node_peer_failed(struct ferry *fy, uint32_t rank)
{
	if (rank >= fy->world || rank == fy->rank || atomic_exchange(&fy->failed[rank], true))
		return;
	atomic_fetch_add(&fy->failures, 1);
	if (fy->tp && fy->tp->ops->drop)
		fy->tp->ops->drop(fy->tp, rank);
	for (size_t i = 0; i < sizeof(fy->peer_failed_fns) / sizeof(fy->peer_failed_fns[0]); i++)
		if (fy->peer_failed_fns[i])
			fy->peer_failed_fns[i](fy, rank);
	/* wake barrier, table and operation waiters so they can give up early */
	pthread_mutex_lock(&fy->lock);
	pthread_cond_broadcast(&fy->cond);
	pthread_mutex_unlock(&fy->lock);
}

uint32_t ferry__node_live_after(const struct ferry *fy, uint32_t rank, uint32_t spare)
{
	for (uint32_t i = 1; i < fy->world; i++) {
		uint32_t r = (rank + i) % fy->world;

		if (r == spare || r == fy->rank ||
		    !atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			return r;
	}
	return fy->world;
}

int ferry__node_on_peer_failed(struct ferry *fy, void (*fn)(struct ferry *fy, uint32_t rank))
{
	for (size_t i = 0; i < sizeof(fy->peer_failed_fns) / sizeof(fy->peer_failed_fns[0]); i++)
		if (!fy->peer_failed_fns[i]) {
			fy->peer_failed_fns[i] = fn;
			return 0;
		}
	return -ENOSPC;
}

/* RCU registrations of this thread: workers and table teardown share one */
static __thread int node_rcu_regs;

void ferry__rcu_enter(void)
{
	if (node_rcu_regs++ == 0)
		urcu_memb_register_thread();
}

void ferry__rcu_leave(void)
{
	if (--node_rcu_regs == 0)
		urcu_memb_unregister_thread();
}

/*
 * ferry__node_poll - let the transport complete one-sided reads on the
 * calling thread (a waiting worker), where it can
 *
 * A node closed meanwhile is not touched: the counter and the flag make a
 * Dekker pair with ferry_close(), which waits for pollers before the
 * transport goes. Context: a worker's thread, RCU-registered, no lock held.
 * @flags: FERRY_TP_POLL_LAST before the caller sleeps. Return: completions
 * handled.
 */
int ferry__node_poll(struct ferry *fy, unsigned flags)
{
	int n = 0;

	if (!fy->tp_polls)
		return 0; /* no shared counter to bounce between waiting workers */
	atomic_fetch_add(&fy->pollers, 1);
	if (!atomic_load(&fy->closed))
		n = fy->tp->ops->poll(fy->tp, flags);
	atomic_fetch_sub(&fy->pollers, 1);
	return n;
}

int ferry_rank(const struct ferry *fy)
{
	return fy ? (int)fy->rank : -EINVAL;
}

int ferry_world(const struct ferry *fy)
{
	return fy ? (int)fy->world : -EINVAL;
}

int ferry_stats(struct ferry *fy, struct ferry_stats *s)
{
	if (!fy || !s)
		return -EINVAL;
	memset(s, 0, sizeof(*s));
	s->local_ops = atomic_load(&fy->gone_local_ops);
	s->remote_ops = atomic_load(&fy->gone_remote_ops);
	urcu_memb_read_lock();
	for (int i = 0; i < FERRY_MAX_WORKERS; i++) {
		struct ferry_worker *w = rcu_dereference(fy->workers[i]);

		if (!w)
			continue;
		s->local_ops += __atomic_load_n(&w->local_ops, __ATOMIC_RELAXED);
		s->remote_ops += __atomic_load_n(&w->remote_ops, __ATOMIC_RELAXED);
	}
	urcu_memb_read_unlock();
	s->served_ops = atomic_load(&fy->served_ops);
	s->forwards = atomic_load(&fy->forwards);
	s->relocations_in = atomic_load(&fy->reloc_in);
	s->relocations_out = atomic_load(&fy->reloc_out);
	s->msgs_sent = atomic_load(&fy->msgs_sent);
	s->msgs_recv = atomic_load(&fy->msgs_recv);
	s->bytes_sent = atomic_load(&fy->bytes_sent);
	s->bytes_recv = atomic_load(&fy->bytes_recv);
	s->onesided_reads = atomic_load(&fy->onesided_reads);
	s->onesided_retries = atomic_load(&fy->onesided_retries);
	s->onesided_fallbacks = atomic_load(&fy->onesided_fallbacks);
	for (int i = 0; i < FERRY_STALENESS_BUCKETS; i++)
		s->staleness[i] = atomic_load(&fy->staleness[i]);
	s->cons_hits = atomic_load(&fy->cons_hits);
	s->cons_misses = atomic_load(&fy->cons_misses);
	s->cons_refreshed = atomic_load(&fy->cons_refreshed);
	s->essp_subscribed = atomic_load(&fy->essp_subscribed);
	s->essp_pushed = atomic_load(&fy->essp_pushed);
	s->essp_taken = atomic_load(&fy->essp_taken);
	s->essp_refused = atomic_load(&fy->essp_refused);
	for (uint32_t r = 0; fy->failed && r < fy->world; r++)
		s->peers_failed += atomic_load_explicit(&fy->failed[r], memory_order_relaxed);
	/* the pollers' Dekker pair with ferry__node_close keeps the transport */
	atomic_fetch_add(&fy->pollers, 1);
	if (!atomic_load(&fy->closed) && fy->tp && fy->tp->ops->mem_held)
		s->tp_buffer_bytes = fy->tp->ops->mem_held(fy->tp);
	atomic_fetch_sub(&fy->pollers, 1);
	return 0;
}

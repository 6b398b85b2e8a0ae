/* SPDX-License-Identifier: MIT */
/*
 * rdma.c - the RDMA transport's entry points: init() (which sets up what
 * device.c and progress.c own, in order), fini(), addr_get(), send(), and
 * the ops table through which the core calls them and the ops of the other
 * files (ferry__rdma_ops). The design is described in rdma.h and at the top
 * of each file.
 *
 * Context: init() and fini() on their caller's thread, never concurrently
 * with another op; addr_get() on the caller's thread; send() on any thread,
 * handlers included.
 */
#define _GNU_SOURCE /* IOV_MAX */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "transport/rdma/rdma.h"

/* ---- init / fini -------------------------------------------------------- */

static int rdma_epoll_add(struct rdma_tp *t, int fd, enum rdma_ev_tag tag)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = tag };

	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev)) {
		int ret = -errno;

		ferry_err("rdma: epoll_ctl: %s", strerror(errno));
		return ret;
	}
	return 0;
}

/*
 * rdma_init - pick the device and address, listen, set up the verbs
 * resources and start the progress thread
 *
 * Context: any thread; @tp is zeroed memory of tp_size bytes with ops set.
 * Return: 0, -EINVAL for a bad config, -FERRY_E_NODEV without a usable
 * device, -ENOMEM when the memlock limit is too small, or the errno of what
 * failed (each logged).
 */
static int rdma_init(struct ferry_tp *tp, const struct ferry_tp_config *cfg)
{
	struct rdma_tp *t = to_rdma(tp);
	const char *bind_addr = cfg->bind_addr ? cfg->bind_addr : "";
	const char *why = NULL;
	int ret;

	if (!cfg->world || cfg->rank >= cfg->world || !cfg->handler || !cfg->handler->on_msg) {
		ferry_err("rdma: bad config: rank %u of world %u%s", cfg->rank, cfg->world,
			  cfg->handler && cfg->handler->on_msg ? "" : ", no on_msg handler");
		return -EINVAL;
	}
	if (strlen(bind_addr) >= sizeof(t->bind)) {
		ferry_err("rdma: the bind address \"%.40s...\" is too long", bind_addr);
		return -EINVAL;
	}
	tp->cfg = *cfg;
	strcpy(t->bind, bind_addr);
	tp->cfg.bind_addr = t->bind;
	t->epfd = t->wake_fd = -1;

	/*
	 * Before any verbs resource: memory registered later stays out of a
	 * fork()ed child's way (a no-op where the kernel copies DMA pages at
	 * fork, IBV_FORK_UNNEEDED).
	 */
	ret = ibv_fork_init();
	if (ret)
		ferry_warn("rdma: rank %u: ibv_fork_init: %s; memory registered from now on is not "
			   "protected against fork() (set RDMAV_FORK_SAFE=1 before the process "
			   "starts, or do not fork after ferry_open)",
			   cfg->rank, strerror(ret));

	ret = ferry__rdma_session_init(t);
	if (ret)
		return ret;
	ret = ferry__rdma_pick_device(t->dev_name, &t->port_num, &why);
	if (ret) {
		ferry_err("rdma: rank %u: %s", cfg->rank, why);
		return ret;
	}
	ret = ferry__rdma_pick_addr(t, t->bind);
	if (ret)
		return ret;
	/* rdma_cm's contexts stay open while we hold this list */
	t->devs = rdma_get_devices(NULL);
	if (!t->devs) {
		ferry_err("rdma: rank %u: rdma_get_devices found no device (is rdma_ucm loaded?)",
			  cfg->rank);
		return -FERRY_E_NODEV;
	}
	ret = ferry__rdma_tp_listen(t);
	if (ret)
		goto err_free_devices;
	ret = ferry__rdma_query(t);
	if (ret)
		goto err_unlisten;
	ret = ferry__rdma_verbs_init(t);
	if (ret)
		goto err_unlisten;
	ret = ferry__rdma_peers_init(t);
	if (ret)
		goto err_verbs_fini;

	pthread_mutex_init(&t->self_lock, NULL);
	pthread_mutex_init(&t->mr_lock, NULL);
	pthread_mutex_init(&t->setup_lock, NULL);
	pthread_mutex_init(&t->cq_lock, NULL);
	ferry__cond_init_monotonic(&t->setup_cond);

	t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->wake_fd < 0) {
		ret = -errno;
		ferry_err("rdma: eventfd: %s", strerror(errno));
		goto err_destroy_locks;
	}
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->epfd < 0) {
		ret = -errno;
		ferry_err("rdma: epoll_create1: %s", strerror(errno));
		goto err_close_wake;
	}
	/* the async fd is the shared context's: every instance reads it without blocking */
	ret = ferry__rdma_set_nonblock(t->ctx->async_fd);
	if (!ret)
		ret = rdma_epoll_add(t, t->wake_fd, RDMA_EV_WAKE);
	if (!ret)
		ret = rdma_epoll_add(t, t->ec->fd, RDMA_EV_CM);
	if (!ret)
		ret = rdma_epoll_add(t, t->ctx->async_fd, RDMA_EV_ASYNC);
	if (!ret && !cfg->busy_poll)
		ret = rdma_epoll_add(t, t->cc->fd, RDMA_EV_CQ);
	if (ret)
		goto err_close_epoll;
	ret = ferry__rdma_reaper_start(t);
	if (ret)
		goto err_close_epoll;
	ret = ferry__rdma_start_thread(t);
	if (ret)
		goto err_stop_reaper;
	ferry_dbg("rdma: rank %u of %u listens on %s (%s port %u)", cfg->rank, cfg->world, t->addr,
		  t->dev_name, t->port_num);
	return 0;

err_stop_reaper:
	ferry__rdma_reaper_stop(t);
err_close_epoll:
	close(t->epfd);
err_close_wake:
	close(t->wake_fd);
err_destroy_locks:
	pthread_cond_destroy(&t->setup_cond);
	pthread_mutex_destroy(&t->cq_lock);
	pthread_mutex_destroy(&t->setup_lock);
	pthread_mutex_destroy(&t->mr_lock);
	pthread_mutex_destroy(&t->self_lock);
	ferry__rdma_peers_fini(t);
err_verbs_fini:
	ferry__rdma_verbs_fini(t);
err_unlisten:
	ferry__rdma_unlisten(t);
err_free_devices:
	rdma_free_devices(t->devs);
	t->devs = NULL;
	return ret;
}

/*
 * rdma_fini - stop the progress thread and free everything but @tp itself
 *
 * Sends every peer a FERRY_MSG_BYE, so that it logs a departure, not a
 * failure, and flushes queued frames for at most RDMA_DRAIN_MS; one-sided
 * operations still pending complete with -FERRY_E_CLOSED on the progress
 * thread before it stops. No handler runs after it returns. Memory the core
 * registered and did not deregister is deregistered here. Context: not
 * concurrently with any other op of @tp.
 */
static void rdma_fini(struct ferry_tp *tp)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_selfmsg *m, *next;

	ferry__tp_send_bye(tp); /* queued, flushed while draining */
	__atomic_store_n(&t->closing, 1, __ATOMIC_RELEASE);
	ferry__rdma_wake(t);
	pthread_join(t->thread, NULL);

	/* the peers see DISCONNECTED; then every queue pair and cm_id goes */
	for (struct rdma_conn *c = t->conns; c; c = c->next)
		if (c->state == RDMA_CS_UP && !c->disconnected) {
			c->disconnected = 1;
			rdma_disconnect(c->id);
		}
	while (t->conns)
		ferry__rdma_conn_destroy(t, t->conns);
	/* every queue pair and cm_id goes before the CQs, the PD and the channel */
	ferry__rdma_reaper_stop(t);
	for (m = t->self_head; m; m = next) {
		next = m->next;
		free(m);
	}
	t->self_head = t->self_tail = NULL;
	ferry__rdma_mrs_fini(t);
	close(t->epfd);
	close(t->wake_fd);
	pthread_cond_destroy(&t->setup_cond);
	pthread_mutex_destroy(&t->cq_lock);
	pthread_mutex_destroy(&t->setup_lock);
	pthread_mutex_destroy(&t->mr_lock);
	pthread_mutex_destroy(&t->self_lock);
	ferry__rdma_peers_fini(t);
	ferry__rdma_verbs_fini(t);
	ferry__rdma_unlisten(t);
	rdma_free_devices(t->devs);
	t->devs = NULL;
}

static int rdma_addr_get(struct ferry_tp *tp, void *buf, size_t *len)
{
	struct rdma_tp *t = to_rdma(tp);
	size_t n = strlen(t->addr);

	if (*len < n) {
		*len = n;
		return -ENOSPC;
	}
	memcpy(buf, t->addr, n);
	*len = n;
	return 0;
}

/* ---- sending ------------------------------------------------------------ */

/*
 * rdma_send - queue one frame to @dst
 *
 * Context: any thread, concurrently with other sends and with the progress
 * thread (handlers may send); not after fini(). Never blocks on the network.
 * The iovec's memory is the caller's again when it returns.
 * Return: 0; -EINVAL (bad dst or iovcnt, or a header that fails
 * ferry__proto_check_hdr() or whose len is not the iovec's total);
 * -ENOTCONN before connect() succeeded; -FERRY_E_PEER when @dst failed;
 * -ENOMEM.
 */
static int rdma_send(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt)
{
	struct rdma_tp *t = to_rdma(tp);
	struct rdma_cursor cur = { .iov = iov, .cnt = iovcnt };
	struct rdma_peer *p;
	size_t total, rem;
	int ret = 0, wake = 0, burst;
	int64_t now;

	if (dst >= tp->cfg.world || iovcnt <= 0 || iovcnt > IOV_MAX)
		return -EINVAL;
	if (ferry__tp_check_frame(&t->base, dst, iov, iovcnt, &total))
		return -EINVAL;
	if (dst == tp->cfg.rank)
		return ferry__rdma_self_send(t, iov, iovcnt, total);

	p = &t->peers[dst];
	rem = total;
	pthread_mutex_lock(&p->lock);
	if (p->state != RDMA_PEER_UP && p->state != RDMA_PEER_LOST &&
	    !(p->state == RDMA_PEER_BROKEN && t->reconnect_ms && !p->reported)) {
		ret = p->state == RDMA_PEER_IDLE ? -ENOTCONN : -FERRY_E_PEER;
		goto out_unlock;
	}
	if (p->q_bytes > FERRY_TP_SENDQ_MAX && !pthread_equal(pthread_self(), t->thread)) {
		ret = ferry__rdma_wait_room(t, p);
		if (ret)
			goto out_unlock;
	}
	/*
	 * corked: a small frame in a burst (less than cork_ns after the last
	 * one to this peer) waits for the sends in flight and leaves with
	 * others, once a signaled completion (sig_n) comes to flush the queue.
	 * A frame after a pause never waits: in a request-reply exchange the
	 * completion may come only with the progress thread's next wake-up,
	 * which would be the frame's latency (docs/benchmarks.md)
	 */
	now = t->cork_ns ? rdma_now_ns() : 0;
	burst = now && now - p->last_send_ns < t->cork_ns;
	p->last_send_ns = now;
	if (p->state == RDMA_PEER_UP && !p->q_head &&
	    (!burst || total > RDMA_CORK_MAX || !p->sig_n ||
	     p->s_posted - p->s_done < RDMA_CORK_INFLIGHT)) {
		while (rem && rdma_can_post_data(t, p)) {
			size_t n = rem < RDMA_CHUNK ? rem : RDMA_CHUNK;

			ferry__rdma_cursor_copy(&cur, rdma_sbuf(p, p->s_posted), n);
			rem -= n;
			ret = ferry__rdma_post_chunk(t, p, n);
			if (ret) {
				ferry__rdma_peer_break(t, p, -ret);
				wake = 1;
				ret = -FERRY_E_PEER;
				if (!t->reconnect_ms)
					goto out_unlock;
				/* the chunk is kept and goes again on the new link (session.c) */
				ret = 0;
				break;
			}
		}
	}
	if (rem) {
		ret = ferry__rdma_q_append(p, &cur, rem);
		if (ret && rem != total) {
			/* half a frame is posted: the stream cannot go on */
			ferry__rdma_peer_break(t, p, ENOMEM);
			wake = 1;
		}
	}
out_unlock:
	pthread_mutex_unlock(&p->lock);
	/* FERRY_RDMA_RX_SPIN_US: a worker's frame may bring a reply; the
	 * progress thread waits for it spinning, woken now, off its path */
	if (!ret && t->rx_spin_ns && !pthread_equal(pthread_self(), t->thread) &&
	    !__atomic_exchange_n(&t->rx_spin_req, 1, __ATOMIC_ACQ_REL))
		wake = 1;
	if (wake)
		ferry__rdma_wake(t);
	return ret;
}

const struct ferry_tp_ops ferry__rdma_ops = {
	.size = sizeof(struct ferry_tp_ops),
	.name = "rdma",
	.caps = FERRY_TP_CAP_READ | FERRY_TP_CAP_WRITE | FERRY_TP_CAP_WRITE_IMM,
	.tp_size = sizeof(struct rdma_tp),
	.mr_size = sizeof(struct rdma_mr),
	.probe = ferry__rdma_probe,
	.init = rdma_init,
	.addr_get = rdma_addr_get,
	.connect = ferry__rdma_tp_connect,
	.send = rdma_send,
	.mem_reg = ferry__rdma_mem_reg,
	.mem_dereg = ferry__rdma_mem_dereg,
	.read = ferry__rdma_read,
	.read_v = ferry__rdma_read_v,
	.poll = ferry__rdma_poll,
	.write = ferry__rdma_write,
	.write_imm = ferry__rdma_write_imm,
	.drop = ferry__rdma_drop,
	.fini = rdma_fini,
};

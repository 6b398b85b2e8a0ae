/* SPDX-License-Identifier: MIT */
/*
 * tcp.c - the TCP transport: one connection per pair of nodes, Ferry frames
 * on the byte stream, one epoll progress thread per transport instance.
 *
 * This file holds the ops table and the transport's lifecycle: init()
 * (listening socket, connections' state, sessions' settings, eventfd, epoll
 * set, progress thread), fini() and addr_get(). init() and fini() run on the caller's
 * thread, never concurrently with another op of the same transport;
 * addr_get() only reads what init() wrote. tcp.h maps the other rooms:
 * conn.c (connect), send.c (send), recv.c, progress.c.
 */
#define _GNU_SOURCE /* like every file of the transport (tcp.h) */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"

static void tcp_conns_fini(struct tcp_tp *t, uint32_t n)
{
	for (uint32_t r = 0; r < n; r++) {
		struct tcp_conn *c = &t->conns[r];

		if (c->fd >= 0) {
			char sink[4096];

			/* read what came and nobody will handle (up to 1 MiB): a
			 * socket closed with unread data sends a reset, which can
			 * reach the peer before it read our BYE, and the peer then
			 * logs a lost link instead of a departure */
			for (int i = 0;
			     i < 256 && recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++)
				;
			shutdown(c->fd, SHUT_WR);
			close(c->fd);
		}
		ferry__tcp_oq_free(c);
		ferry__tcp_rbuf_free(c);
		pthread_cond_destroy(&c->oq_drained);
		pthread_mutex_destroy(&c->lock);
	}
	free(t->conns);
	t->conns = NULL;
}

/*
 * tcp_init - listen, and start the progress thread
 *
 * Context: any thread; @tp is zeroed memory of tp_size bytes with ops set.
 * Return: 0, -EINVAL for a bad config, or the errno of what failed.
 */
static int tcp_init(struct ferry_tp *tp, const struct ferry_tp_config *cfg)
{
	struct tcp_tp *t = to_tcp(tp);
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	const char *bind_addr = cfg->bind_addr && *cfg->bind_addr ? cfg->bind_addr : "127.0.0.1";
	uint32_t r;
	int ret;

	if (!cfg->world || cfg->rank >= cfg->world || !cfg->handler || !cfg->handler->on_msg) {
		ferry_err("tcp: bad config: rank %u of world %u%s", cfg->rank, cfg->world,
			  cfg->handler && cfg->handler->on_msg ? "" : ", no on_msg handler");
		return -EINVAL;
	}
	if (strlen(bind_addr) >= sizeof(t->bind)) {
		ferry_err("tcp: the bind address \"%.40s...\" is too long", bind_addr);
		return -EINVAL;
	}
	tp->cfg = *cfg;
	strcpy(t->bind, bind_addr);
	tp->cfg.bind_addr = t->bind;
	t->lfd = t->epfd = t->wake_fd = -1;

	ret = ferry__tcp_listen(t);
	if (ret)
		return ret;

	t->conns = calloc(cfg->world, sizeof(*t->conns));
	if (!t->conns) {
		ret = -ENOMEM;
		goto err_close_listen;
	}
	for (r = 0; r < cfg->world; r++) {
		ret = -pthread_mutex_init(&t->conns[r].lock, NULL);
		if (ret)
			goto err_free_conns;
		/* the back-pressure wait is bounded on the monotonic clock */
		ret = -ferry__cond_init_monotonic(&t->conns[r].oq_drained);
		if (ret) {
			pthread_mutex_destroy(&t->conns[r].lock);
			goto err_free_conns;
		}
		t->conns[r].fd = -1;
		t->conns[r].rank = r;
	}
	ret = ferry__tcp_session_init(t);
	if (ret)
		goto err_free_conns;
	ret = -pthread_mutex_init(&t->self_lock, NULL);
	if (ret)
		goto err_free_conns;
	ret = -pthread_mutex_init(&t->engine, NULL);
	if (ret)
		goto err_destroy_self_lock;
	{
		const char *e = getenv("FERRY_TCP_WORKER_POLL");

		t->worker_poll = e && !strcmp(e, "1");
	}

	t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (t->wake_fd < 0) {
		ret = -errno;
		ferry_err("tcp: eventfd: %s", strerror(errno));
		goto err_destroy_engine;
	}
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->epfd < 0) {
		ret = -errno;
		ferry_err("tcp: epoll_create1: %s", strerror(errno));
		goto err_close_wake;
	}
	if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_fd, &ev)) {
		ret = -errno;
		ferry_err("tcp: epoll_ctl: %s", strerror(errno));
		goto err_close_epoll;
	}
	t->park_epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->park_epfd < 0 || epoll_ctl(t->park_epfd, EPOLL_CTL_ADD, t->wake_fd, &ev)) {
		ret = -errno;
		ferry_err("tcp: the progress thread's second epoll set: %s", strerror(errno));
		if (t->park_epfd >= 0)
			close(t->park_epfd);
		goto err_close_epoll;
	}
	ret = ferry__tcp_start_thread(t);
	if (ret) {
		close(t->park_epfd);
		goto err_close_epoll;
	}
	ferry_dbg("tcp: rank %u of %u listens on %s", cfg->rank, cfg->world, t->addr);
	return 0;

err_close_epoll:
	close(t->epfd);
err_close_wake:
	close(t->wake_fd);
err_destroy_engine:
	pthread_mutex_destroy(&t->engine);
err_destroy_self_lock:
	pthread_mutex_destroy(&t->self_lock);
err_free_conns:
	tcp_conns_fini(t, r);
err_close_listen:
	close(t->lfd);
	return ret;
}

/*
 * tcp_fini - stop the progress thread and free everything but @tp itself
 *
 * Flushes queued frames for at most TCP_DRAIN_MS first. No handler runs
 * after it returns. Context: not concurrently with any other op of @tp.
 */
static void tcp_fini(struct ferry_tp *tp)
{
	struct tcp_tp *t = to_tcp(tp);
	struct tcp_selfmsg *m, *next;

	ferry__tp_send_bye(tp); /* queued, flushed while draining */
	__atomic_store_n(&t->closing, 1, __ATOMIC_RELEASE);
	ferry__tcp_wake(t);
	pthread_join(t->thread, NULL);

	ferry__tcp_session_fini(t);
	tcp_conns_fini(t, t->base.cfg.world);
	for (m = t->self_head; m; m = next) {
		next = m->next;
		free(m);
	}
	t->self_head = t->self_tail = NULL;
	pthread_mutex_destroy(&t->self_lock);
	pthread_mutex_destroy(&t->engine);
	close(t->epfd);
	close(t->park_epfd);
	close(t->wake_fd);
	if (t->lfd >= 0)
		close(t->lfd);
}

static int tcp_addr_get(struct ferry_tp *tp, void *buf, size_t *len)
{
	struct tcp_tp *t = to_tcp(tp);
	size_t n = strlen(t->addr);

	if (*len < n) {
		*len = n;
		return -ENOSPC;
	}
	memcpy(buf, t->addr, n);
	*len = n;
	return 0;
}

const struct ferry_tp_ops ferry__tcp_ops = {
	.size = sizeof(struct ferry_tp_ops),
	.name = "tcp",
	.caps = FERRY_TP_CAP_POLL_MSG,
	.tp_size = sizeof(struct tcp_tp),
	.mr_size = sizeof(struct ferry_tp_mr),
	.init = tcp_init,
	.addr_get = tcp_addr_get,
	.connect = ferry__tcp_connect,
	.send = ferry__tcp_send,
	.drop = ferry__tcp_drop,
	.poll = ferry__tcp_poll,
	.fini = tcp_fini,
	.mem_held = ferry__tcp_mem_held,
};

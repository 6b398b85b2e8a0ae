/* SPDX-License-Identifier: MIT */
/*
 * send.c - the tcp transport's sending side: ops->send and the out queue of
 * each connection. ferry__tcp_send() runs on any thread, handlers included, and
 * concurrently with itself; ferry__tcp_conn_flush() runs on the progress thread.
 * They meet under the connection's lock (struct tcp_conn says what it
 * guards). A sender that hits a socket error marks the connection BROKEN and
 * wakes the progress thread, which logs it and fails it (recv.c).
 *
 * Sending (ops->send, any thread)
 *
 *   Under the connection's lock: when nothing is queued, sendmsg() straight
 *   from the caller's iovec, one syscall in the common case; whatever the
 *   socket does not take is copied to the out queue and EPOLLOUT is armed.
 *   The progress thread flushes the queue with gathered writes and disarms
 *   EPOLLOUT when it is empty. A frame is queued whole or not at all, so
 *   frames never interleave, and the frames of one thread to one destination
 *   leave in the order they were sent.
 *
 *     out queue: [chunk: f1 f2 f3] -> [chunk: rest of f4] -> NULL
 *                 ^ oq_off = bytes of the head chunk already written
 *
 *   Frames to our own rank go through the self queue (a mutex-protected list
 *   of copies and the wake eventfd) and are delivered by the progress thread.
 */
#define _GNU_SOURCE /* IOV_MAX */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "transport/tcp/tcp.h"

/* ---- out queue ---------------------------------------------------------- */

void ferry__tcp_oq_free(struct tcp_conn *c)
{
	struct tcp_chunk *ch = c->oq_head, *next;

	for (; ch; ch = next) {
		next = ch->next;
		free(ch);
	}
	c->oq_head = c->oq_tail = NULL;
	c->oq_off = 0;
	c->oq_bytes = 0;
	pthread_cond_broadcast(&c->oq_drained);
}

/*
 * tcp_oq_append - queue what is left of a frame after @skip bytes went out
 *
 * All or nothing: on -ENOMEM the queue is unchanged. Call with c->lock held.
 */
static int tcp_oq_append(struct tcp_conn *c, const struct iovec *iov, int iovcnt, size_t skip,
			 size_t total)
{
	size_t need = total - skip, room = 0, fill;
	struct tcp_chunk *tail = c->oq_tail, *fresh = NULL;

	if (tail)
		room = tail->cap - tail->len;
	if (need > room) {
		size_t cap = need - room;

		if (cap < TCP_CHUNK_SIZE)
			cap = TCP_CHUNK_SIZE;
		fresh = malloc(sizeof(*fresh) + cap);
		if (!fresh)
			return -ENOMEM;
		fresh->next = NULL;
		fresh->len = 0;
		fresh->cap = cap;
	}

	for (int i = 0; i < iovcnt; i++) {
		const unsigned char *p = iov[i].iov_base;
		size_t n = iov[i].iov_len;

		if (skip >= n) {
			skip -= n;
			continue;
		}
		p += skip;
		n -= skip;
		skip = 0;
		if (room) {
			fill = n < room ? n : room;
			memcpy(tail->data + tail->len, p, fill);
			tail->len += fill;
			room -= fill;
			p += fill;
			n -= fill;
		}
		if (n) {
			memcpy(fresh->data + fresh->len, p, n);
			fresh->len += n;
		}
	}
	if (fresh) {
		if (tail)
			tail->next = fresh;
		else
			c->oq_head = fresh;
		c->oq_tail = fresh;
	}
	c->oq_bytes += need;
	return 0;
}

/* Call with c->lock held and c->state UP. Return: 0 or a negative errno. */
static int tcp_conn_arm(struct tcp_tp *t, struct tcp_conn *c, int out)
{
	struct epoll_event ev = {
		.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0),
		.data.ptr = c,
	};

	if (c->out_armed == out)
		return 0;
	if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, c->fd, &ev))
		return -errno;
	c->out_armed = out;
	return 0;
}

/*
 * ferry__tcp_conn_flush - write out what the connection's queue holds
 *
 * Context: progress thread; takes c->lock.
 * Return: 0 (sent, or the socket is full again), or the negative errno of a
 * socket error; the caller fails the connection then.
 */
int ferry__tcp_conn_flush(struct tcp_tp *t, struct tcp_conn *c)
{
	struct iovec iov[TCP_FLUSH_IOV];
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	while (c->state == TCP_CONN_UP && c->oq_head) {
		struct msghdr mh = { .msg_iov = iov };
		struct tcp_chunk *ch = c->oq_head;
		size_t off = c->oq_off;
		ssize_t n;

		for (; ch && mh.msg_iovlen < TCP_FLUSH_IOV; ch = ch->next, off = 0) {
			iov[mh.msg_iovlen].iov_base = ch->data + off;
			iov[mh.msg_iovlen].iov_len = ch->len - off;
			mh.msg_iovlen++;
		}
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				ret = -errno;
			break;
		}
		c->oq_bytes -= (size_t)n < c->oq_bytes ? (size_t)n : c->oq_bytes;
		if (c->oq_bytes < FERRY_TP_SENDQ_MAX / 2)
			pthread_cond_broadcast(&c->oq_drained);
		while (n > 0) {
			ch = c->oq_head;
			if ((size_t)n < ch->len - c->oq_off) {
				c->oq_off += n;
				break;
			}
			n -= ch->len - c->oq_off;
			c->oq_off = 0;
			c->oq_head = ch->next;
			free(ch);
		}
		if (!c->oq_head)
			c->oq_tail = NULL;
		else if (c->oq_off)
			break; /* a short write: the socket is full */
	}
	if (!ret && c->state == TCP_CONN_UP && !c->oq_head)
		ret = tcp_conn_arm(t, c, 0);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* ---- sending ------------------------------------------------------------ */

/* Context: any thread. */
static int tcp_self_send(struct tcp_tp *t, const struct iovec *iov, int iovcnt, size_t total)
{
	struct tcp_selfmsg *m = malloc(sizeof(*m) + total);
	size_t off = 0;
	int was_empty;

	if (!m)
		return -ENOMEM;
	for (int i = 0; i < iovcnt; i++) {
		memcpy(m->data + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	m->next = NULL;
	m->len = total;

	pthread_mutex_lock(&t->self_lock);
	was_empty = !t->self_head;
	if (t->self_tail)
		t->self_tail->next = m;
	else
		t->self_head = m;
	t->self_tail = m;
	pthread_mutex_unlock(&t->self_lock);

	/* a non-empty queue has a wake pending already (see ferry__tcp_self_deliver) */
	if (was_empty)
		ferry__tcp_wake(t);
	return 0;
}

/*
 * ferry__tcp_send - queue one frame to @dst
 *
 * Context: any thread, concurrently with other sends and with the progress
 * thread (handlers may send); not after fini(). Never blocks on the network.
 * The iovec's memory is the caller's again when it returns.
 * Return: 0; -EINVAL (bad dst or iovcnt, or a header that fails
 * ferry__proto_check_hdr() or whose len is not the iovec's total);
 * -ENOTCONN before connect() succeeded; -FERRY_E_PEER when @dst failed;
 * -ENOMEM.
 */
/*
 * Back-pressure (transport.h, FERRY_TP_SENDQ_MAX): a sender other than the
 * progress thread waits while the peer's queue is full, until it drained to
 * half, bounded by the node's timeout. Call with c->lock held; returns with
 * it held. Return: 0, -EAGAIN (the peer did not read in time) or
 * -FERRY_E_PEER (it failed meanwhile).
 */
static int tcp_wait_room(struct tcp_tp *t, struct tcp_conn *c)
{
	struct timespec ts;
	int timeout_ms = ferry__tp_deadline(&t->base, &ts);

	while (c->state == TCP_CONN_UP && c->oq_bytes > FERRY_TP_SENDQ_MAX / 2)
		if (pthread_cond_timedwait(&c->oq_drained, &c->lock, &ts) == ETIMEDOUT &&
		    c->oq_bytes > FERRY_TP_SENDQ_MAX / 2) {
			ferry_err("tcp: rank %u: rank %u has not read the %zu bytes queued for it "
				  "within %d ms; the send fails with -EAGAIN (a stopped or slow "
				  "peer: check it, or retry later)",
				  t->base.cfg.rank, c->rank, c->oq_bytes, timeout_ms);
			return -EAGAIN;
		}
	return c->state == TCP_CONN_UP ? 0 : -FERRY_E_PEER;
}

int ferry__tcp_send(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt)
{
	struct tcp_tp *t = to_tcp(tp);
	struct msghdr mh = { .msg_iov = (struct iovec *)iov, .msg_iovlen = iovcnt };
	struct tcp_conn *c;
	size_t total, sent = 0;
	int ret = 0, wake = 0;
	ssize_t n;

	if (dst >= tp->cfg.world || iovcnt <= 0 || iovcnt > IOV_MAX)
		return -EINVAL;
	if (ferry__tp_check_frame(&t->base, dst, iov, iovcnt, &total))
		return -EINVAL;
	if (dst == tp->cfg.rank)
		return tcp_self_send(t, iov, iovcnt, total);

	c = &t->conns[dst];
	pthread_mutex_lock(&c->lock);
	if (c->state != TCP_CONN_UP) {
		ret = c->state == TCP_CONN_IDLE ? -ENOTCONN : -FERRY_E_PEER;
		goto out_unlock;
	}
	if (c->oq_bytes > FERRY_TP_SENDQ_MAX && !pthread_equal(pthread_self(), t->thread)) {
		ret = tcp_wait_room(t, c);
		if (ret)
			goto out_unlock;
	}
	if (!c->oq_head) {
		do {
			n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		} while (n < 0 && errno == EINTR);
		if (n == (ssize_t)total)
			goto out_unlock;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
			/* the progress thread logs it, closes, and reports the peer */
			c->state = TCP_CONN_BROKEN;
			c->send_err = errno;
			__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
			wake = 1;
			ret = -FERRY_E_PEER;
			goto out_unlock;
		}
		sent = n > 0 ? (size_t)n : 0;
	}
	ret = tcp_oq_append(c, iov, iovcnt, sent, total);
	if (ret) {
		if (sent) {
			/* half a frame is on the wire: the stream cannot go on */
			c->state = TCP_CONN_BROKEN;
			c->send_err = ENOMEM;
			__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
			wake = 1;
		}
		goto out_unlock;
	}
	ret = tcp_conn_arm(t, c, 1);
	if (ret) {
		/* queued but never flushed: treat the connection as broken */
		c->state = TCP_CONN_BROKEN;
		c->send_err = -ret;
		__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
		wake = 1;
		ret = -FERRY_E_PEER;
	}
out_unlock:
	pthread_mutex_unlock(&c->lock);
	if (wake)
		ferry__tcp_wake(t);
	return ret;
}

/*
 * The core dropped @dst: break its connection the way a failed send does,
 * so the progress thread closes it after the frame being handled (whose
 * buffer it must not free under the handler) and the peer sees the close.
 * The core knows already: no on_peer_failed for it. Progress thread.
 */
void ferry__tcp_drop(struct ferry_tp *tp, uint32_t dst)
{
	struct tcp_tp *t = to_tcp(tp);
	struct tcp_conn *c;

	if (dst >= t->base.cfg.world || dst == t->base.cfg.rank)
		return;
	c = &t->conns[dst];
	pthread_mutex_lock(&c->lock);
	c->reported = 1;
	if (c->state == TCP_CONN_UP) {
		c->state = TCP_CONN_BROKEN;
		c->send_err = ECONNABORTED;
		__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&c->lock);
	ferry__tcp_wake(t);
}

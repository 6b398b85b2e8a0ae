/* SPDX-License-Identifier: MIT */
/*
 * send.c - the tcp transport's sending side: ops->send and the send log of
 * each connection. ferry__tcp_send() runs on any thread, handlers included, and
 * concurrently with itself; ferry__tcp_conn_flush() runs on the progress thread.
 * They meet under the connection's lock (struct tcp_conn says what it
 * guards). A sender that hits a socket error marks the connection BROKEN and
 * wakes the progress thread, which takes the lost link on (session.c).
 *
 * Sending (ops->send, any thread)
 *
 *   Under the connection's lock, when nothing waits to be written, one
 *   sendmsg() goes straight from the caller's iovec (one syscall in the
 *   common case); then the whole frame is copied to the send log. What the
 *   socket did not take waits there and EPOLLOUT is armed; the progress thread writes
 *   the rest with gathered writes and disarms EPOLLOUT once all is written.
 *   Frames never interleave, and the frames of one thread to one
 *   destination leave in the order they were sent.
 *
 *     log: [chunk: f1 f2 f3] -> [chunk: f4 f5] -> [chunk: f6] -> NULL
 *           written, waiting    ^ snd, snd_off: the next byte to write
 *           for the peer's ACK
 *
 *   A written frame stays in the log until the peer acknowledges it
 *   (FERRY_MSG_ACK, cumulative): if the link is lost, the session resumes
 *   on a new connection from the first frame the peer did not deliver
 *   (ferry__tcp_log_rewind), so nothing is lost and nothing is applied
 *   twice. Frames are numbered 1, 2, ... per direction in the order they
 *   enter the log; ACKs (and the handshake) are not numbered.
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

/* ---- the send log ------------------------------------------------------- */

void ferry__tcp_oq_free(struct tcp_conn *c)
{
	struct tcp_chunk *ch = c->oq_head, *next;

	for (; ch; ch = next) {
		next = ch->next;
		ferry__tcp_chunk_free(ch);
	}
	for (ch = c->spare; ch; ch = next) {
		next = ch->next;
		ferry__tcp_chunk_free(ch);
	}
	c->spare = NULL;
	c->spare_bytes = 0;
	c->oq_held = c->held_peak = 0;
	c->oq_head = c->oq_tail = c->snd = NULL;
	c->snd_off = 0;
	c->oq_bytes = 0;
	pthread_cond_broadcast(&c->oq_drained);
}

/* make room at the log's end for a frame of @total bytes. c->lock held. */
static int tcp_log_room(struct tcp_conn *c, size_t total)
{
	struct tcp_chunk *tail = c->oq_tail, *fresh, **pp, **best = NULL;
	size_t most = 2 * ferry__tcp_chunk_cap(total);

	if (tail && tail->cap - tail->len >= total)
		return 0;
	/* reuse a chunk an acknowledgement freed: no page faults of fresh
	 * memory (a stream of large frames faulted in every chunk), and its
	 * lines are likely still cached. The smallest that fits, and none
	 * more than twice the size needed: small frames that kept a burst's
	 * large chunk cycling through the log would keep it from the trim */
	for (pp = &c->spare; *pp; pp = &(*pp)->next)
		if ((*pp)->cap >= total && (*pp)->cap <= most &&
		    (!best || (*pp)->cap < (*best)->cap))
			best = pp;
	if (best) {
		fresh = *best;
		*best = fresh->next;
		c->spare_bytes -= fresh->cap;
	} else {
		fresh = ferry__tcp_chunk_new(total); /* mem.c */
		if (!fresh)
			return -ENOMEM;
	}
	fresh->next = NULL;
	fresh->len = 0;
	c->oq_held += fresh->cap;
	if (c->oq_held > c->held_peak)
		c->held_peak = c->oq_held;
	fresh->seq0 = c->tx_seq + 1;
	fresh->seq_end = c->tx_seq;
	if (tail)
		tail->next = fresh;
	else
		c->oq_head = fresh;
	c->oq_tail = fresh;
	return 0;
}

/*
 * tcp_log_append - copy a whole frame to the end of the log, after
 * tcp_log_room() made room for it (so it cannot fail)
 * @written: bytes of it already on the wire (only when nothing else was
 *           waiting to be written: snd NULL)
 *
 * A sequenced frame gets the number tx_seq + 1. Call with c->lock held.
 */
static void tcp_log_append(struct tcp_conn *c, const struct iovec *iov, int iovcnt, size_t total,
			   int sequenced, size_t written)
{
	struct tcp_chunk *tail = c->oq_tail;
	size_t at = tail->len;

	for (int i = 0; i < iovcnt; i++) {
		memcpy(tail->data + tail->len, iov[i].iov_base, iov[i].iov_len);
		tail->len += iov[i].iov_len;
	}
	if (sequenced)
		tail->seq_end = ++c->tx_seq;
	if (!c->snd && written < total) {
		c->snd = tail;
		c->snd_off = at + written;
	}
	c->oq_bytes += total;
}

/* drop the head chunks whose frames were all written and acknowledged. c->lock held. */
static void tcp_log_trim(struct tcp_conn *c, int written_only)
{
	struct tcp_chunk *ch;

	while ((ch = c->oq_head) && ch->seq_end <= c->tx_acked) {
		if (ch == c->snd) {
			if (written_only)
				break;
			c->snd = NULL; /* rewind sets it again */
		}
		c->oq_head = ch->next;
		if (!c->oq_head)
			c->oq_tail = NULL;
		c->oq_bytes -= ch->len;
		c->oq_held -= ch->cap;
		/* kept for the next frames; the trim (mem.c) returns what the
		 * traffic stops needing */
		if (c->spare_bytes + ch->cap <= TCP_SPARE_MAX) {
			ch->next = c->spare;
			c->spare = ch;
			c->spare_bytes += ch->cap;
		} else {
			ferry__tcp_chunk_free(ch);
		}
	}
	if (c->oq_bytes < FERRY_TP_SENDQ_MAX / 2)
		pthread_cond_broadcast(&c->oq_drained);
}

void ferry__tcp_log_forget(struct tcp_conn *c)
{
	tcp_log_trim(c, 1);
}

void ferry__tcp_log_ack(struct tcp_conn *c, uint64_t n)
{
	if (n <= c->tx_acked)
		return; /* an old ACK, resent after a resume */
	c->tx_acked = n;
	tcp_log_trim(c, 1);
}

/* sequenced frames from (@ch, @off) up to the write position (@end, @end_off; NULL: the end) */
static uint64_t tcp_log_count(struct tcp_chunk *ch, size_t off, const struct tcp_chunk *end,
			      size_t end_off)
{
	uint64_t n = 0;

	for (; ch; ch = ch->next, off = 0)
		while (off < ch->len) {
			struct ferry_msg_hdr hdr;

			if (ch == end && off >= end_off)
				return n;
			memcpy(&hdr, ch->data + off, sizeof(hdr));
			n += ferry__proto_sequenced(hdr.type);
			off += hdr.len;
		}
	return n;
}

int ferry__tcp_log_rewind(struct tcp_conn *c, uint64_t n, uint64_t *again_p)
{
	struct tcp_chunk *was = c->snd;
	size_t was_off = c->snd_off;

	if (n > c->tx_acked)
		c->tx_acked = n;
	tcp_log_trim(c, 0);
	if (was && !c->snd) {
		/* its chunk held only frames the peer has: none goes again */
		was = c->oq_head;
		was_off = 0;
	}
	c->snd = NULL;
	c->snd_off = 0;
	*again_p = 0;
	for (struct tcp_chunk *ch = c->oq_head; ch; ch = ch->next) {
		uint64_t seq = ch->seq0;

		if (ch->seq_end <= n)
			continue; /* frames the peer has (and ACKs): not written again */
		for (size_t off = 0; off < ch->len;) {
			struct ferry_msg_hdr hdr;

			memcpy(&hdr, ch->data + off, sizeof(hdr));
			if (ferry__proto_sequenced(hdr.type) && seq++ == n + 1) {
				c->snd = ch;
				c->snd_off = off;
				*again_p = tcp_log_count(ch, off, was, was ? was_off : 0);
				return 0;
			}
			off += hdr.len;
		}
		return -1; /* the chunk said it holds frame n + 1 */
	}
	return n == c->tx_seq ? 0 : -1;
}

/*
 * tcp_log_write - write what the log holds from snd on
 *
 * Call with c->lock held and c->state UP. Return: 0 (all written, or the
 * socket is full), or the negative errno of a socket error.
 */
static int tcp_log_write(struct tcp_conn *c)
{
	struct iovec iov[TCP_FLUSH_IOV];

	while (c->snd) {
		struct msghdr mh = { .msg_iov = iov };
		struct tcp_chunk *ch = c->snd;
		size_t off = c->snd_off, want = 0;
		ssize_t n;

		for (; ch && mh.msg_iovlen < TCP_FLUSH_IOV; ch = ch->next, off = 0) {
			iov[mh.msg_iovlen].iov_base = ch->data + off;
			iov[mh.msg_iovlen].iov_len = ch->len - off;
			want += ch->len - off;
			mh.msg_iovlen++;
		}
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -errno;
		}
		for (size_t left = (size_t)n; left;) {
			size_t rest = c->snd->len - c->snd_off;

			if (left < rest) {
				c->snd_off += left;
				break;
			}
			left -= rest;
			c->snd = c->snd->next;
			c->snd_off = 0;
		}
		if ((size_t)n < want)
			return 0; /* a short write: the socket is full */
	}
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
 * ferry__tcp_conn_flush - write out what the connection's log holds unwritten
 *
 * Context: progress thread; takes c->lock.
 * Return: 0 (written, or the socket is full again), or the negative errno of
 * a socket error; the caller takes the link for lost then.
 */
int ferry__tcp_conn_flush(struct tcp_tp *t, struct tcp_conn *c)
{
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	if (c->state == TCP_CONN_UP) {
		ret = tcp_log_write(c);
		if (!ret)
			ret = tcp_conn_arm(t, c, c->snd != NULL);
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* a sender saw @err on the socket: the progress thread takes it on. c->lock held. */
static void tcp_conn_break(struct tcp_tp *t, struct tcp_conn *c, int err)
{
	c->state = TCP_CONN_BROKEN;
	c->send_err = err;
	__atomic_store_n(&t->fail_pending, 1, __ATOMIC_RELEASE);
}

/* Context: progress thread. */
void ferry__tcp_send_ack(struct tcp_tp *t, struct tcp_conn *c)
{
	struct {
		struct ferry_msg_hdr hdr;
		struct ferry_msg_ack ack;
	} f;
	struct iovec iov = { .iov_base = &f, .iov_len = sizeof(f) };
	int ret = 0;

	ferry__proto_hdr_init(&f.hdr, FERRY_MSG_ACK, sizeof(f), t->base.cfg.rank, 0);
	f.ack.delivered = c->rx_seq;
	c->ack_due = 0;
	pthread_mutex_lock(&c->lock);
	if (c->state != TCP_CONN_UP)
		goto out_unlock; /* a RESUME will say it */
	if (tcp_log_room(c, sizeof(f)))
		goto out_unlock; /* no memory: the next one says it */
	tcp_log_append(c, &iov, 1, sizeof(f), 0, 0);
	c->rx_acked = c->rx_seq;
	c->rx_unacked = 0;
	ret = tcp_log_write(c);
	if (!ret)
		ret = tcp_conn_arm(t, c, c->snd != NULL);
	if (ret)
		tcp_conn_break(t, c, -ret);
out_unlock:
	pthread_mutex_unlock(&c->lock);
	if (ret)
		ferry__tcp_wake(t);
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
/* the session lives: frames may still be queued for the peer. c->lock held. */
static int tcp_conn_live(const struct tcp_conn *c)
{
	return c->state == TCP_CONN_UP || c->state == TCP_CONN_DOWN ||
	       (c->state == TCP_CONN_BROKEN && c->send_err != ECONNABORTED);
}

/*
 * Back-pressure (transport.h, FERRY_TP_SENDQ_MAX): a sender other than the
 * progress thread waits while the peer's log is full (written frames count
 * until the peer acknowledges them), until it drained to half, bounded by
 * the node's timeout. Call with c->lock held; returns with it held. Return:
 * 0, -EAGAIN (the peer did not read in time) or -FERRY_E_PEER (it failed
 * meanwhile).
 */
static int tcp_wait_room(struct tcp_tp *t, struct tcp_conn *c)
{
	struct timespec ts;
	int timeout_ms = ferry__tp_deadline(&t->base, &ts);

	while (tcp_conn_live(c) && c->oq_bytes > FERRY_TP_SENDQ_MAX / 2)
		if (pthread_cond_timedwait(&c->oq_drained, &c->lock, &ts) == ETIMEDOUT &&
		    c->oq_bytes > FERRY_TP_SENDQ_MAX / 2) {
			ferry_err("tcp: rank %u: rank %u has not read the %zu bytes queued for it "
				  "within %d ms; the send fails with -EAGAIN (a stopped or slow "
				  "peer: check it, or retry later)",
				  t->base.cfg.rank, c->rank, c->oq_bytes, timeout_ms);
			return -EAGAIN;
		}
	return tcp_conn_live(c) ? 0 : -FERRY_E_PEER;
}

/*
 * ferry__tcp_send - queue one frame to @dst
 *
 * Context: any thread, concurrently with other sends and with the progress
 * thread (handlers may send); not after fini(). Never blocks on the network.
 * The iovec's memory is the caller's again when it returns. While the link
 * to @dst is lost and being re-established, the frame waits in the log.
 * Return: 0; -EINVAL (bad dst or iovcnt, or a header that fails
 * ferry__proto_check_hdr() or whose len is not the iovec's total);
 * -ENOTCONN before connect() succeeded; -FERRY_E_PEER when @dst failed;
 * -EAGAIN (back-pressure); -ENOMEM.
 */
int ferry__tcp_send(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt)
{
	struct tcp_tp *t = to_tcp(tp);
	struct tcp_conn *c;
	size_t total, written = 0;
	int ret = 0, wake = 0, err = 0;
	ssize_t n;

	if (dst >= tp->cfg.world || iovcnt <= 0 || iovcnt > IOV_MAX)
		return -EINVAL;
	if (ferry__tp_check_frame(&t->base, dst, iov, iovcnt, &total))
		return -EINVAL;
	if (dst == tp->cfg.rank)
		return tcp_self_send(t, iov, iovcnt, total);

	c = &t->conns[dst];
	pthread_mutex_lock(&c->lock);
	if (!tcp_conn_live(c)) {
		ret = c->state == TCP_CONN_IDLE ? -ENOTCONN : -FERRY_E_PEER;
		goto out_unlock;
	}
	if (c->oq_bytes > FERRY_TP_SENDQ_MAX && !ferry__tcp_engine_held(t)) {
		ret = tcp_wait_room(t, c);
		if (ret)
			goto out_unlock;
	}
	ret = tcp_log_room(c, total);
	if (ret)
		goto out_unlock;
	if (c->state == TCP_CONN_UP && !c->snd) {
		/* nothing waits: straight from the caller's iovec, then into the log */
		struct msghdr mh = { .msg_iov = (struct iovec *)iov, .msg_iovlen = iovcnt };

		do {
			n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		} while (n < 0 && errno == EINTR);
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			err = errno;
		written = n > 0 ? (size_t)n : 0;
	}
	tcp_log_append(c, iov, iovcnt, total, 1, written);
	if (c->state != TCP_CONN_UP)
		goto out_unlock; /* DOWN or BROKEN: it goes once the session resumes */
	if (!err && c->snd)
		err = -tcp_conn_arm(t, c, 1);
	if (err) {
		/* the frame is in the log: the progress thread reconnects or fails */
		tcp_conn_break(t, c, err);
		wake = 1;
	}
out_unlock:
	pthread_mutex_unlock(&c->lock);
	if (wake)
		ferry__tcp_wake(t);
	return ret;
}

/*
 * The core dropped @dst: break its connection the way a failed send does,
 * with ECONNABORTED (no reconnection), so the progress thread closes it
 * after the frame being handled (whose buffer it must not free under the
 * handler) and the peer sees the close.
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
	if (c->state == TCP_CONN_UP || c->state == TCP_CONN_DOWN || c->state == TCP_CONN_BROKEN)
		tcp_conn_break(t, c, ECONNABORTED);
	pthread_mutex_unlock(&c->lock);
	ferry__tcp_wake(t);
}

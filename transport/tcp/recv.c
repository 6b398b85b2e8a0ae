/* SPDX-License-Identifier: MIT */
/*
 * recv.c - the tcp transport's receiving side: framing the byte stream of
 * each connection, delivering frames (the connections' and the self queue's)
 * to on_msg(), and failing connections. Context: the progress thread only.
 * It takes a connection's lock only for what it shares with senders (reading
 * BROKEN, failing the connection) and never holds it across a handler.
 *
 * Receiving (progress thread)
 *
 *     rbuf: [consumed | frame | frame | partial frame |   free   ]
 *                     ^ rhead                         ^ rtail    ^ rcap
 *
 *   One recv() takes as much as fits (several frames per syscall under
 *   load); every complete frame is checked (ferry__proto_check_hdr(), src ==
 *   the connection's rank) and handed to on_msg() in place. rbuf is
 *   page-aligned (mem.c) and every frame length is a multiple of
 *   FERRY_MSG_ALIGN, so each frame starts 8-byte aligned. The buffer grows
 *   to hold a frame of up to FERRY_MSG_MAX bytes and is freed once it is
 *   empty and above TCP_RBUF_KEEP; below, the trim (mem.c) gives its pages
 *   back once it is empty, and a grown one back to TCP_RBUF_SIZE.
 *
 * Sessions: every frame but the transport's own (HELLO, RESUME, ACK) counts
 * in rx_seq when it is handed to on_msg(); an ACK of that count goes back
 * every TCP_ACK_FRAMES frames or TCP_ACK_BYTES bytes, else TCP_ACK_DELAY_MS
 * after the first frame it covers (session.c runs the timer). An ACK that
 * comes in frees the frames it covers from our send log.
 *
 * Failures: a bad header or a wrong src closes that one connection and
 * calls on_peer_failed() once for that rank, from the progress thread. EOF
 * or a socket error loses the link only: session.c re-establishes it, or
 * fails the peer (after a BYE, past FERRY_RECONNECT_MS, or when its process
 * is gone). The other connections go on.
 */
#define _GNU_SOURCE /* like every file of the transport (tcp.h) */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"

/* ---- failures ----------------------------------------------------------- */

/*
 * ferry__tcp_conn_fail - close a connection and report its rank failed, once
 *
 * The caller has logged the cause. Context: progress thread.
 */
void ferry__tcp_conn_fail(struct tcp_tp *t, struct tcp_conn *c, int err)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	int fd;

	pthread_mutex_lock(&c->lock);
	fd = c->fd;
	c->fd = -1;
	c->state = TCP_CONN_FAILED;
	ferry__tcp_oq_free(c);
	pthread_mutex_unlock(&c->lock);

	/* no sender touches fd now that the state is FAILED */
	if (fd >= 0) {
		epoll_ctl(t->epfd, EPOLL_CTL_DEL, fd, NULL);
		close(fd);
	}
	if (c->link.fd >= 0) {
		epoll_ctl(t->epfd, EPOLL_CTL_DEL, c->link.fd, NULL);
		close(c->link.fd);
		c->link.fd = -1;
	}
	c->ack_due = 0;
	ferry__tcp_rbuf_free(c);

	if (!c->reported) {
		c->reported = 1;
		if (h->on_peer_failed)
			h->on_peer_failed(t->base.cfg.core, c->rank, err);
	}
}

/* Context: progress thread, after a sender flagged fail_pending. */
void ferry__tcp_fail_broken(struct tcp_tp *t)
{
	uint32_t world = t->base.cfg.world;

	for (uint32_t r = 0; r < world; r++) {
		struct tcp_conn *c = &t->conns[r];
		int err;

		pthread_mutex_lock(&c->lock);
		err = c->state == TCP_CONN_BROKEN ? c->send_err : 0;
		pthread_mutex_unlock(&c->lock);
		if (!err)
			continue;
		if (err == ECONNABORTED) {
			ferry_info(
				"tcp: rank %u: closing the connection to rank %u, which the core "
				"dropped",
				t->base.cfg.rank, r);
			ferry__tcp_conn_fail(t, c, -FERRY_E_PEER);
		} else {
			char why[128];

			snprintf(why, sizeof(why), "rank %u: sending to rank %u failed (%s)",
				 t->base.cfg.rank, r, strerror(err));
			ferry__tcp_conn_lost(t, c, why);
		}
	}
}

/* ---- receiving ---------------------------------------------------------- */

/* make room in c->rbuf for the frame at rhead and a large read. Progress thread. */
static int tcp_rbuf_make_room(struct tcp_conn *c)
{
	size_t want = c->rneed > TCP_HDR_LEN ? c->rneed : TCP_HDR_LEN;

	if (c->rhead && (c->rcap - c->rtail < TCP_READ_MIN || c->rhead + want > c->rcap)) {
		memmove(c->rbuf, c->rbuf + c->rhead, c->rtail - c->rhead);
		c->rtail -= c->rhead;
		c->rhead = 0;
	}
	if (c->rbuf && want <= c->rcap)
		return 0;
	/* room for the whole frame and for the frames that follow it */
	want = want < TCP_RBUF_SIZE ? TCP_RBUF_SIZE : want + TCP_RBUF_SIZE;
	return ferry__tcp_rbuf_resize(c, want); /* mem.c */
}

/*
 * tcp_conn_control - a frame of the transport's own in the stream: an ACK
 * frees what it covers from our send log; a HELLO or RESUME after the
 * handshake is a protocol error. Return: 0, or -1 when the connection failed.
 */
static int tcp_conn_control(struct tcp_tp *t, struct tcp_conn *c, const unsigned char *frame,
			    const struct ferry_msg_hdr *hdr)
{
	struct ferry_msg_ack ack;
	uint64_t sent = 0;
	int bad = 1;

	if (hdr->type == FERRY_MSG_ACK && hdr->len == TCP_ACK_LEN) {
		memcpy(&ack, frame + sizeof(*hdr), sizeof(ack));
		pthread_mutex_lock(&c->lock);
		sent = c->tx_seq;
		bad = ack.delivered > sent;
		if (!bad)
			ferry__tcp_log_ack(c, ack.delivered);
		pthread_mutex_unlock(&c->lock);
		if (!bad) {
			ferry__tcp_trim_arm(t); /* the chunks it freed went to the pool */
			return 0;
		}
		ferry_warn("tcp: rank %u acknowledged %llu frames to rank %u, which sent it %llu; "
			   "dropping its connection and marking it failed",
			   c->rank, (unsigned long long)ack.delivered, t->base.cfg.rank,
			   (unsigned long long)sent);
	} else {
		ferry_warn(
			"tcp: rank %u sent rank %u a frame of type %u and %u bytes in the middle "
			"of a session; dropping its connection and marking it failed",
			c->rank, t->base.cfg.rank, hdr->type, hdr->len);
	}
	ferry__tcp_conn_fail(t, c, -FERRY_E_PROTO);
	return -1;
}

/*
 * tcp_conn_deliver - hand every complete frame in rbuf to on_msg()
 *
 * Context: progress thread. Return: 0, or -1 when the connection failed.
 */
static int tcp_conn_deliver(struct tcp_tp *t, struct tcp_conn *c)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	uint32_t world = t->base.cfg.world;

	while (c->rtail - c->rhead >= TCP_HDR_LEN) {
		const unsigned char *frame = c->rbuf + c->rhead;
		struct ferry_msg_hdr hdr;
		const char *why = "invalid header";

		memcpy(&hdr, frame, sizeof(hdr));
		if (ferry__proto_check_hdr(&hdr, world, &why)) {
			ferry_warn("tcp: rank %u sent rank %u a frame with a bad header (%s); "
				   "dropping its connection and marking it failed",
				   c->rank, t->base.cfg.rank, why);
			ferry__tcp_conn_fail(t, c, -FERRY_E_PROTO);
			return -1;
		}
		if (hdr.src != c->rank) {
			ferry_warn("tcp: rank %u sent rank %u a frame that claims to come from "
				   "rank %u; dropping its connection and marking it failed",
				   c->rank, t->base.cfg.rank, hdr.src);
			ferry__tcp_conn_fail(t, c, -FERRY_E_PROTO);
			return -1;
		}
		if (c->rtail - c->rhead < hdr.len) {
			c->rneed = hdr.len;
			break;
		}
		/* rbuf is page-aligned and every len a multiple of FERRY_MSG_ALIGN */
		c->rhead += hdr.len;
		c->rneed = 0;
		if (hdr.len > c->rbig)
			c->rbig = hdr.len;
		if (!ferry__proto_sequenced(hdr.type)) {
			if (tcp_conn_control(t, c, frame, &hdr))
				return -1;
			continue;
		}
		c->rx_seq++;
		c->rx_unacked += hdr.len;
		if (hdr.type == FERRY_MSG_BYE) {
			c->bye = 1; /* the transport's own: the core never sees it */
			continue;
		}
		h->on_msg(t->base.cfg.core, c->rank, frame, hdr.len);
	}
	if (c->rx_seq != c->rx_acked) {
		if (c->rx_seq - c->rx_acked >= TCP_ACK_FRAMES || c->rx_unacked >= TCP_ACK_BYTES) {
			ferry__tcp_send_ack(t, c);
		} else if (!c->ack_due) {
			c->ack_due = tcp_now_ms() + TCP_ACK_DELAY_MS;
			ferry__tcp_timer_at(t, c->ack_due);
		}
	}
	if (c->rhead == c->rtail) {
		c->rhead = c->rtail = 0;
		if (c->rcap > TCP_RBUF_KEEP)
			ferry__tcp_rbuf_free(c);
	}
	return 0;
}

/* the peer closed its end: between frames, or in the middle of one. Progress thread. */
static void tcp_conn_eof(struct tcp_tp *t, struct tcp_conn *c)
{
	size_t have = c->rtail - c->rhead;
	uint32_t me = t->base.cfg.rank;
	char why[160];

	if (!have && c->bye) {
		ferry_info("tcp: rank %u left (it closed its connection to rank %u)", c->rank, me);
		ferry__tcp_conn_fail(t, c, -FERRY_E_PEER);
		return;
	}
	if (!have)
		snprintf(why, sizeof(why), "rank %u closed its connection to rank %u", c->rank, me);
	else if (!c->rneed)
		snprintf(why, sizeof(why),
			 "rank %u closed its connection to rank %u in the middle of a frame "
			 "header (%zu of %zu bytes)",
			 c->rank, me, have, TCP_HDR_LEN);
	else
		snprintf(why, sizeof(why),
			 "rank %u closed its connection to rank %u in the middle of a frame (%zu "
			 "of %zu bytes)",
			 c->rank, me, have, c->rneed);
	ferry__tcp_conn_lost(t, c, why);
}

/* read what the socket has and deliver it. Context: progress thread. */
void ferry__tcp_conn_input(struct tcp_tp *t, struct tcp_conn *c)
{
	for (int i = 0; i < TCP_READS_PER_EVENT; i++) {
		size_t room;
		ssize_t n;

		if (tcp_rbuf_make_room(c)) {
			ferry_err("tcp: rank %u: no memory for a %zu-byte frame from rank %u; "
				  "dropping its connection",
				  t->base.cfg.rank, c->rneed, c->rank);
			ferry__tcp_conn_fail(t, c, -ENOMEM);
			return;
		}
		room = c->rcap - c->rtail;
		n = recv(c->fd, c->rbuf + c->rtail, room, 0);
		if (n > 0) {
			c->rtail += n;
			if (c->rtail > c->rtouched) {
				if (!c->rtouched)
					ferry__tcp_trim_arm(
						t); /* its pages go back when it empties */
				__atomic_store_n(&c->rtouched, c->rtail, __ATOMIC_RELAXED);
			}
			if (tcp_conn_deliver(t, c))
				return;
			if ((size_t)n < room)
				return; /* drained; level-triggered epoll says when more comes */
			continue;
		}
		if (n == 0) {
			tcp_conn_eof(t, c);
			return;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return;
		{
			char why[128];

			snprintf(why, sizeof(why), "rank %u: the connection to rank %u failed (%s)",
				 t->base.cfg.rank, c->rank, strerror(errno));
			ferry__tcp_conn_lost(t, c, why);
		}
		return;
	}
}

/* Context: progress thread. */
void ferry__tcp_self_deliver(struct tcp_tp *t)
{
	const struct ferry_tp_handler *h = t->base.cfg.handler;
	struct tcp_selfmsg *m, *next;

	pthread_mutex_lock(&t->self_lock);
	m = t->self_head;
	t->self_head = t->self_tail = NULL;
	pthread_mutex_unlock(&t->self_lock);

	for (; m; m = next) {
		next = m->next;
		h->on_msg(t->base.cfg.core, t->base.cfg.rank, m->data, m->len);
		free(m);
	}
}

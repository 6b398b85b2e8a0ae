/* SPDX-License-Identifier: MIT */
/* tnode.c - a transport instance with a test's core: tnode.h says what it records. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "common/tnode.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

__thread int tn_in_poll;

const uint32_t tn_size_classes[] = {
	16, 24, 200, 4096, 4104, (64 << 10) + 8, (1 << 20) + 8, 3 << 20, 8 << 20,
};
const size_t tn_nsize_classes = ARRAY_SIZE(tn_size_classes);

int64_t tn_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct timespec tn_deadline_in(int ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	return ts;
}

void tn_frame_fill(uint8_t *buf, uint8_t type, uint32_t len, uint32_t src, uint32_t table)
{
	struct ferry_msg_hdr hdr = {
		.magic = FERRY_MSG_MAGIC,
		.version = FERRY_PROTO_VERSION,
		.type = type,
		.len = len,
		.src = src,
		.table = table,
	};

	memcpy(buf, &hdr, sizeof(hdr));
	for (size_t i = TN_HDR_LEN; i < len; i++)
		buf[i] = tn_pattern(src, table, i);
}

/* note a defect: counted under n->lock, the first one described */
static void note_bad(struct tnode *n, int *counter, const char *what, uint32_t src, size_t len)
{
	if (!n->first_bad[0])
		snprintf(n->first_bad, sizeof(n->first_bad), "%s (frame of %zu bytes from rank %u)",
			 what, len, src);
	(*counter)++;
}

/* every handler starts here: is it on the progress thread, before fini? */
static void handler_enter(struct tnode *n)
{
	if (tn_in_poll)
		n->msgs_polled++; /* on the thread in poll(): tcp's FERRY_TCP_WORKER_POLL */
	else if (!n->starts || !pthread_equal(pthread_self(), n->progress))
		n->wrong_thread++;
	if (n->fini_done)
		n->after_fini++;
}

static void tn_on_msg(void *core, uint32_t src, const void *buf, size_t len)
{
	struct tnode *n = core;
	const struct ferry_msg_hdr *hdr = buf;
	const uint8_t *p = buf;
	uint32_t sender, seq;
	int content_ok = 1, ack = 0;

	pthread_mutex_lock(&n->lock);
	handler_enter(n);
	if ((uintptr_t)buf & 7)
		note_bad(n, &n->misaligned, "misaligned", src, len);
	if (src >= n->world || src >= TN_MAX_NODES || len < TN_HDR_LEN || hdr->len != len ||
	    hdr->src != src) {
		note_bad(n, &n->bad_len, "length or src differs from the header", src, len);
		goto out;
	}
	if (hdr->type == FERRY_MSG_REPLY) {
		n->acks[src]++;
		goto out;
	}
	if (hdr->type == FERRY_MSG_BARRIER) {
		if (hdr->table != n->marks[src] + 1)
			note_bad(n, &n->bad_order, "sync mark out of order", src, len);
		n->marks[src] = hdr->table;
		n->frames_at_mark[src] = n->frames[src];
		goto out;
	}
	sender = hdr->table >> 24;
	seq = hdr->table & 0xffffff;
	if (sender >= TN_MAX_SENDERS || seq != n->next_seq[src][sender])
		note_bad(n, &n->bad_order, "out of order", src, len);
	else
		n->next_seq[src][sender] = seq + 1;
	for (size_t i = TN_HDR_LEN; i < len && content_ok; i++)
		content_ok = p[i] == tn_pattern(src, hdr->table, i);
	if (!content_ok)
		note_bad(n, &n->bad_content, "content differs", src, len);
	n->frames[src]++;
	n->bytes[src] += len;
	if (n->watch) {
		if (memcmp(n->watch, n->watch_want, n->watch_len))
			n->watch_bad++;
		else
			n->watch_good++;
	}
	ack = n->echo;
	if (n->gate_closed) {
		struct timespec dl = tn_deadline_in(20000);

		n->gated = 1;
		pthread_cond_broadcast(&n->cond);
		while (n->gate_closed && pthread_cond_timedwait(&n->cond, &n->lock, &dl) == 0)
			;
		n->gated = 0;
	}
out:
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);

	if (ack) {
		uint8_t reply[TN_HDR_LEN];
		struct iovec iov = { .iov_base = reply, .iov_len = sizeof(reply) };

		tn_frame_fill(reply, FERRY_MSG_REPLY, sizeof(reply), n->rank, hdr->table);
		if (n->ops->send(n->tp, src, &iov, 1)) {
			pthread_mutex_lock(&n->lock);
			n->ack_errs++;
			pthread_mutex_unlock(&n->lock);
		}
	}
}

static void tn_on_peer_failed(void *core, uint32_t src, int err)
{
	struct tnode *n = core;

	pthread_mutex_lock(&n->lock);
	handler_enter(n);
	if (src < TN_MAX_NODES) {
		if (!n->failed[src]++)
			n->failed_ms[src] = tn_now_ms();
		n->failed_err[src] = err;
	}
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
}

static void tn_on_rdma_done(void *core, void *ctx, int status)
{
	struct tnode *n = core;
	struct rdma_slot *slot = ctx;

	pthread_mutex_lock(&n->lock);
	/* checked apart from the other handlers: see the suite's rdma_check_threads() */
	if (tn_in_poll)
		n->rdma_polled++;
	else if (!n->starts || !pthread_equal(pthread_self(), n->progress))
		n->rdma_off_thread++;
	if (n->fini_done)
		n->after_fini++;
	n->rdma_done++;
	if (status && !n->rdma_errs++)
		n->rdma_first_err = status;
	if (slot) {
		slot->done++;
		slot->status = status;
		if (slot->seen_ptr)
			slot->seen = __atomic_load_n(slot->seen_ptr, __ATOMIC_ACQUIRE);
	}
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
}

static void tn_on_write_imm(void *core, uint32_t src, uint32_t tag)
{
	struct tnode *n = core;

	pthread_mutex_lock(&n->lock);
	handler_enter(n);
	if (n->imm_n < TN_IMM_LOG && src < TN_MAX_NODES)
		n->imm_log[n->imm_n++] =
			(struct tn_imm){ .src = src, .tag = tag, .frames_before = n->frames[src] };
	__atomic_store_n(&n->imms, n->imms + 1, __ATOMIC_RELEASE);
	if (n->imm_base) {
		const uint8_t *p = n->imm_base + (size_t)tag * n->imm_stride;

		for (size_t i = 0; i < n->imm_stride; i++)
			if (p[i] != tn_pattern(src, tag, i)) {
				n->imm_bad++;
				break;
			}
	}
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
}

static void tn_on_thread_start(void *core)
{
	struct tnode *n = core;

	pthread_mutex_lock(&n->lock);
	n->starts++;
	n->progress = pthread_self();
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
}

static void tn_on_thread_stop(void *core)
{
	struct tnode *n = core;

	pthread_mutex_lock(&n->lock);
	handler_enter(n);
	n->stops++;
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
}

const struct ferry_tp_handler tn_handler = {
	.on_msg = tn_on_msg,
	.on_peer_failed = tn_on_peer_failed,
	.on_rdma_done = tn_on_rdma_done,
	.on_write_imm = tn_on_write_imm,
	.on_thread_start = tn_on_thread_start,
	.on_thread_stop = tn_on_thread_stop,
};

int tn_start(struct tnode *n, const struct ferry_tp_ops *ops, const struct ferry_tp_config *cfg)
{
	struct ferry_tp_config c = *cfg;
	pthread_condattr_t ca;
	int ret;

	memset(n, 0, sizeof(*n));
	n->ops = ops;
	n->rank = cfg->rank;
	n->world = cfg->world;
	pthread_mutex_init(&n->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&n->cond, &ca);
	pthread_condattr_destroy(&ca);

	c.handler = &tn_handler;
	c.core = n;
	n->tp = calloc(1, ops->tp_size);
	if (!n->tp)
		return -ENOMEM;
	n->tp->ops = ops;
	ret = ops->init(n->tp, &c);
	if (ret)
		goto err_free;
	n->addr_len = sizeof(n->addr);
	ret = ops->addr_get(n->tp, n->addr, &n->addr_len);
	if (ret)
		goto err_fini;
	if (!n->addr_len || n->addr_len > FERRY_TP_ADDR_MAX) {
		ret = -EINVAL;
		goto err_fini;
	}
	return 0;

err_fini:
	ops->fini(n->tp);
err_free:
	free(n->tp);
	n->tp = NULL;
	return ret;
}

void tn_fini(struct tnode *n)
{
	if (!n->tp)
		return;
	n->ops->fini(n->tp);
	free(n->tp);
	n->tp = NULL;
	pthread_mutex_lock(&n->lock);
	n->fini_done = 1;
	pthread_mutex_unlock(&n->lock);
}

int tn_send_frame(struct tnode *n, uint32_t dst, uint32_t sender, uint32_t seq, uint32_t len)
{
	uint8_t small[256];
	uint8_t *buf = len <= sizeof(small) ? small : malloc(len);
	uint32_t table = sender << 24 | seq;
	size_t half = TN_HDR_LEN + (len - TN_HDR_LEN) / 2;
	struct iovec iov[3] = {
		{ .iov_base = buf, .iov_len = TN_HDR_LEN },
		{ .iov_base = buf + TN_HDR_LEN, .iov_len = half - TN_HDR_LEN },
		{ .iov_base = buf + half, .iov_len = len - half },
	};
	int ret;

	if (!buf)
		return -ENOMEM;
	tn_frame_fill(buf, FERRY_MSG_OP, len, n->rank, table);
	ret = n->ops->send(n->tp, dst, iov, 3);
	if (buf != small)
		free(buf);
	return ret;
}

int tn_clean(struct tnode *n, char *why, size_t len)
{
	size_t off = 0;
	int bad = 0;

	if (len)
		why[0] = '\0';
	pthread_mutex_lock(&n->lock);
	const struct {
		const char *what;
		int count;
	} k[] = {
		{ "bad frames", n->bad_len },
		{ "torn frames", n->bad_content },
		{ "reordered frames", n->bad_order },
		{ "frames not 8-byte aligned", n->misaligned },
		{ "handler calls off the progress thread", n->wrong_thread },
		{ "acks failed to send", n->ack_errs },
	};
	for (size_t i = 0; i < ARRAY_SIZE(k); i++) {
		if (!k[i].count)
			continue;
		bad = 1;
		if (off < len)
			off += (size_t)snprintf(why + off, len - off, "%srank %u: %d %s",
						off ? "; " : "", n->rank, k[i].count, k[i].what);
	}
	if (bad && n->first_bad[0] && off < len)
		snprintf(why + off, len - off, "; the first: %s", n->first_bad);
	pthread_mutex_unlock(&n->lock);
	return bad ? -1 : 0;
}

int tn_sync(struct tnode *n, uint32_t live, uint32_t round, int ms)
{
	uint8_t mark[TN_HDR_LEN];
	struct iovec iov = { .iov_base = mark, .iov_len = sizeof(mark) };
	int ret;

	tn_frame_fill(mark, FERRY_MSG_BARRIER, sizeof(mark), n->rank, round);
	for (uint32_t r = 0; r < n->world; r++) {
		if (!(live & (1u << r)))
			continue;
		ret = n->ops->send(n->tp, r, &iov, 1);
		if (ret)
			return ret;
	}
	for (uint32_t r = 0; r < n->world; r++)
		if ((live & (1u << r)) && !WAIT_FOR(n, n->marks[r] >= round, ms))
			return -ETIMEDOUT;
	return 0;
}

void *tn_sender_main(void *arg)
{
	static const uint32_t sizes[] = { 16, 48, 304, 1024, 2056, 16, 64, 131072 };
	struct tn_sender *a = arg;

	if (a->go)
		pthread_barrier_wait(a->go);
	for (uint32_t i = 0; i < a->count; i++)
		for (uint32_t dst = 0; dst < a->n->world; dst++) {
			int ret = tn_send_frame(a->n, dst, a->sender, i,
						sizes[(i + a->sender + dst) % ARRAY_SIZE(sizes)]);

			if (ret && !a->errors++)
				a->first_err = ret;
		}
	return NULL;
}

void *tn_flood_main(void *arg)
{
	struct tn_flood *a = arg;

	for (uint32_t i = 0; i < a->count; i++)
		if (tn_send_frame(a->n, a->dst, a->sender, i, a->len))
			a->errors++;
	return NULL;
}

/* SPDX-License-Identifier: MIT */
/*
 * loop - a test transport: TCP for messages, and one-sided reads and writes
 * emulated inside one process, so the core's one-sided paths (slot hints,
 * torn-read detection, retries, fallbacks) run on every machine, not only on
 * RDMA hardware. Nodes must be threads of one process (ferry_local_cluster_open);
 * connect refuses otherwise. Selected with FERRY_TRANSPORT=loop.
 *
 * Like a NIC, a read copies the remote bytes in address order, 8 bytes at a
 * time, while the owner may be writing them; completion is reported inline,
 * on the thread that posted (the handler contract allows it for this
 * transport: the core's on_rdma_done handler works from any registered
 * thread).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport/transport.h"

struct loop_tp {
	struct ferry_tp base;
	struct ferry_tp *tcp; /* the message transport */
	pid_t pid;
};

struct loop_addr {
	uint32_t pid;
	uint32_t len;
	uint8_t tcp[FERRY_TP_ADDR_MAX - 8];
};

static inline struct loop_tp *to_loop(struct ferry_tp *tp)
{
	return (struct loop_tp *)tp;
}

static int loop_init(struct ferry_tp *tp, const struct ferry_tp_config *cfg)
{
	struct loop_tp *l = to_loop(tp);
	int rc;

	tp->cfg = *cfg;
	l->pid = getpid();
	l->tcp = calloc(1, ferry__tcp_ops.tp_size);
	if (!l->tcp)
		return -ENOMEM;
	l->tcp->ops = &ferry__tcp_ops;
	rc = ferry__tcp_ops.init(l->tcp, cfg);
	if (rc) {
		free(l->tcp);
		l->tcp = NULL;
	}
	return rc;
}

static int loop_addr_get(struct ferry_tp *tp, void *buf, size_t *len)
{
	struct loop_tp *l = to_loop(tp);
	struct loop_addr a = { .pid = (uint32_t)l->pid };
	size_t tl = sizeof(a.tcp);
	int rc;

	if (*len < sizeof(a))
		return -ENOSPC;
	rc = ferry__tcp_ops.addr_get(l->tcp, a.tcp, &tl);
	if (rc)
		return rc;
	a.len = (uint32_t)tl;
	memcpy(buf, &a, sizeof(a));
	*len = sizeof(a);
	return 0;
}

static int loop_connect(struct ferry_tp *tp, const void *const *addrs, const size_t *lens)
{
	struct loop_tp *l = to_loop(tp);
	uint32_t world = tp->cfg.world;
	const void **inner = calloc(world, sizeof(*inner));
	size_t *ilens = calloc(world, sizeof(*ilens));
	int rc = 0;

	if (!inner || !ilens) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t r = 0; r < world; r++) {
		const struct loop_addr *a = addrs[r];

		if (lens[r] != sizeof(*a) || a->len > sizeof(a->tcp)) {
			ferry_err("loop: rank %u's address is not a loop transport's", r);
			rc = -FERRY_E_PROTO;
			goto out;
		}
		if (a->pid != (uint32_t)l->pid) {
			ferry_err("loop: rank %u runs in another process; the loop transport "
				  "emulates one-sided access inside one process only; use tcp",
				  r);
			rc = -FERRY_E_NODEV;
			goto out;
		}
		inner[r] = a->tcp;
		ilens[r] = a->len;
	}
	l->tcp->cfg.cluster_id = tp->cfg.cluster_id;
	rc = ferry__tcp_ops.connect(l->tcp, inner, ilens);
out:
	free(inner);
	free(ilens);
	return rc;
}

static int loop_send(struct ferry_tp *tp, uint32_t dst, const struct iovec *iov, int iovcnt)
{
	return ferry__tcp_ops.send(to_loop(tp)->tcp, dst, iov, iovcnt);
}

static int loop_mem_reg(struct ferry_tp *tp, void *addr, size_t len, unsigned access,
			struct ferry_tp_mr *mr)
{
	mr->addr = addr;
	mr->len = len;
	mr->rkey = 0x100 | access; /* checked on access, like a real key */
	return 0;
}

static void loop_mem_dereg(struct ferry_tp *tp, struct ferry_tp_mr *mr)
{
	mr->addr = NULL;
}

/* copy in address order, 8 bytes at a time, as a NIC's DMA would */
static void loop_copy(void *dst, const void *src, size_t len)
{
	uint64_t *d = dst;
	const uint64_t *s = src;

	for (size_t i = 0; i < len / 8; i++)
		d[i] = __atomic_load_n(&s[i], __ATOMIC_ACQUIRE);
	memcpy((uint8_t *)dst + len / 8 * 8, (const uint8_t *)src + len / 8 * 8, len % 8);
}

static int loop_rw(struct ferry_tp *tp, uint32_t dst, void *local, uint64_t raddr, uint64_t rkey,
		   size_t len, void *ctx, int write)
{
	const struct ferry_tp_handler *h = tp->cfg.handler;
	unsigned need = write ? FERRY_TP_ACCESS_REMOTE_WRITE : FERRY_TP_ACCESS_REMOTE_READ;

	if (dst >= tp->cfg.world || !raddr)
		return -EINVAL;
	if ((rkey & 0x100) == 0 || !(rkey & need)) {
		h->on_rdma_done(tp->cfg.core, ctx, -EACCES);
		return 0;
	}
	if (write) {
		uint64_t *d = (uint64_t *)(uintptr_t)raddr;
		const uint64_t *s = local;

		for (size_t i = 0; i < len / 8; i++)
			__atomic_store_n(&d[i], s[i], __ATOMIC_RELEASE);
		memcpy((uint8_t *)d + len / 8 * 8, (const uint8_t *)s + len / 8 * 8, len % 8);
	} else {
		loop_copy(local, (const void *)(uintptr_t)raddr, len);
	}
	h->on_rdma_done(tp->cfg.core, ctx, 0);
	return 0;
}

static int loop_read(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		     uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	return loop_rw(tp, dst, local, raddr, rkey, len, ctx, 0);
}

static int loop_write(struct ferry_tp *tp, uint32_t dst, const void *local, struct ferry_tp_mr *lmr,
		      uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	return loop_rw(tp, dst, (void *)local, raddr, rkey, len, ctx, 1);
}

/* each read on its own, completed inline: what a doorbell batch must amount to */
static int loop_read_v(struct ferry_tp *tp, struct ferry_tp_rd *rds, size_t n)
{
	int ret = 0;

	for (size_t i = 0; i < n; i++) {
		rds[i].status = loop_rw(tp, rds[i].dst, rds[i].local, rds[i].raddr, rds[i].rkey,
					rds[i].len, rds[i].ctx, 0);
		if (rds[i].status && !ret)
			ret = rds[i].status;
	}
	return ret;
}

static void loop_fini(struct ferry_tp *tp)
{
	struct loop_tp *l = to_loop(tp);

	if (!l->tcp)
		return;
	ferry__tcp_ops.fini(l->tcp);
	free(l->tcp);
	l->tcp = NULL;
}

const struct ferry_tp_ops ferry__loop_ops = {
	.size = sizeof(struct ferry_tp_ops),
	.name = "loop",
	.caps = FERRY_TP_CAP_READ | FERRY_TP_CAP_WRITE,
	.tp_size = sizeof(struct loop_tp),
	.mr_size = sizeof(struct ferry_tp_mr),
	.init = loop_init,
	.addr_get = loop_addr_get,
	.connect = loop_connect,
	.send = loop_send,
	.mem_reg = loop_mem_reg,
	.mem_dereg = loop_mem_dereg,
	.read = loop_read,
	.read_v = loop_read_v,
	.write = loop_write,
	.fini = loop_fini,
};

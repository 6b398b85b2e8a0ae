/* SPDX-License-Identifier: MIT */
/*
 * loop - a test transport: TCP for messages, and one-sided reads and writes
 * emulated inside one process, so the core's one-sided paths (slot hints,
 * torn-read detection, retries, fallbacks) run on every machine, not only on
 * RDMA hardware. Nodes must be threads of one process (ferry_local_cluster_open);
 * connect refuses otherwise. Selected with FERRY_TRANSPORT=loop.
 *
 * By default a read copies the remote bytes in address order, 8 bytes at a
 * time, while the owner may be writing them (as a simple NIC would; a real
 * one need not: see FERRY_LOOP_ADVERSARIAL below); completion is reported
 * inline, on the thread that posted (the handler contract allows it for this
 * transport: the core's on_rdma_done handler works from any registered
 * thread).
 *
 * Like a NIC, too, an access is checked against the target's registrations
 * (the rule of rdma/rma.c's own-rank access): the rkey must name a registration
 * of the destination node (same cluster, rank @dst) that covers the whole
 * range and grants REMOTE_READ for a read, REMOTE_WRITE for a write;
 * otherwise the operation completes with -EACCES and touches nothing. Every
 * registration of every loop node of the process sits in one list
 * (loop_regs), so a node can check a peer's memory; the copy runs under the
 * list's read lock, so a registration cannot go away under it.
 *
 * WRITE with immediate (write_imm, FERRY_TP_CAP_WRITE_IMM; transport.h has
 * the contract): the bytes are copied at once, then a notice goes to @dst
 * through the tcp stream, behind every frame sent to it before, and the
 * receiver's loop hands its tag to on_write_imm() in that place, then sends
 * an acknowledgement back the same way; the writer's on_rdma_done(ctx)
 * runs when that comes (its progress thread), or with -FERRY_E_PEER when
 * the peer failed first, -FERRY_E_CLOSED at fini. Both are loop-only frames
 * on the tcp connection between threads of one process: frames of type
 * FERRY_MSG_LOOP_IMM (50, the loop's own), taken by the loop's own on_msg
 * and never shown to the core. Kept
 * per write_imm not acknowledged: one struct loop_imm (48 bytes).
 *
 * Fault injection, for tests of the fallbacks (read once, at init):
 *
 *   FERRY_LOOP_FAIL_WRITES=N   every N-th write() of this node (N >= 1)
 *                              writes only the first half of its bytes and
 *                              completes with -EIO, as a write cut off by a
 *                              failing link may leave part of its data;
 *                              the connection stays up (unlike rdma, where
 *                              a failed work request ends it)
 *                              (a write_imm() counts in the same N: its
 *                              first copy is cut off halfway, then it is
 *                              written whole again before its notice, as
 *                              the rdma transport posts a WRITE-with-
 *                              immediate again after a lost link)
 *   FERRY_LOOP_ADVERSARIAL=1   every read() copies the remote range's 64-byte
 *                              lines in a random order (the 8-byte words of
 *                              a line in order), pausing between lines (a
 *                              spin of 50-400 ns; in one read of 8, one
 *                              sched_yield), while
 *                              the owner's writers keep running: what an
 *                              RDMA READ split into packets and PCIe reads
 *                              that the hardware serves in any order may
 *                              return. A reader that trusts the order of a
 *                              READ accepts torn images under it.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transport/transport.h"

/* a write_imm() not acknowledged yet (struct loop_tp, imm_lock): one per
 * write_imm in flight, 32 bytes; the caller bounds how many it posts */
struct loop_imm {
	struct loop_imm *next;
	uint64_t id;
	void *ctx;
	uint32_t dst;
};

/* the body of a loop notice or acknowledgement (see the top) */
struct loop_imm_msg {
	uint32_t kind; /* LOOP_IMM_NOTICE or LOOP_IMM_ACK */
	uint32_t tag;
	uint64_t id; /* the writer's number of it */
};

#define LOOP_IMM_NOTICE 1u
#define LOOP_IMM_ACK 2u
#define LOOP_IMM_LEN (sizeof(struct ferry_msg_hdr) + sizeof(struct loop_imm_msg))

struct loop_tp {
	struct ferry_tp base;
	struct ferry_tp *tcp; /* the message transport */
	/* the tcp transport's handler: ours, which takes the loop frames */
	struct ferry_tp_handler inner;
	pthread_mutex_t imm_lock; /* guards imm_head, imm_next */
	struct loop_imm *imm_head;
	uint64_t imm_next;
	pid_t pid;
	uint64_t fail_writes; /* FERRY_LOOP_FAIL_WRITES, 0: off */
	uint64_t nwrites;     /* write() calls (atomic) */
	int adversarial;      /* FERRY_LOOP_ADVERSARIAL */
	unsigned late_ms;     /* FERRY_LOOP_LATE_READS_MS: reads complete late, 0: inline */
	int late_pending;     /* late reads not completed yet (atomic): fini waits */
};

struct loop_mr {
	struct ferry_tp_mr base;
	struct loop_mr *next;	   /* loop_regs */
	const struct ferry_tp *tp; /* the node that registered it */
	uint64_t cluster_id;
	uint32_t rank;
	unsigned access;
};

/* every loop registration in the process: the memory a NIC would know */
static pthread_rwlock_t loop_regs_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct loop_mr *loop_regs;
static uint64_t loop_next_rkey = 0x1000; /* under the write lock */

struct loop_addr {
	uint32_t pid;
	uint32_t len;
	uint8_t tcp[FERRY_TP_ADDR_MAX - 8];
};

static inline struct loop_tp *to_loop(struct ferry_tp *tp)
{
	return (struct loop_tp *)tp;
}

/* complete (and forget) the write_imms to @dst (UINT32_MAX: all) with
 * @status; the progress thread, or fini after it stopped */
static void loop_imm_fail(struct loop_tp *l, uint32_t dst, int status)
{
	struct loop_imm *done = NULL, **pp;

	pthread_mutex_lock(&l->imm_lock);
	for (pp = &l->imm_head; *pp;) {
		struct loop_imm *e = *pp;

		if (dst == UINT32_MAX || e->dst == dst) {
			*pp = e->next;
			e->next = done;
			done = e;
		} else {
			pp = &e->next;
		}
	}
	pthread_mutex_unlock(&l->imm_lock);
	while (done) {
		struct loop_imm *e = done;

		done = e->next;
		l->base.cfg.handler->on_rdma_done(l->base.cfg.core, e->ctx, status);
		free(e);
	}
}

static int loop_imm_send(struct loop_tp *l, uint32_t dst, uint32_t kind, uint32_t tag, uint64_t id)
{
	struct {
		struct ferry_msg_hdr h;
		struct loop_imm_msg m;
	} f = { .m = { .kind = kind, .tag = tag, .id = id } };
	struct iovec iov = { .iov_base = &f, .iov_len = sizeof(f) };

	ferry__proto_hdr_init(&f.h, FERRY_MSG_LOOP_IMM, sizeof(f), l->base.cfg.rank, 0);
	return ferry__tcp_ops.send(l->tcp, dst, &iov, 1);
}

/* a loop notice or acknowledgement from @src; progress thread */
static void loop_imm_input(struct loop_tp *l, uint32_t src, const struct loop_imm_msg *m)
{
	const struct ferry_tp_handler *h = l->base.cfg.handler;
	struct loop_imm *e = NULL, **pp;

	if (m->kind == LOOP_IMM_NOTICE && m->tag <= FERRY_TP_IMM_TAG_MASK) {
		h->on_write_imm(l->base.cfg.core, src, m->tag);
		if (loop_imm_send(l, src, LOOP_IMM_ACK, 0, m->id))
			ferry_dbg("loop: rank %u could not acknowledge a WRITE with immediate to "
				  "rank %u; its writer completes it when it fails",
				  l->base.cfg.rank, src);
		return;
	}
	if (m->kind == LOOP_IMM_ACK) {
		pthread_mutex_lock(&l->imm_lock);
		for (pp = &l->imm_head; *pp; pp = &(*pp)->next)
			if ((*pp)->id == m->id && (*pp)->dst == src) {
				e = *pp;
				*pp = e->next;
				break;
			}
		pthread_mutex_unlock(&l->imm_lock);
		if (e) {
			h->on_rdma_done(l->base.cfg.core, e->ctx, 0);
			free(e);
			return;
		}
	}
	ferry_warn("loop: rank %u sent rank %u a WRITE-with-immediate %s it never posted; "
		   "dropping it",
		   src, l->base.cfg.rank, m->kind == LOOP_IMM_ACK ? "acknowledgement" : "notice");
	ferry__tcp_ops.drop(l->tcp, src);
	loop_imm_fail(l, src, -FERRY_E_PEER);
	h->on_peer_failed(l->base.cfg.core, src, -FERRY_E_PROTO);
}

static void loop_h_msg(void *core, uint32_t src, const void *buf, size_t len)
{
	struct loop_tp *l = core;
	const struct ferry_msg_hdr *hdr = buf;

	if (hdr->type == FERRY_MSG_LOOP_IMM) {
		if (len == LOOP_IMM_LEN && !hdr->table)
			loop_imm_input(l, src, (const void *)(hdr + 1));
		else
			ferry_err("loop: rank %u sent a write_imm notice of %zu bytes for table "
				  "%u (want %zu, 0); ignored: a bug in the loop transport",
				  src, len, hdr->table, LOOP_IMM_LEN);
		return;
	}
	l->base.cfg.handler->on_msg(l->base.cfg.core, src, buf, len);
}

static void loop_h_peer_failed(void *core, uint32_t src, int err)
{
	struct loop_tp *l = core;

	loop_imm_fail(l, src, -FERRY_E_PEER);
	l->base.cfg.handler->on_peer_failed(l->base.cfg.core, src, err);
}

static void loop_h_rdma_done(void *core, void *ctx, int status)
{
	struct loop_tp *l = core;

	l->base.cfg.handler->on_rdma_done(l->base.cfg.core, ctx, status);
}

static void loop_h_thread_start(void *core)
{
	struct loop_tp *l = core;

	if (l->base.cfg.handler->on_thread_start)
		l->base.cfg.handler->on_thread_start(l->base.cfg.core);
}

static void loop_h_thread_stop(void *core)
{
	struct loop_tp *l = core;

	if (l->base.cfg.handler->on_thread_stop)
		l->base.cfg.handler->on_thread_stop(l->base.cfg.core);
}

static int loop_init(struct ferry_tp *tp, const struct ferry_tp_config *cfg)
{
	struct ferry_tp_config icfg;
	struct loop_tp *l = to_loop(tp);
	int rc;

	tp->cfg = *cfg;
	l->pid = getpid();
	{
		const char *f = getenv("FERRY_LOOP_FAIL_WRITES");
		char *end = NULL;
		unsigned long long n = f ? strtoull(f, &end, 10) : 0;

		if (f && (!*f || *end || !n)) {
			ferry_err("loop: FERRY_LOOP_FAIL_WRITES=%s is not a number >= 1; set it to "
				  "N to fail every N-th write, or unset it",
				  f);
			return -EINVAL;
		}
		l->fail_writes = n;
		if (n)
			ferry_warn("loop: rank %u fails every %llu-th one-sided write "
				   "(FERRY_LOOP_FAIL_WRITES)",
				   cfg->rank, n);
	}
	{
		const char *f = getenv("FERRY_LOOP_ADVERSARIAL");

		if (f && strcmp(f, "0") && strcmp(f, "1")) {
			ferry_err("loop: FERRY_LOOP_ADVERSARIAL=%s is neither 0 nor 1; set it to 1 "
				  "to serve reads in a random line order, or unset it",
				  f);
			return -EINVAL;
		}
		l->adversarial = f && !strcmp(f, "1");
		if (l->adversarial)
			ferry_warn("loop: rank %u serves one-sided reads line by line in a random "
				   "order (FERRY_LOOP_ADVERSARIAL)",
				   cfg->rank);
	}
	{
		const char *f = getenv("FERRY_LOOP_LATE_READS_MS");
		char *end = NULL;
		unsigned long n = f ? strtoul(f, &end, 10) : 0;

		if (f && (!*f || *end || n > 60000)) {
			ferry_err(
				"loop: FERRY_LOOP_LATE_READS_MS=%s is not 0 .. 60000; set the ms a "
				"one-sided read takes to complete, or unset it",
				f);
			return -EINVAL;
		}
		l->late_ms = (unsigned)n;
		if (n)
			ferry_warn("loop: rank %u completes one-sided reads %lu ms late "
				   "(FERRY_LOOP_LATE_READS_MS)",
				   cfg->rank, n);
	}
	l->tcp = calloc(1, ferry__tcp_ops.tp_size);
	if (!l->tcp)
		return -ENOMEM;
	l->tcp->ops = &ferry__tcp_ops;
	pthread_mutex_init(&l->imm_lock, NULL);
	l->inner = (struct ferry_tp_handler){
		.on_msg = loop_h_msg,
		.on_peer_failed = loop_h_peer_failed,
		.on_rdma_done = loop_h_rdma_done,
		.on_thread_start = loop_h_thread_start,
		.on_thread_stop = loop_h_thread_stop,
	};
	icfg = *cfg;
	icfg.handler = &l->inner;
	icfg.core = l;
	rc = ferry__tcp_ops.init(l->tcp, &icfg);
	if (rc) {
		pthread_mutex_destroy(&l->imm_lock);
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

static void loop_drop(struct ferry_tp *tp, uint32_t dst)
{
	ferry__tcp_ops.drop(to_loop(tp)->tcp, dst);
	loop_imm_fail(to_loop(tp), dst, -FERRY_E_PEER);
}

static size_t loop_mem_held(struct ferry_tp *tp)
{
	return ferry__tcp_ops.mem_held(to_loop(tp)->tcp);
}

static inline struct loop_mr *to_loop_mr(struct ferry_tp_mr *mr)
{
	return (struct loop_mr *)mr;
}

/* Context: any thread, after connect (the cluster id is known) */
static int loop_mem_reg(struct ferry_tp *tp, void *addr, size_t len, unsigned access,
			struct ferry_tp_mr *mr)
{
	struct loop_mr *m = to_loop_mr(mr);

	if (!addr || !len)
		return -EINVAL;
	m->tp = tp;
	m->cluster_id = tp->cfg.cluster_id;
	m->rank = tp->cfg.rank;
	m->access = access;
	mr->addr = addr;
	mr->len = len;
	pthread_rwlock_wrlock(&loop_regs_lock);
	mr->rkey = loop_next_rkey++;
	m->next = loop_regs;
	loop_regs = m;
	pthread_rwlock_unlock(&loop_regs_lock);
	return 0;
}

/* Context: any thread; no read()/write() on @mr may be in flight */
static void loop_mem_dereg(struct ferry_tp *tp, struct ferry_tp_mr *mr)
{
	struct loop_mr *m = to_loop_mr(mr), **pp;

	if (!mr->addr)
		return;
	pthread_rwlock_wrlock(&loop_regs_lock);
	for (pp = &loop_regs; *pp; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	pthread_rwlock_unlock(&loop_regs_lock);
	mr->addr = NULL;
}

/* is [raddr, raddr + len) of rank @dst open to @need under @rkey? read lock held */
static int loop_access_ok(const struct ferry_tp *tp, uint32_t dst, uint64_t raddr, uint64_t rkey,
			  size_t len, unsigned need)
{
	for (const struct loop_mr *m = loop_regs; m; m = m->next) {
		uintptr_t a = (uintptr_t)m->base.addr;

		if (m->base.rkey != rkey)
			continue;
		return m->cluster_id == tp->cfg.cluster_id && m->rank == dst && raddr >= a &&
		       raddr - a <= m->base.len && len <= m->base.len - (raddr - a) &&
		       (m->access & need) == need;
	}
	return 0;
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

/* a per-thread xorshift64*: the order and the pauses of adversarial reads */
static uint64_t loop_rand(void)
{
	static __thread uint64_t x;

	if (!x) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		x = ((uint64_t)ts.tv_nsec << 20 ^ (uint64_t)(uintptr_t)&ts) | 1;
	}
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	return x * 0x2545f4914f6cdd1dull;
}

/* a spin of 50-400 ns between two lines, or (@yield) a sched_yield */
static void loop_pause(int yield)
{
	struct timespec t0, t;
	long ns;

	if (yield) {
		sched_yield(); /* on a busy machine, let a writer run here */
		return;
	}
	ns = 50 + (long)(loop_rand() % 350);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do
		clock_gettime(CLOCK_MONOTONIC, &t);
	while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < ns);
}

#define LOOP_LINE 64
#define LOOP_LINES_ON_STACK 256

/*
 * FERRY_LOOP_ADVERSARIAL: the 64-byte lines of [src, src + len) (cut at the
 * remote address's line boundaries) in a random order, a pause between two:
 * a spin, and in one read of 8 a sched_yield at one random gap (rarely: on a
 * loaded machine a yield may cost a whole time slice).
 */
static void loop_copy_shuffled(void *dst, const void *src, size_t len)
{
	uintptr_t s0 = (uintptr_t)src, first = s0 / LOOP_LINE;
	size_t n = (s0 + len - 1) / LOOP_LINE - first + 1;
	uint32_t on_stack[LOOP_LINES_ON_STACK], *order = on_stack;
	size_t yield_at;

	if (n > LOOP_LINES_ON_STACK && !(order = malloc(n * sizeof(*order)))) {
		loop_copy(dst, src, len); /* no memory for the shuffle: in order */
		return;
	}
	for (size_t i = 0; i < n; i++)
		order[i] = (uint32_t)i;
	for (size_t i = n - 1; i > 0; i--) { /* Fisher-Yates */
		size_t j = loop_rand() % (i + 1);
		uint32_t x = order[i];

		order[i] = order[j];
		order[j] = x;
	}
	/* one read in 8 yields once, at a random gap */
	yield_at = n > 1 && loop_rand() % 8 == 0 ? 1 + loop_rand() % (n - 1) : 0;
	for (size_t i = 0; i < n; i++) {
		uintptr_t lo = (first + order[i]) * LOOP_LINE, hi = lo + LOOP_LINE;

		if (lo < s0)
			lo = s0;
		if (hi > s0 + len)
			hi = s0 + len;
		if (i)
			loop_pause(i == yield_at);
		loop_copy((uint8_t *)dst + (lo - s0), (const void *)lo, hi - lo);
	}
	if (order != on_stack)
		free(order);
}

static int loop_rw_now(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		       uint64_t raddr, uint64_t rkey, size_t len, void *ctx, int write);

/*
 * FERRY_LOOP_LATE_READS_MS (tests): a read's copy and completion happen on a
 * thread of their own, that many ms later, as a NIC's may come after its
 * poster gave up waiting. The thread registers with the core like the
 * progress thread does; fini waits for every late read.
 */
struct loop_late {
	struct ferry_tp *tp;
	uint32_t dst;
	void *local;
	struct ferry_tp_mr *lmr;
	uint64_t raddr, rkey;
	size_t len;
	void *ctx;
};

static void *loop_late_thread(void *arg)
{
	struct loop_late *r = arg;
	struct ferry_tp *tp = r->tp;
	const struct ferry_tp_handler *h = tp->cfg.handler;
	struct loop_tp *l = to_loop(tp);

	usleep(l->late_ms * 1000u);
	if (h->on_thread_start)
		h->on_thread_start(tp->cfg.core);
	loop_rw_now(tp, r->dst, r->local, r->lmr, r->raddr, r->rkey, r->len, r->ctx, 0);
	if (h->on_thread_stop)
		h->on_thread_stop(tp->cfg.core);
	free(r);
	__atomic_sub_fetch(&l->late_pending, 1, __ATOMIC_RELEASE);
	return NULL;
}

static int loop_rw(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		   uint64_t raddr, uint64_t rkey, size_t len, void *ctx, int write)
{
	struct loop_tp *l = to_loop(tp);

	if (!write && l->late_ms) {
		struct loop_late *r = malloc(sizeof(*r));
		pthread_attr_t a;
		pthread_t th;

		if (r) {
			*r = (struct loop_late){ tp, dst, local, lmr, raddr, rkey, len, ctx };
			__atomic_add_fetch(&l->late_pending, 1, __ATOMIC_ACQ_REL);
			pthread_attr_init(&a);
			pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
			if (!pthread_create(&th, &a, loop_late_thread, r)) {
				pthread_attr_destroy(&a);
				return 0;
			}
			pthread_attr_destroy(&a);
			__atomic_sub_fetch(&l->late_pending, 1, __ATOMIC_RELEASE);
			free(r);
		}
	}
	return loop_rw_now(tp, dst, local, lmr, raddr, rkey, len, ctx, write);
}

static int loop_rw_now(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		       uint64_t raddr, uint64_t rkey, size_t len, void *ctx, int write)
{
	const struct ferry_tp_handler *h = tp->cfg.handler;
	unsigned need = write ? FERRY_TP_ACCESS_REMOTE_WRITE : FERRY_TP_ACCESS_REMOTE_READ;
	struct loop_tp *l = to_loop(tp);
	int status = 0;

	/* the local side must lie in a registration, as rdma_rw checks */
	if (dst >= tp->cfg.world || !raddr || !local || !len || !lmr || !lmr->addr ||
	    (uintptr_t)local < (uintptr_t)lmr->addr ||
	    (uintptr_t)local - (uintptr_t)lmr->addr > lmr->len ||
	    len > lmr->len - ((uintptr_t)local - (uintptr_t)lmr->addr))
		return -EINVAL;
	pthread_rwlock_rdlock(&loop_regs_lock);
	if (!loop_access_ok(tp, dst, raddr, rkey, len, need)) {
		status = -EACCES;
	} else if (write) {
		/* aligned 8-byte words as a NIC writes them (a one-sided reader
		 * may race them); the ends and an unaligned source by the byte:
		 * a collective's segment starts at any element */
		uint8_t *d = (uint8_t *)(uintptr_t)raddr;
		const uint8_t *s = local;
		uint64_t nth = __atomic_add_fetch(&l->nwrites, 1, __ATOMIC_RELAXED);
		size_t i, head = (size_t)(-(uintptr_t)d & 7);

		if (l->fail_writes && nth % l->fail_writes == 0) {
			len /= 2; /* cut off halfway */
			status = -EIO;
		}
		if (head > len)
			head = len;
		memcpy(d, s, head);
		for (i = head; i + 8 <= len; i += 8) {
			uint64_t w;

			memcpy(&w, s + i, 8);
			__atomic_store_n((uint64_t *)(void *)(d + i), w, __ATOMIC_RELEASE);
		}
		memcpy(d + i, s + i, len - i);
	} else if (l->adversarial) {
		loop_copy_shuffled(local, (const void *)(uintptr_t)raddr, len);
	} else {
		loop_copy(local, (const void *)(uintptr_t)raddr, len);
	}
	pthread_rwlock_unlock(&loop_regs_lock);
	h->on_rdma_done(tp->cfg.core, ctx, status);
	return 0;
}

static int loop_read(struct ferry_tp *tp, uint32_t dst, void *local, struct ferry_tp_mr *lmr,
		     uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	return loop_rw(tp, dst, local, lmr, raddr, rkey, len, ctx, 0);
}

static int loop_write(struct ferry_tp *tp, uint32_t dst, const void *local, struct ferry_tp_mr *lmr,
		      uint64_t raddr, uint64_t rkey, size_t len, void *ctx)
{
	return loop_rw(tp, dst, (void *)local, lmr, raddr, rkey, len, ctx, 1);
}

/*
 * loop_write_imm - copy now, then a notice behind the frames sent to @dst
 * before; completes when @dst acknowledges (see the top). Any thread.
 */
static int loop_write_imm(struct ferry_tp *tp, uint32_t dst, const void *local,
			  struct ferry_tp_mr *lmr, uint64_t raddr, uint64_t rkey, size_t len,
			  uint32_t tag, void *ctx)
{
	struct loop_tp *l = to_loop(tp);
	uint8_t *d = (uint8_t *)(uintptr_t)raddr;
	struct loop_imm *e, **pp;
	uint64_t nth, id;
	int rc;

	if (dst >= tp->cfg.world || dst == tp->cfg.rank || tag > FERRY_TP_IMM_TAG_MASK || !raddr ||
	    !local || !len || !lmr || !lmr->addr || (uintptr_t)local < (uintptr_t)lmr->addr ||
	    (uintptr_t)local - (uintptr_t)lmr->addr > lmr->len ||
	    len > lmr->len - ((uintptr_t)local - (uintptr_t)lmr->addr))
		return -EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	pthread_rwlock_rdlock(&loop_regs_lock);
	if (!loop_access_ok(tp, dst, raddr, rkey, len, FERRY_TP_ACCESS_REMOTE_WRITE)) {
		pthread_rwlock_unlock(&loop_regs_lock);
		free(e);
		ferry_err("loop: rank %u: a WRITE with immediate to rank %u names memory it did "
			  "not register for remote writes (rkey %#llx); nothing was written",
			  tp->cfg.rank, dst, (unsigned long long)rkey);
		return -EACCES;
	}
	nth = __atomic_add_fetch(&l->nwrites, 1, __ATOMIC_RELAXED);
	if (l->fail_writes && nth % l->fail_writes == 0)
		memcpy(d, local, len / 2); /* a first attempt cut off by a lost link */
	memcpy(d, local, len);
	pthread_rwlock_unlock(&loop_regs_lock);
	e->ctx = ctx;
	e->dst = dst;
	pthread_mutex_lock(&l->imm_lock);
	e->id = ++l->imm_next;
	e->next = l->imm_head;
	l->imm_head = e;
	id = e->id;
	pthread_mutex_unlock(&l->imm_lock);
	/* no lock held: a send may wait for room, which the progress thread
	 * makes, and it takes imm_lock for the acknowledgements */
	rc = loop_imm_send(l, dst, LOOP_IMM_NOTICE, tag, id);
	if (rc) {
		pthread_mutex_lock(&l->imm_lock);
		for (pp = &l->imm_head; *pp && (*pp)->id != id; pp = &(*pp)->next)
			;
		e = *pp;
		if (e)
			*pp = e->next;
		pthread_mutex_unlock(&l->imm_lock);
		if (!e)
			rc = 0; /* its peer failed meanwhile and completed it: posted */
		free(e);
	}
	return rc;
}

/* each read on its own, completed inline: what a doorbell batch must amount to */
static int loop_read_v(struct ferry_tp *tp, struct ferry_tp_rd *rds, size_t n)
{
	int ret = 0;

	for (size_t i = 0; i < n; i++) {
		rds[i].status = loop_rw(tp, rds[i].dst, rds[i].local, rds[i].lmr, rds[i].raddr,
					rds[i].rkey, rds[i].len, rds[i].ctx, 0);
		if (rds[i].status && !ret)
			ret = rds[i].status;
	}
	return ret;
}

static void loop_fini(struct ferry_tp *tp)
{
	struct loop_tp *l = to_loop(tp);

	/* no handler runs after fini: late reads complete first */
	while (__atomic_load_n(&l->late_pending, __ATOMIC_ACQUIRE))
		usleep(1000);
	struct loop_mr **pp;

	/* registrations left behind (a table destroyed after its node closed)
	 * leave the list now: their memory is freed without a dereg */
	pthread_rwlock_wrlock(&loop_regs_lock);
	for (pp = &loop_regs; *pp;) {
		if ((*pp)->tp == tp)
			*pp = (*pp)->next;
		else
			pp = &(*pp)->next;
	}
	pthread_rwlock_unlock(&loop_regs_lock);
	if (!l->tcp)
		return;
	ferry__tcp_ops.fini(l->tcp);
	free(l->tcp);
	l->tcp = NULL;
	/* the progress thread stopped: what no peer acknowledged ends here */
	loop_imm_fail(l, UINT32_MAX, -FERRY_E_CLOSED);
	pthread_mutex_destroy(&l->imm_lock);
}

const struct ferry_tp_ops ferry__loop_ops = {
	.size = sizeof(struct ferry_tp_ops),
	.name = "loop",
	.caps = FERRY_TP_CAP_READ | FERRY_TP_CAP_WRITE | FERRY_TP_CAP_WRITE_IMM,
	.tp_size = sizeof(struct loop_tp),
	.mr_size = sizeof(struct loop_mr),
	.init = loop_init,
	.addr_get = loop_addr_get,
	.connect = loop_connect,
	.send = loop_send,
	.drop = loop_drop,
	.mem_reg = loop_mem_reg,
	.mem_dereg = loop_mem_dereg,
	.read = loop_read,
	.read_v = loop_read_v,
	.write = loop_write,
	.fini = loop_fini,
	.mem_held = loop_mem_held,
	.write_imm = loop_write_imm,
};

/* SPDX-License-Identifier: MIT */
/*
 * test_transport.c - the transport conformance suite: one set of tests run
 * against every transport in tp_table (transport/transport.h's contract).
 *
 * Each test brings up 2..4 transport instances inside the test process, one
 * per rank, each with a struct tnode as its core: the handlers record what
 * they see (frames checked for length, content and order; failures; the
 * progress thread's identity) under the node's mutex, and the test thread
 * waits on the node's condvar with a deadline. Handlers never assert: they
 * count, and the test thread asserts on the counts.
 *
 * The loop transport (tcp messages, in-process one-sided access) runs the
 * same message cases as tcp; the raw-socket cases are tcp's alone.
 *
 * Test frames: a struct ferry_msg_hdr whose table field carries
 * (sender thread << 24 | sequence number), then a byte pattern derived from
 * (src, table, offset), so that a lost, reordered, shifted or torn frame is
 * seen. Type FERRY_MSG_OP marks data frames, FERRY_MSG_REPLY the acks that a
 * node with echo set sends back from its progress thread.
 *
 * The raw-socket cases (strangers, a misbehaving peer) are specific to the
 * tcp transport and skip the others.
 *
 * Criterion forks per test: sockets and threads are created in the test
 * bodies, never in the parameter generators. Every wait is bounded.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "ferry/ferry.h"
#include "transport/transport.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_NODES 4
#define MAX_SENDERS 8
#define TIMEOUT_MS 5000 /* transport connect timeout */
#define WAIT_MS 30000	/* bound on any wait for frames (sanitizers are slow) */
#define HDR_LEN sizeof(struct ferry_msg_hdr)
#define HELLO_LEN (sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_hello))

static const struct ferry_tp_ops *const tp_table[] = {
	&ferry__tcp_ops,
	&ferry__loop_ops,
#ifdef FERRY_HAVE_RDMA
	&ferry__rdma_ops,
#endif
};

static int tp_index[ARRAY_SIZE(tp_table)];

/* one test per behaviour, parameterized over tp_table */
#define TP_TEST(name, ...)                                                                \
	ParameterizedTestParameters(transport, name)                                      \
	{                                                                                 \
		for (size_t i = 0; i < ARRAY_SIZE(tp_index); i++)                         \
			tp_index[i] = (int)i;                                             \
		return cr_make_param_array(int, tp_index, ARRAY_SIZE(tp_index));          \
	}                                                                                 \
	ParameterizedTest(int *tpi, transport, name, .init = log_capture, .timeout = 120, \
			  ##__VA_ARGS__)

/* ---- log capture -------------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_lines[512][256];
static int log_n;

static void log_cb(enum ferry_log_level level, const char *msg, void *arg)
{
	static const char *const tags[] = { "", "error", "warn", "info", "debug" };

	(void)arg;
	fprintf(stderr, "ferry %s: %s\n", tags[level], msg);
	pthread_mutex_lock(&log_lock);
	if (log_n < (int)ARRAY_SIZE(log_lines))
		snprintf(log_lines[log_n++], sizeof(log_lines[0]), "%s", msg);
	pthread_mutex_unlock(&log_lock);
}

static void log_capture(void)
{
	ferry_log_set(FERRY_LOG_INFO, log_cb, NULL);
}

/* lines that contain both @a and @b (@b may be NULL) */
static int log_count(const char *a, const char *b)
{
	int n = 0;

	pthread_mutex_lock(&log_lock);
	for (int i = 0; i < log_n; i++)
		if (strstr(log_lines[i], a) && (!b || strstr(log_lines[i], b)))
			n++;
	pthread_mutex_unlock(&log_lock);
	return n;
}

/* ---- time --------------------------------------------------------------- */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timespec deadline_in(int ms)
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

/* ---- test nodes --------------------------------------------------------- */

struct tnode {
	const struct ferry_tp_ops *ops;
	struct ferry_tp *tp;
	uint32_t rank, world;
	char addr[FERRY_TP_ADDR_MAX];
	size_t addr_len;

	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t cond;  /* broadcast on every change */
	int starts, stops;
	pthread_t progress;
	int wrong_thread; /* handler calls off the progress thread */
	int after_fini;	  /* handler calls after fini() returned */
	int fini_done;

	uint64_t frames[MAX_NODES]; /* data frames from each src */
	uint64_t bytes[MAX_NODES];
	uint64_t acks[MAX_NODES];
	uint32_t next_seq[MAX_NODES][MAX_SENDERS];
	int bad_len, bad_content, bad_order, misaligned, ack_errs;
	char first_bad[160];

	int failed[MAX_NODES]; /* on_peer_failed() calls per rank */
	int failed_err[MAX_NODES];

	int echo;	 /* ack every data frame back to its src */
	int gate_closed; /* on_msg waits while set (bounded) */
	int gated;	 /* on_msg is waiting at the gate */
};

static uint8_t pattern(uint32_t src, uint32_t table, size_t i)
{
	return (uint8_t)((i * 31u) ^ (i >> 7) ^ (table * 131u) ^ (src * 17u) ^ 0x5a);
}

static void frame_fill(uint8_t *buf, uint8_t type, uint32_t len, uint32_t src, uint32_t table)
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
	for (size_t i = HDR_LEN; i < len; i++)
		buf[i] = pattern(src, table, i);
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
	if (!n->starts || !pthread_equal(pthread_self(), n->progress))
		n->wrong_thread++;
	if (n->fini_done)
		n->after_fini++;
}

static void t_on_msg(void *core, uint32_t src, const void *buf, size_t len)
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
	if (src >= n->world || len < HDR_LEN || hdr->len != len || hdr->src != src) {
		note_bad(n, &n->bad_len, "length or src differs from the header", src, len);
		goto out;
	}
	if (hdr->type == FERRY_MSG_REPLY) {
		n->acks[src]++;
		goto out;
	}
	sender = hdr->table >> 24;
	seq = hdr->table & 0xffffff;
	if (sender >= MAX_SENDERS || seq != n->next_seq[src][sender])
		note_bad(n, &n->bad_order, "out of order", src, len);
	else
		n->next_seq[src][sender] = seq + 1;
	for (size_t i = HDR_LEN; i < len && content_ok; i++)
		content_ok = p[i] == pattern(src, hdr->table, i);
	if (!content_ok)
		note_bad(n, &n->bad_content, "content differs", src, len);
	n->frames[src]++;
	n->bytes[src] += len;
	ack = n->echo;
	if (n->gate_closed) {
		struct timespec dl = deadline_in(20000);

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
		uint8_t reply[HDR_LEN];
		struct iovec iov = { .iov_base = reply, .iov_len = sizeof(reply) };

		frame_fill(reply, FERRY_MSG_REPLY, sizeof(reply), n->rank, hdr->table);
		if (n->ops->send(n->tp, src, &iov, 1)) {
			pthread_mutex_lock(&n->lock);
			n->ack_errs++;
			pthread_mutex_unlock(&n->lock);
		}
	}
}

static void t_on_peer_failed(void *core, uint32_t src, int err)
{
	struct tnode *n = core;

	pthread_mutex_lock(&n->lock);
	handler_enter(n);
	if (src < MAX_NODES) {
		n->failed[src]++;
		n->failed_err[src] = err;
	}
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
}

static void t_on_rdma_done(void *core, void *ctx, int status)
{
	struct tnode *n = core;

	pthread_mutex_lock(&n->lock);
	handler_enter(n);
	pthread_mutex_unlock(&n->lock);
}

static void t_on_thread_start(void *core)
{
	struct tnode *n = core;

	pthread_mutex_lock(&n->lock);
	n->starts++;
	n->progress = pthread_self();
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
}

static void t_on_thread_stop(void *core)
{
	struct tnode *n = core;

	pthread_mutex_lock(&n->lock);
	handler_enter(n);
	n->stops++;
	pthread_cond_broadcast(&n->cond);
	pthread_mutex_unlock(&n->lock);
}

static const struct ferry_tp_handler t_handler = {
	.on_msg = t_on_msg,
	.on_peer_failed = t_on_peer_failed,
	.on_rdma_done = t_on_rdma_done,
	.on_thread_start = t_on_thread_start,
	.on_thread_stop = t_on_thread_stop,
};

/* evaluate @pred under @nd's lock until it holds or @ms pass; the result */
#define WAIT_FOR(nd, pred, ms)                                                              \
	({                                                                                  \
		struct timespec dl_ = deadline_in(ms);                                      \
		bool ok_;                                                                   \
		pthread_mutex_lock(&(nd)->lock);                                            \
		while (!(ok_ = (pred)) &&                                                   \
		       pthread_cond_timedwait(&(nd)->cond, &(nd)->lock, &dl_) != ETIMEDOUT) \
			;                                                                   \
		ok_ = (pred);                                                               \
		pthread_mutex_unlock(&(nd)->lock);                                          \
		ok_;                                                                        \
	})

/* read a field of @n under its lock */
#define LOCKED(n, expr)                           \
	({                                        \
		pthread_mutex_lock(&(n)->lock);   \
		__typeof__(expr) v_ = (expr);     \
		pthread_mutex_unlock(&(n)->lock); \
		v_;                               \
	})

static uint64_t cluster_id_for_test(void)
{
	return 0xfe77000000000000ull | ((uint64_t)getpid() << 8);
}

/* the transport at index @i, or the test is skipped */
static const struct ferry_tp_ops *tp_get(int i)
{
	const struct ferry_tp_ops *ops = tp_table[i];
	const char *why = NULL;

	if (ops->probe && ops->probe(&why))
		cr_skip_test("the %s transport cannot run here: %s", ops->name,
			     why ? why : "its probe failed");
	return ops;
}

static void tp_require_tcp(const struct ferry_tp_ops *ops)
{
	if (strcmp(ops->name, "tcp"))
		cr_skip_test("raw-socket injection applies to the tcp transport, not %s",
			     ops->name);
}

/* init one node; Return: what ops->init returned */
static int tnode_init(struct tnode *n, const struct ferry_tp_ops *ops, uint32_t rank,
		      uint32_t world, uint64_t cluster_id, int timeout_ms, int busy_poll)
{
	struct ferry_tp_config cfg = {
		.rank = rank,
		.world = world,
		.cluster_id = cluster_id,
		.bind_addr = "127.0.0.1",
		.busy_poll = busy_poll,
		.timeout_ms = timeout_ms,
		.handler = &t_handler,
		.core = n,
	};
	pthread_condattr_t ca;
	int ret;

	memset(n, 0, sizeof(*n));
	n->ops = ops;
	n->rank = rank;
	n->world = world;
	pthread_mutex_init(&n->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&n->cond, &ca);
	pthread_condattr_destroy(&ca);

	n->tp = calloc(1, ops->tp_size);
	cr_assert_not_null(n->tp);
	n->tp->ops = ops;
	ret = ops->init(n->tp, &cfg);
	if (ret) {
		free(n->tp);
		n->tp = NULL;
		return ret;
	}
	n->addr_len = sizeof(n->addr);
	cr_assert_eq(ops->addr_get(n->tp, n->addr, &n->addr_len), 0, "addr_get failed");
	cr_assert(n->addr_len > 0 && n->addr_len <= FERRY_TP_ADDR_MAX);
	return 0;
}

static void tnode_fini(struct tnode *n)
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

struct connect_arg {
	struct tnode *n;
	const void *addrs[MAX_NODES];
	size_t lens[MAX_NODES];
	int ret;
	int64_t ms; /* how long connect() took */
	pthread_t thread;
};

static void *connect_main(void *arg)
{
	struct connect_arg *a = arg;
	int64_t t0 = now_ms();

	a->ret = a->n->ops->connect(a->n->tp, a->addrs, a->lens);
	a->ms = now_ms() - t0;
	return NULL;
}

/* start connect() of @n on its own thread, with the blobs of @all (world entries) */
static void connect_start(struct connect_arg *a, struct tnode *n, struct tnode *all)
{
	memset(a, 0, sizeof(*a));
	a->n = n;
	for (uint32_t r = 0; r < n->world; r++) {
		a->addrs[r] = all[r].addr;
		a->lens[r] = all[r].addr_len;
	}
	cr_assert_eq(pthread_create(&a->thread, NULL, connect_main, a), 0);
}

static void connect_join(struct connect_arg *a, int ms)
{
	struct timespec dl;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += ms / 1000 + 1;
	cr_assert_eq(pthread_timedjoin_np(a->thread, NULL, &dl), 0,
		     "connect() of rank %u did not return within %d ms", a->n->rank, ms);
}

/* init @world nodes and connect them all; asserts */
static void cluster_up(struct tnode *nodes, const struct ferry_tp_ops *ops, uint32_t world,
		       int busy_poll)
{
	struct connect_arg args[MAX_NODES];
	uint64_t cid = cluster_id_for_test();

	for (uint32_t r = 0; r < world; r++)
		cr_assert_eq(tnode_init(&nodes[r], ops, r, world, cid, TIMEOUT_MS, busy_poll), 0,
			     "init of rank %u failed", r);
	for (uint32_t r = 0; r < world; r++)
		connect_start(&args[r], &nodes[r], nodes);
	for (uint32_t r = 0; r < world; r++) {
		connect_join(&args[r], TIMEOUT_MS + 5000);
		cr_assert_eq(args[r].ret, 0, "connect of rank %u: %s", r,
			     ferry_strerror(args[r].ret));
	}
}

static void cluster_down(struct tnode *nodes, uint32_t world)
{
	for (uint32_t r = 0; r < world; r++)
		tnode_fini(&nodes[r]);
}

/* send one test frame of @len bytes (a multiple of 8), gathered from three pieces */
static int send_frame(struct tnode *n, uint32_t dst, uint32_t sender, uint32_t seq, uint32_t len)
{
	uint8_t small[256];
	uint8_t *buf = len <= sizeof(small) ? small : malloc(len);
	uint32_t table = sender << 24 | seq;
	size_t half = HDR_LEN + (len - HDR_LEN) / 2;
	struct iovec iov[3] = {
		{ .iov_base = buf, .iov_len = HDR_LEN },
		{ .iov_base = buf + HDR_LEN, .iov_len = half - HDR_LEN },
		{ .iov_base = buf + half, .iov_len = len - half },
	};
	int ret;

	cr_assert_not_null(buf);
	frame_fill(buf, FERRY_MSG_OP, len, n->rank, table);
	ret = n->ops->send(n->tp, dst, iov, 3);
	if (buf != small)
		free(buf);
	return ret;
}

static void assert_clean(struct tnode *n)
{
	pthread_mutex_lock(&n->lock);
	cr_expect_eq(n->bad_len, 0, "rank %u: %d bad frames: %s", n->rank, n->bad_len,
		     n->first_bad);
	cr_expect_eq(n->bad_content, 0, "rank %u: %d torn frames: %s", n->rank, n->bad_content,
		     n->first_bad);
	cr_expect_eq(n->bad_order, 0, "rank %u: %d reordered frames: %s", n->rank, n->bad_order,
		     n->first_bad);
	cr_expect_eq(n->misaligned, 0, "rank %u: %d frames not 8-byte aligned", n->rank,
		     n->misaligned);
	cr_expect_eq(n->wrong_thread, 0, "rank %u: %d handler calls off the progress thread",
		     n->rank, n->wrong_thread);
	cr_expect_eq(n->ack_errs, 0, "rank %u: %d acks failed to send", n->rank, n->ack_errs);
	pthread_mutex_unlock(&n->lock);
}

/* @count frames of 64 bytes from @a to @b (next seqs of sender 7), and check they arrive */
static void exchange(struct tnode *a, struct tnode *b, uint32_t count)
{
	uint64_t before = LOCKED(b, b->frames[a->rank]);
	uint32_t seq = LOCKED(b, b->next_seq[a->rank][7]);

	for (uint32_t i = 0; i < count; i++)
		cr_assert_eq(send_frame(a, b->rank, 7, seq + i, 64), 0, "send %u -> %u", a->rank,
			     b->rank);
	cr_assert(WAIT_FOR(b, b->frames[a->rank] == before + count, WAIT_MS),
		  "rank %u got %llu of %u frames from rank %u", b->rank,
		  (unsigned long long)(LOCKED(b, b->frames[a->rank]) - before), count, a->rank);
}

/* ---- raw sockets (tcp only) --------------------------------------------- */

static int raw_dial(const struct tnode *n)
{
	char s[FERRY_TP_ADDR_MAX + 1], *colon;
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct timeval tv = { .tv_sec = 5 };
	int fd;

	memcpy(s, n->addr, n->addr_len);
	s[n->addr_len] = '\0';
	colon = strrchr(s, ':');
	cr_assert_not_null(colon, "tcp address blob \"%s\" is not ip:port", s);
	*colon = '\0';
	sa.sin_port = htons((uint16_t)atoi(colon + 1));
	cr_assert_eq(inet_pton(AF_INET, s, &sa.sin_addr), 1);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		return -errno;
	}
	return fd;
}

static void raw_hello(uint8_t *buf, uint64_t cluster_id, uint32_t rank, uint32_t world)
{
	struct ferry_msg_hello hello = { .cluster_id = cluster_id, .rank = rank, .world = world };

	frame_fill(buf, FERRY_MSG_HELLO, HELLO_LEN, rank, 0);
	memcpy(buf + HDR_LEN, &hello, sizeof(hello));
}

static void raw_write(int fd, const void *buf, size_t len)
{
	cr_assert_eq(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len, "raw write: %s",
		     strerror(errno));
}

/* 1 when the other end closes @fd within @ms (whatever it sent first is skipped) */
static int raw_closed_within(int fd, int ms)
{
	int64_t end = now_ms() + ms;
	char buf[512];

	while (now_ms() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&p, 1, (int)(end - now_ms())) <= 0)
			continue;
		r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return 1;
	}
	return 0;
}

/* ---- the suite ---------------------------------------------------------- */

TP_TEST(frames_of_many_sizes_arrive_intact)
{
	static const uint32_t sizes[] = {
		16, 24, 200, 4096, 4104, (64 << 10) + 8, (1 << 20) + 8, 3 << 20, 8 << 20,
	};
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct tnode nodes[3];
	const uint32_t world = 3;
	uint64_t want_bytes = 0;

	cluster_up(nodes, ops, world, 0);
	for (size_t i = 0; i < ARRAY_SIZE(sizes); i++)
		want_bytes += sizes[i];
	for (uint32_t src = 0; src < world; src++)
		for (uint32_t dst = 0; dst < world; dst++)
			for (size_t i = 0; i < ARRAY_SIZE(sizes); i++)
				cr_assert_eq(send_frame(&nodes[src], dst, 0, (uint32_t)i, sizes[i]),
					     0, "send of %u bytes %u -> %u", sizes[i], src, dst);

	for (uint32_t dst = 0; dst < world; dst++) {
		struct tnode *n = &nodes[dst];

		for (uint32_t src = 0; src < world; src++) {
			cr_assert(WAIT_FOR(n, n->frames[src] == ARRAY_SIZE(sizes), WAIT_MS),
				  "rank %u got %llu of %zu frames from rank %u", dst,
				  (unsigned long long)LOCKED(n, n->frames[src]), ARRAY_SIZE(sizes),
				  src);
			cr_expect_eq(LOCKED(n, n->bytes[src]), want_bytes);
		}
		assert_clean(n);
	}
	cluster_down(nodes, world);
}

TP_TEST(send_rejects_a_bad_destination)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct tnode nodes[2];

	cluster_up(nodes, ops, 2, 0);
	cr_expect_eq(send_frame(&nodes[0], 2, 0, 0, 64), -EINVAL);
	cr_expect_eq(send_frame(&nodes[0], UINT32_MAX, 0, 0, 64), -EINVAL);
	exchange(&nodes[0], &nodes[1], 1);
	cluster_down(nodes, 2);
}

struct sender_arg {
	struct tnode *n;
	uint32_t sender;
	uint32_t count;
	pthread_barrier_t *go;
	int errors;
	pthread_t thread;
};

/* frames of varied sizes, numbered per (sender, dst), to every rank in turn */
static void *sender_main(void *arg)
{
	static const uint32_t sizes[] = { 16, 48, 304, 1024, 2056, 16, 64, 131072 };
	struct sender_arg *a = arg;

	pthread_barrier_wait(a->go);
	for (uint32_t i = 0; i < a->count; i++)
		for (uint32_t dst = 0; dst < a->n->world; dst++)
			if (send_frame(a->n, dst, a->sender, i,
				       sizes[(i + a->sender + dst) % ARRAY_SIZE(sizes)]))
				a->errors++;
	return NULL;
}

TP_TEST(fifo_per_pair_with_concurrent_senders)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		WORLD = 3,
		SENDERS = 4,
		COUNT = 1500
	};
	struct sender_arg args[WORLD][SENDERS];
	struct tnode nodes[WORLD];
	pthread_barrier_t go;

	cluster_up(nodes, ops, WORLD, 0);
	pthread_barrier_init(&go, NULL, WORLD * SENDERS);
	for (uint32_t r = 0; r < WORLD; r++)
		for (uint32_t s = 0; s < SENDERS; s++) {
			args[r][s] = (struct sender_arg){
				.n = &nodes[r],
				.sender = s,
				.count = COUNT,
				.go = &go,
			};
			cr_assert_eq(pthread_create(&args[r][s].thread, NULL, sender_main,
						    &args[r][s]),
				     0);
		}
	for (uint32_t r = 0; r < WORLD; r++)
		for (uint32_t s = 0; s < SENDERS; s++) {
			pthread_join(args[r][s].thread, NULL);
			cr_expect_eq(args[r][s].errors, 0, "rank %u sender %u: %d sends failed", r,
				     s, args[r][s].errors);
		}
	for (uint32_t dst = 0; dst < WORLD; dst++) {
		struct tnode *n = &nodes[dst];

		for (uint32_t src = 0; src < WORLD; src++)
			cr_assert(WAIT_FOR(n, n->frames[src] == SENDERS * COUNT, WAIT_MS),
				  "rank %u got %llu of %d frames from rank %u", dst,
				  (unsigned long long)LOCKED(n, n->frames[src]), SENDERS * COUNT,
				  src);
		for (uint32_t src = 0; src < WORLD; src++)
			for (uint32_t s = 0; s < SENDERS; s++)
				cr_expect_eq(LOCKED(n, n->next_seq[src][s]), COUNT);
		assert_clean(n);
	}
	pthread_barrier_destroy(&go);
	cluster_down(nodes, WORLD);
}

struct flood_arg {
	struct tnode *n;
	uint32_t dst, count, len;
	int errors;
	pthread_t thread;
};

static void *flood_main(void *arg)
{
	struct flood_arg *a = arg;

	for (uint32_t i = 0; i < a->count; i++)
		if (send_frame(a->n, a->dst, 1, i, a->len))
			a->errors++;
	return NULL;
}

/*
 * Both nodes send large frames at each other while both progress threads
 * answer every frame with an ack: with a send that blocks on a full socket,
 * the two progress threads would wait on each other forever.
 */
TP_TEST(flooding_both_ways_completes)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		COUNT = 48,
		LEN = 1 << 20
	};
	struct flood_arg args[2];
	struct tnode nodes[2];
	int64_t t0;

	cluster_up(nodes, ops, 2, 0);
	for (int r = 0; r < 2; r++)
		nodes[r].echo = 1;
	t0 = now_ms();
	for (uint32_t r = 0; r < 2; r++) {
		args[r] = (struct flood_arg){
			.n = &nodes[r], .dst = 1 - r, .count = COUNT, .len = LEN
		};
		cr_assert_eq(pthread_create(&args[r].thread, NULL, flood_main, &args[r]), 0);
	}
	for (uint32_t r = 0; r < 2; r++) {
		struct tnode *n = &nodes[r];
		uint32_t peer = 1 - r;

		cr_assert(WAIT_FOR(n, n->frames[peer] == COUNT && n->acks[peer] == COUNT, WAIT_MS),
			  "rank %u: %llu of %d frames and %llu of %d acks after %lld ms: stuck", r,
			  (unsigned long long)LOCKED(n, n->frames[peer]), COUNT,
			  (unsigned long long)LOCKED(n, n->acks[peer]), COUNT,
			  (long long)(now_ms() - t0));
	}
	for (uint32_t r = 0; r < 2; r++) {
		pthread_join(args[r].thread, NULL);
		cr_expect_eq(args[r].errors, 0);
		assert_clean(&nodes[r]);
	}
	cluster_down(nodes, 2);
}

/* the receiver's progress thread is stuck in a handler: the sender must not be */
TP_TEST(send_does_not_block_on_a_stalled_peer)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		COUNT = 64,
		LEN = 1 << 20
	};
	struct tnode nodes[2];
	struct tnode *rx = &nodes[1];
	int64_t t0, took;

	cluster_up(nodes, ops, 2, 0);
	rx->gate_closed = 1;
	cr_assert_eq(send_frame(&nodes[0], 1, 0, 0, 64), 0);
	cr_assert(WAIT_FOR(rx, rx->gated, WAIT_MS), "the first frame never reached the handler");

	t0 = now_ms();
	for (uint32_t i = 1; i <= COUNT; i++)
		cr_assert_eq(send_frame(&nodes[0], 1, 0, i, LEN), 0);
	took = now_ms() - t0;

	pthread_mutex_lock(&rx->lock);
	rx->gate_closed = 0;
	pthread_cond_broadcast(&rx->cond);
	pthread_mutex_unlock(&rx->lock);

	cr_expect_lt(took, 10000, "%d MiB of sends to a stalled peer took %lld ms: send blocked",
		     COUNT, (long long)took);
	cr_assert(WAIT_FOR(rx, rx->frames[0] == COUNT + 1, WAIT_MS), "got %llu of %d frames",
		  (unsigned long long)LOCKED(rx, rx->frames[0]), COUNT + 1);
	assert_clean(rx);
	cluster_down(nodes, 2);
}

TP_TEST(progress_thread_hooks_run_once_on_it)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct tnode nodes[2];

	cluster_up(nodes, ops, 2, 0);
	for (int r = 0; r < 2; r++) {
		struct tnode *n = &nodes[r];

		cr_assert(WAIT_FOR(n, n->starts == 1, WAIT_MS), "on_thread_start never ran");
		cr_expect(!pthread_equal(LOCKED(n, n->progress), pthread_self()),
			  "on_thread_start ran on the caller's thread");
	}
	cr_expect(!pthread_equal(nodes[0].progress, nodes[1].progress),
		  "two transport instances share one progress thread");
	exchange(&nodes[0], &nodes[1], 10);
	exchange(&nodes[1], &nodes[0], 10);
	exchange(&nodes[0], &nodes[0], 10);

	for (int r = 0; r < 2; r++) {
		struct tnode *n = &nodes[r];

		tnode_fini(n);
		/* no wait: fini() returns after the thread stopped */
		cr_expect_eq(LOCKED(n, n->stops), 1, "rank %d: on_thread_stop ran %d times", r,
			     LOCKED(n, n->stops));
		cr_expect_eq(LOCKED(n, n->starts), 1);
		assert_clean(n); /* the stop hook ran on the progress thread too */
	}
	usleep(100 * 1000);
	for (int r = 0; r < 2; r++)
		cr_expect_eq(LOCKED(&nodes[r], nodes[r].after_fini), 0,
			     "rank %d: a handler ran after fini() returned", r);
}

TP_TEST(peer_fini_reports_it_failed_once)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct tnode nodes[3];

	cluster_up(nodes, ops, 3, 0);
	exchange(&nodes[2], &nodes[0], 5);
	exchange(&nodes[0], &nodes[2], 5);
	tnode_fini(&nodes[2]);

	for (int r = 0; r < 2; r++) {
		struct tnode *n = &nodes[r];

		cr_assert(WAIT_FOR(n, n->failed[2] > 0, WAIT_MS),
			  "rank %d never heard that rank 2 failed", r);
		cr_expect_eq(LOCKED(n, n->failed_err[2]), -FERRY_E_PEER, "err %s",
			     ferry_strerror(LOCKED(n, n->failed_err[2])));
	}
	usleep(300 * 1000);
	for (int r = 0; r < 2; r++) {
		struct tnode *n = &nodes[r];

		cr_expect_eq(LOCKED(n, n->failed[2]), 1, "rank %d: on_peer_failed(2) ran %d times",
			     r, LOCKED(n, n->failed[2]));
		cr_expect_eq(LOCKED(n, n->failed[0] + n->failed[1]), 0,
			     "rank %d: a live peer was reported failed", r);
		cr_expect_eq(send_frame(n, 2, 0, 0, 64), -FERRY_E_PEER);
	}
	exchange(&nodes[0], &nodes[1], 100);
	exchange(&nodes[1], &nodes[0], 100);
	exchange(&nodes[1], &nodes[1], 10);
	for (int r = 0; r < 3; r++)
		assert_clean(&nodes[r]);
	cr_expect_eq(LOCKED(&nodes[2], nodes[2].after_fini), 0);
	cluster_down(nodes, 3);
}

/*
 * Ranks 1 and 3 of 4 never start (rank 1's address is that of an instance
 * already gone, so dials to it are refused): ranks 0 and 2 give up after
 * their timeout and name both.
 */
TP_TEST(connect_times_out_naming_the_missing_ranks)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint64_t cid = cluster_id_for_test();
	const int timeout_ms = 1000;
	struct connect_arg args[2];
	struct tnode nodes[4];

	for (uint32_t r = 0; r < 4; r++)
		cr_assert_eq(tnode_init(&nodes[r], ops, r, 4, cid, timeout_ms, 0), 0);
	tnode_fini(&nodes[1]);
	tnode_fini(&nodes[3]);
	connect_start(&args[0], &nodes[0], nodes);
	connect_start(&args[1], &nodes[2], nodes);
	for (int i = 0; i < 2; i++) {
		connect_join(&args[i], timeout_ms + 5000);
		cr_expect_eq(args[i].ret, -ETIMEDOUT, "rank %u: %s", args[i].n->rank,
			     ferry_strerror(args[i].ret));
		cr_expect(args[i].ms >= timeout_ms - 50 && args[i].ms <= timeout_ms + 2000,
			  "rank %u gave up after %lld ms with a %d ms timeout", args[i].n->rank,
			  (long long)args[i].ms, timeout_ms);
	}
	cr_expect_eq(log_count("rank 0 timed out", "ranks 1, 3"), 1,
		     "rank 0 did not log the missing ranks 1, 3 once");
	cr_expect_eq(log_count("rank 2 timed out", "ranks 1, 3"), 1,
		     "rank 2 did not log the missing ranks 1, 3 once");
	tnode_fini(&nodes[0]);
	tnode_fini(&nodes[2]);
}

TP_TEST(strangers_are_rejected_and_the_cluster_works)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint64_t cid = cluster_id_for_test();
	struct connect_arg args[3];
	struct tnode nodes[3];
	uint8_t hello[HELLO_LEN], garbage[64];
	int garbage_fd, wrong_cluster_fd, wrong_world_fd, silent_fd, late_fd;

	tp_require_tcp(ops);
	for (uint32_t r = 0; r < 3; r++)
		cr_assert_eq(tnode_init(&nodes[r], ops, r, 3, cid, TIMEOUT_MS, 0), 0);

	/* before the cluster connects: they wait in rank 1's accept queue */
	for (size_t i = 0; i < sizeof(garbage); i++)
		garbage[i] = (uint8_t)(i * 37 + 1);
	garbage_fd = raw_dial(&nodes[1]);
	cr_assert_geq(garbage_fd, 0);
	raw_write(garbage_fd, garbage, sizeof(garbage));

	wrong_cluster_fd = raw_dial(&nodes[1]);
	cr_assert_geq(wrong_cluster_fd, 0);
	raw_hello(hello, cid ^ 1, 2, 3);
	raw_write(wrong_cluster_fd, hello, sizeof(hello));

	wrong_world_fd = raw_dial(&nodes[1]);
	cr_assert_geq(wrong_world_fd, 0);
	raw_hello(hello, cid, 2, 5);
	raw_write(wrong_world_fd, hello, sizeof(hello));

	silent_fd = raw_dial(&nodes[1]);
	cr_assert_geq(silent_fd, 0);

	for (uint32_t r = 0; r < 3; r++)
		connect_start(&args[r], &nodes[r], nodes);
	for (uint32_t r = 0; r < 3; r++) {
		connect_join(&args[r], TIMEOUT_MS + 5000);
		cr_assert_eq(args[r].ret, 0, "connect of rank %u: %s", r,
			     ferry_strerror(args[r].ret));
	}
	cr_expect(raw_closed_within(garbage_fd, 5000), "the garbage writer was not closed");
	cr_expect(raw_closed_within(wrong_cluster_fd, 5000), "the wrong cluster was not closed");
	cr_expect(raw_closed_within(wrong_world_fd, 5000), "the wrong world was not closed");
	cr_expect(raw_closed_within(silent_fd, 5000), "the silent stranger was not closed");
	cr_expect_eq(log_count("rank 1 rejected a connection", NULL), 3,
		     "expected one line per rejected stranger");
	cr_expect_eq(log_count("rank 1 rejected a connection", "cluster id"), 1);

	/* after the cluster connected: refused, or closed at once */
	late_fd = raw_dial(&nodes[1]);
	if (late_fd >= 0) {
		send(late_fd, garbage, sizeof(garbage), MSG_NOSIGNAL);
		cr_expect(raw_closed_within(late_fd, 5000), "a late stranger was kept");
		close(late_fd);
	}

	exchange(&nodes[0], &nodes[1], 50);
	exchange(&nodes[1], &nodes[2], 50);
	exchange(&nodes[2], &nodes[1], 50);
	for (uint32_t r = 0; r < 3; r++) {
		cr_expect_eq(LOCKED(&nodes[r],
				    nodes[r].failed[0] + nodes[r].failed[1] + nodes[r].failed[2]),
			     0, "rank %u reported a peer failed", r);
		assert_clean(&nodes[r]);
	}
	close(garbage_fd);
	close(wrong_cluster_fd);
	close(wrong_world_fd);
	close(silent_fd);
	cluster_down(nodes, 3);
}

/*
 * Rank 3 is a fake written with raw sockets: it passes the HELLO with ranks
 * 0, 1 and 2, sends each a good frame, then misbehaves differently with each.
 */
TP_TEST(a_peer_sending_bad_frames_is_dropped_alone)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint64_t cid = cluster_id_for_test();
	struct connect_arg args[3];
	struct tnode nodes[4];
	int fds[3];
	uint8_t buf[2 * 64];

	tp_require_tcp(ops);
	for (uint32_t r = 0; r < 3; r++)
		cr_assert_eq(tnode_init(&nodes[r], ops, r, 4, cid, TIMEOUT_MS, 0), 0);
	memset(&nodes[3], 0, sizeof(nodes[3]));
	nodes[3].addr_len = 1; /* rank 3 dials everyone: its blob is never used */
	for (uint32_t r = 0; r < 3; r++)
		connect_start(&args[r], &nodes[r], nodes);

	for (uint32_t v = 0; v < 3; v++) {
		uint8_t theirs[HELLO_LEN];
		struct ferry_msg_hello h;

		fds[v] = raw_dial(&nodes[v]);
		cr_assert_geq(fds[v], 0);
		raw_hello(buf, cid, 3, 4);
		raw_write(fds[v], buf, HELLO_LEN);
		cr_assert_eq(recv(fds[v], theirs, sizeof(theirs), MSG_WAITALL),
			     (ssize_t)sizeof(theirs), "no HELLO from rank %u", v);
		memcpy(&h, theirs + HDR_LEN, sizeof(h));
		cr_assert_eq(h.rank, v);
		cr_assert_eq(h.cluster_id, cid);
	}
	for (uint32_t r = 0; r < 3; r++) {
		connect_join(&args[r], TIMEOUT_MS + 5000);
		cr_assert_eq(args[r].ret, 0, "connect of rank %u: %s", r,
			     ferry_strerror(args[r].ret));
	}

	/* to rank 0: a good frame and one with a bad magic, in one write */
	frame_fill(buf, FERRY_MSG_OP, 32, 3, 0);
	frame_fill(buf + 32, FERRY_MSG_OP, 32, 3, 1);
	buf[32] ^= 0xff;
	raw_write(fds[0], buf, 64);

	/* to rank 1: a good frame, then 24 bytes of a 48-byte one, then close */
	frame_fill(buf, FERRY_MSG_OP, 32, 3, 0);
	frame_fill(buf + 32, FERRY_MSG_OP, 48, 3, 1);
	raw_write(fds[1], buf, 32 + 24);
	close(fds[1]);

	/* to rank 2: a good frame, then one that claims to come from rank 1 */
	frame_fill(buf, FERRY_MSG_OP, 32, 3, 0);
	frame_fill(buf + 32, FERRY_MSG_OP, 32, 1, 1);
	raw_write(fds[2], buf, 32);
	usleep(50 * 1000); /* two reads this time */
	raw_write(fds[2], buf + 32, 32);

	for (uint32_t v = 0; v < 3; v++) {
		struct tnode *n = &nodes[v];
		int want = v == 1 ? -FERRY_E_PEER : -FERRY_E_PROTO;

		cr_assert(WAIT_FOR(n, n->failed[3] > 0, WAIT_MS), "rank %u kept the bad peer", v);
		cr_expect_eq(LOCKED(n, n->frames[3]), 1,
			     "rank %u: the good frame before the bad one was not delivered", v);
		cr_expect_eq(LOCKED(n, n->failed_err[3]), want, "rank %u: err %s, want %s", v,
			     ferry_strerror(LOCKED(n, n->failed_err[3])), ferry_strerror(want));
	}
	cr_expect(raw_closed_within(fds[0], 5000), "rank 0 kept the connection open");
	cr_expect(raw_closed_within(fds[2], 5000), "rank 2 kept the connection open");
	usleep(200 * 1000);
	for (uint32_t v = 0; v < 3; v++) {
		cr_expect_eq(LOCKED(&nodes[v], nodes[v].failed[3]), 1,
			     "rank %u: on_peer_failed(3) ran %d times", v,
			     LOCKED(&nodes[v], nodes[v].failed[3]));
		cr_expect_eq(send_frame(&nodes[v], 3, 0, 0, 64), -FERRY_E_PEER);
	}
	cr_expect_eq(log_count("rank 3 sent rank 0 a frame with a bad header", "bad magic"), 1);
	cr_expect_eq(log_count("rank 3 closed its connection to rank 1 in the middle of a frame",
			       "(24 of 48 bytes)"),
		     1);
	cr_expect_eq(log_count("rank 3 sent rank 2 a frame that claims to come from rank 1", NULL),
		     1);

	exchange(&nodes[0], &nodes[1], 50);
	exchange(&nodes[1], &nodes[2], 50);
	exchange(&nodes[2], &nodes[0], 50);
	for (uint32_t v = 0; v < 3; v++) {
		cr_expect_eq(LOCKED(&nodes[v],
				    nodes[v].failed[0] + nodes[v].failed[1] + nodes[v].failed[2]),
			     0, "rank %u reported a live peer failed", v);
		assert_clean(&nodes[v]);
	}
	close(fds[0]);
	close(fds[2]);
	cluster_down(nodes, 3);
}

/* the progress threads spin; a ping-pong still goes through, and fini still stops them */
TP_TEST(busy_poll_delivers_and_stops)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		ROUNDS = 2000
	};
	struct tnode nodes[2];

	cluster_up(nodes, ops, 2, 1);
	nodes[1].echo = 1;
	for (uint32_t i = 0; i < ROUNDS; i++) {
		cr_assert_eq(send_frame(&nodes[0], 1, 0, i, 64), 0);
		cr_assert(WAIT_FOR(&nodes[0], nodes[0].acks[1] == i + 1, WAIT_MS),
			  "round %u: no ack", i);
	}
	for (int r = 0; r < 2; r++)
		assert_clean(&nodes[r]);
	cluster_down(nodes, 2);
	for (int r = 0; r < 2; r++)
		cr_expect_eq(LOCKED(&nodes[r], nodes[r].stops), 1);
}

/* a world of one: connect has nobody to wait for, and frames to self still flow */
TP_TEST(a_world_of_one_talks_to_itself)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct tnode node;

	cluster_up(&node, ops, 1, 0);
	exchange(&node, &node, 100);
	assert_clean(&node);
	cluster_down(&node, 1);
}

/* SPDX-License-Identifier: MIT */
/*
 * test_transport.c - the transport conformance suite: one set of tests run
 * against every transport in tp_table (transport/transport.h's contract).
 *
 * Each test brings up 2..4 transport instances inside the test process, one
 * per rank, each with a struct tnode as its core (tests/common/tnode.h: the
 * handlers record what they see, frames checked for length, content and
 * order, and never assert; the test thread waits with a deadline and asserts
 * on the counts). The message cases' traffic (size classes, concurrent
 * senders, floods) lives there too: ferry-tp-check (tests/rank/tp_check.c)
 * runs the same cases with one rank per process, across network namespaces.
 *
 * The loop transport (tcp messages, in-process one-sided access) runs the
 * same message cases as tcp; the raw-socket cases are tcp's alone.
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

#ifdef FERRY_HAVE_RDMA
#include <infiniband/verbs.h>
#include <linux/capability.h>
#include <rdma/rdma_cma.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#endif

#include "ferry/ferry.h"
#include "transport/transport.h"
#include "common/tnode.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_NODES TN_MAX_NODES
#define TIMEOUT_MS 5000	   /* transport connect timeout */
#define WAIT_MS TN_WAIT_MS /* bound on any wait for frames */
#define HDR_LEN TN_HDR_LEN
#define HELLO_LEN (sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_hello))
#define RESUME_LEN (sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_resume))
#define HS_LEN (HELLO_LEN + RESUME_LEN) /* tcp's handshake: HELLO, then RESUME */

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
/* every line of one test (each runs in its own process): 512 were too few
 * for a refused node's retries on a loaded machine, and a line printed after
 * them was not seen by log_count() */
static char log_lines[8192][256];
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

/* ---- test nodes (tests/common/tnode.h) ----------------------------------- */

static uint64_t cluster_id_for_test(void)
{
	return 0xfe77000000000000ull | ((uint64_t)getpid() << 8);
}

/* the transport at index @i, or the test is skipped */
static const struct ferry_tp_ops *tp_get(int i)
{
	const struct ferry_tp_ops *ops = tp_table[i];
	const char *why = NULL;
	const char *only = getenv("FERRY_TEST_TRANSPORT");

	/* e.g. FERRY_TEST_TRANSPORT=rdma: run one transport's cases, skip the others */
	if (only && *only && strcmp(only, ops->name))
		cr_skip_test("FERRY_TEST_TRANSPORT=%s leaves out the %s transport", only,
			     ops->name);
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

/*
 * The address a node of @ops listens on. rdma_cm cannot use loopback: an rdma
 * node binds the IPv4 address of the RDMA device's interface, which
 * ci/softroce-vm.sh exports as FERRY_TEST_RDMA_ADDR (10.77.0.1 in its guest).
 */
static const char *tnode_bind_addr(const struct ferry_tp_ops *ops)
{
	const char *a = getenv("FERRY_TEST_RDMA_ADDR");

	if (strcmp(ops->name, "rdma"))
		return "127.0.0.1";
	if (a && *a)
		return a;
	return getenv("FERRY_TEST_IN_VM") ? "10.77.0.1" : "127.0.0.1";
}

/* per rank: the cluster token's key its node proves (NULL: no token); tests set it */
static const uint8_t *tnode_key[MAX_NODES];

/* init one node; Return: what ops->init returned */
static int tnode_init(struct tnode *n, const struct ferry_tp_ops *ops, uint32_t rank,
		      uint32_t world, uint64_t cluster_id, int timeout_ms, int busy_poll)
{
	struct ferry_tp_config cfg = {
		.rank = rank,
		.world = world,
		.cluster_id = cluster_id,
		.bind_addr = tnode_bind_addr(ops),
		.busy_poll = busy_poll,
		.timeout_ms = timeout_ms,
		.auth = rank < MAX_NODES && tnode_key[rank],
	};

	if (cfg.auth)
		memcpy(cfg.auth_key, tnode_key[rank], sizeof(cfg.auth_key));
	return tn_start(n, ops, &cfg);
}

static void tnode_fini(struct tnode *n)
{
	tn_fini(n);
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
	int64_t t0 = tn_now_ms();

	a->ret = a->n->ops->connect(a->n->tp, a->addrs, a->lens);
	a->ms = tn_now_ms() - t0;
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
	return tn_send_frame(n, dst, sender, seq, len);
}

static void assert_clean(struct tnode *n)
{
	char why[512];

	cr_expect_eq(tn_clean(n, why, sizeof(why)), 0, "%s", why);
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

	tn_frame_fill(buf, FERRY_MSG_HELLO, HELLO_LEN, rank, 0);
	memcpy(buf + HDR_LEN, &hello, sizeof(hello));
}

/* tcp's whole handshake: the HELLO, then a RESUME of session @inc after @delivered frames
 * of the peer's, having sent it @sent */
static void raw_resume(uint8_t *buf, uint64_t cluster_id, uint32_t rank, uint32_t world,
		       uint64_t inc, uint64_t delivered, uint64_t sent)
{
	struct ferry_msg_resume r = { .incarnation = inc, .delivered = delivered, .sent = sent };

	raw_hello(buf, cluster_id, rank, world);
	tn_frame_fill(buf + HELLO_LEN, FERRY_MSG_RESUME, RESUME_LEN, rank, 0);
	memcpy(buf + HELLO_LEN + HDR_LEN, &r, sizeof(r));
}

/* a first connection: a new session */
static void raw_handshake(uint8_t *buf, uint64_t cluster_id, uint32_t rank, uint32_t world)
{
	raw_resume(buf, cluster_id, rank, world, 0x5eed0001, 0, 0);
}

static void raw_write(int fd, const void *buf, size_t len)
{
	cr_assert_eq(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len, "raw write: %s",
		     strerror(errno));
}

/* 1 when the other end closes @fd within @ms (whatever it sent first is skipped) */
static int raw_closed_within(int fd, int ms)
{
	int64_t end = tn_now_ms() + ms;
	char buf[512];

	while (tn_now_ms() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&p, 1, (int)(end - tn_now_ms())) <= 0)
			continue;
		r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return 1;
	}
	return 0;
}

/* ---- the cluster token (transport/base/auth.h) --------------------------- */

/* the count of log lines with @a and @b once it reached @n, or after @ms */
static int log_wait(const char *a, const char *b, int n, int ms)
{
	int64_t end = tn_now_ms() + ms;
	int got;

	while ((got = log_count(a, b)) < n && tn_now_ms() < end)
		usleep(10000);
	return got;
}

static uint8_t key_a[FERRY_AUTH_KEY_LEN], key_b[FERRY_AUTH_KEY_LEN];

/* two different tokens' keys, as the core derives them */
static void keys_make(void)
{
	cr_assert_eq(ferry__auth_key_from_token("the cluster's token A", 21, key_a), 0);
	cr_assert_eq(ferry__auth_key_from_token("the cluster's token B", 21, key_b), 0);
	cr_assert_neq(memcmp(key_a, key_b, sizeof(key_a)), 0);
}

/* @n nodes with the keys @keys (NULL entries: no token) try to connect within
 * @timeout_ms; @rets receives each connect()'s result */
static void cluster_try(struct tnode *nodes, const struct ferry_tp_ops *ops, uint32_t world,
			const uint8_t *const *keys, int timeout_ms, int *rets)
{
	struct connect_arg args[MAX_NODES];
	uint64_t cid = cluster_id_for_test();

	for (uint32_t r = 0; r < world; r++) {
		tnode_key[r] = keys[r];
		cr_assert_eq(tnode_init(&nodes[r], ops, r, world, cid, timeout_ms, 0), 0,
			     "init of rank %u failed", r);
	}
	for (uint32_t r = 0; r < world; r++)
		connect_start(&args[r], &nodes[r], nodes);
	for (uint32_t r = 0; r < world; r++) {
		connect_join(&args[r], timeout_ms + 5000);
		rets[r] = args[r].ret;
	}
}

TP_TEST(nodes_with_the_same_token_connect_and_exchange_frames)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint8_t *keys[3] = { key_a, key_a, key_a };
	struct tnode nodes[3];
	int rets[3];

	keys_make();
	cluster_try(nodes, ops, 3, keys, TIMEOUT_MS, rets);
	for (uint32_t r = 0; r < 3; r++)
		cr_assert_eq(rets[r], 0, "rank %u: %s", r, ferry_strerror(rets[r]));
	for (uint32_t a = 0; a < 3; a++)
		for (uint32_t b = 0; b < 3; b++)
			if (a != b)
				exchange(&nodes[a], &nodes[b], 50);
	for (uint32_t r = 0; r < 3; r++)
		assert_clean(&nodes[r]);
	cr_expect_eq(log_count("rejected a connection", NULL), 0);
	cluster_down(nodes, 3);
}

/* rank 2 has another token, or none: no connection with it stands, both
 * ends say why, and the two with the same token still connect each other */
/* rank 2 has @key2 (NULL: no token); @why and, when not NULL, @also must be
 * logged: each is waited for up to 3 s while the nodes still try (a loaded
 * machine may not have read a peer's first bytes within the connect's 1.5 s) */
static void refused_case(const struct ferry_tp_ops *ops, const uint8_t *key2, const char *why,
			 const char *also)
{
	const uint8_t *keys[3] = { key_a, key_a, key2 };
	struct tnode nodes[3];
	int rets[3];

	cluster_try(nodes, ops, 3, keys, 1500, rets);
	for (uint32_t r = 0; r < 3; r++)
		cr_expect_eq(rets[r], -ETIMEDOUT, "rank %u connected without rank 2's token: %s", r,
			     ferry_strerror(rets[r]));
	cr_expect_gt(log_count("timed out", "rank 2"), 0, "no rank names rank 2 as missing");
	cr_expect_gt(log_wait(why, NULL, 1, 3000), 0, "no log line says \"%s\"", why);
	if (also)
		cr_expect_gt(log_wait(also, NULL, 1, 3000), 0, "no log line says \"%s\"", also);
	cr_expect_eq(LOCKED(&nodes[0], nodes[0].frames[2]), 0);
	cr_expect_eq(LOCKED(&nodes[2], nodes[2].frames[0]), 0);
	cluster_down(nodes, 3);
}

TP_TEST(a_node_with_another_token_is_refused)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);

	keys_make();
	refused_case(ops, key_b, "its token proof is wrong", NULL);
}

TP_TEST(a_node_without_a_token_is_refused)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);

	keys_make();
	if (!strcmp(ops->name, "rdma")) {
		/* a REQ's private data comes padded: a missing proof reads as a wrong one */
		refused_case(ops, NULL, "its token proof is wrong", NULL);
		return;
	}
	/* the node without a token says what it met */
	refused_case(ops, NULL, "it sent no token proof", "it opens with a token proof");
}

/* run a dialer's side of the token exchange on @fd with @key; @a keeps it */
static int raw_auth(int fd, const uint8_t *key, struct ferry_auth_hs *a)
{
	int64_t end = tn_now_ms() + 3000;
	int ret;

	ferry__auth_hs_init(a, key, "tcp", FERRY_AUTH_DIALER, 1);
	while ((ret = ferry__auth_hs_step(a, fd)) == 0 && tn_now_ms() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		poll(&p, 1, 100);
	}
	return ret;
}

/*
 * A stranger on a token cluster's transport port: a HELLO without a proof,
 * a proof under another token, a genuine proof replayed on another
 * connection. Each is refused (the node closes it and logs its address);
 * with the right token the proof passes and the HELLO is still checked; the
 * cluster serves throughout.
 */
TP_TEST(a_stranger_without_the_token_is_refused_on_the_transport_port)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint8_t *keys[2] = { key_a, key_a };
	uint8_t buf[HS_LEN];
	struct ferry_auth_hs a;
	struct tnode nodes[2];
	int rets[2], fd;

	tp_require_tcp(ops);
	keys_make();
	cluster_try(nodes, ops, 2, keys, TIMEOUT_MS, rets);
	cr_assert(!rets[0] && !rets[1]);

	/* no token: a member's handshake, as it was before tokens */
	fd = raw_dial(&nodes[0]);
	raw_handshake(buf, cluster_id_for_test(), 1, 2);
	raw_write(fd, buf, sizeof(buf));
	cr_expect(raw_closed_within(fd, 3000), "a HELLO without a proof was not closed");
	close(fd);
	cr_expect_eq(log_wait("rejected a connection from 127.0.0.1", "no token proof", 1, 3000),
		     1);

	/* another token: our check of the node's proof fails, and it closes us */
	fd = raw_dial(&nodes[0]);
	cr_expect_eq(raw_auth(fd, key_b, &a), -EACCES);
	cr_expect(strstr(a.why, "token proof is wrong"), "%s", a.why);
	cr_expect(raw_closed_within(fd, 3000), "a wrong proof was not closed");
	close(fd);
	cr_expect_eq(log_wait("rejected a connection from 127.0.0.1", "token proof is wrong", 1,
			      3000),
		     1);

	/* the right token: the proof passes, and the HELLO after it is still checked */
	fd = raw_dial(&nodes[0]);
	cr_expect_eq(raw_auth(fd, key_a, &a), 1, "the right token: %s", a.why);
	raw_hello(buf, cluster_id_for_test() ^ 1, 1, 2);
	raw_write(fd, buf, HELLO_LEN);
	cr_expect(raw_closed_within(fd, 3000), "a HELLO of another cluster was not closed");
	close(fd);
	cr_expect_eq(log_wait("rejected a connection from 127.0.0.1", "is not ours", 1, 3000), 1);

	/* a replay: the nonce and proof that passed above, on a new connection */
	fd = raw_dial(&nodes[0]);
	raw_write(fd, a.out, FERRY_AUTH_HS_LEN);
	cr_expect(raw_closed_within(fd, 3000), "a replayed proof was not closed");
	close(fd);
	cr_expect_eq(log_wait("rejected a connection from 127.0.0.1", "token proof is wrong", 2,
			      3000),
		     2, "the replayed proof was not refused as wrong");

	exchange(&nodes[0], &nodes[1], 20);
	exchange(&nodes[1], &nodes[0], 20);
	cr_expect_eq(LOCKED(&nodes[0], nodes[0].failed[1]), 0);
	cr_expect_eq(LOCKED(&nodes[1], nodes[1].failed[0]), 0);
	cluster_down(nodes, 2);
}

/*
 * 100 connections held open and silent against every node's transport port
 * while the cluster connects, and again while its links break and come back
 * (fault injection resets one every 100 ms): every node connects well inside
 * its timeout, and no frame is lost.
 */
TP_TEST(the_cluster_forms_and_reconnects_beside_100_idle_connections_per_port)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint8_t *keys[3] = { key_a, key_a, key_a };
	struct connect_arg args[3];
	struct tnode nodes[3];
	enum {
		IDLE_PER_NODE = 100
	};
	static int idle[3][IDLE_PER_NODE];
	int64_t t0, took;

	tp_require_tcp(ops);
	keys_make();
	setenv("FERRY_TCP_FAULT_RESET_MS", "100", 1);
	for (uint32_t r = 0; r < 3; r++) {
		tnode_key[r] = keys[r];
		cr_assert_eq(tnode_init(&nodes[r], ops, r, 3, cluster_id_for_test(), TIMEOUT_MS, 0),
			     0);
	}
	for (uint32_t r = 0; r < 3; r++)
		for (int i = 0; i < IDLE_PER_NODE; i++) {
			idle[r][i] = raw_dial(&nodes[r]);
			cr_assert_geq(idle[r][i], 0);
		}
	t0 = tn_now_ms();
	for (uint32_t r = 0; r < 3; r++)
		connect_start(&args[r], &nodes[r], nodes);
	for (uint32_t r = 0; r < 3; r++) {
		connect_join(&args[r], TIMEOUT_MS + 5000);
		cr_assert_eq(args[r].ret, 0, "rank %u beside %d idle connections: %s", r,
			     IDLE_PER_NODE, ferry_strerror(args[r].ret));
	}
	took = tn_now_ms() - t0;
	cr_expect_lt(took, 3000, "the cluster took %lld ms to connect", (long long)took);
	cr_expect_gt(log_count("gave way to newer ones", NULL), 0,
		     "no node said it closed the idle connections");

	/* the links break and redial while a new set of idle connections waits */
	for (uint32_t r = 0; r < 3; r++)
		for (int i = 0; i < IDLE_PER_NODE; i++) {
			close(idle[r][i]);
			idle[r][i] = raw_dial(&nodes[r]);
		}
	for (int round = 0; round < 10; round++) {
		for (uint32_t a = 0; a < 3; a++)
			for (uint32_t b = 0; b < 3; b++)
				if (a != b)
					exchange(&nodes[a], &nodes[b], 20);
		usleep(150000);
	}
	cr_expect_gt(log_count("fault injection", NULL), 2, "no link was broken");
	cr_expect_gt(log_count("resumed", NULL), 2, "no link came back");
	for (uint32_t r = 0; r < 3; r++) {
		assert_clean(&nodes[r]);
		for (uint32_t p = 0; p < 3; p++)
			cr_expect_eq(LOCKED(&nodes[r], nodes[r].failed[p]), 0,
				     "rank %u marked rank %u failed", r, p);
	}
	for (uint32_t r = 0; r < 3; r++)
		for (int i = 0; i < IDLE_PER_NODE; i++)
			close(idle[r][i]);
	cluster_down(nodes, 3);
}

/* ---- the suite ---------------------------------------------------------- */

TP_TEST(frames_of_many_sizes_arrive_intact)
{
	const uint32_t *sizes = tn_size_classes;
	const size_t nsizes = tn_nsize_classes;
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct tnode nodes[3];
	const uint32_t world = 3;
	uint64_t want_bytes = 0;

	cluster_up(nodes, ops, world, 0);
	for (size_t i = 0; i < nsizes; i++)
		want_bytes += sizes[i];
	for (uint32_t src = 0; src < world; src++)
		for (uint32_t dst = 0; dst < world; dst++)
			for (size_t i = 0; i < nsizes; i++)
				cr_assert_eq(send_frame(&nodes[src], dst, 0, (uint32_t)i, sizes[i]),
					     0, "send of %u bytes %u -> %u", sizes[i], src, dst);

	for (uint32_t dst = 0; dst < world; dst++) {
		struct tnode *n = &nodes[dst];

		for (uint32_t src = 0; src < world; src++) {
			cr_assert(WAIT_FOR(n, n->frames[src] == nsizes, WAIT_MS),
				  "rank %u got %llu of %zu frames from rank %u", dst,
				  (unsigned long long)LOCKED(n, n->frames[src]), nsizes, src);
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

/*
 * wait until @n got @want frames from every rank, or until a stream short of
 * them brought no frame for FIFO_STALL_MS (it stopped: what the case is
 * about), or FIFO_CAP_MS passed since @t0 (too slow for the case's 120 s).
 * Return: 0, or -1 with @why saying which bound ran out, when the last frame
 * came and each rank's count.
 *
 * The bound was 30 s after the senders returned, and over rdma in the TCG
 * guest it once ran out ("rank 0 got 5923 of 6000 frames from rank 1").
 * It measured the host: in one guest on a loaded host (load average 12 on
 * its 2 cores when the guest started), 11 runs of the rdma case with 1500 frames per sender
 * (about 100 MB per pair, 600 MB in all) had every frame 34-88 s after the
 * senders began in the 6 that finished (every frame once, in order), and
 * the other 5 were still moving at 90 s; the transport's debug
 * lines showed streams still for up to 6 s, all their credits out, before
 * they moved again. So the guest sends FIFO_COUNT_VM frames per sender, and
 * a stream is failed for stopping (15 s), not for being slow.
 */
#define FIFO_STALL_MS 15000
#define FIFO_CAP_MS 90000 /* inside the case's 120 s */
static int fifo_wait_all(struct tnode *n, uint64_t want, int64_t t0, char *why, size_t wlen)
{
	uint64_t seen[MAX_NODES], got[MAX_NODES];
	int64_t moved[MAX_NODES], now, still = 0;
	uint32_t stopped = UINT32_MAX;
	size_t off;

	for (uint32_t s = 0; s < n->world; s++) {
		seen[s] = UINT64_MAX;
		moved[s] = tn_now_ms();
	}
	for (;;) {
		bool done = WAIT_FOR(n, ({
					     bool all_ = true;
					     for (uint32_t s_ = 0; s_ < n->world; s_++)
						     all_ = all_ && n->frames[s_] == want;
					     all_;
				     }),
				     1000);

		now = tn_now_ms();
		if (done) {
			fprintf(stderr,
				"fifo: rank %u had every frame %lld ms after the senders began\n",
				n->rank, (long long)(now - t0));
			return 0;
		}
		pthread_mutex_lock(&n->lock);
		for (uint32_t s = 0; s < n->world; s++)
			got[s] = n->frames[s];
		pthread_mutex_unlock(&n->lock);
		for (uint32_t s = 0; s < n->world; s++) {
			if (got[s] != seen[s]) {
				seen[s] = got[s];
				moved[s] = now;
			} else if (got[s] < want && now - moved[s] >= FIFO_STALL_MS) {
				stopped = s;
				still = now - moved[s];
			}
		}
		if (stopped != UINT32_MAX || now - t0 >= FIFO_CAP_MS)
			break;
	}
	if (stopped != UINT32_MAX)
		off = (size_t)snprintf(
			why, wlen,
			"the stream from rank %u stopped: no frame of it for %lld ms, "
			"%lld ms after the senders began;",
			stopped, (long long)still, (long long)(now - t0));
	else
		off = (size_t)snprintf(why, wlen,
				       "every stream still moving at the bound, %lld ms after the "
				       "senders began;",
				       (long long)(now - t0));
	for (uint32_t s = 0; s < n->world && off < wlen; s++)
		off += (size_t)snprintf(why + off, wlen - off,
					" %llu of %llu from rank %u (the last %lld ms ago)%s",
					(unsigned long long)got[s], (unsigned long long)want, s,
					(long long)(now - moved[s]),
					LOCKED(n, n->failed[s]) ? " (failed)" : "");
	return -1;
}

TP_TEST(fifo_per_pair_with_concurrent_senders)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		WORLD = 3,
		SENDERS = 4,
		FIFO_COUNT = 1500,
		FIFO_COUNT_VM = 300 /* ci/softroce-vm.sh's guest (FERRY_TEST_IN_VM): see above */
	};
	const uint32_t COUNT = getenv("FERRY_TEST_IN_VM") ? FIFO_COUNT_VM : FIFO_COUNT;
	struct tn_sender args[WORLD][SENDERS];
	struct tnode nodes[WORLD];
	pthread_barrier_t go;
	char why[384];
	int64_t t0;

	cluster_up(nodes, ops, WORLD, 0);
	t0 = tn_now_ms();
	pthread_barrier_init(&go, NULL, WORLD * SENDERS);
	for (uint32_t r = 0; r < WORLD; r++)
		for (uint32_t s = 0; s < SENDERS; s++) {
			args[r][s] = (struct tn_sender){
				.n = &nodes[r],
				.sender = s,
				.count = COUNT,
				.go = &go,
			};
			cr_assert_eq(pthread_create(&args[r][s].thread, NULL, tn_sender_main,
						    &args[r][s]),
				     0);
		}
	for (uint32_t r = 0; r < WORLD; r++)
		for (uint32_t s = 0; s < SENDERS; s++) {
			pthread_join(args[r][s].thread, NULL);
			cr_expect_eq(args[r][s].errors, 0, "rank %u sender %u: %d sends failed", r,
				     s, args[r][s].errors);
		}
	fprintf(stderr, "fifo: %u frames per sender queued %lld ms after the senders began\n",
		COUNT, (long long)(tn_now_ms() - t0));
	for (uint32_t dst = 0; dst < WORLD; dst++) {
		struct tnode *n = &nodes[dst];

		cr_assert_eq(fifo_wait_all(n, (uint64_t)SENDERS * COUNT, t0, why, sizeof(why)), 0,
			     "rank %u: %s", dst, why);
		for (uint32_t src = 0; src < WORLD; src++)
			for (uint32_t s = 0; s < SENDERS; s++)
				cr_expect_eq(LOCKED(n, n->next_seq[src][s]), COUNT);
		assert_clean(n);
	}
	pthread_barrier_destroy(&go);
	cluster_down(nodes, WORLD);
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
	struct tn_flood args[2];
	struct tnode nodes[2];
	int64_t t0;

	cluster_up(nodes, ops, 2, 0);
	for (int r = 0; r < 2; r++)
		nodes[r].echo = 1;
	t0 = tn_now_ms();
	for (uint32_t r = 0; r < 2; r++) {
		args[r] = (struct tn_flood){
			.n = &nodes[r], .dst = 1 - r, .count = COUNT, .len = LEN, .sender = 1
		};
		cr_assert_eq(pthread_create(&args[r].thread, NULL, tn_flood_main, &args[r]), 0);
	}
	for (uint32_t r = 0; r < 2; r++) {
		struct tnode *n = &nodes[r];
		uint32_t peer = 1 - r;

		cr_assert(WAIT_FOR(n, n->frames[peer] == COUNT && n->acks[peer] == COUNT, WAIT_MS),
			  "rank %u: %llu of %d frames and %llu of %d acks after %lld ms: stuck", r,
			  (unsigned long long)LOCKED(n, n->frames[peer]), COUNT,
			  (unsigned long long)LOCKED(n, n->acks[peer]), COUNT,
			  (long long)(tn_now_ms() - t0));
	}
	for (uint32_t r = 0; r < 2; r++) {
		pthread_join(args[r].thread, NULL);
		cr_expect_eq(args[r].errors, 0);
		assert_clean(&nodes[r]);
	}
	cluster_down(nodes, 2);
}

/*
 * The buffers follow the traffic (transport/tcp/mem.c, docs/architecture.md
 * "Memory"): a burst of 1 MiB frames fills the send log, its reuse pool and
 * the receive buffer; once it is over, a trickle of small frames holds no
 * more than the few chunks it has in flight, and an idle pair holds
 * nothing. Before the trim, the pool kept up to 4 MiB and the receive
 * buffer 1.25 MiB per connection for good.
 */
#define MEM_TRICKLE_MAX (256u << 10) /* 4 chunks of 64 KiB: log, pool, rbuf pages */

/* the most one of the @world nodes holds in its buffers now */
static size_t mem_held_max(struct tnode *nodes, int world)
{
	size_t most = 0;

	for (int r = 0; r < world; r++) {
		size_t h = nodes[r].ops->mem_held(nodes[r].tp);

		if (h > most)
			most = h;
	}
	return most;
}

/* wait until both nodes hold at most @bound; Return: what they held last */
static size_t mem_wait_below(struct tnode *nodes, size_t bound, int ms)
{
	int64_t end = tn_now_ms() + ms;
	size_t held;

	while ((held = mem_held_max(nodes, 2)) > bound && tn_now_ms() < end)
		usleep(5000);
	return held;
}

TP_TEST(buffers_follow_the_traffic)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		COUNT = 24,
		LEN = 1 << 20,
		TRICKLE = 100 /* frames, one every 5 ms */
	};
	struct tn_flood burst;
	struct tnode nodes[2];
	size_t peak = 0, held;
	int64_t t0;
	uint32_t seq;

	if (!ops->mem_held)
		cr_skip_test("the %s transport does not report its buffers", ops->name);
	cluster_up(nodes, ops, 2, 0);
	nodes[1].echo = 1;
	t0 = tn_now_ms();
	burst = (struct tn_flood){ .n = &nodes[0], .dst = 1, .count = COUNT, .len = LEN };
	cr_assert_eq(pthread_create(&burst.thread, NULL, tn_flood_main, &burst), 0);
	while (!WAIT_FOR(&nodes[0], nodes[0].acks[1] == COUNT, 1)) {
		held = mem_held_max(nodes, 2);
		if (held > peak)
			peak = held;
		cr_assert_lt(tn_now_ms() - t0, WAIT_MS, "the burst is stuck: %llu of %d acks",
			     (unsigned long long)LOCKED(&nodes[0], nodes[0].acks[1]), COUNT);
	}
	pthread_join(burst.thread, NULL);
	cr_assert_eq(burst.errors, 0);
	cr_assert_geq(peak, (size_t)LEN, "the burst's buffers were never seen: %zu bytes at most",
		      peak);

	/* a trickle: what is in flight is a frame or two */
	seq = LOCKED(&nodes[1], nodes[1].next_seq[0][3]);
	for (int i = 0; i < TRICKLE; i++) {
		cr_assert_eq(send_frame(&nodes[0], 1, 3, seq + (uint32_t)i, 64), 0);
		usleep(5000);
	}
	held = mem_held_max(nodes, 2);
	cr_expect(held <= MEM_TRICKLE_MAX,
		  "%s: %zu bytes held %d ms into a trickle of 64-byte frames, after a burst "
		  "that peaked at %zu",
		  ops->name, held, TRICKLE * 5, peak);

	/* idle: nothing */
	held = mem_wait_below(nodes, 0, 3000);
	cr_expect_eq(held, 0, "%s: %zu bytes held 3 s after the traffic stopped", ops->name, held);
	cr_assert(WAIT_FOR(&nodes[1], nodes[1].frames[0] == COUNT + TRICKLE, WAIT_MS));
	for (int r = 0; r < 2; r++)
		assert_clean(&nodes[r]);
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

	t0 = tn_now_ms();
	for (uint32_t i = 1; i <= COUNT; i++)
		cr_assert_eq(send_frame(&nodes[0], 1, 0, i, LEN), 0);
	took = tn_now_ms() - t0;

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
 * Its close in the middle of a frame is a lost link to rank 1, which waits
 * FERRY_RECONNECT_MS (1 s) for a redial that never comes (rank 3 has no
 * address to probe) and then fails it.
 */
TP_TEST(a_peer_sending_bad_frames_is_dropped_alone)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint64_t cid = cluster_id_for_test();
	struct connect_arg args[3];
	struct tnode nodes[4];
	int fds[3];
	uint8_t buf[2 * 64];

	_Static_assert(sizeof(buf) >= HS_LEN, "the handshake fits");

	tp_require_tcp(ops);
	for (uint32_t r = 0; r < 3; r++)
		cr_assert_eq(tnode_init(&nodes[r], ops, r, 4, cid, TIMEOUT_MS, 0), 0);
	memset(&nodes[3], 0, sizeof(nodes[3]));
	nodes[3].addr_len = 1; /* rank 3 dials everyone: its blob is never used */
	for (uint32_t r = 0; r < 3; r++)
		connect_start(&args[r], &nodes[r], nodes);

	for (uint32_t v = 0; v < 3; v++) {
		uint8_t theirs[HS_LEN];
		struct ferry_msg_hello h;

		fds[v] = raw_dial(&nodes[v]);
		cr_assert_geq(fds[v], 0);
		raw_handshake(buf, cid, 3, 4);
		raw_write(fds[v], buf, HS_LEN);
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
	tn_frame_fill(buf, FERRY_MSG_OP, 32, 3, 0);
	tn_frame_fill(buf + 32, FERRY_MSG_OP, 32, 3, 1);
	buf[32] ^= 0xff;
	raw_write(fds[0], buf, 64);

	/* to rank 1: a good frame, then 24 bytes of a 48-byte one, then close */
	tn_frame_fill(buf, FERRY_MSG_OP, 32, 3, 0);
	tn_frame_fill(buf + 32, FERRY_MSG_OP, 48, 3, 1);
	raw_write(fds[1], buf, 32 + 24);
	close(fds[1]);

	/* to rank 2: a good frame, then one that claims to come from rank 1 */
	tn_frame_fill(buf, FERRY_MSG_OP, 32, 3, 0);
	tn_frame_fill(buf + 32, FERRY_MSG_OP, 32, 1, 1);
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

/*
 * Sessions (tcp): rank 3 is a fake again. It connects to ranks 0, 1 and 2,
 * sends each one frame, closes all three links, and dials again: to rank 0
 * as another process (a new incarnation), to rank 1 with a count of frames
 * delivered that rank 1 never sent, and to rank 2 as itself, in order. Rank 0
 * turns it away and fails it once FERRY_RECONNECT_MS passed; rank 1 fails it
 * for a protocol error; rank 2 answers that it delivered the one frame, and
 * the session goes on: the next frame arrives, and rank 3 is never failed.
 */
TP_TEST(a_redial_resumes_only_its_own_session)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint64_t cid = cluster_id_for_test();
	const uint64_t inc = 0x5eed0001;
	struct connect_arg args[3];
	struct tnode nodes[4];
	uint8_t buf[2 * 64], theirs[HS_LEN];
	struct ferry_msg_resume ans;
	int fds[3];

	tp_require_tcp(ops);
	setenv("FERRY_RECONNECT_MS", "500", 1);
	for (uint32_t r = 0; r < 3; r++)
		cr_assert_eq(tnode_init(&nodes[r], ops, r, 4, cid, TIMEOUT_MS, 0), 0);
	memset(&nodes[3], 0, sizeof(nodes[3]));
	nodes[3].addr_len = 1; /* no address: nobody probes rank 3 */
	for (uint32_t r = 0; r < 3; r++)
		connect_start(&args[r], &nodes[r], nodes);
	for (uint32_t v = 0; v < 3; v++) {
		fds[v] = raw_dial(&nodes[v]);
		cr_assert_geq(fds[v], 0);
		raw_handshake(buf, cid, 3, 4);
		raw_write(fds[v], buf, HS_LEN);
		cr_assert_eq(recv(fds[v], theirs, sizeof(theirs), MSG_WAITALL),
			     (ssize_t)sizeof(theirs), "no handshake from rank %u", v);
	}
	for (uint32_t r = 0; r < 3; r++) {
		connect_join(&args[r], TIMEOUT_MS + 5000);
		cr_assert_eq(args[r].ret, 0, "connect of rank %u: %s", r,
			     ferry_strerror(args[r].ret));
	}
	for (uint32_t v = 0; v < 3; v++) {
		tn_frame_fill(buf, FERRY_MSG_OP, 32, 3, 0);
		raw_write(fds[v], buf, 32);
		cr_assert(WAIT_FOR(&nodes[v], nodes[v].frames[3] == 1, WAIT_MS),
			  "rank %u did not get the first frame", v);
		close(fds[v]);
	}
	usleep(50 * 1000); /* each sees its link lost */

	fds[0] = raw_dial(&nodes[0]);
	cr_assert_geq(fds[0], 0);
	raw_resume(buf, cid, 3, 4, inc + 1, 0, 1);
	raw_write(fds[0], buf, HS_LEN);
	cr_expect(raw_closed_within(fds[0], 5000), "rank 0 resumed another process's session");

	fds[1] = raw_dial(&nodes[1]);
	cr_assert_geq(fds[1], 0);
	raw_resume(buf, cid, 3, 4, inc, 5, 1);
	raw_write(fds[1], buf, HS_LEN);
	cr_expect(raw_closed_within(fds[1], 5000), "rank 1 resumed at a frame it never sent");

	fds[2] = raw_dial(&nodes[2]);
	cr_assert_geq(fds[2], 0);
	raw_resume(buf, cid, 3, 4, inc, 0, 1);
	raw_write(fds[2], buf, HS_LEN);
	cr_assert_eq(recv(fds[2], theirs, sizeof(theirs), MSG_WAITALL), (ssize_t)sizeof(theirs),
		     "rank 2 did not answer the redial");
	memcpy(&ans, theirs + HELLO_LEN + HDR_LEN, sizeof(ans));
	cr_expect_eq(ans.delivered, 1, "rank 2 says it delivered %llu frames of rank 3, not 1",
		     (unsigned long long)ans.delivered);
	cr_expect_eq(ans.sent, 0, "rank 2 says it sent %llu frames to rank 3, not 0",
		     (unsigned long long)ans.sent);
	tn_frame_fill(buf, FERRY_MSG_OP, 32, 3, 1);
	raw_write(fds[2], buf, 32);
	cr_assert(WAIT_FOR(&nodes[2], nodes[2].frames[3] == 2, WAIT_MS),
		  "rank 2 did not deliver the frame after the resume");

	cr_assert(WAIT_FOR(&nodes[0], nodes[0].failed[3] > 0, WAIT_MS), "rank 0 kept rank 3");
	cr_expect_eq(LOCKED(&nodes[0], nodes[0].failed_err[3]), -FERRY_E_PEER);
	cr_assert(WAIT_FOR(&nodes[1], nodes[1].failed[3] > 0, WAIT_MS), "rank 1 kept rank 3");
	cr_expect_eq(LOCKED(&nodes[1], nodes[1].failed_err[3]), -FERRY_E_PROTO);
	usleep(700 * 1000); /* past FERRY_RECONNECT_MS: rank 2's session stands */
	cr_expect_eq(LOCKED(&nodes[2], nodes[2].failed[3]), 0, "rank 2 failed the resumed peer");
	cr_expect_eq(log_count("rank 0 rejected a connection", "another process"), 1);
	cr_expect_eq(log_count("rank 3 resumes its session with rank 1 at frame 6", NULL), 1);
	cr_expect_eq(log_count("rank 0: rank 3 did not come back within 500 ms", NULL), 1);
	cr_expect_eq(log_count("rank 2: resumed the session with rank 3", NULL), 1);
	for (uint32_t v = 0; v < 3; v++) {
		cr_expect_eq(LOCKED(&nodes[v],
				    nodes[v].failed[0] + nodes[v].failed[1] + nodes[v].failed[2]),
			     0, "rank %u reported a live peer failed", v);
		assert_clean(&nodes[v]);
	}
	close(fds[0]);
	close(fds[1]);
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

struct eager_arg {
	struct tnode *n, *all;
	uint32_t count;
	int ret, errors;
	pthread_t thread;
};

static void *eager_main(void *arg)
{
	struct eager_arg *a = arg;
	const void *addrs[MAX_NODES];
	size_t lens[MAX_NODES];

	for (uint32_t r = 0; r < a->n->world; r++) {
		addrs[r] = a->all[r].addr;
		lens[r] = a->all[r].addr_len;
	}
	a->ret = a->n->ops->connect(a->n->tp, addrs, lens);
	for (uint32_t i = 0; !a->ret && i < a->count; i++)
		if (send_frame(a->n, 0, 0, i, i % 2 ? 64 : (64 << 10) + 8))
			a->errors++;
	return NULL;
}

/*
 * The dialing side's connect() can return before the accepting side has seen
 * the connection stand; what it sends at once must still arrive, all of it.
 */
TP_TEST(frames_sent_as_soon_as_connect_returns_arrive)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		ROUNDS = 8,
		COUNT = 40
	};

	for (int round = 0; round < ROUNDS; round++) {
		uint64_t cid = cluster_id_for_test() + (uint64_t)round;
		struct connect_arg a0;
		struct eager_arg a1;
		struct tnode nodes[2];

		for (uint32_t r = 0; r < 2; r++)
			cr_assert_eq(tnode_init(&nodes[r], ops, r, 2, cid, TIMEOUT_MS, 0), 0);
		a1 = (struct eager_arg){ .n = &nodes[1], .all = nodes, .count = COUNT };
		connect_start(&a0, &nodes[0], nodes);
		cr_assert_eq(pthread_create(&a1.thread, NULL, eager_main, &a1), 0);
		pthread_join(a1.thread, NULL);
		connect_join(&a0, TIMEOUT_MS + 5000);
		cr_assert_eq(a0.ret, 0, "round %d: connect of rank 0: %s", round,
			     ferry_strerror(a0.ret));
		cr_assert_eq(a1.ret, 0, "round %d: connect of rank 1: %s", round,
			     ferry_strerror(a1.ret));
		cr_expect_eq(a1.errors, 0);
		cr_assert(WAIT_FOR(&nodes[0], nodes[0].frames[1] == COUNT, WAIT_MS),
			  "round %d: rank 0 got %llu of %d frames sent right after connect", round,
			  (unsigned long long)LOCKED(&nodes[0], nodes[0].frames[1]), COUNT);
		assert_clean(&nodes[0]);
		cluster_down(nodes, 2);
	}
}

/* ---- one-sided operations (transports with CAP_READ and CAP_WRITE) ------ */

/*
 * on_rdma_done runs on the progress thread, except with the loop transport,
 * which completes inline on the posting thread (transport.h: "loop: inline")
 */
static void rdma_check_threads(struct tnode *n)
{
	if (!strcmp(n->ops->name, "loop"))
		return;
	cr_expect_eq(LOCKED(n, n->rdma_off_thread), 0,
		     "rank %u: %d on_rdma_done calls off the progress thread", n->rank,
		     LOCKED(n, n->rdma_off_thread));
}

static void tp_require_onesided(const struct ferry_tp_ops *ops)
{
	if (!(ops->caps & FERRY_TP_CAP_READ) || !(ops->caps & FERRY_TP_CAP_WRITE) || !ops->read ||
	    !ops->write || !ops->mem_reg || !ops->mem_dereg)
		cr_skip_test("the %s transport has no one-sided read and write", ops->name);
}

/* a buffer of @n registered with its transport */
struct tbuf {
	uint8_t *mem;
	size_t len;
	struct ferry_tp_mr *mr;
};

static void tbuf_reg(struct tnode *n, struct tbuf *b, size_t len, unsigned access)
{
	b->len = len;
	/* aligned_alloc wants a multiple of the alignment */
	b->mem = aligned_alloc(4096, (len + 4095) & ~(size_t)4095);
	cr_assert_not_null(b->mem);
	memset(b->mem, 0, len);
	b->mr = calloc(1, n->ops->mr_size);
	cr_assert_not_null(b->mr);
	cr_assert_eq(n->ops->mem_reg(n->tp, b->mem, len, access, b->mr), 0,
		     "rank %u: mem_reg of %zu bytes failed", n->rank, len);
	cr_assert_eq(b->mr->addr, (void *)b->mem);
	cr_assert_eq(b->mr->len, len);
}

static void tbuf_dereg(struct tnode *n, struct tbuf *b)
{
	n->ops->mem_dereg(n->tp, b->mr);
	free(b->mr);
	free(b->mem);
}

/*
 * Rank 0 reads rank 1's registered buffer, writes a slice of it and sends a
 * frame right behind the write: the frame must find the data in place (a
 * relocation hands a slot over this way). Rank 1 also reads its own buffer.
 */
TP_TEST(one_sided_read_and_write_reach_registered_memory)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		LEN = 64 << 10,
		WOFF = 4096,
		WLEN = 8192
	};
	struct rdma_slot rd = { 0 }, wr = { 0 }, srd = { 0 };
	struct tbuf remote, local, self;
	struct tnode nodes[2];
	uint8_t *want = malloc(WLEN);

	tp_require_onesided(ops);
	cr_assert_not_null(want);
	cluster_up(nodes, ops, 2, 0);
	tbuf_reg(&nodes[1], &remote, LEN,
		 FERRY_TP_ACCESS_REMOTE_READ | FERRY_TP_ACCESS_REMOTE_WRITE);
	tbuf_reg(&nodes[0], &local, LEN, 0);
	tbuf_reg(&nodes[1], &self, LEN, 0);
	for (size_t i = 0; i < LEN; i++)
		remote.mem[i] = tn_pattern(1, 99, i);

	cr_assert_eq(ops->read(nodes[0].tp, 1, local.mem, local.mr, (uintptr_t)remote.mem,
			       remote.mr->rkey, LEN, &rd),
		     0);
	cr_assert(WAIT_FOR(&nodes[0], rd.done == 1, WAIT_MS), "the read never completed");
	cr_expect_eq(rd.status, 0, "the read failed: %s", ferry_strerror(rd.status));
	cr_expect_eq(memcmp(local.mem, remote.mem, LEN), 0, "the read brought other bytes");

	for (size_t i = 0; i < WLEN; i++)
		want[i] = local.mem[i] = tn_pattern(0, 7, i);
	pthread_mutex_lock(&nodes[1].lock);
	nodes[1].watch = remote.mem + WOFF;
	nodes[1].watch_want = want;
	nodes[1].watch_len = WLEN;
	pthread_mutex_unlock(&nodes[1].lock);
	cr_assert_eq(ops->write(nodes[0].tp, 1, local.mem, local.mr, (uintptr_t)remote.mem + WOFF,
				remote.mr->rkey, WLEN, &wr),
		     0);
	cr_assert_eq(send_frame(&nodes[0], 1, 0, 0, 64), 0);
	cr_assert(WAIT_FOR(&nodes[0], wr.done == 1, WAIT_MS), "the write never completed");
	cr_expect_eq(wr.status, 0, "the write failed: %s", ferry_strerror(wr.status));
	cr_assert(WAIT_FOR(&nodes[1], nodes[1].frames[0] == 1, WAIT_MS), "the frame never came");
	cr_expect_eq(LOCKED(&nodes[1], nodes[1].watch_bad), 0,
		     "the frame sent after the write arrived before the written data");
	cr_expect_eq(LOCKED(&nodes[1], nodes[1].watch_good), 1);
	cr_expect_eq(memcmp(remote.mem + WOFF, want, WLEN), 0, "the write left other bytes");
	cr_expect_eq(remote.mem[WOFF - 1], tn_pattern(1, 99, WOFF - 1), "the write spilled before");
	cr_expect_eq(remote.mem[WOFF + WLEN], tn_pattern(1, 99, WOFF + WLEN),
		     "the write spilled after");
	pthread_mutex_lock(&nodes[1].lock);
	nodes[1].watch = NULL;
	pthread_mutex_unlock(&nodes[1].lock);

	/* a node's one-sided read of its own memory completes like any other */
	cr_assert_eq(ops->read(nodes[1].tp, 1, self.mem, self.mr, (uintptr_t)remote.mem,
			       remote.mr->rkey, LEN, &srd),
		     0);
	cr_assert(WAIT_FOR(&nodes[1], srd.done == 1, WAIT_MS),
		  "the read of itself never completed");
	cr_expect_eq(srd.status, 0);
	cr_expect_eq(memcmp(self.mem, remote.mem, LEN), 0);

	usleep(100 * 1000);
	cr_expect_eq(rd.done + wr.done + srd.done, 3, "a completion ran twice");
	for (int r = 0; r < 2; r++) {
		cr_expect_eq(LOCKED(&nodes[r], nodes[r].rdma_errs), 0);
		rdma_check_threads(&nodes[r]);
		assert_clean(&nodes[r]);
	}
	tbuf_dereg(&nodes[1], &self);
	tbuf_dereg(&nodes[0], &local);
	tbuf_dereg(&nodes[1], &remote);
	free(want);
	cluster_down(nodes, 2);
}

/* ---- WRITE with immediate (transport.h, FERRY_TP_CAP_WRITE_IMM) ------------ */

static void tp_require_write_imm(const struct ferry_tp_ops *ops)
{
	if (!(ops->caps & FERRY_TP_CAP_WRITE_IMM) || !ops->write_imm || !ops->mem_reg)
		cr_skip_test("the %s transport has no WRITE with immediate", ops->name);
}

/* @n slices of @stride bytes of @b, slice i holding tn_pattern(@src, @tag0 + i, .) */
static void imm_fill(struct tbuf *b, uint32_t src, uint32_t tag0, size_t n, size_t stride)
{
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < stride; j++)
			b->mem[i * stride + j] = tn_pattern(src, tag0 + (uint32_t)i, j);
}

/*
 * Rank 0 interleaves frames and WRITEs with immediate to rank 1: each notice
 * comes after the frames sent before it and before those sent after it,
 * its bytes are in place when it comes, and each write_imm completes once,
 * with 0, and only after rank 1 took it.
 */
TP_TEST(a_write_imm_lands_first_and_keeps_its_place_among_frames)
{
	enum {
		N = 64,
		STRIDE = 4096
	};
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct rdma_slot slots[N];
	struct tbuf remote, local;
	struct tnode nodes[2];

	tp_require_write_imm(ops);
	memset(slots, 0, sizeof(slots));
	cluster_up(nodes, ops, 2, 0);
	tbuf_reg(&nodes[1], &remote, N * STRIDE, FERRY_TP_ACCESS_REMOTE_WRITE);
	tbuf_reg(&nodes[0], &local, N * STRIDE, 0);
	imm_fill(&local, 0, 0, N, STRIDE);
	pthread_mutex_lock(&nodes[1].lock);
	nodes[1].imm_base = remote.mem;
	nodes[1].imm_stride = STRIDE;
	pthread_mutex_unlock(&nodes[1].lock);
	for (uint32_t i = 0; i < N; i++) {
		slots[i].seen_ptr = &nodes[1].imms;
		cr_assert_eq(send_frame(&nodes[0], 1, 0, i, 64 + 8 * (i % 5)), 0);
		cr_assert_eq(ops->write_imm(nodes[0].tp, 1, local.mem + i * STRIDE, local.mr,
					    (uintptr_t)remote.mem + i * STRIDE, remote.mr->rkey,
					    STRIDE, i, &slots[i]),
			     0, "write_imm %u was refused", i);
	}
	cr_assert_eq(send_frame(&nodes[0], 1, 0, N, 64), 0);
	cr_assert(WAIT_FOR(&nodes[1], nodes[1].frames[0] == N + 1 && nodes[1].imms == N, WAIT_MS),
		  "rank 1 got %llu frames and %llu notices of %u",
		  (unsigned long long)LOCKED(&nodes[1], nodes[1].frames[0]),
		  (unsigned long long)LOCKED(&nodes[1], nodes[1].imms), N + 1);
	pthread_mutex_lock(&nodes[1].lock);
	for (uint32_t i = 0; i < N; i++) {
		const struct tn_imm *e = &nodes[1].imm_log[i];

		cr_expect_eq(e->src, 0);
		cr_expect_eq(e->tag, i, "notice %u carried tag %u", i, e->tag);
		cr_expect_eq(e->frames_before, i + 1,
			     "notice %u came after %llu frames, not after the %u sent before it", i,
			     (unsigned long long)e->frames_before, i + 1);
	}
	cr_expect_eq(nodes[1].imm_bad, 0, "%d notices came before their bytes", nodes[1].imm_bad);
	pthread_mutex_unlock(&nodes[1].lock);
	cr_assert(WAIT_FOR(&nodes[0], nodes[0].rdma_done == N, WAIT_MS),
		  "%llu of %u write_imms completed",
		  (unsigned long long)LOCKED(&nodes[0], nodes[0].rdma_done), N);
	usleep(100 * 1000);
	pthread_mutex_lock(&nodes[0].lock);
	for (uint32_t i = 0; i < N; i++) {
		cr_expect_eq(slots[i].done, 1, "write_imm %u completed %d times", i, slots[i].done);
		cr_expect_eq(slots[i].status, 0, "write_imm %u: %s", i,
			     ferry_strerror(slots[i].status));
		cr_expect(slots[i].seen >= i + 1,
			  "write_imm %u completed when rank 1 had taken %llu notices", i,
			  (unsigned long long)slots[i].seen);
	}
	pthread_mutex_unlock(&nodes[0].lock);
	cr_expect_eq(memcmp(remote.mem, local.mem, N * STRIDE), 0);
	for (int r = 0; r < 2; r++)
		assert_clean(&nodes[r]);
	tbuf_dereg(&nodes[0], &local);
	tbuf_dereg(&nodes[1], &remote);
	cluster_down(nodes, 2);
}

struct imm_writer {
	struct tnode *n;
	struct tbuf *local;
	uint64_t raddr, rkey;
	uint32_t tag0, count;
	struct rdma_slot *slots;
	int errors;
	pthread_t thread;
};

static void *imm_writer_main(void *arg)
{
	struct imm_writer *w = arg;

	for (uint32_t i = 0; i < w->count; i++) {
		size_t off = (size_t)(w->tag0 + i) * 1024;

		if (w->n->ops->write_imm(w->n->tp, 1, w->local->mem + off, w->local->mr,
					 w->raddr + off, w->rkey, 1024, w->tag0 + i, &w->slots[i]))
			w->errors++;
	}
	return NULL;
}

/*
 * Ranks 0 and 2 each post 1000 WRITEs with immediate of 1 KiB to rank 1 at
 * once, far more than any window of credits: every one lands once, in each
 * writer's order, its bytes in place, and completes once with 0.
 */
TP_TEST(many_write_imms_in_flight_from_two_writers_arrive_once_in_order)
{
	enum {
		PER = 1000,
		ALL = 2 * PER
	};
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct rdma_slot *slots = calloc(ALL, sizeof(*slots));
	struct imm_writer w[2];
	struct tbuf remote, local[2];
	struct tnode nodes[3];
	uint32_t next[2] = { 0, PER };

	tp_require_write_imm(ops);
	cr_assert_not_null(slots);
	cluster_up(nodes, ops, 3, 0);
	tbuf_reg(&nodes[1], &remote, ALL * 1024, FERRY_TP_ACCESS_REMOTE_WRITE);
	for (int k = 0; k < 2; k++) {
		struct tnode *n = &nodes[k * 2];

		tbuf_reg(n, &local[k], ALL * 1024, 0);
		imm_fill(&local[k], n->rank, 0, ALL, 1024);
		w[k] = (struct imm_writer){ .n = n,
					    .local = &local[k],
					    .raddr = (uintptr_t)remote.mem,
					    .rkey = remote.mr->rkey,
					    .tag0 = (uint32_t)k * PER,
					    .count = PER,
					    .slots = slots + k * PER };
	}
	pthread_mutex_lock(&nodes[1].lock);
	nodes[1].imm_base = remote.mem;
	nodes[1].imm_stride = 1024;
	pthread_mutex_unlock(&nodes[1].lock);
	for (int k = 0; k < 2; k++)
		cr_assert_eq(pthread_create(&w[k].thread, NULL, imm_writer_main, &w[k]), 0);
	for (int k = 0; k < 2; k++) {
		pthread_join(w[k].thread, NULL);
		cr_expect_eq(w[k].errors, 0, "rank %u: %d write_imms refused", w[k].n->rank,
			     w[k].errors);
	}
	cr_assert(WAIT_FOR(&nodes[1], nodes[1].imms == ALL, WAIT_MS),
		  "rank 1 took %llu notices of %u",
		  (unsigned long long)LOCKED(&nodes[1], nodes[1].imms), ALL);
	for (int k = 0; k < 2; k++)
		cr_assert(WAIT_FOR(&nodes[k * 2], nodes[k * 2].rdma_done == PER, WAIT_MS),
			  "rank %d: %llu of %u write_imms completed", k * 2,
			  (unsigned long long)LOCKED(&nodes[k * 2], nodes[k * 2].rdma_done), PER);
	usleep(100 * 1000);
	pthread_mutex_lock(&nodes[1].lock);
	for (uint32_t i = 0; i < ALL; i++) {
		const struct tn_imm *e = &nodes[1].imm_log[i];
		int k = e->src == 2;

		if (e->src != 0 && e->src != 2) {
			cr_expect(0, "notice %u from rank %u", i, e->src);
			continue;
		}
		cr_expect_eq(e->tag, next[k], "rank %u's notice with tag %u came where %u was due",
			     e->src, e->tag, next[k]);
		next[k] = e->tag + 1;
	}
	cr_expect_eq(nodes[1].imm_bad, 0, "%d notices came before their bytes", nodes[1].imm_bad);
	pthread_mutex_unlock(&nodes[1].lock);
	for (uint32_t i = 0; i < ALL; i++) {
		cr_expect_eq(slots[i].done, 1, "write_imm %u completed %d times", i, slots[i].done);
		cr_expect_eq(slots[i].status, 0, "write_imm %u: %s", i,
			     ferry_strerror(slots[i].status));
	}
	for (int r = 0; r < 3; r++)
		assert_clean(&nodes[r]);
	for (int k = 0; k < 2; k++)
		tbuf_dereg(&nodes[k * 2], &local[k]);
	tbuf_dereg(&nodes[1], &remote);
	free(slots);
	cluster_down(nodes, 3);
}

/*
 * A write_imm that its receiver has not taken (its progress thread held in
 * a handler) completes only when the writer drops that peer, with
 * -FERRY_E_PEER, once; nothing completes it again when the receiver moves on.
 * Another, left unacknowledged at the writer's fini, completes there with
 * -FERRY_E_CLOSED, and no handler runs after fini.
 */
TP_TEST(a_write_imm_to_a_failed_peer_completes_with_an_error)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct rdma_slot slot = { 0 }, late = { 0 };
	struct tbuf remote, local;
	struct tnode nodes[3];

	tp_require_write_imm(ops);
	cluster_up(nodes, ops, 3, 0);
	tbuf_reg(&nodes[1], &remote, 4096, FERRY_TP_ACCESS_REMOTE_WRITE);
	tbuf_reg(&nodes[0], &local, 4096, 0);
	pthread_mutex_lock(&nodes[1].lock);
	nodes[1].gate_closed = 1;
	pthread_mutex_unlock(&nodes[1].lock);
	cr_assert_eq(send_frame(&nodes[0], 1, 0, 0, 64), 0);
	cr_assert(WAIT_FOR(&nodes[1], nodes[1].gated, WAIT_MS), "rank 1 never took the frame");
	cr_assert_eq(ops->write_imm(nodes[0].tp, 1, local.mem, local.mr, (uintptr_t)remote.mem,
				    remote.mr->rkey, 4096, 7, &slot),
		     0);
	usleep(100 * 1000);
	cr_expect_eq(LOCKED(&nodes[0], slot.done), 0,
		     "the write_imm completed before its receiver took it");
	ops->drop(nodes[0].tp, 1);
	cr_assert(WAIT_FOR(&nodes[0], slot.done == 1, WAIT_MS),
		  "a write_imm to a dropped peer never completed");
	cr_expect_eq(LOCKED(&nodes[0], slot.status), -FERRY_E_PEER, "it completed with %s",
		     ferry_strerror(LOCKED(&nodes[0], slot.status)));
	pthread_mutex_lock(&nodes[1].lock);
	nodes[1].gate_closed = 0;
	pthread_cond_broadcast(&nodes[1].cond);
	pthread_mutex_unlock(&nodes[1].lock);
	usleep(200 * 1000);
	cr_expect_eq(LOCKED(&nodes[0], slot.done), 1, "it completed %d times",
		     LOCKED(&nodes[0], slot.done));

	/* rank 2 held the same way, then rank 0 closes */
	tbuf_dereg(&nodes[1], &remote);
	tbuf_reg(&nodes[2], &remote, 4096, FERRY_TP_ACCESS_REMOTE_WRITE);
	pthread_mutex_lock(&nodes[2].lock);
	nodes[2].gate_closed = 1;
	pthread_mutex_unlock(&nodes[2].lock);
	cr_assert_eq(send_frame(&nodes[0], 2, 0, 0, 64), 0);
	cr_assert(WAIT_FOR(&nodes[2], nodes[2].gated, WAIT_MS), "rank 2 never took the frame");
	cr_assert_eq(ops->write_imm(nodes[0].tp, 2, local.mem, local.mr, (uintptr_t)remote.mem,
				    remote.mr->rkey, 4096, 8, &late),
		     0);
	tn_fini(&nodes[0]);
	cr_expect_eq(late.done, 1, "a write_imm left at fini completed %d times", late.done);
	cr_expect_eq(late.status, -FERRY_E_CLOSED, "it completed with %s",
		     ferry_strerror(late.status));
	cr_expect_eq(nodes[0].after_fini, 0);
	pthread_mutex_lock(&nodes[2].lock);
	nodes[2].gate_closed = 0;
	pthread_cond_broadcast(&nodes[2].cond);
	pthread_mutex_unlock(&nodes[2].lock);
	tbuf_dereg(&nodes[2], &remote);
	free(local.mr); /* its transport is gone: nothing to deregister */
	free(local.mem);
	cluster_down(nodes, 3);
}

/*
 * A WRITE with immediate into memory its receiver did not open to remote
 * writes is refused at the call (loop: -EACCES), or fails its peer once,
 * completing with -FERRY_E_PEER (rdma: the peer's NIC refuses it, and posted
 * again after a reconnection it would be refused again, without end).
 */
TP_TEST(a_write_imm_into_memory_not_offered_is_refused_or_fails_the_peer)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	struct rdma_slot slot = { 0 };
	struct tbuf remote, local;
	struct tnode nodes[2];
	int rc;

	tp_require_write_imm(ops);
	cluster_up(nodes, ops, 2, 0);
	tbuf_reg(&nodes[1], &remote, 4096, FERRY_TP_ACCESS_REMOTE_READ);
	tbuf_reg(&nodes[0], &local, 4096, 0);
	rc = ops->write_imm(nodes[0].tp, 1, local.mem, local.mr, (uintptr_t)remote.mem,
			    remote.mr->rkey, 4096, 3, &slot);
	if (rc) {
		cr_expect_eq(rc, -EACCES, "refused with %s", ferry_strerror(rc));
	} else {
		cr_assert(WAIT_FOR(&nodes[0], slot.done == 1 && nodes[0].failed[1] == 1, WAIT_MS),
			  "the refused write_imm completed %d times, its peer failed %d times",
			  LOCKED(&nodes[0], slot.done), LOCKED(&nodes[0], nodes[0].failed[1]));
		cr_expect_eq(LOCKED(&nodes[0], slot.status), -FERRY_E_PEER, "it completed with %s",
			     ferry_strerror(LOCKED(&nodes[0], slot.status)));
		cr_expect_eq(log_count("refused a WRITE with immediate", NULL), 1);
		usleep(300 * 1000);
		cr_expect_eq(LOCKED(&nodes[0], slot.done), 1);
		cr_expect_eq(log_count("resumed the session", NULL), 0,
			     "the session reconnected after a refused WRITE with immediate");
	}
	cr_expect_eq(LOCKED(&nodes[1], nodes[1].imms), 0, "rank 1 took a refused write_imm");
	tbuf_dereg(&nodes[0], &local);
	tbuf_dereg(&nodes[1], &remote);
	cluster_down(nodes, 2);
}

/* take completions on this thread, where the transport can (ops->poll) */
static void tnode_poll(struct tnode *n)
{
	if (!n->ops->poll) {
		usleep(200);
		return;
	}
	tn_in_poll = 1;
	n->ops->poll(n->tp, 0);
	tn_in_poll = 0;
}

/*
 * tcp, FERRY_TCP_WORKER_POLL=1: a thread that waits in poll() takes the frames
 * that arrived and runs on_msg itself when the progress thread is not
 * running handlers; every frame arrives once, in order and intact, and no
 * handler runs on any other thread. Without the variable, poll() runs none.
 * One frame at a time, so the spinning poller and the sleeping progress
 * thread race for each.
 */
TP_TEST(tcp_worker_poll_runs_handlers_on_the_polling_thread)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		N = 300
	};
	struct tnode nodes[2];

	tp_require_tcp(ops);
	for (int on = 0; on < 2; on++) {
		uint32_t seq;
		int polled;

		setenv("FERRY_TCP_WORKER_POLL", on ? "1" : "0", 1);
		cluster_up(nodes, ops, 2, 0);
		unsetenv("FERRY_TCP_WORKER_POLL");
		seq = LOCKED(&nodes[0], nodes[0].next_seq[1][7]);
		for (uint32_t i = 0; i < N; i++) {
			int64_t until = tn_now_ms() + WAIT_MS;
			uint64_t want = i + 1;

			cr_assert_eq(send_frame(&nodes[1], 0, 7, seq + i, 64), 0);
			while (LOCKED(&nodes[0], nodes[0].frames[1]) < want &&
			       tn_now_ms() < until) {
				tn_in_poll = 1;
				ops->poll(nodes[0].tp, 0);
				tn_in_poll = 0;
			}
			cr_assert_eq(LOCKED(&nodes[0], nodes[0].frames[1]), want,
				     "frame %u of %u did not arrive", i + 1, N);
		}
		polled = LOCKED(&nodes[0], nodes[0].msgs_polled);
		if (on)
			cr_expect_gt(polled, 0, "no frame of %d was handled by the polling thread",
				     N);
		else
			cr_expect_eq(polled, 0, "poll() ran %d handlers with the poll off", polled);
		assert_clean(&nodes[0]);
		assert_clean(&nodes[1]);
		cluster_down(nodes, 2);
	}
}

/*
 * read_v: runs of reads to one peer leave under one doorbell; every read that
 * was posted completes once, with its bytes, whether the progress thread or a
 * poll() on the waiting thread takes its completion; a bad entry is refused
 * alone, and the batch's return names it.
 */
TP_TEST(read_v_completes_every_posted_read_once)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		N = 600,
		SLICE = 192,
		RLEN = 64 << 10,
		SLOTS = RLEN / SLICE
	};
	struct rdma_slot *slots = calloc(N, sizeof(*slots));
	struct ferry_tp_rd *rds = calloc(N, sizeof(*rds));
	uint8_t *bad = calloc(N, 1);
	struct tbuf remote[3], local;
	struct tnode nodes[3];
	uint32_t i = 0, nbad = 0, seed = 12345;
	int64_t end;

	tp_require_onesided(ops);
	if (!ops->read_v)
		cr_skip_test("the %s transport has no read_v", ops->name);
	cr_assert(slots && rds && bad);
	cluster_up(nodes, ops, 3, 0);
	for (uint32_t r = 0; r < 3; r++) {
		tbuf_reg(&nodes[r], &remote[r], RLEN, FERRY_TP_ACCESS_REMOTE_READ);
		for (size_t b = 0; b < RLEN; b++)
			remote[r].mem[b] = tn_pattern(r, (uint32_t)(b / SLICE), b);
	}
	tbuf_reg(&nodes[0], &local, (size_t)N * SLICE, 0);

	/* batches of 1 to 80 reads; runs of one destination (ourselves included),
	 * and now and then an entry with a destination out of range */
	while (i < N) {
		uint32_t batch = 1 + (seed = seed * 1103515245u + 12345u) % 80, first = i;
		int want = 0, got;

		if (batch > N - i)
			batch = N - i;
		for (; i < first + batch; i++) {
			uint32_t dst = (seed >> 8) % 3;
			size_t off = (size_t)(i * 7919u % SLOTS) * SLICE;

			if (i % 7 == 0)
				seed = seed * 1103515245u + 12345u; /* a new run */
			rds[i] = (struct ferry_tp_rd){
				.dst = dst,
				.local = local.mem + (size_t)i * SLICE,
				.lmr = local.mr,
				.raddr = (uintptr_t)remote[dst].mem + off,
				.rkey = remote[dst].mr->rkey,
				.len = SLICE,
				.ctx = &slots[i],
				.status = 1,
			};
			if (i % 97 == 50) {
				rds[i].dst = 3; /* world is 3 */
				bad[i] = 1;
				nbad++;
				if (!want)
					want = -EINVAL;
			}
		}
		got = ops->read_v(nodes[0].tp, rds + first, batch);
		cr_expect_eq(got, want, "read_v of %u reads returned %d, not %d", batch, got, want);
		for (uint32_t k = first; k < first + batch; k++)
			cr_expect_eq(rds[k].status, bad[k] ? -EINVAL : 0,
				     "read %u: status %d after read_v", k, rds[k].status);
	}
	cr_assert_gt(nbad, 0);

	end = tn_now_ms() + WAIT_MS;
	while (LOCKED(&nodes[0], nodes[0].rdma_done) < (uint64_t)(N - nbad) && tn_now_ms() < end)
		tnode_poll(&nodes[0]);
	cr_assert_eq(LOCKED(&nodes[0], nodes[0].rdma_done), (uint64_t)(N - nbad),
		     "%llu of %u reads completed",
		     (unsigned long long)LOCKED(&nodes[0], nodes[0].rdma_done), N - nbad);
	usleep(100 * 1000);
	for (uint32_t k = 0; k < N; k++) {
		size_t off = (size_t)(k * 7919u % SLOTS) * SLICE;

		if (bad[k]) {
			cr_expect_eq(slots[k].done, 0, "refused read %u completed", k);
			continue;
		}
		cr_expect_eq(slots[k].done, 1, "read %u completed %d times", k, slots[k].done);
		cr_expect_eq(slots[k].status, 0, "read %u: %s", k, ferry_strerror(slots[k].status));
		cr_expect_eq(memcmp(local.mem + (size_t)k * SLICE, remote[rds[k].dst].mem + off,
				    SLICE),
			     0, "read %u (from rank %u) brought other bytes", k, rds[k].dst);
	}
	cr_log_info("%s: %d of %u completions taken inside poll()", ops->name,
		    LOCKED(&nodes[0], nodes[0].rdma_polled), N - nbad);
	cr_expect_eq(LOCKED(&nodes[0], nodes[0].rdma_errs), 0);
	rdma_check_threads(&nodes[0]);
	for (uint32_t r = 0; r < 3; r++)
		assert_clean(&nodes[r]);
	tbuf_dereg(&nodes[0], &local);
	for (uint32_t r = 0; r < 3; r++)
		tbuf_dereg(&nodes[r], &remote[r]);
	free(bad);
	free(rds);
	free(slots);
	cluster_down(nodes, 3);
}

/* more reads than a queue pair holds, posted back to back, with frames among them */
TP_TEST(many_reads_posted_back_to_back_all_complete)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		N = 2000,
		SLICE = 256,
		RLEN = 1 << 20,
		SLOTS = RLEN / SLICE
	};
	struct rdma_slot *slots = calloc(N, sizeof(*slots));
	struct tbuf remote, local;
	struct tnode nodes[2];
	uint32_t frames = 0;
	int bad = 0;

	tp_require_onesided(ops);
	cr_assert_not_null(slots);
	cluster_up(nodes, ops, 2, 0);
	tbuf_reg(&nodes[1], &remote, RLEN, FERRY_TP_ACCESS_REMOTE_READ);
	tbuf_reg(&nodes[0], &local, (size_t)N * SLICE, 0);
	for (size_t i = 0; i < RLEN; i++)
		remote.mem[i] = tn_pattern(1, (uint32_t)(i / SLICE), i);

	for (uint32_t i = 0; i < N; i++) {
		size_t off = (size_t)(i * 7919u % SLOTS) * SLICE;

		cr_assert_eq(ops->read(nodes[0].tp, 1, local.mem + (size_t)i * SLICE, local.mr,
				       (uintptr_t)remote.mem + off, remote.mr->rkey, SLICE,
				       &slots[i]),
			     0, "read %u was refused", i);
		if (i % 200 == 0)
			cr_assert_eq(send_frame(&nodes[0], 1, 0, frames++, 4096), 0);
	}
	cr_assert(WAIT_FOR(&nodes[0], nodes[0].rdma_done == N, WAIT_MS),
		  "%llu of %d reads completed",
		  (unsigned long long)LOCKED(&nodes[0], nodes[0].rdma_done), N);
	for (uint32_t i = 0; i < N; i++) {
		size_t off = (size_t)(i * 7919u % SLOTS) * SLICE;

		if (slots[i].done != 1 || slots[i].status ||
		    memcmp(local.mem + (size_t)i * SLICE, remote.mem + off, SLICE))
			bad++;
	}
	cr_expect_eq(bad, 0, "%d of %d reads completed wrongly", bad, N);
	cr_assert(WAIT_FOR(&nodes[1], nodes[1].frames[0] == frames, WAIT_MS));
	for (int r = 0; r < 2; r++) {
		rdma_check_threads(&nodes[r]);
		assert_clean(&nodes[r]);
	}
	tbuf_dereg(&nodes[0], &local);
	tbuf_dereg(&nodes[1], &remote);
	free(slots);
	cluster_down(nodes, 2);
}

/*
 * A write into memory registered for remote reads only fails, once, with
 * -EACCES. On a reliable connection (rdma) the error also ends the
 * connection: then the peer is reported failed, once, on both sides;
 * otherwise the connection stays usable. The other peers go on either way.
 */
TP_TEST(a_one_sided_access_error_completes_with_eacces)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		LEN = 4096
	};
	struct rdma_slot wr = { 0 };
	struct tbuf remote, local;
	struct tnode nodes[3];
	bool lost;

	tp_require_onesided(ops);
	cluster_up(nodes, ops, 3, 0);
	tbuf_reg(&nodes[1], &remote, LEN, FERRY_TP_ACCESS_REMOTE_READ);
	tbuf_reg(&nodes[0], &local, LEN, 0);
	memset(local.mem, 0xab, LEN);

	cr_assert_eq(ops->write(nodes[0].tp, 1, local.mem, local.mr, (uintptr_t)remote.mem,
				remote.mr->rkey, LEN, &wr),
		     0);
	cr_assert(WAIT_FOR(&nodes[0], wr.done == 1, WAIT_MS), "the write never completed");
	cr_expect_eq(wr.status, -EACCES, "status %s, want %s", ferry_strerror(wr.status),
		     ferry_strerror(-EACCES));
	cr_expect_eq(remote.mem[0], 0, "the refused write changed the memory");
	lost = WAIT_FOR(&nodes[0], nodes[0].failed[1] == 1, 2000);
	if (lost) {
		cr_assert(WAIT_FOR(&nodes[1], nodes[1].failed[0] == 1, WAIT_MS),
			  "rank 1 did not report rank 0 failed");
		cr_expect_eq(send_frame(&nodes[0], 1, 0, 0, 64), -FERRY_E_PEER);
	} else {
		exchange(&nodes[0], &nodes[1], 20);
		exchange(&nodes[1], &nodes[0], 20);
	}
	exchange(&nodes[0], &nodes[2], 20);
	exchange(&nodes[2], &nodes[1], 20);
	usleep(200 * 1000);
	cr_expect_eq(wr.done, 1, "the completion ran %d times", wr.done);
	cr_expect_eq(LOCKED(&nodes[0], nodes[0].failed[1] + nodes[0].failed[2]), lost ? 1 : 0);
	cr_expect_eq(LOCKED(&nodes[2], nodes[2].failed[0] + nodes[2].failed[1]), 0);
	for (int r = 0; r < 3; r++) {
		rdma_check_threads(&nodes[r]);
		assert_clean(&nodes[r]);
	}
	tbuf_dereg(&nodes[0], &local);
	tbuf_dereg(&nodes[1], &remote);
	cluster_down(nodes, 3);
}

/*
 * Least privilege (issue 16, item 3): two regions of one buffer registered
 * on their own for remote writes, as a landing inbox's per-peer regions are
 * (lib/reloc/inbox.c). Each key writes its own region; the first region's
 * key at an address of the second fails with -EACCES and changes nothing,
 * on the NIC (rxe in the SoftRoCE guest) as in the loop transport.
 */
TP_TEST(a_write_outside_its_registration_fails)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		LEN = 4096
	};
	struct rdma_slot wr = { 0 };
	struct ferry_tp_mr *ma, *mb;
	struct tbuf local;
	struct tnode nodes[3];
	uint8_t *mem;
	bool lost;

	tp_require_onesided(ops);
	cluster_up(nodes, ops, 3, 0);
	mem = aligned_alloc(4096, 2 * LEN);
	ma = calloc(1, ops->mr_size);
	mb = calloc(1, ops->mr_size);
	cr_assert(mem && ma && mb);
	memset(mem, 0, 2 * LEN);
	cr_assert_eq(ops->mem_reg(nodes[1].tp, mem, LEN, FERRY_TP_ACCESS_REMOTE_WRITE, ma), 0);
	cr_assert_eq(ops->mem_reg(nodes[1].tp, mem + LEN, LEN, FERRY_TP_ACCESS_REMOTE_WRITE, mb),
		     0);
	cr_assert_neq(ma->rkey, mb->rkey);
	tbuf_reg(&nodes[0], &local, LEN, 0);

	/* each key, its own region, whole */
	memset(local.mem, 0x11, LEN);
	cr_assert_eq(ops->write(nodes[0].tp, 1, local.mem, local.mr, (uintptr_t)mem, ma->rkey, LEN,
				&wr),
		     0);
	cr_assert(WAIT_FOR(&nodes[0], wr.done == 1, WAIT_MS), "the write never completed");
	cr_expect_eq(wr.status, 0, "a write into its region: %s", ferry_strerror(wr.status));
	memset(local.mem, 0x22, LEN);
	cr_assert_eq(ops->write(nodes[0].tp, 1, local.mem, local.mr, (uintptr_t)mem + LEN, mb->rkey,
				LEN, &wr),
		     0);
	cr_assert(WAIT_FOR(&nodes[0], wr.done == 2, WAIT_MS), "the write never completed");
	cr_expect_eq(wr.status, 0);
	cr_expect(mem[0] == 0x11 && mem[LEN - 1] == 0x11 && mem[LEN] == 0x22 &&
			  mem[2 * LEN - 1] == 0x22,
		  "the writes did not land");

	/* the first key, across the boundary into the second region: refused */
	memset(local.mem, 0x33, LEN);
	cr_assert_eq(ops->write(nodes[0].tp, 1, local.mem, local.mr, (uintptr_t)mem + LEN / 2,
				ma->rkey, LEN, &wr),
		     0);
	cr_assert(WAIT_FOR(&nodes[0], wr.done == 3, WAIT_MS), "the write never completed");
	cr_expect_eq(wr.status, -EACCES, "status %s, want %s", ferry_strerror(wr.status),
		     ferry_strerror(-EACCES));
	for (size_t i = LEN; i < 2 * LEN; i++)
		if (mem[i] != 0x22) {
			cr_expect_fail("the refused write changed byte %zu of the other region", i);
			break;
		}
	lost = WAIT_FOR(&nodes[0], nodes[0].failed[1] == 1, 2000);
	if (!lost)
		exchange(&nodes[0], &nodes[1], 20);
	exchange(&nodes[0], &nodes[2], 20);
	cr_expect_eq(LOCKED(&nodes[2], nodes[2].failed[0] + nodes[2].failed[1]), 0);
	tbuf_dereg(&nodes[0], &local);
	ops->mem_dereg(nodes[1].tp, ma);
	ops->mem_dereg(nodes[1].tp, mb);
	free(ma);
	free(mb);
	free(mem);
	cluster_down(nodes, 3);
}

/* a registration's key is never one handed out before: a key a peer kept
 * from a destroyed table opens nothing of a later one (transport/rdma/mr.c) */
TP_TEST(registrations_never_repeat_an_rkey)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	enum {
		N = 300
	};
	static uint64_t keys[N];
	struct tnode nodes[1];
	struct ferry_tp_mr *mr;
	void *mem;

	tp_require_onesided(ops);
	cr_assert_eq(tnode_init(&nodes[0], ops, 0, 1, cluster_id_for_test(), TIMEOUT_MS, 0), 0);
	mem = aligned_alloc(4096, 4096);
	mr = calloc(1, ops->mr_size);
	cr_assert(mem && mr);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(ops->mem_reg(nodes[0].tp, mem, 4096, FERRY_TP_ACCESS_REMOTE_WRITE, mr),
			     0);
		keys[i] = mr->rkey;
		ops->mem_dereg(nodes[0].tp, mr);
		for (int j = 0; j < i; j++)
			cr_assert_neq(keys[j], keys[i],
				      "registration %d got the rkey of %d (%#llx)", i, j,
				      (unsigned long long)keys[i]);
	}
	free(mr);
	free(mem);
	tnode_fini(&nodes[0]);
}

/* ---- rdma_cm injection (rdma only) --------------------------------------- */

#ifdef FERRY_HAVE_RDMA

/*
 * the rdma transport's buffer geometry (struct rdma_hello_ext in
 * transport/rdma/rdma.h), which its HELLO carries after the 32 bytes of the
 * HELLO frame and checks.
 */
#define RDMA_EXT_CHUNK_KIB 64u
#define RDMA_EXT_CREDITS 32u
#define RDMA_EXT_INCARNATION 0x7e57u
#define RDMA_IMM_DATA (0xf7u << 24)	      /* data chunk 0, returning no credit */
#define RDMA_IMM_SEQ(n) ((uint32_t)(n) << 16) /* ... and its number, modulo 128 */
/* the first message on a queue pair: a RESUME, having delivered 0 chunks */
#define RDMA_IMM_RESUME0 (0xf7u << 24 | 1u << 23 | 1u << 22)

static void tp_require_rdma(const struct ferry_tp_ops *ops)
{
	if (strcmp(ops->name, "rdma"))
		cr_skip_test("rdma_cm injection applies to the rdma transport, not %s", ops->name);
}

/* a hand-made rdma_cm connection: a stranger, or a fake peer */
struct raw_rdma {
	struct rdma_event_channel *ec;
	struct rdma_cm_id *id;
	struct ibv_mr *mr;
	uint8_t *buf;
	int status; /* of the last event */
};

/* the type of the next cm event within @ms (acked), or -1 */
static int raw_rdma_event(struct raw_rdma *r, int ms)
{
	struct pollfd p = { .fd = r->ec->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int type;

	if (poll(&p, 1, ms) <= 0 || rdma_get_cm_event(r->ec, &ev))
		return -1;
	type = ev->event;
	r->status = ev->status;
	rdma_ack_cm_event(ev);
	return type;
}

/* a HELLO as the rdma transport sends it: the frame, then the buffer geometry */
static size_t raw_rdma_hello(uint8_t *buf, uint64_t cluster_id, uint32_t rank, uint32_t world)
{
	uint32_t ext[2] = { RDMA_EXT_CHUNK_KIB | RDMA_EXT_CREDITS << 16, RDMA_EXT_INCARNATION };

	raw_hello(buf, cluster_id, rank, world);
	memcpy(buf + HELLO_LEN, ext, sizeof(ext));
	return HELLO_LEN + sizeof(ext);
}

/* resolve, make a queue pair and send a connection request with @pdata to @n */
static void raw_rdma_dial(struct raw_rdma *r, const struct tnode *n, const void *pdata,
			  uint8_t plen)
{
	char s[FERRY_TP_ADDR_MAX + 1], *colon;
	struct sockaddr_in dst = { .sin_family = AF_INET }, src;
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct rdma_conn_param cp = {
		.private_data = pdata,
		.private_data_len = plen,
		.responder_resources = 1,
		.initiator_depth = 1,
		.retry_count = 7,
		.rnr_retry_count = 7,
	};

	memset(r, 0, sizeof(*r));
	memcpy(s, n->addr, n->addr_len);
	s[n->addr_len] = '\0';
	colon = strrchr(s, ':');
	cr_assert_not_null(colon, "rdma address blob \"%s\" is not ip:port", s);
	*colon = '\0';
	dst.sin_port = htons((uint16_t)atoi(colon + 1));
	cr_assert_eq(inet_pton(AF_INET, s, &dst.sin_addr), 1);
	src = dst;
	src.sin_port = 0;

	r->ec = rdma_create_event_channel();
	cr_assert_not_null(r->ec, "rdma_create_event_channel: %s", strerror(errno));
	cr_assert_eq(rdma_create_id(r->ec, &r->id, NULL, RDMA_PS_TCP), 0);
	cr_assert_eq(rdma_resolve_addr(r->id, (struct sockaddr *)&src, (struct sockaddr *)&dst,
				       2000),
		     0, "rdma_resolve_addr: %s", strerror(errno));
	cr_assert_eq(raw_rdma_event(r, 5000), RDMA_CM_EVENT_ADDR_RESOLVED);
	cr_assert_eq(rdma_resolve_route(r->id, 2000), 0);
	cr_assert_eq(raw_rdma_event(r, 5000), RDMA_CM_EVENT_ROUTE_RESOLVED);
	cr_assert_eq(rdma_create_qp(r->id, NULL, &qa), 0, "rdma_create_qp: %s", strerror(errno));
	r->buf = aligned_alloc(4096, 4096);
	cr_assert_not_null(r->buf);
	r->mr = ibv_reg_mr(r->id->pd, r->buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	cr_assert_not_null(r->mr, "ibv_reg_mr: %s", strerror(errno));
	cr_assert_eq(rdma_connect(r->id, &cp), 0, "rdma_connect: %s", strerror(errno));
}

/* send @len bytes of r->buf as one SEND (with immediate @imm when @with_imm) */
static void raw_rdma_send(struct raw_rdma *r, size_t len, int with_imm, uint32_t imm)
{
	struct ibv_sge sge = { .addr = (uintptr_t)r->buf,
			       .length = (uint32_t)len,
			       .lkey = r->mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
		.imm_data = htonl(imm),
	};
	struct ibv_send_wr *bad;
	int64_t end = tn_now_ms() + 5000;
	struct ibv_wc wc;
	int n = 0;

	cr_assert_eq(ibv_post_send(r->id->qp, &wr, &bad), 0);
	while (tn_now_ms() < end && !(n = ibv_poll_cq(r->id->send_cq, 1, &wc)))
		usleep(1000);
	cr_assert_eq(n, 1, "the raw send never completed");
	cr_assert_eq(wc.status, IBV_WC_SUCCESS, "the raw send failed: %s",
		     ibv_wc_status_str(wc.status));
}

static void raw_rdma_close(struct raw_rdma *r)
{
	if (r->id && r->id->qp)
		rdma_destroy_qp(r->id);
	if (r->mr)
		ibv_dereg_mr(r->mr);
	free(r->buf);
	if (r->id)
		rdma_destroy_id(r->id);
	if (r->ec)
		rdma_destroy_event_channel(r->ec);
	memset(r, 0, sizeof(*r));
}

/*
 * Strangers ask rank 1 for a connection before the cluster connects (their
 * requests wait until connect() knows the cluster id) and once after: each
 * is rejected and logged once, and the cluster connects and works.
 */
TP_TEST(strangers_over_rdma_cm_are_rejected)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint64_t cid = cluster_id_for_test();
	struct connect_arg args[3];
	struct raw_rdma s[4], late;
	struct tnode nodes[3];
	uint8_t garbage[48], hello[56];
	size_t hlen;
	int ev;

	tp_require_rdma(ops);
	for (uint32_t r = 0; r < 3; r++)
		cr_assert_eq(tnode_init(&nodes[r], ops, r, 3, cid, TIMEOUT_MS, 0), 0);
	for (size_t i = 0; i < sizeof(garbage); i++)
		garbage[i] = (uint8_t)(i * 37 + 1);
	raw_rdma_dial(&s[0], &nodes[1], garbage, sizeof(garbage));
	hlen = raw_rdma_hello(hello, cid ^ 1, 2, 3);
	raw_rdma_dial(&s[1], &nodes[1], hello, (uint8_t)hlen);
	hlen = raw_rdma_hello(hello, cid, 2, 5);
	raw_rdma_dial(&s[2], &nodes[1], hello, (uint8_t)hlen);
	raw_rdma_dial(&s[3], &nodes[1], NULL, 0);

	for (uint32_t r = 0; r < 3; r++)
		connect_start(&args[r], &nodes[r], nodes);
	for (uint32_t r = 0; r < 3; r++) {
		connect_join(&args[r], TIMEOUT_MS + 5000);
		cr_assert_eq(args[r].ret, 0, "connect of rank %u: %s", r,
			     ferry_strerror(args[r].ret));
	}
	for (int i = 0; i < 4; i++) {
		ev = raw_rdma_event(&s[i], 5000);
		cr_expect_eq(ev, RDMA_CM_EVENT_REJECTED, "stranger %d: %s, not rejected", i,
			     ev < 0 ? "no answer" : rdma_event_str(ev));
		raw_rdma_close(&s[i]);
	}
	cr_expect_eq(log_count("rank 1 rejected a connection from", NULL), 4,
		     "expected one line per rejected stranger");
	cr_expect_eq(log_count("rank 1 rejected a connection from", "cluster id"), 1);
	cr_expect_eq(log_count("rank 1 rejected a connection from", "world size 5"), 1);
	cr_expect_eq(log_count("rank 1 rejected a connection from", "not a Ferry HELLO"), 2);

	/*
	 * after the cluster connected: rank 1 still listens, for redials of
	 * lost links (transport/rdma/session.c), but a stranger that names
	 * rank 2 carries another incarnation than the rank 2 it knows: refused,
	 * and their link is left alone (the exchanges below)
	 */
	hlen = raw_rdma_hello(hello, cid, 2, 3);
	raw_rdma_dial(&late, &nodes[1], hello, (uint8_t)hlen);
	ev = raw_rdma_event(&late, 5000);
	cr_expect(ev != RDMA_CM_EVENT_ESTABLISHED, "a late stranger was accepted");
	raw_rdma_close(&late);

	exchange(&nodes[0], &nodes[1], 50);
	exchange(&nodes[1], &nodes[2], 50);
	exchange(&nodes[2], &nodes[1], 50);
	for (uint32_t r = 0; r < 3; r++) {
		cr_expect_eq(LOCKED(&nodes[r],
				    nodes[r].failed[0] + nodes[r].failed[1] + nodes[r].failed[2]),
			     0, "rank %u reported a peer failed", r);
		assert_clean(&nodes[r]);
	}
	cluster_down(nodes, 3);
}

/*
 * Rank 3 is a fake made with rdma_cm by hand: its HELLO passes with ranks
 * 0, 1 and 2, it sends each a good frame, then misbehaves differently with
 * each. Each drops it alone, once, naming it and the cause.
 */
TP_TEST(a_peer_sending_bad_chunks_is_dropped_alone)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint64_t cid = cluster_id_for_test();
	struct connect_arg args[3];
	struct tnode nodes[4];
	struct raw_rdma f[3];
	uint8_t hello[56];
	size_t hlen;

	tp_require_rdma(ops);
	for (uint32_t r = 0; r < 3; r++)
		cr_assert_eq(tnode_init(&nodes[r], ops, r, 4, cid, TIMEOUT_MS, 0), 0);
	memset(&nodes[3], 0, sizeof(nodes[3]));
	nodes[3].addr_len = 1; /* rank 3 dials everyone: its blob is never used */
	for (uint32_t r = 0; r < 3; r++)
		connect_start(&args[r], &nodes[r], nodes);
	hlen = raw_rdma_hello(hello, cid, 3, 4);
	for (uint32_t v = 0; v < 3; v++) {
		int ev;

		raw_rdma_dial(&f[v], &nodes[v], hello, (uint8_t)hlen);
		ev = raw_rdma_event(&f[v], 5000);
		cr_assert_eq(ev, RDMA_CM_EVENT_ESTABLISHED, "rank %u answered the fake with %s", v,
			     ev < 0 ? "nothing" : rdma_event_str(ev));
		raw_rdma_send(&f[v], 0, 1, RDMA_IMM_RESUME0); /* the session begins */
	}
	for (uint32_t r = 0; r < 3; r++) {
		connect_join(&args[r], TIMEOUT_MS + 5000);
		cr_assert_eq(args[r].ret, 0, "connect of rank %u: %s", r,
			     ferry_strerror(args[r].ret));
	}

	/* to rank 0: a good chunk, then a chunk without the transport's immediate */
	tn_frame_fill(f[0].buf, FERRY_MSG_OP, 32, 3, 0);
	raw_rdma_send(&f[0], 32, 1, RDMA_IMM_DATA);
	tn_frame_fill(f[0].buf, FERRY_MSG_OP, 32, 3, 1);
	raw_rdma_send(&f[0], 32, 0, 0);

	/* to rank 1: one chunk holding a good frame and one with a bad magic */
	tn_frame_fill(f[1].buf, FERRY_MSG_OP, 32, 3, 0);
	tn_frame_fill(f[1].buf + 32, FERRY_MSG_OP, 32, 3, 1);
	f[1].buf[32] ^= 0xff;
	raw_rdma_send(&f[1], 64, 1, RDMA_IMM_DATA);

	/* to rank 2: a good frame, then one that claims to come from rank 1 */
	tn_frame_fill(f[2].buf, FERRY_MSG_OP, 32, 3, 0);
	raw_rdma_send(&f[2], 32, 1, RDMA_IMM_DATA);
	tn_frame_fill(f[2].buf, FERRY_MSG_OP, 32, 1, 1);
	raw_rdma_send(&f[2], 32, 1, RDMA_IMM_DATA | RDMA_IMM_SEQ(1));

	for (uint32_t v = 0; v < 3; v++) {
		struct tnode *n = &nodes[v];
		int ev;

		cr_assert(WAIT_FOR(n, n->failed[3] > 0, WAIT_MS), "rank %u kept the bad peer", v);
		cr_expect_eq(LOCKED(n, n->frames[3]), 1,
			     "rank %u: the good frame before the bad one was not delivered", v);
		cr_expect_eq(LOCKED(n, n->failed_err[3]), -FERRY_E_PROTO, "rank %u: err %s", v,
			     ferry_strerror(LOCKED(n, n->failed_err[3])));
		ev = raw_rdma_event(&f[v], 5000);
		cr_expect_eq(ev, RDMA_CM_EVENT_DISCONNECTED,
			     "rank %u did not disconnect the fake (%s)", v,
			     ev < 0 ? "no event" : rdma_event_str(ev));
	}
	usleep(200 * 1000);
	for (uint32_t v = 0; v < 3; v++) {
		cr_expect_eq(LOCKED(&nodes[v], nodes[v].failed[3]), 1,
			     "rank %u: on_peer_failed(3) ran %d times", v,
			     LOCKED(&nodes[v], nodes[v].failed[3]));
		cr_expect_eq(send_frame(&nodes[v], 3, 0, 0, 64), -FERRY_E_PEER);
	}
	cr_expect_eq(log_count("rank 3 sent rank 0 a chunk with a bad header", "no immediate"), 1);
	cr_expect_eq(log_count("rank 3 sent rank 1 a frame with a bad header", "bad magic"), 1);
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
	for (uint32_t v = 0; v < 3; v++)
		raw_rdma_close(&f[v]);
	cluster_down(nodes, 3);
}

/* drop CAP_IPC_LOCK from the effective set: RLIMIT_MEMLOCK then applies, as to a user */
static void drop_ipc_lock(void)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct data[2];

	cr_assert_eq(syscall(SYS_capget, &hdr, data), 0, "capget: %s", strerror(errno));
	data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
	cr_assert_eq(syscall(SYS_capset, &hdr, data), 0, "capset: %s", strerror(errno));
}

/*
 * Under a small memlock limit, init (its message buffers) and mem_reg (a
 * large region) fail with -ENOMEM and say how to raise the limit, instead
 * of ibv_reg_mr's bare "Cannot allocate memory".
 */
TP_TEST(a_small_memlock_limit_is_named_with_its_fix)
{
	const struct ferry_tp_ops *ops = tp_get(*tpi);
	const uint64_t cid = cluster_id_for_test();
	struct rlimit rl = { .rlim_cur = 64 << 10, .rlim_max = 64 << 10 };
	struct ferry_tp_mr *mr;
	struct tnode nodes[2];
	size_t big = 64u << 20;
	void *mem;

	tp_require_rdma(ops);
	drop_ipc_lock();
	cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
	cr_expect_eq(tnode_init(&nodes[0], ops, 0, 2, cid, TIMEOUT_MS, 0), -ENOMEM);
	cr_expect_eq(log_count("memlock limit", "ulimit -l unlimited"), 1,
		     "init did not name the memlock limit and its fix");

	/* enough for the buffers of one peer, not for a region of 64 MiB more */
	rl.rlim_cur = rl.rlim_max = 16u << 20;
	cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
	cr_assert_eq(tnode_init(&nodes[0], ops, 0, 2, cid, TIMEOUT_MS, 0), 0);
	mem = aligned_alloc(4096, big);
	mr = calloc(1, ops->mr_size);
	cr_assert(mem && mr);
	cr_expect_eq(ops->mem_reg(nodes[0].tp, mem, big, FERRY_TP_ACCESS_REMOTE_READ, mr), -ENOMEM);
	cr_expect_eq(log_count("memlock limit", "ulimit -l unlimited"), 2,
		     "mem_reg did not name the memlock limit and its fix");
	free(mr);
	free(mem);
	tnode_fini(&nodes[0]);
}

#endif /* FERRY_HAVE_RDMA */

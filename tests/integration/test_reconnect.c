/* SPDX-License-Identifier: MIT */
/*
 * Integration: links that break while both processes live are re-established,
 * losing and doubling nothing; a process that dies is still failed fast.
 * Every case breaks links for real: FERRY_TCP_FAULT_RESET_MS makes each
 * node's tcp transport break one of its connections every few ms, with a
 * shutdown() or a reset (transport/tcp/session.c); over rdma,
 * FERRY_RDMA_FAULT_BREAK_MS has the rdma transport rdma_disconnect() one of
 * its links, which puts both queue pairs in the error state and drops what
 * they held (transport/rdma/session.c).
 *
 * - frames_survive_many_resets: three transports in this process stream
 *   numbered frames of many sizes (up to 256 KiB) to each other for 3 s while
 *   their links break every 10 ms (rdma: 100 ms); every frame arrives once,
 *   in order, intact, and no peer is reported failed.
 * - a_storm_keeps_every_push_exactly_once: three forked nodes push (+1),
 *   pull and localize keys of every home for 3 s while their links break
 *   every 20 ms (rdma: 300 ms); every operation succeeds, every key ends with exactly the
 *   pushes that returned 0, and no peer is declared failed.
 * - a_killed_peer_is_failed_within_2_s: the same, and a node is SIGKILLed:
 *   the others' operations on it end with -FERRY_E_PEER within 2 s. Over
 *   rdma FERRY_RECONNECT_MS is 3000 there: the rank below the victim sees
 *   the death in time only through its probe of the victim's listener.
 *
 * With FERRY_TOKEN set (ctest's test_reconnect_token; CI's SoftRoCE guest
 * runs it over rdma too) every connection, redial and probe of every case
 * proves the cluster token: the frames case's bare transports included.
 *
 * The cases run over tcp, or over rdma with FERRY_TRANSPORT=rdma (the
 * SoftRoCE guest: ci/softroce-vm.sh, with FERRY_BIND_ADDR the rxe address);
 * they skip for the loop transport, whose links cannot break. Over rdma the
 * links break less often (every 100 ms): a redial resolves an address
 * and a route and makes a queue pair, which takes milliseconds under TCG.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "ferry/ferry.h"
#include "transport/base/auth.h"
#include "transport/transport.h"

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* 1 over rdma (FERRY_TRANSPORT=rdma), 0 over tcp; skips the loop transport */
static int use_rdma(void)
{
	const char *tp = getenv("FERRY_TRANSPORT");

	if (tp && !strcmp(tp, "rdma")) {
#ifdef FERRY_HAVE_RDMA
		return 1;
#else
		cr_skip_test("FERRY_TRANSPORT=rdma, but this build has no rdma transport");
#endif
	}
	if (tp && *tp && strcmp(tp, "tcp") && strcmp(tp, "auto"))
		cr_skip_test("links of the %s transport cannot break", tp);
	return 0;
}

static const struct ferry_tp_ops *rc_ops(int rdma)
{
#ifdef FERRY_HAVE_RDMA
	if (rdma)
		return &ferry__rdma_ops;
#endif
	(void)rdma;
	return &ferry__tcp_ops;
}

/*
 * The grace of a lost link over rdma. In the 2-vCPU TCG guest, under the
 * frames case's load (three transports in one process, every byte checked
 * on the progress threads), a turn of a progress thread takes up to hundreds
 * of ms and a redial needs several on both sides: the VM measured redials
 * of up to 1.2 s and sessions resumed up to 2.9 s after the loss (a link
 * that never came back, a bug since fixed, still fails at the grace). So
 * the rdma cases give 6 s; the kill case 3 s, with its own reason.
 */
#define RC_RDMA_GRACE "6000"

/*
 * FERRY_TOKEN (ctest's test_reconnect_token, and CI's rdma run of it in the
 * SoftRoCE guest): the frames case's bare transports prove it too, as
 * ferry_open's nodes of the other cases do, so every redial and probe of
 * every case carries a proof that must pass. Return: 1 with a token.
 */
static int rc_token(struct ferry_tp_config *cfg)
{
	const char *tok = getenv("FERRY_TOKEN");

	if (!tok || !*tok)
		return 0;
	cr_assert_eq(ferry__auth_key_from_token(tok, strlen(tok), cfg->auth_key), 0);
	cfg->auth = 1;
	return 1;
}

/* break links every @tcp_ms over tcp, every @rdma_ms over rdma */
static void rc_fault(int tcp_ms, int rdma_ms)
{
	char v[16];

	snprintf(v, sizeof(v), "%d", tcp_ms);
	setenv("FERRY_TCP_FAULT_RESET_MS", v, 1);
	snprintf(v, sizeof(v), "%d", rdma_ms);
	setenv("FERRY_RDMA_FAULT_BREAK_MS", v, 1);
}

/* the nodes' transport: tcp, or rdma chosen through FERRY_TRANSPORT */
static void rc_params(struct ferry_params *p, int rdma)
{
	ferry_params_init(p);
	p->transport = rdma ? FERRY_TRANSPORT_RDMA : FERRY_TRANSPORT_TCP;
	p->timeout_ms = 20000;
}

/* ---- log lines, counted (shared between forked nodes) --------------------- */

struct logcount {
	long resets;  /* fault injection broke a connection */
	long resumed; /* a session resumed on a new connection */
	long resent;  /* frames sent again, summed over the resumptions */
	long failed;  /* a peer marked failed */
	int counting; /* 0: lines are no longer counted (shutdown) */
};

static struct logcount *logc;

static void log_cb(enum ferry_log_level level, const char *msg, void *arg)
{
	const char *p;

	(void)arg;
	/* FERRY_TEST_LOG=1 shows every line (info), for a look at the sessions */
	if ((level <= FERRY_LOG_WARN && !strstr(msg, "FERRY_TCP_FAULT_RESET_MS") &&
	     !strstr(msg, "FERRY_RDMA_FAULT_BREAK_MS")) ||
	    getenv("FERRY_TEST_LOG"))
		fprintf(stderr, "ferry: %s\n", msg);
	if (!logc || !__atomic_load_n(&logc->counting, __ATOMIC_ACQUIRE))
		return;
	if (strstr(msg, "fault injection"))
		__atomic_fetch_add(&logc->resets, 1, __ATOMIC_RELAXED);
	if ((p = strstr(msg, "resumed the session"))) {
		unsigned long long n = 0;

		__atomic_fetch_add(&logc->resumed, 1, __ATOMIC_RELAXED);
		/* tcp counts frames sent again, rdma chunks */
		if ((p = strstr(p, "; ")) && sscanf(p, "; %llu", &n) == 1)
			__atomic_fetch_add(&logc->resent, (long)n, __ATOMIC_RELAXED);
	}
	if (strstr(msg, "marking it failed"))
		__atomic_fetch_add(&logc->failed, 1, __ATOMIC_RELAXED);
}

static void log_start(void)
{
	const char *v = getenv("FERRY_TEST_LOG");

	ferry_log_set(v && !strcmp(v, "debug") ? FERRY_LOG_DEBUG : FERRY_LOG_INFO, log_cb, NULL);
}

static struct logcount *logcount_shared(void)
{
	struct logcount *l =
		mmap(NULL, sizeof(*l), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	cr_assert_neq(l, MAP_FAILED);
	l->counting = 1;
	logc = l;
	log_start();
	return l;
}

/* ---- transport level: numbered frames over breaking links ---------------- */

#define RN 3 /* transports */
#define RUN_NS 3000000000ll

struct rnode {
	struct ferry_tp *tp;
	uint32_t rank;
	char addr[FERRY_TP_ADDR_MAX];
	size_t addr_len;
	const void *addrs[RN];
	size_t lens[RN];
	int connect_ret;

	pthread_mutex_t lock; /* guards the counts below */
	uint64_t got[RN];     /* frames from each rank, each the next in order */
	uint64_t bytes[RN];
	int failed[RN]; /* on_peer_failed() calls */
	int bad;
	char why[200];

	uint64_t sent[RN]; /* the sender thread's, read after it joined */
	int send_err;
};

static uint32_t frame_len(uint32_t seq)
{
	static const uint32_t sizes[] = { 16, 24, 72, 1032, 4096, 16392, 65544 };

	return seq % 97 == 0 ? (256u << 10) + 8 : sizes[seq % 7];
}

static uint8_t frame_byte(uint32_t src, uint32_t seq, size_t i)
{
	return (uint8_t)((i * 31u) ^ (i >> 9) ^ (seq * 131u) ^ (src * 17u) ^ 0x5a);
}

static void r_on_msg(void *core, uint32_t src, const void *buf, size_t len)
{
	struct rnode *n = core;
	const uint8_t *b = buf;
	struct ferry_msg_hdr hdr;
	char why[200] = "";

	memcpy(&hdr, buf, sizeof(hdr));
	pthread_mutex_lock(&n->lock);
	if (src >= RN || hdr.table != (uint32_t)(n->got[src] + 1)) {
		snprintf(why, sizeof(why), "rank %u: frame %u from rank %u where %llu was due",
			 n->rank, hdr.table, src,
			 (unsigned long long)(src < RN ? n->got[src] + 1 : 0));
	} else if (len != frame_len(hdr.table)) {
		snprintf(why, sizeof(why), "rank %u: frame %u from rank %u is %zu bytes, not %u",
			 n->rank, hdr.table, src, len, frame_len(hdr.table));
	} else {
		for (size_t i = sizeof(hdr); i < len; i++)
			if (b[i] != frame_byte(src, hdr.table, i)) {
				snprintf(why, sizeof(why),
					 "rank %u: frame %u from rank %u differs at byte %zu",
					 n->rank, hdr.table, src, i);
				break;
			}
	}
	if (why[0] && !n->bad++)
		snprintf(n->why, sizeof(n->why), "%s", why);
	if (src < RN) {
		n->got[src]++;
		n->bytes[src] += len;
	}
	pthread_mutex_unlock(&n->lock);
}

static void r_on_peer_failed(void *core, uint32_t src, int err)
{
	struct rnode *n = core;

	(void)err;
	pthread_mutex_lock(&n->lock);
	if (src < RN)
		n->failed[src]++;
	pthread_mutex_unlock(&n->lock);
}

static const struct ferry_tp_handler r_handler = {
	.on_msg = r_on_msg,
	.on_peer_failed = r_on_peer_failed,
};

static void *r_connect_main(void *arg)
{
	struct rnode *n = arg;

	n->connect_ret = n->tp->ops->connect(n->tp, n->addrs, n->lens);
	return NULL;
}

/* frames numbered 1, 2, ... to every other rank in turn, until the deadline */
static void *r_send_main(void *arg)
{
	struct rnode *n = arg;
	uint8_t *body = malloc((256u << 10) + 8);
	int64_t end = now_ns() + RUN_NS;

	if (!body) {
		n->send_err = -ENOMEM;
		return NULL;
	}
	while (now_ns() < end && !n->send_err) {
		for (uint32_t dst = 0; dst < RN; dst++) {
			uint32_t seq, len;
			struct ferry_msg_hdr hdr;
			struct iovec iov[2];
			int rc;

			if (dst == n->rank)
				continue;
			seq = (uint32_t)++n->sent[dst];
			len = frame_len(seq);
			ferry__proto_hdr_init(&hdr, FERRY_MSG_OP, len, n->rank, seq);
			for (size_t i = sizeof(hdr); i < len; i++)
				body[i] = frame_byte(n->rank, seq, i);
			iov[0] = (struct iovec){ .iov_base = &hdr, .iov_len = sizeof(hdr) };
			iov[1] = (struct iovec){ .iov_base = body + sizeof(hdr),
						 .iov_len = len - sizeof(hdr) };
			rc = n->tp->ops->send(n->tp, dst, iov, 2);
			if (rc) {
				n->send_err = rc;
				n->sent[dst]--;
				break;
			}
		}
	}
	free(body);
	return NULL;
}

Test(reconnect, frames_survive_many_resets, .timeout = 180)
{
	const uint64_t cid = 0xfe11000000000000ull | ((uint64_t)getpid() << 8);
	struct logcount *lc;
	struct rnode *nodes = calloc(RN, sizeof(*nodes));
	pthread_t th[RN];
	uint64_t frames = 0, bytes = 0;
	long resets, resumed, resent, failed;
	const int rdma = use_rdma();
	const struct ferry_tp_ops *ops = rc_ops(rdma);
	const char *bind = !rdma		     ? "127.0.0.1" :
			   getenv("FERRY_BIND_ADDR") ? getenv("FERRY_BIND_ADDR") :
						       getenv("FERRY_TEST_RDMA_ADDR");
	const long least = rdma ? 10 : 50; /* breaks and resumptions at least */
	int64_t t0;
	int token = 0;

	cr_assert_not_null(nodes);
	lc = logcount_shared();
	rc_fault(10, 100);
	/* sanitizer builds are slow to redial; rdma under TCG more so (RC_RDMA_GRACE) */
	setenv("FERRY_RECONNECT_MS", rdma ? RC_RDMA_GRACE : "2000", 0);
	for (uint32_t r = 0; r < RN; r++) {
		struct rnode *n = &nodes[r];
		struct ferry_tp_config cfg = {
			.rank = r,
			.world = RN,
			.cluster_id = cid,
			.bind_addr = bind ? bind : "",
			.timeout_ms = 20000,
			.handler = &r_handler,
			.core = n,
		};

		token = rc_token(&cfg);
		n->rank = r;
		pthread_mutex_init(&n->lock, NULL);
		n->tp = calloc(1, ops->tp_size);
		cr_assert_not_null(n->tp);
		n->tp->ops = ops;
		cr_assert_eq(ops->init(n->tp, &cfg), 0, "init of rank %u (%s)", r, ops->name);
		n->addr_len = sizeof(n->addr);
		cr_assert_eq(ops->addr_get(n->tp, n->addr, &n->addr_len), 0);
	}
	for (uint32_t r = 0; r < RN; r++) {
		for (uint32_t q = 0; q < RN; q++) {
			nodes[r].addrs[q] = nodes[q].addr;
			nodes[r].lens[q] = nodes[q].addr_len;
		}
		cr_assert_eq(pthread_create(&th[r], NULL, r_connect_main, &nodes[r]), 0);
	}
	for (uint32_t r = 0; r < RN; r++) {
		pthread_join(th[r], NULL);
		cr_assert_eq(nodes[r].connect_ret, 0, "connect of rank %u: %s", r,
			     ferry_strerror(nodes[r].connect_ret));
	}
	for (uint32_t r = 0; r < RN; r++)
		cr_assert_eq(pthread_create(&th[r], NULL, r_send_main, &nodes[r]), 0);
	for (uint32_t r = 0; r < RN; r++) {
		pthread_join(th[r], NULL);
		cr_assert_eq(nodes[r].send_err, 0, "rank %u: send: %s", r,
			     ferry_strerror(nodes[r].send_err));
	}
	/* everything sent arrives, however the links broke meanwhile */
	t0 = now_ns();
	for (uint32_t dst = 0; dst < RN; dst++)
		for (uint32_t src = 0; src < RN; src++) {
			struct rnode *n = &nodes[dst];
			uint64_t want = nodes[src].sent[dst], got = 0;

			if (src == dst)
				continue;
			while (now_ns() - t0 < 60000000000ll) {
				pthread_mutex_lock(&n->lock);
				got = n->got[src];
				pthread_mutex_unlock(&n->lock);
				if (got >= want)
					break;
				usleep(1000);
			}
			cr_assert_eq(got, want, "rank %u got %llu of the %llu frames of rank %u",
				     dst, (unsigned long long)got, (unsigned long long)want, src);
			frames += got;
			pthread_mutex_lock(&n->lock);
			bytes += n->bytes[src];
			pthread_mutex_unlock(&n->lock);
		}
	usleep(100 * 1000); /* nothing more (no frame twice) comes late */
	__atomic_store_n(&lc->counting, 0, __ATOMIC_RELEASE);
	resets = __atomic_load_n(&lc->resets, __ATOMIC_RELAXED);
	resumed = __atomic_load_n(&lc->resumed, __ATOMIC_RELAXED);
	resent = __atomic_load_n(&lc->resent, __ATOMIC_RELAXED);
	failed = __atomic_load_n(&lc->failed, __ATOMIC_RELAXED);
	for (uint32_t r = 0; r < RN; r++) {
		struct rnode *n = &nodes[r];

		pthread_mutex_lock(&n->lock);
		cr_assert_eq(n->bad, 0, "%d bad frames; the first: %s", n->bad, n->why);
		for (uint32_t q = 0; q < RN; q++) {
			cr_assert_eq(n->failed[q], 0, "rank %u reported rank %u failed", r, q);
			cr_assert_eq(n->got[q], nodes[q].sent[r], "rank %u: %llu frames of rank %u",
				     r, (unsigned long long)n->got[q], q);
		}
		pthread_mutex_unlock(&n->lock);
	}
	fprintf(stderr,
		"frames_survive_many_resets (%s%s): %llu frames (%.1f MiB) in order through %ld "
		"injected breaks, %ld sessions resumed, %ld %s sent again\n",
		ops->name, token ? ", every redial proving the token" : "",
		(unsigned long long)frames, (double)bytes / (1 << 20), resets, resumed, resent,
		rdma ? "chunks" : "frames");
	cr_assert_eq(failed, 0, "%ld log lines marked a peer failed", failed);
	cr_assert_geq(resets, least, "only %ld breaks were injected", resets);
	cr_assert_geq(resumed, least, "only %ld sessions resumed", resumed);
	cr_assert_gt(resent, 0, "nothing was ever sent again: the breaks never cost a frame");
	for (uint32_t r = 0; r < RN; r++) {
		ops->fini(nodes[r].tp);
		free(nodes[r].tp);
	}
	free(nodes);
}

/* ---- through the API: a storm of forked nodes ------------------------------ */

#define NODES 3
#define PER 100
#define VLEN 4
#define KEYS (NODES * PER)

struct storm {
	struct logcount log;
	volatile int ready, finished, checked;
	volatile long pushed[KEYS]; /* pushes of +1 that returned 0, per key */
	volatile long ops;
	volatile int failures;
	volatile int64_t kill_ns;
	volatile int64_t peer_err_ns[NODES]; /* when -FERRY_E_PEER first came */
	char why[512];
};

static int storm_fail(struct storm *st, int rank, const char *what, uint64_t key, int rc)
{
	if (!__atomic_fetch_add(&st->failures, 1, __ATOMIC_SEQ_CST))
		snprintf(st->why, sizeof(st->why), "rank %d: %s of key %llu: %s", rank, what,
			 (unsigned long long)key, ferry_strerror(rc));
	return 1;
}

static void wait_count(volatile int *v, int n)
{
	for (int64_t until = now_ns() + 60000000000ll; *v < n && now_ns() < until;)
		usleep(1000);
}

/*
 * One node of the storm: push (+1), pull and localize random keys of every
 * home for 3 s; then, once all stopped, every key holds exactly the pushes
 * that returned 0, read from every node.
 */
static int storm_child(int rank, struct ferry_params *p, struct storm *st)
{
	struct ferry_table_params tp = { .num_keys = KEYS,
					 .value_len = VLEN,
					 .placement = FERRY_PLACEMENT_RANGE };
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
	const float one[VLEN] = { 1, 1, 1, 1 };
	struct ferry_worker *w;
	struct ferry_table *t;
	struct ferry *fy;
	float v[VLEN];
	int64_t end;
	long ops = 0;
	int rc;

	logc = &st->log;
	log_start();
	if (ferry_open(p, &fy))
		return 10;
	if (ferry_table_create(fy, &tp, &t) || ferry_worker_create(fy, &w))
		return 11;
	if ((rc = ferry_barrier(fy)))
		return storm_fail(st, rank, "barrier", 0, rc);
	__atomic_fetch_add(&st->ready, 1, __ATOMIC_SEQ_CST);
	wait_count(&st->ready, NODES);
	for (end = now_ns() + RUN_NS; now_ns() < end; ops++) {
		uint64_t key = tc_rand(&seed) % KEYS;
		unsigned what = (unsigned)(tc_rand(&seed) % 10);

		if (what < 6)
			rc = ferry_push(w, t, &key, 1, one);
		else if (what < 9)
			rc = ferry_pull(w, t, &key, 1, v);
		else
			rc = ferry_localize(w, t, &key, 1);
		if (rc)
			return storm_fail(st, rank,
					  what < 6 ? "push" :
					  what < 9 ? "pull" :
						     "localize",
					  key, rc);
		if (what < 6)
			__atomic_fetch_add(&st->pushed[key], 1, __ATOMIC_SEQ_CST);
	}
	__atomic_fetch_add(&st->ops, ops, __ATOMIC_SEQ_CST);
	__atomic_fetch_add(&st->finished, 1, __ATOMIC_SEQ_CST);
	wait_count(&st->finished, NODES);
	for (uint64_t key = 0; key < KEYS; key++) {
		rc = ferry_pull(w, t, &key, 1, v);
		if (rc)
			return storm_fail(st, rank, "final pull", key, rc);
		for (uint32_t j = 0; j < VLEN; j++)
			if (v[j] != (float)st->pushed[key]) {
				if (!__atomic_fetch_add(&st->failures, 1, __ATOMIC_SEQ_CST))
					snprintf(
						st->why, sizeof(st->why),
						"rank %d: key %llu float %u is %g after %ld pushes",
						rank, (unsigned long long)key, j, (double)v[j],
						st->pushed[key]);
				return 1;
			}
	}
	__atomic_fetch_add(&st->checked, 1, __ATOMIC_SEQ_CST);
	wait_count(&st->checked, NODES);
	__atomic_store_n(&st->log.counting, 0, __ATOMIC_RELEASE); /* departures are no failures */
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	return 0;
}

static struct storm *storm_map(void)
{
	struct storm *st =
		mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	cr_assert_neq(st, MAP_FAILED);
	st->log.counting = 1;
	return st;
}

Test(reconnect, a_storm_keeps_every_push_exactly_once, .timeout = 180)
{
	struct storm *st;
	struct ferry_params p;
	pid_t pids[NODES];
	long pushes = 0;
	const int rdma = use_rdma();
	const long least = rdma ? 10 : 20;
	int rc;

	st = storm_map();
	rc_fault(20, 300); /* over rdma under TCG a redial takes 50-300 ms */
	setenv("FERRY_RECONNECT_MS", rdma ? RC_RDMA_GRACE : "2000", 0);
	rc_params(&p, rdma);
	rc = ferry_local_cluster_fork(NODES, &p, pids);
	if (rc >= 0 && rc < NODES)
		_exit(storm_child(rc, &p, st));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	tc_wait_procs(pids, NODES, -1, st->why);
	cr_assert_eq(st->failures, 0, "%s", st->why);
	for (int k = 0; k < KEYS; k++)
		pushes += st->pushed[k];
	fprintf(stderr,
		"a_storm_keeps_every_push_exactly_once (%s): %ld operations (%ld pushes) through "
		"%ld injected breaks, %ld sessions resumed, %ld %s sent again\n",
		rdma ? "rdma" : "tcp", st->ops, pushes, st->log.resets, st->log.resumed,
		st->log.resent, rdma ? "chunks" : "frames");
	cr_assert_eq(st->log.failed, 0, "%ld log lines marked a peer failed", st->log.failed);
	cr_assert_geq(st->log.resets, least, "only %ld breaks were injected", st->log.resets);
	cr_assert_geq(st->log.resumed, least, "only %ld sessions resumed", st->log.resumed);
	/*
	 * over rdma in the TCG guest an operation often waits for a redial: 97
	 * to 1284 operations were seen in 3 s (32 runs); the count only shows
	 * that the storm ran, exactly-once is what is checked
	 */
	cr_assert_gt(st->ops, rdma ? 40 : 1000, "only %ld operations ran", st->ops);
	munmap(st, sizeof(*st));
}

/* ---- a process that dies is still failed fast ------------------------------ */

#define VICTIM 1 /* the middle rank: it dials rank 0 and listens for rank 2 */

/*
 * Ranks 0 and 2 push and pull keys homed at the victim (and at each other)
 * until an operation on the victim fails with -FERRY_E_PEER; the victim
 * serves until the parent kills it. Links break every 30 ms throughout.
 */
static int victim_child(int rank, struct ferry_params *p, struct storm *st)
{
	struct ferry_table_params tp = { .num_keys = KEYS,
					 .value_len = VLEN,
					 .placement = FERRY_PLACEMENT_RANGE };
	uint64_t seed = 0x2545f4914f6cdd1dull * (uint64_t)(rank + 1);
	const float one[VLEN] = { 1, 1, 1, 1 };
	struct ferry_worker *w;
	struct ferry_table *t;
	struct ferry *fy;
	float v[VLEN];
	long ops = 0;
	int rc;

	logc = &st->log;
	log_start();
	if (ferry_open(p, &fy))
		return 10;
	if (ferry_table_create(fy, &tp, &t) || ferry_worker_create(fy, &w))
		return 11;
	if ((rc = ferry_barrier(fy)))
		return storm_fail(st, rank, "barrier", 0, rc);
	__atomic_fetch_add(&st->ready, 1, __ATOMIC_SEQ_CST);
	if (rank == VICTIM)
		for (;;)
			pause(); /* killed by the parent */
	for (int64_t until = now_ns() + 60000000000ll; now_ns() < until; ops++) {
		/* every other operation is on a key of the victim's */
		uint64_t key = ops % 2 ? VICTIM * PER + tc_rand(&seed) % PER :
					 tc_rand(&seed) % KEYS;

		if (key / PER == VICTIM && st->peer_err_ns[rank])
			continue; /* failed already: only the live keys now */
		rc = ops % 3 ? ferry_push(w, t, &key, 1, one) : ferry_pull(w, t, &key, 1, v);
		if (rc == -FERRY_E_PEER && key / PER == VICTIM && st->kill_ns) {
			if (!st->peer_err_ns[rank])
				st->peer_err_ns[rank] = now_ns();
		} else if (rc) {
			return storm_fail(st, rank, ops % 3 ? "push" : "pull", key, rc);
		}
		if (st->peer_err_ns[rank] && now_ns() > st->peer_err_ns[rank] + 200000000ll)
			break; /* and the live keys still work after it */
	}
	__atomic_fetch_add(&st->ops, ops, __ATOMIC_SEQ_CST);
	__atomic_fetch_add(&st->finished, 1, __ATOMIC_SEQ_CST);
	wait_count(&st->finished, NODES - 1);
	__atomic_store_n(&st->log.counting, 0, __ATOMIC_RELEASE);
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	return st->peer_err_ns[rank] ? 0 : 12;
}

Test(reconnect, a_killed_peer_is_failed_within_2_s, .timeout = 180)
{
	struct storm *st;
	struct ferry_params p;
	pid_t pids[NODES];
	const int rdma = use_rdma();
	int rc;

	st = storm_map();
	rc_fault(30, 100);
	/*
	 * over rdma a grace longer than the 2 s allowed: rank 0 (below the
	 * victim) sees the death in time only by probing the victim's listener
	 * (transport/rdma/session.c), not by waiting the grace out
	 */
	if (rdma)
		setenv("FERRY_RECONNECT_MS", "3000", 0);
	rc_params(&p, rdma);
	rc = ferry_local_cluster_fork(NODES, &p, pids);
	if (rc >= 0 && rc < NODES)
		_exit(victim_child(rc, &p, st));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	wait_count(&st->ready, NODES);
	cr_assert_eq(st->ready, NODES, "the nodes did not start: %s", st->why);
	usleep(1000 * 1000); /* a second of operations and broken links first */
	st->kill_ns = now_ns();
	kill(pids[VICTIM], SIGKILL);
	tc_wait_procs(pids, NODES, VICTIM, st->why);
	cr_assert_eq(st->failures, 0, "%s", st->why);
	for (int r = 0; r < NODES; r++) {
		double ms = (double)(st->peer_err_ns[r] - st->kill_ns) / 1e6;

		if (r == VICTIM)
			continue;
		fprintf(stderr,
			"a_killed_peer_is_failed_within_2_s: rank %d saw -FERRY_E_PEER %.1f ms after the kill\n",
			r, ms);
		cr_assert(st->peer_err_ns[r] > 0, "rank %d never saw the victim fail", r);
		cr_assert_lt(ms, 2000.0, "rank %d saw the victim fail %.0f ms after the kill", r,
			     ms);
	}
	cr_assert_gt(st->log.resets, 0, "no link broke before the kill");
	munmap(st, sizeof(*st));
}

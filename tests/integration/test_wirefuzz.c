/* SPDX-License-Identifier: MIT */
/*
 * Integration: a stranger on the transport ports. Three nodes (threads) form
 * a cluster over tcp; while they push, pull and localize, a raw client opens
 * hundreds of connections to their transport ports and sends what a node
 * must survive: garbage, truncated and oversized frames, HELLOs of another
 * cluster, HELLOs that impersonate a member (with our cluster id, which a
 * sniffer could learn: no authentication yet, docs/security.md) followed by
 * a RESUME of another process, HELLOs of a rank that must wait to be
 * dialed, floods, probes that close at once, and connections that stay
 * silent. Afterwards every operation succeeded, every value is exact, no
 * node marked a real peer failed, and the handshake refused the strangers
 * (its log says so, once per connection).
 *
 * The rendezvous is closed once the cluster formed (tc_open), so strangers
 * there are test_rendezvous's business.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/cluster.h"
#include "lib/core/core.h"
#include "transport/base/frame.h"

#define NODES 3
#define NKEYS 64
#define VLEN 4
#define ROUNDS 60
#define ATTACKS 600 /* connections, spread over the nodes */
#define IDLE 8	    /* of them, held open and silent for the whole run */

static const struct ferry_table_params tparams = { .num_keys = NKEYS, .value_len = VLEN };

/* ---- the log, counted ---------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_rejected;     /* "rejected a connection" */
static int log_impersonated; /* of them, a member's HELLO with a RESUME of another process */
static int log_failed;	     /* a peer marked failed, or dropped */
static char log_failed_line[512];

static void log_capture(enum ferry_log_level level, const char *msg, void *arg)
{
	pthread_mutex_lock(&log_lock);
	if (strstr(msg, "rejected a connection"))
		log_rejected++;
	if (strstr(msg, "rejected a connection") && strstr(msg, "another process"))
		log_impersonated++;
	if (strstr(msg, "marking it failed") || strstr(msg, "dropping rank") ||
	    strstr(msg, "failed for good")) {
		log_failed++;
		snprintf(log_failed_line, sizeof(log_failed_line), "%s", msg);
	}
	pthread_mutex_unlock(&log_lock);
}

static void setup(void)
{
	ferry_log_set(FERRY_LOG_WARN, log_capture, NULL);
}

TestSuite(wirefuzz, .init = setup, .timeout = 120);

/* ---- the stranger ---------------------------------------------------------- */

struct target {
	struct sockaddr_in sa;
	uint32_t rank;
};

struct attack {
	struct target node[NODES];
	uint64_t cluster_id;
	uint64_t rng;
	int done; /* connections made */
	int idle_fds[IDLE];
	atomic_int finished;	  /* the attack thread is through */
	atomic_int rounds[NODES]; /* pushes of 1 each member made, per key */
};

static uint64_t rnd(struct attack *a)
{
	/* xorshift64: the seed is printed, a failure can be replayed */
	a->rng ^= a->rng << 13;
	a->rng ^= a->rng >> 7;
	a->rng ^= a->rng << 17;
	return a->rng;
}

static void rnd_fill(struct attack *a, void *buf, size_t len)
{
	uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)rnd(a);
}

static int dial(const struct target *t)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (connect(fd, (const struct sockaddr *)&t->sa, sizeof(t->sa))) {
		close(fd);
		return -1;
	}
	return fd;
}

static void put(int fd, const void *buf, size_t len)
{
	/* the node may close first: a short or failed write is part of the game */
	(void)!send(fd, buf, len, MSG_NOSIGNAL);
}

/* a HELLO and a RESUME as a member @rank of @world in @cluster would send */
static void handshake(uint8_t *buf, uint64_t cluster, uint32_t rank, uint32_t world, uint64_t inc,
		      uint64_t delivered, uint64_t sent)
{
	struct ferry_msg_hello h = { .cluster_id = cluster, .rank = rank, .world = world };
	struct ferry_msg_resume r = { .incarnation = inc, .delivered = delivered, .sent = sent };
	struct ferry_msg_hdr hdr;

	ferry__proto_hdr_init(&hdr, FERRY_MSG_HELLO, sizeof(hdr) + sizeof(h), rank, 0);
	memcpy(buf, &hdr, sizeof(hdr));
	memcpy(buf + sizeof(hdr), &h, sizeof(h));
	buf += sizeof(hdr) + sizeof(h);
	ferry__proto_hdr_init(&hdr, FERRY_MSG_RESUME, sizeof(hdr) + sizeof(r), rank, 0);
	memcpy(buf, &hdr, sizeof(hdr));
	memcpy(buf + sizeof(hdr), &r, sizeof(r));
}

#define HS_LEN                                                               \
	(2 * sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_hello) + \
	 sizeof(struct ferry_msg_resume))

enum {
	GARBAGE,
	TRUNCATED,
	OTHER_CLUSTER,
	OVERSIZED,
	IMPERSONATE,
	LOWER_RANK,
	FLOOD,
	PROBE,
	BAD_TYPE,
	N_CASES
};

static void attack_one(struct attack *a, int i)
{
	const struct target *t = &a->node[i % NODES];
	static uint8_t big[1 << 20];
	uint8_t buf[4096];
	int kind = (int)(rnd(a) % N_CASES), fd = dial(t);

	if (fd < 0)
		return;
	a->done++;
	switch (kind) {
	case GARBAGE:
		rnd_fill(a, buf, 1 + rnd(a) % 300);
		put(fd, buf, 1 + rnd(a) % 300);
		break;
	case TRUNCATED:
		/* a member's first bytes, cut anywhere before the RESUME ends */
		handshake(buf, a->cluster_id, (t->rank + 1) % NODES, NODES, rnd(a), 0, 0);
		put(fd, buf, rnd(a) % HS_LEN);
		break;
	case OTHER_CLUSTER:
		handshake(buf, rnd(a), (t->rank + 1) % NODES, NODES, rnd(a), 0, 0);
		put(fd, buf, HS_LEN);
		break;
	case OVERSIZED: {
		struct ferry_msg_hdr hdr;
		uint32_t lens[] = { FERRY_MSG_MAX + 8, 0xfffffff8u, 8, 0 };

		ferry__proto_hdr_init(&hdr, rnd(a) & 1 ? FERRY_MSG_HELLO : FERRY_MSG_OP,
				      lens[rnd(a) % 4], (t->rank + 1) % NODES, 0);
		memcpy(buf, &hdr, sizeof(hdr));
		rnd_fill(a, buf + sizeof(hdr), sizeof(buf) - sizeof(hdr));
		put(fd, buf, sizeof(buf));
		break;
	}
	case IMPERSONATE:
		/* a real member's rank, above the node's (it may dial), our cluster, any
		 * incarnation but the member's: another process, refused */
		handshake(buf, a->cluster_id, t->rank == NODES - 1 ? NODES - 1 : NODES - 1, NODES,
			  rnd(a) | 1, rnd(a) % 1000, rnd(a) % 1000);
		if (t->rank == NODES - 1) /* nobody above: claim rank 1 of a lower node */
			handshake(buf, a->cluster_id, 1, NODES, rnd(a) | 1, 0, 0);
		put(fd, buf, HS_LEN);
		break;
	case LOWER_RANK:
		handshake(buf, a->cluster_id, 0, NODES, rnd(a), 0, 0);
		put(fd, buf, HS_LEN);
		break;
	case FLOOD:
		rnd_fill(a, big, sizeof(big));
		for (size_t off = 0; off < sizeof(big);) {
			ssize_t n =
				send(fd, big + off, sizeof(big) - off, MSG_NOSIGNAL | MSG_DONTWAIT);

			if (n <= 0)
				break;
			off += (size_t)n;
		}
		break;
	case PROBE:
		break;
	case BAD_TYPE: {
		struct ferry_msg_hdr hdr;

		handshake(buf, a->cluster_id, (t->rank + 1) % NODES, NODES, rnd(a), 0, 0);
		memcpy(&hdr, buf, sizeof(hdr));
		hdr.type = (uint8_t)(FERRY_MSG_TYPE_MAX + rnd(a) % 200);
		hdr.version = rnd(a) & 1 ? hdr.version : (uint8_t)rnd(a);
		memcpy(buf, &hdr, sizeof(hdr));
		put(fd, buf, HS_LEN);
		break;
	}
	}
	close(fd);
}

static void *attack_thread(void *p)
{
	struct attack *a = p;

	for (int i = 0; i < IDLE; i++)
		a->idle_fds[i] = dial(&a->node[i % NODES]);
	for (int i = 0; i < ATTACKS; i++)
		attack_one(a, i);
	atomic_store(&a->finished, 1);
	return NULL;
}

/* ---- the members' work ----------------------------------------------------- */

/* push 1 to every key, pull, and localize a third of the keys, round after
 * round, until the attack is through (ROUNDS at least); then every key must
 * read the sum of every member's rounds */
static int work(struct tc *c, int rank, void *arg)
{
	struct attack *a = arg;
	struct ferry_worker *w;
	int r, total = 0;
	uint64_t keys[NKEYS], mine[NKEYS];
	float ones[NKEYS * VLEN], vals[NKEYS * VLEN];
	size_t nmine = 0;
	int rc;

	for (uint64_t k = 0; k < NKEYS; k++) {
		keys[k] = k;
		if (k % NODES == (uint64_t)rank)
			mine[nmine++] = k;
	}
	for (int i = 0; i < NKEYS * VLEN; i++)
		ones[i] = 1.0f;
	rc = ferry_worker_create(c->fy[rank], &w);
	if (rc)
		return rc;
	for (r = 0; !rc && (r < ROUNDS || !atomic_load(&a->finished)); r++) {
		rc = ferry_push(w, c->t[rank], keys, NKEYS, ones);
		if (!rc)
			rc = ferry_pull(w, c->t[rank], keys, NKEYS, vals);
		/* keys move while the strangers knock: each node takes its third,
		 * then the next node's */
		if (!rc && r % 10 == 5)
			rc = ferry_localize(w, c->t[rank], mine, nmine);
		if (!rc && r % 10 == 0)
			for (size_t j = 0; j < nmine; j++)
				mine[j] = (mine[j] + 1) % NKEYS;
	}
	atomic_store(&a->rounds[rank], rc ? 0 : r);
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	if (!rc)
		rc = ferry_pull(w, c->t[rank], keys, NKEYS, vals);
	for (int i = 0; i < NODES; i++)
		total += atomic_load(&a->rounds[i]);
	for (int i = 0; !rc && i < NKEYS * VLEN; i++)
		if (vals[i] != (float)total) {
			fprintf(stderr, "rank %d: key %d reads %g, not %d\n", rank, i / VLEN,
				vals[i], total);
			rc = -EBADMSG;
		}
	ferry_worker_destroy(w);
	return rc;
}

Test(wirefuzz, strangers_on_the_transport_ports_harm_no_member)
{
	const char *tp = getenv("FERRY_TRANSPORT");
	struct attack a = { .rng = 0 };
	pthread_t th;
	struct tc c;
	int rc;

	if (tp && *tp && strcmp(tp, "tcp"))
		cr_skip_test("the strangers speak tcp; FERRY_TRANSPORT=%s", tp);
	a.rng = (uint64_t)time(NULL) * 2654435761u | 1;
	fprintf(stderr, "wirefuzz: seed %#llx\n", (unsigned long long)a.rng);
	cr_assert_eq(tc_open(&c, NODES, &tparams, 10000), 0);
	a.cluster_id = c.fy[0]->cluster_id;
	for (int i = 0; i < NODES; i++) {
		char addr[FERRY_TP_ADDR_MAX + 1] = "";
		size_t len = FERRY_TP_ADDR_MAX;
		char *colon;

		cr_assert_eq(c.fy[i]->tp->ops->addr_get(c.fy[i]->tp, addr, &len), 0);
		addr[len < FERRY_TP_ADDR_MAX ? len : FERRY_TP_ADDR_MAX] = '\0';
		colon = strrchr(addr, ':');
		cr_assert_not_null(colon, "node %d's address '%s' has no port", i, addr);
		*colon = '\0';
		a.node[i].rank = (uint32_t)i;
		a.node[i].sa.sin_family = AF_INET;
		a.node[i].sa.sin_port = htons((uint16_t)atoi(colon + 1));
		cr_assert_eq(inet_pton(AF_INET, addr, &a.node[i].sa.sin_addr), 1, "'%s'", addr);
	}

	pthread_create(&th, NULL, attack_thread, &a);
	rc = tc_run(&c, work, &a);
	pthread_join(th, NULL);
	cr_expect_eq(rc, 0, "the members' work failed: %s", ferry_strerror(rc));
	cr_expect_geq(a.done, ATTACKS * 9 / 10, "only %d of %d connections got through", a.done,
		      ATTACKS);
	for (int i = 0; i < NODES; i++)
		for (int j = 0; j < NODES; j++)
			cr_expect(!atomic_load(&c.fy[i]->failed[j]),
				  "rank %d marked rank %d failed", i, j);
	pthread_mutex_lock(&log_lock);
	fprintf(stderr,
		"wirefuzz: %d connections, %d refused in the handshake (%d impersonations); "
		"rounds of work %d %d %d\n",
		a.done, log_rejected, log_impersonated, atomic_load(&a.rounds[0]),
		atomic_load(&a.rounds[1]), atomic_load(&a.rounds[2]));
	cr_expect_eq(log_failed, 0, "%d failure lines, the last: %s", log_failed, log_failed_line);
	/* each stranger that sent something is refused in the handshake, logged */
	cr_expect_geq(log_rejected, a.done / 2, "only %d rejections for %d connections",
		      log_rejected, a.done);
	cr_expect_gt(log_impersonated, 0, "no impersonation reached the RESUME check");
	pthread_mutex_unlock(&log_lock);
	for (int i = 0; i < IDLE; i++)
		if (a.idle_fds[i] >= 0)
			close(a.idle_fds[i]);
	tc_close(&c);
}

/* SPDX-License-Identifier: MIT */
/*
 * Integration: a replacement node asks a running cluster to take it back
 * (FERRY_REJOIN, lib/core/rejoin.c). No replacement is admitted yet
 * (docs/faults.md, "A replacement node"): rank 0 answers each ask with its
 * verdict, the joiner's ferry_open fails with it and one line that says
 * what to do, within about 2 s, and the survivors go on serving.
 *
 * 3 nodes as threads of this process, meeting at a rendezvous the test
 * owns (so that the joiners know it); rank 2 leaves (ferry_close: its
 * goodbye fails it at the others), then the joiners come.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "lib/core/bootstrap.h"
#include "lib/core/core.h"
#include "lib/core/proto.h"
#include "lib/ops/repl.h" /* the takeovers a node ended */

#define N 3
#define KEYS 64

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_last[1024]; /* the last error line */
static char log_warn[1024]; /* the last warning with "rejoin" in it (rank 0's side) */

static void log_capture(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)arg;
	pthread_mutex_lock(&log_lock);
	if (level == FERRY_LOG_ERROR)
		snprintf(log_last, sizeof(log_last), "%s", msg);
	else if (level == FERRY_LOG_WARN && strstr(msg, "rejoin"))
		snprintf(log_warn, sizeof(log_warn), "%s", msg);
	pthread_mutex_unlock(&log_lock);
}

static void log_reset(void)
{
	pthread_mutex_lock(&log_lock);
	log_last[0] = log_warn[0] = '\0';
	pthread_mutex_unlock(&log_lock);
}

/* rank 0's line with @needle, written by its rejoin thread: it may come
 * after the joiner's own answer (a refused token proof); at most 2 s */
static bool warn_seen(const char *needle)
{
	bool seen = false;

	for (int i = 0; i < 2000 && !seen; i++) {
		pthread_mutex_lock(&log_lock);
		seen = strstr(log_warn, needle) != NULL;
		pthread_mutex_unlock(&log_lock);
		if (!seen)
			usleep(1000);
	}
	return seen;
}

static void setup(void)
{
	ferry_log_set(FERRY_LOG_WARN, log_capture, NULL);
}

struct node {
	struct ferry_params p;
	struct ferry *fy;
	struct ferry_table *t;
	int rc;
};

static const struct ferry_table_params tparams = { .num_keys = KEYS, .value_len = 1 };
static const struct ferry_table_params *cluster_tp = &tparams;
static int cluster_hb_ms; /* 0: the default */

static void *node_open(void *arg)
{
	struct node *n = arg;

	n->rc = ferry_open(&n->p, &n->fy);
	if (!n->rc)
		n->rc = ferry_table_create(n->fy, cluster_tp, &n->t);
	return NULL;
}

static char rdv[64];

#define TOKEN_A "a token of thirty-two characters"
#define TOKEN_B "another token, thirty-two bytes!"

/* the cluster, at the test's own rendezvous (@token: NULL, none), each node
 * with a table of cluster_tp */
static void cluster_open(struct node *nodes, const char *token)
{
	pthread_t th[N];
	int lfd = ferry__listen_tcp("127.0.0.1", 0, 16);

	cr_assert_geq(lfd, 0);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", ferry__socket_port(lfd));
	for (int i = 0; i < N; i++) {
		ferry_params_init(&nodes[i].p);
		nodes[i].p.rank = i;
		nodes[i].p.world = N;
		nodes[i].p.rendezvous = rdv;
		nodes[i].p.rendezvous_fd = i == 0 ? lfd : -1;
		nodes[i].p.bind_addr = "127.0.0.1";
		nodes[i].p.transport = FERRY_TRANSPORT_TCP;
		nodes[i].p.timeout_ms = 10000;
		nodes[i].p.token = token;
		nodes[i].p.heartbeat_ms = cluster_hb_ms;
		cr_assert_eq(pthread_create(&th[i], NULL, node_open, &nodes[i]), 0);
	}
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(nodes[i].rc, 0, "rank %d: %s", i, ferry_strerror(nodes[i].rc));
	}
	/* the caller's copy: rank 0 keeps its own for rejoins (bootstrap.c) */
	close(lfd);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *joiner_token; /* the next joiners' token; NULL: none */

/* a replacement's ferry_open: its result, bounded at 2 s */
static int joiner(int rank, int world, int rejoin)
{
	struct ferry_params p;
	struct ferry *fy = NULL;
	int64_t t0 = now_ms();
	int rc;

	ferry_params_init(&p);
	p.rank = rank;
	p.world = world;
	p.rendezvous = rdv;
	p.bind_addr = "127.0.0.1";
	p.transport = FERRY_TRANSPORT_TCP;
	p.timeout_ms = 20000;
	p.rejoin = rejoin;
	p.token = joiner_token;
	log_reset();
	rc = ferry_open(&p, &fy);
	cr_assert_lt(now_ms() - t0, 2000, "rank %d's answer took %lld ms of a 20 s timeout", rank,
		     (long long)(now_ms() - t0));
	cr_assert_null(fy);
	return rc;
}

static uint32_t peers_failed(struct ferry *fy)
{
	struct ferry_stats s;

	cr_assert_eq(ferry_stats(fy, &s), 0);
	return (uint32_t)s.peers_failed;
}

Test(rejoin, rank_0_answers_every_ask_and_the_survivors_go_on, .init = setup, .timeout = 60)
{
	struct node nodes[N];
	struct ferry_worker *w[2];
	float one = 1.0f, v;

	cluster_open(nodes, NULL);
	/* rank 2 is alive: a replacement for it is refused */
	cr_assert_eq(joiner(2, N, 1), -EEXIST);
	cr_assert(strstr(log_last, "rank 2 is alive in the cluster") &&
			  strstr(log_last, "stop the old process first"),
		  "%s", log_last);
	cr_assert(warn_seen("rank 2 is alive here"), "rank 0 did not log its refusal");

	/* rank 2 leaves; ranks 0 and 1 hold it failed */
	ferry_table_destroy(nodes[2].t);
	ferry_close(nodes[2].fy);
	for (int64_t until = now_ms() + 5000;
	     (peers_failed(nodes[0].fy) < 1 || peers_failed(nodes[1].fy) < 1) && now_ms() < until;)
		usleep(1000);
	cr_assert_eq(peers_failed(nodes[0].fy), 1);
	cr_assert_eq(peers_failed(nodes[1].fy), 1);

	/* a replacement for it: rank 0 and rank 1 (asked by rank 0: REJOIN_ASK)
	 * know it failed, and rank 0 cannot admit it */
	cr_assert_eq(joiner(2, N, 1), -EOPNOTSUPP);
	cr_assert(strstr(log_last, "holds rank 2 failed, but cannot admit a replacement") &&
			  strstr(log_last, "ferry_restore"),
		  "%s", log_last);
	cr_assert(warn_seen("it failed here and at every live rank"), "rank 0 did not log the ask");

	/* another world, and a live rank */
	cr_assert_eq(joiner(2, N + 1, 1), -FERRY_E_MISMATCH);
	cr_assert(strstr(log_last, "runs a world of 3 nodes"), "%s", log_last);
	cr_assert_eq(joiner(1, N, 1), -EEXIST);

	/* without the switch: told the cluster runs already, at once */
	cr_assert_eq(joiner(2, N, -1), -EALREADY);
	cr_assert(strstr(log_last, "runs its cluster already") &&
			  strstr(log_last, "FERRY_REJOIN=1"),
		  "%s", log_last);

	/* the survivors serve, rank 2's keys aside (no replicas here) */
	for (int i = 0; i < 2; i++)
		cr_assert_eq(ferry_worker_create(nodes[i].fy, &w[i]), 0);
	for (uint64_t k = 0; k < KEYS; k++) {
		if (ferry_table_home(nodes[0].t, k) == 2)
			continue;
		cr_assert_eq(ferry_push(w[0], nodes[0].t, &k, 1, &one), 0, "key %llu",
			     (unsigned long long)k);
		cr_assert_eq(ferry_push(w[1], nodes[1].t, &k, 1, &one), 0);
		cr_assert_eq(ferry_pull(w[1], nodes[1].t, &k, 1, &v), 0);
		cr_assert_eq(v, 2.0f, "key %llu is %g", (unsigned long long)k, (double)v);
	}
	for (int i = 0; i < 2; i++) {
		ferry_worker_destroy(w[i]);
		ferry_table_destroy(nodes[i].t);
		ferry_close(nodes[i].fy);
	}
}

/* no cluster at the rendezvous: refused at once, not at the timeout */
Test(rejoin, a_rejoin_without_a_cluster_fails_at_once, .init = setup, .timeout = 60)
{
	int lfd = ferry__listen_tcp("127.0.0.1", 0, 1);

	cr_assert_geq(lfd, 0);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", ferry__socket_port(lfd));
	close(lfd); /* a port nobody listens on */
	cr_assert_eq(joiner(1, 2, 1), -FERRY_E_NOJOIN);
	cr_assert(strstr(log_last, "found no cluster at") && strstr(log_last, "FERRY_RENDEZVOUS"),
		  "%s", log_last);
}

static void close_all(struct node *nodes, int n)
{
	for (int i = 0; i < n; i++) {
		ferry_table_destroy(nodes[i].t);
		ferry_close(nodes[i].fy);
	}
}

/* with a cluster token, the ask proves it first: the same token gets the
 * verdict, another one or none is refused without one */
Test(rejoin, with_a_token_only_a_joiner_that_proves_it_gets_a_verdict, .init = setup, .timeout = 60)
{
	struct node nodes[N];

	cluster_open(nodes, TOKEN_A);
	joiner_token = TOKEN_A;
	cr_assert_eq(joiner(1, N, 1), -EEXIST);
	cr_assert(strstr(log_last, "rank 1 is alive in the cluster"), "%s", log_last);
	joiner_token = TOKEN_B;
	cr_assert_eq(joiner(1, N, 1), -EACCES);
	cr_assert(strstr(log_last, "rejoin: rank 1: rank 0 at") && strstr(log_last, "FERRY_TOKEN"),
		  "%s", log_last);
	cr_assert(warn_seen("refused a connection to the rendezvous"),
		  "rank 0 did not log the refused proof");
	joiner_token = NULL;
	cr_assert_eq(joiner(1, N, 1), -FERRY_E_NOJOIN);
	cr_assert(strstr(log_last, "gave no verdict") && strstr(log_last, "cluster token"), "%s",
		  log_last);
	close_all(nodes, N);
}

/* the rejoin hello's checks (a pure function, as the rendezvous's) */
Test(rejoin, the_rejoin_hello_is_checked, .init = setup, .timeout = 60)
{
	struct ferry_bs_hello h = { .magic = FERRY_BS_REJOIN_MAGIC,
				    .version = FERRY_BS_VERSION,
				    .rank = 2,
				    .world = 4 },
			      out;

	cr_assert_eq(ferry__bs_rejoin_parse(&h, sizeof(h), 4, &out), 0);
	cr_assert_eq(out.rank, 2);
	cr_assert_eq(ferry__bs_rejoin_parse(&h, sizeof(h) - 1, 4, &out), -FERRY_E_PROTO);
	cr_assert_eq(ferry__bs_rejoin_parse(&h, sizeof(h), 5, &out), -FERRY_E_MISMATCH);
	h.rank = 0;
	cr_assert_eq(ferry__bs_rejoin_parse(&h, sizeof(h), 4, &out), -EINVAL);
	h.rank = 4;
	cr_assert_eq(ferry__bs_rejoin_parse(&h, sizeof(h), 4, &out), -EINVAL);
	h.rank = 2;
	h.addr.len = FERRY_TP_ADDR_MAX + 1;
	cr_assert_eq(ferry__bs_rejoin_parse(&h, sizeof(h), 4, &out), -FERRY_E_PROTO);
	h.addr.len = 0;
	h.version = FERRY_BS_VERSION + 1;
	cr_assert_eq(ferry__bs_rejoin_parse(&h, sizeof(h), 4, &out), -FERRY_E_PROTO);
	h.version = FERRY_BS_VERSION;
	h.magic = FERRY_BS_MAGIC; /* a plain hello is not a rejoin */
	cr_assert_eq(ferry__bs_rejoin_parse(&h, sizeof(h), 4, &out), -FERRY_E_PROTO);
}

/* rank 0 alone holds rank 2 failed (its membership manager said so: a
 * MGR_DEAD frame to itself), rank 1 holds it alive: rank 0 asks rank 1
 * (REJOIN_ASK), which answers that it is alive (REJOIN_VIEW): refused */
Test(rejoin, a_live_rank_that_holds_the_rank_alive_refuses_the_replacement, .init = setup,
     .timeout = 60)
{
	struct node nodes[N];
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_mgr m;
	} f;

	cluster_open(nodes, NULL);
	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, FERRY_MSG_MGR_DEAD, sizeof(f), 0, 0);
	f.m.rank = 2;
	f.m.epoch = 1;
	cr_assert_eq(ferry__send(nodes[0].fy, 0, &f, sizeof(f)), 0);
	for (int64_t until = now_ms() + 5000; peers_failed(nodes[0].fy) < 1 && now_ms() < until;)
		usleep(1000);
	cr_assert_eq(peers_failed(nodes[0].fy), 1);
	cr_assert_eq(peers_failed(nodes[1].fy), 0, "rank 1 failed rank 2 too: not the case");

	cr_assert_eq(joiner(2, N, 1), -EEXIST);
	cr_assert(strstr(log_last, "rank 2 is alive in the cluster"), "%s", log_last);
	cr_assert(warn_seen("rank 1 holds it alive"), "rank 0 did not log rank 1's view");
	close_all(nodes, N);
}

/* rank 2 failed at ranks 0 and 1 (their managers said so) while its process
 * lives, so their takeover of it waits out the lease (docs/faults.md,
 * "Fencing"): a replacement asking meanwhile is told to ask again
 * (-EAGAIN), and once both ended it, -EOPNOTSUPP */
Test(rejoin, a_replacement_waits_for_every_takeover_of_its_rank, .init = setup, .timeout = 60)
{
	static const struct ferry_table_params rtp = { .num_keys = KEYS,
						       .value_len = 1,
						       .replicas = 1 };
	struct node nodes[N];
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_mgr m;
	} f;
	int rc;

	cluster_tp = &rtp;
	cluster_hb_ms = 3000; /* the takeover waits about this long */
	cluster_open(nodes, NULL);
	for (uint32_t i = 0; i < 2; i++) {
		memset(&f, 0, sizeof(f));
		ferry__proto_hdr_init(&f.h, FERRY_MSG_MGR_DEAD, sizeof(f), i, 0);
		f.m.rank = 2;
		f.m.epoch = 1;
		cr_assert_eq(ferry__send(nodes[i].fy, i, &f, sizeof(f)), 0);
	}
	for (int64_t until = now_ms() + 5000;
	     (peers_failed(nodes[0].fy) < 1 || peers_failed(nodes[1].fy) < 1) && now_ms() < until;)
		usleep(1000);
	cr_assert_eq(atomic_load(&nodes[0].t->repl->takeovers), 0,
		     "the takeover did not wait: the case needs it to");
	rc = joiner(2, N, 1);
	cr_assert_eq(rc, -EAGAIN, "the verdict during the takeover: %s", ferry_strerror(rc));
	cr_assert(strstr(log_last, "ask again"), "%s", log_last);
	cr_assert(warn_seen("takeover of it is still under way"), "rank 0 did not say why");
	for (int64_t until = now_ms() + 15000; (!atomic_load(&nodes[0].t->repl->takeovers) ||
						!atomic_load(&nodes[1].t->repl->takeovers)) &&
					       now_ms() < until;)
		usleep(1000);
	cr_assert(atomic_load(&nodes[0].t->repl->takeovers) &&
			  atomic_load(&nodes[1].t->repl->takeovers),
		  "a takeover did not end within 15 s");
	rc = joiner(2, N, 1);
	cr_assert_eq(rc, -EOPNOTSUPP, "the verdict after the takeovers: %s", ferry_strerror(rc));
	close_all(nodes, N);
	cluster_tp = &tparams;
	cluster_hb_ms = 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * The cluster token at the rendezvous and end to end (issue 16, item 1):
 * nodes (threads) that share a token form a cluster through ferry_open; a
 * node with another token, or none, is refused at the rendezvous with one
 * line naming its address and gets an error that says to fix the token; a
 * node with a token is refused by a rank 0 without one, and says so; the
 * token comes from the params, FERRY_TOKEN or FERRY_TOKEN_FILE; without a
 * token, a node that listens beyond loopback warns. The transport ports'
 * half is in tests/transport/test_transport.c (the "token" cases).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "lib/core/bootstrap.h"
#include "lib/core/config.h"

#define RANKS 3
#define TOKEN_A "a token of thirty-two characters"
#define TOKEN_B "another token, thirty-two bytes!"

/* ---- the log, kept ------------------------------------------------------- */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_lines[256][512];
static int log_n;

static void log_cb(enum ferry_log_level level, const char *msg, void *arg)
{
	(void)level;
	(void)arg;
	pthread_mutex_lock(&log_lock);
	if (log_n < 256)
		snprintf(log_lines[log_n++], sizeof(log_lines[0]), "%s", msg);
	pthread_mutex_unlock(&log_lock);
}

static void log_capture(void)
{
	ferry_log_set(FERRY_LOG_WARN, log_cb, NULL);
}

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

/* ---- a cluster of threads ------------------------------------------------ */

struct rank_arg {
	struct ferry_params p;
	struct ferry *fy;
	int rc;
};

static void *rank_thread(void *p)
{
	struct rank_arg *a = p;

	a->rc = ferry_open(&a->p, &a->fy);
	if (!a->rc)
		a->rc = ferry_barrier(a->fy);
	return NULL;
}

/* RANKS nodes, rank r with @tokens[r] (NULL: the environment's, or none),
 * meet at a fresh rendezvous within @timeout_ms; @rc receives each result */
static void form(const char *const *tokens, int timeout_ms, int *rc)
{
	struct rank_arg a[RANKS];
	pthread_t th[RANKS];
	int lfd = ferry__listen_tcp("127.0.0.1", 0, 128);
	char rdv[64];

	cr_assert_geq(lfd, 0);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", ferry__socket_port(lfd));
	for (int i = 0; i < RANKS; i++) {
		ferry_params_init(&a[i].p);
		a[i].p.rank = i;
		a[i].p.world = RANKS;
		a[i].p.rendezvous = rdv;
		a[i].p.rendezvous_fd = i == 0 ? lfd : -1;
		/* FERRY_TRANSPORT=rdma FERRY_BIND_ADDR=10.77.0.1: the SoftRoCE guest */
		a[i].p.bind_addr = getenv("FERRY_BIND_ADDR") ? NULL : "127.0.0.1";
		a[i].p.transport = getenv("FERRY_TRANSPORT") ? FERRY_TRANSPORT_AUTO :
							       FERRY_TRANSPORT_TCP;
		a[i].p.timeout_ms = timeout_ms;
		a[i].p.token = tokens[i];
		a[i].fy = NULL;
		pthread_create(&th[i], NULL, rank_thread, &a[i]);
	}
	for (int i = 0; i < RANKS; i++) {
		pthread_join(th[i], NULL);
		rc[i] = a[i].rc;
	}
	for (int i = 0; i < RANKS; i++)
		if (a[i].fy)
			ferry_close(a[i].fy);
	close(lfd);
}

TestSuite(auth, .init = log_capture, .timeout = 60);

Test(auth, nodes_with_the_same_token_form_a_cluster)
{
	const char *tokens[RANKS] = { TOKEN_A, TOKEN_A, TOKEN_A };
	int rc[RANKS];

	form(tokens, 5000, rc);
	for (int i = 0; i < RANKS; i++)
		cr_expect_eq(rc[i], 0, "rank %d: %s", i, ferry_strerror(rc[i]));
	cr_expect_eq(log_count("refused", NULL), 0);
}

/* rank 2 has @tok2: it is refused at the rendezvous, fast, with an error that
 * names the token; rank 0 names its address; the others time out on it */
static void refused_case(const char *tok0, const char *tok2, const char *rank0_says,
			 const char *rank2_says)
{
	const char *tokens[RANKS] = { tok0, tok0, tok2 };
	int rc[RANKS];

	form(tokens, 1500, rc);
	cr_expect_eq(rc[2], -EACCES, "rank 2 (token %s) got %s", tok2 ? tok2 : "none",
		     ferry_strerror(rc[2]));
	cr_expect_eq(rc[0], -FERRY_E_NOJOIN, "rank 0: %s", ferry_strerror(rc[0]));
	cr_expect_neq(rc[1], 0, "rank 1 formed a cluster without rank 2");
	cr_expect_eq(log_count("refused a rendezvous connection from 127.0.0.1", rank0_says), 1,
		     "rank 0 did not name the address of the node it refused");
	cr_expect_geq(log_count("rank 2", rank2_says), 1, "rank 2 did not say \"%s\"", rank2_says);
}

Test(auth, a_node_with_another_token_is_refused_at_the_rendezvous)
{
	refused_case(TOKEN_A, TOKEN_B, "token proof is wrong", "same FERRY_TOKEN");
}

Test(auth, a_node_without_a_token_is_refused_at_the_rendezvous)
{
	refused_case(TOKEN_A, NULL, "sent no token proof", "without; give every node");
}

Test(auth, a_node_with_a_token_is_refused_by_a_rank_0_without_one)
{
	refused_case(NULL, TOKEN_A, "it opens with a token proof",
		     "closed the connection instead of proving the token");
}

Test(auth, the_token_comes_from_FERRY_TOKEN_or_FERRY_TOKEN_FILE)
{
	const char *none[RANKS] = { NULL, NULL, NULL };
	char path[] = "/tmp/ferry-token-XXXXXX";
	int rc[RANKS], fd;

	setenv("FERRY_TOKEN", TOKEN_A, 1);
	form(none, 5000, rc);
	for (int i = 0; i < RANKS; i++)
		cr_expect_eq(rc[i], 0, "FERRY_TOKEN: rank %d: %s", i, ferry_strerror(rc[i]));
	unsetenv("FERRY_TOKEN");

	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, TOKEN_A "\n", sizeof(TOKEN_A)), (ssize_t)sizeof(TOKEN_A));
	close(fd);
	setenv("FERRY_TOKEN_FILE", path, 1);
	form(none, 5000, rc);
	for (int i = 0; i < RANKS; i++)
		cr_expect_eq(rc[i], 0, "FERRY_TOKEN_FILE: rank %d: %s", i, ferry_strerror(rc[i]));
	cr_expect_eq(log_count("can be read by other users", NULL), 0, "mkstemp makes it 0600");

	/* the file's token against another in the params: refused */
	{
		const char *b2[RANKS] = { NULL, NULL, TOKEN_B };

		form(b2, 1500, rc);
		cr_expect_eq(rc[2], -EACCES, "a token unlike the file's: %s",
			     ferry_strerror(rc[2]));
	}
	chmod(path, 0644);
	form(none, 5000, rc);
	cr_expect_eq(rc[0], 0);
	cr_expect_geq(log_count("can be read by other users", "chmod 600"), 1);
	unlink(path);
}

/* what ferry__config_resolve makes of @token, binding @bind as rank @rank */
static int resolve(const char *token, const char *bind, int rank, struct ferry_config *c)
{
	struct ferry_params p;

	ferry_params_init(&p);
	p.rank = rank;
	p.world = 2;
	p.rendezvous = "127.0.0.1:1";
	p.bind_addr = bind;
	p.transport = FERRY_TRANSPORT_TCP;
	p.token = token;
	memset(c, 0, sizeof(*c));
	return ferry__config_resolve(&p, c);
}

Test(auth, without_a_token_a_node_beyond_loopback_warns_how_to_set_one)
{
	struct ferry_config c;

	cr_assert_eq(resolve(NULL, "127.0.0.1", 1, &c), 0);
	cr_expect_eq(c.auth, 0);
	cr_expect_eq(log_count("no cluster token", NULL), 0, "loopback alone: no warning");
	cr_assert_eq(resolve(NULL, "0.0.0.0", 1, &c), 0);
	cr_expect_eq(log_count("no cluster token", "set FERRY_TOKEN"), 1);
	cr_assert_eq(resolve(TOKEN_A, "0.0.0.0", 1, &c), 0);
	cr_expect_eq(c.auth, 1);
	cr_expect_eq(log_count("no cluster token", NULL), 1, "a token: no warning");
	cr_expect_eq(resolve("", "127.0.0.1", 1, &c), -EINVAL, "an empty token");
	cr_expect_eq(log_count("is empty", NULL), 1);
	cr_assert_eq(resolve("short", "127.0.0.1", 1, &c), 0);
	cr_expect_eq(log_count("has 5 bytes", NULL), 1, "a short token is not named");
	setenv("FERRY_TOKEN", TOKEN_A, 1);
	setenv("FERRY_TOKEN_FILE", "/nonexistent", 1);
	cr_expect_eq(resolve(NULL, "127.0.0.1", 1, &c), -EINVAL, "two sources");
	unsetenv("FERRY_TOKEN");
	cr_expect_eq(resolve(NULL, "127.0.0.1", 1, &c), -EINVAL, "a missing file");
	cr_expect_eq(log_count("cannot read FERRY_TOKEN_FILE=/nonexistent", NULL), 1);
}

/* SPDX-License-Identifier: MIT */
/*
 * The rendezvous (lib/core/bootstrap.c) against connections that are not
 * ranks: rank 0 serves every connection at once, each has a second to
 * introduce itself, and the oldest silent one from an address gives way to
 * a newcomer, so idle, slow and garbage connections cannot keep the real
 * ranks out (issue 16: 8 idle connections used to make every rank fail).
 *
 * Each case opens its strangers against rank 0's listening socket before the
 * ranks start, holds them open while three ranks (threads) form a cluster
 * with a 5 s timeout, and checks that the cluster formed well inside it.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "lib/core/bootstrap.h"

#define RANKS 3
#define TIMEOUT_MS 5000

struct rank_arg {
	struct ferry_params p;
	struct ferry *fy;
	int rc;
};

static void *rank_thread(void *p)
{
	struct rank_arg *a = p;

	a->rc = ferry_open(&a->p, &a->fy);
	return NULL;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int dial(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0);
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "connect: %s",
		     strerror(errno));
	return fd;
}

/* the cluster's token (NULL: none); a case sets it */
static const char *token;

enum stranger {
	IDLE,
	HALF_HELLO,
	GARBAGE
};

/*
 * Open @n connections of @kind against a fresh rendezvous, then let RANKS
 * ranks meet there. Asserts every rank joined, within 3 s (the old server
 * spent up to 1 s on each stranger, one after the other).
 */
static void form_with_strangers(int n, enum stranger kind)
{
	struct rank_arg a[RANKS];
	pthread_t th[RANKS];
	int *fds = calloc((size_t)n, sizeof(int));
	int lfd = ferry__listen_tcp("127.0.0.1", 0, 1024), port;
	int64_t t0, took;
	char rdv[64];

	cr_assert_not_null(fds);
	cr_assert_geq(lfd, 0);
	port = ferry__socket_port(lfd);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", port);
	for (int i = 0; i < n; i++) {
		struct ferry_bs_hello h = { .magic = FERRY_BS_MAGIC, .version = FERRY_BS_VERSION };

		fds[i] = dial(port);
		if (kind == HALF_HELLO)
			cr_assert_eq(send(fds[i], &h, sizeof(h) / 2, MSG_NOSIGNAL),
				     (ssize_t)sizeof(h) / 2);
		else if (kind == GARBAGE) {
			/* as long as a hello, so it is read whole and refused */
			memset(&h, 'G', sizeof(h));
			cr_assert_eq(send(fds[i], &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
		}
	}
	t0 = now_ms();
	for (int i = 0; i < RANKS; i++) {
		ferry_params_init(&a[i].p);
		a[i].p.rank = i;
		a[i].p.world = RANKS;
		a[i].p.rendezvous = rdv;
		a[i].p.rendezvous_fd = i == 0 ? lfd : -1;
		a[i].p.bind_addr = "127.0.0.1";
		a[i].p.transport = FERRY_TRANSPORT_TCP;
		a[i].p.timeout_ms = TIMEOUT_MS;
		a[i].p.token = token;
		a[i].fy = NULL;
		pthread_create(&th[i], NULL, rank_thread, &a[i]);
	}
	for (int i = 0; i < RANKS; i++)
		pthread_join(th[i], NULL);
	took = now_ms() - t0;
	for (int i = 0; i < RANKS; i++)
		cr_expect_eq(a[i].rc, 0, "rank %d did not join beside %d strangers: %s", i, n,
			     ferry_strerror(a[i].rc));
	cr_expect_lt(took, 3000, "the cluster took %lld ms to form beside %d strangers",
		     (long long)took, n);
	for (int i = 0; i < RANKS; i++)
		if (!a[i].rc)
			ferry_close(a[i].fy);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	free(fds);
	close(lfd);
}

Test(rendezvous, the_cluster_forms_with_100_idle_connections_held_open, .timeout = 60)
{
	form_with_strangers(100, IDLE);
}

/* more than rank 0 keeps waiting at once (BS_PENDING_MAX) and from one
 * address (BS_PER_SOURCE): the oldest give way, the ranks get in */
Test(rendezvous, the_cluster_forms_with_400_idle_connections_from_one_address, .timeout = 60)
{
	form_with_strangers(400, IDLE);
}

Test(rendezvous, the_cluster_forms_beside_50_half_sent_hellos, .timeout = 60)
{
	form_with_strangers(50, HALF_HELLO);
}

Test(rendezvous, the_cluster_forms_beside_50_connections_that_send_garbage, .timeout = 60)
{
	form_with_strangers(50, GARBAGE);
}

/* with a token, each connection must also prove it before its hello: the
 * strangers cannot, and the ranks still get in */
Test(rendezvous, a_token_cluster_forms_with_100_idle_connections_held_open, .timeout = 60)
{
	token = "the rendezvous test's token, 32B";
	form_with_strangers(100, IDLE);
}

Test(rendezvous, a_token_cluster_forms_beside_50_connections_that_send_garbage, .timeout = 60)
{
	token = "the rendezvous test's token, 32B";
	form_with_strangers(50, GARBAGE);
}

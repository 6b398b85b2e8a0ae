/* SPDX-License-Identifier: MIT */
/*
 * rejoin.c - a replacement node asks a running cluster to take it back in,
 * over rank 0's rendezvous port, which rank 0 keeps for the cluster's life:
 *
 *   joiner (rank d, FERRY_REJOIN=1)           rank 0, its rejoin thread
 *     | connect (no retry: the cluster runs    | accept; the token proof
 *     |   or it does not)                      |   (with FERRY_TOKEN)
 *     | BS_HELLO{REJOIN magic, d, world, addr} ->  d below world, not 0, same
 *     |                                        |   world; d failed here?
 *     | <---- BS_LIST{status, world}: no addresses
 *
 *   status  -EEXIST        d is alive at rank 0: a rejoin replaces a failed node
 *           -EOPNOTSUPP    d failed, but no replacement is admitted yet
 *           -FERRY_E_MISMATCH, -EINVAL   another world; rank 0 or out of range
 *
 * A plain hello (a node started without the switch after the cluster
 * formed) is answered -EALREADY (its line says to use FERRY_REJOIN), and
 * rank 0's own probe of a taken port (another process claiming rank 0)
 * -FERRY_E_MISMATCH, as the rendezvous answers both.
 *
 * What admission needs beyond this verdict (a new transport session for
 * the rank, its tables, the homes its failure passed on) is in
 * docs/faults.md, "A replacement node": not built.
 *
 * Threads: ferry__bs_rejoin runs in the joiner's ferry_open; the service is
 * a thread of rank 0's, started once the node is up and stopped by
 * ferry__node_close before the transport goes. It serves one connection at
 * a time, each bounded by REJOIN_HELLO_MS (a rejoin is rare, and nobody
 * else waits on this port once the cluster formed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/core/bootstrap.h"
#include "transport/base/log.h"

#define REJOIN_HELLO_MS 1000 /* a connection's time for its proof and hello */
#define REJOIN_DIAL_MS 2000  /* the joiner's bound on the whole exchange */

/*
 * Rank 0's rejoin service. Memory: this struct (about 100 B); one
 * connection at a time, on the stack of its thread.
 */
struct ferry_rejoin_srv {
	int lfd;
	int wake[2]; /* a byte in wake[1] stops the thread */
	pthread_t thread;
	uint32_t world;
	int auth;
	uint8_t auth_key[FERRY_AUTH_KEY_LEN];
	bool (*failed)(void *arg, uint32_t rank);
	void *arg;
};

int ferry__bs_rejoin_parse(const void *buf, size_t len, uint32_t world, struct ferry_bs_hello *h_p)
{
	struct ferry_bs_hello h;

	if (len < sizeof(h))
		return -FERRY_E_PROTO;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != FERRY_BS_REJOIN_MAGIC || h.version != FERRY_BS_VERSION ||
	    h.addr.len > FERRY_TP_ADDR_MAX)
		return -FERRY_E_PROTO;
	*h_p = h;
	if (h.world != world)
		return -FERRY_E_MISMATCH;
	if (h.rank == 0 || h.rank >= world)
		return -EINVAL;
	return 0;
}

/* ---- the joiner ------------------------------------------------------------ */

int ferry__bs_rejoin(const struct ferry_config *c, const struct ferry_addr *mine)
{
	int64_t deadline = ferry__bs_now_ms() + REJOIN_DIAL_MS;
	struct ferry_bs_hello h = { .magic = FERRY_BS_REJOIN_MAGIC,
				    .version = FERRY_BS_VERSION,
				    .rank = (uint32_t)c->rank,
				    .world = (uint32_t)c->world,
				    .addr = *mine };
	struct ferry_bs_list list = { 0 };
	struct sockaddr_in sa;
	int fd, rc, one = 1;
	char why[512];

	rc = ferry__bs_resolve(c->rdv_host, c->rdv_port, &sa, c->rdv_var);
	if (rc)
		return rc;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		rc = -errno;
		ferry_err("rejoin: rank %d found no cluster at %s:%d (%s): a rejoin needs the "
			  "running cluster's rendezvous, where its rank 0 listens; give that "
			  "FERRY_RENDEZVOUS (this one came from %s), or start a new cluster "
			  "without FERRY_REJOIN",
			  c->rank, c->rdv_host, c->rdv_port, strerror(-rc), c->rdv_var);
		close(fd);
		return -FERRY_E_NOJOIN;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (c->auth) {
		rc = ferry__bs_auth_dial(c, fd, deadline, why, sizeof(why));
		if (rc) {
			ferry_err("rejoin: rank %d: rank 0 at %s:%d %s: %s; give the replacement "
				  "the cluster's FERRY_TOKEN (this one's came from %s)",
				  c->rank, c->rdv_host, c->rdv_port,
				  rc == -ETIMEDOUT ? "did not prove the token in time" :
						     "is refused",
				  rc == -ETIMEDOUT ? "see its log" : why, c->auth_src);
			close(fd);
			return rc == -ETIMEDOUT ? -ETIMEDOUT : -EACCES;
		}
	}
	rc = ferry__bs_io(fd, &h, sizeof(h), deadline, 1);
	if (!rc)
		rc = ferry__bs_io(fd, &list, sizeof(list), deadline, 0);
	close(fd);
	if (rc) {
		ferry_err("rejoin: rank %d: rank 0 at %s:%d gave no verdict (%s): its cluster "
			  "may still be forming (a rejoin needs a running one), or it was started "
			  "with a cluster token and this node without; see rank 0's log",
			  c->rank, c->rdv_host, c->rdv_port, strerror(-rc));
		return -FERRY_E_NOJOIN;
	}
	if (list.magic != FERRY_BS_MAGIC || list.status >= 0) {
		ferry_err("rejoin: rank %d: rank 0 at %s:%d answered with garbage", c->rank,
			  c->rdv_host, c->rdv_port);
		return -FERRY_E_PROTO;
	}
	switch (list.status) {
	case -EEXIST:
		ferry_err("rejoin: rank 0 at %s:%d holds rank %d alive: a rejoin replaces a "
			  "failed node; stop the old process first and wait until the cluster "
			  "fails it, or give this one the failed node's rank (FERRY_RANK)",
			  c->rdv_host, c->rdv_port, c->rank);
		break;
	case -EOPNOTSUPP:
		ferry_err("rejoin: rank 0 at %s:%d holds rank %d failed, but cannot admit a "
			  "replacement yet (docs/faults.md, \"A replacement node\"); the "
			  "survivors go on without it: to have %d nodes again, start the whole "
			  "cluster again and ferry_restore() its last checkpoint",
			  c->rdv_host, c->rdv_port, c->rank, c->world);
		break;
	case -FERRY_E_MISMATCH:
		ferry_err("rejoin: rank 0 at %s:%d runs a world of %u nodes, but this node was "
			  "started with %d (from %s); give the cluster's world",
			  c->rdv_host, c->rdv_port, list.world, c->world, c->rank_src);
		break;
	default:
		ferry_err("rejoin: rank 0 at %s:%d refused rank %d: %s", c->rdv_host, c->rdv_port,
			  c->rank, ferry_strerror(list.status));
		break;
	}
	return list.status;
}

/* ---- rank 0's service -------------------------------------------------------- */

/* the token proof of an accepted connection; 0, or a negative errno */
static int srv_auth(struct ferry_rejoin_srv *s, int fd, int64_t deadline, const char *who)
{
	struct ferry_auth_hs a;
	int rc;

	ferry__auth_hs_init(&a, s->auth_key, "bootstrap", FERRY_AUTH_ACCEPTOR, 0);
	while ((rc = ferry__auth_hs_step(&a, fd)) == 0) {
		struct pollfd pfd = {
			.fd = fd, .events = POLLIN | (ferry__auth_hs_want_out(&a) ? POLLOUT : 0)
		};
		int64_t left = deadline - ferry__bs_now_ms();

		if (left <= 0 || (poll(&pfd, 1, (int)left) < 0 && errno != EINTR))
			return -ETIMEDOUT;
	}
	if (rc == 1)
		return 0;
	if (rc == -EACCES)
		ferry_warn("rejoin: refused a connection to the rendezvous from %s: %s", who,
			   a.why);
	return rc < 0 ? rc : -EACCES;
}

/* one connection: its hello, the verdict, one line */
static void srv_serve(struct ferry_rejoin_srv *s, int fd, const char *who)
{
	int64_t deadline = ferry__bs_now_ms() + REJOIN_HELLO_MS;
	struct ferry_bs_list v = { .magic = FERRY_BS_MAGIC, .world = s->world };
	struct ferry_bs_hello raw, h;
	int rc;

	if (s->auth && srv_auth(s, fd, deadline, who))
		return;
	if (ferry__bs_io(fd, &raw, sizeof(raw), deadline, 0))
		return; /* silent or gone: nothing to answer */
	rc = ferry__bs_rejoin_parse(&raw, sizeof(raw), s->world, &h);
	if (rc == -FERRY_E_PROTO && !ferry__bs_hello_parse(&raw, sizeof(raw), s->world, &h)) {
		ferry_warn("rejoin: rank %u connected to the rendezvous from %s after the cluster "
			   "formed, without FERRY_REJOIN; told it so",
			   h.rank, who);
		v.status = -EALREADY;
	} else if (rc == -FERRY_E_PROTO) {
		/* rank 0's probe of a taken port (rank 0 in its hello), or garbage */
		memcpy(&h, &raw, sizeof(h));
		if (h.magic != FERRY_BS_MAGIC) {
			ferry_warn("rejoin: dropped a connection to the rendezvous from %s that "
				   "did not introduce itself as a Ferry node",
				   who);
			return;
		}
		v.status = -FERRY_E_MISMATCH;
	} else if (rc == -FERRY_E_MISMATCH) {
		ferry_warn("rejoin: refused a rejoin of rank %u from %s: it was started with a "
			   "world of %u, this cluster has %u",
			   h.rank, who, h.world, s->world);
		v.status = rc;
	} else if (rc) {
		ferry_warn("rejoin: refused a rejoin of rank %u from %s: %s", h.rank, who,
			   h.rank ? "not below the world size" :
				    "rank 0 cannot be replaced (it coordinates the cluster)");
		v.status = rc;
	} else if (!s->failed(s->arg, h.rank)) {
		ferry_warn("rejoin: refused a rejoin of rank %u from %s: rank %u is alive here",
			   h.rank, who, h.rank);
		v.status = -EEXIST;
	} else {
		ferry_warn("rejoin: rank %u asks to rejoin from %s; it failed here, but this "
			   "build cannot admit a replacement (docs/faults.md, \"A replacement "
			   "node\"): refused",
			   h.rank, who);
		v.status = -EOPNOTSUPP;
	}
	(void)ferry__bs_io(fd, &v, sizeof(v), deadline, 1);
}

static void *srv_main(void *arg)
{
	struct ferry_rejoin_srv *s = arg;

	for (;;) {
		struct pollfd pfd[2] = { { .fd = s->lfd, .events = POLLIN },
					 { .fd = s->wake[0], .events = POLLIN } };
		struct sockaddr_in sa = { 0 };
		socklen_t salen = sizeof(sa);
		char who[INET_ADDRSTRLEN + 8] = "?";
		int fd, one = 1;

		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			ferry_warn("rejoin: poll: %s; rank 0 stops answering rejoins",
				   strerror(errno));
			break;
		}
		if (pfd[1].revents)
			break;
		if (!(pfd[0].revents & POLLIN))
			continue;
		fd = accept4(s->lfd, (struct sockaddr *)&sa, &salen, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			continue;
		if (sa.sin_family == AF_INET)
			inet_ntop(AF_INET, &sa.sin_addr, who, sizeof(who));
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		srv_serve(s, fd, who);
		close(fd);
	}
	return NULL;
}

int ferry__rejoin_srv_start(const struct ferry_config *c, int lfd,
			    bool (*failed)(void *arg, uint32_t rank), void *arg,
			    struct ferry_rejoin_srv **srv_p)
{
	struct ferry_rejoin_srv *s = calloc(1, sizeof(*s));
	int rc;

	if (!s) {
		close(lfd);
		return -ENOMEM;
	}
	s->lfd = lfd;
	s->world = (uint32_t)c->world;
	s->auth = c->auth;
	memcpy(s->auth_key, c->auth_key, sizeof(s->auth_key));
	s->failed = failed;
	s->arg = arg;
	if (pipe2(s->wake, O_CLOEXEC)) {
		rc = -errno;
		goto err_free;
	}
	rc = -pthread_create(&s->thread, NULL, srv_main, s);
	if (rc)
		goto err_close_pipe;
	pthread_setname_np(s->thread, "ferry-rejoin");
	*srv_p = s;
	return 0;

err_close_pipe:
	close(s->wake[0]);
	close(s->wake[1]);
err_free:
	close(lfd);
	ferry__auth_wipe(s->auth_key, sizeof(s->auth_key));
	free(s);
	return rc;
}

void ferry__rejoin_srv_stop(struct ferry_rejoin_srv *s)
{
	char b = 1;

	if (!s)
		return;
	while (write(s->wake[1], &b, 1) < 0 && errno == EINTR)
		;
	pthread_join(s->thread, NULL);
	close(s->wake[0]);
	close(s->wake[1]);
	close(s->lfd);
	ferry__auth_wipe(s->auth_key, sizeof(s->auth_key));
	free(s);
}

/* SPDX-License-Identifier: MIT */
/*
 * bootstrap.c - rendezvous through rank 0, over plain TCP, before any
 * transport connection exists:
 *
 *   rank r                                  rank 0
 *     | connect (retried until the deadline)  | listen on the rendezvous
 *     | BS_HELLO {rank, world, address} ----> | collect world-1 hellos
 *     | <--- BS_LIST {status, cluster id,     | or time out, naming the
 *     |       missing ranks, world addresses} | ranks that never came
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lib/core/bootstrap.h"
#include "lib/core/pmix.h"
#include "transport/base/log.h"

#define BS_MAGIC 0x46594253u /* "FYBS" */
#define BS_VERSION 1
#define BS_MISSING_MAX 16

struct bs_hello {
	uint32_t magic;
	uint32_t version;
	uint32_t rank;
	uint32_t world;
	struct ferry_addr addr;
};

struct bs_list {
	uint32_t magic;
	int32_t status;
	uint64_t cluster_id;
	uint32_t world;
	uint32_t nmissing;
	uint32_t missing[BS_MISSING_MAX];
	/* then world struct ferry_addr */
};

static int64_t bs_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* move exactly len bytes before the deadline; 0 or -errno (-ECONNRESET on EOF) */
static int bs_io(int fd, void *buf, size_t len, int64_t deadline, int out)
{
	uint8_t *p = buf;

	while (len) {
		struct pollfd pfd = { .fd = fd, .events = out ? POLLOUT : POLLIN };
		int64_t left = deadline - bs_now_ms();
		ssize_t n;
		int rc;

		if (left <= 0)
			return -ETIMEDOUT;
		rc = poll(&pfd, 1, (int)left);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0)
			return -errno;
		if (rc == 0)
			return -ETIMEDOUT;
		n = out ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ECONNRESET;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* @var names the setting that gave @host, for the message; NULL: none */
static int bs_resolve(const char *host, int port, struct sockaddr_in *sa, const char *var)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	int rc;

	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	if (!host || !*host || inet_pton(AF_INET, host, &sa->sin_addr) == 1)
		return 0;
	rc = getaddrinfo(host, NULL, &hints, &res);
	if (rc) {
		if (var)
			ferry_err(
				"bootstrap: cannot resolve the rendezvous host '%s' (from %s): %s; "
				"fix %s",
				host, var, gai_strerror(rc), var);
		else
			ferry_err("bootstrap: cannot resolve '%s': %s", host, gai_strerror(rc));
		return -EHOSTUNREACH;
	}
	sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
	freeaddrinfo(res);
	return 0;
}

int ferry__listen_tcp(const char *host, int port, int backlog)
{
	struct sockaddr_in sa;
	int fd, one = 1, rc;

	rc = bs_resolve(host, port, &sa, NULL);
	if (rc)
		return rc;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, backlog)) {
		rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

int ferry__socket_port(int fd)
{
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);

	if (getsockname(fd, (struct sockaddr *)&sa, &sl))
		return -errno;
	return ntohs(sa.sin_port);
}

static void bs_name_missing(char *buf, size_t len, const uint32_t *missing, uint32_t n)
{
	size_t off = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < n && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%u", i ? ", " : "", missing[i]);
}

/* rank 0 refuses a hello: say why, for the person who started the nodes */
static void bs_refuse_log(const struct bs_hello *h, uint32_t world)
{
	if (h->world != world)
		ferry_err("bootstrap: rank %u was started with a world of %u nodes, but rank 0 "
			  "(this node) with a world of %u; start every node with the same world "
			  "size (WORLD_SIZE, FERRY_WORLD or the launcher's)",
			  h->rank, h->world, world);
	else if (h->rank >= world)
		ferry_err("bootstrap: a node claims rank %u, not below the world size %u; give "
			  "every node a rank from 0 to %u",
			  h->rank, world, world - 1);
	else
		ferry_err("bootstrap: two processes claim rank %u: a second one tried to join "
			  "after the first; give every process its own rank (RANK, FERRY_RANK or "
			  "the launcher's)",
			  h->rank);
}

/*
 * bs_probe_rank0 - rank 0 found the rendezvous port taken: is it another
 * Ferry rank 0 (two processes claim rank 0), or another program? Asks with a
 * hello of rank 0, which a Ferry rank 0 refuses with its world size.
 * Return: -FERRY_E_MISMATCH or -EADDRINUSE, logged.
 */
static int bs_probe_rank0(const struct ferry_config *c)
{
	int64_t deadline = bs_now_ms() + (c->timeout_ms < 2000 ? c->timeout_ms : 2000);
	struct bs_hello h = { .magic = BS_MAGIC,
			      .version = BS_VERSION,
			      .world = (uint32_t)c->world };
	struct bs_list list = { 0 };
	struct sockaddr_in sa;
	int fd, ferry = 0;

	if (!bs_resolve(c->rdv_host, c->rdv_port, &sa, c->rdv_var)) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && !connect(fd, (struct sockaddr *)&sa, sizeof(sa)) &&
		    !bs_io(fd, &h, sizeof(h), deadline, 1) &&
		    !bs_io(fd, &list, sizeof(list), deadline, 0) && list.magic == BS_MAGIC)
			ferry = 1;
		if (fd >= 0)
			close(fd);
	}
	if (ferry) {
		ferry_err("bootstrap: two processes claim rank 0: another one already serves the "
			  "rendezvous %s:%d (from %s) as rank 0 of a world of %u; give every "
			  "process its own rank (this one's came from %s)",
			  c->rdv_host, c->rdv_port, c->rdv_src, list.world, c->rank_src);
		return -FERRY_E_MISMATCH;
	}
	ferry_err("bootstrap: rank 0 cannot listen on the rendezvous %s:%d (from %s): another "
		  "program holds the port; pick a free one (FERRY_RENDEZVOUS=host:port, or "
		  "MASTER_PORT: Ferry uses MASTER_PORT+1)",
		  c->rdv_host, c->rdv_port, c->rdv_src);
	return -EADDRINUSE;
}

static int bs_serve(const struct ferry_config *c, const struct ferry_addr *mine,
		    struct ferry_addr *addrs, uint64_t *cluster_id_p)
{
	int64_t deadline = bs_now_ms() + c->timeout_ms;
	uint32_t world = (uint32_t)c->world, joined = 1;
	size_t list_len = sizeof(struct bs_list) + world * sizeof(struct ferry_addr);
	struct bs_list *list;
	int *fds, lfd, rc = 0;
	uint64_t id;

	fds = malloc(world * sizeof(*fds));
	list = calloc(1, list_len);
	if (!fds || !list) {
		free(fds);
		free(list);
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < world; r++)
		fds[r] = -1;
	addrs[0] = *mine;

	lfd = c->rdv_fd;
	if (lfd < 0) {
		lfd = ferry__listen_tcp(c->rdv_host, c->rdv_port, 128);
		if (lfd == -EADDRINUSE) {
			rc = bs_probe_rank0(c);
			goto out_free;
		}
		if (lfd < 0) {
			ferry_err("bootstrap: rank 0 cannot listen on the rendezvous %s:%d (from "
				  "%s): %s; it must be an address of rank 0's host",
				  c->rdv_host, c->rdv_port, c->rdv_src, strerror(-lfd));
			rc = lfd;
			goto out_free;
		}
	}

	while (joined < world) {
		struct pollfd pfd = { .fd = lfd, .events = POLLIN };
		int64_t left = deadline - bs_now_ms();
		struct bs_hello h;
		int fd, one = 1;

		if (left <= 0)
			break;
		rc = poll(&pfd, 1, (int)left);
		if (rc <= 0)
			continue;
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		/* a stranger gets at most a second of our time */
		rc = bs_io(fd, &h, sizeof(h),
			   bs_now_ms() + 1000 < deadline ? bs_now_ms() + 1000 : deadline, 0);
		if (rc || h.magic != BS_MAGIC || h.version != BS_VERSION ||
		    h.addr.len > FERRY_TP_ADDR_MAX) {
			ferry_warn("bootstrap: dropped a rendezvous connection that did not "
				   "introduce itself as a Ferry node");
			close(fd);
			continue;
		}
		if (h.world != world || h.rank == 0 || h.rank >= world || fds[h.rank] >= 0) {
			/* the world lets the node say which sizes differ */
			struct bs_list nack = { .magic = BS_MAGIC,
						.status = -FERRY_E_MISMATCH,
						.world = world };

			bs_refuse_log(&h, world);
			bs_io(fd, &nack, sizeof(nack), deadline, 1);
			close(fd);
			continue;
		}
		fds[h.rank] = fd;
		addrs[h.rank] = h.addr;
		joined++;
	}

	if (getrandom(&id, sizeof(id), 0) != sizeof(id))
		id = (uint64_t)bs_now_ms() ^ ((uint64_t)getpid() << 32);
	list->magic = BS_MAGIC;
	list->world = world;
	list->cluster_id = id;
	for (uint32_t r = 1; r < world; r++)
		if (fds[r] < 0 && list->nmissing < BS_MISSING_MAX)
			list->missing[list->nmissing++] = r;
	if (joined < world) {
		char names[256];

		bs_name_missing(names, sizeof(names), list->missing, list->nmissing);
		ferry_err("bootstrap: timed out after %d ms waiting for rank%s %s%s of %u to join "
			  "at %s:%d; check that they were started with the same rendezvous and "
			  "can reach it",
			  c->timeout_ms, list->nmissing > 1 ? "s" : "", names,
			  world - joined > list->nmissing ? " (and more)" : "", world, c->rdv_host,
			  c->rdv_port);
		list->status = -FERRY_E_NOJOIN;
		rc = -FERRY_E_NOJOIN;
	} else {
		rc = 0;
		memcpy(list + 1, addrs, world * sizeof(struct ferry_addr));
		*cluster_id_p = id;
	}
	for (uint32_t r = 1; r < world; r++) {
		if (fds[r] < 0)
			continue;
		if (bs_io(fds[r], list, rc ? sizeof(*list) : list_len, bs_now_ms() + 5000, 1) &&
		    !rc) {
			ferry_err("bootstrap: could not send the address list to rank %u", r);
			rc = -FERRY_E_PEER;
		}
		close(fds[r]);
	}
	if (c->rdv_fd < 0)
		close(lfd);
out_free:
	free(fds);
	free(list);
	return rc;
}

static int bs_join(const struct ferry_config *c, const struct ferry_addr *mine,
		   struct ferry_addr *addrs, uint64_t *cluster_id_p)
{
	int64_t deadline = bs_now_ms() + c->timeout_ms;
	struct bs_hello h = { .magic = BS_MAGIC, .version = BS_VERSION };
	struct bs_list list;
	struct sockaddr_in sa;
	int fd = -1, rc, one = 1;

	rc = bs_resolve(c->rdv_host, c->rdv_port, &sa, c->rdv_var);
	if (rc)
		return rc;
	for (;;) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
		if (!connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
			break;
		rc = -errno;
		close(fd);
		if (bs_now_ms() >= deadline) {
			ferry_err("bootstrap: rank %d could not reach rank 0 at %s:%d within %d ms "
				  "(%s); start rank 0, or fix %s",
				  c->rank, c->rdv_host, c->rdv_port, c->timeout_ms, strerror(-rc),
				  c->rdv_var);
			return -ETIMEDOUT;
		}
		usleep(20000);
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	h.rank = (uint32_t)c->rank;
	h.world = (uint32_t)c->world;
	h.addr = *mine;
	rc = bs_io(fd, &h, sizeof(h), deadline, 1);
	if (!rc)
		rc = bs_io(fd, &list, sizeof(list), deadline + 2000, 0);
	if (rc) {
		ferry_err("bootstrap: rank %d got no address list from rank 0 at %s:%d (%s); "
			  "see rank 0's log",
			  c->rank, c->rdv_host, c->rdv_port, strerror(-rc));
		close(fd);
		return rc == -ECONNRESET ? -FERRY_E_PEER : -ETIMEDOUT;
	}
	if (list.magic != BS_MAGIC || list.status > 0 || list.nmissing > BS_MISSING_MAX) {
		ferry_err("bootstrap: rank 0 at %s:%d answered with garbage", c->rdv_host,
			  c->rdv_port);
		close(fd);
		return -FERRY_E_PROTO;
	}
	if (list.status) {
		char names[256];

		bs_name_missing(names, sizeof(names), list.missing, list.nmissing);
		if (list.status == -FERRY_E_NOJOIN)
			ferry_err("bootstrap: rank 0 gave up: rank%s %s never joined",
				  list.nmissing > 1 ? "s" : "", names);
		else if (list.status == -FERRY_E_MISMATCH && list.world &&
			 list.world != (uint32_t)c->world)
			ferry_err(
				"bootstrap: rank 0 at %s:%d runs a world of %u nodes, but this node "
				"(rank %d) was started with a world of %d (from %s); start every "
				"node with the same world size",
				c->rdv_host, c->rdv_port, list.world, c->rank, c->world,
				c->rank_src);
		else if (list.status == -FERRY_E_MISMATCH && list.world)
			ferry_err(
				"bootstrap: two processes claim rank %d: rank 0 at %s:%d has one "
				"already; give every process its own rank (this one's came from %s)",
				c->rank, c->rdv_host, c->rdv_port, c->rank_src);
		else
			ferry_err("bootstrap: rank 0 refused rank %d: %s", c->rank,
				  ferry_strerror(list.status));
		close(fd);
		return list.status;
	}
	if (list.world != (uint32_t)c->world) {
		ferry_err("bootstrap: rank 0 runs a world of %u nodes, this node (rank %d) a world "
			  "of %d; start every node with the same world size",
			  list.world, c->rank, c->world);
		close(fd);
		return -FERRY_E_MISMATCH;
	}
	rc = bs_io(fd, addrs, (size_t)c->world * sizeof(struct ferry_addr), deadline + 2000, 0);
	close(fd);
	if (rc) {
		ferry_err("bootstrap: the address list from rank 0 was cut short (%s)",
			  strerror(-rc));
		return -FERRY_E_PEER;
	}
	for (int r = 0; r < c->world; r++)
		if (addrs[r].len > FERRY_TP_ADDR_MAX) {
			ferry_err("bootstrap: rank 0 sent an address of %u bytes", addrs[r].len);
			return -FERRY_E_PROTO;
		}
	*cluster_id_p = list.cluster_id;
	return 0;
}

int ferry__bootstrap(const struct ferry_config *c, const struct ferry_addr *mine,
		     struct ferry_addr *addrs, uint64_t *cluster_id_p)
{
	if (c->world == 1) {
		addrs[0] = *mine;
		if (getrandom(cluster_id_p, sizeof(*cluster_id_p), 0) != sizeof(*cluster_id_p))
			*cluster_id_p = (uint64_t)bs_now_ms();
		return 0;
	}
#ifdef FERRY_HAVE_PMIX
	if (c->use_pmix)
		return ferry__pmix_bootstrap(c, mine, addrs, cluster_id_p);
#endif
	if (c->rank == 0)
		return bs_serve(c, mine, addrs, cluster_id_p);
	return bs_join(c, mine, addrs, cluster_id_p);
}

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
 *
 * With a cluster token (FERRY_TOKEN), every connection first proves it,
 * both ways (transport/base/auth.h), before rank 0 reads a hello or the node
 * an address list; rank 0 refuses one that cannot, naming its address. Anyone
 * who reaches the port may still connect, so rank 0 never waits on one
 * connection: it polls the listener and every connection still to introduce
 * itself at once, each with BS_HELLO_MS for its proof and its whole hello,
 * and bounds how many wait (see struct bs_pending). The messages are checked
 * by pure functions (ferry__bs_*_parse) that the fuzz targets call too.
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

#define BS_PENDING_MAX 256 /* connections accepted that have not introduced themselves */
#define BS_PER_SOURCE 64   /* of those, from one address: the oldest gives way */
#define BS_HELLO_MS 1000   /* a connection's time to introduce itself */

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

/*
 * bs_auth_dial - prove the token to rank 0 and check its proof, on a
 * connection we opened (a joining node, or rank 0's probe)
 * Return: 0; -EACCES with @why; -ETIMEDOUT; -ECONNRESET (rank 0 closed).
 */
int ferry__bs_auth_run(struct ferry_auth_hs *a, const uint8_t *key, int role, int fd,
		       int64_t deadline)
{
	int rc;

	ferry__auth_hs_init(a, key, "bootstrap", role, 0);
	while ((rc = ferry__auth_hs_step(a, fd)) == 0) {
		struct pollfd pfd = {
			.fd = fd, .events = POLLIN | (ferry__auth_hs_want_out(a) ? POLLOUT : 0)
		};
		int64_t left = deadline - bs_now_ms();

		if (left <= 0 || (poll(&pfd, 1, (int)left) < 0 && errno != EINTR))
			return -ETIMEDOUT;
	}
	return rc;
}

static int bs_auth_dial(const struct ferry_config *c, int fd, int64_t deadline, char *why,
			size_t wlen)
{
	struct ferry_auth_hs a;
	int rc = ferry__bs_auth_run(&a, c->auth_key, FERRY_AUTH_DIALER, fd, deadline);

	if (rc == -ETIMEDOUT)
		return rc;
	if (rc == 1)
		return 0;
	if (rc == -EACCES) {
		snprintf(why, wlen, "%s", a.why);
		return -EACCES;
	}
	snprintf(why, wlen,
		 "it closed the connection instead of proving the token: was it started without "
		 "FERRY_TOKEN, or with another one? (see its log)");
	return -ECONNRESET;
}

int64_t ferry__bs_now_ms(void)
{
	return bs_now_ms();
}

int ferry__bs_io(int fd, void *buf, size_t len, int64_t deadline, int out)
{
	return bs_io(fd, buf, len, deadline, out);
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
static void bs_refuse_log(const struct ferry_bs_hello *h, uint32_t world)
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
	struct ferry_bs_hello h = { .magic = FERRY_BS_MAGIC,
				    .version = FERRY_BS_VERSION,
				    .world = (uint32_t)c->world };
	struct ferry_bs_list list = { 0 };
	struct sockaddr_in sa;
	int fd, ferry = 0;

	if (!bs_resolve(c->rdv_host, c->rdv_port, &sa, c->rdv_var)) {
		fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		char why[200];

		if (fd >= 0 && !connect(fd, (struct sockaddr *)&sa, sizeof(sa)) &&
		    (!c->auth || !bs_auth_dial(c, fd, deadline, why, sizeof(why))) &&
		    !bs_io(fd, &h, sizeof(h), deadline, 1) &&
		    !bs_io(fd, &list, sizeof(list), deadline, 0) && list.magic == FERRY_BS_MAGIC)
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

/* ---- the messages: pure checks, shared with the fuzz targets -------------- */

/* a hello's frame with @magic (a joiner's or a replacement's) into *@h_p:
 * 0, or -FERRY_E_PROTO (*@h_p untouched) */
static int bs_hello_read(const void *buf, size_t len, uint32_t magic, struct ferry_bs_hello *h_p)
{
	struct ferry_bs_hello h;

	if (len < sizeof(h))
		return -FERRY_E_PROTO;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != magic || h.version != FERRY_BS_VERSION || h.addr.len > FERRY_TP_ADDR_MAX)
		return -FERRY_E_PROTO;
	*h_p = h;
	return 0;
}

int ferry__bs_hello_parse(const void *buf, size_t len, uint32_t world, struct ferry_bs_hello *h_p)
{
	struct ferry_bs_hello h;

	if (bs_hello_read(buf, len, FERRY_BS_MAGIC, &h))
		return -FERRY_E_PROTO;
	*h_p = h;
	if (h.world != world || h.rank == 0 || h.rank >= world)
		return -FERRY_E_MISMATCH;
	return 0;
}

int ferry__bs_list_parse(const struct ferry_config *c, const void *buf, size_t len,
			 struct ferry_bs_list *list_p, char *why, size_t wlen)
{
	struct ferry_bs_list list;

	if (len < sizeof(list)) {
		snprintf(why, wlen,
			 "bootstrap: rank 0 at %s:%d answered with %zu bytes, short of an "
			 "address list",
			 c->rdv_host, c->rdv_port, len);
		return -FERRY_E_PROTO;
	}
	memcpy(&list, buf, sizeof(list));
	if (list.magic != FERRY_BS_MAGIC || list.status > 0 ||
	    list.nmissing > FERRY_BS_MISSING_MAX) {
		snprintf(why, wlen, "bootstrap: rank 0 at %s:%d answered with garbage", c->rdv_host,
			 c->rdv_port);
		return -FERRY_E_PROTO;
	}
	if (list.status) {
		char names[256];

		bs_name_missing(names, sizeof(names), list.missing, list.nmissing);
		if (list.status == -FERRY_E_NOJOIN)
			snprintf(why, wlen, "bootstrap: rank 0 gave up: rank%s %s never joined",
				 list.nmissing > 1 ? "s" : "", names);
		else if (list.status == -FERRY_E_MISMATCH && list.world &&
			 list.world != (uint32_t)c->world)
			snprintf(why, wlen,
				 "bootstrap: rank 0 at %s:%d runs a world of %u nodes, but this "
				 "node (rank %d) was started with a world of %d (from %s); start "
				 "every node with the same world size",
				 c->rdv_host, c->rdv_port, list.world, c->rank, c->world,
				 c->rank_src);
		else if (list.status == -FERRY_E_MISMATCH && list.world)
			snprintf(why, wlen,
				 "bootstrap: two processes claim rank %d: rank 0 at %s:%d has one "
				 "already; give every process its own rank (this one's came from "
				 "%s)",
				 c->rank, c->rdv_host, c->rdv_port, c->rank_src);
		else if (list.status == -EALREADY)
			snprintf(why, wlen,
				 "bootstrap: rank 0 at %s:%d runs its cluster already: a node "
				 "cannot join it as rank %d now; to replace a failed node, start "
				 "it with FERRY_REJOIN=1 (docs/faults.md, \"A replacement node\")",
				 c->rdv_host, c->rdv_port, c->rank);
		else
			snprintf(why, wlen, "bootstrap: rank 0 refused rank %d: %s", c->rank,
				 ferry_strerror(list.status));
		return list.status;
	}
	if (list.world != (uint32_t)c->world) {
		snprintf(why, wlen,
			 "bootstrap: rank 0 runs a world of %u nodes, this node (rank %d) a world "
			 "of %d; start every node with the same world size",
			 list.world, c->rank, c->world);
		return -FERRY_E_MISMATCH;
	}
	*list_p = list;
	return 0;
}

int ferry__bs_addrs_check(const struct ferry_addr *addrs, uint32_t world, char *why, size_t wlen)
{
	for (uint32_t r = 0; r < world; r++)
		if (addrs[r].len > FERRY_TP_ADDR_MAX) {
			snprintf(why, wlen, "bootstrap: rank 0 sent an address of %u bytes",
				 addrs[r].len);
			return -FERRY_E_PROTO;
		}
	return 0;
}

/* ---- rank 0: the rendezvous ------------------------------------------------ */

/*
 * A connection accepted that has not introduced itself yet. Rank 0 serves
 * them all at once (poll): each has BS_HELLO_MS to send its hello, at most
 * BS_PER_SOURCE wait from one address and BS_PENDING_MAX in all; a newcomer
 * past a bound closes the oldest one waiting (a real rank sends its hello
 * right after connecting, so the oldest is an idle one), so silent or slow
 * connections cannot hold the real ranks back.
 */
struct bs_pending {
	int fd;		 /* -1: a free slot */
	uint32_t source; /* IPv4 address, network order */
	int64_t until;	 /* closed then if still silent */
	int authed;	 /* it proved the token (or there is none) */
	size_t off;	 /* bytes of the hello in */
	struct ferry_auth_hs auth;
	struct ferry_bs_hello h;
};

/* rank 0's rendezvous state; bs_serve()'s thread only */
struct bs_server {
	const struct ferry_config *c;
	uint32_t world, joined;
	int *fds; /* per rank: its connection, -1 until it joined */
	struct ferry_addr *addrs;
	struct bs_pending pend[BS_PENDING_MAX];
	unsigned silent;     /* closed for silence, or to make room */
	char silent_who[64]; /* the address of the last of them */
};

static void bs_pending_close(struct bs_server *s, struct bs_pending *p, int silent)
{
	if (silent) {
		struct in_addr a = { .s_addr = p->source };

		s->silent++;
		inet_ntop(AF_INET, &a, s->silent_who, sizeof(s->silent_who));
	}
	close(p->fd);
	p->fd = -1;
}

/* a slot for a connection from @source: a free one, or the oldest of the
 * source's when it has BS_PER_SOURCE waiting, or the oldest of all */
static struct bs_pending *bs_pending_slot(struct bs_server *s, uint32_t source)
{
	struct bs_pending *free_slot = NULL, *oldest = NULL, *oldest_src = NULL;
	unsigned from_src = 0;

	for (int i = 0; i < BS_PENDING_MAX; i++) {
		struct bs_pending *p = &s->pend[i];

		if (p->fd < 0) {
			if (!free_slot)
				free_slot = p;
			continue;
		}
		if (!oldest || p->until < oldest->until)
			oldest = p;
		if (p->source == source) {
			from_src++;
			if (!oldest_src || p->until < oldest_src->until)
				oldest_src = p;
		}
	}
	if (from_src >= BS_PER_SOURCE) {
		bs_pending_close(s, oldest_src, 1);
		return oldest_src;
	}
	if (free_slot)
		return free_slot;
	bs_pending_close(s, oldest, 1);
	return oldest;
}

/* the token proof of @p is in: 1 passed, 0 not yet, -1 closed (refused: logged) */
static int bs_pending_auth(struct bs_server *s, struct bs_pending *p)
{
	int rc = ferry__auth_hs_step(&p->auth, p->fd);
	struct in_addr a = { .s_addr = p->source };
	char who[INET_ADDRSTRLEN];

	if (rc == 1) {
		p->authed = 1;
		return 1;
	}
	if (!rc)
		return 0;
	if (rc == -EACCES) {
		inet_ntop(AF_INET, &a, who, sizeof(who));
		ferry_warn("bootstrap: refused a rendezvous connection from %s: %s", who,
			   p->auth.why);
		bs_pending_close(s, p, 0);
	} else {
		bs_pending_close(s, p, 1);
	}
	return -1;
}

static void bs_accept(struct bs_server *s, int lfd)
{
	struct sockaddr_in sa = { 0 };
	socklen_t salen = sizeof(sa);
	struct bs_pending *p;
	int fd, one = 1;

	fd = accept4(lfd, (struct sockaddr *)&sa, &salen, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return;
	if (sa.sin_family != AF_INET)
		sa.sin_addr.s_addr = 0;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	p = bs_pending_slot(s, sa.sin_addr.s_addr);
	p->fd = fd;
	p->source = sa.sin_addr.s_addr;
	p->until = bs_now_ms() + BS_HELLO_MS;
	p->off = 0;
	p->authed = !s->c->auth;
	if (s->c->auth) {
		/* our nonce goes out now; the rest when the node answers */
		ferry__auth_hs_init(&p->auth, s->c->auth_key, "bootstrap", FERRY_AUTH_ACCEPTOR, 0);
		bs_pending_auth(s, p);
	}
}

/* @p's socket is readable: take what it sent; a whole hello joins or is refused */
static void bs_pending_input(struct bs_server *s, struct bs_pending *p, int64_t deadline)
{
	struct ferry_bs_hello h;
	ssize_t n;
	int rc;

	if (!p->authed && bs_pending_auth(s, p) <= 0)
		return;
	n = recv(p->fd, (uint8_t *)&p->h + p->off, sizeof(p->h) - p->off, 0);
	if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n <= 0) {
		bs_pending_close(s, p, 1);
		return;
	}
	p->off += (size_t)n;
	if (!s->c->auth && ferry__auth_looks_like(&p->h, p->off)) {
		struct in_addr a = { .s_addr = p->source };
		char who[INET_ADDRSTRLEN];

		inet_ntop(AF_INET, &a, who, sizeof(who));
		ferry_warn("bootstrap: refused a rendezvous connection from %s: it opens with a "
			   "token proof, and this rank 0 has no token; give every node the same "
			   "FERRY_TOKEN",
			   who);
		bs_pending_close(s, p, 0);
		return;
	}
	if (p->off < sizeof(p->h))
		return;
	rc = ferry__bs_hello_parse(&p->h, sizeof(p->h), s->world, &h);
	if (rc == -FERRY_E_PROTO) {
		ferry_warn("bootstrap: dropped a rendezvous connection that did not "
			   "introduce itself as a Ferry node");
		bs_pending_close(s, p, 0);
		return;
	}
	if (rc || s->fds[h.rank] >= 0) {
		/* the world lets the node say which sizes differ */
		struct ferry_bs_list nack = { .magic = FERRY_BS_MAGIC,
					      .status = -FERRY_E_MISMATCH,
					      .world = s->world };
		int64_t by = bs_now_ms() + BS_HELLO_MS;

		bs_refuse_log(&h, s->world);
		bs_io(p->fd, &nack, sizeof(nack), by < deadline ? by : deadline, 1);
		bs_pending_close(s, p, 0);
		return;
	}
	s->fds[h.rank] = p->fd;
	s->addrs[h.rank] = h.addr;
	s->joined++;
	p->fd = -1;
}

/* serve the rendezvous until every rank joined or @deadline: each turn polls
 * the listener and every connection still to introduce itself */
static void bs_gather(struct bs_server *s, int lfd, int64_t deadline)
{
	struct pollfd pfd[1 + BS_PENDING_MAX];
	int idx[1 + BS_PENDING_MAX];

	while (s->joined < s->world) {
		int64_t now = bs_now_ms(), wake = deadline;
		int n = 1, rc;

		if (now >= deadline)
			break;
		pfd[0] = (struct pollfd){ .fd = lfd, .events = POLLIN };
		for (int i = 0; i < BS_PENDING_MAX; i++) {
			struct bs_pending *p = &s->pend[i];

			if (p->fd < 0)
				continue;
			if (p->until <= now) {
				bs_pending_close(s, p, 1);
				continue;
			}
			if (p->until < wake)
				wake = p->until;
			pfd[n] = (struct pollfd){
				.fd = p->fd,
				.events = POLLIN |
					  (!p->authed && ferry__auth_hs_want_out(&p->auth) ?
						   POLLOUT :
						   0),
			};
			idx[n++] = i;
		}
		rc = poll(pfd, (nfds_t)n, (int)(wake - now));
		if (rc <= 0)
			continue;
		/* the ones waiting first: a newcomer may close the oldest of them */
		for (int j = 1; j < n; j++)
			if (pfd[j].revents && s->pend[idx[j]].fd >= 0)
				bs_pending_input(s, &s->pend[idx[j]], deadline);
		if (pfd[0].revents & POLLIN)
			bs_accept(s, lfd);
	}
	for (int i = 0; i < BS_PENDING_MAX; i++)
		if (s->pend[i].fd >= 0)
			bs_pending_close(s, &s->pend[i], 1);
	if (s->silent)
		ferry_warn("bootstrap: closed %u rendezvous connection%s that did not introduce "
			   "%s within %d ms or gave way to newer ones (the last from %s); "
			   "something other than this cluster's ranks connects to %s:%d",
			   s->silent, s->silent > 1 ? "s" : "",
			   s->silent > 1 ? "themselves" : "itself", BS_HELLO_MS, s->silent_who,
			   s->c->rdv_host, s->c->rdv_port);
}

static int bs_serve(const struct ferry_config *c, const struct ferry_addr *mine,
		    struct ferry_addr *addrs, uint64_t *cluster_id_p, int *lfd_p)
{
	int64_t deadline = bs_now_ms() + c->timeout_ms;
	uint32_t world = (uint32_t)c->world;
	size_t list_len = sizeof(struct ferry_bs_list) + world * sizeof(struct ferry_addr);
	struct ferry_bs_list *list;
	struct bs_server *s;
	int lfd, rc = 0;
	uint64_t id;

	s = calloc(1, sizeof(*s));
	list = calloc(1, list_len);
	if (s)
		s->fds = malloc(world * sizeof(*s->fds));
	if (!s || !s->fds || !list) {
		if (s)
			free(s->fds);
		free(s);
		free(list);
		return -ENOMEM;
	}
	s->c = c;
	s->world = world;
	s->joined = 1;
	s->addrs = addrs;
	for (uint32_t r = 0; r < world; r++)
		s->fds[r] = -1;
	for (int i = 0; i < BS_PENDING_MAX; i++)
		s->pend[i].fd = -1;
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

	bs_gather(s, lfd, deadline);

	if (getrandom(&id, sizeof(id), 0) != sizeof(id))
		id = (uint64_t)bs_now_ms() ^ ((uint64_t)getpid() << 32);
	list->magic = FERRY_BS_MAGIC;
	list->world = world;
	list->cluster_id = id;
	for (uint32_t r = 1; r < world; r++)
		if (s->fds[r] < 0 && list->nmissing < FERRY_BS_MISSING_MAX)
			list->missing[list->nmissing++] = r;
	if (s->joined < world) {
		char names[256];

		bs_name_missing(names, sizeof(names), list->missing, list->nmissing);
		ferry_err("bootstrap: timed out after %d ms waiting for rank%s %s%s of %u to join "
			  "at %s:%d; check that they were started with the same rendezvous and "
			  "can reach it",
			  c->timeout_ms, list->nmissing > 1 ? "s" : "", names,
			  world - s->joined > list->nmissing ? " (and more)" : "", world,
			  c->rdv_host, c->rdv_port);
		list->status = -FERRY_E_NOJOIN;
		rc = -FERRY_E_NOJOIN;
	} else {
		rc = 0;
		memcpy(list + 1, addrs, world * sizeof(struct ferry_addr));
		*cluster_id_p = id;
	}
	for (uint32_t r = 1; r < world; r++) {
		if (s->fds[r] < 0)
			continue;
		if (bs_io(s->fds[r], list, rc ? sizeof(*list) : list_len, bs_now_ms() + 5000, 1) &&
		    !rc) {
			ferry_err("bootstrap: could not send the address list to rank %u", r);
			rc = -FERRY_E_PEER;
		}
		close(s->fds[r]);
	}
	if (!rc && lfd_p) {
		/* the rejoin service (rejoin.c) answers on it for the node's life;
		 * a listener the caller gave stays the caller's: a copy */
		*lfd_p = c->rdv_fd < 0 ? lfd : fcntl(lfd, F_DUPFD_CLOEXEC, 0);
		if (*lfd_p < 0)
			ferry_warn("bootstrap: cannot keep the rendezvous for rejoins: %s",
				   strerror(errno));
	} else if (c->rdv_fd < 0) {
		close(lfd);
	}
out_free:
	free(s->fds);
	free(s);
	free(list);
	return rc;
}

static int bs_join(const struct ferry_config *c, const struct ferry_addr *mine,
		   struct ferry_addr *addrs, uint64_t *cluster_id_p)
{
	int64_t deadline = bs_now_ms() + c->timeout_ms;
	struct ferry_bs_hello h = { .magic = FERRY_BS_MAGIC, .version = FERRY_BS_VERSION };
	struct ferry_bs_list raw = { 0 }, list;
	struct sockaddr_in sa;
	int fd = -1, rc, one = 1;
	char why[512];

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
	if (c->auth) {
		rc = bs_auth_dial(c, fd, deadline, why, sizeof(why));
		if (rc) {
			ferry_err(
				"bootstrap: rank %d: rank 0 at %s:%d %s: %s; start every node with "
				"the same FERRY_TOKEN (this one's came from %s)",
				c->rank, c->rdv_host, c->rdv_port,
				rc == -ETIMEDOUT ? "did not prove the token in time" : "is refused",
				rc == -ETIMEDOUT ? "see its log" : why, c->auth_src);
			close(fd);
			return rc == -ETIMEDOUT ? -ETIMEDOUT : -EACCES;
		}
	}
	h.rank = (uint32_t)c->rank;
	h.world = (uint32_t)c->world;
	h.addr = *mine;
	rc = bs_io(fd, &h, sizeof(h), deadline, 1);
	if (!rc)
		rc = bs_io(fd, &raw, sizeof(raw), deadline + 2000, 0);
	if (rc && !c->auth && ferry__auth_looks_like(&raw, sizeof(raw))) {
		ferry_err("bootstrap: rank %d: rank 0 at %s:%d asks for a token proof: it was "
			  "started with FERRY_TOKEN and this node without; give every node the "
			  "same token",
			  c->rank, c->rdv_host, c->rdv_port);
		close(fd);
		return -EACCES;
	}
	if (rc) {
		ferry_err("bootstrap: rank %d got no address list from rank 0 at %s:%d (%s); "
			  "see rank 0's log",
			  c->rank, c->rdv_host, c->rdv_port, strerror(-rc));
		close(fd);
		return rc == -ECONNRESET ? -FERRY_E_PEER : -ETIMEDOUT;
	}
	rc = ferry__bs_list_parse(c, &raw, sizeof(raw), &list, why, sizeof(why));
	if (rc && !c->auth && ferry__auth_looks_like(&raw, sizeof(raw))) {
		ferry_err("bootstrap: rank %d: rank 0 at %s:%d asks for a token proof: it was "
			  "started with FERRY_TOKEN and this node without; give every node the "
			  "same token",
			  c->rank, c->rdv_host, c->rdv_port);
		close(fd);
		return -EACCES;
	}
	if (rc) {
		ferry_err("%s", why);
		close(fd);
		return rc;
	}
	rc = bs_io(fd, addrs, (size_t)c->world * sizeof(struct ferry_addr), deadline + 2000, 0);
	close(fd);
	if (rc) {
		ferry_err("bootstrap: the address list from rank 0 was cut short (%s)",
			  strerror(-rc));
		return -FERRY_E_PEER;
	}
	rc = ferry__bs_addrs_check(addrs, (uint32_t)c->world, why, sizeof(why));
	if (rc) {
		ferry_err("%s", why);
		return rc;
	}
	*cluster_id_p = list.cluster_id;
	return 0;
}

/* ---- a replacement node's ask (rank 0's side: rejoin.c) ------------------------- */

#define BS_REJOIN_MS 3000 /* the joiner's bound on the whole exchange */

int ferry__bs_rejoin_parse(const void *buf, size_t len, uint32_t world, struct ferry_bs_hello *h_p)
{
	struct ferry_bs_hello h;

	if (bs_hello_read(buf, len, FERRY_BS_REJOIN_MAGIC, &h))
		return -FERRY_E_PROTO;
	*h_p = h;
	if (h.world != world)
		return -FERRY_E_MISMATCH;
	if (h.rank == 0 || h.rank >= world)
		return -EINVAL;
	return 0;
}

int ferry__bs_rejoin(const struct ferry_config *c, const struct ferry_addr *mine)
{
	int64_t deadline = bs_now_ms() + BS_REJOIN_MS;
	struct ferry_bs_hello h = { .magic = FERRY_BS_REJOIN_MAGIC,
				    .version = FERRY_BS_VERSION,
				    .rank = (uint32_t)c->rank,
				    .world = (uint32_t)c->world,
				    .addr = *mine };
	struct ferry_bs_list list = { 0 };
	struct sockaddr_in sa;
	int fd, rc, one = 1;
	char why[512];

	rc = bs_resolve(c->rdv_host, c->rdv_port, &sa, c->rdv_var);
	if (rc)
		return rc;
	/* non-blocking: a host that drops the SYN costs the deadline, not the
	 * kernel's minutes of retries */
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
	if (rc == -EINPROGRESS) {
		struct pollfd pfd = { .fd = fd, .events = POLLOUT };
		int64_t left = deadline - bs_now_ms();
		int err = 0;
		socklen_t elen = sizeof(err);

		rc = poll(&pfd, 1, left > 0 ? (int)left : 0);
		if (rc == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen))
			rc = -err;
		else
			rc = rc == 0 ? -ETIMEDOUT : -errno;
	}
	if (rc) {
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
		rc = bs_auth_dial(c, fd, deadline, why, sizeof(why));
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
	rc = bs_io(fd, &h, sizeof(h), deadline, 1);
	if (!rc)
		rc = bs_io(fd, &list, sizeof(list), deadline, 0);
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
		ferry_err("rejoin: rank %d is alive in the cluster of rank 0 at %s:%d (rank 0, or "
			  "a live rank, holds it alive: see rank 0's log): a rejoin replaces a "
			  "failed node; stop the old process first and wait until the cluster "
			  "fails it, or give this one the failed node's rank (FERRY_RANK)",
			  c->rank, c->rdv_host, c->rdv_port);
		break;
	case -EOPNOTSUPP:
		ferry_err("rejoin: rank 0 at %s:%d holds rank %d failed, but cannot admit a "
			  "replacement yet (docs/faults.md, \"A replacement node\"); the "
			  "survivors go on without it: to have %d nodes again, start the whole "
			  "cluster again and ferry_restore() its last checkpoint",
			  c->rdv_host, c->rdv_port, c->rank, c->world);
		break;
	case -EAGAIN:
		ferry_err("rejoin: rank 0 at %s:%d holds rank %d failed, but a live rank did not "
			  "answer whether it does too (see rank 0's log); ask again",
			  c->rdv_host, c->rdv_port, c->rank);
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

int ferry__bootstrap(const struct ferry_config *c, const struct ferry_addr *mine,
		     struct ferry_addr *addrs, uint64_t *cluster_id_p)
{
	return ferry__bootstrap_keep(c, mine, addrs, cluster_id_p, NULL);
}

int ferry__bootstrap_keep(const struct ferry_config *c, const struct ferry_addr *mine,
			  struct ferry_addr *addrs, uint64_t *cluster_id_p, int *lfd_p)
{
	if (lfd_p)
		*lfd_p = -1;
	if (c->rejoin)
		return ferry__bs_rejoin(c, mine);
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
		return bs_serve(c, mine, addrs, cluster_id_p, lfd_p);
	return bs_join(c, mine, addrs, cluster_id_p);
}

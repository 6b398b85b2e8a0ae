/* SPDX-License-Identifier: MIT */
/*
 * conn.c - the tcp transport's connection setup: the listening socket
 * (opened by init()) and ops->connect, which dials, accepts, exchanges
 * HELLOs and hands the sockets to the progress thread. Context: the thread
 * that calls init() or connect(); nothing here runs on the progress thread,
 * which sees a connection only once tcp_setup_publish() put it in the epoll
 * set.
 *
 * Connection setup (ops->connect, on the caller's thread)
 *
 *   Rank i dials every rank j < i and accepts every rank j > i. Both ends
 *   send a HELLO and a RESUME (the session's start: its incarnation, no
 *   frames yet) first and check the other's before the connection counts:
 *
 *     rank j (j < i)                                  rank i
 *     listening since init  <-------- connect() ----  retried until the deadline
 *     HELLO{cluster, j, world} --------------------->  magic, version, cluster,
 *     RESUME{inc_j, 0, 0}    <---------------------   world, rank == j; RESUME
 *     magic, version, cluster, world,                  HELLO{cluster, i, world}
 *     rank i > j, not a duplicate; RESUME              RESUME{inc_i, 0, 0}
 *
 *   A connection that fails its HELLO (checked as soon as it is in) is logged
 *   once, closed and not counted; accepting goes on. Once all world-1
 *   connections stand, the sockets and each peer's incarnation and address
 *   go to the progress thread, and so does the listening socket: a peer that
 *   loses its link redials it (session.c). With FERRY_RECONNECT_MS=0 the
 *   listening socket is closed instead (later strangers are refused).
 */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/tcp/tcp.h"

/* ---- sockets, and the listening socket of init() ------------------------ */

void ferry__tcp_set_nodelay(int fd)
{
	int one = 1;

	/* a failure costs latency, not correctness */
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
		ferry_dbg("tcp: TCP_NODELAY: %s", strerror(errno));
}

void ferry__tcp_sockaddr_str(const struct sockaddr_in *sa, char *buf, size_t len)
{
	char ip[INET_ADDRSTRLEN];

	if (!inet_ntop(AF_INET, &sa->sin_addr, ip, sizeof(ip)))
		snprintf(ip, sizeof(ip), "?");
	snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(sa->sin_port));
}

static int tcp_resolve(const char *host, struct in_addr *in)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res;
	int ret;

	if (inet_pton(AF_INET, host, in) == 1)
		return 0;
	ret = getaddrinfo(host, NULL, &hints, &res);
	if (ret) {
		ferry_err("tcp: cannot resolve the bind address \"%s\" to IPv4: %s", host,
			  gai_strerror(ret));
		return -EADDRNOTAVAIL;
	}
	*in = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
	freeaddrinfo(res);
	return 0;
}

int ferry__tcp_listen(struct tcp_tp *t)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t salen = sizeof(sa);
	int ret, fd;

	ret = tcp_resolve(t->bind, &sa.sin_addr);
	if (ret)
		return ret;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		ret = -errno;
		ferry_err("tcp: socket: %s", strerror(errno));
		return ret;
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, SOMAXCONN) ||
	    getsockname(fd, (struct sockaddr *)&sa, &salen)) {
		ret = -errno;
		ferry_err("tcp: cannot listen on %s: %s; the address must belong to this host: "
			  "set FERRY_BIND_ADDR to one of its addresses, or FERRY_SOCKET_IFNAME to "
			  "the interface that reaches the other nodes",
			  t->bind, strerror(errno));
		close(fd);
		return ret;
	}
	/* bound to every interface: peers are told the address that reaches them */
	if (sa.sin_addr.s_addr == htonl(INADDR_ANY) && t->base.cfg.adv_addr &&
	    *t->base.cfg.adv_addr && tcp_resolve(t->base.cfg.adv_addr, &sa.sin_addr)) {
		close(fd);
		return -EADDRNOTAVAIL;
	}
	ferry__tcp_sockaddr_str(&sa, t->addr, sizeof(t->addr));
	t->lfd = fd;
	return 0;
}

/* ---- connection setup --------------------------------------------------- */

/* a connection in its handshake: token proof (with a token), then HELLO */
struct tcp_hs {
	int fd;		/* -1: none */
	int connecting; /* our non-blocking connect() is in flight */
	int authed;	/* the token proof is through (or there is no token) */
	size_t out_off;
	size_t in_off;
	int peer;	 /* -1 until the peer's HELLO passed */
	int64_t until;	 /* accepted: closed then if not through (TCP_HS_MS) */
	uint32_t source; /* accepted: the peer's IPv4 address (TCP_HS_PER_SOURCE) */
	struct ferry_auth_hs auth;
	unsigned char in[TCP_HS_LEN];
	char who[64]; /* the peer's ip:port, for the log */
};

/* the state of our dials to one lower rank */
struct tcp_dial {
	struct sockaddr_in sa;
	char where[64];
	struct tcp_hs hs;
	int64_t next_ms; /* earliest time of the next attempt */
	int backoff_ms;
	int last_err;  /* errno of the last failed attempt, 0 when none */
	char why[160]; /* or why its HELLO was refused */
	int logged;    /* a refused HELLO was logged */
};

struct tcp_setup {
	struct tcp_tp *t;
	uint32_t rank, world;
	int *fds;		 /* established, per rank; -1 while missing */
	uint64_t *incs;		 /* per rank: the incarnation its RESUME gave */
	struct sockaddr_in *sas; /* per rank: its listening address, */
	int *have_sa;		 /* if its blob was one (higher ranks' are optional) */
	uint32_t missing;
	struct tcp_dial *dials; /* ranks [0, rank) */
	struct tcp_hs acc[TCP_MAX_HANDSHAKES];
	unsigned char hello[TCP_HS_LEN]; /* our HELLO and RESUME */
	int64_t deadline;
	unsigned gave_way; /* accepted handshakes closed for a newcomer or for time */
	char gave_way_who[64];
};

/* a new handshake: its token proof starts (our nonce goes out first) */
static void tcp_hs_auth_start(struct tcp_setup *s, struct tcp_hs *hs, int role)
{
	const struct ferry_tp_config *cfg = &s->t->base.cfg;

	hs->authed = !cfg->auth;
	if (cfg->auth)
		ferry__auth_hs_init(&hs->auth, cfg->auth_key, "tcp", role, cfg->rank);
}

/* what a handshake waits for */
static short tcp_hs_events(const struct tcp_hs *hs)
{
	if (hs->connecting)
		return POLLOUT;
	if (!hs->authed)
		return POLLIN | (ferry__auth_hs_want_out(&hs->auth) ? POLLOUT : 0);
	return POLLIN | (hs->out_off < TCP_HS_LEN ? POLLOUT : 0);
}

static void tcp_hs_close(struct tcp_hs *hs)
{
	if (hs->fd >= 0)
		close(hs->fd);
	hs->fd = -1;
}

static void tcp_dial_retry(struct tcp_dial *d, int err)
{
	tcp_hs_close(&d->hs);
	if (err)
		d->last_err = err;
	d->next_ms = tcp_now_ms() + d->backoff_ms;
	d->backoff_ms = d->backoff_ms * 2 > TCP_RETRY_MAX_MS ? TCP_RETRY_MAX_MS : d->backoff_ms * 2;
}

static void tcp_dial_start(struct tcp_setup *s, struct tcp_dial *d)
{
	struct tcp_hs *hs = &d->hs;
	int fd;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		tcp_dial_retry(d, errno);
		return;
	}
	ferry__tcp_set_nodelay(fd);
	memset(hs, 0, sizeof(*hs));
	hs->fd = fd;
	hs->peer = -1;
	tcp_hs_auth_start(s, hs, FERRY_AUTH_DIALER);
	snprintf(hs->who, sizeof(hs->who), "%s", d->where);
	if (!connect(fd, (struct sockaddr *)&d->sa, sizeof(d->sa)))
		return;
	if (errno == EINPROGRESS || errno == EINTR) {
		hs->connecting = 1;
		return;
	}
	tcp_dial_retry(d, errno);
}

/*
 * tcp_hs_step - move a HELLO exchange on
 *
 * Return: 1 when our HELLO and RESUME are out and the peer's are in, 0 while
 * it goes on (the peer's HELLO may be in: hs->in_off says), -ENODATA when the
 * peer closed before its handshake was complete, -EACCES when it failed the
 * token proof (hs->auth.why says how), or the negative errno of a socket
 * error.
 */
static int tcp_hs_step(struct tcp_setup *s, struct tcp_hs *hs)
{
	ssize_t n;

	if (hs->connecting) {
		int err = 0;
		socklen_t elen = sizeof(err);

		if (getsockopt(hs->fd, SOL_SOCKET, SO_ERROR, &err, &elen))
			return -errno;
		if (err)
			return -err;
		hs->connecting = 0;
	}
	if (!hs->authed) {
		int ret = ferry__auth_hs_step(&hs->auth, hs->fd);

		if (ret <= 0)
			return ret;
		hs->authed = 1;
	}
	while (hs->out_off < TCP_HS_LEN) {
		n = send(hs->fd, s->hello + hs->out_off, TCP_HS_LEN - hs->out_off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			return -errno;
		}
		hs->out_off += n;
	}
	/* exactly the handshake: frames that follow stay in the socket for the progress thread */
	while (hs->in_off < TCP_HS_LEN) {
		n = recv(hs->fd, hs->in + hs->in_off, TCP_HS_LEN - hs->in_off, 0);
		if (n == 0)
			return -ENODATA;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -errno;
		}
		hs->in_off += n;
	}
	return hs->out_off == TCP_HS_LEN;
}

/*
 * tcp_hello_check - is the peer's HELLO one of our cluster?
 * @dialed: the rank we dialed, or -1 for a connection we accepted
 *
 * Return: the peer's rank, or -1 with @why (of @len bytes) saying what is wrong.
 */
static int tcp_hello_check(struct tcp_setup *s, const struct tcp_hs *hs, int dialed, char *why,
			   size_t len)
{
	const struct ferry_tp_config *cfg = &s->t->base.cfg;
	int peer = ferry__proto_check_hello(hs->in, TCP_HELLO_LEN, cfg->cluster_id, s->world,
					    s->rank, dialed, why, len);

	if (peer < 0)
		return -1;
	if (s->fds[peer] >= 0) {
		snprintf(why, len, "rank %d is already connected", peer);
		return -1;
	}
	return peer;
}

/*
 * tcp_hs_check - check what of the peer's handshake is in: its HELLO as soon
 * as it is (a stranger goes at once), its RESUME once @done
 *
 * Return: 0 (hs->peer set once the HELLO passed), or -1 with @why.
 */
static int tcp_hs_check(struct tcp_setup *s, struct tcp_hs *hs, int dialed, int done, char *why,
			size_t len)
{
	struct ferry_msg_resume r;

	if (hs->peer < 0 && hs->in_off >= TCP_HELLO_LEN) {
		hs->peer = tcp_hello_check(s, hs, dialed, why, len);
		if (hs->peer < 0)
			return -1;
	}
	if (!done)
		return 0;
	if (ferry__tcp_resume_parse(s->t, hs->in + TCP_HELLO_LEN, (uint32_t)hs->peer, 0, &r, why,
				    len))
		return -1;
	s->incs[hs->peer] = r.incarnation;
	return 0;
}

static void tcp_hs_gave_way(struct tcp_setup *s, struct tcp_hs *hs)
{
	s->gave_way++;
	snprintf(s->gave_way_who, sizeof(s->gave_way_who), "%s", hs->who);
	tcp_hs_close(hs);
}

/* a slot for a connection from @source: a free one, else the oldest of the
 * source's when it holds TCP_HS_PER_SOURCE, else the oldest of all (a real
 * rank sends its handshake at once: the oldest is an idle one) */
static struct tcp_hs *tcp_setup_slot(struct tcp_setup *s, uint32_t source)
{
	struct tcp_hs *free_slot = NULL, *oldest = NULL, *oldest_src = NULL;
	unsigned from_src = 0;

	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++) {
		struct tcp_hs *hs = &s->acc[i];

		if (hs->fd < 0) {
			if (!free_slot)
				free_slot = hs;
			continue;
		}
		if (!oldest || hs->until < oldest->until)
			oldest = hs;
		if (hs->source == source) {
			from_src++;
			if (!oldest_src || hs->until < oldest_src->until)
				oldest_src = hs;
		}
	}
	if (from_src >= TCP_HS_PER_SOURCE) {
		tcp_hs_gave_way(s, oldest_src);
		return oldest_src;
	}
	if (free_slot)
		return free_slot;
	tcp_hs_gave_way(s, oldest);
	return oldest;
}

static void tcp_setup_accept(struct tcp_setup *s)
{
	for (;;) {
		struct sockaddr_in sa;
		socklen_t salen = sizeof(sa);
		struct tcp_hs *hs = NULL;
		int fd;

		fd = accept4(s->t->lfd, (struct sockaddr *)&sa, &salen,
			     SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				ferry_warn("tcp: rank %u: accept: %s", s->rank, strerror(errno));
			return;
		}
		hs = tcp_setup_slot(s, sa.sin_addr.s_addr);
		ferry__tcp_set_nodelay(fd);
		memset(hs, 0, sizeof(*hs));
		hs->fd = fd;
		hs->peer = -1;
		hs->until = tcp_now_ms() + TCP_HS_MS;
		hs->source = sa.sin_addr.s_addr;
		tcp_hs_auth_start(s, hs, FERRY_AUTH_ACCEPTOR);
		ferry__tcp_sockaddr_str(&sa, hs->who, sizeof(hs->who));
	}
}

/* an accepted connection is readable or writable */
static void tcp_setup_acc_step(struct tcp_setup *s, struct tcp_hs *hs)
{
	char why[160];
	int ret, peer;

	ret = tcp_hs_step(s, hs);
	if (ret < 0) {
		ferry_warn("tcp: rank %u rejected a connection from %s: %s", s->rank, hs->who,
			   ret == -EACCES  ? hs->auth.why :
			   ret == -ENODATA ? "it closed before its HELLO" :
					     strerror(-ret));
		tcp_hs_close(hs);
		return;
	}
	if (tcp_hs_check(s, hs, -1, ret, why, sizeof(why))) {
		ferry_warn("tcp: rank %u rejected a connection from %s: %s", s->rank, hs->who, why);
		tcp_hs_close(hs);
		return;
	}
	if (!ret)
		return;
	peer = hs->peer;
	ferry_dbg("tcp: rank %u accepted rank %d from %s", s->rank, peer, hs->who);
	s->fds[peer] = hs->fd;
	s->missing--;
	hs->fd = -1;
}

/* a connection we dialed to rank @j is readable or writable */
static void tcp_setup_dial_step(struct tcp_setup *s, uint32_t j)
{
	struct tcp_dial *d = &s->dials[j];
	int ret, peer;

	ret = tcp_hs_step(s, &d->hs);
	if (ret < 0) {
		/* refused (not listening yet), or it closed on us: try again */
		if (ret == -EACCES) {
			snprintf(d->why, sizeof(d->why), "%s", d->hs.auth.why);
			if (!d->logged++)
				ferry_warn("tcp: rank %u: the node at %s, dialed as rank %u, is "
					   "refused: %s",
					   s->rank, d->where, j, d->why);
		} else if (ret == -ENODATA) {
			snprintf(d->why, sizeof(d->why),
				 "it closed the connection before its HELLO%s",
				 s->t->base.cfg.auth ? " (or its token proof: does it have the "
						       "same token?)" :
						       "");
		} else {
			d->why[0] = '\0';
		}
		ferry_dbg("tcp: rank %u: dialing rank %u at %s: %s", s->rank, j, d->where,
			  ret == -ENODATA ? d->why : strerror(-ret));
		tcp_dial_retry(d, ret == -ENODATA ? 0 : -ret);
		return;
	}
	if (!tcp_hs_check(s, &d->hs, (int)j, ret, d->why, sizeof(d->why))) {
		if (!ret)
			return; /* its HELLO is fine so far */
		peer = d->hs.peer;
	} else {
		peer = -1;
	}
	if (peer < 0) {
		if (!d->logged++)
			ferry_warn(
				"tcp: rank %u: the node at %s, dialed as rank %u, is refused: %s",
				s->rank, d->where, j, d->why);
		tcp_dial_retry(d, 0);
		return;
	}
	ferry_dbg("tcp: rank %u connected to rank %u at %s", s->rank, j, d->where);
	s->fds[j] = d->hs.fd;
	s->missing--;
	d->hs.fd = -1;
}

/* log, once, the ranks that never connected and what we know of why */
static void tcp_setup_timeout(struct tcp_setup *s, int timeout_ms)
{
	char list[512], hint[384];
	size_t off = 0, hoff = 0;
	uint32_t listed = 0;

	list[0] = hint[0] = '\0';
	for (uint32_t r = 0; r < s->world; r++) {
		if (r == s->rank || s->fds[r] >= 0)
			continue;
		if (listed++ < 16 && off < sizeof(list))
			off += snprintf(list + off, sizeof(list) - off, "%s%u",
					listed > 1 ? ", " : "", r);
		if (r < s->rank && hoff < sizeof(hint)) {
			struct tcp_dial *d = &s->dials[r];

			hoff += snprintf(hint + hoff, sizeof(hint) - hoff, "; rank %u at %s: %s", r,
					 d->where,
					 d->why[0]   ? d->why :
					 d->last_err ? strerror(d->last_err) :
						       "no answer");
		}
	}
	if (listed > 16 && off < sizeof(list))
		snprintf(list + off, sizeof(list) - off, " and %u more", listed - 16);
	ferry_err("tcp: rank %u timed out after %d ms waiting for rank%s %s to connect; check "
		  "that they started and can reach %s%s",
		  s->rank, timeout_ms, listed > 1 ? "s" : "", list, s->t->addr, hint);
}

/* the sockets go to the progress thread. Return: 0 or a negative errno. */
static int tcp_setup_publish(struct tcp_setup *s)
{
	struct tcp_tp *t = s->t;

	for (uint32_t r = 0; r < s->world; r++) {
		struct tcp_conn *c = &t->conns[r];
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = c };
		int ret = 0;

		if (r == s->rank)
			continue;
		pthread_mutex_lock(&c->lock);
		c->fd = s->fds[r];
		s->fds[r] = -1;
		c->peer_inc = s->incs[r];
		c->have_sa = s->have_sa[r];
		c->sa = s->sas[r];
		c->state = TCP_CONN_UP;
		if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, c->fd, &ev))
			ret = -errno;
		pthread_mutex_unlock(&c->lock);
		if (ret) {
			/* fini() closes what was handed over */
			ferry_err("tcp: rank %u: epoll_ctl: %s", s->rank, strerror(-ret));
			return ret;
		}
	}
	return 0;
}

/*
 * ferry__tcp_connect - connect to every peer
 *
 * Blocks the calling thread for at most cfg.timeout_ms. Context: once per
 * transport, after init(), before any send() to a peer. The HELLO carries
 * tp->cfg.cluster_id as it is now: the core learns the id in the bootstrap,
 * after init(), and stores it there before calling connect().
 * Return: 0; -ETIMEDOUT (the log names the ranks that never connected);
 * -EINVAL for an address blob that is not ours; -EALREADY when called twice.
 */
int ferry__tcp_connect(struct ferry_tp *tp, const void *const *addrs, const size_t *lens)
{
	struct tcp_tp *t = to_tcp(tp);
	const struct ferry_tp_config *cfg = &tp->cfg;
	struct pollfd *pfds = NULL;
	int *owner = NULL; /* per pollfd: the rank dialed, or -1 - index in acc[] */
	struct tcp_setup *s;
	int timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30000;
	int ret = 0;
	uint32_t r;

	if (t->connected)
		return -EALREADY;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->t = t;
	s->rank = cfg->rank;
	s->world = cfg->world;
	s->missing = cfg->world - 1;
	s->deadline = tcp_now_ms() + timeout_ms;
	ferry__tcp_hs_build(t, NULL, s->hello); /* a new session: counts 0 */
	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++)
		s->acc[i].fd = -1;

	s->fds = malloc(cfg->world * sizeof(*s->fds));
	s->incs = calloc(cfg->world, sizeof(*s->incs));
	s->sas = calloc(cfg->world, sizeof(*s->sas));
	s->have_sa = calloc(cfg->world, sizeof(*s->have_sa));
	s->dials = calloc(cfg->rank ? cfg->rank : 1, sizeof(*s->dials));
	pfds = calloc(1 + cfg->rank + TCP_MAX_HANDSHAKES, sizeof(*pfds));
	owner = calloc(1 + cfg->rank + TCP_MAX_HANDSHAKES, sizeof(*owner));
	if (!s->fds || !s->incs || !s->sas || !s->have_sa || !s->dials || !pfds || !owner) {
		ret = -ENOMEM;
		goto out_free;
	}
	for (r = 0; r < cfg->world; r++) {
		s->fds[r] = -1;
		/* a lower rank probes a higher one's listener after a lost link */
		s->have_sa[r] = r != cfg->rank &&
				!ferry__tp_parse_ipv4(addrs[r], lens[r], &s->sas[r]);
	}
	for (r = 0; r < cfg->rank; r++) {
		struct tcp_dial *d = &s->dials[r];

		d->hs.fd = -1;
		d->backoff_ms = TCP_RETRY_MIN_MS;
		if (ferry__tp_parse_ipv4(addrs[r], lens[r], &d->sa)) {
			ferry_err("tcp: rank %u: the address of rank %u is not an \"ip:port\" of "
				  "the tcp transport; do all nodes use the same transport?",
				  cfg->rank, r);
			ret = -EINVAL;
			goto out_close;
		}
		ferry__tcp_sockaddr_str(&d->sa, d->where, sizeof(d->where));
	}

	while (s->missing) {
		int64_t now = tcp_now_ms(), wake = s->deadline;
		nfds_t n = 0;
		int nready;

		if (now >= s->deadline) {
			tcp_setup_timeout(s, timeout_ms);
			ret = -ETIMEDOUT;
			goto out_close;
		}
		pfds[n] = (struct pollfd){ .fd = t->lfd, .events = POLLIN };
		n++;
		for (r = 0; r < cfg->rank; r++) {
			struct tcp_dial *d = &s->dials[r];

			if (s->fds[r] >= 0)
				continue;
			if (d->hs.fd < 0 && now >= d->next_ms)
				tcp_dial_start(s, d);
			if (d->hs.fd < 0) {
				if (d->next_ms < wake)
					wake = d->next_ms;
				continue;
			}
			pfds[n] =
				(struct pollfd){ .fd = d->hs.fd, .events = tcp_hs_events(&d->hs) };
			owner[n++] = (int)r;
		}
		for (int i = 0; i < TCP_MAX_HANDSHAKES; i++) {
			struct tcp_hs *hs = &s->acc[i];

			if (hs->fd < 0)
				continue;
			if (hs->until <= now) {
				tcp_hs_gave_way(s, hs);
				continue;
			}
			if (hs->until < wake)
				wake = hs->until;
			pfds[n] = (struct pollfd){ .fd = hs->fd, .events = tcp_hs_events(hs) };
			owner[n++] = -1 - i;
		}

		nready = poll(pfds, n, (int)(wake > now ? wake - now : 0));
		if (nready < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			ferry_err("tcp: rank %u: poll: %s", cfg->rank, strerror(errno));
			goto out_close;
		}
		if (!nready)
			continue;

		for (nfds_t i = 1; i < n; i++) {
			if (!pfds[i].revents)
				continue;
			if (owner[i] >= 0)
				tcp_setup_dial_step(s, (uint32_t)owner[i]);
			else
				tcp_setup_acc_step(s, &s->acc[-1 - owner[i]]);
		}
		if (pfds[0].revents)
			tcp_setup_accept(s);
	}

	ret = tcp_setup_publish(s);
	if (ret)
		goto out_close;
	t->connected = 1;
	if (t->reconnect_ms) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &t->lfd_ev };

		/* peers that lose their link redial here (session.c) */
		if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->lfd, &ev)) {
			ret = -errno;
			ferry_err("tcp: rank %u: epoll_ctl: %s", cfg->rank, strerror(errno));
			goto out_close;
		}
	} else {
		close(t->lfd);
		t->lfd = -1;
	}
	ferry_dbg("tcp: rank %u is connected to all %u peers", cfg->rank, cfg->world - 1);
	if (s->gave_way)
		ferry_warn("tcp: rank %u closed %u connection%s that did not finish a handshake "
			   "within %d ms or gave way to newer ones (the last from %s); something "
			   "other than this cluster's ranks connects to %s",
			   cfg->rank, s->gave_way, s->gave_way > 1 ? "s" : "", TCP_HS_MS,
			   s->gave_way_who, t->addr);

out_close:
	for (int i = 0; i < TCP_MAX_HANDSHAKES; i++) {
		if (s->acc[i].fd >= 0 && !ret)
			ferry_info("tcp: rank %u: closing a connection from %s that had not "
				   "finished its HELLO",
				   cfg->rank, s->acc[i].who);
		tcp_hs_close(&s->acc[i]);
	}
	for (r = 0; r < cfg->rank; r++)
		tcp_hs_close(&s->dials[r].hs);
	for (r = 0; r < cfg->world; r++)
		if (s->fds[r] >= 0)
			close(s->fds[r]);
out_free:
	free(owner);
	free(pfds);
	free(s->dials);
	free(s->have_sa);
	free(s->sas);
	free(s->incs);
	free(s->fds);
	free(s);
	return ret;
}

/* SPDX-License-Identifier: MIT */
/*
 * rejoin.c - a replacement node asks a running cluster to take it back in,
 * over rank 0's rendezvous port, which rank 0 keeps for the cluster's life:
 *
 *   joiner (rank d, FERRY_REJOIN=1)           rank 0, its rejoin thread
 *     | connect (no retry: the cluster runs    | accept; the token proof
 *     |   or it does not)                      |   (with FERRY_TOKEN)
 *     | BS_HELLO{REJOIN magic, d, world, addr} ->  d below world, not 0, same
 *     |                                        |   world; d failed here? then
 *     |              rank 0 and each live rank <- REJOIN_ASK{d, seq}
 *     |                                        |   -> REJOIN_VIEW{d, seq, state}
 *     | <---- BS_LIST{status, world}: no addresses
 *
 *   status  -EEXIST        d is alive at rank 0, or at a live rank that says so
 *           -EOPNOTSUPP    d failed at rank 0 and at every live rank, each of
 *                          which ended its takeover of d, but no replacement
 *                          is admitted yet
 *           -EAGAIN        a takeover of d still waits somewhere, or a live
 *                          rank did not answer within REJOIN_VIEW_MS
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
 * Rank 0 asks itself too (a frame to itself), so that its own takeover
 * state is read where it lives, on the progress thread.
 *
 * The joiner's side (ferry__bs_rejoin) and the hello's check
 * (ferry__bs_rejoin_parse) are in bootstrap.c, beside the rendezvous: this
 * file is rank 0's side and the live ranks' views.
 *
 * Threads: the service is a thread of rank 0's, started once the node is
 * up and stopped by ferry__node_close (through fy->rejoin_stop, set by
 * ferry__rejoin_attach) before the transport goes, its memory freed after,
 * when no handler runs. It serves one connection at a time, each bounded by
 * REJOIN_HELLO_MS and the views by REJOIN_VIEW_MS (a rejoin is rare, and
 * nobody else waits on this port once the cluster formed). The ASK and
 * VIEW handlers run on the progress thread.
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
#include "lib/core/core.h"
#include "lib/core/proto.h"
#include "transport/base/log.h"

#define REJOIN_HELLO_MS 1000 /* a connection's time for its proof and hello */
#define REJOIN_VIEW_MS 1000  /* the live ranks' time to answer an ask */

/*
 * Rank 0's rejoin service. Memory: this struct (about 200 B) and a byte per
 * rank (@asked); one connection at a time, on the stack of its thread.
 */
struct ferry_rejoin_srv {
	struct ferry *fy;
	int lfd;
	int wake[2]; /* a byte in wake[1] stops the thread */
	pthread_t thread;
	bool started;
	uint32_t world;
	int auth;
	uint8_t auth_key[FERRY_AUTH_KEY_LEN];
	/* the ask under way, under @lock: its number and rank, and per rank
	 * 0 not asked, 1 asked, else 2 + its enum ferry_rejoin_state */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t seq, rank;
	uint8_t *asked;
};

/* ---- rank 0's service -------------------------------------------------------- */

/* the token proof of an accepted connection; 0, or a negative errno */
static int srv_auth(struct ferry_rejoin_srv *s, int fd, int64_t deadline, const char *who)
{
	struct ferry_auth_hs a;
	int rc = ferry__bs_auth_run(&a, s->auth_key, FERRY_AUTH_ACCEPTOR, fd, deadline);

	if (rc == -ETIMEDOUT)
		return rc;
	if (rc == 1)
		return 0;
	if (rc == -EACCES)
		ferry_warn("rejoin: refused a connection to the rendezvous from %s: %s", who,
			   a.why);
	return rc < 0 ? rc : -EACCES;
}

/*
 * Ask this node and every rank it holds live (but @d) how they hold @d.
 * Return: 0 failed everywhere, no takeover of it waiting; 1 *@who_p holds
 * it alive; 2 *@who_p still waits for its takeover; -EAGAIN *@who_p did not
 * answer within REJOIN_VIEW_MS. Context: the service's thread.
 */
static int srv_views(struct ferry_rejoin_srv *s, uint32_t d, uint32_t *who_p)
{
	struct ferry *fy = s->fy;
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_rejoin m;
	} f;
	int64_t until = ferry__bs_now_ms() + REJOIN_VIEW_MS;
	uint32_t seq;
	int rc;

	pthread_mutex_lock(&s->lock);
	seq = ++s->seq;
	s->rank = d;
	memset(s->asked, 0, s->world);
	for (uint32_t r = 0; r < s->world; r++)
		if (r != d && !atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			s->asked[r] = 1;
	pthread_mutex_unlock(&s->lock);
	for (uint32_t r = 0; r < s->world; r++) {
		if (r == d || atomic_load_explicit(&fy->failed[r], memory_order_relaxed))
			continue;
		memset(&f, 0, sizeof(f));
		ferry__proto_hdr_init(&f.h, FERRY_MSG_REJOIN_ASK, sizeof(f), fy->rank, 0);
		f.m.rank = d;
		f.m.seq = seq;
		(void)ferry__send(fy, r, &f, sizeof(f)); /* one that fails: r failed (below) */
	}
	pthread_mutex_lock(&s->lock);
	for (;;) {
		uint32_t missing = s->world, alive = s->world, taking = s->world;
		struct timespec ts;

		for (uint32_t r = 0; r < s->world; r++) {
			if (s->asked[r] == 2 + FERRY_REJOIN_ALIVE && alive == s->world)
				alive = r;
			if (s->asked[r] == 2 + FERRY_REJOIN_TAKEOVER && taking == s->world)
				taking = r;
			/* a rank that failed meanwhile has no view to give */
			if (s->asked[r] == 1 &&
			    !atomic_load_explicit(&fy->failed[r], memory_order_relaxed) &&
			    missing == s->world)
				missing = r;
		}
		if (alive < s->world) {
			*who_p = alive;
			rc = 1;
			break;
		}
		if (missing == s->world && taking < s->world) {
			*who_p = taking;
			rc = 2;
			break;
		}
		if (missing == s->world) {
			rc = 0;
			break;
		}
		if (ferry__bs_now_ms() >= until) {
			*who_p = missing;
			rc = -EAGAIN;
			break;
		}
		/* a slice at a time: a failure meanwhile does not signal us */
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 20 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		ferry__cond_wait_until(&s->cond, &s->lock, &ts);
	}
	s->rank = 0; /* late answers are ignored */
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* one connection: its hello, the verdict, one line */
static void srv_serve(struct ferry_rejoin_srv *s, int fd, const char *who)
{
	int64_t deadline = ferry__bs_now_ms() + REJOIN_HELLO_MS;
	struct ferry_bs_list v = { .magic = FERRY_BS_MAGIC, .world = s->world };
	struct ferry_bs_hello raw, h;
	uint32_t other = 0;
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
	} else if (!atomic_load_explicit(&s->fy->failed[h.rank], memory_order_relaxed)) {
		ferry_warn("rejoin: refused a rejoin of rank %u from %s: rank %u is alive here",
			   h.rank, who, h.rank);
		v.status = -EEXIST;
	} else if ((rc = srv_views(s, h.rank, &other)) == 1) {
		ferry_warn("rejoin: refused a rejoin of rank %u from %s: rank %u holds it alive "
			   "(it failed here only)",
			   h.rank, who, other);
		v.status = -EEXIST;
	} else if (rc == 2) {
		ferry_warn("rejoin: refused a rejoin of rank %u from %s for now: rank %u's "
			   "takeover of it is still under way",
			   h.rank, who, other);
		v.status = -EAGAIN;
	} else if (rc) {
		ferry_warn("rejoin: refused a rejoin of rank %u from %s for now: rank %u did not "
			   "say within %d ms whether it holds rank %u failed",
			   h.rank, who, other, REJOIN_VIEW_MS, h.rank);
		v.status = -EAGAIN;
	} else {
		ferry_warn("rejoin: rank %u asks to rejoin from %s; it failed here and at every "
			   "live rank, each ended its takeover, but this build cannot admit a "
			   "replacement (docs/faults.md, \"A replacement node\"): refused",
			   h.rank, who);
		v.status = -EOPNOTSUPP;
	}
	/* the views may have taken up to REJOIN_VIEW_MS of the hello's time */
	(void)ferry__bs_io(fd, &v, sizeof(v), ferry__bs_now_ms() + REJOIN_HELLO_MS, 1);
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
		if (pfd[0].revents & (POLLERR | POLLNVAL)) {
			/* poll would return at once for ever: stop instead of spinning */
			ferry_warn("rejoin: the rendezvous listener failed; rank 0 stops answering "
				   "rejoins");
			break;
		}
		if (!(pfd[0].revents & POLLIN))
			continue;
		fd = accept4(s->lfd, (struct sockaddr *)&sa, &salen, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM)
				usleep(10000); /* the connection waits in the backlog */
			continue;
		}
		if (sa.sin_family == AF_INET)
			inet_ntop(AF_INET, &sa.sin_addr, who, sizeof(who));
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		srv_serve(s, fd, who);
		close(fd);
	}
	return NULL;
}

int ferry__rejoin_srv_start(struct ferry *fy, const struct ferry_config *c, int lfd)
{
	struct ferry_rejoin_srv *s = calloc(1, sizeof(*s));
	int rc;

	if (s)
		s->asked = calloc(fy->world, 1);
	if (!s || !s->asked) {
		if (s)
			free(s->asked);
		free(s);
		close(lfd);
		return -ENOMEM;
	}
	s->fy = fy;
	s->lfd = lfd;
	s->world = fy->world;
	s->auth = c->auth;
	memcpy(s->auth_key, c->auth_key, sizeof(s->auth_key));
	pthread_mutex_init(&s->lock, NULL);
	ferry__cond_init_monotonic(&s->cond);
	if (pipe2(s->wake, O_CLOEXEC)) {
		rc = -errno;
		goto err_free;
	}
	/* the VIEW handler finds it there: before any ask can go */
	__atomic_store_n(&fy->rejoin_srv, s, __ATOMIC_RELEASE);
	rc = -pthread_create(&s->thread, NULL, srv_main, s);
	if (rc)
		goto err_close_pipe;
	s->started = true;
	pthread_setname_np(s->thread, "ferry-rejoin");
	return 0;

err_close_pipe:
	__atomic_store_n(&fy->rejoin_srv, NULL, __ATOMIC_RELEASE);
	close(s->wake[0]);
	close(s->wake[1]);
err_free:
	close(lfd);
	ferry__auth_wipe(s->auth_key, sizeof(s->auth_key));
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	free(s->asked);
	free(s);
	return rc;
}

void ferry__rejoin_srv_stop(struct ferry_rejoin_srv *s)
{
	char b = 1;

	if (!s || !s->started)
		return;
	while (write(s->wake[1], &b, 1) < 0 && errno == EINTR)
		;
	pthread_join(s->thread, NULL);
	s->started = false;
	close(s->wake[0]);
	close(s->wake[1]);
	close(s->lfd);
	ferry__auth_wipe(s->auth_key, sizeof(s->auth_key));
}

void ferry__rejoin_srv_free(struct ferry_rejoin_srv *s)
{
	if (!s)
		return;
	ferry__rejoin_srv_stop(s);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	free(s->asked);
	free(s);
}

/* ---- the live ranks' views (progress thread) ------------------------------- */

/* rank 0 asks whether this node holds a rank failed: the answer, at once */
static void rejoin_on_ask(struct ferry *fy, struct ferry_table *unused, uint32_t src,
			  const struct ferry_proto_view *v)
{
	const struct ferry_msg_rejoin *m = v->body;
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_rejoin m;
	} f;

	(void)unused;
	if (src != 0) {
		ferry_warn("rejoin: rank %u asked how this node holds rank %u; only rank 0 asks: "
			   "ignored",
			   src, m->rank);
		return;
	}
	memset(&f, 0, sizeof(f));
	ferry__proto_hdr_init(&f.h, FERRY_MSG_REJOIN_VIEW, sizeof(f), fy->rank, 0);
	f.m.rank = m->rank;
	f.m.seq = m->seq;
	if (!atomic_load_explicit(&fy->failed[m->rank], memory_order_relaxed))
		f.m.state = FERRY_REJOIN_ALIVE;
	else if (fy->takeover_pending && fy->takeover_pending(fy, m->rank))
		f.m.state = FERRY_REJOIN_TAKEOVER;
	else
		f.m.state = FERRY_REJOIN_FAILED;
	(void)ferry__send(fy, 0, &f, sizeof(f));
}

/* a live rank's answer to rank 0's ask under way */
static void rejoin_on_view(struct ferry *fy, struct ferry_table *unused, uint32_t src,
			   const struct ferry_proto_view *v)
{
	const struct ferry_msg_rejoin *m = v->body;
	struct ferry_rejoin_srv *s = __atomic_load_n(&fy->rejoin_srv, __ATOMIC_ACQUIRE);
	bool ok = false;

	(void)unused;
	if (s) {
		pthread_mutex_lock(&s->lock);
		ok = s->rank && m->seq == s->seq && m->rank == s->rank && s->asked[src] == 1;
		if (ok) {
			s->asked[src] = (uint8_t)(2 + m->state);
			pthread_cond_broadcast(&s->cond);
		}
		pthread_mutex_unlock(&s->lock);
	}
	if (!ok)
		ferry_warn("rejoin: rank %u answered an ask about rank %u (number %u) that this "
			   "node has not made or no longer waits for: ignored",
			   src, m->rank, m->seq);
}

int ferry__rejoin_attach(struct ferry *fy)
{
	int rc = ferry__dispatch_register(fy, FERRY_MSG_REJOIN_ASK, FERRY_DISPATCH_NODE,
					  rejoin_on_ask);

	fy->rejoin_start = ferry__rejoin_srv_start;
	fy->rejoin_stop = ferry__rejoin_srv_stop;
	fy->rejoin_free = ferry__rejoin_srv_free;

	return rc ? rc :
		    ferry__dispatch_register(fy, FERRY_MSG_REJOIN_VIEW, FERRY_DISPATCH_NODE,
					     rejoin_on_view);
}

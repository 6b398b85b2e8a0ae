/* SPDX-License-Identifier: MIT */
/*
 * cm.c - connection management over rdma_cm: the HELLO in the connection's
 * private data, dialing the lower ranks, judging and accepting requests from
 * the higher ones, rejecting the rest with a reason, the setup's progress and
 * deadline, and connect().
 *
 * Context: the progress thread owns every cm_id and runs all of this but
 * ferry__rdma_tp_connect() and rdma_setup_timeout(), which run on connect()'s
 * caller; the two meet under setup_lock. ferry__rdma_conn_destroy() also runs in
 * fini(), after the progress thread stopped. The listening cm_id is made in
 * init() (device.c: its device becomes the transport's).
 *
 * Connection setup (ops->connect on the caller's thread; the work on the
 * progress thread, which owns every cm_id)
 *
 *     rank j (j < i)                                  rank i
 *     listening since init  <-- REQ{HELLO i, bufs} --  rdma_resolve_addr/route,
 *     check HELLO: cluster, world, rank > j,           create QP, post receives,
 *     buffers; create QP, post receives,               rdma_connect; retried with
 *     rdma_accept(HELLO j) ----- REP --------------->  backoff until the deadline
 *     ESTABLISHED                                      ESTABLISHED: check HELLO j
 *
 *   The private data is the same HELLO frame the tcp transport sends first
 *   (struct ferry_msg_hdr + struct ferry_msg_hello), followed by this
 *   transport's buffer geometry (struct rdma_hello_ext), which must match. A
 *   request that fails its check is rejected (with a reason in the REJ's
 *   private data), logged once and not counted. Requests that arrive before
 *   connect() was called (the cluster id is not known yet) are held and judged
 *   when it is. Once every peer is up the listener stays, for the redials
 *   of lost links (session.c); with FERRY_RECONNECT_MS=0 it is destroyed, so
 *   later strangers are refused by the kernel. A redial passes the same
 *   checks, and its HELLO must carry the incarnation the session began with.
 *
 * The HELLO, the token proof and the probe of a lost higher rank are built
 * and checked in hello.c.
 *
 * Token (cfg.auth). rdma_cm carries one message each way before the
 * connection stands (56 bytes of private data in a REQ), so the proof here
 * is not tcp's nonce exchange (transport/base/auth.h) but a MAC under the
 * token's key of what makes each attempt unique:
 *
 *   REQ  ... HELLO, geometry, {attempt a, mac96(k, "rdma req", cluster id, i, j, a)}
 *   REP  ... HELLO, geometry, {a, mac256(k, "rdma rep", cluster id, i, j, a)}
 *
 * The cluster id (64 random bits rank 0 draws for each cluster it forms)
 * plays the acceptor's nonce, the dialer's attempt counter the dialer's:
 * rank j accepts rank i's proof only for an attempt above the last that
 * passed, so a recorded REQ is worth nothing in another cluster, to another
 * rank, or once a newer attempt came; the dialer takes only the REP of the
 * attempt in flight. A REQ without a valid proof is rejected
 * (RDMA_REJ_AUTH) and logged with its address, like a bad HELLO.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rdma/rdma.h"

static void rdma_sa_str(const struct sockaddr *sa, char *buf, size_t len)
{
	char ip[INET_ADDRSTRLEN];
	const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

	if (!sa || sa->sa_family != AF_INET || !inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip))) {
		snprintf(buf, len, "?");
		return;
	}
	snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(in->sin_port));
}

/* ---- connections (progress thread) ---------------------------------------- */

struct rdma_conn *ferry__rdma_conn_new(struct rdma_tp *t, enum rdma_conn_kind kind)
{
	struct rdma_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->kind = kind;
	c->rank = UINT32_MAX;
	c->t0_ms = rdma_now_ms();
	c->next = t->conns;
	t->conns = c;
	return c;
}

/* what a connection waits for, for the log */
const char *ferry__rdma_conn_state_str(const struct rdma_conn *c)
{
	switch (c->state) {
	case RDMA_CS_ADDR:
		return "resolving the address";
	case RDMA_CS_ROUTE:
		return "resolving the route";
	case RDMA_CS_HELD:
		return "held until connect()";
	case RDMA_CS_CONNECTING:
		return c->kind == RDMA_CONN_DIAL ? "waiting for the REP" : "waiting for the RTU";
	case RDMA_CS_UP:
		return "established";
	default:
		return "new";
	}
}

/* note the outcome of a redial of lost @p, for the line that fails it */
void ferry__rdma_redial_note(struct rdma_peer *p, const char *fmt, ...)
{
	va_list ap;

	if (!p->lost)
		return;
	va_start(ap, fmt);
	vsnprintf(p->redial_why, sizeof(p->redial_why), fmt, ap);
	va_end(ap);
}

/*
 * ferry__rdma_conn_destroy - cut a connection loose and have its queue pair
 * and cm_id destroyed
 *
 * Its events were acked (they always are before they are handled). A peer
 * whose queue pair it was loses it, and bumps its generation so that its
 * stale completions are dropped. The destroy calls, which wait in the kernel,
 * run on the reaper (reap.c); @c is the reaper's from here. Context:
 * progress thread, or fini().
 */
void ferry__rdma_conn_destroy(struct rdma_tp *t, struct rdma_conn *c)
{
	struct rdma_conn **pp;

	if (c->rank < t->base.cfg.world && c->kind != RDMA_CONN_LISTEN) {
		struct rdma_peer *p = &t->peers[c->rank];

		if (p->conn == c) {
			pthread_mutex_lock(&p->lock);
			p->qp = NULL;
			p->gen++;
			pthread_mutex_unlock(&p->lock);
			p->conn = NULL;
			p->live = 0;
			p->rx_ok = 0;
			p->rx_out = 0; /* its completions are dropped: another generation */
		}
		if ((c->kind == RDMA_CONN_DIAL || c->kind == RDMA_CONN_PROBE) &&
		    t->dials[c->rank].conn == c)
			t->dials[c->rank].conn = NULL;
	}
	if (c->state == RDMA_CS_HELD)
		t->nheld--;
	for (pp = &t->conns; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	ferry__rdma_reap(t, c);
}

void ferry__rdma_conn_reject(struct rdma_tp *t, struct rdma_conn *c, enum rdma_rej_reason reason)
{
	struct rdma_rej rej = { .magic = RDMA_REJ_MAGIC, .reason = reason };

	RDMA_TIMED(t, c->rank, "rdma_reject", rdma_reject(c->id, &rej, sizeof(rej)));
	ferry__rdma_conn_destroy(t, c);
}

/* our private data for @c: the HELLO, and with a token the proof of c->attempt */
void ferry__rdma_conn_param(struct rdma_tp *t, struct rdma_conn *c, struct rdma_conn_param *cp,
			    uint8_t their_init, uint8_t their_resp, int accepting)
{
	uint32_t me = t->base.cfg.rank;

	memset(cp, 0, sizeof(*cp));
	memcpy(c->pdata_out, t->hello, RDMA_PDATA_LEN);
	cp->private_data = c->pdata_out;
	cp->private_data_len = RDMA_PDATA_LEN;
	if (t->base.cfg.auth && accepting) {
		struct rdma_auth_rep ar = { .attempt = c->attempt };

		ferry__rdma_auth_mac(t, "rdma rep", c->rank, me, c->attempt, ar.mac);
		memcpy(c->pdata_out + RDMA_PDATA_LEN, &ar, sizeof(ar));
		cp->private_data_len = RDMA_REP_PDATA_LEN;
	} else if (t->base.cfg.auth) {
		uint8_t mac[FERRY_AUTH_MAC_LEN];
		struct rdma_auth_req aq = { .attempt = c->attempt };

		ferry__rdma_auth_mac(t, "rdma req", me, c->rank, c->attempt, mac);
		memcpy(aq.mac, mac, sizeof(aq.mac));
		memcpy(c->pdata_out + RDMA_PDATA_LEN, &aq, sizeof(aq));
		cp->private_data_len = RDMA_REQ_PDATA_LEN;
	}
	cp->responder_resources = (uint8_t)t->max_rd;
	cp->initiator_depth = (uint8_t)t->max_rd;
	if (accepting) {
		if (cp->responder_resources > their_init)
			cp->responder_resources = their_init;
		if (cp->initiator_depth > their_resp)
			cp->initiator_depth = their_resp;
	}
	cp->retry_count = 7;
	cp->rnr_retry_count = 7; /* credits keep buffers posted; never give up on RNR */
}

/* is @c its rank's connection, or the dial in flight to it (a redial)? */
static bool rdma_conn_current(const struct rdma_tp *t, const struct rdma_conn *c)
{
	if (c->rank >= t->base.cfg.world)
		return false;
	return t->peers[c->rank].conn == c || t->dials[c->rank].conn == c;
}

/* the progress thread's side of connect(): a peer is up */
static void rdma_conn_up(struct rdma_tp *t, struct rdma_conn *c)
{
	struct rdma_peer *p = &t->peers[c->rank];

	if (p->conn != c) {
		ferry__rdma_conn_destroy(t, c);
		return;
	}
	c->state = RDMA_CS_UP;
	if (c->kind == RDMA_CONN_DIAL && t->dials[c->rank].conn == c)
		t->dials[c->rank].conn = NULL; /* no dial in flight: a lost link redials */
	if (!p->reported) {
		/*
		 * (a peer that sent garbage before this event is failed: it stays
		 * so.) Frames wait in the out queue until both RESUMEs passed
		 * (session.c): then the stream goes on where the peer stopped.
		 */
		pthread_mutex_lock(&p->lock);
		if (p->state != RDMA_PEER_FAILED)
			p->state = RDMA_PEER_LOST;
		pthread_mutex_unlock(&p->lock);
		p->live = 1;
		p->ever_up = 1;
		p->up_ms = rdma_now_ms();
		ferry_dbg("rdma: rank %u is connected to rank %u (%s, %s, after %lld ms)",
			  t->base.cfg.rank, c->rank,
			  c->kind == RDMA_CONN_DIAL ? "dialed" : "accepted", c->who,
			  (long long)(p->up_ms - c->t0_ms));
		if (ferry__rdma_resume_post(t, p))
			return; /* lost again */
		/*
		 * Credits owed for chunks that came before this event go back now:
		 * no completion may come to return them if the peer used them all.
		 */
		ferry__rdma_mark_dirty(t, p);
		ferry__rdma_flush_dirty(t);
	} else {
		ferry__rdma_peer_up(t, p); /* failed already: connect() need not wait for it */
	}
}

/*
 * ferry__rdma_peer_up - both RESUMEs of @p's connection passed: it counts as
 * connected for connect(). Progress thread (session.c).
 */
void ferry__rdma_peer_up(struct rdma_tp *t, struct rdma_peer *p)
{
	int done;

	pthread_mutex_lock(&t->setup_lock);
	if (!t->up[p->rank]) {
		t->up[p->rank] = 1;
		t->missing--;
	}
	done = !t->missing && t->phase == RDMA_PHASE_CONNECTING;
	if (done)
		t->phase = RDMA_PHASE_DONE;
	pthread_cond_broadcast(&t->setup_cond);
	pthread_mutex_unlock(&t->setup_lock);
	if (done) {
		struct rdma_conn *x, *next;

		t->seen_phase = RDMA_PHASE_DONE;
		/*
		 * without reconnection, later strangers are refused by the kernel;
		 * with it, the listener takes the redials. Leftovers go.
		 */
		if (t->listen && !t->reconnect_ms) {
			ferry__rdma_conn_destroy(t, t->listen);
			t->listen = NULL;
		}
		for (x = t->conns; x; x = next) {
			next = x->next;
			if (x->state != RDMA_CS_UP && !rdma_conn_current(t, x))
				ferry__rdma_conn_destroy(t, x);
		}
	}
}

/* a connection that was up is gone (DISCONNECTED, DEVICE_REMOVAL) */
static void rdma_conn_lost(struct rdma_tp *t, struct rdma_conn *c, const char *how)
{
	struct rdma_peer *p = &t->peers[c->rank];

	char why[128];

	c->disconnected = 1;
	if (p->conn != c || !p->live)
		return;
	if (p->bye) {
		ferry_info("rdma: rank %u left (it %s rank %u)", c->rank, how, t->base.cfg.rank);
	} else if (t->reconnect_ms && !p->reported) {
		snprintf(why, sizeof(why), "rank %u %s rank %u", c->rank, how, t->base.cfg.rank);
		ferry__rdma_peer_lost(t, p, why);
		return;
	} else if (__atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
		ferry_info("rdma: rank %u %s rank %u; marking it failed", c->rank, how,
			   t->base.cfg.rank);
	else
		ferry_warn("rdma: rank %u %s rank %u; marking it failed", c->rank, how,
			   t->base.cfg.rank);
	ferry__rdma_peer_fail(t, p, -FERRY_E_PEER);
}

/* judge a connection request and accept or reject it; connect() has begun */
static void rdma_accept_request(struct rdma_tp *t, struct rdma_conn *c)
{
	uint32_t me = t->base.cfg.rank;
	struct rdma_conn_param cp;
	enum rdma_rej_reason reason = RDMA_REJ_HELLO;
	struct rdma_peer *p;
	uint32_t inc = 0;
	char why[192];
	int rank, probe_ok;

	/* probes come only with reconnection, from a peer whose session began */
	probe_ok = t->reconnect_ms != 0;
	rank = ferry__rdma_hello_check(t, c->pdata, c->plen, -1, probe_ok, &inc, why, sizeof(why));
	if (rank >= 0 && t->base.cfg.auth &&
	    ferry__rdma_auth_check(t, c->pdata, c->plen, 0, (uint32_t)rank, me,
				   &t->peers[rank].auth_attempt, why, sizeof(why))) {
		reason = RDMA_REJ_AUTH;
		rank = -1;
	}
	p = rank >= 0 ? &t->peers[rank] : NULL;
	if (p && p->lost && (uint32_t)rank > me) {
		p->redials++;
		p->req_ms = rdma_now_ms();
	}
	if (p && p->reported) {
		snprintf(why, sizeof(why), "rank %d was marked failed: it stays so", rank);
		reason = RDMA_REJ_FAILED;
		rank = -1;
	} else if (p && p->inc && inc != p->inc) {
		/* the process we had a session with is gone: this is another */
		snprintf(why, sizeof(why),
			 "it is another process of rank %d (incarnation %08x, not %08x): the "
			 "one we knew is gone",
			 rank, inc, p->inc);
		reason = RDMA_REJ_INCARNATION;
		rank = -1;
	} else if (p && (uint32_t)rank < me) {
		if (!p->ever_up) {
			snprintf(why, sizeof(why),
				 "rank %d is lower than ours and should wait for our dial", rank);
			reason = RDMA_REJ_HELLO;
			rank = -1;
		} else {
			ferry__rdma_probe_answer(t, c, p);
			return;
		}
	} else if (p && p->conn && p->conn->state == RDMA_CS_UP &&
		   (p->live || !ferry__rdma_peer_drained(t, p))) {
		/* a redial: it lost the link. Take ours for lost, and let it dial again */
		if (p->live) {
			snprintf(why, sizeof(why),
				 "rank %d dialed rank %u again (it lost their link)", rank, me);
			ferry__rdma_peer_lost(t, p, why);
		}
		ferry_dbg("rdma: rank %u: rank %d redials while its last link drains: dial again",
			  me, rank);
		ferry__rdma_redial_note(p, "request %u refused: the last link was draining",
					p->redials);
		ferry__rdma_conn_reject(t, c, RDMA_REJ_AGAIN);
		return;
	}
	if (rank < 0) {
		if (p)
			ferry__rdma_redial_note(p, "request %u refused: %s", p->redials, why);
		ferry_warn("rdma: rank %u rejected a connection from %s: %s", me, c->who, why);
		ferry__rdma_conn_reject(t, c, reason);
		/*
		 * (another incarnation is not taken for proof that ours died: a
		 * stranger could send it. If it did, the link is lost and stays so.)
		 */
		return;
	}
	/*
	 * a pending accept of the same rank is a dead attempt: the dialer
	 * retried; a lost link's drained queue pair goes too
	 */
	if (ferry__rdma_conn_attach(t, c, (uint32_t)rank)) {
		ferry__rdma_conn_reject(t, c, RDMA_REJ_RESOURCES);
		return;
	}
	p->inc = inc;
	c->attempt = t->peers[rank].auth_attempt;
	ferry__rdma_conn_param(t, c, &cp, c->initiator_depth, c->responder_resources, 1);
	if (RDMA_TIMED(t, (uint32_t)rank, "rdma_accept", rdma_accept(c->id, &cp))) {
		ferry_warn("rdma: rank %u: rdma_accept of rank %d from %s: %s", me, rank, c->who,
			   strerror(errno));
		ferry__rdma_redial_note(p, "request %u: rdma_accept failed", p->redials);
		ferry__rdma_conn_destroy(t, c);
		return;
	}
	c->state = RDMA_CS_CONNECTING;
	if (p->lost) {
		ferry__rdma_redial_note(p, "request %u accepted", p->redials);
		ferry_dbg(
			"rdma: rank %u: accepted the redial of rank %d (request %u since the loss, "
			"%lld ms after it)",
			me, rank, p->redials, (long long)(rdma_now_ms() - p->lost_ms));
	}
}

static void rdma_on_request(struct rdma_tp *t, const struct rdma_cm_ev *ev)
{
	uint32_t me = t->base.cfg.rank;
	struct rdma_conn *c = ferry__rdma_conn_new(t, RDMA_CONN_ACCEPT);

	if (!c) {
		rdma_reject(ev->id, NULL, 0);
		rdma_destroy_id(ev->id);
		return;
	}
	c->id = ev->id;
	ev->id->context = c;
	rdma_sa_str(rdma_get_peer_addr(ev->id), c->who, sizeof(c->who));
	memcpy(c->pdata, ev->pdata, ev->plen);
	c->plen = ev->plen;
	c->initiator_depth = ev->initiator_depth;
	c->responder_resources = ev->responder_resources;

	switch (t->seen_phase) {
	case RDMA_PHASE_IDLE:
		/* the cluster id is not known before connect(): judge it then */
		if (t->nheld >= RDMA_MAX_HELD) {
			ferry_warn("rdma: rank %u rejected a connection from %s: %d requests wait "
				   "for connect() already",
				   me, c->who, RDMA_MAX_HELD);
			ferry__rdma_conn_reject(t, c, RDMA_REJ_BUSY);
			return;
		}
		c->state = RDMA_CS_HELD;
		t->nheld++;
		return;
	case RDMA_PHASE_CONNECTING:
		rdma_accept_request(t, c);
		return;
	case RDMA_PHASE_DONE:
		if (t->reconnect_ms) {
			rdma_accept_request(t, c); /* a redial (session.c) */
			return;
		}
		/* fall through */
	default:
		ferry_info("rdma: rank %u rejected a connection from %s: the cluster is %s", me,
			   c->who, t->seen_phase == RDMA_PHASE_DONE ? "connected" : "closed");
		ferry__rdma_conn_reject(t, c, RDMA_REJ_CLOSED);
		return;
	}
}

static void rdma_dial_retry(struct rdma_tp *t, uint32_t j, const char *why)
{
	struct rdma_dial *d = &t->dials[j];

	if (why) {
		pthread_mutex_lock(&t->setup_lock);
		snprintf(d->why, sizeof(d->why), "%s", why);
		pthread_mutex_unlock(&t->setup_lock);
	}
	d->next_ms = rdma_now_ms() + d->backoff_ms;
	d->backoff_ms = d->backoff_ms * 2 > RDMA_RETRY_MAX_MS ? RDMA_RETRY_MAX_MS :
								d->backoff_ms * 2;
}

static void rdma_dial_start(struct rdma_tp *t, uint32_t j)
{
	struct rdma_dial *d = &t->dials[j];
	struct rdma_conn *c = ferry__rdma_conn_new(t, RDMA_CONN_DIAL);
	char why[96];

	if (!c) {
		rdma_dial_retry(t, j, "out of memory");
		return;
	}
	c->rank = j;
	snprintf(c->who, sizeof(c->who), "%s", d->where);
	if (rdma_create_id(t->ec, &c->id, c, RDMA_PS_TCP)) {
		snprintf(why, sizeof(why), "rdma_create_id: %s", strerror(errno));
		c->id = NULL;
		goto err_destroy;
	}
	if (RDMA_TIMED(t, j, "rdma_resolve_addr",
		       rdma_resolve_addr(c->id, (struct sockaddr *)&t->src_sa,
					 (struct sockaddr *)&d->sa, RDMA_RESOLVE_MS))) {
		snprintf(why, sizeof(why), "rdma_resolve_addr: %s", strerror(errno));
		goto err_destroy;
	}
	c->state = RDMA_CS_ADDR;
	d->conn = c;
	if (t->peers[j].lost) {
		struct rdma_peer *p = &t->peers[j];

		p->redials++;
		ferry__rdma_redial_note(p, "dial %u: resolving the address", p->redials);
		ferry_dbg(
			"rdma: rank %u: redialing rank %u (dial %u since the loss, %lld ms after it)",
			t->base.cfg.rank, j, p->redials, (long long)(c->t0_ms - p->lost_ms));
	}
	return;

err_destroy:
	ferry__rdma_conn_destroy(t, c);
	rdma_dial_retry(t, j, why);
}

/* an event on a connection we dialed */
static void rdma_dial_event(struct rdma_tp *t, struct rdma_conn *c, const struct rdma_cm_ev *ev)
{
	uint32_t me = t->base.cfg.rank, j = c->rank, inc = 0;
	struct rdma_dial *d = &t->dials[j];
	struct rdma_peer *p = &t->peers[j];
	struct rdma_conn_param cp;
	int gone = 0;
	char why[192];

	switch (ev->type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (RDMA_TIMED(t, j, "rdma_resolve_route",
			       rdma_resolve_route(c->id, RDMA_RESOLVE_MS))) {
			snprintf(why, sizeof(why), "rdma_resolve_route: %s", strerror(errno));
			break;
		}
		c->state = RDMA_CS_ROUTE;
		return;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (ferry__rdma_conn_attach(t, c, j)) {
			snprintf(why, sizeof(why), "no queue pair");
			break;
		}
		c->attempt = ++d->attempts;
		ferry__rdma_conn_param(t, c, &cp, 0, 0, 0);
		if (RDMA_TIMED(t, j, "rdma_connect", rdma_connect(c->id, &cp))) {
			snprintf(why, sizeof(why), "rdma_connect: %s", strerror(errno));
			break;
		}
		c->state = RDMA_CS_CONNECTING;
		return;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (ferry__rdma_hello_check(t, ev->pdata, ev->plen, (int)j, 0, &inc, why,
					    sizeof(why)) < 0 ||
		    (t->base.cfg.auth && ferry__rdma_auth_check(t, ev->pdata, ev->plen, 1, me, j,
								&c->attempt, why, sizeof(why))) ||
		    (p->inc && inc != p->inc &&
		     (gone = snprintf(why, sizeof(why),
				      "it is another process (incarnation %08x, not %08x): the "
				      "one we knew is gone",
				      inc, p->inc)))) {
			if (!d->logged++)
				ferry_warn("rdma: rank %u: the node at %s, dialed as rank %u, is "
					   "refused: %s",
					   me, d->where, j, why);
			c->disconnected = 1;
			RDMA_TIMED(t, j, "rdma_disconnect", rdma_disconnect(c->id));
			break;
		}
		p->inc = inc;
		rdma_conn_up(t, c);
		return;
	case RDMA_CM_EVENT_REJECTED: {
		struct rdma_rej rej = { 0 };

		if (ev->plen >= sizeof(rej))
			memcpy(&rej, ev->pdata, sizeof(rej));
		if (rej.magic == RDMA_REJ_MAGIC)
			snprintf(why, sizeof(why), "rejected: %s", ferry__rdma_rej_str(rej.reason));
		else
			snprintf(why, sizeof(why), "rejected (status %d): nothing listens there",
				 ev->status);
		/* a lost link's peer whose listener is gone, or that failed us, is gone */
		gone = rej.magic != RDMA_REJ_MAGIC || rej.reason == RDMA_REJ_FAILED ||
		       rej.reason == RDMA_REJ_INCARNATION;
		break;
	}
	case RDMA_CM_EVENT_DISCONNECTED:
		if (c->state == RDMA_CS_UP) {
			rdma_conn_lost(t, c, "disconnected from");
			return;
		}
		snprintf(why, sizeof(why), "it disconnected before the connection stood");
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		snprintf(why, sizeof(why), "%s (%s)", rdma_event_str(ev->type),
			 strerror(ev->status < 0 ? -ev->status : ev->status));
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		if (c->state == RDMA_CS_UP) {
			rdma_conn_lost(t, c, "was lost (device removed) to");
			return;
		}
		snprintf(why, sizeof(why), "the device was removed");
		break;
	default:
		return;
	}
	/* this attempt failed */
	if (c->state == RDMA_CS_UP)
		return;
	ferry_dbg("rdma: rank %u: dialing rank %u at %s: %s (after %lld ms)", me, j, d->where, why,
		  (long long)(rdma_now_ms() - c->t0_ms));
	ferry__rdma_redial_note(p, "dial %u: %s after %lld ms", p->redials, why,
				(long long)(rdma_now_ms() - c->t0_ms));
	ferry__rdma_conn_destroy(t, c);
	if (p->lost && !p->reported && gone) {
		ferry_warn("rdma: rank %u: redialing rank %u at %s after a lost link: %s; marking "
			   "it failed",
			   me, j, d->where, why);
		p->lost = 0;
		ferry__rdma_peer_fail(t, p, -FERRY_E_PEER);
		return;
	}
	if (t->seen_phase == RDMA_PHASE_CONNECTING || p->lost)
		rdma_dial_retry(t, j, why);
}

/* an event on a connection we accepted */
static void rdma_accept_event(struct rdma_tp *t, struct rdma_conn *c, const struct rdma_cm_ev *ev)
{
	switch (ev->type) {
	case RDMA_CM_EVENT_ESTABLISHED:
		rdma_conn_up(t, c);
		return;
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		if (c->state == RDMA_CS_UP) {
			rdma_conn_lost(t, c,
				       ev->type == RDMA_CM_EVENT_DISCONNECTED ?
					       "disconnected from" :
					       "was lost (device removed) to");
			return;
		}
		break;
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
		if (c->state == RDMA_CS_UP)
			return;
		break;
	default:
		return;
	}
	ferry_dbg("rdma: rank %u: the connection from %s (rank %u) failed before it stood: %s "
		  "after %lld ms",
		  t->base.cfg.rank, c->who, c->rank, rdma_event_str(ev->type),
		  (long long)(rdma_now_ms() - c->t0_ms));
	if (c->rank < t->base.cfg.world && t->peers[c->rank].conn == c)
		ferry__rdma_redial_note(&t->peers[c->rank], "request %u: %s before it stood",
					t->peers[c->rank].redials, rdma_event_str(ev->type));
	ferry__rdma_conn_destroy(t, c);
}

/* connect() began or gave up: act on it. Progress thread. */
void ferry__rdma_setup_sync(struct rdma_tp *t)
{
	struct rdma_conn *c, *next;
	enum rdma_phase phase;

	pthread_mutex_lock(&t->setup_lock);
	phase = t->phase;
	pthread_mutex_unlock(&t->setup_lock);
	if (phase == t->seen_phase)
		return;
	t->seen_phase = phase;
	if (phase == RDMA_PHASE_CONNECTING) {
		/* the cluster id is known now: judge the held requests, oldest first */
		for (;;) {
			struct rdma_conn *oldest = NULL;

			for (c = t->conns; c; c = c->next)
				if (c->state == RDMA_CS_HELD)
					oldest = c;
			if (!oldest)
				break;
			oldest->state = RDMA_CS_NEW;
			t->nheld--;
			rdma_accept_request(t, oldest);
		}
		return;
	}
	if (phase == RDMA_PHASE_ABANDONED || phase == RDMA_PHASE_DONE) {
		if (t->listen && (phase == RDMA_PHASE_ABANDONED || !t->reconnect_ms)) {
			ferry__rdma_conn_destroy(t, t->listen);
			t->listen = NULL;
		}
		for (c = t->conns; c; c = next) {
			next = c->next;
			if (c->state != RDMA_CS_UP &&
			    (phase == RDMA_PHASE_ABANDONED || !rdma_conn_current(t, c)))
				ferry__rdma_conn_destroy(t, c);
		}
	}
}

/*
 * start due dials: at setup, and redials of lost links once the old queue
 * pair drained (session.c). Return: the next time one is due, or -1.
 * Progress thread.
 */
int64_t ferry__rdma_setup_tick(struct rdma_tp *t)
{
	int64_t now, next = -1, probe;

	if (t->seen_phase != RDMA_PHASE_CONNECTING && t->seen_phase != RDMA_PHASE_DONE)
		return -1;
	now = rdma_now_ms();
	for (uint32_t j = 0; j < t->base.cfg.rank; j++) {
		struct rdma_dial *d = &t->dials[j];
		struct rdma_peer *p = &t->peers[j];

		if (d->conn && p->lost && !p->live && d->conn->state != RDMA_CS_UP) {
			/*
			 * a redial in flight is bounded: a REQ, REP or REJ lost on the
			 * way is sent again by the kernel's CM only after seconds (its
			 * response timeout), past the grace. Destroying the attempt
			 * rejects it at the peer; the next one starts afresh.
			 */
			int64_t due = d->conn->t0_ms + ferry__rdma_redial_ms(t);

			if (now < due) {
				if (next < 0 || due < next)
					next = due;
				continue;
			}
			ferry_info("rdma: rank %u: redial %u of rank %u hung %s for %lld ms; "
				   "dialing again",
				   t->base.cfg.rank, p->redials, j,
				   ferry__rdma_conn_state_str(d->conn),
				   (long long)(now - d->conn->t0_ms));
			ferry__rdma_redial_note(p, "dial %u: hung %s for %lld ms", p->redials,
						ferry__rdma_conn_state_str(d->conn),
						(long long)(now - d->conn->t0_ms));
			ferry__rdma_conn_destroy(t, d->conn);
			d->conn = NULL;
			d->next_ms = now;
		}
		if (p->live || p->reported || d->conn)
			continue;
		if (p->lost && !ferry__rdma_peer_drained(t, p)) {
			/* its completions wake us when it drains, or the grace ends */
			int64_t due = p->err_ms + RDMA_DRAIN_GRACE_MS;

			if (next < 0 || due < next)
				next = due > now ? due : now + 1;
			continue;
		}
		if (!p->lost && t->seen_phase != RDMA_PHASE_CONNECTING)
			continue;
		if (now >= d->next_ms)
			rdma_dial_start(t, j);
		if (!d->conn && (next < 0 || d->next_ms < next))
			next = d->next_ms;
	}
	probe = ferry__rdma_probe_tick(t, now);
	if (probe >= 0 && (next < 0 || probe < next))
		next = probe;
	return next;
}

static void rdma_cm_dispatch(struct rdma_tp *t, const struct rdma_cm_ev *ev)
{
	struct rdma_conn *c;

	if (ev->type == RDMA_CM_EVENT_CONNECT_REQUEST) {
		ferry__rdma_setup_sync(t);
		rdma_on_request(t, ev);
		return;
	}
	c = ev->ctx; /* NULL: a connection cut loose (reap.c), or none of ours */
	if (!c)
		return;
	switch (c->kind) {
	case RDMA_CONN_DIAL:
		rdma_dial_event(t, c, ev);
		break;
	case RDMA_CONN_ACCEPT:
		rdma_accept_event(t, c, ev);
		break;
	case RDMA_CONN_PROBE:
		ferry__rdma_probe_event(t, c, ev);
		break;
	case RDMA_CONN_LISTEN:
		if (ev->type == RDMA_CM_EVENT_DEVICE_REMOVAL)
			ferry_err("rdma: rank %u: device %s was removed", t->base.cfg.rank,
				  t->dev_name);
		break;
	}
}

/* the cm event channel is readable. Progress thread. */
void ferry__rdma_cm_input(struct rdma_tp *t)
{
	for (;;) {
		struct rdma_cm_event *e;
		struct rdma_cm_ev ev;

		if (rdma_get_cm_event(t->ec, &e)) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				ferry_err("rdma: rank %u: rdma_get_cm_event: %s", t->base.cfg.rank,
					  strerror(errno));
			return;
		}
		memset(&ev, 0, sizeof(ev));
		ev.type = e->event;
		ev.id = e->id;
		/* before the ack: after it the reaper may destroy the id (reap.c) */
		ev.ctx = e->id ? e->id->context : NULL;
		ev.status = e->status;
		if (e->param.conn.private_data && e->param.conn.private_data_len) {
			ev.plen = e->param.conn.private_data_len < sizeof(ev.pdata) ?
					  e->param.conn.private_data_len :
					  sizeof(ev.pdata);
			memcpy(ev.pdata, e->param.conn.private_data, ev.plen);
		}
		ev.initiator_depth = e->param.conn.initiator_depth;
		ev.responder_resources = e->param.conn.responder_resources;
		/* acked first, so that rdma_destroy_id() on its id cannot wait for it */
		rdma_ack_cm_event(e);
		rdma_cm_dispatch(t, &ev);
	}
}

/* ---- connection setup (caller's thread) ---------------------------------- */

/* log, once, the ranks that never connected and what we know of why. setup_lock held. */
static void rdma_setup_timeout(struct rdma_tp *t, int timeout_ms)
{
	uint32_t me = t->base.cfg.rank, listed = 0;
	char list[512], hint[384];
	size_t off = 0, hoff = 0;

	list[0] = hint[0] = '\0';
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		if (r == me || t->up[r])
			continue;
		if (listed++ < 16 && off < sizeof(list))
			off += snprintf(list + off, sizeof(list) - off, "%s%u",
					listed > 1 ? ", " : "", r);
		if (r < me && hoff < sizeof(hint)) {
			struct rdma_dial *d = &t->dials[r];

			hoff += snprintf(hint + hoff, sizeof(hint) - hoff, "; rank %u at %s: %s", r,
					 d->where, d->why[0] ? d->why : "no answer");
		}
	}
	if (listed > 16 && off < sizeof(list))
		snprintf(list + off, sizeof(list) - off, " and %u more", listed - 16);
	ferry_err("rdma: rank %u timed out after %d ms waiting for rank%s %s to connect; check "
		  "that they started and can reach %s%s",
		  me, timeout_ms, listed > 1 ? "s" : "", list, t->addr, hint);
}

/*
 * ferry__rdma_tp_connect - connect to every peer
 *
 * Hands the work to the progress thread and waits for at most
 * cfg.timeout_ms. Context: once per transport, after init(), before any
 * send() to a peer; cfg.cluster_id is set.
 * Return: 0; -ETIMEDOUT (the log names the ranks that never connected);
 * -EINVAL for an address blob that is not ours; -EALREADY when called twice.
 */
int ferry__rdma_tp_connect(struct ferry_tp *tp, const void *const *addrs, const size_t *lens)
{
	struct rdma_tp *t = to_rdma(tp);
	const struct ferry_tp_config *cfg = &tp->cfg;
	int timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30000;
	struct timespec dl;
	int ret = 0;

	if (t->connected)
		return -EALREADY;
	for (uint32_t r = 0; r < cfg->world; r++) {
		struct rdma_dial *d = &t->dials[r];

		if (r == cfg->rank)
			continue;
		if (r > cfg->rank) {
			/* a higher rank's listener is only probed (session.c): no address, no probe */
			if (!ferry__tp_parse_ipv4(addrs[r], lens[r], &d->sa)) {
				d->probe_ok = 1;
				rdma_sa_str((struct sockaddr *)&d->sa, d->where, sizeof(d->where));
			}
			continue;
		}
		if (ferry__tp_parse_ipv4(addrs[r], lens[r], &d->sa)) {
			ferry_err("rdma: rank %u: the address of rank %u is not an \"ip:port\" of "
				  "the rdma transport; do all nodes use the same transport?",
				  cfg->rank, r);
			return -EINVAL;
		}
		rdma_sa_str((struct sockaddr *)&d->sa, d->where, sizeof(d->where));
	}

	ferry__deadline_ms(timeout_ms, &dl);
	pthread_mutex_lock(&t->setup_lock);
	ferry__rdma_hello_build(t);
	t->phase = t->missing ? RDMA_PHASE_CONNECTING : RDMA_PHASE_DONE;
	pthread_mutex_unlock(&t->setup_lock);
	ferry__rdma_wake(t);

	pthread_mutex_lock(&t->setup_lock);
	while (t->missing &&
	       pthread_cond_timedwait(&t->setup_cond, &t->setup_lock, &dl) != ETIMEDOUT)
		;
	if (t->missing) {
		t->phase = RDMA_PHASE_ABANDONED;
		rdma_setup_timeout(t, timeout_ms);
		ret = -ETIMEDOUT;
	}
	pthread_mutex_unlock(&t->setup_lock);
	ferry__rdma_wake(t);
	if (!ret) {
		t->connected = 1;
		ferry_dbg("rdma: rank %u is connected to all %u peers", cfg->rank, cfg->world - 1);
	}
	return ret;
}

/* SPDX-License-Identifier: MIT */
/*
 * hello.c - what rdma_cm's messages carry: the HELLO and the token proof in
 * the private data of a REQ and a REP (cm.c has the exchange and its
 * design), the reasons of our REJs, and the probe of a lost higher rank: a
 * REQ that a live peer always refuses (session.c has the design).
 *
 * Context: the progress thread, but ferry__rdma_hello_build() (connect()'s
 * caller, setup_lock held).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rdma/rdma.h"

/* ---- HELLO -------------------------------------------------------------- */

/* our private data; call with setup_lock held, once cluster_id is known */
void ferry__rdma_hello_build(struct rdma_tp *t)
{
	const struct ferry_tp_config *cfg = &t->base.cfg;
	struct ferry_msg_hdr hdr = {
		.magic = FERRY_MSG_MAGIC,
		.version = FERRY_PROTO_VERSION,
		.type = FERRY_MSG_HELLO,
		.len = RDMA_HELLO_LEN,
		.src = cfg->rank,
	};
	struct ferry_msg_hello hello = {
		.cluster_id = cfg->cluster_id,
		.rank = cfg->rank,
		.world = cfg->world,
	};
	struct rdma_hello_ext ext = {
		.chunk_kib = RDMA_CHUNK >> 10,
		.credits = RDMA_CREDITS,
		.incarnation = t->incarnation,
	};

	memcpy(t->hello, &hdr, sizeof(hdr));
	memcpy(t->hello + sizeof(hdr), &hello, sizeof(hello));
	memcpy(t->hello + RDMA_HELLO_LEN, &ext, sizeof(ext));
}

/*
 * rdma_hello_check - is the peer's private data a HELLO of our cluster?
 * @dialed: the rank we dialed, or -1 for a request we got
 * @probe_ok: a request may come from a lower rank (a probe, session.c)
 *
 * Context: progress thread, after connect() published the cluster id.
 * Return: the peer's rank (its incarnation in *@inc_p), or -1 with @why
 * saying what is wrong.
 */
int ferry__rdma_hello_check(struct rdma_tp *t, const uint8_t *pdata, size_t len, int dialed,
			    int probe_ok, uint32_t *inc_p, char *why, size_t wlen)
{
	const struct ferry_tp_config *cfg = &t->base.cfg;
	struct rdma_hello_ext ext;
	int peer;

	if (len < RDMA_PDATA_LEN) {
		snprintf(why, wlen, "its private data is %zu bytes, not a HELLO", len);
		return -1;
	}
	if (dialed < 0 && probe_ok) {
		struct ferry_msg_hello hello;

		/* a lower rank's probe (session.c) names its rank as a dialer would */
		memcpy(&hello, pdata + sizeof(struct ferry_msg_hdr), sizeof(hello));
		if (hello.rank < cfg->rank)
			dialed = (int)hello.rank;
	}
	peer = ferry__proto_check_hello(pdata, RDMA_HELLO_LEN, cfg->cluster_id, cfg->world,
					cfg->rank, dialed, why, wlen);
	if (peer < 0)
		return -1;
	memcpy(&ext, pdata + RDMA_HELLO_LEN, sizeof(ext));
	if (ext.chunk_kib != RDMA_CHUNK >> 10 || ext.credits != RDMA_CREDITS || !ext.incarnation) {
		snprintf(why, wlen,
			 "its receive buffers (%u x %u KiB) differ from ours (%u x %u): a "
			 "different Ferry build",
			 ext.credits, ext.chunk_kib, RDMA_CREDITS, RDMA_CHUNK >> 10);
		return -1;
	}
	*inc_p = ext.incarnation;
	return peer;
}

/* the MAC of attempt @a of rank @i's dials to rank @j; @label: whose */
void ferry__rdma_auth_mac(const struct rdma_tp *t, const char *label, uint32_t i, uint32_t j,
			  uint32_t a, uint8_t *mac)
{
	const uint64_t cid = t->base.cfg.cluster_id;
	const void *parts[] = { &cid, &i, &j, &a };
	const size_t lens[] = { sizeof(cid), sizeof(i), sizeof(j), sizeof(a) };

	ferry__auth_mac(t->base.cfg.auth_key, label, parts, lens, 4, mac);
}

/*
 * rdma_auth_check - the token proof after a HELLO of rank @i to rank @j
 * @rep: 0 a dialer's REQ (checked by the acceptor: its attempt must be above
 *       @attempt_p's), 1 an acceptor's REP (its attempt must be *@attempt_p)
 * Return: 0 (a REQ's attempt stored in *@attempt_p), or -1 with @why.
 */
int ferry__rdma_auth_check(const struct rdma_tp *t, const uint8_t *pdata, size_t len, int rep,
			   uint32_t i, uint32_t j, uint32_t *attempt_p, char *why, size_t wlen)
{
	uint8_t mac[FERRY_AUTH_MAC_LEN];
	struct rdma_auth_rep ar;
	struct rdma_auth_req aq;
	size_t need = rep ? RDMA_REP_PDATA_LEN : RDMA_REQ_PDATA_LEN;

	if (len < need) {
		snprintf(why, wlen,
			 "it sent no token proof (%zu bytes of private data): was it "
			 "started without FERRY_TOKEN? every node needs the same one",
			 len);
		return -1;
	}
	ferry__rdma_auth_mac(t, rep ? "rdma rep" : "rdma req", i, j,
			     rep ? (memcpy(&ar, pdata + RDMA_PDATA_LEN, sizeof(ar)), ar.attempt) :
				   (memcpy(&aq, pdata + RDMA_PDATA_LEN, sizeof(aq)), aq.attempt),
			     mac);
	if (!ferry__auth_equal(mac, rep ? ar.mac : aq.mac, rep ? sizeof(ar.mac) : sizeof(aq.mac))) {
		snprintf(why, wlen,
			 "its token proof is wrong: it was started with another "
			 "FERRY_TOKEN, or none");
		return -1;
	}
	if (rep && ar.attempt != *attempt_p) {
		snprintf(why, wlen, "its token proof answers dial attempt %u, not %u", ar.attempt,
			 *attempt_p);
		return -1;
	}
	if (!rep && aq.attempt <= *attempt_p) {
		snprintf(why, wlen,
			 "it replays the token proof of dial attempt %u (attempt %u passed "
			 "already)",
			 aq.attempt, *attempt_p);
		return -1;
	}
	if (!rep)
		*attempt_p = aq.attempt;
	return 0;
}

const char *ferry__rdma_rej_str(uint32_t reason)
{
	switch (reason) {
	case RDMA_REJ_AUTH:
		return "it did not accept our token proof (see its log)";
	case RDMA_REJ_HELLO:
		return "it did not accept our HELLO (see its log)";
	case RDMA_REJ_DUP:
		return "it counts us as connected already";
	case RDMA_REJ_CLOSED:
		return "its cluster is connected or gave up";
	case RDMA_REJ_BUSY:
		return "it holds too many requests";
	case RDMA_REJ_RESOURCES:
		return "it could not make a queue pair";
	case RDMA_REJ_AGAIN:
		return "it is still closing our last link";
	case RDMA_REJ_FAILED:
		return "it marked us failed";
	case RDMA_REJ_INCARNATION:
		return "it holds a session with another process of our rank";
	case RDMA_REJ_REDIAL:
		return "it lives and redials us";
	default:
		return "an unknown reason";
	}
}

/*
 * how long after the loss the first probe goes, and between probes:
 * FERRY_RECONNECT_MS / 4 within [RDMA_PROBE_MIN_MS, RDMA_PROBE_MAX_MS]
 */
static int rdma_probe_ms(const struct rdma_tp *t)
{
	int ms = t->reconnect_ms / 4;

	return ms < RDMA_PROBE_MIN_MS ? RDMA_PROBE_MIN_MS :
	       ms > RDMA_PROBE_MAX_MS ? RDMA_PROBE_MAX_MS :
					ms;
}

/*
 * rdma_probe_answer - lower rank @p probes our listener (session.c): its link
 * to us is lost. Ours too, then: take it for lost if we did not see it (a
 * disconnect request lost on the way), and redial at once. The answer is a
 * REJ that says we live and redial; a dead process answers nothing of ours.
 */
void ferry__rdma_probe_answer(struct rdma_tp *t, struct rdma_conn *c, struct rdma_peer *p)
{
	uint32_t me = t->base.cfg.rank;

	/*
	 * It probes no sooner than rdma_probe_ms() after its loss: a link of
	 * ours that stood since is the redial it waits for (its ESTABLISHED
	 * still on the way), not one that broke unseen.
	 */
	if (p->live && rdma_now_ms() - p->up_ms >= rdma_probe_ms(t)) {
		char why[128];

		snprintf(why, sizeof(why), "rank %u probed rank %u (it lost their link)", p->rank,
			 me);
		ferry__rdma_peer_lost(t, p, why);
	} else if (p->lost && !t->dials[p->rank].conn) {
		t->dials[p->rank].next_ms = rdma_now_ms();
	}
	ferry_dbg("rdma: rank %u: rank %u probed us (%s); answered that we redial", me, p->rank,
		  p->lost ? "we lost the link too" : "our link to it is new");
	ferry__rdma_conn_reject(t, c, RDMA_REJ_REDIAL);
}

/* ---- probes of a lost higher rank (session.c) ----------------------------- */

static void rdma_probe_start(struct rdma_tp *t, uint32_t r)
{
	struct rdma_dial *d = &t->dials[r];
	struct rdma_peer *p = &t->peers[r];
	struct rdma_conn *c = ferry__rdma_conn_new(t, RDMA_CONN_PROBE);

	d->next_ms = rdma_now_ms() + rdma_probe_ms(t);
	if (!c)
		return;
	c->rank = r;
	snprintf(c->who, sizeof(c->who), "%s", d->where);
	if (rdma_create_id(t->ec, &c->id, c, RDMA_PS_TCP)) {
		c->id = NULL;
		ferry__rdma_conn_destroy(t, c);
		return;
	}
	if (RDMA_TIMED(t, r, "rdma_resolve_addr (a probe)",
		       rdma_resolve_addr(c->id, (struct sockaddr *)&t->src_sa,
					 (struct sockaddr *)&d->sa, RDMA_RESOLVE_MS))) {
		ferry__rdma_conn_destroy(t, c);
		return;
	}
	c->state = RDMA_CS_ADDR;
	d->conn = c;
	p->probes++;
	ferry_dbg("rdma: rank %u: probing rank %u at %s (probe %u, %lld ms after the loss)",
		  t->base.cfg.rank, r, d->where, p->probes, (long long)(c->t0_ms - p->lost_ms));
}

/*
 * an event on our probe of a lost higher rank: a REJ of ours says it lives
 * (and redials); a REJ of the kernel's CM that nobody listens on its port,
 * or one that says it failed us, ends the wait at once
 */
void ferry__rdma_probe_event(struct rdma_tp *t, struct rdma_conn *c, const struct rdma_cm_ev *ev)
{
	uint32_t me = t->base.cfg.rank, r = c->rank;
	struct rdma_dial *d = &t->dials[r];
	struct rdma_peer *p = &t->peers[r];
	struct rdma_conn_param cp;
	struct rdma_rej rej = { 0 };
	int gone = 0;
	char why[160];

	switch (ev->type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (!RDMA_TIMED(t, r, "rdma_resolve_route (a probe)",
				rdma_resolve_route(c->id, RDMA_RESOLVE_MS))) {
			c->state = RDMA_CS_ROUTE;
			return;
		}
		snprintf(why, sizeof(why), "rdma_resolve_route: %s", strerror(errno));
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED: {
		/* a queue pair of its own (no buffers): its number makes the REQ unique */
		struct ibv_qp_init_attr qa = {
			.send_cq = t->scq,
			.recv_cq = t->rcq,
			.qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 1,
				 .max_recv_wr = 1,
				 .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};

		if (RDMA_TIMED(t, r, "rdma_create_qp (a probe)",
			       rdma_create_qp(c->id, t->pd, &qa))) {
			snprintf(why, sizeof(why), "rdma_create_qp: %s", strerror(errno));
			break;
		}
		c->attempt = ++d->attempts;
		ferry__rdma_conn_param(t, c, &cp, 0, 0, 0);
		if (RDMA_TIMED(t, r, "rdma_connect (a probe)", rdma_connect(c->id, &cp))) {
			snprintf(why, sizeof(why), "rdma_connect: %s", strerror(errno));
			break;
		}
		c->state = RDMA_CS_CONNECTING;
		return;
	}
	case RDMA_CM_EVENT_REJECTED:
		if (ev->plen >= sizeof(rej))
			memcpy(&rej, ev->pdata, sizeof(rej));
		if (rej.magic == RDMA_REJ_MAGIC) {
			snprintf(why, sizeof(why), "rejected: %s", ferry__rdma_rej_str(rej.reason));
			gone = rej.reason == RDMA_REJ_FAILED || rej.reason == RDMA_REJ_INCARNATION;
		} else {
			/* IB_CM_REJ_INVALID_SERVICE_ID: no listener on its port, its process is gone */
			gone = ev->status == RDMA_CM_REJ_NO_LISTENER;
			snprintf(why, sizeof(why), "rejected (status %d)%s", ev->status,
				 gone ? ": nothing listens there" : "");
		}
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		/* not ours to keep: a probe is always refused by a node of this build */
		snprintf(why, sizeof(why), "it accepted the probe");
		c->disconnected = 1;
		RDMA_TIMED(t, r, "rdma_disconnect (a probe)", rdma_disconnect(c->id));
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_DISCONNECTED:
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		snprintf(why, sizeof(why), "%s (%s)", rdma_event_str(ev->type),
			 strerror(ev->status < 0 ? -ev->status : ev->status));
		break;
	default:
		return;
	}
	ferry_dbg("rdma: rank %u: probe %u of rank %u: %s after %lld ms", me, p->probes, r, why,
		  (long long)(rdma_now_ms() - c->t0_ms));
	ferry__rdma_redial_note(p, "probe %u: %s", p->probes, why);
	ferry__rdma_conn_destroy(t, c);
	d->next_ms = rdma_now_ms() + rdma_probe_ms(t);
	if (gone && p->lost && !p->live && !p->reported) {
		ferry_warn("rdma: rank %u: probing rank %u at %s after a lost link: %s; marking it "
			   "failed",
			   me, r, d->where, why);
		p->lost = 0;
		ferry__rdma_peer_fail(t, p, -FERRY_E_PEER);
	}
}

/*
 * probe each lost higher rank that has not redialed us: first
 * rdma_probe_ms() after the loss (or its last request), then as often, each
 * probe bounded as long. Return: the next time one is due, or -1.
 */
int64_t ferry__rdma_probe_tick(struct rdma_tp *t, int64_t now)
{
	int64_t next = -1;
	int every = rdma_probe_ms(t);

	if (t->seen_phase != RDMA_PHASE_DONE || !t->reconnect_ms ||
	    __atomic_load_n(&t->closing, __ATOMIC_ACQUIRE))
		return -1;
	for (uint32_t r = t->base.cfg.rank + 1; r < t->base.cfg.world; r++) {
		struct rdma_dial *d = &t->dials[r];
		struct rdma_peer *p = &t->peers[r];
		int64_t due;

		if (d->conn) {
			due = d->conn->t0_ms + every;
			if (now >= due || !p->lost || p->live || p->reported) {
				if (p->lost && !p->live && !p->reported)
					ferry__rdma_redial_note(p, "probe %u: no answer in %lld ms",
								p->probes,
								(long long)(now - d->conn->t0_ms));
				ferry__rdma_conn_destroy(t, d->conn);
				due = now;
			}
			if (d->conn) {
				if (next < 0 || due < next)
					next = due;
				continue;
			}
		}
		if (!p->lost || p->live || p->reported || !d->probe_ok)
			continue;
		due = p->lost_ms + every;
		if (d->next_ms > due)
			due = d->next_ms;
		if (p->req_ms >= p->lost_ms && p->req_ms + every > due)
			due = p->req_ms + every; /* it redials: it lives */
		if (now >= due) {
			rdma_probe_start(t, r);
			due = d->conn ? d->conn->t0_ms + every : d->next_ms;
		}
		if (next < 0 || due < next)
			next = due;
	}
	return next;
}

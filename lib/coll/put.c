/* SPDX-License-Identifier: MIT */
/*
 * put.c - the bandwidth-bound collectives' segments by one-sided WRITE:
 * where the transport can WRITE (FERRY_TP_CAP_WRITE: rdma, loop), the
 * ring's and the chain's segments go straight into the receiver's memory
 * instead of through the transport's message buffers.
 *
 *   receiver (member src of the writer's dst)      writer
 *   start: register the working buffer (REMOTE_WRITE) and, on the ring, a
 *          landing buffer for the reduce-scatter steps (count elements)
 *          COLL_KEYS (addresses, rkeys) ----------> keys kept; segments
 *                                                   queued until then
 *                                      <- - - - - - WRITE segment j into
 *                                                   buf (all-gather, chain)
 *                                                   or land (reduce-scatter)
 *                                                   ... its completion (0)
 *          COLL_PUT (step, off, n) <--------------- sent in segment order
 *   on_frame: the same checks as a COLL frame's, the elements taken from
 *   land (reduced in) or already in place (nothing to copy)
 *
 * The announcement leaves only once the WRITE completed at the writer, so a
 * COLL_PUT never names data that is not there: a link lost and
 * re-established by the transport (docs/rdma.md, "Reconnection") replays
 * frames but never WRITEs, and the WRITE's completion came before the frame
 * was sent. A WRITE that fails (a lost link: -FERRY_E_PEER, an access
 * error, loop's injected -EIO) sends that segment by message instead, in
 * its place in the order: segments to one member leave, WRITE-announced or
 * by message, in the order they were queued (a queue of struct coll_put),
 * which is what the receiver checks. A receiver that offered nothing (its
 * FERRY_COLL_ZCOPY=0, a registration that failed) sends keys of 0 and gets
 * every segment by message. This costs one completion per segment before
 * the announcement (the round trip a WRITE with immediate would save:
 * docs/collectives.md, "Over RDMA").
 *
 * WRITE with immediate (FERRY_TP_CAP_WRITE_IMM: rdma, loop): a receiver
 * that offers memory offers a slot too (COLL_KEYS' n, coll.h has the tag's
 * layout), and the writer sends each segment as one write_imm naming the
 * slot, the step and the segment's number in it: no COLL_PUT, and nothing
 * waits for the WRITE's completion before the next step can use the data.
 * The receiver's core gets the tag in the writer's stream order, after the
 * bytes landed (transport.h), and takes it as the COLL_PUT of that segment
 * (coll.c, coll_on_write_imm: the same checks). The transport keeps the
 * segment's descriptor until the receiver acknowledged it and posts it again
 * after a lost link, so the entry stays queued, and the working buffer
 * registered, until that acknowledgement (its on_rdma_done); a write_imm
 * that fails (only a failed peer or a closing node fail one) fails the
 * collective: a segment by message behind later ones already written would
 * arrive out of order. A collective writes with immediate only when the
 * receiver gave a slot, its steps and segments fit the tag (at most
 * FERRY_COLL_IMM_STEPS steps and FERRY_COLL_IMM_SEGS segments in the whole
 * buffer), and FERRY_COLL_IMM is not 0 here (a switch to measure the
 * COLL_PUT path against it); else it uses COLL_PUT as above, whole.
 *
 * Which collectives exchange keys follows from what every node knows alike
 * (the transport's capability, the algorithm, the size against
 * FERRY_COLL_ZCOPY_MIN), so a writer never waits for keys that do not come.
 *
 * Memory, per collective that puts: the ring's landing buffer (the
 * collective's size), the registrations of it and of the working buffer
 * (pinned for the collective's life), and one struct coll_put per segment
 * queued and not yet announced (at most the segments this node sends in the
 * collective). A collective's memory is freed once no WRITE of it is in
 * flight (ferry__coll_zc_fini waits for that, bounded by the node's
 * timeout).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/coll/coll.h"

#define PUT_NONE UINT32_MAX
/* an entry's status when the receiver offered no memory for it: by message */
#define PUT_NOT_OFFERED 1

enum coll_put_state {
	PUT_WAIT = 1, /* the receiver's keys have not come */
	PUT_POSTED,   /* its WRITE is in flight */
	PUT_DONE,     /* status says how it went */
};

/* one segment to c->zc.dst */
struct coll_put {
	struct ferry_rdma_ctx rc; /* first: the WRITE's completion context */
	struct coll_put *next;
	struct ferry_coll *c;
	uint32_t step;
	uint32_t seg; /* its number in the step */
	bool imm;     /* posted as a write_imm */
	uint64_t off, n;
	enum coll_put_state state;
	int status;
};

/* the collective whose WRITEs this thread posts now: a transport that
 * completes inline (loop) calls put_done inside write(), lock held */
static __thread struct ferry_coll *put_posting;

static atomic_ullong *put_counter(struct ferry_colls *cs, int which)
{
	return which == 0 ? &cs->puts : which == 1 ? &cs->put_fails : &cs->puts_imm;
}

static unsigned long long put_count(const struct ferry *fy, int which)
{
	struct ferry_colls *world = fy->coll;
	unsigned long long n = atomic_load(put_counter(world, which));

	pthread_mutex_lock(&world->glock);
	for (struct ferry_colls *g = world->groups; g; g = g->next)
		n += atomic_load(put_counter(g, which));
	pthread_mutex_unlock(&world->glock);
	return n;
}

unsigned long long ferry__coll_puts(const struct ferry *fy)
{
	return put_count(fy, 0);
}

unsigned long long ferry__coll_put_fails(const struct ferry *fy)
{
	return put_count(fy, 1);
}

unsigned long long ferry__coll_puts_imm(const struct ferry *fy)
{
	return put_count(fy, 2);
}

/* a slot for @c's write_imms (0: none free), the world's glock */
static uint32_t put_slot_take(struct ferry_coll *c)
{
	struct ferry_colls *world = c->fy->coll;
	uint32_t got = 0;

	pthread_mutex_lock(&world->glock);
	for (uint32_t i = 0; i < FERRY_COLL_IMM_SLOTS && !got; i++) {
		uint32_t k = (world->imm_next + i) % FERRY_COLL_IMM_SLOTS;

		if (!world->imm_slots[k]) {
			world->imm_slots[k] = c;
			world->imm_retired[k] = false;
			world->imm_next = k + 1;
			got = k + 1;
		}
	}
	pthread_mutex_unlock(&world->glock);
	return got;
}

static void put_slot_give(struct ferry_coll *c)
{
	struct ferry_colls *world = c->fy->coll;

	if (!c->zc.slot)
		return;
	pthread_mutex_lock(&world->glock);
	world->imm_slots[c->zc.slot - 1] = NULL;
	pthread_mutex_lock(&c->colls->lock);
	/* writes of a collective that ended on a failure may still come */
	world->imm_retired[c->zc.slot - 1] = c->status != 0;
	pthread_mutex_unlock(&c->colls->lock);
	pthread_mutex_unlock(&world->glock);
	c->zc.slot = 0;
}

void ferry__coll_zcopy_set(struct ferry *fy, bool on, size_t min)
{
	struct ferry_colls *world = fy->coll;

	pthread_mutex_lock(&world->lock);
	world->zcopy = on;
	world->zcopy_min = min;
	pthread_mutex_unlock(&world->lock);
}

void ferry__coll_imm_set(struct ferry *fy, bool on)
{
	atomic_store(&((struct ferry_colls *)fy->coll)->imm, on);
}

/* do step @step's segments land in the landing buffer (reduce-scatter)? */
static bool put_lands(const struct ferry_coll *c, uint32_t step)
{
	return c->sig.kind != FERRY_COLL_KIND_BCAST && step + 1 < c->colls->n;
}

static struct ferry_tp_mr *put_reg(struct ferry_coll *c, void *addr, size_t len, unsigned access)
{
	struct ferry_tp *tp = c->fy->tp;
	struct ferry_tp_mr *mr = calloc(1, tp->ops->mr_size);

	if (!mr)
		return NULL;
	if (tp->ops->mem_reg(tp, addr, len, access, mr)) {
		free(mr);
		return NULL;
	}
	if ((access & FERRY_TP_ACCESS_REMOTE_WRITE) && !mr->rkey) {
		/* 0 says "not offered" on the wire */
		tp->ops->mem_dereg(tp, mr);
		free(mr);
		return NULL;
	}
	return mr;
}

static void put_dereg(struct ferry_coll *c, struct ferry_tp_mr **mr_p)
{
	if (!*mr_p)
		return;
	c->fy->tp->ops->mem_dereg(c->fy->tp, *mr_p);
	free(*mr_p);
	*mr_p = NULL;
}

int ferry__coll_zc_start(struct ferry_coll *c, uint32_t src, uint32_t dst, bool land)
{
	struct ferry *fy = c->fy;
	struct ferry_colls *world = fy->coll;
	const struct ferry_tp_ops *ops = fy->tp->ops;
	const size_t bytes = (size_t)c->sig.count * c->esz;
	size_t min;
	bool zcopy;
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_coll b;
		struct ferry_msg_coll_keys k;
	} f;

	c->zc.src = src;
	c->zc.dst = dst;
	pthread_mutex_lock(&world->lock);
	zcopy = world->zcopy;
	min = world->zcopy_min;
	pthread_mutex_unlock(&world->lock);
	if (!(ops->caps & FERRY_TP_CAP_WRITE) || !ops->write || !ops->mem_reg || bytes < min)
		return 0;
	c->zc.on = true;
	c->zc.wseg = calloc(2 * (size_t)c->colls->n + 2, sizeof(*c->zc.wseg));
	if (!c->zc.wseg)
		return -ENOMEM;
	memset(&f, 0, sizeof(f));
	if (zcopy) {
		/* what we receive into must take remote writes; a buffer we
		 * only send from needs local access */
		c->zc.mr_buf = put_reg(c, c->buf, bytes,
				       src != PUT_NONE ? FERRY_TP_ACCESS_REMOTE_WRITE : 0);
		if (c->zc.mr_buf && src != PUT_NONE && land) {
			c->zc.land = malloc(bytes);
			if (c->zc.land)
				c->zc.mr_land =
					put_reg(c, c->zc.land, bytes, FERRY_TP_ACCESS_REMOTE_WRITE);
			if (!c->zc.mr_land) {
				free(c->zc.land);
				c->zc.land = NULL;
			}
		}
		if (!c->zc.mr_buf || (land && src != PUT_NONE && !c->zc.mr_land))
			ferry_dbg("coll: collective %llu: no registered memory for its %zu bytes "
				  "(see the transport's line); its segments go by message",
				  (unsigned long long)c->sig.seq, bytes);
	}
	if (src == PUT_NONE)
		return 0;
	if (c->zc.mr_buf && (!land || c->zc.mr_land)) {
		c->zc.offer = true;
		f.k.buf_addr = (uintptr_t)c->buf;
		f.k.buf_rkey = c->zc.mr_buf->rkey;
		if (land) {
			f.k.land_addr = (uintptr_t)c->zc.land;
			f.k.land_rkey = c->zc.mr_land->rkey;
		}
		if ((ops->caps & FERRY_TP_CAP_WRITE_IMM) && ops->write_imm)
			c->zc.slot = put_slot_take(c);
	}
	f.b = c->sig;
	f.b.off = 0;
	f.b.n = c->zc.slot; /* the slot + 1, 0: none */
	f.b.step = 0;
	ferry__proto_hdr_init(&f.h, FERRY_MSG_COLL_KEYS, sizeof(f), fy->rank, 0);
	return ferry__send(fy, ferry__coll_rank(c->colls, src), &f, sizeof(f));
}

/* a COLL_PUT: segment @e's WRITE has landed */
static int put_announce(struct ferry_coll *c, const struct coll_put *e)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_coll b;
	} f;

	f.b = c->sig;
	f.b.off = e->off;
	f.b.n = (uint32_t)e->n;
	f.b.step = e->step;
	ferry__proto_hdr_init(&f.h, FERRY_MSG_COLL_PUT, sizeof(f), c->fy->rank, 0);
	return ferry__send(c->fy, ferry__coll_rank(c->colls, c->zc.dst), &f, sizeof(f));
}

/*
 * send what completed at the head of the queue, in order: an announcement,
 * or the segment by message; complete the collective when it asked to and
 * the queue is empty. Lock held (or the caller's thread before RUNNING).
 * Return: 0 or a send's error
 */
static int put_drain(struct ferry_coll *c)
{
	struct coll_put *e;
	int rc = 0;

	while ((e = c->zc.head) && e->state == PUT_DONE) {
		c->zc.head = e->next;
		if (!c->zc.head)
			c->zc.tail = NULL;
		if (c->state != FERRY_COLL_DONE && !rc && e->imm) {
			if (e->status == 0) {
				atomic_fetch_add_explicit(&c->colls->puts_imm, 1,
							  memory_order_relaxed);
			} else {
				/* a failed peer or a closing node: said where it is seen */
				bool known = e->status == -FERRY_E_PEER ||
					     e->status == -FERRY_E_CLOSED;

				FERRY_LOG(
					known ? FERRY_LOG_DEBUG : FERRY_LOG_ERROR,
					"coll: collective %llu: a WRITE with immediate to rank %u "
					"failed (%s); the collective fails with it",
					(unsigned long long)c->sig.seq,
					ferry__coll_rank(c->colls, c->zc.dst),
					ferry_strerror(e->status));
				rc = e->status;
			}
		} else if (c->state != FERRY_COLL_DONE && !rc) {
			if (e->status == 0) {
				rc = put_announce(c, e);
				if (!rc)
					atomic_fetch_add_explicit(&c->colls->puts, 1,
								  memory_order_relaxed);
			} else {
				if (e->status != PUT_NOT_OFFERED)
					atomic_fetch_add_explicit(&c->colls->put_fails, 1,
								  memory_order_relaxed);
				if (e->status != PUT_NOT_OFFERED)
					ferry_dbg(
						"coll: collective %llu: a WRITE to rank %u failed "
						"(%s); that segment goes by message",
						(unsigned long long)c->sig.seq,
						ferry__coll_rank(c->colls, c->zc.dst),
						ferry_strerror(e->status));
				rc = ferry__coll_send_msg(c, c->zc.dst, e->step, e->off, e->n);
			}
		}
		free(e);
	}
	if (!rc && !c->zc.head && c->zc.finish_ok)
		ferry__coll_finish(c, 0);
	return rc;
}

/* the WRITE of @ctx completed: the progress thread, or inside write() */
static void put_done(struct ferry *fy, void *ctx, int status)
{
	struct coll_put *e = ctx;
	struct ferry_coll *c = e->c;
	struct ferry_colls *cs = c->colls;
	bool inline_ = put_posting == c;
	int rc;

	(void)fy;
	if (!inline_)
		pthread_mutex_lock(&cs->lock);
	e->state = PUT_DONE;
	e->status = status;
	c->zc.inflight--;
	if (inline_)
		return; /* the poster drains */
	if (c->state != FERRY_COLL_DONE) {
		rc = put_drain(c);
		if (rc)
			ferry__coll_finish(c, rc);
	}
	if (!c->zc.inflight)
		pthread_cond_broadcast(&cs->cond);
	pthread_mutex_unlock(&cs->lock);
}

/* post the WRITEs of every entry that waited for the keys; lock held */
static void put_post(struct ferry_coll *c)
{
	struct ferry_tp *tp = c->fy->tp;

	for (struct coll_put *e = c->zc.head; e; e = e->next) {
		bool lands = put_lands(c, e->step);
		uint64_t raddr = lands ? c->zc.pland : c->zc.pbuf;
		uint64_t rkey = lands ? c->zc.pland_rkey : c->zc.pbuf_rkey;
		int rc;

		if (e->state != PUT_WAIT)
			continue;
		if (!rkey || !c->zc.mr_buf) {
			e->state = PUT_DONE;
			e->status = PUT_NOT_OFFERED;
			continue;
		}
		e->state = PUT_POSTED;
		c->zc.inflight++;
		put_posting = c;
		if (c->zc.imm) {
			uint32_t tag = FERRY_TP_IMM_USER_COLL << FERRY_TP_IMM_USER_SHIFT |
				       (c->zc.pslot - 1) << FERRY_COLL_IMM_SLOT_SHIFT |
				       e->step << FERRY_COLL_IMM_STEP_SHIFT | e->seg;

			e->imm = true;
			rc = tp->ops->write_imm(tp, ferry__coll_rank(c->colls, c->zc.dst),
						(uint8_t *)c->buf + e->off * c->esz, c->zc.mr_buf,
						raddr + e->off * c->esz, rkey,
						(size_t)e->n * c->esz, tag, e);
		} else {
			rc = tp->ops->write(tp, ferry__coll_rank(c->colls, c->zc.dst),
					    (uint8_t *)c->buf + e->off * c->esz, c->zc.mr_buf,
					    raddr + e->off * c->esz, rkey, (size_t)e->n * c->esz,
					    e);
		}
		put_posting = NULL;
		if (rc) {
			e->state = PUT_DONE;
			e->status = rc;
			c->zc.inflight--;
		}
	}
}

int ferry__coll_send(struct ferry_coll *c, uint32_t dst, uint32_t step, uint64_t off, uint64_t n)
{
	const uint64_t seg = FERRY_COLL_SEG_BYTES / c->esz;

	if (!c->zc.on || dst != c->zc.dst)
		return ferry__coll_send_msg(c, dst, step, off, n);
	while (n) {
		struct coll_put *e = calloc(1, sizeof(*e));
		uint64_t k = n < seg ? n : seg;

		if (!e) {
			ferry_err("coll: collective %llu: no memory to queue a segment; it fails",
				  (unsigned long long)c->sig.seq);
			return -ENOMEM;
		}
		e->rc.done = put_done;
		e->c = c;
		e->step = step;
		e->seg = c->zc.wseg[step]++;
		e->off = off;
		e->n = k;
		e->state = PUT_WAIT;
		if (c->zc.tail)
			c->zc.tail->next = e;
		else
			c->zc.head = e;
		c->zc.tail = e;
		off += k;
		n -= k;
	}
	if (!c->zc.keys)
		return 0;
	put_post(c);
	return put_drain(c);
}

const char *ferry__coll_zc_keys(struct ferry_coll *c, uint32_t src, const struct ferry_msg_coll *m,
				const void *data)
{
	const struct ferry_msg_coll_keys *k = data;
	const struct ferry_tp_ops *ops = c->fy->tp->ops;
	const uint64_t seg = FERRY_COLL_SEG_BYTES / c->esz;
	int rc;

	if (!c->zc.on)
		return "coll: keys of a collective that puts nothing";
	if (src != c->zc.dst)
		return "coll: keys from a member this node does not send to";
	if (c->zc.keys)
		return "coll: a second set of keys";
	if ((k->buf_rkey && !k->buf_addr) || (k->land_rkey && !k->land_addr) ||
	    (k->land_rkey && !k->buf_rkey))
		return "coll: keys without their addresses";
	if (m->n > FERRY_COLL_IMM_SLOTS || (m->n && !k->buf_rkey))
		return "coll: a WRITE-with-immediate slot out of range, or without memory";
	c->zc.keys = true;
	c->zc.pbuf = k->buf_addr;
	c->zc.pbuf_rkey = k->buf_rkey;
	c->zc.pland = k->land_addr;
	c->zc.pland_rkey = k->land_rkey;
	/* every entry queued so far waits for these keys: none went yet */
	c->zc.pslot = m->n;
	c->zc.imm = m->n && c->zc.mr_buf &&
		    atomic_load(&((struct ferry_colls *)c->fy->coll)->imm) &&
		    (ops->caps & FERRY_TP_CAP_WRITE_IMM) && ops->write_imm &&
		    2 * c->colls->n + 2 <= FERRY_COLL_IMM_STEPS &&
		    c->sig.count <= (uint64_t)FERRY_COLL_IMM_SEGS * seg &&
		    ferry__coll_rank(c->colls, c->zc.dst) != c->fy->rank;
	put_post(c);
	rc = put_drain(c);
	if (rc)
		ferry__coll_finish(c, rc);
	return NULL;
}

const void *ferry__coll_zc_landed(struct ferry_coll *c, uint32_t src,
				  const struct ferry_msg_coll *m, bool land, bool *in_place_p,
				  const char **why_p)
{
	if (!c->zc.offer || src != c->zc.src || (land && !c->zc.land)) {
		*why_p = "coll: a put into memory this node did not offer";
		return NULL;
	}
	*in_place_p = !land;
	return (const uint8_t *)(land ? c->zc.land : c->buf) + m->off * c->esz;
}

void ferry__coll_finish_ok(struct ferry_coll *c)
{
	if (c->zc.head)
		c->zc.finish_ok = true;
	else
		ferry__coll_finish(c, 0);
}

bool ferry__coll_zc_fini(struct ferry_coll *c)
{
	struct ferry_colls *cs = c->colls;
	struct timespec deadline;

	if (!c->zc.on)
		return true;
	put_slot_give(c);
	ferry__deadline_ms(c->fy->timeout_ms, &deadline);
	pthread_mutex_lock(&cs->lock);
	while (c->zc.inflight)
		if (ferry__cond_wait_until(&cs->cond, &cs->lock, &deadline) == ETIMEDOUT &&
		    c->zc.inflight) {
			pthread_mutex_unlock(&cs->lock);
			ferry_err("coll: collective %llu: %u WRITEs still in flight after %d ms; "
				  "its buffers stay registered and allocated (leaked) so that they "
				  "land in memory still ours; the transport is stuck",
				  (unsigned long long)c->sig.seq, c->zc.inflight,
				  c->fy->timeout_ms);
			return false;
		}
	while (c->zc.head) {
		struct coll_put *e = c->zc.head;

		c->zc.head = e->next;
		free(e);
	}
	c->zc.tail = NULL;
	pthread_mutex_unlock(&cs->lock);
	put_dereg(c, &c->zc.mr_buf);
	put_dereg(c, &c->zc.mr_land);
	free(c->zc.land);
	c->zc.land = NULL;
	free(c->zc.wseg);
	c->zc.wseg = NULL;
	return true;
}

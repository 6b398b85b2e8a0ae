/* SPDX-License-Identifier: MIT */
/*
 * coll.c - the public collectives: arguments, numbering, the start, the
 * frames of the node's collectives, failures and waiting.
 *
 *   caller (any application thread)         progress thread
 *   -------------------------------         ---------------
 *   check arguments (one log line each)
 *   copy src into the working buffer
 *   lock: seq = next_seq++, STARTING,       COLL of seq s: not started here
 *         take frames kept for s              yet -> kept in colls->ahead;
 *   send the first step (no lock)             STARTING -> kept in coll->early;
 *   lock: RUNNING; frames kept -> KICK        RUNNING -> the algorithm's
 *   wait: spin a little, then the             on_frame: reduce, forward,
 *         condition variable, bounded         finish
 *         by the node's timeout             KICK (from itself): replay the
 *                                             kept frames, then run()
 *
 * Every node numbers its collectives 0, 1, 2 ... in call order; a frame
 * carries its collective's number and signature (count, kind, type,
 * operator, algorithm, root), checked against the local call. The checks
 * that drop a peer (a protocol error, logged with the reason) are: a frame
 * of a collective complete here, or more than FERRY_COLL_WINDOW ahead; and,
 * in the algorithm, a sender that is not this step's peer, a segment out of
 * order or outside its chunk, a step out of range. A different signature is
 * the application's error, not the peer's: the collective fails with
 * -FERRY_E_MISMATCH.
 *
 * Failures: a peer's ends every collective under way with -FERRY_E_PEER at
 * once (every collective involves every node); every later one fails at its
 * start. A mismatch or a timeout leaves the nodes out of step: later
 * collectives fail too, with that status.
 *
 * Memory, per node: the handles (at most FERRY_COLL_MAX_ACTIVE started and
 * not collected), each with 2 world + 2 offsets, a scratch buffer for a
 * reduce's non-root nodes (count elements) and a root's world bytes; kept
 * frames: those of collectives started here (rd.c, tree.c say how many)
 * and of at most FERRY_COLL_WINDOW collectives not started here yet, each no
 * more than that collective sends this node.
 */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "lib/coll/coll.h"

static const char *const coll_names[] = { "?", "ferry_allreduce", "ferry_reduce",
					  "ferry_broadcast" };
static const char *const coll_algo_names[] = { "auto", "doubling", "ring" };

static const struct ferry_coll_algo_ops *coll_ops(const struct ferry_coll *c)
{
	if (c->sig.kind == FERRY_COLL_KIND_BCAST)
		return c->sig.algo == FERRY_COLL_ALGO_RING ? &ferry__coll_chain : &ferry__coll_tree;
	return c->sig.algo == FERRY_COLL_ALGO_RING ? &ferry__coll_ring : &ferry__coll_rd;
}

static int64_t coll_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void coll_free(struct ferry_coll *c)
{
	/* a WRITE still in flight would land in freed memory: leak instead */
	if (!ferry__coll_zc_fini(c))
		return;
	ferry__coll_early_free(c->early);
	free(c->next_off);
	free(c->acked);
	free(c->scratch);
	ferry__node_put(c->fy);
	free(c);
}

/* ---- arguments ------------------------------------------------------- */

static bool coll_overlap(const void *a, const void *b, size_t bytes)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return x != y && x < y + bytes && y < x + bytes;
}

static int coll_check(struct ferry_colls *cs, uint8_t kind, const void *src, const void *dst,
		      size_t count, int dtype, int op, int root)
{
	const char *name = coll_names[kind];
	uint32_t esz = ferry__dtype_size(dtype > 0 ? (uint32_t)dtype : 0);
	bool is_root = kind == FERRY_COLL_KIND_ALLREDUCE || (cs && root == (int)cs->me);

	if (!cs) {
		ferry_err("coll: %s: the node or group is NULL; pass the handle ferry_open or "
			  "ferry_group_create gave",
			  name);
		return -EINVAL;
	}
	if (!esz) {
		ferry_err("coll: %s: unknown element type %d; pass FERRY_FLOAT32, FERRY_FLOAT64 "
			  "or FERRY_INT64",
			  name, dtype);
		return -EINVAL;
	}
	if (kind != FERRY_COLL_KIND_BCAST && (op < FERRY_SUM || op > FERRY_MIN)) {
		ferry_err("coll: %s: unknown operator %d; pass FERRY_SUM, FERRY_MAX or FERRY_MIN",
			  name, op);
		return -EINVAL;
	}
	if (kind != FERRY_COLL_KIND_ALLREDUCE && (root < 0 || (uint32_t)root >= cs->n)) {
		ferry_err("coll: %s: root %d is not a %s of %u", name, root,
			  cs->id ? "member index of this group" : "rank of this world", cs->n);
		return -EINVAL;
	}
	if (!count)
		return 0;
	if (count > SIZE_MAX / esz || count > UINT64_MAX / esz) {
		ferry_err("coll: %s: %zu elements of %u bytes overflow the address space", name,
			  count, esz);
		return -EINVAL;
	}
	if (!src || (is_root && !dst)) {
		ferry_err("coll: %s: a NULL buffer for %zu elements; pass the %s buffer", name,
			  count, !src ? "input" : "output");
		return -EINVAL;
	}
	if ((uintptr_t)src % esz || (is_root && (uintptr_t)dst % esz)) {
		ferry_err("coll: %s: a buffer at %p is not aligned to its %u-byte elements; align "
			  "it (malloc does)",
			  name, (uintptr_t)src % esz ? src : dst, esz);
		return -EINVAL;
	}
	if (is_root && coll_overlap(src, dst, count * esz)) {
		ferry_err("coll: %s: input and output overlap without being the same buffer; pass "
			  "the same pointer twice to work in place, or separate buffers",
			  name);
		return -EINVAL;
	}
	return 0;
}

/* ---- start ------------------------------------------------------------ */

/* why a new collective cannot start (logged), or 0; @busy: count the
 * collectives started and not collected too. colls->lock held */
static int coll_refuse(struct ferry_colls *cs, uint8_t kind, bool busy)
{
	if (cs->broken == -FERRY_E_PEER) {
		ferry_err("coll: %s: rank %u failed, and no collective can complete without it; "
			  "restart the job",
			  coll_names[kind], cs->broken_rank);
		return cs->broken;
	}
	if (cs->broken) {
		ferry_err("coll: %s: an earlier collective failed (%s) and left the nodes out of "
			  "step; restart the job",
			  coll_names[kind], ferry_strerror(cs->broken));
		return cs->broken;
	}
	if (busy && cs->nstarted >= FERRY_COLL_MAX_ACTIVE) {
		ferry_err("coll: %s: %d collectives started and not collected; wait for or test "
			  "one first",
			  coll_names[kind], FERRY_COLL_MAX_ACTIVE);
		return -EBUSY;
	}
	return 0;
}

static int coll_kick(struct ferry_coll *c)
{
	return ferry__coll_send_ctl(c, c->colls->me, FERRY_MSG_COLL_KICK);
}

static int coll_start(struct ferry_colls *cs, uint8_t kind, const void *src, void *dst,
		      size_t count, int dtype, int op, int root, struct ferry_coll **coll_p)
{
	struct ferry *fy;
	struct ferry_colls *world;
	struct ferry_coll *c;
	struct ferry_coll_early **pp;
	enum ferry_coll_algo algo;
	size_t bytes, crossover;
	bool is_root;
	int rc, kick;

	rc = coll_check(cs, kind, src, dst, count, dtype, op, root);
	if (rc)
		return rc;
	fy = cs->fy;
	/* every group follows the node's choice (ferry_coll_algo_set) */
	world = fy->coll;
	pthread_mutex_lock(&world->lock);
	algo = world->algo;
	crossover = world->crossover;
	pthread_mutex_unlock(&world->lock);
	if (!coll_p) {
		ferry_err("coll: %s_start: no place for the handle; pass &handle",
			  coll_names[kind]);
		return -EINVAL;
	}
	if (atomic_load(&fy->closed))
		return -FERRY_E_CLOSED;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	ferry__node_get(fy);
	c->fy = fy;
	c->colls = cs;
	c->esz = ferry__dtype_size((uint32_t)dtype);
	c->sig.kind = kind;
	c->sig.dtype = (uint8_t)dtype;
	c->sig.op = kind == FERRY_COLL_KIND_BCAST ? 0 : (uint8_t)op;
	c->sig.root = kind == FERRY_COLL_KIND_ALLREDUCE ? 0 : (uint32_t)root;
	c->sig.count = count;
	c->sig.group = cs->id;
	c->src = src;
	bytes = count * c->esz;
	is_root = kind == FERRY_COLL_KIND_ALLREDUCE || (uint32_t)root == cs->me;

	/* refused calls change nothing: check before touching the output */
	pthread_mutex_lock(&cs->lock);
	rc = coll_refuse(cs, kind, true);
	if (!rc)
		cs->nstarted++;
	pthread_mutex_unlock(&cs->lock);
	if (rc) {
		coll_free(c);
		return rc;
	}

	/* the working buffer: the output, or a reduce's scratch off the root */
	if (kind == FERRY_COLL_KIND_BCAST) {
		c->buf = (void *)src;
	} else if (is_root) {
		c->buf = dst;
		if (count && src != dst)
			memcpy(dst, src, bytes);
	} else if (count) {
		c->scratch = malloc(bytes);
		if (c->scratch) {
			memcpy(c->scratch, src, bytes);
			c->buf = c->scratch;
		}
	}

	pthread_mutex_lock(&cs->lock);
	if (!count || cs->n == 1) {
		/* nothing to send: done at once, with no number (every node skips it) */
		c->state = FERRY_COLL_DONE;
		atomic_store(&c->done, true);
		pthread_mutex_unlock(&cs->lock);
		*coll_p = c;
		return 0;
	}
	c->next_off = calloc(2 * (size_t)cs->n + 2, sizeof(*c->next_off));
	/* a peer may have failed meanwhile: its listener saw no such collective */
	rc = !c->next_off || !c->buf ? -ENOMEM : coll_refuse(cs, kind, false);
	if (rc) {
		cs->nstarted--;
		pthread_mutex_unlock(&cs->lock);
		if (rc == -ENOMEM)
			ferry_err("coll: %s: no memory for %s", coll_names[kind],
				  c->buf ? "its step offsets" :
					   "a scratch buffer of the input's size");
		coll_free(c);
		return rc;
	}
	c->sig.algo = algo != FERRY_COLL_ALGO_AUTO ? algo :
		      bytes < crossover		   ? FERRY_COLL_ALGO_DOUBLING :
						     FERRY_COLL_ALGO_RING;
	c->sig.seq = cs->next_seq++;
	c->state = FERRY_COLL_STARTING;
	c->next = cs->active;
	cs->active = c;
	/* frames that came before the call, in arrival order */
	for (pp = &cs->ahead; *pp;) {
		struct ferry_coll_early *e = *pp;
		const struct ferry_msg_coll *m = ferry__coll_frame_body(e);

		if (m->seq != c->sig.seq) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		e->next = NULL;
		if (c->early_tail)
			c->early_tail->next = e;
		else
			c->early = e;
		c->early_tail = e;
	}
	cs->ahead_tail = NULL;
	for (struct ferry_coll_early *e = cs->ahead; e; e = e->next)
		cs->ahead_tail = e;
	pthread_mutex_unlock(&cs->lock);

	kick = coll_ops(c)->start(c);

	pthread_mutex_lock(&cs->lock);
	rc = 0;
	if (c->state != FERRY_COLL_DONE) {
		if (kick < 0) {
			ferry__coll_finish(c, kick);
		} else {
			c->state = FERRY_COLL_RUNNING;
			kick = kick > 0 || c->early;
			c->replay = kick > 0;
		}
	}
	if (c->state == FERRY_COLL_DONE && c->status) {
		rc = c->status;
		cs->nstarted--;
	}
	pthread_mutex_unlock(&cs->lock);
	if (rc) {
		ferry_err("coll: %s %llu: its first step could not be sent: %s", coll_names[kind],
			  (unsigned long long)c->sig.seq, ferry_strerror(rc));
		coll_free(c);
		return rc;
	}
	if (kick > 0) {
		rc = coll_kick(c);
		if (rc) {
			pthread_mutex_lock(&cs->lock);
			ferry__coll_finish(c, rc);
			pthread_mutex_unlock(&cs->lock);
		}
	}
	*coll_p = c;
	return 0;
}

/* ---- wait ------------------------------------------------------------- */

/*
 * A thread that polls the transport runs handlers, which need it
 * RCU-registered (transport/transport.h, poll). A collective's caller may be
 * any application thread: the first wait registers it, and it stays so
 * until it exits (a thread-specific key's destructor unregisters it), so a
 * wait costs no registration. Return: registered.
 */
static pthread_key_t coll_rcu_key;
/* the collectives this thread waits for while it polls (coll_on_msg counts
 * the frames it takes so: cs->polled) */
static __thread struct ferry_colls *coll_polling;
static pthread_once_t coll_rcu_once = PTHREAD_ONCE_INIT;
static int coll_rcu_key_rc;

static void coll_rcu_exit(void *p)
{
	(void)p;
	ferry__rcu_leave();
}

static void coll_rcu_key_make(void)
{
	coll_rcu_key_rc = pthread_key_create(&coll_rcu_key, coll_rcu_exit);
}

static bool coll_rcu_registered(void)
{
	pthread_once(&coll_rcu_once, coll_rcu_key_make);
	if (coll_rcu_key_rc)
		return false;
	if (pthread_getspecific(coll_rcu_key))
		return true;
	if (pthread_setspecific(coll_rcu_key, (void *)1))
		return false;
	ferry__rcu_enter();
	return true;
}

static int coll_collect(struct ferry_coll *c, bool block)
{
	struct ferry *fy;
	struct ferry_colls *cs;
	struct timespec deadline;
	int rc;

	if (!c) {
		ferry_err("coll: wait or test of a NULL handle; pass the one a _start call gave");
		return -EINVAL;
	}
	fy = c->fy;
	cs = c->colls;
	if (block && !atomic_load_explicit(&c->done, memory_order_acquire)) {
		/* a small collective takes tens of microseconds: spin before
		 * sleeping. Where the transport lets a waiting thread read the
		 * sockets itself (tcp, FERRY_TCP_WORKER_POLL=1), the spin does,
		 * and the frames that complete this collective are handled here
		 * with no hand-off from the progress thread; else it yields the
		 * CPU, which the progress thread may need */
		int64_t until = coll_now_ns() + (fy->busy_poll ? 1000000000ll : 100000ll);
		bool poll = cs->poll && coll_rcu_registered();

		if (poll) {
			coll_polling = cs;
			ferry__node_poll(fy, FERRY_TP_POLL_HOLD | FERRY_TP_POLL_FIRST);
		}
		/* a poll that found nothing yields too once the spin lasted
		 * 20 us: a node that shares the core may be the one to send;
		 * sooner, a yield on a loaded core would give it away for a
		 * whole time slice. Where this host runs more ranks than it has
		 * CPUs (cs->yield_now), the sender is most likely waiting for
		 * this CPU: yield at once (4 ranks on 2 cores: all-reduces of
		 * 8 B to 4 KiB took 1.9x Open MPI's time, 1.0-1.1x so) */
		int64_t yield_from = until - (fy->busy_poll ? 1000000000ll : 100000ll) +
				     (cs->yield_now ? 0 : 20000);
		int64_t now;

		while (!atomic_load_explicit(&c->done, memory_order_acquire) &&
		       (now = coll_now_ns()) < until)
			if (!poll ||
			    (ferry__node_poll(fy, FERRY_TP_POLL_HOLD) <= 0 && now >= yield_from))
				sched_yield();
		if (poll) {
			/* done: the progress thread may stay aside for the
			 * next collective; else it takes the sockets back now */
			ferry__node_poll(
				fy, FERRY_TP_POLL_HOLD | FERRY_TP_POLL_LAST |
					    (atomic_load_explicit(&c->done, memory_order_acquire) ?
						     FERRY_TP_POLL_LINGER :
						     0));
			coll_polling = NULL;
		}
	}
	ferry__deadline_ms(fy->timeout_ms, &deadline);
	pthread_mutex_lock(&cs->lock);
	while (!atomic_load_explicit(&c->done, memory_order_acquire)) {
		struct timespec slice;

		if (atomic_load(&fy->closed)) {
			ferry__coll_finish(c, -FERRY_E_CLOSED);
			break;
		}
		if (!block) {
			pthread_mutex_unlock(&cs->lock);
			return -EAGAIN;
		}
		/* wake up at least every 100 ms to notice a close */
		ferry__deadline_ms(100, &slice);
		if (slice.tv_sec > deadline.tv_sec ||
		    (slice.tv_sec == deadline.tv_sec && slice.tv_nsec > deadline.tv_nsec))
			slice = deadline;
		if (ferry__cond_wait_until(&cs->cond, &cs->lock, &slice) == ETIMEDOUT &&
		    !atomic_load(&c->done) && slice.tv_sec == deadline.tv_sec &&
		    slice.tv_nsec == deadline.tv_nsec) {
			ferry_err("coll: %s %llu: timed out after %d ms (%llu elements still to "
				  "come); a node is stopped, slow or did not call it; later "
				  "collectives fail too",
				  coll_names[c->sig.kind], (unsigned long long)c->sig.seq,
				  fy->timeout_ms, (unsigned long long)c->remaining);
			if (!cs->broken)
				cs->broken = -ETIMEDOUT;
			ferry__coll_finish(c, -ETIMEDOUT);
		}
	}
	rc = c->status;
	cs->nstarted--;
	pthread_mutex_unlock(&cs->lock);
	if (rc == -FERRY_E_PEER)
		ferry_err("coll: %s %llu: rank %u failed, and the collective cannot complete "
			  "without it; restart the job",
			  coll_names[c->sig.kind], (unsigned long long)c->sig.seq, cs->broken_rank);
	coll_free(c);
	return rc;
}

int ferry_coll_wait(struct ferry_coll *coll)
{
	return coll_collect(coll, true);
}

int ferry_coll_test(struct ferry_coll *coll)
{
	return coll_collect(coll, false);
}

/* ---- public calls ----------------------------------------------------- */

static struct ferry_colls *coll_world(struct ferry *fy)
{
	return fy ? fy->coll : NULL;
}

static struct ferry_colls *coll_group(struct ferry_group *g)
{
	return g ? &g->cs : NULL;
}

int ferry_allreduce_start(struct ferry *fy, const void *src, void *dst, size_t count,
			  enum ferry_dtype dtype, enum ferry_redop op, struct ferry_coll **coll_p)
{
	return coll_start(coll_world(fy), FERRY_COLL_KIND_ALLREDUCE, src, dst, count, (int)dtype,
			  (int)op, 0, coll_p);
}

int ferry_reduce_start(struct ferry *fy, const void *src, void *dst, size_t count,
		       enum ferry_dtype dtype, enum ferry_redop op, int root,
		       struct ferry_coll **coll_p)
{
	return coll_start(coll_world(fy), FERRY_COLL_KIND_REDUCE, src, dst, count, (int)dtype,
			  (int)op, root, coll_p);
}

int ferry_broadcast_start(struct ferry *fy, void *buf, size_t count, enum ferry_dtype dtype,
			  int root, struct ferry_coll **coll_p)
{
	return coll_start(coll_world(fy), FERRY_COLL_KIND_BCAST, buf, buf, count, (int)dtype, 0,
			  root, coll_p);
}

int ferry_group_allreduce_start(struct ferry_group *g, const void *src, void *dst, size_t count,
				enum ferry_dtype dtype, enum ferry_redop op,
				struct ferry_coll **coll_p)
{
	return coll_start(coll_group(g), FERRY_COLL_KIND_ALLREDUCE, src, dst, count, (int)dtype,
			  (int)op, 0, coll_p);
}

int ferry_group_reduce_start(struct ferry_group *g, const void *src, void *dst, size_t count,
			     enum ferry_dtype dtype, enum ferry_redop op, int root,
			     struct ferry_coll **coll_p)
{
	return coll_start(coll_group(g), FERRY_COLL_KIND_REDUCE, src, dst, count, (int)dtype,
			  (int)op, root, coll_p);
}

int ferry_group_broadcast_start(struct ferry_group *g, void *buf, size_t count,
				enum ferry_dtype dtype, int root, struct ferry_coll **coll_p)
{
	return coll_start(coll_group(g), FERRY_COLL_KIND_BCAST, buf, buf, count, (int)dtype, 0,
			  root, coll_p);
}

int ferry_group_allreduce(struct ferry_group *g, const void *src, void *dst, size_t count,
			  enum ferry_dtype dtype, enum ferry_redop op)
{
	struct ferry_coll *c;
	int rc = ferry_group_allreduce_start(g, src, dst, count, dtype, op, &c);

	return rc ? rc : ferry_coll_wait(c);
}

int ferry_group_reduce(struct ferry_group *g, const void *src, void *dst, size_t count,
		       enum ferry_dtype dtype, enum ferry_redop op, int root)
{
	struct ferry_coll *c;
	int rc = ferry_group_reduce_start(g, src, dst, count, dtype, op, root, &c);

	return rc ? rc : ferry_coll_wait(c);
}

int ferry_group_broadcast(struct ferry_group *g, void *buf, size_t count, enum ferry_dtype dtype,
			  int root)
{
	struct ferry_coll *c;
	int rc = ferry_group_broadcast_start(g, buf, count, dtype, root, &c);

	return rc ? rc : ferry_coll_wait(c);
}

int ferry_allreduce(struct ferry *fy, const void *src, void *dst, size_t count,
		    enum ferry_dtype dtype, enum ferry_redop op)
{
	struct ferry_coll *c;
	int rc = ferry_allreduce_start(fy, src, dst, count, dtype, op, &c);

	return rc ? rc : ferry_coll_wait(c);
}

int ferry_reduce(struct ferry *fy, const void *src, void *dst, size_t count, enum ferry_dtype dtype,
		 enum ferry_redop op, int root)
{
	struct ferry_coll *c;
	int rc = ferry_reduce_start(fy, src, dst, count, dtype, op, root, &c);

	return rc ? rc : ferry_coll_wait(c);
}

int ferry_broadcast(struct ferry *fy, void *buf, size_t count, enum ferry_dtype dtype, int root)
{
	struct ferry_coll *c;
	int rc = ferry_broadcast_start(fy, buf, count, dtype, root, &c);

	return rc ? rc : ferry_coll_wait(c);
}

int ferry_coll_algo_set(struct ferry *fy, enum ferry_coll_algo algo)
{
	struct ferry_colls *cs;

	if (!fy || algo < FERRY_COLL_ALGO_AUTO || algo > FERRY_COLL_ALGO_RING) {
		ferry_err("coll: ferry_coll_algo_set: %s; pass FERRY_COLL_ALGO_AUTO, _DOUBLING or "
			  "_RING",
			  fy ? "unknown algorithm" : "the node is NULL");
		return -EINVAL;
	}
	cs = fy->coll;
	pthread_mutex_lock(&cs->lock);
	cs->algo = algo;
	pthread_mutex_unlock(&cs->lock);
	return 0;
}

/* ---- frames (progress thread) ----------------------------------------- */

static struct ferry_coll *coll_find(struct ferry_colls *cs, uint64_t seq)
{
	for (struct ferry_coll *c = cs->active; c; c = c->next)
		if (c->sig.seq == seq)
			return c;
	return NULL;
}

static bool coll_sig_eq(const struct ferry_msg_coll *a, const struct ferry_msg_coll *b)
{
	return a->seq == b->seq && a->count == b->count && a->kind == b->kind &&
	       a->dtype == b->dtype && a->op == b->op && a->algo == b->algo && a->root == b->root &&
	       a->group == b->group;
}

/* the application called different collectives: fail this one and every
 * later one. Lock held. */
static void coll_mismatch(struct ferry_coll *c, uint32_t src, const struct ferry_msg_coll *m)
{
	static const char *const types[] = { "?", "float32", "float64", "int64" };

	ferry_err("coll: collective %llu: rank %u called %s of %llu %s (op %u, root %u, %s) "
		  "where this node called %s of %llu %s (op %u, root %u, %s); every node must "
		  "call the same collectives in the same order with the same arguments (and the "
		  "same ferry_coll_algo_set)",
		  (unsigned long long)c->sig.seq, ferry__coll_rank(c->colls, src),
		  coll_names[m->kind], (unsigned long long)m->count, types[m->dtype], m->op,
		  m->root, coll_algo_names[m->algo], coll_names[c->sig.kind],
		  (unsigned long long)c->sig.count, types[c->sig.dtype], c->sig.op, c->sig.root,
		  coll_algo_names[c->sig.algo]);
	if (!c->colls->broken)
		c->colls->broken = -FERRY_E_MISMATCH;
	ferry__coll_finish(c, -FERRY_E_MISMATCH);
}

/* one frame of a started collective; lock held. Return: a protocol error */
static const char *coll_deliver(struct ferry_coll *c, uint32_t src, uint8_t type,
				const struct ferry_msg_coll *m, const void *data)
{
	if (!coll_sig_eq(&c->sig, m)) {
		coll_mismatch(c, src, m);
		return NULL;
	}
	return coll_ops(c)->on_frame(c, src, type, m, data);
}

/* replay what @c kept while it started, then let it move on; lock held */
static const char *coll_replay(struct ferry_coll *c, uint32_t *bad_src)
{
	struct ferry_coll_early *e = c->early;
	const char *why = NULL;

	c->early = c->early_tail = NULL;
	c->replay = false;
	while (e && !why && c->state == FERRY_COLL_RUNNING) {
		struct ferry_coll_early *next = e->next;
		const struct ferry_msg_hdr *h = (const void *)e->frame;
		const struct ferry_msg_coll *m = (const void *)(h + 1);

		why = coll_deliver(c, e->src, h->type, m, m + 1);
		if (why)
			*bad_src = e->src;
		free(e);
		e = next;
	}
	ferry__coll_early_free(e);
	if (!why && c->state == FERRY_COLL_RUNNING && coll_ops(c)->run)
		coll_ops(c)->run(c);
	return why;
}

/* a frame of @cs from member @src; cs->lock held. Return: a protocol error
 * (the member to drop in *@bad) */
static const char *coll_group_msg(struct ferry_colls *cs, uint32_t src, uint8_t type,
				  const struct ferry_msg_coll *m, const struct ferry_proto_view *v,
				  uint32_t *bad)
{
	struct ferry_coll *c = coll_find(cs, m->seq);

	*bad = src;
	if (type == FERRY_MSG_COLL_KICK) {
		if (src != cs->me)
			return "coll: a kick from another node";
		if (c && c->state == FERRY_COLL_RUNNING)
			return coll_replay(c, bad);
	} else if (!c) {
		if (cs->broken)
			; /* out of step already: what is left of abandoned ones goes */
		else if (m->seq < cs->next_seq)
			return "coll: a frame of a collective complete here";
		else if (m->seq >= cs->next_seq + FERRY_COLL_WINDOW)
			return "coll: a frame of a collective too far ahead of this node";
		else if (ferry__coll_keep(&cs->ahead, &cs->ahead_tail, src, v->hdr, v->hdr->len))
			ferry_err("coll: no memory to keep a frame of collective %llu from rank "
				  "%u; it is lost and that collective will time out",
				  (unsigned long long)m->seq, ferry__coll_rank(cs, src));
	} else if (c->state == FERRY_COLL_STARTING || c->replay) {
		if (!coll_sig_eq(&c->sig, m))
			coll_mismatch(c, src, m);
		else if (ferry__coll_keep(&c->early, &c->early_tail, src, v->hdr, v->hdr->len))
			ferry__coll_finish(c, -ENOMEM);
	} else {
		return coll_deliver(c, src, type, m, v->data);
	}
	return NULL;
}

static void coll_on_msg(struct ferry *fy, struct ferry_table *t, uint32_t src,
			const struct ferry_proto_view *v)
{
	struct ferry_colls *world = fy->coll, *cs = world;
	const struct ferry_msg_coll *m = v->coll;
	const char *why = NULL;
	uint32_t bad = src;

	(void)t;
	if (m->group) {
		pthread_mutex_lock(&world->glock);
		for (cs = world->groups; cs && cs->id != m->group; cs = cs->next)
			;
		if (!cs)
			why = ferry__coll_orphan(world, src, v);
	}
	if (cs) {
		int32_t idx = cs->index ? cs->index[src] : (int32_t)src;

		if (idx < 0) {
			why = "coll: a frame of a group its sender is not a member of";
		} else {
			if (coll_polling == cs)
				atomic_fetch_add_explicit(&cs->polled, 1, memory_order_relaxed);
			pthread_mutex_lock(&cs->lock);
			why = coll_group_msg(cs, (uint32_t)idx, v->hdr->type, m, v, &bad);
			pthread_mutex_unlock(&cs->lock);
			bad = ferry__coll_rank(cs, bad);
		}
	}
	if (m->group)
		pthread_mutex_unlock(&world->glock);
	if (why) {
		ferry_err("proto: rank %u sent a malformed message (collective %llu, step %u): %s; "
			  "dropping rank %u",
			  bad, (unsigned long long)m->seq, m->step, why, bad);
		ferry__node_peer_failed(fy, bad);
	}
}

/* the COLL_PUT that a write_imm's collective bits @bits stand for, into @m
 * (@c offered the slot they name); lock held. Return: a protocol error */
static const char *coll_imm_frame(struct ferry_coll *c, uint32_t bits, struct ferry_msg_coll *m)
{
	const uint32_t step = bits >> FERRY_COLL_IMM_STEP_SHIFT & (FERRY_COLL_IMM_STEPS - 1);
	const uint32_t k = bits & (FERRY_COLL_IMM_SEGS - 1);
	const struct ferry_coll_algo_ops *algo = coll_ops(c);
	const uint64_t seg = FERRY_COLL_SEG_BYTES / c->esz;
	uint64_t lo, hi;

	if (!algo->recv_range || step >= algo->nsteps(c))
		return "coll: a WRITE with immediate naming a step this collective does not take";
	algo->recv_range(c, step, &lo, &hi);
	if (lo + k * seg >= hi)
		return "coll: a WRITE with immediate naming a segment past its step's elements";
	*m = c->sig;
	m->step = step;
	m->off = lo + k * seg;
	m->n = (uint32_t)(hi - m->off < seg ? hi - m->off : seg);
	return NULL;
}

/*
 * a write_imm from @src landed (coll.h has the tag): the COLL_PUT of the
 * segment it names, taken as that frame would be (kept while the collective
 * starts, the same checks). Progress thread.
 */
static void coll_on_write_imm(struct ferry *fy, uint32_t src, uint32_t bits)
{
	struct ferry_colls *world = fy->coll, *cs;
	const uint32_t slot = bits >> FERRY_COLL_IMM_SLOT_SHIFT;
	const char *why = NULL;
	struct ferry_coll *c;
	uint32_t bad = src;
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_coll b;
	} f;

	pthread_mutex_lock(&world->glock);
	c = slot < FERRY_COLL_IMM_SLOTS ? world->imm_slots[slot] : NULL;
	if (!c) {
		if (slot >= FERRY_COLL_IMM_SLOTS || !world->imm_retired[slot])
			why = "coll: a WRITE with immediate into a slot no collective here offered";
	} else {
		int32_t idx;

		cs = c->colls;
		idx = cs->index ? cs->index[src] : (int32_t)src;
		if (idx < 0 || (uint32_t)idx != c->zc.src) {
			why = "coll: a WRITE with immediate from a node this collective did not "
			      "offer memory to";
		} else {
			struct ferry_proto_view v = { .hdr = &f.h, .body = &f.b, .coll = &f.b };

			pthread_mutex_lock(&cs->lock);
			why = coll_imm_frame(c, bits, &f.b);
			if (!why) {
				ferry__proto_hdr_init(&f.h, FERRY_MSG_COLL_PUT, sizeof(f), src, 0);
				v.count = f.b.n;
				why = coll_group_msg(cs, (uint32_t)idx, FERRY_MSG_COLL_PUT, &f.b,
						     &v, &bad);
				bad = ferry__coll_rank(cs, bad);
			}
			pthread_mutex_unlock(&cs->lock);
		}
	}
	pthread_mutex_unlock(&world->glock);
	if (why) {
		ferry_err("proto: rank %u sent a malformed WRITE with immediate (collective bits "
			  "%#x): %s; dropping rank %u",
			  bad, bits, why, bad);
		ferry__node_peer_failed(fy, bad);
	}
}

/* @rank failed: every collective of @cs under way ends, and every later one
 * fails at its start */
static void coll_break(struct ferry_colls *cs, uint32_t rank)
{
	pthread_mutex_lock(&cs->lock);
	if (cs->broken != -FERRY_E_PEER) {
		cs->broken = -FERRY_E_PEER;
		cs->broken_rank = rank;
	}
	while (cs->active)
		ferry__coll_finish(cs->active, -FERRY_E_PEER);
	ferry__coll_early_free(cs->ahead);
	cs->ahead = cs->ahead_tail = NULL;
	pthread_mutex_unlock(&cs->lock);
}

/* a peer failed (progress thread): every collective of the whole cluster,
 * and of each group it is a member of, needs it */
static void coll_on_peer_failed(struct ferry *fy, uint32_t rank)
{
	struct ferry_colls *world = fy->coll;

	coll_break(world, rank);
	pthread_mutex_lock(&world->glock);
	for (struct ferry_colls *g = world->groups; g; g = g->next)
		if (g->index[rank] >= 0)
			coll_break(g, rank);
	pthread_mutex_unlock(&world->glock);
}

static void coll_colls_free(void *p)
{
	struct ferry_colls *cs = p;

	if (!cs)
		return;
	ferry__coll_groups_free(cs);
	pthread_mutex_destroy(&cs->glock);
	ferry__coll_colls_fini(cs);
	free(cs);
}

static enum ferry_coll_algo coll_env_algo(void)
{
	const char *s = getenv("FERRY_COLL_ALGO");

	if (!s || !*s || !strcmp(s, "auto"))
		return FERRY_COLL_ALGO_AUTO;
	if (!strcmp(s, "doubling") || !strcmp(s, "tree"))
		return FERRY_COLL_ALGO_DOUBLING;
	if (!strcmp(s, "ring") || !strcmp(s, "chain"))
		return FERRY_COLL_ALGO_RING;
	ferry_warn("coll: FERRY_COLL_ALGO=%s is not auto, doubling or ring; using auto", s);
	return FERRY_COLL_ALGO_AUTO;
}

static size_t coll_env_crossover(void)
{
	const char *s = getenv("FERRY_COLL_CROSSOVER");
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return FERRY_COLL_CROSSOVER_DEFAULT;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || end == s) {
		ferry_warn("coll: FERRY_COLL_CROSSOVER=%s is not a number of bytes; using %u", s,
			   FERRY_COLL_CROSSOVER_DEFAULT);
		return FERRY_COLL_CROSSOVER_DEFAULT;
	}
	return (size_t)v;
}

/* a number in the environment, @def when unset or not a number (said once) */
static size_t coll_env_size(const char *name, size_t def)
{
	const char *s = getenv(name);
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || end == s) {
		ferry_warn("coll: %s=%s is not a number; using %zu", name, s, def);
		return def;
	}
	return (size_t)v;
}

unsigned long long ferry__coll_polled(const struct ferry *fy)
{
	struct ferry_colls *world = fy->coll;
	unsigned long long n = atomic_load(&world->polled);

	pthread_mutex_lock(&world->glock);
	for (struct ferry_colls *g = world->groups; g; g = g->next)
		n += atomic_load(&g->polled);
	pthread_mutex_unlock(&world->glock);
	return n;
}

int ferry__coll_attach(struct ferry *fy)
{
	struct ferry_colls *cs = calloc(1, sizeof(*cs));
	int rc;

	if (!cs)
		return -ENOMEM;
	ferry__coll_colls_init(cs, fy);
	pthread_mutex_init(&cs->glock, NULL);
	cs->algo = coll_env_algo();
	cs->crossover = coll_env_crossover();
	cs->zcopy = coll_env_size("FERRY_COLL_ZCOPY", 1) != 0;
	cs->zcopy_min = coll_env_size("FERRY_COLL_ZCOPY_MIN", FERRY_COLL_ZCOPY_MIN_DEFAULT);
	atomic_store(&cs->imm, coll_env_size("FERRY_COLL_IMM", 1) != 0);
	fy->coll = cs;
	fy->coll_free = coll_colls_free;
	rc = ferry__dispatch_register(fy, FERRY_MSG_COLL, FERRY_DISPATCH_NODE, coll_on_msg);
	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_COLL_ACK, FERRY_DISPATCH_NODE,
					      coll_on_msg);
	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_COLL_KICK, FERRY_DISPATCH_NODE,
					      coll_on_msg);
	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_COLL_KEYS, FERRY_DISPATCH_NODE,
					      coll_on_msg);
	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_COLL_PUT, FERRY_DISPATCH_NODE,
					      coll_on_msg);
	if (!rc)
		rc = ferry__dispatch_register_imm(fy, FERRY_TP_IMM_USER_COLL, coll_on_write_imm);
	return rc ? rc : ferry__node_on_peer_failed(fy, coll_on_peer_failed);
}

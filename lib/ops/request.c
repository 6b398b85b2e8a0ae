/* SPDX-License-Identifier: MIT */
/*
 * request.c - the public key operations (pull, push, set and their _start
 * forms, wait, test): the fast path for keys live here, then a request
 * (ticket) whose remote keys go as OP frames or one-sided reads; holding a
 * request behind an earlier one on the same key; bounded waiting.
 *
 *   worker thread                          progress threads
 *   -------------                          ----------------
 *   key live here? (own[] under RCU) --yes-> seqlock read / locked update,
 *        | no                                 in the calling thread, no message
 *        v
 *   group by location hint, one OP frame per destination
 *        ...................................> owner: apply, REPLY to origin
 *                                             not owner: queue if the key is
 *                                             on its way here, else forward
 *                                             (to the home; the home to the
 *                                             owner it recorded)
 *   wait: spin, then sleep on the worker's <- REPLY: copy values, count down
 *   condvar (bounded by the node timeout)      under worker.lock
 *
 * Operations of one worker on one key take effect in the order started: a
 * request that touches a key on which the same worker still has a remote
 * operation in flight is held back until that one completes.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "lib/ops/internal.h"
#include "lib/ops/repl.h"
#include "transport/base/cpu.h"

static int ops_check(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		     const void *vals, int need_vals, const char *what)
{
	if (!w || !t) {
		ferry_err("%s: NULL worker or table", what);
		return -EINVAL;
	}
	if (atomic_load_explicit(&w->fy->closed, memory_order_relaxed))
		return -FERRY_E_CLOSED;
	if (t->fy != w->fy) {
		ferry_err("%s: the table belongs to another node than the worker", what);
		return -EINVAL;
	}
	if (n && (!keys || (need_vals && !vals))) {
		ferry_err("%s: NULL %s buffer for %zu keys", what, keys ? "value" : "key", n);
		return -EINVAL;
	}
	if (n > (1u << 26)) {
		ferry_err("%s: %zu keys in one call; the limit is 2^26", what, n);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		if (!ferry__key_ok(t, keys[i])) {
			ferry_err("%s: key %llu is out of range (table %u has %llu keys)", what,
				  (unsigned long long)keys[i], t->id,
				  (unsigned long long)t->params.num_keys);
			return -ERANGE;
		}
	return 0;
}

/* send the keys of @r that are not done yet, one frame per destination */
static void ops_send_remote(struct ferry_worker *w, struct ferry_req *r, uint64_t ticket)
{
	struct ferry *fy = w->fy;
	struct ferry_table *t = r->t;
	struct ferry_msg_op tmpl = {
		.origin = fy->rank, .worker = w->id, .req = ticket, .op = r->op, .flags = r->flags
	};
	struct ops_out one = { .used = 0 }, *outs = &one;
	struct ferry_rd *reads[OPS_RD_POOL];
	/* small pulls go one-sided; a big batch is one message per owner, one
	 * round trip for all, where N reads cost N (until doorbell batching) */
	bool onesided = r->op == FERRY_OP_PULL && r->n <= OPS_RD_BATCH && ferry__table_onesided(t);
	uint32_t first_dst = UINT32_MAX;
	size_t off = 0, nremote = 0, nreads = 0;

	for (size_t i = 0; i < r->n; i++) {
		uint64_t key = r->keys[i];
		uint32_t len = ferry__value_len(t, key);
		struct ferry_msg_key k = { .key = key, .idx = (uint32_t)i, .len = len };
		uint32_t dst;
		const float *in = r->op == FERRY_OP_PULL ? NULL : r->in + off;

		off += len;
		if (r->done[i / 8] & (1u << (i % 8)))
			continue;
		if (onesided && nreads < OPS_RD_POOL &&
		    (reads[nreads] = ferry__ops_rd_prepare(w, r, ticket, i))) {
			ferry__ops_req_dst(r, reads[nreads]->owner);
			nreads++;
			nremote++;
			if (r->tracked && !ferry__ops_inflight_add(w, key))
				r->done[(r->n + 7) / 8 + i / 8] |= (uint8_t)(1u << (i % 8));
			continue;
		}
		dst = ferry__loc_get(t, key);
		if (dst >= fy->world)
			dst = ferry__home(t, key);
		if (first_dst == UINT32_MAX) {
			first_dst = dst;
		} else if (dst != first_dst && outs == &one) {
			/* more than one destination: one builder per rank */
			outs = calloc(fy->world, sizeof(*outs));
			if (!outs) {
				outs = &one;
				dst = first_dst; /* correct, only slower: it is forwarded */
			} else {
				outs[first_dst] = one;
			}
		}
		ferry__ops_req_dst(r, dst);
		ferry__ops_out_add(fy, t, outs == &one ? &one : &outs[dst], &tmpl, dst, &k, in);
		nremote++;
		if (r->tracked && !ferry__ops_inflight_add(w, key))
			r->done[(r->n + 7) / 8 + i / 8] |= (uint8_t)(1u << (i % 8));
	}
	ferry__ops_count(&w->remote_ops, nremote);
	/* completions may start now: the loop above no longer reads r->done */
	ferry__ops_rd_post_all(fy, reads, nreads);
	/* before the send: the reply may come before this thread returns */
	if (r->op != FERRY_OP_PULL && ferry__tl_of(fy))
		for (size_t i = 0; i < r->n; i++)
			ferry__tl_stamp(fy, FERRY_TL_PUSH_POST, r->keys[i]);
	if (outs == &one) {
		ferry__ops_out_flush(fy, t, &one);
		return;
	}
	for (uint32_t d = 0; d < fy->world; d++)
		ferry__ops_out_flush(fy, t, &outs[d]);
	free(outs);
}

/* serve local keys in place, send the rest */
static void ops_dispatch(struct ferry_worker *w, struct ferry_req *r)
{
	struct ferry_table *t = r->t;
	uint64_t ticket = r->ticket;
	size_t off = 0, nlocal = 0;
	int all_local = 1;

	r->held = false;
	if (t->repl)
		r->take_seen = atomic_load_explicit(&t->repl->takeovers, memory_order_acquire);
	if (r->start) {
		/* a request kind of a module above (localize): it sends */
		r->start(w, t, r, ticket);
		return;
	}
	/* with replicas an update goes through the progress thread, which
	 * sends its copy to the backup before anyone is told it is done */
	if (!t->params.no_local_fast_path && !(t->params.replicas && r->op != FERRY_OP_PULL)) {
		urcu_memb_read_lock();
		for (size_t i = 0; i < r->n; i++) {
			uint64_t key = r->keys[i];
			uint32_t len = ferry__value_len(t, key);
			int rc;

			if (r->done[i / 8] & (1u << (i % 8))) {
				off += len;
				continue;
			}
			rc = ferry__ops_apply(t, r->op, key, r->in ? r->in + off : NULL,
					      r->out ? r->out + off : NULL);
			off += len;
			if (rc) {
				all_local = 0;
				continue;
			}
			r->done[i / 8] |= (uint8_t)(1u << (i % 8));
			nlocal++;
		}
		urcu_memb_read_unlock();
		ferry__ops_count(&w->local_ops, nlocal);
		/* nothing remote yet: the progress thread cannot race on r */
		__atomic_store_n(&r->remaining, r->remaining - nlocal, __ATOMIC_RELEASE);
		if (all_local)
			return;
	}
	ops_send_remote(w, r, ticket);
}

/* collect finished tracked requests' keys, then release held ones in order */
static void ops_progress(struct ferry_worker *w)
{
	while (w->held_head) {
		struct ferry_req *r = w->held_head;
		int blocked = 0;

		for (size_t i = 0; i < r->n && !blocked; i++)
			blocked = ferry__ops_inflight_has(w, r->keys[i]);
		if (blocked) {
			/* an earlier request still runs: release what has finished */
			int released = 0;

			for (uint32_t i = 0; i < FERRY_MAX_INFLIGHT; i++) {
				struct ferry_req *q = &w->reqs[i];

				if (q->ticket && q->tracked &&
				    !__atomic_load_n(&q->remaining, __ATOMIC_ACQUIRE)) {
					ferry__ops_untrack(w, q);
					released = 1;
				}
			}
			if (!released)
				return;
			continue;
		}
		w->held_head = r->next_held;
		if (!w->held_head)
			w->held_tail = NULL;
		ops_dispatch(w, r);
	}
}

static int ops_start(struct ferry_worker *w, struct ferry_table *t, uint8_t op,
		     const uint64_t *keys, size_t n, const float *in, float *out, int async,
		     uint64_t *ticket_p, size_t ndone, ferry_req_start_fn start)
{
	static const char *const names[] = {
		[FERRY_OP_PULL] = "pull", [FERRY_OP_PUSH] = "push", [FERRY_OP_SET] = "set"
	};
	const char *what = op == FERRY_REQ_LOCALIZE ? "localize" : names[op];
	struct ferry_req *r;
	uint32_t idx;
	int rc, hold = 0;

	if (!ndone) {
		rc = ops_check(w, t, keys, n,
			       op == FERRY_OP_PULL ? (const void *)out : (const void *)in,
			       op != FERRY_REQ_LOCALIZE, what);
		if (rc)
			return rc;
	}
	if (!ticket_p && async)
		return -EINVAL;
	if (!w->nfree) {
		ferry_err("%s: worker %u has %d operations in flight, the limit; wait for some",
			  what, w->id, FERRY_MAX_INFLIGHT);
		return -EBUSY;
	}
	idx = w->free_idx[--w->nfree];
	r = &w->reqs[idx];
	memset(r, 0, sizeof(*r));
	/* done bits, then remote bits (keys sent away, for the in-flight set) */
	r->done = calloc(2 * ((n + 7) / 8) + 1, 1);
	if (!r->done) {
		w->free_idx[w->nfree++] = idx;
		return -ENOMEM;
	}
	r->op = op;
	r->flags = op == FERRY_OP_PUSH ? w->op_flags : 0;
	r->start = start;
	r->fail_seen = atomic_load_explicit(&w->fy->failures, memory_order_acquire);
	r->t = t;
	r->keys = keys;
	r->n = n;
	r->in = in;
	r->out = out;
	/* the fast path already served the first ndone keys */
	for (size_t i = 0; i < ndone; i++)
		r->done[i / 8] |= (uint8_t)(1u << (i % 8));
	r->remaining = n - ndone;
	if (op == FERRY_REQ_LOCALIZE && t->params.mode == FERRY_MODE_CLASSIC)
		r->remaining = 0; /* static placement: nothing moves */
	if (++w->gen == 0)
		w->gen = 1;
	pthread_mutex_lock(&w->lock);
	r->ticket = (uint64_t)w->gen << 32 | idx;
	pthread_mutex_unlock(&w->lock);

	if (r->remaining) {
		if (w->held_head) {
			hold = 1;
		} else if (w->inflight_n) {
			ops_progress(w);
			for (size_t i = 0; i < n && !hold; i++)
				hold = ferry__ops_inflight_has(w, keys[i]);
		}
		/* only asynchronous requests can be overtaken by a later one */
		r->tracked = async && op != FERRY_REQ_LOCALIZE;
		if (hold) {
			r->held = true;
			if (w->held_tail)
				w->held_tail->next_held = r;
			else
				w->held_head = r;
			w->held_tail = r;
		} else {
			ops_dispatch(w, r);
		}
	}
	if (ticket_p)
		*ticket_p = r->ticket;
	return (int)idx;
}

/* a rank @r sent to that has failed since, or world */
static uint32_t ops_req_dead_dst(struct ferry_worker *w, struct ferry_req *r)
{
	struct ferry *fy = w->fy;
	uint32_t dead = fy->world;

	r->fail_seen = atomic_load_explicit(&fy->failures, memory_order_acquire);
	for (uint8_t i = 0; i < r->ndsts; i++)
		if (atomic_load_explicit(&fy->failed[r->dsts[i]], memory_order_relaxed))
			return r->dsts[i];
	/* where nodes on the way sent its keys on (lib/ops/serve.c, OP_FWD) */
	pthread_mutex_lock(&w->lock);
	for (uint8_t i = 0; i < r->nfwds && dead == fy->world; i++)
		if (atomic_load_explicit(&fy->failed[r->fwds[i]], memory_order_relaxed))
			dead = r->fwds[i];
	if (r->fwds_many)
		/* more than it keeps: any failure may be one of them */
		for (uint32_t x = 0; x < fy->world && dead == fy->world; x++)
			if (x != fy->rank &&
			    atomic_load_explicit(&fy->failed[x], memory_order_relaxed))
				dead = x;
	pthread_mutex_unlock(&w->lock);
	return dead;
}

/* wait for a request; collect it. @block 0: poll once (-EAGAIN) */
static int ops_wait_req(struct ferry_worker *w, struct ferry_req *r, int block)
{
	struct ferry *fy = w->fy;
	/* a one-sided read takes a few µs on hardware and tens under rxe: spin
	 * longer for it, since this thread completes it (ferry__node_poll) */
	int64_t spin = fy->busy_poll ? INT64_MAX / 2 : ferry__table_onesided(r->t) ? 200000 : 50000;
	int64_t deadline = 0, spin_until = 0;
	bool failed_now;
	int rc = 0;

	if (!r->held && !__atomic_load_n(&r->remaining, __ATOMIC_ACQUIRE) && !w->held_head)
		goto collect; /* served in place: no clock needed */

	for (unsigned iter = 0;; iter++) {
		/* take our reads' completions here, not through the progress thread */
		ferry__node_poll(fy, 0);
		if (w->held_head)
			ops_progress(w);
		if (!r->held && !__atomic_load_n(&r->remaining, __ATOMIC_ACQUIRE))
			break;
		if (atomic_load_explicit(&fy->closed, memory_order_relaxed)) {
			rc = -FERRY_E_CLOSED;
			break;
		}
		if (r->t->repl && (rc = ferry__fenced_check(fy, ferry__ops_name(r->op))))
			break;
		if (!r->held &&
		    ((failed_now = atomic_load_explicit(&fy->failures, memory_order_relaxed) !=
				   r->fail_seen) ||
		     (atomic_load_explicit(&r->fwds_new, memory_order_relaxed) &&
		      atomic_exchange_explicit(&r->fwds_new, false, memory_order_acquire)))) {
			uint32_t dead = ops_req_dead_dst(w, r);

			if (dead < fy->world) {
				ferry_err(
					"%s of %zu keys on table %u: rank %u failed while the call "
					"waited on it; %s",
					ferry__ops_name(r->op), r->n, r->t->id, dead,
					r->t->params.replicas ?
						"its keys fail over to their backups: try again" :
						"the keys it held are unreachable until it is back");
				rc = -FERRY_E_PEER;
				break;
			}
			if (failed_now && r->t->params.replicas && r->op != FERRY_REQ_LOCALIZE) {
				/*
				 * replicas: a node that forwarded the keys may have
				 * sent them through the failed one, and nothing
				 * would answer; the keys fail over, so the call
				 * fails now (-FERRY_E_PEER: it may or may not have
				 * been applied) and a retry finds the new owner
				 */
				for (dead = 0; dead < fy->world; dead++)
					if (atomic_load_explicit(&fy->failed[dead],
								 memory_order_relaxed))
						break;
				ferry_warn("%s of %zu keys on table %u: rank %u failed while "
					   "the call waited; it may have passed through it, "
					   "so it fails: try again",
					   ferry__ops_name(r->op), r->n, r->t->id, dead);
				rc = -FERRY_E_PEER;
				break;
			}
		}
		if (!r->held && r->t->repl && r->op != FERRY_REQ_LOCALIZE &&
		    atomic_load_explicit(&r->t->repl->takeovers, memory_order_acquire) !=
			    r->take_seen) {
			/*
			 * A takeover ended here after the request went: every
			 * live node has echoed the failure, so any node that
			 * forwarded the request toward the dead rank before it
			 * knew (a queue that was then dropped) knows now, and
			 * nothing will answer such a request. It fails (it may
			 * or may not have been applied) and a retry finds the
			 * key's new owner (docs/faults.md, "A push forwarded
			 * toward a dying node").
			 */
			ferry_warn("%s of %zu keys on table %u: the keys of a failed rank were "
				   "taken over while the call waited; it may have been forwarded "
				   "to that rank, so it fails: try again",
				   ferry__ops_name(r->op), r->n, r->t->id);
			rc = -FERRY_E_PEER;
			break;
		}
		if (!block)
			return -EAGAIN;
		/*
		 * The clock is read only once the wait has lasted 64 rounds, and
		 * then every 64: a short wait reads it never. (In a VM whose
		 * clock source is an emulated HPET each read is a system call and
		 * a device access, microseconds under emulation.) The deadline
		 * counts from the first read: later by 63 rounds, a few µs.
		 */
		if ((iter & 63) == 63) {
			int64_t now = ferry__ops_now_ns();

			if (!deadline) {
				deadline = now + (int64_t)fy->timeout_ms * 1000000;
				spin_until = now + spin;
			}
			if (now >= deadline) {
				rc = -ETIMEDOUT;
				break;
			}
			if (now >= spin_until && !r->held) {
				int64_t until = now + 1000000; /* re-check every ms */
				struct timespec ts;

				/* the progress thread takes our completions while we sleep */
				ferry__node_poll(fy, FERRY_TP_POLL_LAST);

				if (until > deadline)
					until = deadline;
				ts.tv_sec = until / 1000000000;
				ts.tv_nsec = until % 1000000000;
				pthread_mutex_lock(&w->lock);
				w->sleeping = 1;
				if (r->remaining)
					pthread_cond_timedwait(&w->cond, &w->lock, &ts);
				w->sleeping = 0;
				pthread_mutex_unlock(&w->lock);
				continue;
			}
		}
		/* on a machine with few cores the progress threads need the CPU we
		 * would burn: spin briefly, then yield while still polling */
		if (iter < FERRY_SPIN_RELAX)
			ferry__cpu_relax();
		else
			sched_yield();
	}
	if (rc == -ETIMEDOUT || rc == -FERRY_E_PEER) {
		uint64_t key = 0;

		for (size_t i = 0; i < r->n; i++)
			if (!(r->done[i / 8] & (1u << (i % 8)))) {
				key = r->keys[i];
				break;
			}
		if (rc == -ETIMEDOUT)
			ferry_err(
				"%s of %zu keys on table %u timed out after %d ms; key %llu (home "
				"rank %u) never answered; check that every node is alive",
				ferry__ops_name(r->op), r->n, r->t->id, fy->timeout_ms,
				(unsigned long long)key, ferry__home(r->t, key));
		if (r->held) {
			/* take it out of the held queue */
			struct ferry_req **pp = &w->held_head, *prev = NULL;

			while (*pp && *pp != r) {
				prev = *pp;
				pp = &(*pp)->next_held;
			}
			if (*pp)
				*pp = r->next_held;
			if (w->held_tail == r)
				w->held_tail = prev;
		}
	} else if (!rc) {
collect:
		pthread_mutex_lock(&w->lock);
		rc = r->status;
		pthread_mutex_unlock(&w->lock);
	}
	ferry__ops_req_free(w, r);
	return rc;
}

/*
 * The fast path looks a key's slot up OPS_AHEAD keys before it uses it and
 * starts loading the slot, and starts loading the directory's bucket of
 * the key 2 x OPS_AHEAD ahead (batches of more than OPS_AHEAD keys): in a
 * batch of keys spread over memory (an SGD step's row and columns) the two
 * dependent cache misses of each key (bucket, then slot) overlap with the
 * work on the keys before it. The slot found early comes from the
 * directory alone (ferry__dir_own_hint()) and is checked in the slot when
 * it is used, as any slot pointer the fast path holds (below): a key that
 * moved meanwhile, or a slot of another key, goes the slow way.
 */
#define OPS_AHEAD 4

static inline struct ferry_slot *ops_fast_ahead(const struct ferry_table *t, uint64_t key,
						uint8_t op)
{
	struct ferry_slot *s;

	if (!ferry__key_ok(t, key))
		return NULL;
	/* no slot read here: the slot is checked when it is used */
	s = ferry__dir_own_hint(&t->dir, key);
	if (s && op == FERRY_OP_PULL) {
		__builtin_prefetch(s, 0);
		__builtin_prefetch((const char *)s + 64, 0);
	} else if (s) {
		__builtin_prefetch(s, 1);
		__builtin_prefetch((const char *)s + 64, 1);
	}
	return s;
}

/* serve @key from its slot @s at *@off of @in / @out: false when it goes the
 * slow way (no slot, or the slot is no longer the key's live copy) */
static inline bool ops_fast_one(struct ferry_table *t, struct ferry_slot *s, uint64_t key,
				uint8_t op, const float *in, float *out, size_t *off)
{
	uint32_t len = ferry__value_len(t, key);

	if (!s)
		return false;
	if (op == FERRY_OP_PULL) {
		if (ferry__slot_read(s, key, out + *off, len))
			return false;
	} else if (ferry__slot_update(&t->arena, s, key, in + *off, len, op == FERRY_OP_PUSH)) {
		return false;
	}
	*off += len;
	return true;
}

/* ops_fast() for a batch of more than OPS_AHEAD keys: the look-ahead above */
static size_t ops_fast_batch(const struct ferry_worker *w, struct ferry_table *t, uint8_t op,
			     const uint64_t *keys, size_t n, const float *in, float *out)
{
	/* the slots of keys [i, i + OPS_AHEAD), looked up ahead of use */
	struct ferry_slot *ahead[OPS_AHEAD];
	size_t i, off = 0;

	for (i = 0; i < 2 * OPS_AHEAD && i < n; i++)
		ferry__dir_own_prefetch(&t->dir, keys[i]);
	for (i = 0; i < OPS_AHEAD; i++)
		ahead[i] = ops_fast_ahead(t, keys[i], op);
	for (i = 0; i < n; i++) {
		uint64_t key = keys[i];
		struct ferry_slot *s = ahead[i % OPS_AHEAD];

		if (!ferry__key_ok(t, key) || (w->inflight_n && ferry__ops_inflight_has(w, key)))
			break; /* the request path reports it, or holds it */
		if (i + OPS_AHEAD < n)
			ahead[i % OPS_AHEAD] = ops_fast_ahead(t, keys[i + OPS_AHEAD], op);
		if (i + 2 * OPS_AHEAD < n)
			ferry__dir_own_prefetch(&t->dir, keys[i + 2 * OPS_AHEAD]);
		if (!ops_fast_one(t, s, key, op, in, out, &off))
			break;
	}
	return i;
}

/*
 * The fast path of a synchronous operation: serve keys that live here in
 * place, with no request, ticket or allocation, for as long as they do.
 *
 * One fast-path section (lib/dir/fastrd.h: no call into liburcu) covers
 * the whole batch: the directory's array may be rebuilt, and the old one is
 * freed only after every section open at that time ended. The slots
 * need none, for the reason a one-sided reader needs none: a slot's memory
 * lives as long as the table's arena, and every access is validated inside
 * the slot. A reader with a stale slot pointer finds the slot MOVED (the
 * value left), FREE, or holding another key, and goes the slow way; if the
 * slot was reused for the same key, it is that key's live copy. State LIVE
 * is stored after the value when a key arrives, and MOVED under the write
 * lock before it leaves.
 *
 * Return: how many leading keys were served; the caller hands the rest to
 * the request path. Context: the worker's thread.
 */
static size_t ops_fast(struct ferry_worker *w, struct ferry_table *t, uint8_t op,
		       const uint64_t *keys, size_t n, const float *in, float *out)
{
	struct ferry_fastrd_cell *cell;
	size_t i, off = 0;

	/* held requests go first (they wait for keys in flight, and a key of
	 * theirs must not be overtaken); a key of this worker's in flight is
	 * left to the request path, which holds it (the loops below) */
	if (t->params.no_local_fast_path || (t->params.replicas && op != FERRY_OP_PULL) ||
	    w->held_head || (op == FERRY_OP_PULL ? !out : !in))
		return 0;
	cell = &t->fy->fastrd->cell[w->id];
	ferry__fastrd_enter(cell);
	if (n > OPS_AHEAD) {
		i = ops_fast_batch(w, t, op, keys, n, in, out);
	} else {
		/* a few keys: nothing to overlap, and a single key's pull stays a
		 * lookup and a seqlock read */
		for (i = 0; i < n; i++) {
			uint64_t key = keys[i];

			if (!ferry__key_ok(t, key) ||
			    (w->inflight_n && ferry__ops_inflight_has(w, key)))
				break; /* the request path reports it, or holds it */
			if (!ops_fast_one(t, ferry__own(t, key), key, op, in, out, &off))
				break;
		}
	}
	ferry__fastrd_leave(cell);
	ferry__ops_count(&w->local_ops, i);
	return i;
}

int ferry__ops_sync(struct ferry_worker *w, struct ferry_table *t, uint8_t op, const uint64_t *keys,
		    size_t n, const float *in, float *out, ferry_req_start_fn start)
{
	size_t done;
	int idx;

	if (t && t->repl && ferry__fenced_check(t->fy, ferry__ops_name(op)))
		return -FERRY_E_PEER;
	done = 0;
	if ((op == FERRY_OP_PUSH || op == FERRY_OP_SET) && t && keys) {
		/* a batch is checked whole before any of it is applied: the fast
		 * path would apply the keys before a bad one */
		for (size_t i = 0; i < n; i++)
			if (!ferry__key_ok(t, keys[i]))
				return ops_check(w, t, keys, n, in, 1, ferry__ops_name(op));
	}
	if (op != FERRY_REQ_LOCALIZE && w && t && keys && t->fy == w->fy &&
	    !atomic_load_explicit(&w->fy->closed, memory_order_relaxed))
		done = ops_fast(w, t, op, keys, n, in, out);
	if (done == n)
		return 0;
	if (done) {
		/* check the rest as the request path would have checked all */
		int rc = ops_check(w, t, keys + done, n - done,
				   op == FERRY_OP_PULL ? (const void *)out : (const void *)in, 1,
				   ferry__ops_name(op));

		if (rc)
			return rc;
	}
	idx = ops_start(w, t, op, keys, n, in, out, 0, NULL, done, start);

	if (idx < 0)
		return idx;
	return ops_wait_req(w, &w->reqs[idx], 1);
}

int ferry__ops_async(struct ferry_worker *w, struct ferry_table *t, uint8_t op,
		     const uint64_t *keys, size_t n, const float *in, float *out,
		     ferry_req_start_fn start, uint64_t *ticket_p)
{
	uint64_t ticket;
	int idx;

	if (!ticket_p) {
		ferry_err("%s_start: NULL ticket pointer", ferry__ops_name(op));
		return -EINVAL;
	}
	if (t && t->repl && ferry__fenced_check(t->fy, ferry__ops_name(op)))
		return -FERRY_E_PEER;
	if (t && t->params.push_codec && op == FERRY_OP_PUSH) {
		/* the residuals change only once a push is known to be done */
		ferry_err("push_start: table %u compresses its pushes (push_codec); use "
			  "ferry_push",
			  t->id);
		return -EOPNOTSUPP;
	}
	if (t && t->cons_hooks && op != FERRY_REQ_LOCALIZE) {
		/* lib/cons/ buffers and caches per node; a ticket would promise
		 * an order and a completion it does not keep */
		ferry_err("%s_start: table %u has %s; use ferry_%s (it does not wait for the "
			  "owner there)",
			  ferry__ops_name(op), t->id,
			  t->hot ? "hot keys" : "a consistency model other than SEQUENTIAL",
			  ferry__ops_name(op));
		return -EOPNOTSUPP;
	}
	idx = ops_start(w, t, op, keys, n, in, out, 1, &ticket, 0, start);
	if (idx < 0)
		return idx;
	*ticket_p = ticket;
	return 0;
}

int ferry_pull(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
	       float *vals)
{
	if (t && t->cons_hooks)
		return t->cons_hooks->pull(w, t, keys, n, vals);
	return ferry__ops_sync(w, t, FERRY_OP_PULL, keys, n, NULL, vals, NULL);
}

int ferry_push(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
	       const float *deltas)
{
	if (t && t->cons_hooks)
		return t->cons_hooks->push(w, t, keys, n, deltas);
	if (t && t->codec_push)
		return t->codec_push(w, t, keys, n, deltas);
	return ferry__ops_sync(w, t, FERRY_OP_PUSH, keys, n, deltas, NULL, NULL);
}

int ferry_set(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
	      const float *vals)
{
	if (t && t->cons_hooks)
		return t->cons_hooks->set(w, t, keys, n, vals);
	return ferry__ops_sync(w, t, FERRY_OP_SET, keys, n, vals, NULL, NULL);
}

int ferry_pull_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		     float *vals, uint64_t *ticket_p)
{
	return ferry__ops_async(w, t, FERRY_OP_PULL, keys, n, NULL, vals, NULL, ticket_p);
}

int ferry_push_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		     const float *deltas, uint64_t *ticket_p)
{
	return ferry__ops_async(w, t, FERRY_OP_PUSH, keys, n, deltas, NULL, NULL, ticket_p);
}

int ferry_set_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys, size_t n,
		    const float *vals, uint64_t *ticket_p)
{
	return ferry__ops_async(w, t, FERRY_OP_SET, keys, n, vals, NULL, NULL, ticket_p);
}

static int ops_ticket(struct ferry_worker *w, uint64_t ticket, int block)
{
	struct ferry_req *r;

	if (!w)
		return -EINVAL;
	r = ferry__ops_req_find(w, ticket);
	if (!r) {
		ferry_err("wait: ticket %#llx is unknown to worker %u or already collected",
			  (unsigned long long)ticket, w->id);
		return -ENOENT;
	}
	return ops_wait_req(w, r, block);
}

int ferry_wait(struct ferry_worker *w, uint64_t ticket)
{
	return ops_ticket(w, ticket, 1);
}

int ferry_test(struct ferry_worker *w, uint64_t ticket)
{
	return ops_ticket(w, ticket, 0);
}

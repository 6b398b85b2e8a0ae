/* SPDX-License-Identifier: MIT */
/*
 * reap.c - the reaper: a thread of each transport instance that destroys
 * the queue pairs and cm_ids the progress thread is done with.
 *
 * rdma_destroy_qp() and rdma_destroy_id() wait in the kernel (for the
 * device's tasks, for the CM's exchange with the other end): in the TCG
 * guest one took up to 539 ms, and while it ran on the progress thread
 * nothing was delivered, no credit returned and no timer looked at. The
 * progress thread now only cuts a connection loose, and the reaper
 * destroys it:
 *
 *     progress thread: ferry__rdma_conn_destroy(c)      reaper thread
 *     unlink c from its peer (gen++), dial, conns
 *     its queue pair to the error state: it places
 *       and reads no more bytes of our buffers
 *     id->context = NULL: the dispatcher drops the
 *       events that still come for it
 *     queue c  --------------------------------------> rdma_destroy_qp(c->id)
 *                                                       rdma_destroy_id(c->id)
 *                                                       free(c)
 *
 * Nothing names c once it is queued: work requests name a rank and a
 * generation, never a queue pair or a connection (a completion of the old
 * queue pair is dropped for its generation, cq.c); the peer's pointer to the
 * queue pair was cleared under its lock, so no sender posts on it; and a
 * cm event read for its id is acked before rdma_destroy_id() returns
 * (librdmacm waits for it), its context read before the ack (cm.c). The
 * CQs, the PD and the event channel outlive every queue pair and cm_id:
 * fini() stops the reaper, which first empties its queue, before it
 * destroys them.
 *
 * Opt-in for now: FERRY_RDMA_REAPER=1 starts the reaper. Without it every
 * destroy runs on the progress thread, as before: in one guest boot
 * test_reconnect passed 1 of 3 runs with the reaper and 3 of 3 without
 * (docs/rdma.md, "The reaper"; no mechanism found), and the progress
 * thread's turns on cm events did not get shorter.
 *
 * Bound: RDMA_REAP_MAX connections wait at most. Past it (a flood of
 * connection requests faster than the kernel destroys them), the progress
 * thread destroys the connection itself, as it did before the reaper, and
 * says so at debug level.
 *
 * Context: ferry__rdma_reap() on the progress thread, or in fini() after it
 * stopped; ferry__rdma_reaper_start() in init(); ferry__rdma_reaper_stop() in
 * fini(), after the progress thread stopped and every connection was handed
 * over.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "transport/rdma/rdma.h"

/* RDMA_TIMED's log line: @what for @rank began at @t0 (rdma_now_ms); errno is kept */
void ferry__rdma_slow_note(const struct rdma_tp *t, uint32_t rank, const char *what, int64_t t0)
{
	int err = errno; /* the call's, for its caller's message */
	int64_t took = rdma_now_ms() - t0;

	if (took >= RDMA_SLOW_CALL_MS)
		ferry_dbg("rdma: rank %u: %s for rank %u took %lld ms", t->base.cfg.rank, what,
			  rank, (long long)took);
	errno = err;
}

/* destroy @c's queue pair and cm_id and free it; logs a slow call at debug level */
static void rdma_conn_free(struct rdma_tp *t, struct rdma_conn *c, const char *where)
{
	int64_t t0 = rdma_now_ms(), took;

	if (c->id) {
		if (c->id->qp)
			rdma_destroy_qp(c->id);
		rdma_destroy_id(c->id);
	}
	took = rdma_now_ms() - t0;
	if (took >= RDMA_SLOW_CALL_MS)
		ferry_dbg("rdma: rank %u: destroying a connection of rank %u (%s) took %lld ms %s",
			  t->base.cfg.rank, c->rank, ferry__rdma_conn_state_str(c), (long long)took,
			  where);
	free(c);
}

static void *rdma_reaper_main(void *arg)
{
	struct rdma_tp *t = arg;

	pthread_mutex_lock(&t->reap_lock);
	for (;;) {
		struct rdma_conn *c = t->reap_head;

		if (!c) {
			if (t->reap_stop)
				break;
			pthread_cond_wait(&t->reap_cond, &t->reap_lock);
			continue;
		}
		t->reap_head = c->next;
		pthread_mutex_unlock(&t->reap_lock);
		rdma_conn_free(t, c, "on the reaper");
		pthread_mutex_lock(&t->reap_lock);
		t->reap_n--;
		t->reaped++;
	}
	pthread_mutex_unlock(&t->reap_lock);
	return NULL;
}

/*
 * ferry__rdma_reaper_start - start the reaper thread. Context: init(), before
 * the progress thread. Return: 0 or a negative errno (logged).
 */
int ferry__rdma_reaper_start(struct rdma_tp *t)
{
	const char *on = getenv("FERRY_RDMA_REAPER");
	sigset_t all, old;
	int ret;

	if (!on || strcmp(on, "1")) {
		/* off by default until guest runs show it costs no test
		 * (docs/rdma.md, "The reaper"): every destroy on the progress
		 * thread, as before it */
		ferry_info("rdma: rank %u: queue pairs and cm_ids are destroyed on the progress "
			   "thread (FERRY_RDMA_REAPER=1 moves them to a reaper thread)",
			   t->base.cfg.rank);
		return 0;
	}

	pthread_mutex_init(&t->reap_lock, NULL);
	pthread_cond_init(&t->reap_cond, NULL);
	t->reap_head = t->reap_tail = NULL;
	t->reap_n = 0;
	t->reap_stop = 0;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = -pthread_create(&t->reap_thread, NULL, rdma_reaper_main, t);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret) {
		ferry_err("rdma: cannot start the reaper thread: %s", strerror(-ret));
		pthread_cond_destroy(&t->reap_cond);
		pthread_mutex_destroy(&t->reap_lock);
		return ret;
	}
	pthread_setname_np(t->reap_thread, "ferry-rdma-reap");
	t->reap_started = 1;
	return 0;
}

/*
 * ferry__rdma_reaper_stop - destroy what is queued, then stop the thread.
 * Context: fini(), after the progress thread stopped and every connection was
 * handed to ferry__rdma_reap(); before the CQs, PD and event channel go.
 */
void ferry__rdma_reaper_stop(struct rdma_tp *t)
{
	if (!t->reap_started)
		return;
	pthread_mutex_lock(&t->reap_lock);
	t->reap_stop = 1;
	pthread_cond_signal(&t->reap_cond);
	pthread_mutex_unlock(&t->reap_lock);
	pthread_join(t->reap_thread, NULL);
	t->reap_started = 0;
	pthread_cond_destroy(&t->reap_cond);
	pthread_mutex_destroy(&t->reap_lock);
}

/*
 * ferry__rdma_reap - destroy connection @c, unlinked from everything, off the
 * progress thread
 *
 * Its queue pair goes to the error state here (a cheap call), so that it
 * places nothing more into the peer's receive buffers, which a newer queue
 * pair may use already; its cm_id stops naming it. The reaper destroys the
 * rest; with RDMA_REAP_MAX waiting, or no reaper, it is destroyed here.
 * Context: progress thread, or fini() after it stopped.
 */
void ferry__rdma_reap(struct rdma_tp *t, struct rdma_conn *c)
{
	if (c->id) {
		c->id->context = NULL;
		if (c->id->qp) {
			struct ibv_qp_attr qa = { .qp_state = IBV_QPS_ERR };

			RDMA_TIMED(t, c->rank, "moving a queue pair to the error state",
				   ibv_modify_qp(c->id->qp, &qa, IBV_QP_STATE));
		}
	}
	if (t->reap_started) {
		pthread_mutex_lock(&t->reap_lock);
		if (t->reap_n < RDMA_REAP_MAX && !t->reap_stop) {
			c->next = NULL;
			if (t->reap_head)
				t->reap_tail->next = c;
			else
				t->reap_head = c;
			t->reap_tail = c;
			t->reap_n++;
			pthread_cond_signal(&t->reap_cond);
			pthread_mutex_unlock(&t->reap_lock);
			return;
		}
		pthread_mutex_unlock(&t->reap_lock);
		ferry_dbg("rdma: rank %u: %d connections wait for the reaper already; destroying "
			  "one of rank %u on this thread",
			  t->base.cfg.rank, RDMA_REAP_MAX, c->rank);
	}
	rdma_conn_free(t, c, "inline");
}

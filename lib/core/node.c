/* SPDX-License-Identifier: MIT */
/*
 * node.c - one process (or thread group) = one node: open, close, the
 * message dispatcher that runs on the transport's progress thread, barrier,
 * statistics, and the local-cluster helpers for tests and demos.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/core/bootstrap.h"
#include "lib/core/config.h"
#include "lib/core/core.h"

int ferry__deadline_ms(int timeout_ms, struct timespec *ts)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
	return 0;
}

/* pthread_cond_timedwait on a CLOCK_MONOTONIC condvar; 0 or ETIMEDOUT */
int ferry__cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *ts)
{
	return pthread_cond_timedwait(c, m, ts);
}

static void node_cond_init(pthread_cond_t *c)
{
	pthread_condattr_t a;

	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
}

int ferry__send(struct ferry *fy, uint32_t dst, const void *frame, size_t len)
{
	struct iovec iov = { .iov_base = (void *)frame, .iov_len = len };
	int rc;

	if (atomic_load_explicit(&fy->closed, memory_order_acquire))
		return -FERRY_E_CLOSED;
	if (dst != fy->rank && atomic_load_explicit(&fy->failed[dst], memory_order_relaxed))
		return -FERRY_E_PEER;
	rc = fy->tp->ops->send(fy->tp, dst, &iov, 1);
	if (rc)
		return rc;
	atomic_fetch_add_explicit(&fy->msgs_sent, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&fy->bytes_sent, len, memory_order_relaxed);
	return 0;
}

/* ---- progress thread: dispatch --------------------------------------- */

static void node_on_thread_start(void *core)
{
	urcu_memb_register_thread();
}

static void node_on_thread_stop(void *core)
{
	urcu_memb_unregister_thread();
}

static void node_on_peer_failed(void *core, uint32_t src, int err)
{
	struct ferry *fy = core;

	if (src >= fy->world)
		return;
	atomic_store(&fy->failed[src], true);
	/* wake barrier and table waiters so they can give up early */
	pthread_mutex_lock(&fy->lock);
	pthread_cond_broadcast(&fy->cond);
	pthread_mutex_unlock(&fy->lock);
}

static void node_barrier_on_msg(struct ferry *fy, uint32_t src, uint8_t type,
				const struct ferry_msg_barrier *b)
{
	pthread_mutex_lock(&fy->lock);
	if (type == FERRY_MSG_BARRIER && fy->rank == 0) {
		uint64_t gen;
		uint32_t r;

		if (b->gen + 1 > fy->barrier_arrived[src])
			fy->barrier_arrived[src] = b->gen + 1;
		/* release every generation that all ranks have entered */
		for (;;) {
			gen = fy->barrier_released;
			for (r = 0; r < fy->world; r++)
				if (fy->barrier_arrived[r] <= gen)
					break;
			if (r < fy->world)
				break;
			/*
			 * Send the releases first, then release rank 0's own waiter: a
			 * barrier that has returned on rank 0 sends nothing more (the
			 * stats of the test after it must see no barrier traffic).
			 * Only this thread changes barrier_released on rank 0.
			 */
			pthread_mutex_unlock(&fy->lock);
			{
				struct {
					struct ferry_msg_hdr h;
					struct ferry_msg_barrier b;
				} rel;

				ferry__proto_hdr_init(&rel.h, FERRY_MSG_BARRIER_REL, sizeof(rel),
						      fy->rank, 0);
				rel.b.gen = gen;
				for (r = 1; r < fy->world; r++)
					ferry__send(fy, r, &rel, sizeof(rel));
			}
			pthread_mutex_lock(&fy->lock);
			fy->barrier_released = gen + 1;
		}
		pthread_cond_broadcast(&fy->cond);
	} else if (type == FERRY_MSG_BARRIER_REL && src == 0) {
		if (b->gen + 1 > fy->barrier_released)
			fy->barrier_released = b->gen + 1;
		pthread_cond_broadcast(&fy->cond);
	} else {
		ferry_warn("barrier: rank %u sent a barrier message meant for rank 0; ignored",
			   src);
	}
	pthread_mutex_unlock(&fy->lock);
}

static struct ferry_table *node_table(struct ferry *fy, uint32_t id)
{
	if (id >= FERRY_MAX_TABLES)
		return NULL;
	return rcu_dereference(fy->tables[id]);
}

/* drop a peer that broke the protocol; the others keep being served */
static void node_proto_error(struct ferry *fy, uint32_t src, uint8_t type, const char *why)
{
	ferry_err("proto: rank %u sent a malformed message (type %u): %s; dropping rank %u", src,
		  type, why, src);
	atomic_store(&fy->failed[src], true);
}

static void node_on_msg(void *core, uint32_t src, const void *buf, size_t len)
{
	struct ferry *fy = core;
	const struct ferry_msg_hdr *hdr = buf;
	struct ferry_proto_limits node_lim = { .world = fy->world };
	struct ferry_proto_view v;
	struct ferry_table *t = NULL;
	const char *why = NULL;

	if (src >= fy->world || atomic_load_explicit(&fy->failed[src], memory_order_relaxed))
		return;
	atomic_fetch_add_explicit(&fy->msgs_recv, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&fy->bytes_recv, len, memory_order_relaxed);

	urcu_memb_read_lock();
	switch (len >= sizeof(*hdr) ? hdr->type : 0) {
	case FERRY_MSG_OP:
	case FERRY_MSG_REPLY:
	case FERRY_MSG_LOCALIZE:
	case FERRY_MSG_HANDOVER_REQ:
	case FERRY_MSG_HANDOVER:
	case FERRY_MSG_LOC_ACK:
	case FERRY_MSG_HANDOVER_DONE:
		t = node_table(fy, hdr->table);
		if (!t) {
			if (hdr->table < fy->ntables) {
				/* destroyed here, still used there: drop the message only */
				ferry_warn("table %u: rank %u used a table this node destroyed; "
					   "message dropped",
					   hdr->table, src);
				goto out;
			}
			why = "unknown table";
			break;
		}
		if (ferry__proto_parse(buf, len, &t->lim, &v, &why))
			break;
		switch (hdr->type) {
		case FERRY_MSG_OP:
			ferry__ops_on_op(fy, t, src, &v);
			break;
		case FERRY_MSG_REPLY:
			ferry__ops_on_reply(fy, t, src, &v);
			break;
		case FERRY_MSG_LOCALIZE:
			ferry__reloc_on_localize(fy, t, src, &v);
			break;
		case FERRY_MSG_HANDOVER_REQ:
			ferry__reloc_on_handover_req(fy, t, src, &v);
			break;
		case FERRY_MSG_HANDOVER:
		case FERRY_MSG_HANDOVER_DONE:
			ferry__reloc_on_handover(fy, t, src, &v);
			break;
		case FERRY_MSG_LOC_ACK:
			ferry__reloc_on_ack(fy, t, src, &v);
			break;
		}
		goto out;
	case FERRY_MSG_BARRIER:
	case FERRY_MSG_BARRIER_REL:
		if (ferry__proto_parse(buf, len, &node_lim, &v, &why))
			break;
		node_barrier_on_msg(fy, src, hdr->type, v.body);
		goto out;
	case FERRY_MSG_TABLE:
	case FERRY_MSG_TABLE_ACK:
		if (ferry__proto_parse(buf, len, &node_lim, &v, &why))
			break;
		ferry__table_on_msg(fy, src, &v);
		goto out;
	default:
		why = "unexpected message type";
		break;
	}
	node_proto_error(fy, src, len >= sizeof(*hdr) ? hdr->type : 0, why);
out:
	urcu_memb_read_unlock();
}

static void node_on_rdma_done(void *core, void *ctx, int status)
{
	urcu_memb_read_lock();
	ferry__ops_on_rdma_done(core, ctx, status);
	urcu_memb_read_unlock();
}

static const struct ferry_tp_handler node_handler = {
	.on_rdma_done = node_on_rdma_done,
	.on_msg = node_on_msg,
	.on_peer_failed = node_on_peer_failed,
	.on_thread_start = node_on_thread_start,
	.on_thread_stop = node_on_thread_stop,
};

/* ---- open / close ----------------------------------------------------- */

static const struct ferry_tp_ops *node_pick_transport(enum ferry_transport_kind kind)
{
	const char *why = "this build has no RDMA transport (libibverbs/librdmacm missing)";

	if (kind == FERRY_TRANSPORT_LOOP) {
		ferry_info("transport: loop (tcp messages, one-sided access emulated in-process)");
		return &ferry__loop_ops;
	}
#ifdef FERRY_HAVE_RDMA
	if (kind != FERRY_TRANSPORT_TCP) {
		int rc = ferry__rdma_ops.probe ? ferry__rdma_ops.probe(&why) : 0;

		if (!rc) {
			ferry_info("transport: rdma (a usable device with an active port)");
			return &ferry__rdma_ops;
		}
	}
#endif
	if (kind == FERRY_TRANSPORT_RDMA) {
		ferry_err("transport: rdma was asked for but cannot run: %s; use "
			  "FERRY_TRANSPORT=tcp or fix the device (see ferry-info)",
			  why ? why : "no usable device");
		return NULL;
	}
	if (kind == FERRY_TRANSPORT_AUTO)
		ferry_info("transport: tcp (auto: %s)", why ? why : "no RDMA device");
	return &ferry__tcp_ops;
}

static void node_free(struct ferry *fy)
{
	free(fy->failed);
	free(fy->barrier_arrived);
	for (int i = 0; i < FERRY_MAX_TABLES; i++) {
		free(fy->table_seen[i]);
		free(fy->table_arenas[i]);
	}
	pthread_mutex_destroy(&fy->lock);
	pthread_cond_destroy(&fy->cond);
	free(fy);
}

void ferry__node_put(struct ferry *fy)
{
	if (atomic_fetch_sub(&fy->refs, 1) == 1)
		node_free(fy);
}

int ferry_open(const struct ferry_params *params, struct ferry **fy_p)
{
	const struct ferry_tp_ops *ops;
	struct ferry_tp_config tcfg;
	struct ferry_config c;
	struct ferry_addr mine, *addrs = NULL;
	const void **blobs = NULL;
	size_t *lens = NULL, alen;
	struct ferry *fy;
	int rc;

	if (!fy_p)
		return -EINVAL;
	rc = ferry__config_resolve(params, &c);
	if (rc)
		return rc;
	ops = node_pick_transport(c.transport);
	if (!ops)
		return -FERRY_E_NODEV;

	fy = calloc(1, sizeof(*fy));
	if (!fy)
		return -ENOMEM;
	fy->rank = (uint32_t)c.rank;
	fy->world = (uint32_t)c.world;
	fy->timeout_ms = c.timeout_ms;
	fy->busy_poll = c.busy_poll;
	atomic_init(&fy->refs, 1);
	pthread_mutex_init(&fy->lock, NULL);
	node_cond_init(&fy->cond);
	fy->failed = calloc(fy->world, sizeof(*fy->failed));
	fy->barrier_arrived = calloc(fy->world, sizeof(*fy->barrier_arrived));
	addrs = calloc(fy->world, sizeof(*addrs));
	blobs = calloc(fy->world, sizeof(*blobs));
	lens = calloc(fy->world, sizeof(*lens));
	fy->tp = calloc(1, ops->tp_size);
	if (!fy->failed || !fy->barrier_arrived || !addrs || !blobs || !lens || !fy->tp) {
		rc = -ENOMEM;
		goto err_free;
	}

	fy->tp->ops = ops;
	fy->tp_polls = ops->poll != NULL;
	tcfg = (struct ferry_tp_config){
		.rank = fy->rank,
		.world = fy->world,
		.bind_addr = c.bind_addr,
		.busy_poll = c.busy_poll,
		.timeout_ms = c.timeout_ms,
		.handler = &node_handler,
		.core = fy,
	};
	rc = ops->init(fy->tp, &tcfg);
	if (rc) {
		ferry_err("transport: %s failed to start: %s", ops->name, ferry_strerror(rc));
		goto err_free;
	}
	alen = sizeof(mine.buf);
	rc = ops->addr_get(fy->tp, mine.buf, &alen);
	if (rc)
		goto err_fini;
	mine.len = (uint32_t)alen;
	rc = ferry__bootstrap(&c, &mine, addrs, &fy->cluster_id);
	if (rc)
		goto err_fini;
	for (uint32_t r = 0; r < fy->world; r++) {
		blobs[r] = addrs[r].buf;
		lens[r] = addrs[r].len;
	}
	fy->tp->cfg.cluster_id = fy->cluster_id;
	rc = ops->connect(fy->tp, blobs, lens);
	if (rc)
		goto err_fini;
	ferry_info("node: rank %u of %u up over %s", fy->rank, fy->world, ops->name);
	free(addrs);
	free(blobs);
	free(lens);
	*fy_p = fy;
	return 0;

err_fini:
	ops->fini(fy->tp);
err_free:
	free(fy->tp);
	free(addrs);
	free(blobs);
	free(lens);
	node_free(fy);
	return rc;
}

void ferry_close(struct ferry *fy)
{
	if (!fy || atomic_exchange(&fy->closed, true))
		return;
	/* a worker inside the transport's poll() leaves it first */
	while (atomic_load(&fy->pollers))
		sched_yield();
	/* no handler runs after fini: replies stop, workers see CLOSED */
	fy->tp->ops->fini(fy->tp);
	free(fy->tp);
	fy->tp = NULL;
	pthread_mutex_lock(&fy->lock);
	pthread_cond_broadcast(&fy->cond);
	pthread_mutex_unlock(&fy->lock);
	ferry__node_put(fy);
}

/*
 * ferry__node_poll - let the transport complete one-sided reads on the
 * calling thread (a waiting worker), where it can
 *
 * A node closed meanwhile is not touched: the counter and the flag make a
 * Dekker pair with ferry_close(), which waits for pollers before the
 * transport goes. Context: a worker's thread, RCU-registered, no lock held.
 * @flags: FERRY_TP_POLL_LAST before the caller sleeps. Return: completions
 * handled.
 */
int ferry__node_poll(struct ferry *fy, unsigned flags)
{
	int n = 0;

	if (!fy->tp_polls)
		return 0; /* no shared counter to bounce between waiting workers */
	atomic_fetch_add(&fy->pollers, 1);
	if (!atomic_load(&fy->closed))
		n = fy->tp->ops->poll(fy->tp, flags);
	atomic_fetch_sub(&fy->pollers, 1);
	return n;
}

int ferry_rank(const struct ferry *fy)
{
	return fy ? (int)fy->rank : -EINVAL;
}

int ferry_world(const struct ferry *fy)
{
	return fy ? (int)fy->world : -EINVAL;
}

int ferry_barrier(struct ferry *fy)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_barrier b;
	} msg;
	struct timespec ts;
	uint64_t gen;
	int rc = 0;

	if (!fy)
		return -EINVAL;
	if (atomic_load(&fy->closed))
		return -FERRY_E_CLOSED;
	pthread_mutex_lock(&fy->lock);
	gen = fy->barrier_gen++;
	pthread_mutex_unlock(&fy->lock);
	ferry__proto_hdr_init(&msg.h, FERRY_MSG_BARRIER, sizeof(msg), fy->rank, 0);
	msg.b.gen = gen;
	rc = ferry__send(fy, 0, &msg, sizeof(msg));
	if (rc)
		return rc;
	ferry__deadline_ms(fy->timeout_ms, &ts);
	pthread_mutex_lock(&fy->lock);
	while (fy->barrier_released <= gen && !rc) {
		if (atomic_load(&fy->closed))
			rc = -FERRY_E_CLOSED;
		else if (ferry__cond_wait_until(&fy->cond, &fy->lock, &ts) == ETIMEDOUT)
			rc = -ETIMEDOUT;
	}
	if (rc == -ETIMEDOUT) {
		char names[256] = "";
		size_t off = 0;

		if (fy->rank == 0) {
			for (uint32_t r = 0; r < fy->world && off < sizeof(names); r++)
				if (fy->barrier_arrived[r] <= gen)
					off += (size_t)snprintf(names + off, sizeof(names) - off,
								"%s%u", off ? ", " : "", r);
			ferry_err("barrier %llu: timed out after %d ms; ranks %s never entered it",
				  (unsigned long long)gen, fy->timeout_ms, names);
		} else {
			ferry_err("barrier %llu: timed out after %d ms waiting for rank 0 to "
				  "release it (see rank 0's log for the missing ranks)",
				  (unsigned long long)gen, fy->timeout_ms);
		}
	}
	pthread_mutex_unlock(&fy->lock);
	return rc;
}

int ferry_stats(struct ferry *fy, struct ferry_stats *s)
{
	if (!fy || !s)
		return -EINVAL;
	memset(s, 0, sizeof(*s));
	s->local_ops = atomic_load(&fy->gone_local_ops);
	s->remote_ops = atomic_load(&fy->gone_remote_ops);
	urcu_memb_read_lock();
	for (int i = 0; i < FERRY_MAX_WORKERS; i++) {
		struct ferry_worker *w = rcu_dereference(fy->workers[i]);

		if (!w)
			continue;
		s->local_ops += __atomic_load_n(&w->local_ops, __ATOMIC_RELAXED);
		s->remote_ops += __atomic_load_n(&w->remote_ops, __ATOMIC_RELAXED);
	}
	urcu_memb_read_unlock();
	s->served_ops = atomic_load(&fy->served_ops);
	s->forwards = atomic_load(&fy->forwards);
	s->relocations_in = atomic_load(&fy->reloc_in);
	s->relocations_out = atomic_load(&fy->reloc_out);
	s->msgs_sent = atomic_load(&fy->msgs_sent);
	s->msgs_recv = atomic_load(&fy->msgs_recv);
	s->bytes_sent = atomic_load(&fy->bytes_sent);
	s->bytes_recv = atomic_load(&fy->bytes_recv);
	s->onesided_reads = atomic_load(&fy->onesided_reads);
	s->onesided_retries = atomic_load(&fy->onesided_retries);
	s->onesided_fallbacks = atomic_load(&fy->onesided_fallbacks);
	return 0;
}

/* ---- local clusters ---------------------------------------------------- */

/* where local nodes listen: loopback, unless FERRY_BIND_ADDR names the RDMA
 * interface's address (rdma_cm cannot use 127.0.0.1) */
static const char *node_local_bind(void)
{
	const char *s = getenv("FERRY_BIND_ADDR");

	return s && *s ? s : "127.0.0.1";
}

struct cluster_arg {
	struct ferry_params params;
	struct ferry *fy;
	int rc;
};

static void *cluster_open_thread(void *p)
{
	struct cluster_arg *a = p;

	a->rc = ferry_open(&a->params, &a->fy);
	return NULL;
}

int ferry_local_cluster_open(int n, const struct ferry_params *params, struct ferry **fys)
{
	struct cluster_arg *args;
	pthread_t *th;
	char rdv[64];
	int lfd, port, rc = 0;

	if (n <= 0 || n > 65535 || !fys)
		return -EINVAL;
	lfd = ferry__listen_tcp("127.0.0.1", 0, 128);
	if (lfd < 0)
		return lfd;
	port = ferry__socket_port(lfd);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", port);
	args = calloc((size_t)n, sizeof(*args));
	th = calloc((size_t)n, sizeof(*th));
	if (!args || !th) {
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if (params)
			args[i].params = *params;
		else
			ferry_params_init(&args[i].params);
		args[i].params.rank = i;
		args[i].params.world = n;
		args[i].params.rendezvous = rdv;
		args[i].params.rendezvous_fd = i == 0 ? lfd : -1;
		if (!args[i].params.bind_addr)
			args[i].params.bind_addr = node_local_bind();
		if (pthread_create(&th[i], NULL, cluster_open_thread, &args[i])) {
			/* the others time out without this rank; collect them */
			args[i].rc = -EAGAIN;
			th[i] = 0;
		}
	}
	for (int i = 0; i < n; i++) {
		if (th[i])
			pthread_join(th[i], NULL);
		if (args[i].rc && !rc)
			rc = args[i].rc;
	}
	for (int i = 0; i < n; i++) {
		if (rc && !args[i].rc)
			ferry_close(args[i].fy);
		else if (!rc)
			fys[i] = args[i].fy;
	}
out:
	free(args);
	free(th);
	close(lfd);
	return rc;
}

int ferry_local_cluster_fork(int n, struct ferry_params *params, pid_t *pids)
{
	static char rdv[64];
	int lfd, port;

	if (n <= 0 || n > 65535 || !params || !pids)
		return -EINVAL;
	lfd = ferry__listen_tcp("127.0.0.1", 0, 128);
	if (lfd < 0)
		return lfd;
	port = ferry__socket_port(lfd);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", port);
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();

		if (pid < 0) {
			int rc = -errno;

			for (int j = 0; j < i; j++)
				kill(pids[j], SIGKILL);
			for (int j = 0; j < i; j++)
				waitpid(pids[j], NULL, 0);
			close(lfd);
			return rc;
		}
		if (pid == 0) {
			params->rank = i;
			params->world = n;
			params->rendezvous = rdv;
			if (!params->bind_addr)
				params->bind_addr = node_local_bind();
			if (i == 0) {
				params->rendezvous_fd = lfd;
			} else {
				params->rendezvous_fd = -1;
				close(lfd);
			}
			return i;
		}
		pids[i] = pid;
	}
	close(lfd);
	return FERRY_LOCAL_PARENT;
}

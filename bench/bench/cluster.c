/* SPDX-License-Identifier: MIT */
/*
 * cluster.c - run one SPMD scenario function on every node of a cluster.
 *
 *   --nodes-as threads   ferry_local_cluster_open(): N nodes, one thread each
 *   --procs              ferry_local_cluster_fork(): N processes; the parent
 *                        waits, results come back through the shared region
 *   --external           ferry_open() from FERRY_RANK/WORLD/RENDEZVOUS: this
 *                        process is one node; the cluster is opened once and
 *                        kept for every scenario
 *
 * With --pin a node process is put on one CPU before it opens its node, so
 * every thread it starts (worker, progress threads, the raw baseline's
 * client or server) runs there, and both sides of a round trip schedule
 * alike: rank r gets the (r mod n)-th of the n CPUs the process may use.
 *
 * Every node first sets up what all scenarios share: a worker for its main
 * thread, a small exchange table, and on rank 1 the raw baseline server,
 * whose address and port rank 0 reads from the exchange table. So the raw
 * round trip always runs between the same two nodes, over the same link, as
 * the operations it is compared with.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fb.h"

#define XCHG_FLOATS 8

void fb_failf(struct fb_shared *sh, const char *fmt, ...)
{
	char msg[160];
	va_list ap;
	int i;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "ferry-bench: FAILED: %s\n", msg);
	i = atomic_fetch_add(&sh->failures, 1);
	if (i >= 0 && i < 8)
		snprintf(sh->failure_msg[i], sizeof(sh->failure_msg[i]), "%s", msg);
}

void fb_fail(struct fb_node *n, const char *what, int err)
{
	fb_failf(n->sh, "rank %d: %s: %s", n->rank, what, ferry_strerror(err));
}

int fb_barrier(struct fb_node *n)
{
	int rc = ferry_barrier(n->fy);

	if (rc) {
		fb_fail(n, "barrier", rc);
		return -1;
	}
	return 0;
}

int fb_table_create(struct fb_node *n, uint64_t num_keys, uint32_t value_bytes,
		    struct ferry_table **t_p)
{
	struct ferry_table_params tp = {
		.num_keys = num_keys,
		.value_len = value_bytes / 4 ? value_bytes / 4 : 1,
		.placement = FERRY_PLACEMENT_RANGE,
		.mode = n->o->mode,
		.no_local_fast_path = n->o->no_fast_path,
	};
	int rc = ferry_table_create(n->fy, &tp, t_p);

	if (rc) {
		char what[96];

		snprintf(what, sizeof(what), "table of %llu keys x %u bytes",
			 (unsigned long long)num_keys, value_bytes);
		fb_fail(n, what, rc);
		return -1;
	}
	/*
	 * Use the table only once every node has returned from create: a node
	 * serves a table's messages as soon as it is published, but fills in
	 * the peers' arena addresses (one-sided hand-overs) only after create's
	 * acknowledgement, and a hand-over served in between dereferenced the
	 * missing addresses (seen with the rdma transport in the SoftRoCE VM).
	 */
	return fb_barrier(n);
}

size_t fb_keys_homed(struct ferry_table *t, uint64_t num_keys, int rank, uint64_t from,
		     uint64_t *keys, size_t count)
{
	size_t got = 0;

	for (uint64_t k = from; k < num_keys && got < count; k++)
		if (ferry_table_home(t, k) == rank)
			keys[got++] = k;
	return got;
}

/*
 * The end of a phase in which one node (the leader, usually rank 0) measures
 * and the others wait. A barrier alone would not do: Ferry bounds every wait
 * by the node's timeout, and a measurement may take longer. So the waiting
 * nodes poll a flag the leader sets (a pull every 20 ms, key 0 of the
 * exchange table: [0] the phase reached, [1] 1 when some node gave up), and
 * then all meet at a barrier.
 */
#define PHASE_POLL_US 20000
#define PHASE_MAX_S 3600

static int phase_flag(struct fb_node *n, float phase, float abort_flag)
{
	float v[XCHG_FLOATS] = { phase, abort_flag };
	uint64_t key = 0;

	return ferry_set(n->w, n->xchg, &key, 1, v);
}

int fb_phase_end(struct fb_node *n, int leader)
{
	int64_t deadline = fb_now_ns() + (int64_t)PHASE_MAX_S * 1000000000;
	float v[XCHG_FLOATS];
	uint64_t key = 0;
	int rc;

	n->phase++;
	if (n->rank == leader) {
		rc = phase_flag(n, (float)n->phase, 0);
		if (rc) {
			fb_fail(n, "setting the phase flag", rc);
			return -1;
		}
		return fb_barrier(n);
	}
	for (;;) {
		rc = ferry_pull(n->w, n->xchg, &key, 1, v);
		if (rc) {
			fb_fail(n, "waiting for the measuring node", rc);
			return -1;
		}
		if (v[1] != 0) {
			fb_failf(n->sh, "rank %d: another node gave up; leaving", n->rank);
			return -1;
		}
		if (v[0] >= (float)n->phase)
			break;
		if (fb_now_ns() > deadline) {
			fb_failf(n->sh, "rank %d: rank %d measured for more than %d s", n->rank,
				 leader, PHASE_MAX_S);
			return -1;
		}
		usleep(PHASE_POLL_US);
	}
	return fb_barrier(n);
}

/* --pin: this process (and every thread it starts later) on one CPU */
static int pin_rank(struct fb_shared *sh, int rank)
{
	cpu_set_t allowed, one;
	int n, k = 0;

	if (sched_getaffinity(0, sizeof(allowed), &allowed)) {
		fb_failf(sh, "--pin: rank %d: sched_getaffinity: %s", rank, strerror(errno));
		return -1;
	}
	n = CPU_COUNT(&allowed);
	for (int cpu = 0; cpu < CPU_SETSIZE && n > 0; cpu++) {
		if (!CPU_ISSET(cpu, &allowed))
			continue;
		if (k++ == rank % n) {
			CPU_ZERO(&one);
			CPU_SET(cpu, &one);
			if (sched_setaffinity(0, sizeof(one), &one)) {
				fb_failf(sh, "--pin: rank %d: sched_setaffinity(cpu %d): %s", rank,
					 cpu, strerror(errno));
				return -1;
			}
			return 0;
		}
	}
	fb_failf(sh, "--pin: rank %d: no CPU allowed to this process", rank);
	return -1;
}

/* ---- the per-node setup every scenario shares ----------------------------- */

static const char *node_bind_addr(const struct fb_opts *o)
{
	if (o->bind_addr)
		return o->bind_addr;
	if (o->nodes_as == FB_NODES_EXTERNAL)
		return getenv("FERRY_BIND_ADDR"); /* NULL: any */
	return "127.0.0.1";
}

static int node_setup(struct fb_node *n)
{
	float x[XCHG_FLOATS] = { 0 };
	uint64_t key;
	int rc;

	rc = ferry_worker_create(n->fy, &n->w);
	if (rc) {
		fb_fail(n, "worker", rc);
		return -1;
	}
	if (n->o->timeline && fb_tl_enable(n))
		return -1;
	if (fb_table_create(n, (uint64_t)n->world, XCHG_FLOATS * 4, &n->xchg))
		return -1;
	if (n->rank == 1) {
		const char *addr = node_bind_addr(n->o);
		struct in_addr ia = { 0 };

		if (addr && inet_pton(AF_INET, addr, &ia) != 1) {
			fb_failf(n->sh, "rank 1: the bind address '%s' is not IPv4", addr);
			return -1;
		}
		rc = fb_raw_srv_start(addr, n->o->busy_poll, (struct fb_raw_srv **)&n->raw_srv,
				      &n->raw_port);
		if (rc) {
			fb_fail(n, "raw baseline server", rc);
			return -1;
		}
		x[0] = (float)n->raw_port;
		for (int i = 0; i < 4; i++)
			x[1 + i] = (float)((const uint8_t *)&ia.s_addr)[i];
		key = 1;
		rc = ferry_set(n->w, n->xchg, &key, 1, x);
		if (rc) {
			fb_fail(n, "exchange set", rc);
			return -1;
		}
	}
	if (fb_barrier(n))
		return -1;
	if (n->rank == 0 && n->world > 1) {
		uint8_t b[4];

		key = 1;
		rc = ferry_pull(n->w, n->xchg, &key, 1, x);
		if (rc) {
			fb_fail(n, "exchange pull", rc);
			return -1;
		}
		n->raw_port = (int)x[0];
		for (int i = 0; i < 4; i++)
			b[i] = (uint8_t)x[1 + i];
		if (!b[0] && !b[1] && !b[2] && !b[3])
			snprintf(n->raw_addr, sizeof(n->raw_addr), "127.0.0.1");
		else
			snprintf(n->raw_addr, sizeof(n->raw_addr), "%u.%u.%u.%u", b[0], b[1], b[2],
				 b[3]);
	}
	return 0;
}

static void node_teardown(struct fb_node *n)
{
	fb_raw_srv_stop(n->raw_srv);
	n->raw_srv = NULL;
	if (n->xchg)
		ferry_table_destroy(n->xchg);
	n->xchg = NULL;
	if (n->w)
		ferry_worker_destroy(n->w);
	n->w = NULL;
}

static int node_main(struct fb_node *n, fb_node_fn fn)
{
	int rc = node_setup(n);

	if (!rc)
		rc = fn(n);
	/* a node that gave up may have left a phase early: release the waiters */
	if (rc && n->xchg)
		phase_flag(n, (float)n->phase, 1);
	/* leave together: a node's server must outlive the others' last use */
	if (ferry_barrier(n->fy) && !rc) {
		fb_fail(n, "final barrier", -ETIMEDOUT);
		rc = -1;
	}
	node_teardown(n);
	return rc;
}

static void cluster_params(const struct fb_opts *o, struct ferry_params *p)
{
	ferry_params_init(p);
	p->transport = o->transport;
	p->busy_poll = o->busy_poll;
	if (o->timeout_ms)
		p->timeout_ms = o->timeout_ms;
	if (o->nodes_as != FB_NODES_EXTERNAL)
		p->bind_addr = o->bind_addr;
	else if (o->bind_addr)
		p->bind_addr = o->bind_addr;
}

/* ---- threads ---------------------------------------------------------------- */

struct cl_thread {
	struct fb_node n;
	fb_node_fn fn;
	pthread_t th;
	int rc;
};

static void *cl_thread_main(void *arg)
{
	struct cl_thread *c = arg;

	c->rc = node_main(&c->n, c->fn);
	return NULL;
}

static int run_threads(const struct fb_opts *o, struct fb_shared *sh, int world, fb_node_fn fn,
		       void *arg, const char *what)
{
	struct ferry_params p;
	struct ferry **fys = calloc((size_t)world, sizeof(*fys));
	struct cl_thread *c = calloc((size_t)world, sizeof(*c));
	int rc, bad = 0;

	if (!fys || !c) {
		free(fys);
		free(c);
		fb_failf(sh, "%s: out of memory", what);
		return -1;
	}
	cluster_params(o, &p);
	rc = ferry_local_cluster_open(world, &p, fys);
	if (rc) {
		fb_failf(sh, "%s: cannot open a local cluster of %d nodes (transport %s): %s", what,
			 world, fb_transport_name(o->transport), ferry_strerror(rc));
		free(fys);
		free(c);
		return -1;
	}
	for (int i = 0; i < world; i++) {
		c[i].n = (struct fb_node){
			.o = o, .sh = sh, .fy = fys[i], .rank = i, .world = world, .arg = arg
		};
		c[i].fn = fn;
		if (pthread_create(&c[i].th, NULL, cl_thread_main, &c[i])) {
			c[i].rc = -1;
			c[i].th = 0;
			fb_failf(sh, "%s: cannot start the thread of node %d", what, i);
		}
	}
	for (int i = 0; i < world; i++) {
		if (c[i].th)
			pthread_join(c[i].th, NULL);
		bad |= c[i].rc != 0;
	}
	for (int i = 0; i < world; i++)
		ferry_close(fys[i]);
	free(fys);
	free(c);
	return bad ? -1 : 0;
}

/* ---- processes ---------------------------------------------------------------- */

static int run_procs(const struct fb_opts *o, struct fb_shared *sh, int world, fb_node_fn fn,
		     void *arg, const char *what)
{
	struct ferry_params p;
	pid_t *pids = calloc((size_t)world, sizeof(*pids));
	int rc, left = world, bad = 0, limit_ms, waited_ms = 0;

	if (!pids) {
		fb_failf(sh, "%s: out of memory", what);
		return -1;
	}
	cluster_params(o, &p);
	fflush(NULL);
	rc = ferry_local_cluster_fork(world, &p, pids);
	if (rc < 0) {
		fb_failf(sh, "%s: cannot fork %d nodes: %s", what, world, ferry_strerror(rc));
		free(pids);
		return -1;
	}
	if (rc != FERRY_LOCAL_PARENT) {
		struct fb_node n = { .o = o, .sh = sh, .rank = rc, .world = world, .arg = arg };

		/* pinned before ferry_open: its threads inherit the CPU */
		if (o->pin && pin_rank(sh, n.rank))
			_exit(1);
		rc = ferry_open(&p, &n.fy);
		if (rc) {
			fb_failf(sh, "%s: rank %d cannot join: %s", what, n.rank,
				 ferry_strerror(rc));
			_exit(1);
		}
		rc = node_main(&n, fn);
		ferry_close(n.fy);
		fflush(NULL);
		_exit(rc ? 1 : 0);
	}
	/* a node that failed leaves the others waiting at most their timeout */
	limit_ms = (o->timeout_ms ? o->timeout_ms : 30000) * 2;
	while (left > 0) {
		int st;
		pid_t pid = waitpid(-1, &st, bad ? WNOHANG : 0);

		if (pid > 0) {
			for (int i = 0; i < world; i++)
				if (pids[i] == pid) {
					pids[i] = 0;
					left--;
				}
			if (!WIFEXITED(st) || WEXITSTATUS(st)) {
				if (!bad && WIFSIGNALED(st))
					fb_failf(sh, "%s: a node died of signal %d", what,
						 WTERMSIG(st));
				bad = 1;
			}
			continue;
		}
		if (pid < 0 && errno != EINTR)
			break;
		usleep(10000);
		waited_ms += 10;
		if (waited_ms > limit_ms) {
			for (int i = 0; i < world; i++)
				if (pids[i] > 0)
					kill(pids[i], SIGKILL);
			fb_failf(sh, "%s: nodes still running %d ms after another failed; killed",
				 what, limit_ms);
			limit_ms = 1 << 30;
		}
	}
	free(pids);
	return bad ? -1 : 0;
}

/* ---- external ------------------------------------------------------------------ */

static struct fb_node ext_node;
static int ext_open;
static int ext_rank;

static int run_external(const struct fb_opts *o, struct fb_shared *sh, int world, fb_node_fn fn,
			void *arg, const char *what)
{
	struct fb_node n;
	int rc;

	if (!ext_open) {
		struct ferry_params p;

		cluster_params(o, &p);
		ext_node = (struct fb_node){ .o = o, .sh = sh };
		if (o->pin) {
			const char *r = getenv("FERRY_RANK");

			if (!r)
				r = getenv("RANK");
			if (!r) {
				fb_failf(sh, "--pin with --external reads the rank from FERRY_RANK "
					     "or RANK, and neither is set");
				return -1;
			}
			if (pin_rank(sh, atoi(r)))
				return -1;
		}
		rc = ferry_open(&p, &ext_node.fy);
		if (rc) {
			fb_failf(sh,
				 "cannot join the cluster (FERRY_RANK, FERRY_WORLD, "
				 "FERRY_RENDEZVOUS): %s",
				 ferry_strerror(rc));
			return -1;
		}
		ext_node.rank = ferry_rank(ext_node.fy);
		ext_rank = ext_node.rank;
		ext_node.world = ferry_world(ext_node.fy);
		ext_open = 1;
		if (node_setup(&ext_node)) {
			ext_open = -1;
			return -1;
		}
	}
	if (ext_open < 0)
		return -1;
	if (ext_node.world < world) {
		if (ext_node.rank == 0)
			printf("# %s: skipped, it needs %d nodes and the cluster has %d\n", what,
			       world, ext_node.world);
		atomic_fetch_add(&sh->skipped, 1);
		return 0;
	}
	n = ext_node;
	n.arg = arg;
	rc = fn(&n);
	ext_node.phase = n.phase;
	if (rc)
		phase_flag(&n, (float)n.phase, 1);
	if (ferry_barrier(n.fy) && !rc) {
		fb_fail(&n, "barrier after the scenario", -ETIMEDOUT);
		rc = -1;
	}
	return rc;
}

int fb_cluster_rank(void)
{
	return ext_rank;
}

void fb_cluster_close(void)
{
	if (!ext_open)
		return;
	if (ext_open > 0)
		ferry_barrier(ext_node.fy);
	node_teardown(&ext_node);
	ferry_close(ext_node.fy);
	ext_open = 0;
}

int fb_cluster_run(const struct fb_opts *o, struct fb_shared *sh, int world, fb_node_fn fn,
		   void *arg, const char *what)
{
	if (o->verbose)
		fprintf(stderr, "ferry-bench: %s on %d nodes\n", what, world);
	switch (o->nodes_as) {
	case FB_NODES_PROCS:
		return run_procs(o, sh, world, fn, arg, what);
	case FB_NODES_EXTERNAL:
		return run_external(o, sh, world, fn, arg, what);
	default:
		return run_threads(o, sh, world, fn, arg, what);
	}
}

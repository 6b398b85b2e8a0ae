/* SPDX-License-Identifier: MIT */
/*
 * faults.c - the price and the payoff of replicas (docs/faults.md):
 *
 *   replicas   push latency and throughput on tables with replicas = 1 and
 *              replicas = 2, against the same pushes on a table with
 *              replicas = 0 in the same run, on the same nodes, in rotating
 *              rounds (so all three see the same moments of a noisy
 *              machine); 3 nodes, range placement: rank 0 pushes keys owned
 *              by rank 1 (remote: the owner copies each update to rank 2,
 *              and with r = 2 to rank 0 too, before it answers) and its own
 *              keys (local: with replicas the update goes through rank 0's
 *              progress thread and a copy to rank 1, and rank 2 with r = 2;
 *              without, the local fast path applies it in place)
 *   failover   the time from a SIGKILL (or a SIGSTOP) of one node of 4 forked
 *              processes to the first successful push, started after it, on
 *              a key the dead node owned, measured on a survivor that is not
 *              the key's new home; one fresh cluster per kill, a 250 ms
 *              heartbeat
 *
 * Neither is in "all": -s replicas, -s failover.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fb.h"

/* ---- replicas ----------------------------------------------------------- */

#define REPL_KEYS_PER_NODE 4096
#define REPL_ROUNDS 20	/* rotating rounds of r = 0, 1 and 2 */
#define REPL_NT 3	/* tables: replicas 0, 1, 2 */
#define REPL_BATCH 256	/* keys per push of the throughput rows */
#define REPL_TPUT_S 0.1 /* seconds of batch pushes per round and table */

struct repl_arg {
	uint32_t bytes;
};

static int repl_table(struct fb_node *n, uint32_t bytes, uint32_t replicas,
		      struct ferry_table **t_p)
{
	struct ferry_table_params tp = {
		.num_keys = (uint64_t)REPL_KEYS_PER_NODE * (uint64_t)n->world,
		.value_len = bytes / 4 ? bytes / 4 : 1,
		.placement = FERRY_PLACEMENT_RANGE,
		.mode = n->o->mode,
		.replicas = replicas,
	};
	int rc = ferry_table_create(n->fy, &tp, t_p);

	if (rc) {
		char what[64];

		snprintf(what, sizeof(what), "replicas: table with replicas = %u", replicas);
		fb_fail(n, what, rc);
		return -1;
	}
	return fb_barrier(n); /* as fb_table_create: used once every node has it */
}

/* @iters single-key pushes to @keys (round robin), each timed into @lat */
static int repl_lat(struct fb_node *n, struct ferry_table *t, const uint64_t *keys, size_t nkeys,
		    const float *v, long iters, int64_t *lat)
{
	for (long i = 0; i < iters; i++) {
		int64_t t0 = fb_now_ns();
		int rc = ferry_push(n->w, t, &keys[(size_t)i % nkeys], 1, v);

		if (rc) {
			fb_fail(n, "replicas: push", rc);
			return -1;
		}
		lat[i] = fb_now_ns() - t0;
	}
	return 0;
}

/* batch pushes for @secs; *@keys_p += keys pushed, *@ns_p += time taken */
static int repl_tput(struct fb_node *n, struct ferry_table *t, const uint64_t *keys, const float *v,
		     double secs, double *keys_p, double *ns_p)
{
	int64_t t0 = fb_now_ns(), end = t0 + (int64_t)(secs * 1e9), now;
	long pushes = 0;

	do {
		int rc = ferry_push(n->w, t, keys, REPL_BATCH, v);

		if (rc) {
			fb_fail(n, "replicas: batch push", rc);
			return -1;
		}
		pushes++;
		now = fb_now_ns();
	} while (now < end);
	*keys_p += (double)pushes * REPL_BATCH;
	*ns_p += (double)(now - t0);
	return 0;
}

/* @l1: the latencies with r replicas, @l0 with none (the same run) */
static void repl_row(struct fb_node *n, const char *op, uint32_t bytes, int64_t *l1, int64_t *l0,
		     long cnt, int r_)
{
	struct fb_result r = { .value_bytes = bytes, .threads = 1, .keys = 1 };
	struct fb_base b;

	snprintf(r.scenario, sizeof(r.scenario), "replicas");
	snprintf(r.op, sizeof(r.op), "%s", op);
	fb_sort(l1, (size_t)cnt);
	fb_result_lat(&r, l1, (size_t)cnt);
	fb_base_from_lat(&b, "same push, r=0", l0, cnt);
	fb_result_base(&r, &b);
	snprintf(r.note, sizeof(r.note), "r=%d over r=0, %d rotating rounds", r_, REPL_ROUNDS);
	fb_result_add(n->sh, &r);
}

static int repl_node(struct fb_node *n)
{
	const struct repl_arg *a = n->arg;
	struct ferry_table *t[REPL_NT] = { NULL }; /* [replicas] */
	long per = n->o->iters / REPL_ROUNDS > 0 ? n->o->iters / REPL_ROUNDS : 1;
	long cnt = per * REPL_ROUNDS;
	int64_t *lat[2][REPL_NT] = { { NULL } }; /* [remote, local][replicas] */
	uint64_t remote[REPL_BATCH], local[REPL_BATCH];
	float *v = NULL;
	int bad = 0;

	for (int r = 0; r < REPL_NT && !bad; r++)
		bad = repl_table(n, a->bytes, (uint32_t)r, &t[r]);
	if (bad)
		goto out;
	if (n->rank == 0) {
		size_t nr = fb_keys_homed(t[0], (uint64_t)REPL_KEYS_PER_NODE * (uint64_t)n->world,
					  1, 0, remote, REPL_BATCH);
		size_t nl = fb_keys_homed(t[0], (uint64_t)REPL_KEYS_PER_NODE * (uint64_t)n->world,
					  0, 0, local, REPL_BATCH);
		double keys[REPL_NT] = { 0 }, ns[REPL_NT] = { 0 };
		bool got = true;

		v = calloc(REPL_BATCH, a->bytes);
		for (int i = 0; i < 2; i++)
			for (int j = 0; j < REPL_NT; j++)
				got &= (lat[i][j] = malloc((size_t)cnt * sizeof(int64_t))) != NULL;
		if (!v || !got || nr < REPL_BATCH || nl < REPL_BATCH) {
			fb_failf(n->sh, "replicas: out of memory, or too few keys per node");
			bad = 1;
			goto done;
		}
		for (long i = 0; i < REPL_BATCH; i++)
			v[i * (a->bytes / 4 ? a->bytes / 4 : 1)] = 1;
		/* warm up all: connections, caches, the arena's first touch */
		for (int r = 0; r < REPL_NT && !bad; r++)
			bad = repl_lat(n, t[r], remote, REPL_BATCH, v, cnt, lat[0][r]) ||
			      repl_lat(n, t[r], local, REPL_BATCH, v, cnt, lat[1][r]);
		for (int round = 0; round < REPL_ROUNDS && !bad; round++) {
			/* round i starts with r = i mod 3: each goes first as often */
			for (int k = 0; k < REPL_NT && !bad; k++) {
				int r = (round + k) % REPL_NT;

				bad = repl_lat(n, t[r], remote, REPL_BATCH, v, per,
					       lat[0][r] + round * per) ||
				      repl_lat(n, t[r], local, REPL_BATCH, v, per,
					       lat[1][r] + round * per) ||
				      repl_tput(n, t[r], remote, v, REPL_TPUT_S, &keys[r], &ns[r]);
			}
		}
		for (int rr = 1; rr < REPL_NT && !bad; rr++) {
			struct fb_result r = { .value_bytes = a->bytes,
					       .threads = 1,
					       .keys = REPL_BATCH };
			char op[32];

			snprintf(op, sizeof(op), "push remote r=%d", rr);
			repl_row(n, op, a->bytes, lat[0][rr], lat[0][0], cnt, rr);
			snprintf(op, sizeof(op), "push local r=%d", rr);
			repl_row(n, op, a->bytes, lat[1][rr], lat[1][0], cnt, rr);
			snprintf(r.scenario, sizeof(r.scenario), "replicas");
			snprintf(r.op, sizeof(r.op), "push-batch r=%d", rr);
			snprintf(r.baseline, sizeof(r.baseline), "same pushes, r=0");
			r.ops_per_s = keys[rr] / (ns[rr] / 1e9);
			r.base_ops_per_s = keys[0] / (ns[0] / 1e9);
			r.mb_per_s = r.ops_per_s * a->bytes / 1e6;
			snprintf(r.note, sizeof(r.note), "keys/s, %d-key pushes to rank 1",
				 REPL_BATCH);
			fb_result_add(n->sh, &r);
		}
	}
done:
	if (fb_phase_end(n, 0))
		bad = 1;
out:
	for (int r = 0; r < REPL_NT; r++)
		if (t[r])
			ferry_table_destroy(t[r]);
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < REPL_NT; j++)
			free(lat[i][j]);
	free(v);
	return bad ? -1 : 0;
}

int fb_replicas(const struct fb_opts *o, struct fb_shared *sh)
{
	int bad = 0;

	for (int i = 0; i < o->nsizes; i++) {
		struct repl_arg a = { .bytes = o->sizes[i] };

		bad |= fb_cluster_run(o, sh, 3, repl_node, &a, "replicas");
	}
	return bad ? -1 : 0;
}

/* ---- failover ----------------------------------------------------------- */

#define FO_NODES 4
#define FO_DEAD 3
#define FO_MEASURER 1 /* not the dead node's successor (rank 0, the new home) */
#define FO_KEYS 1024
#define FO_HB_MS 250
#define FO_BOUND_NS 10000000000ll /* no success 10 s after the kill: a failure */

struct fo_shared {
	volatile int ready, done, failed;
	volatile int64_t kill_ns;
	volatile int64_t first_ok_ns; /* since the kill */
	volatile long peer_fails;     /* pushes that failed with -FERRY_E_PEER meanwhile */
	volatile long timeouts;	      /* pushes that timed out meanwhile (below) */
	char why[160];
};

static void fo_fail(struct fo_shared *s, int rank, const char *what, int rc)
{
	if (!__atomic_fetch_add(&s->failed, 1, __ATOMIC_SEQ_CST))
		snprintf(s->why, sizeof(s->why), "rank %d: %s: %s", rank, what, ferry_strerror(rc));
}

static int fo_child(int rank, struct ferry_params *p, struct fo_shared *s)
{
	struct ferry_table_params tp = { .num_keys = FO_KEYS,
					 .value_len = 16,
					 .placement = FERRY_PLACEMENT_HASH,
					 .replicas = 1 };
	const float one[16] = { 1 };
	struct ferry_worker *w = NULL;
	struct ferry_table *t = NULL;
	struct ferry *fy;
	uint64_t key = 0;
	int rc;

	if ((rc = ferry_open(p, &fy))) {
		fo_fail(s, rank, "open", rc);
		return 1;
	}
	if ((rc = ferry_table_create(fy, &tp, &t)) || (rc = ferry_worker_create(fy, &w)) ||
	    (rc = ferry_barrier(fy))) {
		fo_fail(s, rank, "setup", rc);
		return 1;
	}
	/* a key the dead node owns: homed there, and nothing moves it */
	while (key < FO_KEYS && ferry_table_home(t, key) != FO_DEAD)
		key++;
	__atomic_fetch_add(&s->ready, 1, __ATOMIC_SEQ_CST);
	if (rank == FO_MEASURER) {
		for (;;) {
			int64_t k = s->kill_ns, t0 = fb_now_ns();

			rc = ferry_push(w, t, &key, 1, one);
			if (!rc && k && t0 > k) {
				s->first_ok_ns = fb_now_ns() - k;
				break;
			}
			if (rc == -FERRY_E_PEER) {
				s->peer_fails++;
			} else if (rc == -ETIMEDOUT && k && t0 > k) {
				/*
				 * Should not happen any more: a push that a survivor
				 * forwarded toward the dead node just before it
				 * learned of the death ends when the takeover does
				 * (lib/ops/request.c). Counted, not fatal: the time
				 * counts in the figure (max) and the row's note says
				 * how often; the retry measures on.
				 */
				s->timeouts++;
			} else if (rc) {
				fo_fail(s, rank, "push", rc);
				break;
			}
			if (k && t0 - k > FO_BOUND_NS) {
				fo_fail(s, rank, "no push succeeded 10 s after the kill",
					-FERRY_E_PEER);
				break;
			}
		}
		s->done = 1;
	}
	while (!s->done && !s->failed)
		usleep(1000);
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	return 0;
}

/* one cluster, one kill; Return: 0 and *@ns_p, or -1 (recorded) */
static int fo_once(const struct fb_opts *o, struct fb_shared *sh, int stop, int64_t *ns_p,
		   long *peer_p, long *timeouts_p)
{
	struct fo_shared *s =
		mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_params p;
	pid_t pids[FO_NODES];
	int rc, bad = 0;

	if (s == MAP_FAILED) {
		fb_failf(sh, "failover: mmap: out of memory");
		return -1;
	}
	ferry_params_init(&p);
	p.transport = o->transport;
	p.heartbeat_ms = FO_HB_MS;
	p.timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 8000;
	if (o->bind_addr)
		p.bind_addr = o->bind_addr;
	fflush(stdout);
	rc = ferry_local_cluster_fork(FO_NODES, &p, pids);
	if (rc >= 0 && rc < FO_NODES)
		_exit(fo_child(rc, &p, s));
	if (rc != FERRY_LOCAL_PARENT) {
		fb_failf(sh, "failover: fork: %s", ferry_strerror(rc));
		munmap(s, sizeof(*s));
		return -1;
	}
	for (int64_t until = fb_now_ns() + 30000000000ll;
	     s->ready < FO_NODES && !s->failed && fb_now_ns() < until;)
		usleep(1000);
	if (s->ready == FO_NODES && !s->failed) {
		usleep(200 * 1000); /* the measurer's pushes run */
		if (stop) {
			int status;

			/* kill() only queues SIGSTOP: the clock starts once every
			 * thread of the node has stopped */
			kill(pids[FO_DEAD], SIGSTOP);
			waitpid(pids[FO_DEAD], &status, WUNTRACED);
		}
		s->kill_ns = fb_now_ns();
		if (!stop)
			kill(pids[FO_DEAD], SIGKILL);
	} else {
		fo_fail(s, -1, "the nodes did not start", -ETIMEDOUT);
	}
	for (int i = 0; i < FO_NODES; i++) {
		int64_t until = fb_now_ns() + 60000000000ll; /* a survivor that hangs: killed */
		int status = 0;
		pid_t got;

		if (i == FO_DEAD)
			continue;
		if (s->failed)
			kill(pids[i], SIGKILL);
		while ((got = waitpid(pids[i], &status, WNOHANG)) == 0 && fb_now_ns() < until)
			usleep(1000);
		if (!got) {
			kill(pids[i], SIGKILL);
			waitpid(pids[i], &status, 0);
			fo_fail(s, i, "did not close within 60 s after the kill", -ETIMEDOUT);
		}
		if (got != pids[i] || !WIFEXITED(status) || WEXITSTATUS(status))
			bad = 1;
	}
	kill(pids[FO_DEAD], SIGKILL);
	waitpid(pids[FO_DEAD], NULL, 0);
	if (s->failed || bad || !s->first_ok_ns) {
		fb_failf(sh, "failover: %s", s->failed ? s->why : "a survivor failed");
		munmap(s, sizeof(*s));
		return -1;
	}
	*ns_p = s->first_ok_ns;
	*peer_p += s->peer_fails;
	*timeouts_p += s->timeouts;
	munmap(s, sizeof(*s));
	return 0;
}

int fb_failover(const struct fb_opts *o, struct fb_shared *sh)
{
	int kills = o->quick ? 3 : 20;

	if (o->nodes_as == FB_NODES_EXTERNAL) {
		printf("ferry-bench: failover: skipped in --external mode (it forks and kills "
		       "its own nodes)\n");
		atomic_fetch_add(&sh->skipped, 1);
		return 0;
	}
	for (int stop = 0; stop < 2; stop++) {
		int64_t *lat = calloc((size_t)kills, sizeof(*lat));
		struct fb_result r = { .value_bytes = 64, .threads = 1, .keys = 1 };
		long peer = 0, timeouts = 0;
		int n = 0;

		if (!lat)
			return -1;
		for (int i = 0; i < kills; i++)
			if (!fo_once(o, sh, stop, &lat[n], &peer, &timeouts))
				n++;
		if (n) {
			fb_sort(lat, (size_t)n);
			fb_result_lat(&r, lat, (size_t)n);
			snprintf(r.scenario, sizeof(r.scenario), "failover");
			snprintf(r.op, sizeof(r.op), stop ? "sigstop->push" : "sigkill->push");
			r.extra = (double)lat[n - 1] / 1e6;
			snprintf(r.extra_name, sizeof(r.extra_name), "max[ms]");
			snprintf(r.note, sizeof(r.note),
				 "%d/%d %s, 4 procs, hb %d ms, %ld retries, %ld timed out", n,
				 kills, stop ? "stops" : "kills", FO_HB_MS, peer, timeouts);
			fb_result_add(sh, &r);
		}
		free(lat);
	}
	return 0;
}

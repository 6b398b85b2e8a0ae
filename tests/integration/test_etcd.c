/* SPDX-License-Identifier: MIT */
/*
 * Integration: the etcd membership manager (lib/mgr/etcd.c) against a real
 * etcd from Debian's etcd-server, started per test on loopback with a
 * temporary data folder and free ports, and stopped and removed after.
 *
 *  - a cluster forms with etcd membership (as threads and as processes),
 *    works, and its keys are gone from etcd once it closed;
 *  - a node killed with SIGKILL, and one stopped with SIGSTOP (its
 *    connections stay up: only its lease tells), is declared dead within
 *    TTL + 2 s, and the survivors' waits on it end with -FERRY_E_PEER;
 *  - etcd unreachable at start is a clear error.
 *
 * Skipped, with the reason, when libferry has no etcd manager (no libcurl)
 * or the etcd binary is missing.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef FERRY_HAVE_ETCD
#include <curl/curl.h>
#endif

#include "common/cluster.h"
#include "common/etcdsrv.h"

#define TTL 2	      /* seconds: the lease */
#define BOUND_MS 2000 /* what detection may take past the TTL */
#define NK 300

#ifdef FERRY_HAVE_ETCD
/* keys under /ferry/ now ("L2ZlcnJ5Lw==" is "/ferry/", "L2ZlcnJ5MA==" "/ferry0") */
static int ed_count_keys(const struct etcd_srv *s)
{
	char out[4096], *c;

	cr_assert_eq(ed_post(s, "/v3/kv/range",
			     "{\"key\":\"L2ZlcnJ5Lw==\",\"range_end\":\"L2ZlcnJ5MA==\","
			     "\"count_only\":true}",
			     out, sizeof(out)),
		     200, "etcd range: %s", out);
	c = strstr(out, "\"count\":\"");
	return c ? atoi(c + 9) : 0;
}
#endif

/* ---- shared by the processes of one test --------------------------------- */

struct ed_sh {
	int ready, killed, done;
	int64_t t_kill_ms;
	int64_t detect_ms[4];
	int saw_left[4];
	uint64_t epoch_before[4], epoch_after[4];
	char why[256];
};

static struct ed_sh *ed_log_sh;
static int ed_my_rank = -1; /* this process's node */

static void ed_log_cb(enum ferry_log_level level, const char *msg, void *arg)
{
	int r = __atomic_load_n(&ed_my_rank, __ATOMIC_ACQUIRE);

	if (ed_log_sh && r >= 0 && r < 4 && strstr(msg, "left the cluster at epoch"))
		__atomic_store_n(&ed_log_sh->saw_left[r], 1, __ATOMIC_RELEASE);
	fprintf(stderr, "%s\n", msg);
}

static int ed_wait_flag(int *flag, int value, int ms)
{
	int64_t deadline = ed_now_ms() + ms;

	while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < value)
		if (ed_now_ms() > deadline)
			return -ETIMEDOUT;
		else
			usleep(1000);
	return 0;
}

#define ED_FAIL(code, ...)                                 \
	do {                                               \
		snprintf(why, sizeof(why), __VA_ARGS__);   \
		fprintf(stderr, "%s\n", why);              \
		if (!sh->why[0])                           \
			memcpy(sh->why, why, sizeof(why)); \
		return code;                               \
	} while (0)

/* one node: form, work; with @victim >= 0, that rank freezes and the others
 * check that a wait on it ends with -FERRY_E_PEER within TTL + BOUND_MS */
static int ed_child(struct ferry_params *p, struct ed_sh *sh, int victim)
{
	struct ferry_table_params tp = { .num_keys = NK, .value_len = 1 };
	struct ferry_worker *w;
	struct ferry_table *t;
	struct ferry *fy;
	char why[256];
	uint64_t key;
	float v = 1;
	int rc, rank, world;

	/* a stopped or stuck node must not outlive a test that failed */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	ed_log_sh = sh;
	ferry_log_set(FERRY_LOG_WARN, ed_log_cb, NULL);
	rc = ferry_open(p, &fy);
	if (rc)
		ED_FAIL(10, "rank %d: open: %s", p->rank, ferry_strerror(rc));
	rank = ferry_rank(fy);
	world = ferry_world(fy);
	__atomic_store_n(&ed_my_rank, rank, __ATOMIC_RELEASE);
	if (!ferry_epoch(fy))
		ED_FAIL(11, "rank %d: membership epoch 0 with etcd", rank);
	rc = ferry_table_create(fy, &tp, &t);
	if (!rc)
		rc = ferry_worker_create(fy, &w);
	if (rc)
		ED_FAIL(12, "rank %d: table: %s", rank, ferry_strerror(rc));
	/* everyone pushes 1 to every key: the cluster works */
	for (key = 0; key < NK && !rc; key += 7)
		rc = ferry_push(w, t, &key, 1, &v);
	if (!rc)
		rc = ferry_barrier(fy);
	if (rc)
		ED_FAIL(13, "rank %d: push: %s", rank, ferry_strerror(rc));
	if (victim < 0) {
		key = 42 * 7; /* pushed by every node; homed on the last */
		rc = ferry_pull(w, t, &key, 1, &v);
		if (rc || v != (float)world)
			ED_FAIL(14, "rank %d: pull: %s, %g", rank, ferry_strerror(rc), v);
		rc = ferry_barrier(fy);
		ferry_worker_destroy(w);
		ferry_table_destroy(t);
		ferry_close(fy);
		return rc ? 15 : 0;
	}
	if (rank == victim) {
		__atomic_store_n(&sh->ready, 1, __ATOMIC_RELEASE);
		for (;;)
			pause();
	}
	if (ed_wait_flag(&sh->killed, 1, 20000))
		ED_FAIL(16, "rank %d: the victim was never stopped", rank);
	sh->epoch_before[rank] = ferry_epoch(fy);
	/* a key homed on the victim: the wait on it must end, with -FERRY_E_PEER */
	key = NK - 1;
	if (ferry_table_home(t, key) != victim)
		ED_FAIL(17, "rank %d: key %llu is not homed on rank %d", rank,
			(unsigned long long)key, victim);
	rc = ferry_pull(w, t, &key, 1, &v);
	sh->detect_ms[rank] = ed_now_ms() - sh->t_kill_ms;
	if (rc != -FERRY_E_PEER)
		ED_FAIL(18, "rank %d: a pull from the dead rank returned %s after %lld ms", rank,
			ferry_strerror(rc), (long long)sh->detect_ms[rank]);
	/* keys homed on the living stay usable */
	key = 0;
	rc = ferry_pull(w, t, &key, 1, &v);
	if (rc)
		ED_FAIL(19, "rank %d: a pull from rank 0 after the death: %s", rank,
			ferry_strerror(rc));
	/* the lease's end reaches this node within the bound, whatever saw it first */
	{
		int64_t deadline = sh->t_kill_ms + TTL * 1000 + BOUND_MS;

		while (ferry_epoch(fy) == sh->epoch_before[rank] && ed_now_ms() < deadline)
			usleep(10000);
		sh->epoch_after[rank] = ferry_epoch(fy);
	}
	/* close only once every survivor is done with the others */
	__atomic_add_fetch(&sh->done, 1, __ATOMIC_ACQ_REL);
	if (ed_wait_flag(&sh->done, world - 1, 20000))
		ED_FAIL(20, "rank %d: the other survivors never finished", rank);
	ferry_worker_destroy(w);
	ferry_table_destroy(t);
	ferry_close(fy);
	return 0;
}

static void ed_params(struct ferry_params *p, const struct etcd_srv *s)
{
	ferry_params_init(p);
	p->transport = FERRY_TRANSPORT_TCP;
	p->timeout_ms = 30000;
	p->etcd_endpoints = s->url;
	p->etcd_ttl = TTL;
	/* etcd is the liveness source under test: the heartbeat (1 s by
	 * default) would fail a stopped node before its lease ends */
	p->heartbeat_ms = -1;
}

static void ed_procs(int victim, int sig)
{
	struct ed_sh *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ferry_params p;
	struct etcd_srv s;
	pid_t pids[3];
	int rc;

	cr_assert_neq(sh, MAP_FAILED);
	ed_up(&s);
	ed_params(&p, &s);
	rc = ferry_local_cluster_fork(3, &p, pids);
	if (rc >= 0 && rc < 3)
		_exit(ed_child(&p, sh, victim));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	if (victim >= 0) {
		cr_assert_eq(ed_wait_flag(&sh->ready, 1, 30000), 0,
			     "the victim never got ready: %s", sh->why);
		sh->t_kill_ms = ed_now_ms();
		if (sig == SIGSTOP)
			tc_stop_proc(pids[victim]);
		else
			kill(pids[victim], sig);
		__atomic_store_n(&sh->killed, 1, __ATOMIC_RELEASE);
	}
	if (sig == SIGSTOP) {
		/* the survivors are through; the stopped one would never exit */
		ed_wait_flag(&sh->done, 2, 60000);
		kill(pids[victim], SIGKILL);
	}
	tc_wait_procs(pids, 3, victim, sh->why);
	for (int r = 0; victim >= 0 && r < 3; r++) {
		if (r == victim)
			continue;
		cr_log_info("rank %d: the wait on the dead rank ended %lld ms after the %s", r,
			    (long long)sh->detect_ms[r], sig == SIGKILL ? "SIGKILL" : "SIGSTOP");
		cr_assert_leq(sh->detect_ms[r], TTL * 1000 + BOUND_MS,
			      "rank %d declared the victim dead after %lld ms", r,
			      (long long)sh->detect_ms[r]);
		cr_assert_gt(sh->epoch_after[r], sh->epoch_before[r],
			     "rank %d never saw the victim's key go (epoch %llu)", r,
			     (unsigned long long)sh->epoch_after[r]);
		if (sig == SIGSTOP)
			/* the stopped node's connections stay up: only etcd could tell */
			cr_assert(sh->saw_left[r], "rank %d: no 'left the cluster' line", r);
	}
#ifdef FERRY_HAVE_ETCD
	if (victim < 0)
		cr_assert_eq(ed_count_keys(&s), 0, "the nodes' keys stayed in etcd after close");
#endif
	ed_down(&s);
	munmap(sh, sizeof(*sh));
}

Test(etcd, processes_form_a_cluster_and_leave_no_key_behind, .timeout = 120)
{
	ed_skip_unless_available();
	ed_procs(-1, 0);
}

Test(etcd, a_sigkilled_node_is_declared_dead_within_the_ttl, .timeout = 120)
{
	ed_skip_unless_available();
	ed_procs(2, SIGKILL);
}

Test(etcd, a_sigstopped_node_is_declared_dead_within_the_ttl, .timeout = 120)
{
	ed_skip_unless_available();
	ed_procs(2, SIGSTOP);
}

Test(etcd, threads_form_a_cluster, .timeout = 120)
{
	struct ferry_params p;
	struct ferry *fys[3];
	struct etcd_srv s;
	int rc;

	ed_skip_unless_available();
	ed_up(&s);
	ed_params(&p, &s);
	rc = ferry_local_cluster_open(3, &p, fys);
	cr_assert_eq(rc, 0, "open: %s", ferry_strerror(rc));
	for (int i = 0; i < 3; i++)
		cr_assert_gt(ferry_epoch(fys[i]), 0, "rank %d: epoch 0", i);
#ifdef FERRY_HAVE_ETCD
	cr_assert_eq(ed_count_keys(&s), 3, "not every node's key is in etcd");
#endif
	for (int i = 0; i < 3; i++)
		ferry_close(fys[i]);
#ifdef FERRY_HAVE_ETCD
	cr_assert_eq(ed_count_keys(&s), 0, "the nodes' keys stayed in etcd after close");
#endif
	ed_down(&s);
}

static char ed_log[8192];
static size_t ed_log_len;
static pthread_mutex_t ed_log_lock = PTHREAD_MUTEX_INITIALIZER;

static void ed_capture(enum ferry_log_level level, const char *msg, void *arg)
{
	size_t n = strlen(msg);

	pthread_mutex_lock(&ed_log_lock);
	if (ed_log_len + n + 2 < sizeof(ed_log)) {
		memcpy(ed_log + ed_log_len, msg, n);
		ed_log_len += n;
		ed_log[ed_log_len++] = '\n';
		ed_log[ed_log_len] = 0;
	}
	pthread_mutex_unlock(&ed_log_lock);
}

Test(etcd, unreachable_etcd_at_start_is_a_clear_error, .timeout = 60)
{
	struct ferry_params p;
	struct ferry *fys[2];
	char url[64];
	int rc;

#ifndef FERRY_HAVE_ETCD
	cr_skip_test("libferry was built without libcurl: no etcd manager");
#endif
	/* a port nobody listens on */
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", ed_free_port());
	ferry_params_init(&p);
	p.transport = FERRY_TRANSPORT_TCP;
	p.timeout_ms = 10000;
	p.etcd_endpoints = url;
	ferry_log_set(FERRY_LOG_ERROR, ed_capture, NULL);
	rc = ferry_local_cluster_open(2, &p, fys);
	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL);
	cr_assert_eq(rc, -ECONNREFUSED, "open returned %d (%s)", rc, ferry_strerror(rc));
	cr_assert(strstr(ed_log, "cannot reach etcd") && strstr(ed_log, url),
		  "no log line says etcd at %s is unreachable:\n%s", url, ed_log);
}

struct ed_bar {
	struct ferry *fy;
	int rc;
};

static void *ed_barrier_thread(void *arg)
{
	struct ed_bar *b = arg;

	b->rc = ferry_barrier(b->fy);
	return NULL;
}

/* a barrier of @n nodes of this process; 0 or the first error */
static int ed_barrier(struct ferry **fys, int n)
{
	struct ed_bar b[3];
	pthread_t th[3];
	int rc = 0;

	for (int i = 0; i < n; i++) {
		b[i] = (struct ed_bar){ .fy = fys[i] };
		pthread_create(&th[i], NULL, ed_barrier_thread, &b[i]);
	}
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		if (b[i].rc && !rc)
			rc = b[i].rc;
	}
	return rc;
}

/*
 * etcd restarts under a running cluster (same folder and ports): nobody is
 * declared dead past 2 TTLs, and the watch comes back: a node that closes
 * afterwards is seen to go (the others' epoch grows).
 */
Test(etcd, an_etcd_restart_kills_nobody_and_the_watch_comes_back, .timeout = 120)
{
	struct ferry_params p;
	struct ferry *fys[3];
	struct etcd_srv s;
	uint64_t before;
	int64_t deadline;
	int rc;

	ed_skip_unless_available();
	ed_up(&s);
	ed_params(&p, &s);
	rc = ferry_local_cluster_open(3, &p, fys);
	cr_assert_eq(rc, 0, "open: %s", ferry_strerror(rc));
	ed_stop(&s);
	usleep(500000);
	ed_spawn(&s);
	usleep(2 * TTL * 1000000);
	rc = ed_barrier(fys, 3);
	cr_assert_eq(rc, 0, "a barrier after etcd restarted: %s (a node was declared dead?)",
		     ferry_strerror(rc));
	before = ferry_epoch(fys[0]);
	ferry_close(fys[2]);
	deadline = ed_now_ms() + TTL * 1000 + BOUND_MS;
	while (ferry_epoch(fys[0]) == before && ed_now_ms() < deadline)
		usleep(10000);
	cr_assert_gt(ferry_epoch(fys[0]), before,
		     "rank 0 never saw rank 2's key go after etcd restarted");
	ferry_close(fys[0]);
	ferry_close(fys[1]);
	ed_down(&s);
}

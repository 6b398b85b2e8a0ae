/* SPDX-License-Identifier: MIT */
/*
 * Integration: checkpoints (lib/ckpt/). A checkpoint taken in the middle of
 * training (pushes and localizes before it, more pushes right after its
 * mark, while the shards are written) and restored into 2 and into 4 nodes
 * reads back exactly the sum of the pushes before the mark; as threads and
 * as processes, dense and sparse. Corrupt, truncated, missing and
 * mismatched checkpoints are refused on every node, with a log line naming
 * the file, and leave the table as it was.
 *
 * Every delta is a small integer, so a key's sum is exact in any order, and
 * each rank's pushes are a function of (rank, step): any process can
 * compute what the checkpoint must hold.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cluster.h"

#define NK 2000	   /* dense keys */
#define VLEN 4	   /* floats per key */
#define BATCH 32   /* keys per push */
#define STEPS 30   /* training steps */
#define CK_STEP 17 /* the checkpoint is marked before this step */
#define POOL 300   /* sparse keys in use */

struct ck_cfg {
	int sparse;
	const char *dir;
	int train_world;
	int err_expect; /* restore: the error every node must return (0: success) */
};

static void ck_params(struct ferry_table_params *tp, int sparse, enum ferry_placement pl)
{
	memset(tp, 0, sizeof(*tp));
	tp->value_len = VLEN;
	tp->placement = pl;
	if (sparse)
		tp->sparse = 1;
	else
		tp->num_keys = NK;
}

static uint64_t ck_pool_key(uint64_t i)
{
	uint64_t s = (i + 1) * 0x9e3779b97f4a7c15ull;

	return tc_rand(&s);
}

/* rank @r's push of step @s: keys and integer deltas */
static void ck_step_ops(int sparse, int r, int s, uint64_t *keys, float *deltas)
{
	uint64_t seed = (uint64_t)(r + 1) * 1000003u + (uint64_t)s * 7919u + 1;

	for (int i = 0; i < BATCH; i++) {
		uint64_t x = tc_rand(&seed);

		keys[i] = sparse ? ck_pool_key(x % POOL) : x % NK;
		for (int j = 0; j < VLEN; j++)
			deltas[i * VLEN + j] = (float)((int)(tc_rand(&seed) % 7) - 3);
	}
}

/* the keys a test reads back, and what the checkpoint must hold for them */
static uint64_t ck_key(int sparse, uint64_t i)
{
	return sparse ? ck_pool_key(i) : i;
}

static void ck_expected(int sparse, int world, float *exp)
{
	uint64_t nk = sparse ? POOL : NK, keys[BATCH];
	float d[BATCH * VLEN];

	memset(exp, 0, nk * VLEN * sizeof(float));
	for (int r = 0; r < world; r++)
		for (int s = 0; s < CK_STEP; s++) {
			ck_step_ops(sparse, r, s, keys, d);
			for (int i = 0; i < BATCH; i++) {
				uint64_t idx = keys[i];

				if (sparse)
					for (idx = 0; ck_pool_key(idx) != keys[i]; idx++)
						;
				for (int j = 0; j < VLEN; j++)
					exp[idx * VLEN + j] += d[i * VLEN + j];
			}
		}
}

/* one node's training, with a checkpoint marked before step CK_STEP */
static int ck_train(struct ferry *fy, struct ferry_table *t, const struct ck_cfg *cfg)
{
	struct ferry_worker *w;
	struct ferry_checkpoint *ck = NULL;
	uint64_t keys[BATCH];
	float d[BATCH * VLEN];
	int r = ferry_rank(fy), rc;

	rc = ferry_worker_create(fy, &w);
	if (rc)
		return rc;
	for (int s = 0; s < STEPS && !rc; s++) {
		if (s == CK_STEP)
			rc = ferry_table_checkpoint_start(t, cfg->dir, &ck);
		ck_step_ops(cfg->sparse, r, s, keys, d);
		if (!rc)
			rc = ferry_push(w, t, keys, BATCH, d);
		/* moves: a few of this step's keys come here */
		if (!rc && s % 3 == r % 3)
			rc = ferry_localize(w, t, keys, 4);
	}
	/* the shard was written while the steps after the mark ran */
	if (!rc && ck)
		rc = ferry_checkpoint_wait(ck);
	if (!rc)
		rc = ferry_barrier(fy);
	ferry_worker_destroy(w);
	return rc;
}

/* pull every key of the test and compare with @exp; 0 or the first bad key + 1 */
static int ck_verify(struct ferry *fy, struct ferry_table *t, int sparse, const float *exp,
		     char *why, size_t whylen)
{
	uint64_t nk = sparse ? POOL : NK;
	struct ferry_worker *w;
	float v[VLEN];
	int rc = ferry_worker_create(fy, &w);

	if (rc)
		return rc;
	for (uint64_t i = 0; i < nk && !rc; i++) {
		uint64_t k = ck_key(sparse, i);

		rc = ferry_pull(w, t, &k, 1, v);
		if (rc) {
			snprintf(why, whylen, "pull of key %llu: %s", (unsigned long long)k,
				 ferry_strerror(rc));
			break;
		}
		if (memcmp(v, exp + i * VLEN, sizeof(v))) {
			snprintf(why, whylen,
				 "rank %d: key %llu reads %g %g %g %g, expected %g %g %g %g",
				 ferry_rank(fy), (unsigned long long)k, v[0], v[1], v[2], v[3],
				 exp[i * VLEN], exp[i * VLEN + 1], exp[i * VLEN + 2],
				 exp[i * VLEN + 3]);
			rc = 1;
		}
	}
	ferry_worker_destroy(w);
	return rc;
}

/* ---- as threads --------------------------------------------------------- */

struct ck_targ {
	struct ck_cfg *cfg;
	const float *exp;
	char why[TC_MAX][256];
	int rcs[TC_MAX];
};

static int ck_train_fn(struct tc *c, int rank, void *arg)
{
	struct ck_targ *a = arg;

	return ck_train(c->fy[rank], c->t[rank], a->cfg);
}

/*
 * A sparse key the checkpoint does not hold, written before the restore
 * (@check 0: every node pushes 1 to it), must read as its initial value
 * (0) after it (@check 1). Return: 0, 1 (it does not), or an error.
 */
static int ck_touch_stray(struct ferry *fy, struct ferry_table *t, int check)
{
	const uint64_t stray = 77; /* not a pool key: the pool's are 64-bit hashes */
	float one[VLEN] = { 1, 1, 1, 1 }, v[VLEN];
	struct ferry_worker *w;
	int rc = ferry_worker_create(fy, &w);

	if (rc)
		return rc;
	if (!check) {
		rc = ferry_push(w, t, &stray, 1, one);
		if (!rc)
			rc = ferry_barrier(fy);
	} else {
		rc = ferry_pull(w, t, &stray, 1, v);
		if (!rc && (v[0] || v[1] || v[2] || v[3]))
			rc = 1;
	}
	ferry_worker_destroy(w);
	return rc;
}

static int ck_restore_fn(struct tc *c, int rank, void *arg)
{
	struct ck_targ *a = arg;
	int rc = 0;

	if (a->cfg->sparse)
		rc = ck_touch_stray(c->fy[rank], c->t[rank], 0);
	if (!rc)
		rc = ferry_table_restore(c->t[rank], a->cfg->dir);
	a->rcs[rank] = rc;
	if (rc) {
		snprintf(a->why[rank], sizeof(a->why[rank]), "rank %d: restore: %s", rank,
			 ferry_strerror(rc));
		return rc;
	}
	if (a->cfg->sparse)
		rc = ck_touch_stray(c->fy[rank], c->t[rank], 1);
	if (rc) {
		snprintf(a->why[rank], sizeof(a->why[rank]),
			 "rank %d: a sparse key that is not in the checkpoint %s", rank,
			 rc == 1 ? "kept its value through the restore" : ferry_strerror(rc));
		return rc;
	}
	rc = ck_verify(c->fy[rank], c->t[rank], a->cfg->sparse, a->exp, a->why[rank],
		       sizeof(a->why[rank]));
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	return rc;
}

static char *ck_tmpdir(void)
{
	char *d = strdup("/tmp/ferry-ckpt-XXXXXX");

	cr_assert(d && mkdtemp(d));
	return d;
}

static void ck_rmdir(char *d)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	cr_assert_eq(system(cmd), 0);
	free(d);
}

static void ck_threads(int sparse)
{
	struct ferry_table_params tp;
	struct ck_cfg cfg = { .sparse = sparse, .train_world = 4 };
	struct ck_targ a = { .cfg = &cfg };
	uint64_t nk = sparse ? POOL : NK;
	float *exp = calloc(nk * VLEN, sizeof(float));
	struct tc c;
	int rc;

	cr_assert(exp);
	cfg.dir = ck_tmpdir();
	ck_expected(sparse, 4, exp);
	a.exp = exp;
	ck_params(&tp, sparse, FERRY_PLACEMENT_RANGE);
	cr_assert_eq(tc_open(&c, 4, &tp, 20000), 0);
	rc = tc_run(&c, ck_train_fn, &a);
	cr_assert_eq(rc, 0, "training: %s", ferry_strerror(rc));
	tc_close(&c);
	/* into 2 nodes, hash-placed, and into 4 */
	for (int n = 2; n <= 4; n += 2) {
		ck_params(&tp, sparse, n == 2 ? FERRY_PLACEMENT_HASH : FERRY_PLACEMENT_RANGE);
		cr_assert_eq(tc_open(&c, n, &tp, 20000), 0);
		memset(a.why, 0, sizeof(a.why));
		rc = tc_run(&c, ck_restore_fn, &a);
		for (int i = 0; i < n; i++)
			cr_assert_eq(a.why[i][0], 0, "into %d nodes: %s", n, a.why[i]);
		cr_assert_eq(rc, 0, "into %d nodes: %s", n, ferry_strerror(rc));
		tc_close(&c);
	}
	ck_rmdir((char *)cfg.dir);
	free(exp);
}

Test(ckpt, threads_dense_taken_in_training_restores_into_2_and_4_nodes, .timeout = 120)
{
	ck_threads(0);
}

Test(ckpt, threads_sparse_taken_in_training_restores_into_2_and_4_nodes, .timeout = 120)
{
	ck_threads(1);
}

/* ---- per-key value lengths ------------------------------------------------ */

#define VL_KEYS 500
static uint32_t vl_lens[VL_KEYS];

static float vl_val(uint64_t key, uint32_t j)
{
	return (float)(key * 10 + j);
}

/* @check 0: set every key (each node a share); 1: read every key back */
static int vl_fn(struct tc *c, int rank, void *arg)
{
	const char *dir = arg;
	struct ferry_worker *w;
	float v[64];
	int rc = ferry_worker_create(c->fy[rank], &w);

	for (uint64_t k = (uint64_t)rank; !rc && k < VL_KEYS; k += (uint64_t)c->n) {
		for (uint32_t j = 0; j < vl_lens[k]; j++)
			v[j] = vl_val(k, j);
		rc = ferry_set(w, c->t[rank], &k, 1, v);
	}
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	if (!rc)
		rc = ferry_table_checkpoint(c->t[rank], dir);
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	ferry_worker_destroy(w);
	return rc;
}

static int vl_check_fn(struct tc *c, int rank, void *arg)
{
	const char *dir = arg;
	struct ferry_worker *w;
	float v[64];
	int rc = ferry_table_restore(c->t[rank], dir);

	if (!rc)
		rc = ferry_worker_create(c->fy[rank], &w);
	if (rc)
		return rc;
	for (uint64_t k = 0; !rc && k < VL_KEYS; k++) {
		rc = ferry_pull(w, c->t[rank], &k, 1, v);
		for (uint32_t j = 0; !rc && j < vl_lens[k]; j++)
			if (v[j] != vl_val(k, j))
				rc = 1000 + (int)k;
	}
	if (!rc)
		rc = ferry_barrier(c->fy[rank]);
	ferry_worker_destroy(w);
	return rc;
}

Test(ckpt, per_key_value_lengths_restore_from_3_into_2_nodes, .timeout = 60)
{
	struct ferry_table_params tp = { .num_keys = VL_KEYS, .value_lens = vl_lens };
	char *dir = ck_tmpdir();
	struct tc c;
	int rc;

	for (uint64_t k = 0; k < VL_KEYS; k++)
		vl_lens[k] = 1 + (uint32_t)(k * 7 % 64);
	cr_assert_eq(tc_open(&c, 3, &tp, 20000), 0);
	rc = tc_run(&c, vl_fn, dir);
	cr_assert_eq(rc, 0, "set and checkpoint: %d (%s)", rc, ferry_strerror(rc));
	tc_close(&c);
	tp.placement = FERRY_PLACEMENT_HASH;
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	rc = tc_run(&c, vl_check_fn, dir);
	cr_assert_eq(rc, 0, "restore: %d (%s)", rc,
		     rc >= 1000 ? "a key read wrong" : ferry_strerror(rc));
	tc_close(&c);
	ck_rmdir(dir);
}

/* ---- as processes -------------------------------------------------------- */

struct ck_shared {
	char why[256];
};

static int ck_child(struct ferry_params *p, struct ck_shared *sh, const struct ck_cfg *cfg,
		    int restore)
{
	struct ferry_table_params tp;
	struct ferry_table *t;
	struct ferry *fy;
	float *exp = NULL;
	char why[256] = "";
	int rc;

	rc = ferry_open(p, &fy);
	if (rc)
		return 10;
	ck_params(&tp, cfg->sparse, FERRY_PLACEMENT_RANGE);
	rc = ferry_table_create(fy, &tp, &t);
	if (rc)
		return 11;
	if (!restore) {
		rc = ck_train(fy, t, cfg);
		if (rc)
			snprintf(why, sizeof(why), "rank %d: training: %s", ferry_rank(fy),
				 ferry_strerror(rc));
	} else {
		exp = calloc((cfg->sparse ? POOL : NK) * VLEN, sizeof(float));
		ck_expected(cfg->sparse, cfg->train_world, exp);
		rc = ferry_table_restore(t, cfg->dir);
		if (rc)
			snprintf(why, sizeof(why), "rank %d: restore: %s", ferry_rank(fy),
				 ferry_strerror(rc));
		else
			rc = ck_verify(fy, t, cfg->sparse, exp, why, sizeof(why));
		if (!rc)
			rc = ferry_barrier(fy);
		free(exp);
	}
	if (rc && why[0])
		memcpy(sh->why, why, sizeof(why));
	ferry_table_destroy(t);
	ferry_close(fy);
	return rc ? 12 : 0;
}

static void ck_procs_run(int n, struct ck_shared *sh, const struct ck_cfg *cfg, int restore)
{
	struct ferry_params p;
	pid_t pids[TC_MAX];
	int rc;

	ferry_params_init(&p);
	p.transport = getenv("FERRY_TRANSPORT") ? FERRY_TRANSPORT_AUTO : FERRY_TRANSPORT_TCP;
	p.timeout_ms = 20000;
	rc = ferry_local_cluster_fork(n, &p, pids);
	if (rc >= 0 && rc < n)
		_exit(ck_child(&p, sh, cfg, restore));
	cr_assert_eq(rc, FERRY_LOCAL_PARENT, "fork: %s", ferry_strerror(rc));
	tc_wait_procs(pids, n, -1, sh->why);
}

static void ck_procs(int sparse)
{
	struct ck_shared *sh =
		mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ck_cfg cfg = { .sparse = sparse, .train_world = 4 };
	char *dir = ck_tmpdir();

	cr_assert_neq(sh, MAP_FAILED);
	cfg.dir = dir;
	ck_procs_run(4, sh, &cfg, 0);
	ck_procs_run(2, sh, &cfg, 1);
	ck_procs_run(4, sh, &cfg, 1);
	ck_rmdir(dir);
	munmap(sh, sizeof(*sh));
}

Test(ckpt, procs_dense_taken_in_training_restores_into_2_and_4_nodes, .timeout = 180)
{
	ck_procs(0);
}

Test(ckpt, procs_sparse_taken_in_training_restores_into_2_and_4_nodes, .timeout = 180)
{
	ck_procs(1);
}

/* ---- bad checkpoints ------------------------------------------------------ */

static pthread_mutex_t ck_log_lock = PTHREAD_MUTEX_INITIALIZER;
static char ck_log[1 << 16];
static size_t ck_log_len;

static void ck_log_cb(enum ferry_log_level level, const char *msg, void *arg)
{
	size_t n = strlen(msg);

	pthread_mutex_lock(&ck_log_lock);
	if (ck_log_len + n + 2 < sizeof(ck_log)) {
		memcpy(ck_log + ck_log_len, msg, n);
		ck_log_len += n;
		ck_log[ck_log_len++] = '\n';
		ck_log[ck_log_len] = 0;
	}
	pthread_mutex_unlock(&ck_log_lock);
}

/* lines of the captured log that hold both @a and @b */
static int ck_log_count(const char *a, const char *b)
{
	int n = 0;

	pthread_mutex_lock(&ck_log_lock);
	for (char *l = ck_log; l && *l;) {
		char *e = strchr(l, '\n');

		*e = 0;
		if (strstr(l, a) && strstr(l, b))
			n++;
		*e = '\n';
		l = e + 1;
	}
	ck_log_len = 0;
	ck_log[0] = 0;
	pthread_mutex_unlock(&ck_log_lock);
	return n;
}

struct ck_bad {
	const char *dir;
	struct ferry_table *t2[TC_MAX]; /* NULL: restore into c->t */
	float *before[TC_MAX];		/* every key's value before the restore */
	int rcs[TC_MAX];
};

static int ck_snap_fn(struct tc *c, int rank, void *arg)
{
	struct ck_bad *b = arg;
	struct ferry_worker *w;
	uint64_t keys[NK];
	int rc = ferry_worker_create(c->fy[rank], &w);

	if (rc)
		return rc;
	for (uint64_t i = 0; i < NK; i++)
		keys[i] = i;
	rc = ferry_pull(w, c->t[rank], keys, NK, b->before[rank]);
	ferry_worker_destroy(w);
	return rc;
}

static int ck_bad_fn(struct tc *c, int rank, void *arg)
{
	struct ck_bad *b = arg;

	b->rcs[rank] = ferry_table_restore(b->t2[rank] ? b->t2[rank] : c->t[rank], b->dir);
	return 0;
}

static int ck_create8_fn(struct tc *c, int rank, void *arg)
{
	struct ck_bad *b = arg;
	struct ferry_table_params tp8;

	ck_params(&tp8, 0, FERRY_PLACEMENT_RANGE);
	tp8.value_len = 8;
	return ferry_table_create(c->fy[rank], &tp8, &b->t2[rank]);
}

static void ck_file(char *path, size_t len, const char *dir, const char *name)
{
	snprintf(path, len, "%s/%s", dir, name);
}

static void ck_copy(const char *from, const char *to)
{
	char cmd[2048];

	snprintf(cmd, sizeof(cmd), "cp -p '%s' '%s'", from, to);
	cr_assert_eq(system(cmd), 0);
}

/* restore must fail with @err on both nodes, say @what about @file on both,
 * and leave every value as it was */
static void ck_refused(struct tc *c, struct ck_bad *b, int err, const char *file, const char *what)
{
	float *after = malloc(NK * VLEN * sizeof(float));

	cr_assert(after);
	cr_assert_eq(tc_run(c, ck_snap_fn, b), 0);
	cr_assert_eq(tc_run(c, ck_bad_fn, b), 0);
	for (int i = 0; i < c->n; i++)
		cr_assert_eq(b->rcs[i], err, "rank %d: restore returned %d (%s), expected %d (%s)",
			     i, b->rcs[i], ferry_strerror(b->rcs[i]), err, ferry_strerror(err));
	cr_assert_geq(ck_log_count(file, what), c->n, "no log line on each node names %s: %s", file,
		      what);
	for (int i = 0; i < c->n; i++) {
		memcpy(after, b->before[i], NK * VLEN * sizeof(float));
		cr_assert_eq(tc_run(c, ck_snap_fn, b), 0);
		cr_assert_eq(memcmp(after, b->before[i], NK * VLEN * sizeof(float)), 0,
			     "a refused restore changed values on rank %d", i);
	}
	free(after);
}

Test(ckpt, corrupt_truncated_missing_and_mismatched_checkpoints_are_refused, .timeout = 180)
{
	struct ferry_table_params tp;
	struct ck_cfg cfg = { .sparse = 0, .train_world = 2 };
	struct ck_targ a = { .cfg = &cfg };
	struct ck_bad b = { 0 };
	char *dir = ck_tmpdir(), path[512], save[512], man[512];
	float *exp = calloc(NK * VLEN, sizeof(float));
	struct tc c;
	int fd;

	cr_assert(exp);
	ferry_log_set(FERRY_LOG_ERROR, ck_log_cb, NULL);
	cfg.dir = dir;
	b.dir = dir;
	ck_params(&tp, 0, FERRY_PLACEMENT_RANGE);
	cr_assert_eq(tc_open(&c, 2, &tp, 20000), 0);
	for (int i = 0; i < 2; i++)
		b.before[i] = malloc(NK * VLEN * sizeof(float));
	/* a checkpoint, then training goes on past it */
	cr_assert_eq(tc_run(&c, ck_train_fn, &a), 0);
	ck_file(path, sizeof(path), dir, "shard-1-of-2.fck");
	snprintf(save, sizeof(save), "%s/saved", dir);
	ck_file(man, sizeof(man), dir, "manifest.json");
	ck_copy(path, save);

	/* a byte changed in a value */
	fd = open(path, O_RDWR);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, "\x7f", 1, 64 + 16 + 3), 1);
	close(fd);
	ck_refused(&c, &b, -EBADMSG, path, "corrupt");
	ck_copy(save, path);

	/* cut short */
	cr_assert_eq(truncate(path, 1000), 0);
	ck_refused(&c, &b, -EBADMSG, path, "truncated");
	ck_copy(save, path);

	/* a shard gone */
	cr_assert_eq(unlink(path), 0);
	ck_refused(&c, &b, -ENOENT, path, "cannot open");
	ck_copy(save, path);

	/* a manifest that is not JSON */
	ck_copy(man, save);
	fd = open(man, O_WRONLY | O_TRUNC);
	cr_assert_eq(write(fd, "{\"format\": ", 11), 11);
	close(fd);
	ck_refused(&c, &b, -EBADMSG, man, "corrupt");
	/* no manifest: a checkpoint that never finished */
	cr_assert_eq(unlink(man), 0);
	ck_refused(&c, &b, -ENOENT, man, "no checkpoint");
	ck_copy(save, man);

	/* into a table of another value length */
	cr_assert_eq(tc_run(&c, ck_create8_fn, &b), 0);
	ck_refused(&c, &b, -FERRY_E_MISMATCH, man, "value_len");
	for (int i = 0; i < 2; i++) {
		ferry_table_destroy(b.t2[i]);
		b.t2[i] = NULL;
	}

	/* the good checkpoint still loads, over the values trained past it */
	ck_expected(0, 2, exp);
	a.exp = exp;
	cr_assert_eq(tc_run(&c, ck_restore_fn, &a), 0, "%s %s", a.why[0], a.why[1]);
	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL);
	tc_close(&c);
	for (int i = 0; i < 2; i++)
		free(b.before[i]);
	free(exp);
	ck_rmdir(dir);
}

/* SPDX-License-Identifier: MIT */
/*
 * ckpt.c - ferry_table_checkpoint: a consistent snapshot of a table, each
 * node writing its own shard (layout: ckpt.h).
 *
 *   every node                                   rank 0
 *   ----------                                   ------
 *   mkdir dir                                    unlink dir/manifest.json
 *   barrier A: every node stopped operating on the table, so every
 *              acknowledged operation is applied where its key lives
 *   mark: holding off dir.own's writers, copy each owned key's value (a seqlock read)
 *         into one buffer laid out as the shard's records
 *   barrier B: every node marked; ferry_table_checkpoint_start returns and
 *              training goes on (what it does now is not in the copies)
 *   writer thread: header + buffer -> .tmp, XXH3-64 as it goes, fsync, rename
 *   ferry_checkpoint_wait: join; all-reduce {status, keys, bytes, xxh3}
 *              per rank -> every node knows every shard
 *                                                write manifest.json (.tmp,
 *                                                fsync, rename, fsync dir)
 *   broadcast rank 0's status: every node returns the same result
 *
 * Why a copy and not copy-on-write per slot: the copy is one pass of
 * memcpy over what the node owns (ferry-ckpt measures it against the
 * write), and it keeps the push path free of any checkpoint test.
 *
 * Memory: the copy holds every value this node owns (16 bytes of record
 * header per key, plus the value) from the mark until the shard is written.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "lib/ckpt/ckpt.h"
#include "lib/ckpt/ckpt_int.h"
#include "lib/core/core.h"

struct ferry_checkpoint {
	struct ferry_table *t;
	char *dir;
	pthread_t writer;
	bool writer_started;
	/* the mark: records back to back (ckpt.h), then the writer's results */
	uint8_t *buf;
	size_t len, cap;
	uint64_t keys;
	uint64_t skipped; /* keys found not live at the mark */
	int status;	  /* the writer's */
	uint64_t bytes, xxh3;
	double mark_ms;
};

static int64_t ckpt_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int ckpt_reserve(struct ferry_checkpoint *ck, size_t more)
{
	size_t cap = ck->cap ? ck->cap : 1u << 16;
	uint8_t *b;

	if (ck->len + more <= ck->cap)
		return 0;
	while (cap < ck->len + more)
		cap *= 2;
	b = realloc(ck->buf, cap);
	if (!b)
		return -ENOMEM;
	ck->buf = b;
	ck->cap = cap;
	return 0;
}

/* one owned key into the copy; own's writers held off (ferry__dir_own_lock),
 * so nothing publishes or unpublishes into the map meanwhile */
static int ckpt_copy_one(struct ferry_checkpoint *ck, uint64_t key, const struct ferry_slot *s)
{
	struct ferry_table *t = ck->t;
	uint32_t len = ferry__value_len(t, key);
	struct ferry_ckpt_rec rec = { .key = key, .len = len };
	int rc = ckpt_reserve(ck, sizeof(rec) + (size_t)len * sizeof(float));

	if (rc)
		return rc;
	if (ferry__slot_read(s, key, (float *)(ck->buf + ck->len + sizeof(rec)), len)) {
		/* moved or moving: an operation is still under way */
		ck->skipped++;
		return 0;
	}
	memcpy(ck->buf + ck->len, &rec, sizeof(rec));
	ck->len += sizeof(rec) + (size_t)len * sizeof(float);
	ck->keys++;
	return 0;
}

struct ckpt_each {
	struct ferry_checkpoint *ck;
	int rc;
};

static void ckpt_each_fn(void *arg, uint64_t key, void *slot)
{
	struct ckpt_each *e = arg;

	if (!e->rc)
		e->rc = ckpt_copy_one(e->ck, key, slot);
}

static int ckpt_mark(struct ferry_checkpoint *ck)
{
	struct ferry_dir *d = &ck->t->dir;
	struct ckpt_each e = { .ck = ck };
	uint64_t n;

	ferry__dir_own_lock(d);
	n = ferry__dir_own_count(d);
	/* the size: exact for a table of one value_len; with value_lens the
	 * headers only (one long value must not make every key count as long),
	 * and the buffer doubles as it fills */
	e.rc = ckpt_reserve(ck, n * (sizeof(struct ferry_ckpt_rec) +
				     (ck->t->value_lens ? 0 : ck->t->max_len * 4ull)));
	if (!e.rc)
		ferry__dir_own_each(d, ckpt_each_fn, &e);
	ferry__dir_own_unlock(d);
	if (e.rc == -ENOMEM)
		ferry_err("checkpoint: table %u: out of memory copying the %" PRIu64
			  " keys rank %u owns (%zu bytes so far); free memory or checkpoint "
			  "with more nodes",
			  ck->t->id, n, ck->t->fy->rank, ck->len);
	if (!e.rc && ck->skipped) {
		ferry_err("checkpoint: table %u: %" PRIu64 " keys of rank %u were moving at the "
			  "mark; every node must finish its operations on the table (wait for "
			  "every ticket) before it calls ferry_table_checkpoint_start",
			  ck->t->id, ck->skipped, ck->t->fy->rank);
		e.rc = -EBUSY;
	}
	return e.rc;
}

/* write @len bytes at the file's position, hashing them; 0 or -errno */
static int ckpt_write_all(int fd, const void *p, size_t len, XXH3_state_t *h)
{
	const uint8_t *b = p;

	if (XXH3_64bits_update(h, p, len) != XXH_OK)
		return -EINVAL;
	while (len) {
		ssize_t w = write(fd, b, len > (1u << 30) ? 1u << 30 : len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		b += w;
		len -= (size_t)w;
	}
	return 0;
}

int ferry__ckpt_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd))
		rc = -errno;
	close(fd);
	return rc;
}

static void *ckpt_writer(void *arg)
{
	struct ferry_checkpoint *ck = arg;
	struct ferry_table *t = ck->t;
	struct ferry *fy = t->fy;
	struct ferry_ckpt_hdr hdr;
	char path[PATH_MAX], tmp[PATH_MAX];
	XXH3_state_t *h = XXH3_createState();
	int fd = -1, rc;

	snprintf(path, sizeof(path), "%s/shard-%u-of-%u.fck", ck->dir, fy->rank, fy->world);
	snprintf(tmp, sizeof(tmp), "%s/.shard-%u-of-%u.fck.tmp", ck->dir, fy->rank, fy->world);
	if (!h) {
		rc = -ENOMEM;
		goto out;
	}
	XXH3_64bits_reset(h);
	memset(&hdr, 0, sizeof(hdr));
	memcpy(hdr.magic, FERRY_CKPT_MAGIC, sizeof(hdr.magic));
	hdr.version = FERRY_CKPT_VERSION;
	hdr.rank = fy->rank;
	hdr.world = fy->world;
	hdr.value_len = t->wire.value_len;
	hdr.keys = ck->keys;
	hdr.num_keys = t->wire.num_keys;
	hdr.lens_hash = t->wire.lens_hash;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	rc = ckpt_write_all(fd, &hdr, sizeof(hdr), h);
	if (!rc)
		rc = ckpt_write_all(fd, ck->buf, ck->len, h);
	if (!rc && fsync(fd))
		rc = -errno;
	if (close(fd) && !rc)
		rc = -errno;
	fd = -1;
	if (!rc && rename(tmp, path))
		rc = -errno;
	if (!rc)
		rc = ferry__ckpt_fsync_dir(ck->dir);
	if (!rc) {
		ck->bytes = sizeof(hdr) + ck->len;
		ck->xxh3 = XXH3_64bits_digest(h);
	}
out:
	if (rc) {
		ferry_err("checkpoint: rank %u could not write %s: %s; check that the folder is "
			  "writable and the disk has room",
			  fy->rank, path, strerror(-rc));
		unlink(tmp);
		rc = -EIO;
	}
	XXH3_freeState(h);
	free(ck->buf);
	ck->buf = NULL;
	ck->status = rc;
	return NULL;
}

static void ckpt_free(struct ferry_checkpoint *ck)
{
	free(ck->buf);
	free(ck->dir);
	free(ck);
}

int ferry_table_checkpoint_start(struct ferry_table *t, const char *dir,
				 struct ferry_checkpoint **ck_p)
{
	struct ferry_checkpoint *ck;
	struct ferry *fy;
	char man[PATH_MAX];
	int64_t t0;
	int rc, lrc = 0;

	if (!t || !dir || !*dir || !ck_p)
		return -EINVAL;
	fy = t->fy;
	if (t->params.hot_count || t->params.hot_auto) {
		ferry_err("checkpoint: table %u has hot keys, whose replicas a checkpoint does "
			  "not hold yet; checkpoint a table without hot_keys",
			  t->id);
		return -EOPNOTSUPP;
	}
	if (strlen(dir) + 64 > PATH_MAX) {
		ferry_err("checkpoint: folder name too long (%zu bytes)", strlen(dir));
		return -EINVAL;
	}
	ck = calloc(1, sizeof(*ck));
	if (!ck || !(ck->dir = strdup(dir))) {
		free(ck);
		return -ENOMEM;
	}
	ck->t = t;
	if (mkdir(dir, 0777) && errno != EEXIST) {
		lrc = -errno;
		ferry_err("checkpoint: rank %u cannot make the folder %s: %s", fy->rank, dir,
			  strerror(-lrc));
	}
	if (!lrc && fy->rank == 0) {
		/* no manifest while the shards change: a crash leaves no checkpoint
		 * that looks whole */
		snprintf(man, sizeof(man), "%s/%s", dir, FERRY_CKPT_MANIFEST);
		if (unlink(man) && errno != ENOENT) {
			lrc = -errno;
			ferry_err("checkpoint: rank 0 cannot remove the old %s: %s", man,
				  strerror(-lrc));
		}
	}
	/* A: every node stopped; every acknowledged operation is applied */
	rc = ferry_barrier(fy);
	if (rc)
		goto err;
	t0 = ckpt_now_ns();
	if (!lrc)
		lrc = ckpt_mark(ck);
	ck->mark_ms = (double)(ckpt_now_ns() - t0) / 1e6;
	/* B: every node marked; a failure anywhere fails everywhere */
	{
		int64_t st = lrc, all = 0;

		rc = ferry_allreduce(fy, &st, &all, 1, FERRY_INT64, FERRY_MIN);
		if (!rc && all)
			rc = lrc ? lrc : (int)all;
	}
	if (rc)
		goto err;
	rc = pthread_create(&ck->writer, NULL, ckpt_writer, ck);
	if (rc) {
		/* write here instead: slower, but the checkpoint is not lost */
		ckpt_writer(ck);
	} else {
		ck->writer_started = true;
	}
	ferry_dbg("checkpoint: table %u: rank %u marked %" PRIu64 " keys (%zu bytes) in %.3f ms",
		  t->id, fy->rank, ck->keys, ck->len, ck->mark_ms);
	*ck_p = ck;
	return 0;
err:
	ckpt_free(ck);
	return rc;
}

/* rank 0: the manifest, from every shard's figures */
static int ckpt_manifest(struct ferry_checkpoint *ck, const int64_t *all)
{
	struct ferry_table *t = ck->t;
	struct ferry *fy = t->fy;
	char path[PATH_MAX], tmp[PATH_MAX], name[64];
	json_t *root, *shards;
	uint64_t total = 0;
	int rc = 0;

	root = json_object();
	shards = json_array();
	if (!root || !shards) {
		json_decref(root);
		json_decref(shards);
		return -ENOMEM;
	}
	for (uint32_t r = 0; r < fy->world; r++) {
		const int64_t *e = &all[4 * r];
		char hex[17];

		snprintf(name, sizeof(name), "shard-%u-of-%u.fck", r, fy->world);
		snprintf(hex, sizeof(hex), "%016" PRIx64, (uint64_t)e[3]);
		total += (uint64_t)e[1];
		if (json_array_append_new(shards,
					  json_pack("{s:i, s:s, s:I, s:I, s:s}", "rank", (int)r,
						    "file", name, "keys", (json_int_t)e[1], "bytes",
						    (json_int_t)e[2], "xxh3", hex)))
			rc = -ENOMEM;
	}
	if (!rc && (json_object_set_new(root, "format", json_string(FERRY_CKPT_FORMAT)) ||
		    json_object_set_new(root, "version", json_integer(FERRY_CKPT_VERSION)) ||
		    json_object_set_new(root, "table", ferry__ckpt_table_json(t)) ||
		    json_object_set_new(root, "nodes", json_integer(fy->world)) ||
		    json_object_set_new(root, "keys", json_integer((json_int_t)total)) ||
		    json_object_set(root, "shards", shards)))
		rc = -ENOMEM;
	json_decref(shards);
	snprintf(path, sizeof(path), "%s/%s", ck->dir, FERRY_CKPT_MANIFEST);
	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", ck->dir, FERRY_CKPT_MANIFEST);
	if (!rc) {
		int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

		if (fd < 0) {
			rc = -errno;
		} else {
			if (json_dumpfd(root, fd, JSON_INDENT(1) | JSON_SORT_KEYS))
				rc = -EIO;
			if (!rc && (write(fd, "\n", 1) != 1 || fsync(fd)))
				rc = -errno;
			if (close(fd) && !rc)
				rc = -errno;
			if (!rc && rename(tmp, path))
				rc = -errno;
			if (!rc)
				rc = ferry__ckpt_fsync_dir(ck->dir);
			if (rc)
				unlink(tmp);
		}
	}
	json_decref(root);
	if (rc) {
		ferry_err("checkpoint: rank 0 could not write %s: %s; check that the folder is "
			  "writable and the disk has room",
			  path, strerror(-rc));
		return -EIO;
	}
	return 0;
}

int ferry_checkpoint_wait(struct ferry_checkpoint *ck)
{
	struct ferry *fy;
	int64_t *mine, *all, st;
	int rc;

	if (!ck)
		return -EINVAL;
	fy = ck->t->fy;
	if (ck->writer_started)
		pthread_join(ck->writer, NULL);
	mine = calloc(4ull * fy->world, sizeof(*mine));
	all = calloc(4ull * fy->world, sizeof(*all));
	if (!mine || !all) {
		/* the others wait out their timeout: nothing else to do without memory */
		free(mine);
		free(all);
		ckpt_free(ck);
		return -ENOMEM;
	}
	mine[4 * fy->rank] = ck->status;
	mine[4 * fy->rank + 1] = (int64_t)ck->keys;
	mine[4 * fy->rank + 2] = (int64_t)ck->bytes;
	mine[4 * fy->rank + 3] = (int64_t)ck->xxh3;
	rc = ferry_allreduce(fy, mine, all, 4ull * fy->world, FERRY_INT64, FERRY_SUM);
	if (rc)
		goto out;
	st = 0;
	for (uint32_t r = 0; r < fy->world; r++)
		if (all[4 * r] && !st)
			st = all[4 * r];
	if (fy->rank == 0 && !st)
		st = ckpt_manifest(ck, all);
	rc = ferry_broadcast(fy, &st, 1, FERRY_INT64, 0);
	if (!rc)
		rc = (int)st;
out:
	free(mine);
	free(all);
	ckpt_free(ck);
	return rc;
}

int ferry_table_checkpoint(struct ferry_table *t, const char *dir)
{
	struct ferry_checkpoint *ck;
	int rc = ferry_table_checkpoint_start(t, dir, &ck);

	return rc ? rc : ferry_checkpoint_wait(ck);
}

/* the fields a restore must match come first in the list restore.c checks
 * (ferry__ckpt_table_json's keys); placement, mode and vnodes are recorded
 * for people, not checked: a checkpoint loads under any placement */
json_t *ferry__ckpt_table_json(const struct ferry_table *t)
{
	const struct ferry_msg_table *w = &t->wire;
	char lens[17], seed[17];
	uint32_t a, b;

	snprintf(lens, sizeof(lens), "%016" PRIx64, w->lens_hash);
	snprintf(seed, sizeof(seed), "%016" PRIx64, w->init_seed);
	memcpy(&a, &w->init_a, sizeof(a));
	memcpy(&b, &w->init_b, sizeof(b));
	return json_pack("{s:I, s:i, s:s, s:i, s:i, s:I, s:I, s:f, s:f, s:s, s:s, s:s, s:i}",
			 "num_keys", (json_int_t)w->num_keys, "value_len", (int)w->value_len,
			 "lens_hash", lens, "sparse", (int)w->sparse, "init", (int)w->init,
			 "init_a_bits", (json_int_t)a, "init_b_bits", (json_int_t)b, "init_a",
			 (double)w->init_a, "init_b", (double)w->init_b, "init_seed", seed,
			 "placement", w->placement == FERRY_PLACEMENT_HASH ? "hash" : "range",
			 "mode", w->mode == FERRY_MODE_CLASSIC ? "classic" : "dynamic", "vnodes",
			 (int)w->vnodes);
}

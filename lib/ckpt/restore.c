/* SPDX-License-Identifier: MIT */
/*
 * restore.c - ferry_table_restore: load a checkpoint (layout: ckpt.h) into
 * a table of the same kind, on any number of nodes, all or nothing.
 *
 *   every node
 *   ----------
 *   1. read manifest.json; check its format and the table's parameters
 *      (num_keys, value lengths, sparse, initial values) against this table
 *   2. for each shard of the manifest: size and XXH3-64 as the manifest
 *      says, header as the manifest says, every record in bounds and of the
 *      table's value length; keep (copy) the records of the keys this node
 *      owns now, each once (a sparse key homed here that no node made yet
 *      is made here first, with its initial value: what it reads as anyway)
 *   3. all-reduce: the lowest status of any node, and the keys kept by all;
 *      a failure anywhere (or a key no node kept) fails every node, and no
 *      value changed anywhere
 *   4. set each kept key's slot; a sparse key owned here that the
 *      checkpoint does not hold goes back to its initial value
 *   5. barrier: no node returns, so none serves, before every node installed
 *
 * Every node reads every shard, so every node finds (and logs) a bad file
 * itself. Memory: the values of the keys this node owns (the copy of step 2)
 * and a map of their keys (32-64 bytes each), until the call returns; a
 * shard is mapped, not read into memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "lib/ckpt/ckpt.h"
#include "lib/ckpt/ckpt_int.h"
#include "lib/core/core.h"
#include "lib/ops/ops.h"

struct rst_ent {
	struct ferry_slot *s;
	uint64_t key;
	uint32_t len;
	size_t off; /* floats into rst.vals */
};

struct rst {
	struct ferry_table *t;
	const char *dir;
	struct rst_ent *ents;
	size_t n, cap;
	float *vals;
	size_t nvals, capvals;
	struct ferry_keymap seen; /* key -> index into ents + 1 */
	uint64_t keys;		  /* the manifest's total */
};

/* the manifest's table fields that must equal this table's */
static const char *const rst_fields[] = {
	"num_keys", "value_len", "lens_hash",	"sparse",
	"init",	    "init_seed", "init_a_bits", "init_b_bits",
};

static int rst_manifest_table(struct rst *r, const char *path, json_t *theirs)
{
	json_t *mine = ferry__ckpt_table_json(r->t);
	int rc = 0;

	if (!mine)
		return -ENOMEM;
	for (size_t i = 0; i < sizeof(rst_fields) / sizeof(rst_fields[0]); i++) {
		json_t *a = json_object_get(mine, rst_fields[i]);
		json_t *b = json_object_get(theirs, rst_fields[i]);
		char *sa, *sb;

		if (b && json_equal(a, b))
			continue;
		sa = json_dumps(a, JSON_ENCODE_ANY);
		sb = b ? json_dumps(b, JSON_ENCODE_ANY) : NULL;
		ferry_err("restore: %s: the checkpoint's table has %s = %s, table %u here has %s; "
			  "create the table with the checkpoint's parameters",
			  path, rst_fields[i], sb ? sb : "(none)", r->t->id, sa ? sa : "?");
		free(sa);
		free(sb);
		rc = -FERRY_E_MISMATCH;
		break;
	}
	json_decref(mine);
	return rc;
}

static int rst_keep(struct rst *r, const char *path, uint64_t key, struct ferry_slot *s,
		    const float *val, uint32_t len)
{
	int rc;

	if (ferry__keymap_get(&r->seen, key)) {
		ferry_err("restore: %s is corrupt: key %" PRIu64 " is in the checkpoint twice",
			  path, key);
		return -EBADMSG;
	}
	if (r->n == r->cap) {
		size_t cap = r->cap ? 2 * r->cap : 1024;
		struct rst_ent *e = realloc(r->ents, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		r->ents = e;
		r->cap = cap;
	}
	if (r->nvals + len > r->capvals) {
		size_t cap = r->capvals ? 2 * r->capvals : 1u << 16;
		float *v;

		while (cap < r->nvals + len)
			cap *= 2;
		v = realloc(r->vals, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		r->vals = v;
		r->capvals = cap;
	}
	rc = ferry__keymap_put(&r->seen, key, r->n + 1);
	if (rc)
		return rc;
	memcpy(r->vals + r->nvals, val, (size_t)len * sizeof(float));
	r->ents[r->n++] = (struct rst_ent){ .s = s, .key = key, .len = len, .off = r->nvals };
	r->nvals += len;
	return 0;
}

/* @key's live slot here, made now when it is a sparse key homed here that
 * no node made yet; NULL (*rc_p 0) when another node owns it */
static struct ferry_slot *rst_slot(struct rst *r, uint64_t key, int *rc_p)
{
	struct ferry_table *t = r->t;
	struct ferry_slot *s;

	*rc_p = 0;
	urcu_memb_read_lock();
	s = ferry__own(t, key);
	if (s && (__atomic_load_n(&s->key, __ATOMIC_RELAXED) != key ||
		  __atomic_load_n(&s->state, __ATOMIC_RELAXED) != FERRY_SLOT_LIVE))
		s = NULL;
	/* owners is the progress thread's; no operation runs now (the contract),
	 * so nothing writes it */
	if (!s && t->params.sparse && ferry__home(t, key) == t->fy->rank &&
	    ferry__owner(t, key) == t->fy->rank) {
		*rc_p = ferry__ops_materialize(t, key, &s);
		if (*rc_p == -EAGAIN) {
			ferry_err("restore: table %u: key %" PRIu64 " is on the move; no node may "
				  "operate on the table during a restore",
				  t->id, key);
			*rc_p = -EBUSY;
		}
		if (*rc_p)
			s = NULL;
	}
	urcu_memb_read_unlock();
	return s;
}

static int rst_records(struct rst *r, const char *path, const uint8_t *p, size_t size,
		       uint64_t keys)
{
	struct ferry_table *t = r->t;
	size_t off = sizeof(struct ferry_ckpt_hdr);
	int rc;

	for (uint64_t i = 0; i < keys; i++) {
		struct ferry_ckpt_rec rec;
		struct ferry_slot *s;

		if (size - off < sizeof(rec)) {
			ferry_err("restore: %s is corrupt: record %" PRIu64 " of %" PRIu64
				  " runs past the end",
				  path, i, keys);
			return -EBADMSG;
		}
		memcpy(&rec, p + off, sizeof(rec));
		off += sizeof(rec);
		if (rec.zero || !ferry__key_ok(t, rec.key) ||
		    rec.len != ferry__value_len(t, rec.key) ||
		    (size - off) / sizeof(float) < rec.len) {
			ferry_err("restore: %s is corrupt: record %" PRIu64 " (key %" PRIu64
				  ", %u floats) is not one of this table's keys or runs past the "
				  "end",
				  path, i, rec.key, rec.len);
			return -EBADMSG;
		}
		s = rst_slot(r, rec.key, &rc);
		if (rc)
			return rc;
		if (s) {
			float v[256];
			const uint8_t *src = p + off;

			/* the map may be unaligned for floats only in a corrupt file;
			 * copy through memcpy all the same */
			if (rec.len <= 256) {
				memcpy(v, src, rec.len * sizeof(float));
				rc = rst_keep(r, path, rec.key, s, v, rec.len);
			} else {
				float *big = malloc(rec.len * sizeof(float));

				if (!big)
					return -ENOMEM;
				memcpy(big, src, rec.len * sizeof(float));
				rc = rst_keep(r, path, rec.key, s, big, rec.len);
				free(big);
			}
			if (rc)
				return rc;
		}
		off += (size_t)rec.len * sizeof(float);
	}
	if (off != size) {
		ferry_err("restore: %s is corrupt: %zu bytes after its last record", path,
			  size - off);
		return -EBADMSG;
	}
	return 0;
}

static int rst_shard(struct rst *r, uint32_t rank, uint32_t world, const char *file, uint64_t keys,
		     uint64_t bytes, uint64_t xxh)
{
	struct ferry_table *t = r->t;
	struct ferry_ckpt_hdr hdr;
	char path[PATH_MAX];
	struct stat st;
	uint8_t *p;
	uint64_t sum;
	int fd, rc;

	snprintf(path, sizeof(path), "%s/%s", r->dir, file);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		ferry_err("restore: cannot open %s, shard %u of the checkpoint: %s", path, rank,
			  strerror(-rc));
		return rc == -ENOENT ? -ENOENT : -EIO;
	}
	if (fstat(fd, &st)) {
		rc = -errno;
		close(fd);
		ferry_err("restore: cannot stat %s: %s", path, strerror(-rc));
		return -EIO;
	}
	if ((uint64_t)st.st_size != bytes) {
		close(fd);
		ferry_err("restore: %s is %s: %lld bytes, the manifest says %" PRIu64, path,
			  (uint64_t)st.st_size < bytes ? "truncated" : "corrupt (too long)",
			  (long long)st.st_size, bytes);
		return -EBADMSG;
	}
	p = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		rc = -errno;
		ferry_err("restore: cannot map %s: %s", path, strerror(-rc));
		return rc == -ENOMEM ? rc : -EIO;
	}
	rc = 0;
	sum = XXH3_64bits(p, bytes);
	memcpy(&hdr, p, sizeof(hdr));
	if (sum != xxh) {
		ferry_err("restore: %s is corrupt: its XXH3-64 is %016" PRIx64
			  ", the manifest says %016" PRIx64,
			  path, sum, xxh);
		rc = -EBADMSG;
	} else if (memcmp(hdr.magic, FERRY_CKPT_MAGIC, sizeof(hdr.magic)) ||
		   hdr.version != FERRY_CKPT_VERSION) {
		ferry_err("restore: %s is not a Ferry shard of version %u", path,
			  FERRY_CKPT_VERSION);
		rc = -EBADMSG;
	} else if (hdr.rank != rank || hdr.world != world || hdr.keys != keys ||
		   hdr.num_keys != t->wire.num_keys || hdr.lens_hash != t->wire.lens_hash ||
		   hdr.value_len != t->wire.value_len) {
		ferry_err("restore: %s does not belong to this checkpoint: its header says rank "
			  "%u of %u, %" PRIu64 " keys; the manifest says rank %u of %u, %" PRIu64
			  " keys (or the table differs)",
			  path, hdr.rank, hdr.world, hdr.keys, rank, world, keys);
		rc = -FERRY_E_MISMATCH;
	} else {
		rc = rst_records(r, path, p, bytes, keys);
	}
	munmap(p, bytes);
	return rc;
}

static int rst_load(struct rst *r)
{
	char path[PATH_MAX];
	json_error_t jerr;
	json_t *root, *shards, *v;
	json_int_t nodes = -1, total = -1;
	uint64_t sum = 0;
	const char *fmt = NULL;
	int rc = 0;

	snprintf(path, sizeof(path), "%s/%s", r->dir, FERRY_CKPT_MANIFEST);
	if (access(path, F_OK)) {
		rc = -errno;
		ferry_err("restore: no checkpoint at %s: %s (a checkpoint that did not finish "
			  "has no manifest)",
			  path, strerror(-rc));
		return rc == -ENOENT ? -ENOENT : -EIO;
	}
	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		ferry_err("restore: %s is corrupt: line %d: %s", path, jerr.line, jerr.text);
		return -EBADMSG;
	}
	v = json_object_get(root, "version");
	if (json_unpack(root, "{s:s, s:I, s:I, s:o}", "format", &fmt, "nodes", &nodes, "keys",
			&total, "shards", &shards) ||
	    strcmp(fmt, FERRY_CKPT_FORMAT) || !json_is_integer(v) ||
	    json_integer_value(v) != FERRY_CKPT_VERSION || !json_is_array(shards) || nodes < 1 ||
	    nodes > UINT16_MAX || total < 0 || json_array_size(shards) != (size_t)nodes) {
		ferry_err("restore: %s is corrupt or not a Ferry checkpoint manifest of version %u",
			  path, FERRY_CKPT_VERSION);
		rc = -EBADMSG;
		goto out;
	}
	rc = rst_manifest_table(r, path, json_object_get(root, "table"));
	if (rc)
		goto out;
	r->keys = (uint64_t)total;
	if (!r->t->params.sparse && r->keys != r->t->params.num_keys) {
		ferry_err("restore: %s is corrupt: it holds %" PRIu64 " keys of a dense table of "
			  "%" PRIu64,
			  path, r->keys, r->t->params.num_keys);
		rc = -EBADMSG;
		goto out;
	}
	for (uint32_t i = 0; !rc && i < (uint32_t)nodes; i++) {
		json_int_t rank = -1, keys = -1, bytes = -1;
		const char *file = NULL, *hex = NULL;
		char want[64], *end;
		uint64_t xxh;

		snprintf(want, sizeof(want), "shard-%u-of-%u.fck", i, (unsigned)nodes);
		if (json_unpack(json_array_get(shards, i), "{s:I, s:s, s:I, s:I, s:s}", "rank",
				&rank, "file", &file, "keys", &keys, "bytes", &bytes, "xxh3",
				&hex) ||
		    rank != i || strcmp(file, want) || keys < 0 ||
		    bytes < (json_int_t)sizeof(struct ferry_ckpt_hdr) || strlen(hex) != 16) {
			ferry_err("restore: %s is corrupt: shard entry %u", path, i);
			rc = -EBADMSG;
			break;
		}
		errno = 0;
		xxh = strtoull(hex, &end, 16);
		if (errno || *end) {
			ferry_err("restore: %s is corrupt: shard entry %u's checksum", path, i);
			rc = -EBADMSG;
			break;
		}
		sum += (uint64_t)keys;
		rc = rst_shard(r, i, (uint32_t)nodes, file, (uint64_t)keys, (uint64_t)bytes, xxh);
	}
	if (!rc && sum != r->keys) {
		ferry_err("restore: %s is corrupt: its shards hold %" PRIu64
			  " keys, it says %" PRIu64,
			  path, sum, r->keys);
		rc = -EBADMSG;
	}
out:
	json_decref(root);
	return rc;
}

struct rst_reset {
	struct rst *r;
	uint64_t *keys;
	size_t n, cap;
	int rc;
};

static void rst_reset_fn(void *arg, uint64_t key, void *slot)
{
	struct rst_reset *x = arg;

	(void)slot;
	if (x->rc || ferry__keymap_get(&x->r->seen, key))
		return;
	if (x->n == x->cap) {
		size_t cap = x->cap ? 2 * x->cap : 256;
		uint64_t *k = realloc(x->keys, cap * sizeof(*k));

		if (!k) {
			x->rc = -ENOMEM;
			return;
		}
		x->keys = k;
		x->cap = cap;
	}
	x->keys[x->n++] = key;
}

/* a sparse table: the keys owned here that the checkpoint does not hold
 * (step 1 of the reset, before anything changed, as it can fail) */
static int rst_reset_list(struct rst *r, struct rst_reset *x)
{
	struct ferry_dir *d = &r->t->dir;

	x->r = r;
	if (!r->t->params.sparse)
		return 0;
	ferry__dir_own_lock(d);
	ferry__dir_own_each(d, rst_reset_fn, x);
	ferry__dir_own_unlock(d);
	if (x->rc)
		ferry_err("restore: table %u: out of memory on rank %u", r->t->id, r->t->fy->rank);
	return x->rc;
}

static void rst_install(struct rst *r, struct rst_reset *x)
{
	struct ferry_table *t = r->t;
	uint64_t bad = 0;
	float *v = NULL;

	for (size_t i = 0; i < r->n; i++) {
		const struct rst_ent *e = &r->ents[i];

		if (ferry__slot_update(&t->arena, e->s, e->key, r->vals + e->off, e->len, 0))
			bad++;
	}
	if (x->n)
		v = malloc((size_t)t->max_len * sizeof(float));
	for (size_t i = 0; v && i < x->n; i++) {
		uint64_t key = x->keys[i];
		uint32_t len = ferry__value_len(t, key);
		struct ferry_slot *s;

		urcu_memb_read_lock();
		s = ferry__own(t, key);
		ferry__init_value(&t->init, key, 0, v, len);
		if (!s || ferry__slot_update(&t->arena, s, key, v, len, 0))
			bad++;
		urcu_memb_read_unlock();
	}
	if (x->n && !v)
		bad += x->n;
	free(v);
	if (bad)
		ferry_err("restore: table %u: %" PRIu64 " keys left rank %u while it installed "
			  "them: an operation ran on the table during the restore; restore again "
			  "with none running",
			  t->id, bad, t->fy->rank);
}

int ferry_table_restore(struct ferry_table *t, const char *dir)
{
	struct rst r = { .t = t, .dir = dir };
	struct rst_reset x = { 0 };
	struct ferry *fy;
	int64_t st, all, kept;
	int rc, lrc;

	if (!t || !dir || !*dir)
		return -EINVAL;
	fy = t->fy;
	if (t->params.hot_count || t->params.hot_auto) {
		ferry_err("restore: table %u has hot keys, whose replicas a restore does not "
			  "set yet; restore into a table without hot_keys",
			  t->id);
		return -EOPNOTSUPP;
	}
	if (strlen(dir) + 64 > PATH_MAX) {
		ferry_err("restore: folder name too long (%zu bytes)", strlen(dir));
		return -EINVAL;
	}
	ferry__rcu_enter();
	lrc = ferry__keymap_init(&r.seen);
	if (!lrc)
		lrc = rst_load(&r);
	if (!lrc)
		lrc = rst_reset_list(&r, &x);
	/* every node's verdict: the lowest status, and the keys kept */
	st = lrc;
	rc = ferry_allreduce(fy, &st, &all, 1, FERRY_INT64, FERRY_MIN);
	if (!rc && all)
		rc = lrc ? lrc : (int)all;
	if (!rc) {
		st = (int64_t)r.n;
		rc = ferry_allreduce(fy, &st, &kept, 1, FERRY_INT64, FERRY_SUM);
	}
	if (!rc && (uint64_t)kept != r.keys) {
		ferry_err("restore: %s: %" PRIu64 " of the checkpoint's %" PRIu64
			  " keys found a node that owns them; no operation may run on the table "
			  "during a restore",
			  dir, (uint64_t)kept, r.keys);
		rc = -EBUSY;
	}
	if (!rc) {
		rst_install(&r, &x);
		rc = ferry_barrier(fy);
	}
	if (lrc == -ENOMEM)
		ferry_err("restore: rank %u ran out of memory keeping the values of the keys it "
			  "owns; free memory or restore into more nodes",
			  fy->rank);
	if (r.seen.arr)
		ferry__keymap_fini(&r.seen);
	free(x.keys);
	free(r.ents);
	free(r.vals);
	ferry__rcu_leave();
	return rc;
}

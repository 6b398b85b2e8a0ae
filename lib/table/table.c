/* SPDX-License-Identifier: MIT */
/*
 * table.c - collective table creation. Each node builds its side (placement,
 * directory, arena with the home's keys live at zero), registers it so that
 * messages for it can be served, and sends its parameters to rank 0. Rank 0
 * compares them with its own and acknowledges to everyone once all arrived,
 * so when create returns anywhere, every node already serves the table.
 */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lib/cons/cons.h"
#include "lib/ops/codec.h"
#include "lib/ops/ops.h"
#include "lib/reloc/reloc.h"
#include "lib/table/table.h"

static const char *const table_field_names[] = {
	[FERRY_TF_NONE] = "none",
	[FERRY_TF_NUM_KEYS] = "num_keys",
	[FERRY_TF_VALUE_LENS] = "value_len/value_lens",
	[FERRY_TF_CAPACITY] = "capacity",
	[FERRY_TF_PLACEMENT] = "placement",
	[FERRY_TF_VNODES] = "vnodes",
	[FERRY_TF_MODE] = "mode",
	[FERRY_TF_FAST_PATH] = "no_local_fast_path",
	[FERRY_TF_INIT] = "init/init_a/init_b/init_seed",
	[FERRY_TF_SPARSE] = "sparse",
	[FERRY_TF_CONSISTENCY] = "consistency/staleness",
	[FERRY_TF_REPLICAS] = "replicas",
	[FERRY_TF_HOT] = "hot_keys/hot_count/hot_sync_ms/hot_auto",
};

static uint32_t table_diff(const struct ferry_msg_table *a, const struct ferry_msg_table *b)
{
	if (a->num_keys != b->num_keys)
		return FERRY_TF_NUM_KEYS;
	if (a->lens_hash != b->lens_hash || a->value_len != b->value_len)
		return FERRY_TF_VALUE_LENS;
	if (a->capacity != b->capacity)
		return FERRY_TF_CAPACITY;
	if (a->placement != b->placement)
		return FERRY_TF_PLACEMENT;
	if (a->vnodes != b->vnodes)
		return FERRY_TF_VNODES;
	if (a->mode != b->mode)
		return FERRY_TF_MODE;
	if (a->sparse != b->sparse)
		return FERRY_TF_SPARSE;
	if (a->init != b->init || a->init_seed != b->init_seed ||
	    memcmp(&a->init_a, &b->init_a, sizeof(float)) ||
	    memcmp(&a->init_b, &b->init_b, sizeof(float)))
		return FERRY_TF_INIT;
	if (a->no_local_fast_path != b->no_local_fast_path)
		return FERRY_TF_FAST_PATH;
	if (a->consistency != b->consistency || a->staleness != b->staleness)
		return FERRY_TF_CONSISTENCY;
	if (a->replicas != b->replicas)
		return FERRY_TF_REPLICAS;
	if (a->hot_count != b->hot_count || a->hot_sync_ms != b->hot_sync_ms ||
	    a->hot_hash != b->hot_hash)
		return FERRY_TF_HOT;
	return FERRY_TF_NONE;
}

/* rank 0, with fy->lock held: decide once every rank's parameters are in */
static void table_try_verdict(struct ferry *fy, uint32_t id)
{
	struct ferry_msg_table ack;
	struct ferry_msg_arena *arenas;
	struct ferry_msg_hdr *h;
	uint32_t field = FERRY_TF_NONE, from = 0;
	size_t len = sizeof(*h) + sizeof(ack) + fy->world * sizeof(*arenas);

	if (fy->table_nseen[id] < fy->world || fy->table_verdict[id])
		return;
	h = calloc(1, len);
	arenas = calloc(fy->world, sizeof(*arenas));
	if (!h || !arenas) {
		free(h);
		free(arenas);
		ferry_err("table %u: out of memory at rank 0", id);
		return; /* the others time out, and the log said why */
	}
	for (uint32_t r = 0; r < fy->world; r++) {
		const struct ferry_msg_table *m = &fy->table_seen[id][r];

		arenas[r] = (struct ferry_msg_arena){ .addr = m->arena_addr,
						      .rkey = m->arena_rkey,
						      .inbox_addr = m->inbox_addr,
						      .inbox_rkey = m->inbox_rkey,
						      .inbox_entries = m->inbox_entries,
						      .inbox_stride = m->inbox_stride };
	}
	for (uint32_t r = 1; r < fy->world && field == FERRY_TF_NONE; r++) {
		field = table_diff(&fy->table_seen[id][0], &fy->table_seen[id][r]);
		from = r;
	}
	memset(&ack, 0, sizeof(ack));
	ack.status = field ? -FERRY_E_MISMATCH : 0;
	ack.field = field;
	ack.from_rank = from;
	fy->table_ack[id] = ack;
	fy->table_verdict[id] = 1;
	fy->table_arenas[id] = arenas;
	ferry__proto_hdr_init(h, FERRY_MSG_TABLE_ACK, (uint32_t)len, fy->rank, id);
	memcpy(h + 1, &ack, sizeof(ack));
	memcpy((uint8_t *)(h + 1) + sizeof(ack), arenas, fy->world * sizeof(*arenas));
	pthread_mutex_unlock(&fy->lock);
	for (uint32_t r = 1; r < fy->world; r++)
		ferry__send(fy, r, h, len);
	free(h);
	pthread_mutex_lock(&fy->lock);
	pthread_cond_broadcast(&fy->cond);
}

/*
 * Rank 0, with fy->lock held: decide that table @id fails everywhere with
 * @status (a rank gave up waiting, or failed), unless it was decided
 * already. Every live rank gets the verdict; none serves the table.
 */
static void table_fail_verdict(struct ferry *fy, uint32_t id, int status, uint32_t from)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_table m;
	} ack;

	if (fy->table_verdict[id])
		return;
	memset(&ack, 0, sizeof(ack));
	ack.m.status = status;
	ack.m.field = FERRY_TF_NONE;
	ack.m.from_rank = from;
	fy->table_ack[id] = ack.m;
	fy->table_verdict[id] = 1;
	ferry__proto_hdr_init(&ack.h, FERRY_MSG_TABLE_ACK, sizeof(ack), fy->rank, id);
	pthread_mutex_unlock(&fy->lock);
	for (uint32_t r = 1; r < fy->world; r++)
		ferry__send(fy, r, &ack, sizeof(ack)); /* failed ranks refuse it */
	pthread_mutex_lock(&fy->lock);
	pthread_cond_broadcast(&fy->cond);
}

/* rank 0, fy->lock held: send rank @r the verdict given for table @id again
 * (it asked, having given up waiting: the first copy may be on its way) */
static void table_resend_verdict(struct ferry *fy, uint32_t id, uint32_t r)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_table m;
	} ack;
	struct ferry_msg_arena *arenas = fy->table_arenas[id];
	size_t len = sizeof(ack) + (arenas ? fy->world * sizeof(*arenas) : 0);
	uint8_t *buf = malloc(len);

	if (!buf)
		return; /* that rank times out, and says so */
	memset(&ack, 0, sizeof(ack));
	ack.m = fy->table_ack[id];
	ferry__proto_hdr_init(&ack.h, FERRY_MSG_TABLE_ACK, (uint32_t)len, fy->rank, id);
	memcpy(buf, &ack, sizeof(ack));
	if (arenas)
		memcpy(buf + sizeof(ack), arenas, fy->world * sizeof(*arenas));
	pthread_mutex_unlock(&fy->lock);
	ferry__send(fy, r, buf, len);
	free(buf);
	pthread_mutex_lock(&fy->lock);
}

/* rank 0 records one rank's parameters (its own included) */
static void table_record(struct ferry *fy, uint32_t src, uint32_t id,
			 const struct ferry_msg_table *m)
{
	if (!fy->table_seen[id]) {
		fy->table_seen[id] = calloc(fy->world, sizeof(struct ferry_msg_table));
		if (!fy->table_seen[id])
			return;
	}
	/* a duplicate from one rank would be miscounted: keep the first */
	if (fy->table_seen[id][src].value_len || fy->table_seen[id][src].num_keys)
		return;
	fy->table_seen[id][src] = *m;
	fy->table_nseen[id]++;
	table_try_verdict(fy, id);
}

static void table_on_msg(struct ferry *fy, struct ferry_table *unused, uint32_t src,
			 const struct ferry_proto_view *v)
{
	const struct ferry_msg_hdr *hdr = v->hdr;
	const struct ferry_msg_table *m = v->body;
	uint32_t id = hdr->table;

	if (id >= FERRY_MAX_TABLES) {
		ferry_warn("table: rank %u sent a table id %u out of range; ignored", src, id);
		return;
	}
	pthread_mutex_lock(&fy->lock);
	if (hdr->type == FERRY_MSG_TABLE && fy->rank == 0 && m->status) {
		/* rank src gave up waiting: the table fails everywhere, unless it
		 * was decided already, which src then learns (again) */
		if (!fy->table_verdict[id])
			table_fail_verdict(fy, id, -ETIMEDOUT, src);
		else
			table_resend_verdict(fy, id, src);
	} else if (hdr->type == FERRY_MSG_TABLE && fy->rank == 0) {
		table_record(fy, src, id, m);
	} else if (hdr->type == FERRY_MSG_TABLE_ACK && src == 0 && !fy->table_verdict[id]) {
		fy->table_ack[id] = *m;
		fy->table_verdict[id] = 1;
		if (v->arenas) {
			fy->table_arenas[id] = malloc(fy->world * sizeof(*v->arenas));
			if (fy->table_arenas[id])
				memcpy(fy->table_arenas[id], v->arenas,
				       fy->world * sizeof(*v->arenas));
		}
		pthread_cond_broadcast(&fy->cond);
	}
	pthread_mutex_unlock(&fy->lock);
}

static int table_check_params(const struct ferry_table_params *p)
{
	if (p->sparse != 0 && p->sparse != 1) {
		ferry_err("table: sparse is %d; use 0 (keys 0 .. num_keys-1) or 1 (any key)",
			  p->sparse);
		return -EINVAL;
	}
	if (p->sparse && (p->num_keys || p->value_lens)) {
		ferry_err("table: a sparse table takes any 64-bit key and one value_len; set "
			  "num_keys to 0 and value_lens to NULL");
		return -EINVAL;
	}
	if (!p->sparse && !p->num_keys) {
		ferry_err("table: num_keys is 0; a table needs at least one key (or set sparse = 1 "
			  "for keys from the whole 64-bit space)");
		return -EINVAL;
	}
	if (p->init != FERRY_INIT_ZERO && p->init != FERRY_INIT_UNIFORM &&
	    p->init != FERRY_INIT_NORMAL) {
		ferry_err("table: initializer %d is unknown; use FERRY_INIT_ZERO, _UNIFORM or "
			  "_NORMAL",
			  p->init);
		return -EINVAL;
	}
	if (p->init != FERRY_INIT_ZERO &&
	    (!isfinite(p->init_a) || !isfinite(p->init_b) ||
	     (p->init == FERRY_INIT_UNIFORM ? p->init_b < p->init_a : p->init_b < 0))) {
		ferry_err("table: initializer bounds %g, %g are not finite, or %s",
			  (double)p->init_a, (double)p->init_b,
			  p->init == FERRY_INIT_UNIFORM ? "init_b < init_a" :
							  "the standard deviation init_b < 0");
		return -EINVAL;
	}
	if (p->loc_cache > FERRY_LOC_CACHE_MAX) {
		ferry_err("table: loc_cache %llu entries is above the limit of %u",
			  (unsigned long long)p->loc_cache, FERRY_LOC_CACHE_MAX);
		return -EINVAL;
	}
	if (p->num_keys > (1ull << 40)) {
		ferry_err("table: num_keys %llu is above the limit of 2^40",
			  (unsigned long long)p->num_keys);
		return -EINVAL;
	}
	if (!p->value_lens && (p->value_len == 0 || p->value_len > (1u << 22))) {
		ferry_err("table: value_len %u must be 1 .. 4194304 floats", p->value_len);
		return -EINVAL;
	}
	if (p->value_lens)
		for (uint64_t k = 0; k < p->num_keys; k++)
			if (p->value_lens[k] == 0 || p->value_lens[k] > (1u << 22)) {
				ferry_err(
					"table: value_lens[%llu] = %u must be 1 .. 4194304 floats",
					(unsigned long long)k, p->value_lens[k]);
				return -EINVAL;
			}
	if (p->placement != FERRY_PLACEMENT_RANGE && p->placement != FERRY_PLACEMENT_HASH) {
		ferry_err("table: placement %d is neither RANGE nor HASH", p->placement);
		return -EINVAL;
	}
	if (p->mode != FERRY_MODE_DYNAMIC && p->mode != FERRY_MODE_CLASSIC) {
		ferry_err("table: mode %d is neither DYNAMIC nor CLASSIC", p->mode);
		return -EINVAL;
	}
	if (p->consistency < FERRY_CONS_SEQUENTIAL || p->consistency > FERRY_CONS_ESSP) {
		ferry_err("table: consistency %d is unknown; use FERRY_CONS_SEQUENTIAL, _EVENTUAL, "
			  "_SSP or _ESSP",
			  p->consistency);
		return -EINVAL;
	}
	if (p->staleness &&
	    (p->consistency != FERRY_CONS_SSP && p->consistency != FERRY_CONS_ESSP)) {
		ferry_err("table: staleness %u is a bound of SSP and ESSP only; set it to 0 for "
			  "this consistency model",
			  p->staleness);
		return -EINVAL;
	}
	if (p->staleness > (1u << 20)) {
		ferry_err("table: staleness %u clocks is above the limit of 2^20", p->staleness);
		return -EINVAL;
	}
	if (p->replicas > 2) {
		ferry_err("table: replicas %u is not supported yet; use 0 (none), 1 or 2 (backups "
			  "per key, docs/faults.md)",
			  p->replicas);
		return -EINVAL;
	}
	if (p->replicas && p->sparse) {
		ferry_err("table: replicas with a sparse table is not supported yet; use a dense "
			  "table (num_keys) or replicas 0");
		return -EINVAL;
	}
	if (ferry__codec_check(p) || ferry__hot_check(p))
		return -EINVAL;
	if (p->capacity > 0xffffffffull) {
		ferry_err("table: capacity %llu is above 2^32-1 slots",
			  (unsigned long long)p->capacity);
		return -EINVAL;
	}
	return 0;
}

static void table_free(struct ferry_table *t)
{
	/* the pending table's teardown walks it under RCU: register this
	 * thread for it if no worker did */
	ferry__cons_table_fini(t);
	ferry__codec_table_fini(t);
	ferry__rcu_enter();
	ferry__reloc_table_fini(t);
	ferry__repl_table_fini(t);
	ferry__rcu_leave();
	ferry__reloc_inbox_fini(t->fy, t);
	for (uint32_t c = 0; c < FERRY_ARENA_CHUNKS_MAX; c++) {
		if (t->chunk_mr[c] && t->fy->tp)
			t->fy->tp->ops->mem_dereg(t->fy->tp, t->chunk_mr[c]);
		free(t->chunk_mr[c]);
	}
	free(t->peer_chunks);
	free(t->inbox_grant);
	ferry__arena_fini(&t->arena);
	ferry__placement_fini(&t->place);
	ferry__dir_fini(&t->dir);
	free(t->value_lens);
	free(t->value_offs);
	free(t->peer_arena);
	free(t);
}

/* the keys this node is home of, live in its arena from the start */
static int table_fill_home(struct ferry *fy, struct ferry_table *t, uint64_t n, uint64_t cap)
{
	int rc = 0;

	for (uint64_t k = 0; k < n && !rc; k++) {
		uint32_t idx;
		struct ferry_slot *s;

		if (ferry__home(t, k) != fy->rank)
			continue;
		rc = ferry__arena_alloc(&t->arena, &idx);
		if (rc == -ENOSPC)
			ferry_err("table: capacity %llu slots is less than the %s keys this node "
				  "is home of; raise the table's capacity",
				  (unsigned long long)cap, "initial");
		if (rc)
			break;
		s = ferry__arena_slot(&t->arena, idx);
		ferry__slot_install_init(&t->arena, s, k, &t->init, ferry__value_len(t, k));
		rc = ferry__dir_own_set(&t->dir, k, s);
	}
	return rc;
}

/* this node's side: placement, directory, arena with its home keys live */
static int table_build(struct ferry *fy, const struct ferry_table_params *p, struct ferry_table *t)
{
	uint64_t n = p->num_keys, lens_hash = 0, cap;
	int rc;

	t->fy = fy;
	t->params = *p;
	if (p->push_codec)
		t->codec_push = ferry__codec_push;
	t->params.vnodes = p->vnodes ? p->vnodes : 1024;
	t->params.value_lens = NULL;
	rc = ferry__pend_init(&t->pend);
	if (rc)
		return rc;
	rc = ferry__repl_table_init(t);
	if (rc)
		return rc;
	t->max_len = p->value_len;
	if (p->value_lens) {
		t->value_lens = malloc(n * sizeof(uint32_t));
		t->value_offs = malloc((n + 1) * sizeof(uint64_t));
		if (!t->value_lens || !t->value_offs)
			return -ENOMEM;
		memcpy(t->value_lens, p->value_lens, n * sizeof(uint32_t));
		t->max_len = 0;
		t->value_offs[0] = 0;
		for (uint64_t k = 0; k < n; k++) {
			if (t->value_lens[k] > t->max_len)
				t->max_len = t->value_lens[k];
			t->value_offs[k + 1] = t->value_offs[k] + t->value_lens[k];
			lens_hash = ferry__hash64(lens_hash ^ t->value_lens[k]);
		}
		t->params.value_len = 0;
	}
	t->lim = (struct ferry_proto_limits){ .world = fy->world,
					      .num_keys = n,
					      .value_len = t->params.value_len,
					      .value_lens = t->value_lens };
	rc = ferry__placement_init(&t->place, p->placement, n, fy->world, t->params.vnodes);
	if (rc)
		return rc;

	t->init = (struct ferry_init_spec){
		.kind = (uint32_t)p->init, .a = p->init_a, .b = p->init_b, .seed = p->init_seed
	};
	rc = ferry__dir_init(&t->dir, fy->rank, p->loc_cache, fy->fastrd);
	if (!rc && !p->sparse && p->placement == FERRY_PLACEMENT_RANGE) {
		uint64_t lo, nhome;

		/* the node holds all of these from the start: an array for them */
		ferry__placement_range_of(&t->place, fy->rank, &lo, &nhome);
		rc = ferry__dir_home_range(&t->dir, lo, nhome);
	}
	if (rc)
		return rc;

	/* by default a node can own every key, and a few more slots cover keys
	 * that left and wait for a grace period before their slot is free; a
	 * sparse table's keys come into being on use, up to 2^20 per node */
	cap = p->capacity ? p->capacity : p->sparse ? FERRY_SPARSE_CAPACITY : n + 64;
	if (p->mode == FERRY_MODE_CLASSIC && !p->capacity && !p->replicas) {
		/* nothing ever moves: the home's keys are all it holds (with
		 * replicas a node may take a failed node's keys over: the
		 * default, every key + 64) */
		cap = 0;
		for (uint64_t k = 0; k < n; k++)
			cap += ferry__home(t, k) == fy->rank;
	}
	rc = ferry__arena_init(&t->arena, (uint32_t)(cap > 0xffffffffull ? 0xffffffffull : cap),
			       t->max_len, &fy->budget);
	if (rc)
		return rc;
	ferry__dir_arena(&t->dir, t->arena.base, t->arena.stride, offsetof(struct ferry_slot, key));
	if (fy->budget.limit &&
	    fy->budget.limit < ((uint64_t)t->arena.stride << t->arena.chunk_shift)) {
		ferry_err("table: the memory budget of %llu bytes is smaller than one chunk of the "
			  "table's arena (%llu bytes: %u slots of %zu); raise FERRY_MEM_LIMIT (or "
			  "params.mem_limit)",
			  (unsigned long long)fy->budget.limit,
			  (unsigned long long)t->arena.stride << t->arena.chunk_shift,
			  1u << t->arena.chunk_shift, t->arena.stride);
		return -EINVAL;
	}
	if (fy->tp->ops->mem_reg) {
		/* peers only read slots, a chunk at a time as the arena grows
		 * (lib/ops/chunks.c); hand-overs land in the inbox (reloc.c) */
		t->arena.on_chunk = ferry__ops_chunk_reg;
		t->arena.chunk_arg = t;
		if (fy->tp->ops->caps & FERRY_TP_CAP_READ) {
			t->peer_chunks = calloc(fy->world, sizeof(*t->peer_chunks));
			t->inbox_grant = calloc(fy->world, sizeof(*t->inbox_grant));
			if (!t->peer_chunks || !t->inbox_grant)
				return -ENOMEM;
		}
		rc = ferry__reloc_inbox_init(fy, t);
		if (rc)
			return rc;
	}

	ferry__rcu_enter(); /* a directory that grows frees its old array by call_rcu */
	rc = table_fill_home(fy, t, n, cap);
	ferry__rcu_leave();
	if (!rc)
		rc = ferry__repl_table_seed(t);
	if (rc)
		return rc;

	t->wire = (struct ferry_msg_table){
		.num_keys = n,
		.lens_hash = lens_hash,
		.capacity = p->capacity,
		.value_len = t->params.value_len,
		.placement = (uint32_t)p->placement,
		.vnodes = t->params.vnodes,
		.mode = (uint32_t)p->mode,
		.no_local_fast_path = (uint32_t) !!p->no_local_fast_path,
		.init = (uint32_t)p->init,
		.init_a = p->init_a,
		.init_b = p->init_b,
		.sparse = (uint32_t)p->sparse,
		.init_seed = p->init_seed,
		.consistency = (uint32_t)p->consistency,
		.staleness = p->staleness,
		.replicas = p->replicas,
		.hot_count = p->hot_count,
		.hot_sync_ms = p->hot_sync_ms,
		.hot_hash = ferry__hot_hash(p),
	};
	/* one-sided access starts only once every arena is known (create) */
	if (t->peer_chunks) {
		/* the rkeys come a chunk at a time (CHUNK frames, lib/ops/chunks.c) */
		t->wire.arena_addr = (uint64_t)(uintptr_t)t->arena.base;
		t->wire.arena_rkey = 0;
		t->wire.arena_stride = t->arena.stride;
		if (t->inbox.base) {
			t->wire.inbox_addr = (uint64_t)(uintptr_t)t->inbox.base;
			t->wire.inbox_rkey = 0; /* a region's to each peer: inbox.c */
			t->wire.inbox_entries = t->inbox.n;
			t->wire.inbox_stride = t->inbox.stride;
		}
	}
	return 0;
}

/*
 * proto.c checked each announced inbox on its own; what only the table knows
 * is the largest value: an entry that cannot hold it is not used (hand-overs
 * to that rank go by message). Context: create, before one-sided access is on.
 */
static void table_check_inboxes(struct ferry_table *t)
{
	const uint64_t need = (uint64_t)t->max_len * sizeof(float);

	for (uint32_t r = 0; r < t->fy->world; r++) {
		struct ferry_msg_arena *a = &t->peer_arena[r];

		if (a->inbox_entries && a->inbox_stride < need) {
			ferry_err(
				"table %u: rank %u's landing entries hold %u bytes, less than the "
				"largest value (%llu bytes); keys localized to it are handed "
				"over by message",
				t->id, r, a->inbox_stride, (unsigned long long)need);
			a->inbox_entries = 0;
		}
	}
}

/*
 * Wait for rank 0's verdict on table @id: all or nothing. A rank whose wait
 * times out asks rank 0 to fail the table (a TABLE with a status) and waits
 * once more for the verdict, which is then a failure for everyone, or the
 * success rank 0 had already sent everyone. Rank 0 decides failure itself
 * when its own wait ends. A failed rank 0 fails the wait at once.
 * Return: 0 with *@ack, or a negative errno (no verdict arrived).
 */
static int table_wait_verdict(struct ferry *fy, uint32_t id, struct ferry_msg_table *ack)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_table m;
	} msg;
	struct timespec ts;
	int rc = 0, asked = 0;

	ferry__deadline_ms(fy->timeout_ms, &ts);
	pthread_mutex_lock(&fy->lock);
	while (!fy->table_verdict[id]) {
		if (atomic_load(&fy->closed)) {
			rc = -FERRY_E_CLOSED;
			break;
		}
		if (fy->rank != 0 && atomic_load(&fy->failed[0])) {
			rc = -FERRY_E_PEER;
			ferry_err("table %u: rank 0, which decides, failed", id);
			break;
		}
		if (ferry__cond_wait_until(&fy->cond, &fy->lock, &ts) != ETIMEDOUT)
			continue;
		if (fy->table_verdict[id])
			break;
		if (fy->rank == 0) {
			table_fail_verdict(fy, id, -ETIMEDOUT, 0);
			break;
		}
		if (asked) {
			rc = -ETIMEDOUT;
			break;
		}
		/* ask rank 0 to fail it everywhere, and hear what it decided */
		asked = 1;
		memset(&msg, 0, sizeof(msg));
		ferry__proto_hdr_init(&msg.h, FERRY_MSG_TABLE, sizeof(msg), fy->rank, id);
		msg.m.status = -ETIMEDOUT;
		pthread_mutex_unlock(&fy->lock);
		rc = ferry__send(fy, 0, &msg, sizeof(msg));
		pthread_mutex_lock(&fy->lock);
		if (rc)
			break;
		ferry__deadline_ms(fy->timeout_ms, &ts);
	}
	if (!rc)
		*ack = fy->table_ack[id];
	pthread_mutex_unlock(&fy->lock);
	return rc;
}

static void table_try_free(struct ferry *fy, uint32_t id);
static void table_reap(struct ferry *fy, bool wait, bool force);

/* a rank failed (progress thread): rank 0 fails every table still waiting
 * for that rank's parameters, at once */
static void table_on_peer_failed(struct ferry *fy, uint32_t rank)
{
	if (fy->rank != 0)
		return;
	pthread_mutex_lock(&fy->lock);
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++)
		if (fy->table_seen[id] && !fy->table_verdict[id] &&
		    !fy->table_seen[id][rank].value_len && !fy->table_seen[id][rank].num_keys)
			table_fail_verdict(fy, id, -FERRY_E_PEER, rank);
	/* and a destroy no longer waits for it */
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++)
		table_try_free(fy, id);
	pthread_mutex_unlock(&fy->lock);
}

int ferry_table_create(struct ferry *fy, const struct ferry_table_params *p,
		       struct ferry_table **table_p)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_table m;
	} msg;
	struct ferry_msg_table ack;
	struct ferry_table *t;
	uint32_t id;
	int rc;

	if (!fy || !p || !table_p)
		return -EINVAL;
	if (atomic_load(&fy->closed))
		return -FERRY_E_CLOSED;
	rc = table_check_params(p);
	if (rc)
		return rc;
	if (p->replicas && p->replicas >= fy->world) {
		/* a key and its backups on r + 1 different nodes */
		ferry_err("table: replicas %u needs at least %u nodes and this cluster has %u; use "
			  "replicas %u or fewer, or more nodes",
			  p->replicas, p->replicas + 1, fy->world, fy->world ? fy->world - 1 : 0);
		return -EINVAL;
	}
	/* destroyed tables first: their ids must be free here when they are
	 * free on the other nodes */
	table_reap(fy, true, false);
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	rc = table_build(fy, p, t);
	if (rc) {
		if (rc == -ENOMEM)
			ferry_err("table: out of memory for %llu keys",
				  (unsigned long long)p->num_keys);
		goto err_free;
	}
	rc = ferry__cons_table_init(t);
	if (rc) {
		ferry_err("table: out of memory for the consistency model's state");
		goto err_free;
	}

	pthread_mutex_lock(&fy->lock);
	for (id = 0; id < FERRY_MAX_TABLES && fy->table_inuse[id]; id++)
		;
	if (id == FERRY_MAX_TABLES) {
		pthread_mutex_unlock(&fy->lock);
		ferry_err("table: this node has %d tables, the limit; destroy unused ones",
			  FERRY_MAX_TABLES);
		rc = -ENOSPC;
		goto err_free;
	}
	/* the lowest free id: the same on every node, as every node creates
	 * in the same order and frees an id only after all destroyed it */
	fy->table_inuse[id] = true;
	if (id >= fy->ntables)
		fy->ntables = id + 1;
	t->id = id;
	rcu_assign_pointer(fy->tables[id], t);
	if (fy->rank == 0)
		table_record(fy, 0, id, &t->wire);
	pthread_mutex_unlock(&fy->lock);

	if (fy->rank != 0) {
		ferry__proto_hdr_init(&msg.h, FERRY_MSG_TABLE, sizeof(msg), fy->rank, id);
		memset(&msg, 0, sizeof(msg));
		ferry__proto_hdr_init(&msg.h, FERRY_MSG_TABLE, sizeof(msg), fy->rank, id);
		msg.m = t->wire;
		rc = ferry__send(fy, 0, &msg, sizeof(msg));
		if (rc)
			goto err_unpublish;
	}

	rc = table_wait_verdict(fy, id, &ack);
	if (rc == -ETIMEDOUT)
		ferry_err("table %u: not every node created it within %d ms, and rank 0 gave no "
			  "verdict; every node must call ferry_table_create() in the same order",
			  id, fy->timeout_ms);
	if (rc)
		goto err_unpublish;
	if (ack.status == -FERRY_E_MISMATCH) {
		ferry_err("table %u: rank %u created it with a different %s than rank 0; pass "
			  "the same parameters on every node",
			  id, ack.from_rank,
			  ack.field < sizeof(table_field_names) / sizeof(table_field_names[0]) ?
				  table_field_names[ack.field] :
				  "field");
		rc = ack.status;
		goto err_unpublish;
	}
	if (ack.status) {
		ferry_err("table %u: failed on every node: rank %u %s; every node must call "
			  "ferry_table_create() in the same order, within the timeout (%d ms)",
			  id, ack.from_rank,
			  ack.status == -FERRY_E_PEER ? "failed before it created it" :
							"gave up waiting for the others",
			  fy->timeout_ms);
		rc = ack.status;
		goto err_unpublish;
	}
	if (t->wire.arena_addr) {
		pthread_mutex_lock(&fy->lock);
		t->peer_arena = fy->table_arenas[id];
		fy->table_arenas[id] = NULL;
		pthread_mutex_unlock(&fy->lock);
		if (!t->peer_arena) {
			ferry_err("table %u: rank 0 sent no arena addresses; one-sided access is "
				  "off for this table",
				  id);
		} else {
			table_check_inboxes(t);
			/* the progress thread may serve this table already: publish last */
			__atomic_store_n(&t->onesided, true, __ATOMIC_RELEASE);
			ferry__reloc_inbox_grant(fy, t);
		}
	}
	ferry__cons_table_publish(t);
	atomic_fetch_add(&fy->refs, 1);
	*table_p = t;
	return 0;

err_unpublish:
	pthread_mutex_lock(&fy->lock);
	rcu_assign_pointer(fy->tables[id], NULL);
	/* the id of a failed create stays taken: the others may have failed
	 * later than this node, and ids must agree everywhere */
	pthread_mutex_unlock(&fy->lock);
	urcu_memb_synchronize_rcu();
err_free:
	table_free(t);
	return rc;
}

/* forget rank 0's and the acknowledgement's state of table @id, so that the
 * id can be created again; fy->lock held */
static void table_id_reset(struct ferry *fy, uint32_t id)
{
	free(fy->table_seen[id]);
	fy->table_seen[id] = NULL;
	fy->table_nseen[id] = 0;
	fy->table_verdict[id] = 0;
	memset(&fy->table_ack[id], 0, sizeof(fy->table_ack[id]));
	free(fy->table_arenas[id]);
	fy->table_arenas[id] = NULL;
	free(fy->table_freeing[id]);
	fy->table_freeing[id] = NULL;
}

/*
 * Rank 0, fy->lock held: once every live rank destroyed table @id, reset its
 * state and tell everyone (in order before any later TABLE of theirs, so a
 * reused id starts afresh everywhere).
 */
static void table_try_free(struct ferry *fy, uint32_t id)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_barrier b;
	} ack;

	if (!fy->table_freeing[id] || fy->table_freed[id])
		return;
	for (uint32_t r = 0; r < fy->world; r++)
		if (!fy->table_freeing[id][r] && !atomic_load(&fy->failed[r]))
			return;
	table_id_reset(fy, id);
	fy->table_freed[id] = true;
	memset(&ack, 0, sizeof(ack));
	ferry__proto_hdr_init(&ack.h, FERRY_MSG_TABLE_FREE_ACK, sizeof(ack), fy->rank, id);
	pthread_mutex_unlock(&fy->lock);
	for (uint32_t r = 1; r < fy->world; r++)
		ferry__send(fy, r, &ack, sizeof(ack));
	pthread_mutex_lock(&fy->lock);
	pthread_cond_broadcast(&fy->cond);
}

/* fy->lock held: rank @src destroyed table @id */
static void table_freeing(struct ferry *fy, uint32_t src, uint32_t id)
{
	if (!fy->table_freeing[id]) {
		fy->table_freeing[id] = calloc(fy->world, 1);
		if (!fy->table_freeing[id])
			return; /* the destroys time out, and say so */
	}
	fy->table_freeing[id][src] = 1;
	table_try_free(fy, id);
}

static void table_on_free_msg(struct ferry *fy, struct ferry_table *unused, uint32_t src,
			      const struct ferry_proto_view *v)
{
	uint32_t id = v->hdr->table;

	if (id >= FERRY_MAX_TABLES) {
		ferry_warn("table: rank %u sent a table id %u out of range; ignored", src, id);
		return;
	}
	pthread_mutex_lock(&fy->lock);
	if (v->hdr->type == FERRY_MSG_TABLE_FREE && fy->rank == 0) {
		table_freeing(fy, src, id);
	} else if (v->hdr->type == FERRY_MSG_TABLE_FREE_ACK && src == 0 &&
		   !(fy->tables[id] ? fy->tables[id]->dying : fy->table_inuse[id])) {
		/* rank 0 acknowledges only what every live node destroyed: this
		 * one has not (or the id is free), so the table stays */
		ferry_warn("table: rank 0 says table %u was destroyed everywhere, but this node "
			   "has not destroyed it; ignored",
			   id);
	} else if (v->hdr->type == FERRY_MSG_TABLE_FREE_ACK && src == 0) {
		table_id_reset(fy, id);
		fy->table_freed[id] = true;
		pthread_cond_broadcast(&fy->cond);
	} else {
		ferry_warn("table: rank %u sent a table release meant for rank 0; ignored", src);
	}
	pthread_mutex_unlock(&fy->lock);
}

/*
 * The destroy fence. ferry_table_destroy does not free the table at once:
 * this node keeps serving it (messages, one-sided reads and writes into its
 * arena and inbox) until every live node destroyed it too, so no peer's
 * access meets a deregistered region (on RDMA that would put the queue pair
 * in error, and the two nodes would fail each other for good). Rank 0
 * counts the destroys and tells everyone; the table is then freed at the
 * next create, destroy or close on this node (table_reap), never on the
 * progress thread (freeing waits for a grace period).
 */
static void table_fence_start(struct ferry *fy, struct ferry_table *t)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_barrier b;
	} msg;

	pthread_mutex_lock(&fy->lock);
	t->dying = true;
	if (fy->rank == 0)
		table_freeing(fy, 0, t->id);
	pthread_mutex_unlock(&fy->lock);
	if (fy->rank != 0) {
		memset(&msg, 0, sizeof(msg));
		ferry__proto_hdr_init(&msg.h, FERRY_MSG_TABLE_FREE, sizeof(msg), fy->rank, t->id);
		if (ferry__send(fy, 0, &msg, sizeof(msg)))
			/* rank 0 left or failed: nobody can fence any more */
			ferry_info("table %u: rank 0 cannot be told it was destroyed here (it "
				   "left); it is freed when this node closes",
				   t->id);
	}
}

/* unpublish and free a destroyed table; fy->lock not held */
static void table_release(struct ferry *fy, struct ferry_table *t, bool fenced)
{
	uint32_t id = t->id;

	pthread_mutex_lock(&fy->lock);
	rcu_assign_pointer(fy->tables[id], NULL);
	pthread_mutex_unlock(&fy->lock);
	/* no handler sees the table after this; then let deferred frees run */
	urcu_memb_synchronize_rcu();
	urcu_memb_barrier();
	pthread_mutex_lock(&fy->lock);
	/* a fenced id is free for the next create (every node freed it); an
	 * unfenced one stays taken, so that ids keep agreeing */
	fy->table_freed[id] = false;
	if (fenced)
		fy->table_inuse[id] = false;
	pthread_mutex_unlock(&fy->lock);
	table_free(t);
	ferry__node_put(fy);
}

/*
 * Free the destroyed tables whose fence passed. @wait: first wait for every
 * fence, bounded by the timeout (a create must: the ids it picks from must
 * agree with the other nodes'); @force: free them all now (close: the peers
 * see this node leave). Context: an application thread, no lock held.
 */
static void table_reap(struct ferry *fy, bool wait, bool force)
{
	struct timespec ts;

	ferry__deadline_ms(fy->timeout_ms, &ts);
	for (uint32_t id = 0; id < FERRY_MAX_TABLES; id++) {
		struct ferry_table *t;
		bool fenced = false;

		pthread_mutex_lock(&fy->lock);
		t = fy->tables[id];
		if (t && t->dying && wait && !force) {
			while (!fy->table_freed[id] && !atomic_load(&fy->closed) &&
			       !(fy->rank != 0 && atomic_load(&fy->failed[0])) &&
			       ferry__cond_wait_until(&fy->cond, &fy->lock, &ts) != ETIMEDOUT)
				;
			if (!fy->table_freed[id])
				ferry_warn("table %u: not every node destroyed it within %d ms; "
					   "freeing it here anyway (a peer that still uses it "
					   "fails); call ferry_table_destroy() on every node",
					   id, fy->timeout_ms);
		}
		if (t && t->dying)
			fenced = fy->table_freed[id];
		pthread_mutex_unlock(&fy->lock);
		if (t && t->dying && (fenced || wait || force))
			table_release(fy, t, fenced);
	}
}

void ferry__table_close(struct ferry *fy)
{
	table_reap(fy, false, true);
}

void ferry_table_destroy(struct ferry_table *t)
{
	struct ferry *fy;

	if (!t)
		return;
	fy = t->fy;
	/* this node's buffers and copies go now; the table is served on */
	ferry__cons_table_fini(t);
	if (atomic_load(&fy->closed)) {
		table_release(fy, t, false);
		return;
	}
	table_fence_start(fy, t);
	table_reap(fy, false, false);
}

int ferry__table_attach(struct ferry *fy)
{
	int rc = ferry__dispatch_register(fy, FERRY_MSG_TABLE, FERRY_DISPATCH_NODE, table_on_msg);

	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_TABLE_ACK, FERRY_DISPATCH_NODE,
					      table_on_msg);
	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_TABLE_FREE, FERRY_DISPATCH_NODE,
					      table_on_free_msg);
	if (!rc)
		rc = ferry__dispatch_register(fy, FERRY_MSG_TABLE_FREE_ACK, FERRY_DISPATCH_NODE,
					      table_on_free_msg);
	return rc ? rc : ferry__node_on_peer_failed(fy, table_on_peer_failed);
}

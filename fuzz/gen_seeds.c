/* SPDX-License-Identifier: MIT */
/*
 * gen_seeds - write a seed corpus of valid inputs for each fuzz target, in
 * the layouts fuzz.h describes, built with the same frame builder and
 * structs the nodes use (so the seeds follow the wire format as it changes):
 *
 *   gen_seeds DIR    writes DIR/frame/, DIR/handshake/, DIR/bootstrap/,
 *                    DIR/table/ (created if missing)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz/fuzz.h"
#include "lib/core/bootstrap.h"

static const char *out_dir;
static int nseeds;

static void seed_write(const char *target, const char *name, const void *pre, size_t plen,
		       const void *buf, size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", out_dir, target);
	if (mkdir(path, 0755) && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
	f = fopen(path, "wb");
	if (!f || fwrite(pre, 1, plen, f) != plen || fwrite(buf, 1, len, f) != len || fclose(f)) {
		perror(path);
		exit(1);
	}
	nseeds++;
}

/* a finished frame to fuzz_frame under every table mode */
static void seed_frame(const char *name, struct ferry_frame *f, uint8_t type, uint32_t src,
		       uint8_t world_byte)
{
	char n[128];

	if (ferry__frame_finish(f, type, src, 0)) {
		fprintf(stderr, "gen_seeds: %s did not build\n", name);
		exit(1);
	}
	for (uint8_t mode = 0; mode < 4; mode++) {
		uint8_t pre[2] = { mode, world_byte };

		snprintf(n, sizeof(n), "%s-mode%u", name, mode);
		seed_write("frame", n, pre, sizeof(pre), f->buf, f->len);
	}
	ferry__frame_free(f);
}

static void frames(void)
{
	uint32_t key_lens[FUZZ_NKEYS];
	struct ferry_frame f;

	fuzz_key_lens(key_lens);
	/* world byte 3: a world of 4 */
	for (uint8_t op = FERRY_OP_PULL; op <= FERRY_OP_SET; op++) {
		struct ferry_msg_op *o;
		char n[64];

		ferry__frame_begin(&f);
		o = ferry__frame_put(&f, sizeof(*o));
		o->origin = 1;
		o->req = 7;
		o->op = op;
		o->count = 2;
		for (uint32_t i = 0; i < 2; i++) {
			struct ferry_msg_key *k = ferry__frame_put(&f, sizeof(*k));

			k->key = 5 + i;
			k->idx = i;
			k->len = FUZZ_VLEN;
		}
		if (op != FERRY_OP_PULL)
			ferry__frame_put(&f, 2 * FUZZ_VLEN * sizeof(float));
		snprintf(n, sizeof(n), "op%u", op);
		seed_frame(n, &f, FERRY_MSG_OP, 1, 3);
	}
	for (int slots = 0; slots < 2; slots++) {
		struct ferry_msg_reply *r;

		ferry__frame_begin(&f);
		r = ferry__frame_put(&f, sizeof(*r));
		r->req = 7;
		r->count = 3;
		r->op = FERRY_OP_PULL;
		r->flags = slots ? FERRY_REPLY_F_SLOTS : 0;
		ferry__frame_put(&f, 3 * sizeof(uint32_t));
		if (slots)
			ferry__frame_put(&f, sizeof(uint32_t) + 3 * sizeof(uint64_t));
		ferry__frame_put(&f, 3 * FUZZ_VLEN * sizeof(float));
		seed_frame(slots ? "reply-slots" : "reply", &f, FERRY_MSG_REPLY, 2, 3);
	}
	for (uint8_t type = FERRY_MSG_LOCALIZE; type <= FERRY_MSG_HANDOVER_DONE; type++) {
		struct ferry_msg_move *mv;
		char n[64];

		if (type > FERRY_MSG_LOC_ACK && type != FERRY_MSG_HANDOVER_DONE)
			continue;
		ferry__frame_begin(&f);
		mv = ferry__frame_put(&f, sizeof(*mv));
		mv->requester = 1;
		mv->count = 2;
		for (uint32_t i = 0; i < 2; i++) {
			struct ferry_msg_mv *m = ferry__frame_put(&f, sizeof(*m));

			m->key = 10 + i;
			m->slot = i;
			m->landing = type == FERRY_MSG_HANDOVER_DONE ? i : FERRY_LANDING_NONE;
			m->len = type == FERRY_MSG_HANDOVER ? FUZZ_VLEN : 0;
		}
		if (type == FERRY_MSG_HANDOVER)
			ferry__frame_put(&f, 2 * FUZZ_VLEN * sizeof(float));
		snprintf(n, sizeof(n), "move%u", type);
		seed_frame(n, &f, type, 2, 3);
	}
	{
		static const uint8_t bar[] = { FERRY_MSG_BARRIER, FERRY_MSG_BARRIER_REL,
					       FERRY_MSG_TABLE_FREE, FERRY_MSG_TABLE_FREE_ACK };

		for (size_t i = 0; i < sizeof(bar); i++) {
			struct ferry_msg_barrier *b;
			char n[64];

			ferry__frame_begin(&f);
			b = ferry__frame_put(&f, sizeof(*b));
			b->gen = 3;
			snprintf(n, sizeof(n), "barrier%u", bar[i]);
			seed_frame(n, &f, bar[i], 0, 3);
		}
	}
	{
		struct ferry_msg_chunk *c;

		ferry__frame_begin(&f);
		c = ferry__frame_put(&f, sizeof(*c));
		c->chunk = 3;
		c->shift = 12;
		c->rkey = 0x1234;
		seed_frame("chunk", &f, FERRY_MSG_CHUNK, 1, 3);
		/* a landing inbox region's grant (lib/reloc/inbox.c) */
		ferry__frame_begin(&f);
		c = ferry__frame_put(&f, sizeof(*c));
		c->chunk = FERRY_CHUNK_INBOX;
		c->shift = 0;
		c->rkey = 0x5678;
		seed_frame("chunk-inbox", &f, FERRY_MSG_CHUNK, 1, 3);
	}
	{
		/* hot-key deltas (lib/cons/hot.c): two entries, then their values */
		struct ferry_msg_hot_push *h;
		struct ferry_msg_hot_ent *e;

		ferry__frame_begin(&f);
		h = ferry__frame_put(&f, sizeof(*h));
		h->seq = 1;
		h->count = 2;
		e = ferry__frame_put(&f, 2 * sizeof(*e));
		e[0] = (struct ferry_msg_hot_ent){ .idx = 0, .len = 2 };
		e[1] = (struct ferry_msg_hot_ent){ .idx = 5, .len = 2 };
		for (int i = 0; i < 4; i++)
			*(float *)ferry__frame_put(&f, sizeof(float)) = (float)i;
		seed_frame("hot-push", &f, FERRY_MSG_HOT_PUSH, 1, 3);
		ferry__frame_begin(&f);
		((struct ferry_msg_hot_ack *)ferry__frame_put(&f, sizeof(struct ferry_msg_hot_ack)))
			->seq = 1;
		seed_frame("hot-ack", &f, FERRY_MSG_HOT_ACK, 1, 3);
	}
	{
		/* the consistency models (lib/cons/): a clock, a batch of two
		 * keys' deltas and its answers, ESSP's subscription, pushed
		 * values and kick */
		struct ferry_msg_cons_push *cp;
		struct ferry_msg_cons_key *ck;
		struct ferry_msg_cons_ack *ca;
		struct ferry_msg_cons_st *st;
		struct ferry_msg_essp_sub *es;
		struct ferry_msg_essp_val *ev;
		struct ferry_msg_essp_ent *ee;

		ferry__frame_begin(&f);
		((struct ferry_msg_clock *)ferry__frame_put(&f, sizeof(struct ferry_msg_clock)))
			->clock = 4;
		seed_frame("clock", &f, FERRY_MSG_CLOCK, 1, 3);
		ferry__frame_begin(&f);
		cp = ferry__frame_put(&f, sizeof(*cp));
		cp->seq = 1;
		cp->total = 2;
		cp->count = 2;
		ck = ferry__frame_put(&f, 2 * sizeof(*ck));
		ck[0] = (struct ferry_msg_cons_key){ .key = 3, .idx = 0, .len = FUZZ_VLEN };
		ck[1] = (struct ferry_msg_cons_key){ .key = 9, .idx = 1, .len = FUZZ_VLEN };
		ferry__frame_put(&f, 2 * FUZZ_VLEN * sizeof(float));
		seed_frame("cons-push", &f, FERRY_MSG_CONS_PUSH, 1, 3);
		ferry__frame_begin(&f);
		ca = ferry__frame_put(&f, sizeof(*ca));
		ca->seq = 1;
		ca->count = 2;
		st = ferry__frame_put(&f, 2 * sizeof(*st));
		st[0] = (struct ferry_msg_cons_st){ .idx = 0 };
		st[1] = (struct ferry_msg_cons_st){ .idx = 1, .status = -EAGAIN, .hint = 2 };
		seed_frame("cons-ack", &f, FERRY_MSG_CONS_ACK, 2, 3);
		ferry__frame_begin(&f);
		es = ferry__frame_put(&f, sizeof(*es));
		es->done = 1;
		es->id = 5;
		es->count = 2;
		es->origin = 1;
		*(uint64_t *)ferry__frame_put(&f, sizeof(uint64_t)) = 3;
		*(uint64_t *)ferry__frame_put(&f, sizeof(uint64_t)) = 9;
		seed_frame("essp-sub", &f, FERRY_MSG_ESSP_SUB, 1, 3);
		ferry__frame_begin(&f);
		ev = ferry__frame_put(&f, sizeof(*ev));
		ev->fresh = 3;
		ev->count = 2;
		ee = ferry__frame_put(&f, 2 * sizeof(*ee));
		ee[0] = (struct ferry_msg_essp_ent){ .key = 3, .tag = 1, .id = 5, .len = FUZZ_VLEN };
		ee[1] = (struct ferry_msg_essp_ent){ .key = 9, .tag = 1, .id = 5, .len = FUZZ_VLEN };
		ferry__frame_put(&f, 2 * FUZZ_VLEN * sizeof(float));
		seed_frame("essp-val", &f, FERRY_MSG_ESSP_VAL, 2, 3);
		ferry__frame_begin(&f);
		((struct ferry_msg_essp_kick *)ferry__frame_put(&f,
								sizeof(struct ferry_msg_essp_kick)))
			->clock = 4;
		seed_frame("essp-kick", &f, FERRY_MSG_ESSP_KICK, 1, 3);
	}
	{
		/* collectives by one-sided WRITE (lib/coll/put.c): a receiver's
		 * keys, and a writer's notice that a segment landed */
		struct ferry_msg_coll *c;
		struct ferry_msg_coll_keys *k;

		ferry__frame_begin(&f);
		c = ferry__frame_put(&f, sizeof(*c));
		*c = (struct ferry_msg_coll){ .seq = 0, .count = 1024, .kind = 0, .dtype = 0 };
		k = ferry__frame_put(&f, sizeof(*k));
		*k = (struct ferry_msg_coll_keys){
			.buf_addr = 4096, .buf_rkey = 7, .land_addr = 8192, .land_rkey = 9
		};
		seed_frame("coll-keys", &f, FERRY_MSG_COLL_KEYS, 1, 3);
		ferry__frame_begin(&f);
		c = ferry__frame_put(&f, sizeof(*c));
		*c = (struct ferry_msg_coll){
			.seq = 0, .count = 1024, .off = 256, .n = 256, .step = 1
		};
		seed_frame("coll-put", &f, FERRY_MSG_COLL_PUT, 1, 3);
	}
	ferry__frame_begin(&f);
	ferry__frame_put(&f, sizeof(struct ferry_msg_table));
	seed_frame("table", &f, FERRY_MSG_TABLE, 1, 3);
	ferry__frame_begin(&f);
	ferry__frame_put(&f, sizeof(struct ferry_msg_table));
	ferry__frame_put(&f, 4 * sizeof(struct ferry_msg_arena));
	seed_frame("table-ack", &f, FERRY_MSG_TABLE_ACK, 0, 3);
	ferry__frame_begin(&f);
	seed_frame("bye", &f, FERRY_MSG_BYE, 1, 3);
	for (int view = 0; view < 2; view++) {
		struct ferry_msg_rejoin *rj;

		ferry__frame_begin(&f);
		rj = ferry__frame_put(&f, sizeof(*rj));
		*rj = (struct ferry_msg_rejoin){ .rank = 3, .seq = 1, .state = (uint32_t)view };
		seed_frame(view ? "rejoin-view" : "rejoin-ask", &f,
			   view ? FERRY_MSG_REJOIN_VIEW : FERRY_MSG_REJOIN_ASK, view ? 1 : 0, 3);
	}
}

static void handshakes(void)
{
	uint8_t hs[2 * sizeof(struct ferry_msg_hdr) + sizeof(struct ferry_msg_hello) +
		   sizeof(struct ferry_msg_resume)];
	struct ferry_msg_hdr h;
	struct ferry_msg_hello hello = { .cluster_id = FUZZ_CLUSTER, .rank = 2, .world = 4 };
	struct ferry_msg_resume r = { .incarnation = FUZZ_INCARNATION };
	size_t off = 0;

	/* rank 2 of 4 dials rank 1: world byte 2 (1 + fuzz_world), rank byte 1 */
	ferry__proto_hdr_init(&h, FERRY_MSG_HELLO, sizeof(h) + sizeof(hello), 2, 0);
	memcpy(hs, &h, sizeof(h));
	memcpy(hs + sizeof(h), &hello, sizeof(hello));
	off = sizeof(h) + sizeof(hello);
	ferry__proto_hdr_init(&h, FERRY_MSG_RESUME, sizeof(h) + sizeof(r), 2, 0);
	memcpy(hs + off, &h, sizeof(h));
	memcpy(hs + off + sizeof(h), &r, sizeof(r));
	seed_write("handshake", "first", (uint8_t[4]){ 2, 1, 0, 0 }, 4, hs, sizeof(hs));
	seed_write("handshake", "dialed", (uint8_t[4]){ 2, 3, 1 | (2 << 1), 0 }, 4, hs, sizeof(hs));
	r.delivered = 40;
	r.sent = 41;
	memcpy(hs + off + sizeof(h), &r, sizeof(r));
	seed_write("handshake", "resume", (uint8_t[4]){ 2, 1, 0x80, 0 }, 4, hs, sizeof(hs));
	seed_write("handshake", "hello-only", (uint8_t[4]){ 2, 1, 0, 0 }, 4, hs, off);
}

static void bootstrap(void)
{
	struct ferry_bs_hello h = {
		.magic = FERRY_BS_MAGIC, .version = FERRY_BS_VERSION, .rank = 2, .world = 4
	};
	struct {
		struct ferry_bs_list l;
		struct ferry_addr a[4];
	} list = { 0 };

	h.addr.len = (uint32_t)snprintf((char *)h.addr.buf, sizeof(h.addr.buf), "127.0.0.1:4000");
	seed_write("bootstrap", "hello", (uint8_t[4]){ 0, 3, 0, 0 }, 4, &h, sizeof(h));
	h.world = 5;
	seed_write("bootstrap", "hello-world5", (uint8_t[4]){ 0, 3, 0, 0 }, 4, &h, sizeof(h));
	h.magic = FERRY_BS_REJOIN_MAGIC;
	h.world = 4;
	seed_write("bootstrap", "rejoin", (uint8_t[4]){ 2, 3, 0, 0 }, 4, &h, sizeof(h));
	h.magic = FERRY_BS_MAGIC;
	list.l.magic = FERRY_BS_MAGIC;
	list.l.cluster_id = FUZZ_CLUSTER;
	list.l.world = 4;
	for (int r = 0; r < 4; r++)
		list.a[r].len = (uint32_t)snprintf((char *)list.a[r].buf, sizeof(list.a[r].buf),
						   "127.0.0.1:%d", 4000 + r);
	seed_write("bootstrap", "list", (uint8_t[4]){ 1, 3, 2, 0 }, 4, &list, sizeof(list));
	list.l.status = -FERRY_E_NOJOIN;
	list.l.nmissing = 2;
	list.l.missing[0] = 1;
	list.l.missing[1] = 3;
	seed_write("bootstrap", "list-nojoin", (uint8_t[4]){ 1, 3, 2, 0 }, 4, &list.l,
		   sizeof(list.l));
	list.l.status = -FERRY_E_MISMATCH;
	list.l.nmissing = 0;
	list.l.world = 5;
	seed_write("bootstrap", "list-mismatch", (uint8_t[4]){ 1, 3, 2, 0 }, 4, &list.l,
		   sizeof(list.l));
}

static void tables(void)
{
	struct {
		struct ferry_msg_table t;
		struct ferry_msg_arena a[4];
	} m = { 0 };

	m.t.num_keys = 1000;
	m.t.capacity = 1000;
	m.t.value_len = 8;
	m.t.vnodes = 64;
	m.t.init = 1;
	m.t.init_a = -0.5f;
	m.t.init_b = 0.5f;
	m.t.init_seed = 42;
	m.t.inbox_addr = 0x7f0000000000ull;
	m.t.inbox_rkey = 0x99;
	m.t.inbox_entries = 64;
	m.t.inbox_stride = 64;
	seed_write("table", "table", (uint8_t[2]){ 3, 0 }, 2, &m.t, sizeof(m.t));
	m.t.sparse = 1;
	m.t.num_keys = 0;
	seed_write("table", "table-sparse", (uint8_t[2]){ 3, 0 }, 2, &m.t, sizeof(m.t));
	seed_write("table", "ack", (uint8_t[2]){ 3, 1 }, 2, &m.t, sizeof(m.t));
	for (int r = 0; r < 4; r++) {
		m.a[r].addr = 0x7f0000100000ull + (uint64_t)r * 0x100000;
		m.a[r].rkey = 0x100 + (uint64_t)r;
		m.a[r].inbox_addr = r % 2 ? 0x7f0000800000ull : 0;
		m.a[r].inbox_rkey = r % 2 ? 0x200 : 0;
		m.a[r].inbox_entries = r % 2 ? 16 : 0;
		m.a[r].inbox_stride = r % 2 ? 128 : 0;
	}
	seed_write("table", "ack-arenas", (uint8_t[2]){ 3, 1 }, 2, &m, sizeof(m));
	m.t.status = -FERRY_E_MISMATCH;
	m.t.field = FERRY_TF_VNODES;
	m.t.from_rank = 2;
	seed_write("table", "ack-mismatch", (uint8_t[2]){ 3, 1 }, 2, &m.t, sizeof(m.t));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: gen_seeds DIR\n");
		return 2;
	}
	out_dir = argv[1];
	if (mkdir(out_dir, 0755) && errno != EEXIST) {
		perror(out_dir);
		return 1;
	}
	frames();
	handshakes();
	bootstrap();
	tables();
	printf("gen_seeds: %d seeds in %s\n", nseeds, out_dir);
	return 0;
}

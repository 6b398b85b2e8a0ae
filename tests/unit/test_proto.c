/* SPDX-License-Identifier: MIT */
/*
 * test_proto.c - the wire format: frames built with the frame builder parse
 * back to what was put in, and every malformed field a peer could send is
 * refused with -FERRY_E_PROTO and a reason, never read past.
 *
 * Every frame under test is copied into a buffer of exactly its length, so
 * that AddressSanitizer builds catch any read past the end.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"
#include "lib/core/proto.h"

#define WORLD 4
#define NKEYS 100
#define VLEN 3

static uint32_t key_lens[NKEYS]; /* per-key lengths: 1 + key % 5 */

static const struct ferry_proto_limits lim_fixed = {
	.world = WORLD,
	.num_keys = NKEYS,
	.value_len = VLEN,
};

static struct ferry_proto_limits lim_perkey = {
	.world = WORLD,
	.num_keys = NKEYS,
	.value_lens = key_lens,
};

static void proto_setup(void)
{
	for (uint32_t k = 0; k < NKEYS; k++)
		key_lens[k] = 1 + k % 5;
}

TestSuite(proto, .init = proto_setup);

/* a finished frame in a buffer of exactly its length */
struct fr {
	uint8_t *buf;
	size_t len;
};

static struct fr fr_take(struct ferry_frame *f, uint8_t type, uint32_t src, uint32_t table)
{
	struct fr x;
	int rc = ferry__frame_finish(f, type, src, table);

	cr_assert_eq(rc, 0, "frame_finish: %d", rc);
	cr_assert_eq(f->len % FERRY_MSG_ALIGN, 0, "finished frame of %zu bytes not aligned",
		     f->len);
	x.len = f->len;
	x.buf = malloc(x.len);
	cr_assert_not_null(x.buf);
	memcpy(x.buf, f->buf, x.len);
	ferry__frame_free(f);
	return x;
}

static struct ferry_msg_hdr *fr_hdr(struct fr *x)
{
	return (struct ferry_msg_hdr *)x->buf;
}

static void *fr_body(struct fr *x)
{
	return x->buf + sizeof(struct ferry_msg_hdr);
}

/* grow or shrink a frame by @delta bytes (zeros appended) and fix the header's len */
static void fr_resize(struct fr *x, long delta)
{
	size_t n = (size_t)((long)x->len + delta);
	uint8_t *b = malloc(n);

	cr_assert_not_null(b);
	memset(b, 0, n);
	memcpy(b, x->buf, n < x->len ? n : x->len);
	free(x->buf);
	x->buf = b;
	x->len = n;
	fr_hdr(x)->len = (uint32_t)n;
}

static void fr_free(struct fr *x)
{
	free(x->buf);
	x->buf = NULL;
}

static float val_of(uint64_t key, uint32_t j)
{
	return (float)key * 10.0f + (float)j + 0.5f;
}

static uint32_t lim_len(const struct ferry_proto_limits *lim, uint64_t key)
{
	return lim->value_lens ? lim->value_lens[key] : lim->value_len;
}

/*
 * OP: @count_field in the body, @n entries from @keys (len from @lens, or the
 * table's when NULL), then @nvals floats.
 */
static struct fr op_frame(uint8_t op, uint32_t origin, uint32_t count_field, const uint64_t *keys,
			  const uint32_t *lens, uint32_t n, const struct ferry_proto_limits *lim,
			  size_t nvals)
{
	struct ferry_frame f;
	struct ferry_msg_op *b;
	size_t put = 0;

	ferry__frame_begin(&f);
	b = ferry__frame_put(&f, sizeof(*b));
	cr_assert_not_null(b);
	b->origin = origin;
	b->worker = 17;
	b->req = 0x1122334455667788ull;
	b->op = op;
	b->hops = 2;
	b->count = count_field;
	for (uint32_t i = 0; i < n; i++) {
		struct ferry_msg_key *k = ferry__frame_put(&f, sizeof(*k));

		cr_assert_not_null(k);
		k->key = keys[i];
		k->idx = 1000 + i;
		k->len = lens ? lens[i] : (keys[i] < NKEYS ? lim_len(lim, keys[i]) : VLEN);
	}
	for (uint32_t i = 0; i < n && put < nvals; i++) {
		uint32_t len = lens ? lens[i] : (keys[i] < NKEYS ? lim_len(lim, keys[i]) : VLEN);

		for (uint32_t j = 0; j < len && put < nvals; j++, put++)
			*(float *)ferry__frame_put(&f, sizeof(float)) = val_of(keys[i], j);
	}
	for (; put < nvals; put++)
		*(float *)ferry__frame_put(&f, sizeof(float)) = -1.0f;
	return fr_take(&f, FERRY_MSG_OP, 1, 5);
}

/* floats a push/set of @keys carries under @lim */
static size_t op_nvals(const uint64_t *keys, uint32_t n, const struct ferry_proto_limits *lim)
{
	size_t s = 0;

	for (uint32_t i = 0; i < n; i++)
		s += lim_len(lim, keys[i]);
	return s;
}

/* LOCALIZE, HANDOVER_REQ, HANDOVER, LOC_ACK, HANDOVER_DONE; entry i names
 * slot 500 + i and landing entry 1000 + i */
static struct fr move_frame(uint8_t type, uint32_t requester, uint32_t count_field,
			    const uint64_t *keys, const uint32_t *lens, uint32_t n, size_t nvals)
{
	struct ferry_frame f;
	struct ferry_msg_move *b;

	ferry__frame_begin(&f);
	b = ferry__frame_put(&f, sizeof(*b));
	cr_assert_not_null(b);
	b->requester = requester;
	b->count = count_field;
	for (uint32_t i = 0; i < n; i++) {
		struct ferry_msg_mv *m = ferry__frame_put(&f, sizeof(*m));

		m->key = keys[i];
		m->slot = 500 + i;
		m->len = lens[i];
		m->landing = 1000 + i;
	}
	for (size_t i = 0; i < nvals; i++)
		*(float *)ferry__frame_put(&f, sizeof(float)) = (float)i + 0.25f;
	return fr_take(&f, type, 2, 5);
}

static struct fr reply_frame(uint8_t op, uint32_t count_field, uint32_t n, int32_t status,
			     size_t nvals)
{
	struct ferry_frame f;
	struct ferry_msg_reply *b;

	ferry__frame_begin(&f);
	b = ferry__frame_put(&f, sizeof(*b));
	cr_assert_not_null(b);
	b->req = 99;
	b->worker = 3;
	b->count = count_field;
	b->status = status;
	b->owner = 2;
	b->op = op;
	for (uint32_t i = 0; i < n; i++)
		*(uint32_t *)ferry__frame_put(&f, sizeof(uint32_t)) = 7 * i;
	for (size_t i = 0; i < nvals; i++)
		*(float *)ferry__frame_put(&f, sizeof(float)) = (float)i * 2.0f;
	return fr_take(&f, FERRY_MSG_REPLY, 3, 5);
}

/* a type with a fixed body only; @extra bytes after it. The body is a byte
 * pattern, except that a table body announces no landing inbox (its inbox
 * fields are checked: all zero is the one value a pattern cannot break) */
static struct fr fixed_frame(uint8_t type, size_t body, size_t extra)
{
	struct ferry_frame f;
	uint8_t *p;

	ferry__frame_begin(&f);
	p = ferry__frame_put(&f, body + extra);
	cr_assert(p || body + extra == 0);
	for (size_t i = 0; i < body; i++)
		p[i] = (uint8_t)(i + 1);
	for (size_t i = body; i < body + extra; i++)
		p[i] = 0xee;
	if (type == FERRY_MSG_TABLE || type == FERRY_MSG_TABLE_ACK) {
		struct ferry_msg_table *t = (struct ferry_msg_table *)p;

		t->inbox_addr = t->inbox_rkey = 0;
		t->inbox_entries = t->inbox_stride = 0;
		t->init = t->sparse = 0;
		t->consistency = t->staleness = 0;
	}
	return fr_take(&f, type, 0, 0);
}

static void expect_ok(struct fr *x, const struct ferry_proto_limits *lim,
		      struct ferry_proto_view *v, const char *what)
{
	const char *why = NULL;
	int rc;

	rc = ferry__proto_check_hdr(fr_hdr(x), WORLD, &why);
	cr_assert_eq(rc, 0, "%s: header refused: %s", what, why ? why : "(no reason)");
	rc = ferry__proto_parse(x->buf, x->len, lim, v, &why);
	cr_assert_eq(rc, 0, "%s: frame refused: %s", what, why ? why : "(no reason)");
	cr_assert_eq((const void *)v->hdr, (const void *)x->buf);
	cr_assert_eq(v->body, fr_body(x), "%s: body not after the header", what);
}

/* the header passes, the body must not; @reason: a word of the expected why */
static void expect_body_bad(struct fr *x, const struct ferry_proto_limits *lim, const char *reason,
			    const char *what)
{
	struct ferry_proto_view v;
	const char *why = NULL;
	int rc;

	rc = ferry__proto_check_hdr(fr_hdr(x), WORLD, &why);
	cr_assert_eq(rc, 0, "%s: the header should pass, refused: %s", what,
		     why ? why : "(no reason)");
	rc = ferry__proto_parse(x->buf, x->len, lim, &v, &why);
	cr_assert_eq(rc, -FERRY_E_PROTO, "%s: parse returned %d, want -FERRY_E_PROTO", what, rc);
	cr_assert_not_null(why, "%s: refused without a reason", what);
	cr_assert(strstr(why, reason), "%s: refused for '%s', expected a reason about '%s'", what,
		  why, reason);
	/* no reason pointer: still refused, no crash */
	cr_assert_eq(ferry__proto_parse(x->buf, x->len, lim, &v, NULL), -FERRY_E_PROTO);
}

static void expect_hdr_bad(const struct ferry_msg_hdr *h, uint32_t world, const char *reason,
			   const char *what)
{
	const char *why = NULL;
	int rc = ferry__proto_check_hdr(h, world, &why);

	cr_assert_eq(rc, -FERRY_E_PROTO, "%s: check_hdr returned %d, want -FERRY_E_PROTO", what,
		     rc);
	cr_assert_not_null(why, "%s: refused without a reason", what);
	cr_assert(strstr(why, reason), "%s: refused for '%s', expected a reason about '%s'", what,
		  why, reason);
	cr_assert_eq(ferry__proto_check_hdr(h, world, NULL), -FERRY_E_PROTO);
}

/* ---- the builder ---------------------------------------------------------- */

Test(proto, builder_pads_to_8_with_zeros_and_writes_the_header)
{
	for (size_t body = 0; body <= 24; body++) {
		struct ferry_frame f;
		struct fr x;
		uint8_t *p;

		ferry__frame_begin(&f);
		cr_assert_eq(f.len, sizeof(struct ferry_msg_hdr));
		if (body) {
			p = ferry__frame_put(&f, body);
			cr_assert_not_null(p);
			for (size_t i = 0; i < body; i++)
				cr_assert_eq(p[i], 0, "put did not zero its bytes");
			memset(p, 0xab, body);
		}
		x = fr_take(&f, FERRY_MSG_BARRIER, 3, 9);
		cr_assert_eq(x.len, (16 + body + 7) / 8 * 8, "body %zu: frame of %zu bytes", body,
			     x.len);
		for (size_t i = 16 + body; i < x.len; i++)
			cr_assert_eq(x.buf[i], 0, "body %zu: padding byte %zu is %#x", body, i,
				     x.buf[i]);
		cr_assert_eq(fr_hdr(&x)->magic, FERRY_MSG_MAGIC);
		cr_assert_eq(fr_hdr(&x)->version, FERRY_PROTO_VERSION);
		cr_assert_eq(fr_hdr(&x)->type, FERRY_MSG_BARRIER);
		cr_assert_eq(fr_hdr(&x)->len, x.len);
		cr_assert_eq(fr_hdr(&x)->src, 3);
		cr_assert_eq(fr_hdr(&x)->table, 9);
		/* "FY" on the wire */
		cr_assert_eq(x.buf[0], 'F');
		cr_assert_eq(x.buf[1], 'Y');
		fr_free(&x);
	}
}

Test(proto, builder_refuses_a_frame_above_the_maximum)
{
	struct ferry_frame f;

	ferry__frame_begin(&f);
	cr_assert_not_null(ferry__frame_put(&f, FERRY_MSG_MAX));
	cr_assert_eq(ferry__frame_finish(&f, FERRY_MSG_BARRIER, 0, 0), -EMSGSIZE);
	ferry__frame_free(&f);
}

/* ---- valid frames of every type -------------------------------------------- */

static void check_op_roundtrip(uint8_t op, const struct ferry_proto_limits *lim)
{
	const uint64_t keys[] = { 0, 42, NKEYS - 1, 7, 42 };
	const uint32_t n = 5;
	size_t nvals = op == FERRY_OP_PULL ? 0 : op_nvals(keys, n, lim);
	struct fr x = op_frame(op, WORLD - 1, n, keys, NULL, n, lim, nvals);
	const struct ferry_msg_op *b;
	struct ferry_proto_view v;
	size_t at = 0;

	expect_ok(&x, lim, &v, "op");
	b = v.body;
	cr_assert_eq(b->origin, WORLD - 1);
	cr_assert_eq(b->worker, 17);
	cr_assert_eq(b->req, 0x1122334455667788ull);
	cr_assert_eq(b->op, op);
	cr_assert_eq(b->hops, 2);
	cr_assert_eq(v.count, n, "op %u: count %u", op, v.count);
	cr_assert_eq((const void *)v.keys, (const void *)(x.buf + 16 + sizeof(*b)));
	for (uint32_t i = 0; i < n; i++) {
		cr_assert_eq(v.keys[i].key, keys[i]);
		cr_assert_eq(v.keys[i].idx, 1000 + i);
		cr_assert_eq(v.keys[i].len, lim_len(lim, keys[i]));
	}
	cr_assert_eq(v.nvals, nvals, "op %u: nvals %zu, want %zu", op, v.nvals, nvals);
	cr_assert_eq((const void *)v.vals, (const void *)&v.keys[n]);
	cr_assert_leq((const uint8_t *)(v.vals + v.nvals), x.buf + x.len);
	for (uint32_t i = 0; i < n && nvals; i++)
		for (uint32_t j = 0; j < lim_len(lim, keys[i]); j++, at++)
			cr_assert_eq(v.vals[at], val_of(keys[i], j), "op %u: value %zu", op, at);
	cr_assert_null(v.mvs);
	cr_assert_null(v.idx);
	fr_free(&x);
}

Test(proto, op_frames_round_trip)
{
	for (uint8_t op = FERRY_OP_PULL; op <= FERRY_OP_SET; op++) {
		check_op_roundtrip(op, &lim_fixed);
		check_op_roundtrip(op, &lim_perkey);
	}
}

Test(proto, op_with_one_key_and_padding_parses)
{
	/* 16 + 24 + 16 + 3 floats = 68 bytes, padded to 72: 4 bytes of padding */
	const uint64_t key = 5;
	struct fr x = op_frame(FERRY_OP_PUSH, 0, 1, &key, NULL, 1, &lim_fixed, VLEN);
	struct ferry_proto_view v;

	cr_assert_eq(x.len, 72);
	expect_ok(&x, &lim_fixed, &v, "push with padding");
	cr_assert_eq(v.nvals, VLEN);
	cr_assert_eq(v.vals[2], val_of(5, 2));
	fr_free(&x);
}

Test(proto, move_frames_round_trip)
{
	static const uint8_t types[] = { FERRY_MSG_LOCALIZE, FERRY_MSG_HANDOVER_REQ,
					 FERRY_MSG_LOC_ACK, FERRY_MSG_HANDOVER_DONE,
					 FERRY_MSG_HANDOVER };
	const uint64_t keys[] = { 3, NKEYS - 1, 0 };
	const struct ferry_proto_limits *lims[] = { &lim_fixed, &lim_perkey };

	for (size_t t = 0; t < sizeof(types); t++)
		for (size_t l = 0; l < 2; l++) {
			const struct ferry_proto_limits *lim = lims[l];
			int ho = types[t] == FERRY_MSG_HANDOVER;
			uint32_t lens[3];
			size_t nvals = 0;
			struct ferry_proto_view v;
			const struct ferry_msg_move *b;
			struct fr x;

			for (int i = 0; i < 3; i++) {
				lens[i] = ho ? lim_len(lim, keys[i]) : 0;
				nvals += lens[i];
			}
			x = move_frame(types[t], WORLD - 1, 3, keys, lens, 3, nvals);
			expect_ok(&x, lim, &v, "move");
			b = v.body;
			cr_assert_eq(b->requester, WORLD - 1);
			cr_assert_eq(v.count, 3);
			cr_assert_eq((const void *)v.mvs, (const void *)(x.buf + 16 + sizeof(*b)));
			for (int i = 0; i < 3; i++) {
				cr_assert_eq(v.mvs[i].key, keys[i]);
				cr_assert_eq(v.mvs[i].slot, 500 + (uint32_t)i);
				cr_assert_eq(v.mvs[i].len, lens[i]);
				cr_assert_eq(v.mvs[i].landing, 1000 + (uint32_t)i);
			}
			cr_assert_eq(v.nvals, nvals, "type %u: nvals %zu want %zu", types[t],
				     v.nvals, nvals);
			for (size_t i = 0; i < nvals; i++)
				cr_assert_eq(v.vals[i], (float)i + 0.25f);
			cr_assert_null(v.keys);
			fr_free(&x);
		}
}

Test(proto, reply_frames_round_trip)
{
	struct ferry_proto_view v;
	const struct ferry_msg_reply *b;
	struct fr x;

	/* pull: 2 indices, 6 values */
	x = reply_frame(FERRY_OP_PULL, 2, 2, 0, 6);
	expect_ok(&x, NULL, &v, "pull reply");
	b = v.body;
	cr_assert_eq(b->req, 99);
	cr_assert_eq(b->worker, 3);
	cr_assert_eq(b->owner, 2);
	cr_assert_eq(b->status, 0);
	cr_assert_eq(v.count, 2);
	cr_assert_eq(v.idx[0], 0);
	cr_assert_eq(v.idx[1], 7);
	cr_assert_eq(v.nvals, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(v.vals[i], (float)i * 2.0f);
	fr_free(&x);

	/* pull, 3 indices: the padding float is counted (documented) */
	x = reply_frame(FERRY_OP_PULL, 3, 3, 0, 4);
	expect_ok(&x, NULL, &v, "pull reply with padding");
	cr_assert_eq(v.count, 3);
	cr_assert_eq(v.idx[2], 14);
	cr_assert_geq(v.nvals, 4);
	cr_assert_leq(v.nvals, 5);
	cr_assert_eq(v.vals[3], 6.0f);
	fr_free(&x);

	/* push and set: no values; a failed one carries a negative status */
	for (uint8_t op = FERRY_OP_PUSH; op <= FERRY_OP_SET; op++) {
		x = reply_frame(op, 4, 4, -ENOSPC, 0);
		expect_ok(&x, NULL, &v, "push/set reply");
		b = v.body;
		cr_assert_eq(b->status, -ENOSPC);
		cr_assert_eq(b->op, op);
		cr_assert_eq(v.count, 4);
		cr_assert_eq(v.idx[3], 21);
		cr_assert_eq(v.nvals, 0);
		fr_free(&x);
	}
}

Test(proto, fixed_body_frames_round_trip)
{
	struct ferry_proto_view v;
	struct ferry_frame f;
	struct fr x;

	{
		struct ferry_msg_hello *h;

		ferry__frame_begin(&f);
		h = ferry__frame_put(&f, sizeof(*h));
		h->cluster_id = 0xabcdef0123456789ull;
		h->rank = 2;
		h->world = WORLD;
		x = fr_take(&f, FERRY_MSG_HELLO, 2, 0);
		expect_ok(&x, NULL, &v, "hello");
		h = (struct ferry_msg_hello *)v.body;
		cr_assert_eq(h->cluster_id, 0xabcdef0123456789ull);
		cr_assert_eq(h->rank, 2);
		cr_assert_eq(h->world, WORLD);
		cr_assert_eq(v.count, 0);
		fr_free(&x);
	}
	for (uint8_t type = FERRY_MSG_BARRIER; type <= FERRY_MSG_BARRIER_REL; type++) {
		struct ferry_msg_barrier *b;

		ferry__frame_begin(&f);
		b = ferry__frame_put(&f, sizeof(*b));
		b->gen = 12345;
		x = fr_take(&f, type, 1, 0);
		cr_assert_eq(x.len, 32); /* header 16, gen 8, status 4, rank 4 */
		expect_ok(&x, NULL, &v, "barrier");
		cr_assert_eq(((const struct ferry_msg_barrier *)v.body)->gen, 12345);
		fr_free(&x);
	}
	for (uint8_t type = FERRY_MSG_TABLE; type <= FERRY_MSG_TABLE_ACK; type++) {
		struct ferry_msg_table *t;
		const struct ferry_msg_table *r;

		ferry__frame_begin(&f);
		t = ferry__frame_put(&f, sizeof(*t));
		t->num_keys = 1ull << 40;
		t->lens_hash = 0x0102030405060708ull;
		t->capacity = 77;
		t->value_len = 16;
		t->placement = 1;
		t->vnodes = 256;
		t->mode = 1;
		t->no_local_fast_path = 1;
		t->status = -FERRY_E_MISMATCH;
		t->field = FERRY_TF_VNODES;
		t->from_rank = 3;
		t->inbox_addr = 0x7f1234560000ull;
		t->inbox_rkey = 0x1234;
		t->inbox_entries = 1024;
		t->inbox_stride = 4096;
		t->init = FERRY_INIT_NORMAL;
		t->init_a = 0.5f;
		t->init_b = 0.25f;
		t->sparse = 1;
		t->init_seed = 0xfeedull;
		x = fr_take(&f, type, 3, 200);
		expect_ok(&x, NULL, &v, "table");
		r = v.body;
		cr_assert_eq(r->num_keys, 1ull << 40);
		cr_assert_eq(r->lens_hash, 0x0102030405060708ull);
		cr_assert_eq(r->capacity, 77);
		cr_assert_eq(r->value_len, 16);
		cr_assert_eq(r->vnodes, 256);
		cr_assert_eq(r->status, -FERRY_E_MISMATCH);
		cr_assert_eq(r->field, FERRY_TF_VNODES);
		cr_assert_eq(r->from_rank, 3);
		cr_assert_eq(r->inbox_addr, 0x7f1234560000ull);
		cr_assert_eq(r->inbox_rkey, 0x1234);
		cr_assert_eq(r->inbox_entries, 1024);
		cr_assert_eq(r->inbox_stride, 4096);
		cr_assert_eq(r->init, FERRY_INIT_NORMAL);
		cr_assert_eq(r->init_a, 0.5f);
		cr_assert_eq(r->init_b, 0.25f);
		cr_assert_eq(r->sparse, 1);
		cr_assert_eq(r->init_seed, 0xfeedull);
		cr_assert_eq(v.hdr->table, 200);
		fr_free(&x);
	}
}

/* ---- the header -------------------------------------------------------------- */

static struct ferry_msg_hdr good_hdr(void)
{
	struct ferry_msg_hdr h;

	ferry__proto_hdr_init(&h, FERRY_MSG_BARRIER, 24, WORLD - 1, 0);
	return h;
}

Test(proto, header_boundaries_pass)
{
	struct ferry_msg_hdr h = good_hdr();

	cr_assert_eq(ferry__proto_check_hdr(&h, WORLD, NULL), 0);
	h.len = 16;
	cr_assert_eq(ferry__proto_check_hdr(&h, WORLD, NULL), 0, "len 16 refused");
	h.len = FERRY_MSG_MAX;
	cr_assert_eq(ferry__proto_check_hdr(&h, WORLD, NULL), 0, "len FERRY_MSG_MAX refused");
	h = good_hdr();
	for (unsigned type = 1; type < FERRY_MSG_TYPE_MAX; type++) {
		h.type = (uint8_t)type;
		cr_assert_eq(ferry__proto_check_hdr(&h, WORLD, NULL), 0, "type %u refused", type);
	}
	h = good_hdr();
	h.src = 0;
	cr_assert_eq(ferry__proto_check_hdr(&h, 1, NULL), 0);
}

Test(proto, header_bad_magic)
{
	struct ferry_msg_hdr h = good_hdr();

	h.magic = 0x4659; /* byte-swapped */
	expect_hdr_bad(&h, WORLD, "magic", "swapped magic");
	h.magic = 0;
	expect_hdr_bad(&h, WORLD, "magic", "zero magic");
}

Test(proto, header_bad_version)
{
	struct ferry_msg_hdr h = good_hdr();

	h.version = 0;
	expect_hdr_bad(&h, WORLD, "version", "version 0");
	h.version = FERRY_PROTO_VERSION + 1;
	expect_hdr_bad(&h, WORLD, "version", "version + 1");
}

Test(proto, header_bad_type)
{
	struct ferry_msg_hdr h = good_hdr();

	h.type = 0;
	expect_hdr_bad(&h, WORLD, "type", "type 0");
	h.type = FERRY_MSG_TYPE_MAX;
	expect_hdr_bad(&h, WORLD, "type", "type FERRY_MSG_TYPE_MAX");
	h.type = 255;
	expect_hdr_bad(&h, WORLD, "type", "type 255");
}

Test(proto, header_len_below_the_header)
{
	static const uint32_t lens[] = { 0, 8, 15 };
	struct ferry_msg_hdr h = good_hdr();

	for (size_t i = 0; i < 3; i++) {
		h.len = lens[i];
		expect_hdr_bad(&h, WORLD, "length", "len < 16");
	}
}

Test(proto, header_len_above_the_maximum)
{
	struct ferry_msg_hdr h = good_hdr();

	h.len = FERRY_MSG_MAX + 8;
	expect_hdr_bad(&h, WORLD, "length", "len FERRY_MSG_MAX + 8");
	h.len = UINT32_MAX - 7;
	expect_hdr_bad(&h, WORLD, "length", "len 2^32 - 8");
}

Test(proto, header_len_not_a_multiple_of_8)
{
	struct ferry_msg_hdr h = good_hdr();

	for (uint32_t len = 17; len < 24; len++) {
		h.len = len;
		expect_hdr_bad(&h, WORLD, "multiple", "unaligned len");
	}
	h.len = FERRY_MSG_MAX - 4;
	expect_hdr_bad(&h, WORLD, "multiple", "unaligned len near the maximum");
}

Test(proto, header_src_out_of_range)
{
	struct ferry_msg_hdr h = good_hdr();

	h.src = WORLD;
	expect_hdr_bad(&h, WORLD, "rank", "src == world");
	h.src = UINT32_MAX;
	expect_hdr_bad(&h, WORLD, "rank", "src 2^32 - 1");
	h.src = 0;
	expect_hdr_bad(&h, 0, "rank", "world 0");
}

/* ---- the frame against its buffer -------------------------------------------- */

Test(proto, frame_shorter_than_its_fixed_body)
{
	static const struct {
		uint8_t type;
		size_t body;
	} c[] = {
		{ FERRY_MSG_HELLO, sizeof(struct ferry_msg_hello) },
		{ FERRY_MSG_OP, sizeof(struct ferry_msg_op) },
		{ FERRY_MSG_REPLY, sizeof(struct ferry_msg_reply) },
		{ FERRY_MSG_LOCALIZE, sizeof(struct ferry_msg_move) },
		{ FERRY_MSG_HANDOVER_REQ, sizeof(struct ferry_msg_move) },
		{ FERRY_MSG_HANDOVER, sizeof(struct ferry_msg_move) },
		{ FERRY_MSG_LOC_ACK, sizeof(struct ferry_msg_move) },
		{ FERRY_MSG_BARRIER, sizeof(struct ferry_msg_barrier) },
		{ FERRY_MSG_BARRIER_REL, sizeof(struct ferry_msg_barrier) },
		{ FERRY_MSG_TABLE, sizeof(struct ferry_msg_table) },
		{ FERRY_MSG_TABLE_ACK, sizeof(struct ferry_msg_table) },
		{ FERRY_MSG_HANDOVER_DONE, sizeof(struct ferry_msg_move) },
		{ FERRY_MSG_TABLE_FREE, sizeof(struct ferry_msg_barrier) },
		{ FERRY_MSG_TABLE_FREE_ACK, sizeof(struct ferry_msg_barrier) },
		{ FERRY_MSG_RESUME, sizeof(struct ferry_msg_resume) },
		{ FERRY_MSG_ACK, sizeof(struct ferry_msg_ack) },
		{ FERRY_MSG_CHUNK, sizeof(struct ferry_msg_chunk) },
		{ FERRY_MSG_COLL, sizeof(struct ferry_msg_coll) },
		{ FERRY_MSG_COLL_ACK, sizeof(struct ferry_msg_coll) },
		{ FERRY_MSG_COLL_KICK, sizeof(struct ferry_msg_coll) },
		{ FERRY_MSG_HEARTBEAT, sizeof(struct ferry_msg_heartbeat) },
		{ FERRY_MSG_REPL, sizeof(struct ferry_msg_repl) },
		{ FERRY_MSG_REPL_ACK, sizeof(struct ferry_msg_repl_ack) },
		{ FERRY_MSG_REPL_SYNC, sizeof(struct ferry_msg_repl_sync) },
		{ FERRY_MSG_MGR_DEAD, sizeof(struct ferry_msg_mgr) },
		{ FERRY_MSG_OP_FWD, sizeof(struct ferry_msg_op_fwd) },
		{ FERRY_MSG_CLOCK, sizeof(struct ferry_msg_clock) },
		{ FERRY_MSG_CONS_PUSH, sizeof(struct ferry_msg_cons_push) },
		{ FERRY_MSG_CONS_ACK, sizeof(struct ferry_msg_cons_ack) },
		{ FERRY_MSG_HOT_PUSH, sizeof(struct ferry_msg_hot_push) },
		{ FERRY_MSG_HOT_ACK, sizeof(struct ferry_msg_hot_ack) },
		{ FERRY_MSG_ESSP_SUB, sizeof(struct ferry_msg_essp_sub) },
		{ FERRY_MSG_ESSP_VAL, sizeof(struct ferry_msg_essp_val) },
		{ FERRY_MSG_ESSP_KICK, sizeof(struct ferry_msg_essp_kick) },
		{ FERRY_MSG_COLL_KEYS, sizeof(struct ferry_msg_coll) },
		{ FERRY_MSG_COLL_PUT, sizeof(struct ferry_msg_coll) },
		{ FERRY_MSG_REJOIN_ASK, sizeof(struct ferry_msg_rejoin) },
		{ FERRY_MSG_REJOIN_VIEW, sizeof(struct ferry_msg_rejoin) },
	};

	/* every type but BYE, which is a bare header, and LOOP_IMM, the loop
	 * transport's own (both below); the numbers not assigned are 26-31 (30
	 * and 31 are the handshake's AUTH frames, never inside a session), 34-35
	 * and 41-42 */
	cr_assert_eq(sizeof(c) / sizeof(c[0]),
		     (FERRY_MSG_REPL_SYNC - 1) + 2 + (FERRY_MSG_TYPE_MAX - FERRY_MSG_CLOCK) - 2 - 1,
		     "a type is not covered");
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		/* one word short, and a bare header */
		struct fr x = fixed_frame(c[i].type, c[i].body - 8, 0);

		expect_body_bad(&x, &lim_fixed, "shorter", "body one word short");
		fr_free(&x);
		x = fixed_frame(c[i].type, 0, 0);
		expect_body_bad(&x, &lim_fixed, "shorter", "bare header");
		fr_free(&x);
	}
}

Test(proto, loop_imm_is_the_loop_transports_own_and_refused_by_the_core)
{
	struct fr x = fixed_frame(FERRY_MSG_LOOP_IMM, 16, 0);
	struct ferry_proto_view v;
	const char *why = NULL;

	/* a session carries it (the loop's own tcp connections) ... */
	cr_assert_eq(ferry__proto_check_hdr(fr_hdr(&x), WORLD, &why), 0, "LOOP_IMM refused: %s",
		     why ? why : "(no reason)");
	/* ... and the loop takes it: one that reached the core is refused */
	cr_assert_eq(ferry__proto_parse(x.buf, x.len, &lim_fixed, &v, &why), -FERRY_E_PROTO);
	cr_assert_not_null(why);
	fr_free(&x);
}

Test(proto, bye_is_a_bare_header_for_the_transports_only)
{
	struct fr x = fixed_frame(FERRY_MSG_BYE, 0, 0);
	struct ferry_proto_view v;
	const char *why = NULL;

	cr_assert_eq(x.len, 16);
	cr_assert_eq(ferry__proto_check_hdr(fr_hdr(&x), WORLD, &why), 0, "BYE refused: %s",
		     why ? why : "(no reason)");
	/* the transports consume it; one that reached the core is refused */
	cr_assert_eq(ferry__proto_parse(x.buf, x.len, &lim_fixed, &v, &why), -FERRY_E_PROTO);
	cr_assert_not_null(why);
	fr_free(&x);
}

Test(proto, header_len_differs_from_the_buffer)
{
	const uint64_t key = 1;
	struct fr x = op_frame(FERRY_OP_PULL, 0, 1, &key, NULL, 1, &lim_fixed, 0);
	struct ferry_proto_view v;
	const char *why = NULL;

	/* the header claims 8 more bytes than arrived */
	fr_hdr(&x)->len += 8;
	expect_body_bad(&x, &lim_fixed, "length", "header len > buffer");
	/* the header claims fewer than arrived */
	fr_hdr(&x)->len -= 16;
	expect_body_bad(&x, &lim_fixed, "length", "header len < buffer");
	/* a buffer shorter than any header */
	cr_assert_eq(ferry__proto_parse(x.buf, 8, &lim_fixed, &v, &why), -FERRY_E_PROTO);
	cr_assert_not_null(why);
	cr_assert_eq(ferry__proto_parse(x.buf, 0, &lim_fixed, &v, &why), -FERRY_E_PROTO);
	fr_free(&x);
}

/*
 * The core parses what the transport's header check passed, but parse does
 * not lean on it: a frame the header check would refuse is refused here too
 * and never read past.
 */
Test(proto, parse_alone_refuses_what_the_header_check_would)
{
	struct ferry_proto_view v;
	const char *why = NULL;
	struct ferry_msg_hdr *h;
	uint8_t *b;

	/* 8 bytes that claim to be a whole 8-byte frame */
	b = malloc(8);
	cr_assert_not_null(b);
	memset(b, 0, 8);
	{
		uint32_t len8 = 8;

		memcpy(b + offsetof(struct ferry_msg_hdr, len), &len8, sizeof(len8));
	}
	cr_assert_eq(ferry__proto_parse(b, 8, NULL, &v, &why), -FERRY_E_PROTO);
	cr_assert_not_null(why);
	cr_assert(strstr(why, "header"), "refused for '%s'", why);
	free(b);

	/* a bare header of an unknown type */
	{
		static const uint8_t types[] = { 0, FERRY_MSG_TYPE_MAX, 255 };

		for (size_t i = 0; i < sizeof(types); i++) {
			b = malloc(16);
			cr_assert_not_null(b);
			h = (struct ferry_msg_hdr *)b;
			ferry__proto_hdr_init(h, types[i], 16, 0, 0);
			why = NULL;
			cr_assert_eq(ferry__proto_parse(b, 16, &lim_fixed, &v, &why),
				     -FERRY_E_PROTO, "type %u parsed", types[i]);
			cr_assert_not_null(why);
			cr_assert(strstr(why, "type"), "type %u refused for '%s'", types[i], why);
			free(b);
		}
	}

	/* a pull reply whose length leaves half a float after the indices */
	{
		struct fr x = reply_frame(FERRY_OP_PULL, 1, 1, 0, 0); /* 52 -> 56 bytes */

		cr_assert_eq(x.len, 56);
		fr_hdr(&x)->len = 54;
		why = NULL;
		cr_assert_eq(ferry__proto_parse(x.buf, 54, NULL, &v, &why), -FERRY_E_PROTO);
		cr_assert_not_null(why);
		cr_assert(strstr(why, "float"), "refused for '%s'", why);
		fr_free(&x);
	}
}

/* ---- OP ---------------------------------------------------------------------- */

static const uint64_t op_keys[] = { 4, 9, 2 };

Test(proto, op_origin_out_of_range)
{
	struct fr x = op_frame(FERRY_OP_PULL, WORLD, 3, op_keys, NULL, 3, &lim_fixed, 0);

	expect_body_bad(&x, &lim_fixed, "origin", "origin == world");
	fr_free(&x);
	x = op_frame(FERRY_OP_PULL, UINT32_MAX, 3, op_keys, NULL, 3, &lim_fixed, 0);
	expect_body_bad(&x, &lim_fixed, "origin", "origin 2^32 - 1");
	fr_free(&x);
}

Test(proto, op_unknown_operation)
{
	/* 16: the core's internal localize request, never on the wire */
	static const uint8_t ops[] = { 0, FERRY_OP_SET + 1, 16, 255 };

	for (size_t i = 0; i < sizeof(ops); i++) {
		struct fr x = op_frame(ops[i], 0, 3, op_keys, NULL, 3, &lim_fixed, 0);

		expect_body_bad(&x, &lim_fixed, "operation", "unknown op");
		fr_free(&x);
	}
}

Test(proto, op_count_zero)
{
	/* no entries at all, and a zero count in front of entries */
	struct fr x = op_frame(FERRY_OP_PULL, 0, 0, op_keys, NULL, 0, &lim_fixed, 0);

	expect_body_bad(&x, &lim_fixed, "no keys", "count 0, no entries");
	fr_free(&x);
	x = op_frame(FERRY_OP_PULL, 0, 0, op_keys, NULL, 3, &lim_fixed, 0);
	expect_body_bad(&x, &lim_fixed, "no keys", "count 0 before entries");
	fr_free(&x);
}

Test(proto, op_count_exceeds_the_frame)
{
	static const uint32_t counts[] = { 4, 1000, 1u << 28, UINT32_MAX };

	for (size_t i = 0; i < 4; i++) {
		struct fr x =
			op_frame(FERRY_OP_PULL, 0, counts[i], op_keys, NULL, 3, &lim_fixed, 0);

		expect_body_bad(&x, &lim_fixed, "count", "count beyond the entries");
		fr_free(&x);
	}
	/* a push whose values could pass for entries is still caught by the
	 * key and length checks or the count */
	{
		size_t nv = op_nvals(op_keys, 3, &lim_fixed);
		struct fr x = op_frame(FERRY_OP_PUSH, 0, 4, op_keys, NULL, 3, &lim_fixed, nv);
		struct ferry_proto_view v;
		const char *why = NULL;

		cr_assert_eq(ferry__proto_parse(x.buf, x.len, &lim_fixed, &v, &why), -FERRY_E_PROTO,
			     "a count one too big over a push's values was accepted");
		fr_free(&x);
	}
}

Test(proto, op_key_out_of_range)
{
	static const uint64_t bad[] = { NKEYS, NKEYS + 1, 1ull << 40, UINT64_MAX };

	for (size_t i = 0; i < 4; i++) {
		uint64_t keys[3] = { 1, bad[i], 2 };
		uint32_t lens[3] = { VLEN, VLEN, VLEN };
		struct fr x = op_frame(FERRY_OP_PULL, 0, 3, keys, lens, 3, &lim_fixed, 0);

		expect_body_bad(&x, &lim_fixed, "key out of range", "key >= num_keys");
		fr_free(&x);
	}
	{
		/* the last key in range still parses */
		uint64_t keys[1] = { NKEYS - 1 };
		struct fr x = op_frame(FERRY_OP_PULL, 0, 1, keys, NULL, 1, &lim_fixed, 0);
		struct ferry_proto_view v;

		expect_ok(&x, &lim_fixed, &v, "last key");
		fr_free(&x);
	}
}

Test(proto, op_entry_len_differs_from_the_tables_fixed_length)
{
	static const uint32_t bad[] = { 0, VLEN - 1, VLEN + 1, UINT32_MAX };

	for (uint8_t op = FERRY_OP_PULL; op <= FERRY_OP_SET; op++)
		for (size_t i = 0; i < 4; i++) {
			uint32_t lens[3] = { VLEN, bad[i], VLEN };
			size_t nv = op == FERRY_OP_PULL ? 0 : 3 * VLEN;
			struct fr x = op_frame(op, 0, 3, op_keys, lens, 3, &lim_fixed, nv);

			expect_body_bad(&x, &lim_fixed, "length differs", "fixed len mismatch");
			fr_free(&x);
		}
}

Test(proto, op_entry_len_differs_from_the_tables_per_key_length)
{
	/* key 4 has 5 floats, key 9 has 5, key 2 has 3 under lim_perkey */
	static const uint32_t good[3] = { 5, 5, 3 };

	for (int which = 0; which < 3; which++)
		for (int delta = -1; delta <= 1; delta += 2) {
			uint32_t lens[3];
			struct fr x;

			memcpy(lens, good, sizeof(lens));
			lens[which] = (uint32_t)((int)lens[which] + delta);
			x = op_frame(FERRY_OP_SET, 0, 3, op_keys, lens, 3, &lim_perkey, 13);
			expect_body_bad(&x, &lim_perkey, "length differs", "per-key len mismatch");
			fr_free(&x);
		}
	{
		/* the fixed length that would be right for another key is wrong */
		uint32_t lens[3] = { VLEN, VLEN, VLEN };
		struct fr x = op_frame(FERRY_OP_PULL, 0, 3, op_keys, lens, 3, &lim_perkey, 0);

		expect_body_bad(&x, &lim_perkey, "length differs", "fixed len under per-key");
		fr_free(&x);
	}
	{
		struct fr x = op_frame(FERRY_OP_SET, 0, 3, op_keys, good, 3, &lim_perkey, 13);
		struct ferry_proto_view v;

		expect_ok(&x, &lim_perkey, &v, "per-key lengths");
		cr_assert_eq(v.nvals, 13);
		fr_free(&x);
	}
}

Test(proto, op_value_bytes_short_or_long)
{
	const struct ferry_proto_limits *lims[] = { &lim_fixed, &lim_perkey };

	for (size_t l = 0; l < 2; l++)
		for (uint8_t op = FERRY_OP_PUSH; op <= FERRY_OP_SET; op++) {
			size_t nv = op_nvals(op_keys, 3, lims[l]);
			struct fr x;

			/* one float short, and no values at all */
			x = op_frame(op, 0, 3, op_keys, NULL, 3, lims[l], nv - 1);
			expect_body_bad(&x, lims[l], "value bytes", "one float short");
			fr_free(&x);
			x = op_frame(op, 0, 3, op_keys, NULL, 3, lims[l], 0);
			expect_body_bad(&x, lims[l], "value bytes", "no values");
			fr_free(&x);
			/* two floats long: more than padding can explain */
			x = op_frame(op, 0, 3, op_keys, NULL, 3, lims[l], nv + 2);
			expect_body_bad(&x, lims[l], "value bytes", "two floats long");
			fr_free(&x);
			/* exactly right still parses */
			x = op_frame(op, 0, 3, op_keys, NULL, 3, lims[l], nv);
			{
				struct ferry_proto_view v;

				expect_ok(&x, lims[l], &v, "exact values");
				cr_assert_eq(v.nvals, nv);
			}
			fr_free(&x);
		}
	{
		/* a pull carries no values */
		struct fr x = op_frame(FERRY_OP_PULL, 0, 3, op_keys, NULL, 3, &lim_fixed, 3 * VLEN);

		expect_body_bad(&x, &lim_fixed, "value bytes", "values on a pull");
		fr_free(&x);
	}
	{
		/* zero bytes of padding appended by hand beyond one word */
		struct fr x = op_frame(FERRY_OP_PULL, 0, 3, op_keys, NULL, 3, &lim_fixed, 0);

		fr_resize(&x, 8);
		expect_body_bad(&x, &lim_fixed, "value bytes", "8 trailing zero bytes on a pull");
		fr_free(&x);
	}
}

/* a sparse table's limits (num_keys 0) take any key; a TABLE frame with an
 * unknown initializer or a sparse flag other than 0/1 is refused */
Test(proto, sparse_keys_and_table_initializers)
{
	const uint64_t big[] = { UINT64_MAX, 1ull << 63, 12345 };
	struct ferry_proto_limits lim = lim_fixed;
	struct ferry_proto_view v;

	lim.num_keys = 0;
	{
		struct fr x = op_frame(FERRY_OP_PULL, 0, 3, big, NULL, 3, &lim, 0);

		expect_ok(&x, &lim, &v, "pull of keys from the whole space, sparse table");
		cr_assert_eq(v.keys[0].key, UINT64_MAX);
		fr_free(&x);
	}
	{
		struct fr x = op_frame(FERRY_OP_PULL, 0, 3, big, NULL, 3, &lim, 0);

		expect_body_bad(&x, &lim_fixed, "key", "the same keys, dense table");
		fr_free(&x);
	}
	for (int c = 0; c < 2; c++) {
		struct ferry_frame f;
		struct ferry_msg_table *t;
		struct fr x;

		ferry__frame_begin(&f);
		t = ferry__frame_put(&f, sizeof(*t));
		memset(t, 0, sizeof(*t));
		t->num_keys = 10;
		t->value_len = 1;
		if (c == 0)
			t->init = 3;
		else
			t->sparse = 2;
		x = fr_take(&f, FERRY_MSG_TABLE, 0, 0);
		expect_body_bad(&x, NULL, c == 0 ? "initializer" : "sparse",
				c == 0 ? "init 3" : "sparse 2");
		fr_free(&x);
	}
}

/* CHUNK: an index and a chunk size within their ranges */
Test(proto, chunk_announcements_are_checked)
{
	static const struct {
		uint32_t chunk, shift;
		const char *why; /* NULL: fine */
	} c[] = {
		{ 0, 14, NULL },
		{ 255, 6, NULL },
		{ 3, 31, NULL },
		{ 256, 14, "index" },
		{ 0, 5, "slots" },
		{ 0, 32, "slots" },
		{ FERRY_CHUNK_INBOX - 1, 14, "index" },
		{ FERRY_CHUNK_INBOX, 0, NULL }, /* an inbox region's grant */
		{ FERRY_CHUNK_INBOX, 14, "inbox grant" },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct ferry_proto_view v;
		struct ferry_frame f;
		struct ferry_msg_chunk *m;
		struct fr x;

		ferry__frame_begin(&f);
		m = ferry__frame_put(&f, sizeof(*m));
		m->chunk = c[i].chunk;
		m->shift = c[i].shift;
		m->rkey = 0x1234;
		x = fr_take(&f, FERRY_MSG_CHUNK, 1, 3);
		if (c[i].why) {
			expect_body_bad(&x, NULL, c[i].why, "chunk");
		} else {
			expect_ok(&x, NULL, &v, "chunk");
			cr_assert_eq(((const struct ferry_msg_chunk *)v.body)->rkey, 0x1234);
		}
		fr_free(&x);
	}
}

/* MGR_DEAD: a node tells itself that another's membership ended */
Test(proto, mgr_dead_names_another_rank_in_range)
{
	static const struct {
		uint32_t src, rank, pad;
		const char *why; /* NULL: fine */
	} c[] = {
		{ 1, 3, 0, NULL },
		{ 0, 1, 0, NULL },
		{ 2, 2, 0, "rank" },
		{ 1, WORLD, 0, "rank" },
		{ 1, UINT32_MAX, 0, "rank" },
		{ 1, 2, 7, "rank" },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct ferry_proto_view v;
		struct ferry_frame f;
		struct ferry_msg_mgr *m;
		struct fr x;

		ferry__frame_begin(&f);
		m = ferry__frame_put(&f, sizeof(*m));
		m->epoch = 42;
		m->rank = c[i].rank;
		m->pad = c[i].pad;
		x = fr_take(&f, FERRY_MSG_MGR_DEAD, c[i].src, 0);
		if (c[i].why) {
			expect_body_bad(&x, &lim_fixed, c[i].why, "mgr_dead");
		} else {
			expect_ok(&x, &lim_fixed, &v, "mgr_dead");
			cr_assert_eq(((const struct ferry_msg_mgr *)v.body)->epoch, 42);
		}
		fr_free(&x);
	}
}

/* REJOIN_ASK and REJOIN_VIEW: about another rank than the sender and 0, in
 * range; state 0 in an ask, 0 .. 2 in a view */
Test(proto, rejoin_frames_name_another_rank_in_range)
{
	static const struct {
		uint8_t type;
		uint32_t src, rank, state, pad;
		const char *why; /* NULL: fine */
	} c[] = {
		{ FERRY_MSG_REJOIN_ASK, 0, 3, 0, 0, NULL },
		{ FERRY_MSG_REJOIN_VIEW, 1, 3, 1, 0, NULL },
		{ FERRY_MSG_REJOIN_VIEW, 1, 3, 0, 0, NULL },
		{ FERRY_MSG_REJOIN_VIEW, 0, 3, 2, 0, NULL },
		{ FERRY_MSG_REJOIN_ASK, 0, 3, 1, 0, "state" },
		{ FERRY_MSG_REJOIN_VIEW, 1, 3, 3, 0, "state" },
		{ FERRY_MSG_REJOIN_ASK, 0, 0, 0, 0, "rank" },
		{ FERRY_MSG_REJOIN_VIEW, 2, 2, 1, 0, "rank" },
		{ FERRY_MSG_REJOIN_ASK, 0, WORLD, 0, 0, "rank" },
		{ FERRY_MSG_REJOIN_VIEW, 1, UINT32_MAX, 0, 0, "rank" },
		{ FERRY_MSG_REJOIN_VIEW, 1, 2, 0, 5, "rank" },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct ferry_proto_view v;
		struct ferry_frame f;
		struct ferry_msg_rejoin *m;
		struct fr x;

		ferry__frame_begin(&f);
		m = ferry__frame_put(&f, sizeof(*m));
		m->rank = c[i].rank;
		m->seq = 7;
		m->state = c[i].state;
		m->pad = c[i].pad;
		x = fr_take(&f, c[i].type, c[i].src, 0);
		if (c[i].why) {
			expect_body_bad(&x, &lim_fixed, c[i].why, "rejoin");
		} else {
			expect_ok(&x, &lim_fixed, &v, "rejoin");
			cr_assert_eq(((const struct ferry_msg_rejoin *)v.body)->seq, 7);
		}
		fr_free(&x);
	}
}

/* OP_FWD: a forwarder tells the origin where its keys went on */
Test(proto, op_fwd_names_another_rank_in_range)
{
	static const struct {
		uint32_t src, dst;
		const char *why; /* NULL: fine */
	} c[] = {
		{ 1, 2, NULL },	      { 2, 0, NULL },
		{ 2, 2, NULL }, /* a node that replays to itself */
		{ 1, WORLD, "rank" }, { 1, UINT32_MAX, "rank" },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct ferry_proto_view v;
		struct ferry_frame f;
		struct ferry_msg_op_fwd *m;
		struct fr x;

		ferry__frame_begin(&f);
		m = ferry__frame_put(&f, sizeof(*m));
		m->worker = 3;
		m->dst = c[i].dst;
		m->req = 0x100000007ull;
		x = fr_take(&f, FERRY_MSG_OP_FWD, c[i].src, 1);
		if (c[i].why) {
			expect_body_bad(&x, &lim_fixed, c[i].why, "op_fwd");
		} else {
			expect_ok(&x, &lim_fixed, &v, "op_fwd");
			cr_assert_eq(((const struct ferry_msg_op_fwd *)v.body)->req,
				     0x100000007ull);
		}
		fr_free(&x);
	}
}

Test(proto, op_without_a_table_is_refused)
{
	struct fr x = op_frame(FERRY_OP_PULL, 0, 3, op_keys, NULL, 3, &lim_fixed, 0);

	expect_body_bad(&x, NULL, "table", "op, lim NULL");
	fr_free(&x);
}

/* ---- LOCALIZE, HANDOVER_REQ, HANDOVER, LOC_ACK, HANDOVER_DONE --------------------- */

static const uint8_t move_types[] = { FERRY_MSG_LOCALIZE, FERRY_MSG_HANDOVER_REQ,
				      FERRY_MSG_HANDOVER, FERRY_MSG_LOC_ACK,
				      FERRY_MSG_HANDOVER_DONE };
static const uint64_t mv_keys[] = { 8, 0, 99 };

/* the right lengths of mv_keys for @type under lim_fixed */
static void mv_lens(uint8_t type, uint32_t *lens, size_t *nvals)
{
	*nvals = 0;
	for (int i = 0; i < 3; i++) {
		lens[i] = type == FERRY_MSG_HANDOVER ? VLEN : 0;
		*nvals += lens[i];
	}
}

Test(proto, move_requester_out_of_range)
{
	for (size_t t = 0; t < sizeof(move_types); t++) {
		uint32_t lens[3];
		size_t nv;
		struct fr x;

		mv_lens(move_types[t], lens, &nv);
		x = move_frame(move_types[t], WORLD, 3, mv_keys, lens, 3, nv);
		expect_body_bad(&x, &lim_fixed, "requester", "requester == world");
		fr_free(&x);
		x = move_frame(move_types[t], UINT32_MAX, 3, mv_keys, lens, 3, nv);
		expect_body_bad(&x, &lim_fixed, "requester", "requester 2^32 - 1");
		fr_free(&x);
	}
}

Test(proto, move_count_zero_or_too_big)
{
	static const uint32_t big[] = { 4, 1u << 28, UINT32_MAX };

	for (size_t t = 0; t < sizeof(move_types); t++) {
		uint32_t lens[3];
		size_t nv;
		struct fr x;

		mv_lens(move_types[t], lens, &nv);
		x = move_frame(move_types[t], 1, 0, mv_keys, lens, 3, nv);
		expect_body_bad(&x, &lim_fixed, "no keys", "move count 0");
		fr_free(&x);
		x = move_frame(move_types[t], 1, 0, mv_keys, lens, 0, 0);
		expect_body_bad(&x, &lim_fixed, "no keys", "move count 0, no entries");
		fr_free(&x);
		for (size_t i = 0; i < 3; i++) {
			x = move_frame(move_types[t], 1, big[i], mv_keys, lens, 3, 0);
			expect_body_bad(&x, &lim_fixed, "count", "move count beyond the entries");
			fr_free(&x);
		}
	}
}

Test(proto, move_key_out_of_range)
{
	for (size_t t = 0; t < sizeof(move_types); t++) {
		uint64_t keys[3] = { 8, NKEYS, 1 };
		uint32_t lens[3];
		size_t nv;
		struct fr x;

		mv_lens(move_types[t], lens, &nv);
		x = move_frame(move_types[t], 1, 3, keys, lens, 3, nv);
		expect_body_bad(&x, &lim_fixed, "key out of range", "move key == num_keys");
		fr_free(&x);
		keys[1] = UINT64_MAX;
		x = move_frame(move_types[t], 1, 3, keys, lens, 3, nv);
		expect_body_bad(&x, &lim_fixed, "key out of range", "move key 2^64 - 1");
		fr_free(&x);
	}
}

Test(proto, handover_len_differs_from_the_table)
{
	/* fixed length */
	{
		uint32_t lens[3] = { VLEN, VLEN + 1, VLEN };
		struct fr x = move_frame(FERRY_MSG_HANDOVER, 1, 3, mv_keys, lens, 3, 3 * VLEN + 1);

		expect_body_bad(&x, &lim_fixed, "length differs", "handover fixed len + 1");
		fr_free(&x);
		lens[1] = 0;
		x = move_frame(FERRY_MSG_HANDOVER, 1, 3, mv_keys, lens, 3, 2 * VLEN);
		expect_body_bad(&x, &lim_fixed, "length differs", "handover len 0");
		fr_free(&x);
	}
	/* per-key lengths: keys 8, 0, 99 have 4, 1, 5 floats */
	{
		uint32_t lens[3] = { 4, 1, 5 };
		struct fr x = move_frame(FERRY_MSG_HANDOVER, 1, 3, mv_keys, lens, 3, 10);
		struct ferry_proto_view v;

		expect_ok(&x, &lim_perkey, &v, "handover per-key");
		cr_assert_eq(v.nvals, 10);
		fr_free(&x);
		lens[2] = 4;
		x = move_frame(FERRY_MSG_HANDOVER, 1, 3, mv_keys, lens, 3, 9);
		expect_body_bad(&x, &lim_perkey, "length differs", "handover per-key len - 1");
		fr_free(&x);
	}
}

Test(proto, handover_value_bytes_short_or_long)
{
	uint32_t lens[3] = { VLEN, VLEN, VLEN };
	struct fr x;

	x = move_frame(FERRY_MSG_HANDOVER, 1, 3, mv_keys, lens, 3, 3 * VLEN - 1);
	expect_body_bad(&x, &lim_fixed, "value bytes", "handover one float short");
	fr_free(&x);
	x = move_frame(FERRY_MSG_HANDOVER, 1, 3, mv_keys, lens, 3, 0);
	expect_body_bad(&x, &lim_fixed, "value bytes", "handover without values");
	fr_free(&x);
	x = move_frame(FERRY_MSG_HANDOVER, 1, 3, mv_keys, lens, 3, 3 * VLEN + 2);
	expect_body_bad(&x, &lim_fixed, "value bytes", "handover two floats long");
	fr_free(&x);
}

Test(proto, nonzero_len_where_no_value_travels)
{
	for (size_t t = 0; t < sizeof(move_types); t++) {
		uint32_t lens[3] = { 0, VLEN, 0 };
		struct fr x;

		if (move_types[t] == FERRY_MSG_HANDOVER)
			continue;
		x = move_frame(move_types[t], 1, 3, mv_keys, lens, 3, 0);
		expect_body_bad(&x, &lim_fixed, "length set", "len on a move without values");
		fr_free(&x);
		/* and values after the entries are refused too */
		lens[1] = 0;
		x = move_frame(move_types[t], 1, 3, mv_keys, lens, 3, 2);
		expect_body_bad(&x, &lim_fixed, "value bytes", "values on a move without any");
		fr_free(&x);
	}
}

Test(proto, move_without_a_table_is_refused)
{
	uint32_t lens[3] = { 0, 0, 0 };
	struct fr x = move_frame(FERRY_MSG_LOCALIZE, 1, 3, mv_keys, lens, 3, 0);

	expect_body_bad(&x, NULL, "table", "localize, lim NULL");
	fr_free(&x);
}

/* ---- REPLY --------------------------------------------------------------------- */

Test(proto, reply_count_zero)
{
	struct fr x = reply_frame(FERRY_OP_PULL, 0, 0, 0, 2);

	expect_body_bad(&x, NULL, "count", "reply count 0");
	fr_free(&x);
	x = reply_frame(FERRY_OP_PUSH, 0, 2, 0, 0);
	expect_body_bad(&x, NULL, "count", "reply count 0 before indices");
	fr_free(&x);
}

Test(proto, reply_count_too_big)
{
	static const uint32_t big[] = { 3, 1000, 1u << 30, UINT32_MAX };

	for (size_t i = 0; i < 4; i++) {
		struct fr x = reply_frame(FERRY_OP_PUSH, big[i], 2, 0, 0);

		expect_body_bad(&x, NULL, "count", "reply count beyond the indices");
		fr_free(&x);
	}
}

Test(proto, reply_unknown_operation)
{
	static const uint8_t ops[] = { 0, FERRY_OP_SET + 1, 255 };

	for (size_t i = 0; i < sizeof(ops); i++) {
		struct fr x = reply_frame(ops[i], 2, 2, 0, 0);

		expect_body_bad(&x, NULL, "operation", "reply unknown op");
		fr_free(&x);
	}
}

Test(proto, reply_positive_status)
{
	static const int32_t st[] = { 1, EAGAIN, FERRY_E_PEER, INT32_MAX };

	for (size_t i = 0; i < 4; i++) {
		struct fr x = reply_frame(FERRY_OP_PUSH, 2, 2, st[i], 0);

		expect_body_bad(&x, NULL, "status", "positive status");
		fr_free(&x);
	}
	{
		struct fr x = reply_frame(FERRY_OP_PUSH, 2, 2, INT32_MIN, 0);
		struct ferry_proto_view v;

		expect_ok(&x, NULL, &v, "most negative status");
		fr_free(&x);
	}
}

Test(proto, reply_values_on_a_push_or_set_reply)
{
	for (uint8_t op = FERRY_OP_PUSH; op <= FERRY_OP_SET; op++) {
		/* 2 and 3 floats: more than a padding word */
		for (size_t nv = 2; nv <= 3; nv++) {
			struct fr x = reply_frame(op, 2, 2, 0, nv);

			expect_body_bad(&x, NULL, "values", "values on a push/set reply");
			fr_free(&x);
		}
	}
}

/* ---- trailing bytes ------------------------------------------------------------- */

Test(proto, trailing_bytes_after_a_fixed_body)
{
	static const struct {
		uint8_t type;
		size_t body;
	} c[] = {
		{ FERRY_MSG_HELLO, sizeof(struct ferry_msg_hello) },
		{ FERRY_MSG_BARRIER, sizeof(struct ferry_msg_barrier) },
		{ FERRY_MSG_BARRIER_REL, sizeof(struct ferry_msg_barrier) },
		{ FERRY_MSG_TABLE, sizeof(struct ferry_msg_table) },
	};

	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct ferry_proto_view v;
		struct fr x = fixed_frame(c[i].type, c[i].body, 0);

		expect_ok(&x, NULL, &v, "exact fixed body");
		fr_free(&x);
		for (size_t extra = 1; extra <= 16; extra += 7) { /* 1 -> 8, 8, 15 -> 16 */
			x = fixed_frame(c[i].type, c[i].body, extra);
			expect_body_bad(&x, NULL, "trailing", "bytes after a fixed body");
			fr_free(&x);
		}
	}
}

/* TABLE_ACK: no trailer, or exactly one {addr, rkey} per rank */
static struct fr table_ack_frame(size_t narenas, size_t extra)
{
	struct ferry_frame f;
	struct ferry_msg_table *t;

	ferry__frame_begin(&f);
	t = ferry__frame_put(&f, sizeof(*t));
	cr_assert_not_null(t);
	t->num_keys = 1000;
	for (size_t i = 0; i < narenas; i++) {
		struct ferry_msg_arena *a = ferry__frame_put(&f, sizeof(*a));

		a->addr = 0x7f0000000000ull + (i << 20);
		a->rkey = 100 + i;
		if (i % 2) /* every other rank has no inbox */
			continue;
		a->inbox_addr = 0x7e0000000000ull + (i << 20);
		a->inbox_rkey = 200 + i;
		a->inbox_entries = (uint32_t)(1 + i);
		a->inbox_stride = 64 * (uint32_t)(1 + i);
	}
	if (extra)
		memset(ferry__frame_put(&f, extra), 0xee, extra);
	return fr_take(&f, FERRY_MSG_TABLE_ACK, 0, 1);
}

Test(proto, table_ack_with_one_arena_per_rank_round_trips)
{
	struct ferry_proto_view v;
	struct fr x = table_ack_frame(0, 0);

	expect_ok(&x, &lim_fixed, &v, "table ack without arenas");
	cr_assert_null(v.arenas);
	cr_assert_eq(((const struct ferry_msg_table *)v.body)->num_keys, 1000);
	fr_free(&x);
	/* no limits at all is fine without a trailer */
	x = table_ack_frame(0, 0);
	expect_ok(&x, NULL, &v, "table ack without arenas, no limits");
	fr_free(&x);

	x = table_ack_frame(WORLD, 0);
	expect_ok(&x, &lim_fixed, &v, "table ack with arenas");
	cr_assert_not_null(v.arenas);
	cr_assert_eq(v.count, WORLD);
	cr_assert_eq((const uint8_t *)v.arenas, x.buf + 16 + sizeof(struct ferry_msg_table));
	for (size_t i = 0; i < WORLD; i++) {
		cr_assert_eq(v.arenas[i].addr, 0x7f0000000000ull + (i << 20));
		cr_assert_eq(v.arenas[i].rkey, 100 + i);
		cr_assert_eq(v.arenas[i].inbox_addr, i % 2 ? 0 : 0x7e0000000000ull + (i << 20));
		cr_assert_eq(v.arenas[i].inbox_rkey, i % 2 ? 0 : 200 + i);
		cr_assert_eq(v.arenas[i].inbox_entries, i % 2 ? 0 : 1 + i);
		cr_assert_eq(v.arenas[i].inbox_stride, i % 2 ? 0 : 64 * (1 + i));
	}
	fr_free(&x);
}

/* ---- landing inboxes: the table's fields and the move entries' index -------- */

struct inbox_case {
	uint64_t addr, rkey;
	uint32_t entries, stride;
	const char *reason; /* NULL: valid */
	const char *what;
};

static const struct inbox_case inbox_cases[] = {
	{ 0, 0, 0, 0, NULL, "no inbox" },
	{ 0x1000, 1, 1, 64, NULL, "one entry of 64 bytes" },
	{ 0x1000, 1, 1024, 4096, NULL, "1024 entries of 4 KiB: 4 MiB" },
	{ 0x1000, 1, 1, 16u << 20, NULL, "one entry of the largest value" },
	{ UINT64_MAX - 127, 1, 1, 64, NULL, "64 bytes below the end of the address space" },
	{ 0x1000, 0, 0, 0, "without entries", "address without entries" },
	{ 0, 1, 0, 0, "without entries", "key without entries" },
	{ 0, 0, 0, 64, "without entries", "stride without entries" },
	{ 0x1000, 1, 1025, 64, "more entries", "1025 entries" },
	{ 0x1000, 1, UINT32_MAX, 64, "more entries", "2^32 - 1 entries" },
	{ 0, 1, 1, 64, "without an address", "entries at address 0" },
	{ 0x1000, 1, 1, 0, "stride", "stride 0" },
	{ 0x1000, 1, 1, 100, "stride", "stride not a multiple of 64" },
	{ 0x1000, 1, 1, (16u << 20) + 64, "stride", "stride above 16 MiB" },
	{ 0x1000, 1, 1, UINT32_MAX & ~63u, "stride", "stride near 2^32" },
	{ 0x1000, 1, 1024, 4160, "4 MiB", "1024 entries of 4160 bytes" },
	{ 0x1000, 1, 2, 4u << 20, "4 MiB", "two entries of 4 MiB" },
	{ UINT64_MAX - 127, 1, 2, 64, "wraps", "range up to the end of the address space" },
	{ UINT64_MAX - 63, 1, 1, 64, "wraps", "one entry up to the end of the address space" },
	{ UINT64_MAX, 1, 1, 64, "wraps", "address 2^64 - 1" },
};

static struct fr table_inbox_frame(uint8_t type, const struct inbox_case *c)
{
	struct ferry_frame f;
	struct ferry_msg_table *t;

	ferry__frame_begin(&f);
	t = ferry__frame_put(&f, sizeof(*t));
	cr_assert_not_null(t);
	t->num_keys = 1000;
	t->inbox_addr = c->addr;
	t->inbox_rkey = c->rkey;
	t->inbox_entries = c->entries;
	t->inbox_stride = c->stride;
	return fr_take(&f, type, 1, 1);
}

Test(proto, table_inbox_fields_are_checked)
{
	for (size_t i = 0; i < sizeof(inbox_cases) / sizeof(inbox_cases[0]); i++) {
		const struct inbox_case *c = &inbox_cases[i];

		for (uint8_t type = FERRY_MSG_TABLE; type <= FERRY_MSG_TABLE_ACK; type++) {
			struct ferry_proto_view v;
			struct fr x = table_inbox_frame(type, c);

			if (c->reason)
				expect_body_bad(&x, &lim_fixed, c->reason, c->what);
			else
				expect_ok(&x, &lim_fixed, &v, c->what);
			fr_free(&x);
		}
	}
}

Test(proto, table_ack_trailer_inbox_fields_are_checked)
{
	for (size_t i = 0; i < sizeof(inbox_cases) / sizeof(inbox_cases[0]); i++) {
		const struct inbox_case *c = &inbox_cases[i];

		/* the case in each rank's entry in turn, the others valid */
		for (size_t bad = 0; bad < WORLD; bad++) {
			struct ferry_proto_view v;
			struct fr x = table_ack_frame(WORLD, 0);
			struct ferry_msg_arena *a =
				(struct ferry_msg_arena *)(x.buf + 16 +
							   sizeof(struct ferry_msg_table)) +
				bad;

			a->inbox_addr = c->addr;
			a->inbox_rkey = c->rkey;
			a->inbox_entries = c->entries;
			a->inbox_stride = c->stride;
			if (c->reason) {
				expect_body_bad(&x, &lim_fixed, c->reason, c->what);
			} else {
				expect_ok(&x, &lim_fixed, &v, c->what);
				cr_assert_eq(v.arenas[bad].inbox_entries, c->entries);
				cr_assert_eq(v.arenas[bad].inbox_stride, c->stride);
			}
			fr_free(&x);
		}
	}
}

/* mv_keys as @type with entry 1's landing index and ticket set */
static struct fr move_landing_frame(uint8_t type, uint32_t landing, uint32_t ticket)
{
	uint32_t lens[3];
	size_t nv = 0;
	struct fr x;
	struct ferry_msg_mv *mv;

	for (int i = 0; i < 3; i++) {
		lens[i] = type == FERRY_MSG_HANDOVER ? VLEN : 0;
		nv += lens[i];
	}
	x = move_frame(type, 1, 3, mv_keys, lens, 3, nv);
	mv = (struct ferry_msg_mv *)(x.buf + 16 + sizeof(struct ferry_msg_move)) + 1;
	mv->landing = landing;
	mv->ticket = ticket;
	return x;
}

Test(proto, move_landing_index_is_checked)
{
	for (size_t t = 0; t < sizeof(move_types); t++) {
		uint8_t type = move_types[t];
		struct ferry_proto_view v;
		struct fr x;

		x = move_landing_frame(type, FERRY_INBOX_MAX_ENTRIES - 1, 0);
		expect_ok(&x, &lim_fixed, &v, "landing entry 1023");
		cr_assert_eq(v.mvs[1].landing, FERRY_INBOX_MAX_ENTRIES - 1);
		fr_free(&x);
		x = move_landing_frame(type, 0, 0);
		expect_ok(&x, &lim_fixed, &v, "landing entry 0");
		fr_free(&x);

		x = move_landing_frame(type, FERRY_LANDING_NONE, 0);
		if (type == FERRY_MSG_HANDOVER_DONE) {
			/* the value is in a landing entry, or nowhere */
			expect_body_bad(&x, &lim_fixed, "without a landing entry",
					"hand-over done, no landing entry");
		} else {
			expect_ok(&x, &lim_fixed, &v, "no landing entry");
			cr_assert_eq(v.mvs[1].landing, FERRY_LANDING_NONE);
		}
		fr_free(&x);

		x = move_landing_frame(type, FERRY_INBOX_MAX_ENTRIES, 0);
		expect_body_bad(&x, &lim_fixed, "landing entry out of range", "landing 1024");
		fr_free(&x);
		x = move_landing_frame(type, FERRY_LANDING_NONE - 1, 0);
		expect_body_bad(&x, &lim_fixed, "landing entry out of range", "landing 2^32 - 2");
		fr_free(&x);
		/* a ticket is any 32 bits: the requester's handler judges it */
		x = move_landing_frame(type, 5, UINT32_MAX);
		expect_ok(&x, &lim_fixed, &v, "ticket 2^32 - 1");
		cr_assert_eq(v.mvs[1].ticket, UINT32_MAX);
		fr_free(&x);
	}
}

Test(proto, table_ack_trailer_must_match_the_world)
{
	static const size_t bad[] = { 1, WORLD - 1, WORLD + 1, 2 * WORLD };

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct fr x = table_ack_frame(bad[i], 0);

		expect_body_bad(&x, &lim_fixed, "arena", "arena count != world");
		fr_free(&x);
	}
	{
		/* right count, one word too many; and stray bytes alone */
		struct fr x = table_ack_frame(WORLD, 8);

		expect_body_bad(&x, &lim_fixed, "arena", "arenas plus a word");
		fr_free(&x);
		for (size_t extra = 1; extra <= 16; extra += 7) {
			x = table_ack_frame(0, extra);
			expect_body_bad(&x, &lim_fixed, "arena", "stray bytes after a table ack");
			fr_free(&x);
		}
		/* a trailer cannot be checked without the world size */
		x = table_ack_frame(WORLD, 0);
		expect_body_bad(&x, NULL, "arena", "arenas, no limits");
		fr_free(&x);
	}
}

/* ---- REPLY with slot hints ---------------------------------------------------- */

/* @n indices, (pad to 8 when @n is odd), @nslots hints, then @nvals floats */
static struct fr reply_slots_frame(uint8_t op, uint8_t flags, uint32_t n, uint32_t nslots,
				   size_t nvals)
{
	struct ferry_frame f;
	struct ferry_msg_reply *b;

	ferry__frame_begin(&f);
	b = ferry__frame_put(&f, sizeof(*b));
	cr_assert_not_null(b);
	b->req = 5;
	b->count = n;
	b->op = op;
	b->flags = flags;
	for (uint32_t i = 0; i < n; i++)
		*(uint32_t *)ferry__frame_put(&f, sizeof(uint32_t)) = i;
	if (n & 1)
		ferry__frame_put(&f, sizeof(uint32_t));
	for (uint32_t i = 0; i < nslots; i++)
		*(uint64_t *)ferry__frame_put(&f, sizeof(uint64_t)) = ((uint64_t)(1000 + i) << 32) |
								      (7 + i);
	for (size_t i = 0; i < nvals; i++)
		*(float *)ferry__frame_put(&f, sizeof(float)) = (float)i + 0.5f;
	return fr_take(&f, FERRY_MSG_REPLY, 1, 0);
}

Test(proto, reply_slot_hints_round_trip)
{
	for (uint32_t n = 1; n <= 4; n++) {
		struct ferry_proto_view v;
		struct fr x = reply_slots_frame(FERRY_OP_PULL, FERRY_REPLY_F_SLOTS, n, n, 2 * n);

		expect_ok(&x, NULL, &v, "pull reply with slot hints");
		cr_assert_eq(v.count, n);
		cr_assert_not_null(v.slots);
		cr_assert_eq((uintptr_t)v.slots % 8, 0, "n %u: slot hints not 8-aligned", n);
		for (uint32_t i = 0; i < n; i++) {
			cr_assert_eq(v.idx[i], i);
			cr_assert_eq(v.slots[i], ((uint64_t)(1000 + i) << 32) | (7 + i),
				     "n %u: hint %u", n, i);
		}
		cr_assert_eq(v.nvals, 2 * n, "n %u: nvals %zu", n, v.nvals);
		for (uint32_t i = 0; i < 2 * n; i++)
			cr_assert_eq(v.vals[i], (float)i + 0.5f);
		fr_free(&x);

		/* a push reply may carry hints too, but no values */
		x = reply_slots_frame(FERRY_OP_PUSH, FERRY_REPLY_F_SLOTS, n, n, 0);
		expect_ok(&x, NULL, &v, "push reply with slot hints");
		cr_assert_eq(v.nvals, 0);
		cr_assert_eq(v.slots[n - 1], ((uint64_t)(999 + n) << 32) | (6 + n));
		fr_free(&x);
		x = reply_slots_frame(FERRY_OP_PUSH, FERRY_REPLY_F_SLOTS, n, n, 2);
		expect_body_bad(&x, NULL, "values", "push reply with hints and values");
		fr_free(&x);
	}
	{
		/* without the flag there are no hints */
		struct ferry_proto_view v;
		struct fr x = reply_slots_frame(FERRY_OP_PULL, 0, 2, 0, 3);

		expect_ok(&x, NULL, &v, "pull reply without hints");
		cr_assert_null(v.slots);
		fr_free(&x);
	}
}

Test(proto, reply_slot_hints_exceeding_the_frame)
{
	for (uint32_t n = 1; n <= 4; n++) {
		/* one hint short, and none at all */
		struct fr x = reply_slots_frame(FERRY_OP_PUSH, FERRY_REPLY_F_SLOTS, n, n - 1, 0);

		expect_body_bad(&x, NULL, "slot hints", "one hint short");
		fr_free(&x);
	}
	{
		/* a pull's values cannot stand in for missing hints unnoticed:
		 * 3 indices, 1 hint, 2 floats = 3 hints' worth of bytes short */
		struct fr x = reply_slots_frame(FERRY_OP_PULL, FERRY_REPLY_F_SLOTS, 3, 1, 2);

		expect_body_bad(&x, NULL, "slot hints", "hints short under values");
		fr_free(&x);
	}
}

Test(proto, reply_unknown_flags)
{
	static const uint8_t flags[] = { 2, 4, 0x80, 0xff, FERRY_REPLY_F_SLOTS | 2 };

	for (size_t i = 0; i < sizeof(flags); i++) {
		struct fr x = reply_slots_frame(FERRY_OP_PUSH, flags[i], 2, 2, 0);

		expect_body_bad(&x, NULL, "flags", "unknown reply flag");
		fr_free(&x);
	}
}

/* ---- fuzz ----------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static uint32_t rng_below(uint32_t n)
{
	return (uint32_t)(rng() % n);
}

/* a parsed view must lie inside the frame and name only keys in range */
static void check_view(const uint8_t *buf, size_t len, const struct ferry_proto_limits *lim,
		       const struct ferry_proto_view *v, uint64_t iter)
{
	const uint8_t *end = buf + len;
	uint8_t type = ((const struct ferry_msg_hdr *)buf)->type;

	cr_assert_eq((const void *)v->hdr, (const void *)buf);
	cr_assert_eq((const uint8_t *)v->body, buf + 16, "iter %llu", (unsigned long long)iter);
	if (v->keys) {
		cr_assert_eq(type, FERRY_MSG_OP);
		cr_assert_leq((const uint8_t *)(v->keys + v->count), end,
			      "iter %llu: keys past end", (unsigned long long)iter);
		for (uint32_t i = 0; i < v->count; i++) {
			cr_assert_lt(v->keys[i].key, lim->num_keys);
			cr_assert_eq(v->keys[i].len, lim_len(lim, v->keys[i].key));
		}
	}
	if (v->mvs) {
		cr_assert_leq((const uint8_t *)(v->mvs + v->count), end, "iter %llu: mvs past end",
			      (unsigned long long)iter);
		for (uint32_t i = 0; i < v->count; i++) {
			cr_assert_lt(v->mvs[i].key, lim->num_keys);
			cr_assert(v->mvs[i].landing == FERRY_LANDING_NONE ||
				  v->mvs[i].landing < FERRY_INBOX_MAX_ENTRIES);
			cr_assert(type != FERRY_MSG_HANDOVER_DONE ||
				  v->mvs[i].landing != FERRY_LANDING_NONE);
		}
	}
	if (v->idx)
		cr_assert_leq((const uint8_t *)(v->idx + v->count), end, "iter %llu: idx past end",
			      (unsigned long long)iter);
	if (v->slots) {
		cr_assert_eq(type, FERRY_MSG_REPLY);
		cr_assert_leq((const uint8_t *)(v->slots + v->count), end,
			      "iter %llu: slot hints past end", (unsigned long long)iter);
	}
	if (v->arenas) {
		cr_assert_eq(type, FERRY_MSG_TABLE_ACK);
		cr_assert_eq(v->count, lim->world);
		cr_assert_eq((const uint8_t *)(v->arenas + v->count), end,
			     "iter %llu: arenas do not end the frame", (unsigned long long)iter);
		for (uint32_t i = 0; i < v->count; i++)
			cr_assert_leq(v->arenas[i].inbox_entries, FERRY_INBOX_MAX_ENTRIES);
	}
	if (v->nvals) {
		cr_assert_not_null(v->vals);
		cr_assert_leq((const uint8_t *)(v->vals + v->nvals), end,
			      "iter %llu: %zu values past end", (unsigned long long)iter, v->nvals);
	}
	if (type == FERRY_MSG_OP || (type >= FERRY_MSG_LOCALIZE && type <= FERRY_MSG_LOC_ACK) ||
	    type == FERRY_MSG_HANDOVER_DONE || type == FERRY_MSG_REPLY)
		cr_assert_gt(v->count, 0, "iter %llu: a keyed frame with no keys parsed",
			     (unsigned long long)iter);
}

/* a small valid frame of a random type, as a seed for mutation */
static struct fr fuzz_seed(const struct ferry_proto_limits *lim)
{
	uint64_t keys[4];
	uint32_t lens[4];
	uint32_t n = 1 + rng_below(4);
	size_t nv = 0;

	for (uint32_t i = 0; i < n; i++) {
		keys[i] = rng_below(NKEYS);
		lens[i] = lim_len(lim, keys[i]);
		nv += lens[i];
	}
	switch (rng_below(7)) {
	case 0: {
		uint8_t op = (uint8_t)(FERRY_OP_PULL + rng_below(3));

		return op_frame(op, rng_below(WORLD), n, keys, NULL, n, lim,
				op == FERRY_OP_PULL ? 0 : nv);
	}
	case 1:
		return move_frame(FERRY_MSG_HANDOVER, rng_below(WORLD), n, keys, lens, n, nv);
	case 2:
		for (uint32_t i = 0; i < n; i++)
			lens[i] = 0;
		return move_frame(rng_below(2) ? FERRY_MSG_HANDOVER_DONE :
						 (uint8_t)(FERRY_MSG_LOCALIZE + rng_below(2)),
				  rng_below(WORLD), n, keys, lens, n, 0);
	case 3: {
		uint8_t op = (uint8_t)(FERRY_OP_PULL + rng_below(3));

		return reply_frame(op, n, n, -(int32_t)rng_below(3),
				   op == FERRY_OP_PULL ? rng_below(8) : 0);
	}
	case 4: {
		uint8_t op = (uint8_t)(FERRY_OP_PULL + rng_below(3));

		return reply_slots_frame(op, FERRY_REPLY_F_SLOTS, n, n,
					 op == FERRY_OP_PULL ? rng_below(8) : 0);
	}
	case 5:
		return table_ack_frame(rng_below(2) ? WORLD : 0, 0);
	default: {
		static const uint8_t types[] = { FERRY_MSG_HELLO, FERRY_MSG_BARRIER,
						 FERRY_MSG_TABLE, FERRY_MSG_TABLE_ACK };
		static const size_t bodies[] = { sizeof(struct ferry_msg_hello),
						 sizeof(struct ferry_msg_barrier),
						 sizeof(struct ferry_msg_table),
						 sizeof(struct ferry_msg_table) };
		uint32_t t = rng_below(4);

		return fixed_frame(types[t], bodies[t], 0);
	}
	}
}

#define ITERS 100000
Test(proto, fuzz_random_frames_parse_or_are_refused, .timeout = 60)
{
	long accepted = 0, refused_hdr = 0, refused_body = 0;

	rng_state = 0x9e3779b97f4a7c15ull;
	for (uint64_t it = 0; it < ITERS; it++) {
		const struct ferry_proto_limits *lim = (it & 1) ? &lim_perkey : &lim_fixed;
		struct ferry_proto_view v;
		const char *why = NULL;
		uint8_t *buf;
		size_t len;
		int rc;

		if (rng_below(2)) {
			/* random bytes, 16 .. 512 of them */
			int plausible = rng_below(4) != 0;

			len = 16 + rng_below(512 - 16 + 1);
			if (plausible && rng_below(8))
				len &= ~(size_t)7;
			buf = malloc(len);
			cr_assert_not_null(buf);
			for (size_t i = 0; i < len; i++)
				buf[i] = (uint8_t)rng();
			/* mostly a plausible header, so the body parsers run */
			if (plausible) {
				struct ferry_msg_hdr *h = (struct ferry_msg_hdr *)buf;

				h->magic = FERRY_MSG_MAGIC;
				h->version = FERRY_PROTO_VERSION;
				if (rng_below(8))
					h->type = (uint8_t)(1 + rng_below(FERRY_MSG_TYPE_MAX - 1));
				if (rng_below(8))
					h->len = (uint32_t)len;
				if (rng_below(8))
					h->src = rng_below(WORLD);
				if (rng_below(2)) {
					/* small counts and keys reach the entry checks */
					uint32_t *w = (uint32_t *)(buf + 16);

					for (size_t i = 0; 16 + 4 * (i + 1) <= len && i < 32; i++)
						if (rng_below(2))
							w[i] = rng_below(i % 2 ? 8 : NKEYS + 2);
				}
			}
		} else {
			/* a valid frame with a few bytes changed, maybe cut or grown */
			struct fr x = fuzz_seed(lim);
			uint32_t flips = rng_below(4);

			for (uint32_t i = 0; i < flips; i++) {
				size_t at = rng_below((uint32_t)x.len);

				if (rng_below(2))
					x.buf[at] ^= (uint8_t)(1u << rng_below(8));
				else
					x.buf[at] = (uint8_t)rng();
			}
			switch (rng_below(4)) {
			case 0:
				if (x.len > 24) {
					uint32_t words = (uint32_t)(x.len - 16) / 8;

					fr_resize(&x, -8 * (long)(1 + rng_below(words)));
				}
				break;
			case 1:
				fr_resize(&x, 8 * (long)(1 + rng_below(3)));
				break;
			default:
				break;
			}
			buf = x.buf;
			len = x.len;
		}

		rc = ferry__proto_check_hdr((const struct ferry_msg_hdr *)buf, WORLD, &why);
		if (rc) {
			cr_assert_eq(rc, -FERRY_E_PROTO);
			cr_assert_not_null(why);
			refused_hdr++;
		} else {
			why = NULL;
			rc = ferry__proto_parse(buf, len, lim, &v, &why);
			if (rc) {
				cr_assert_eq(rc, -FERRY_E_PROTO, "iter %llu: parse returned %d",
					     (unsigned long long)it, rc);
				cr_assert_not_null(why, "iter %llu: refused without a reason",
						   (unsigned long long)it);
				refused_body++;
			} else {
				check_view(buf, len, lim, &v, it);
				accepted++;
			}
		}
		free(buf);
	}
	cr_log_info("fuzz: %ld accepted, %ld refused by the header, %ld by the body", accepted,
		    refused_hdr, refused_body);
	/* the generator reaches every outcome (else it tests little) */
	cr_assert_gt(accepted, ITERS / 100);
	cr_assert_gt(refused_hdr, ITERS / 100);
	cr_assert_gt(refused_body, ITERS / 100);
}

/* ---- collectives ------------------------------------------------------------ */

/* a COLL frame: @m, then @n elements of @esz bytes (+ @extra bytes) */
static struct fr coll_frame(uint8_t type, struct ferry_msg_coll m, size_t data_bytes, long extra)
{
	struct ferry_frame f;
	uint8_t *p;

	ferry__frame_begin(&f);
	p = ferry__frame_put(&f, sizeof(m) + data_bytes + (extra > 0 ? (size_t)extra : 0));
	cr_assert_not_null(p);
	memcpy(p, &m, sizeof(m));
	return fr_take(&f, type, 1, 0);
}

static struct ferry_msg_coll good_coll(void)
{
	return (struct ferry_msg_coll){ .seq = 7,
					.count = 11,
					.off = 4,
					.n = 3,
					.step = 2,
					.kind = FERRY_COLL_KIND_ALLREDUCE,
					.dtype = FERRY_FLOAT32,
					.op = FERRY_SUM,
					.algo = FERRY_COLL_ALGO_RING };
}

Test(proto, coll_frames_pass_with_their_segment)
{
	struct ferry_msg_coll m = good_coll();
	struct ferry_proto_view v;
	struct fr x = coll_frame(FERRY_MSG_COLL, m, 3 * 4, 0);

	expect_ok(&x, &lim_fixed, &v, "a float32 segment of 3");
	cr_assert_not_null(v.coll);
	cr_assert_eq(v.coll->n, 3);
	cr_assert_eq(v.data, (const uint8_t *)fr_body(&x) + sizeof(m));
	fr_free(&x);
	m.kind = FERRY_COLL_KIND_BCAST;
	m.op = 0;
	m.root = WORLD - 1;
	m.n = 0;
	m.off = 0;
	m.step = 0;
	x = coll_frame(FERRY_MSG_COLL_ACK, m, 0, 0);
	expect_ok(&x, &lim_fixed, &v, "a broadcast acknowledgement");
	fr_free(&x);
}

Test(proto, coll_frames_with_a_bad_field_are_refused)
{
	static const struct {
		const char *what, *reason;
		int field;
		uint64_t value;
	} cases[] = {
		{ "kind 0", "collective", 0, 0 },
		{ "kind 4", "collective", 0, 4 },
		{ "dtype 0", "element type", 1, 0 },
		{ "dtype 4", "element type", 1, 4 },
		{ "op 0", "operator", 2, 0 },
		{ "op 4", "operator", 2, 4 },
		{ "algo 0", "algorithm", 3, 0 },
		{ "algo 3", "algorithm", 3, 3 },
		{ "root of an all-reduce", "root", 4, 1 },
		{ "step 2 world + 2", "step", 5, 2 * WORLD + 2 },
		{ "count 0", "count", 6, 0 },
		{ "off past count", "outside", 7, 10 },
		{ "n 0", "outside", 8, 0 },
		{ "off + n past count", "outside", 8, 8 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct ferry_msg_coll m = good_coll();
		struct fr x;

		switch (cases[i].field) {
		case 0:
			m.kind = (uint8_t)cases[i].value;
			break;
		case 1:
			m.dtype = (uint8_t)cases[i].value;
			break;
		case 2:
			m.op = (uint8_t)cases[i].value;
			break;
		case 3:
			m.algo = (uint8_t)cases[i].value;
			break;
		case 4:
			m.root = (uint32_t)cases[i].value;
			break;
		case 5:
			m.step = (uint32_t)cases[i].value;
			break;
		case 6:
			m.count = cases[i].value;
			break;
		case 7:
			m.off = cases[i].value;
			break;
		case 8:
			m.n = (uint32_t)cases[i].value;
			break;
		}
		x = coll_frame(FERRY_MSG_COLL, m, 3 * 4, 0);
		expect_body_bad(&x, &lim_fixed, cases[i].reason, cases[i].what);
		fr_free(&x);
	}
	{
		struct ferry_msg_coll m = good_coll();
		struct fr x = coll_frame(FERRY_MSG_COLL, m, 2 * 4, 0); /* 3 announced, 2 sent */

		expect_body_bad(&x, &lim_fixed, "data bytes", "a segment one element short");
		fr_free(&x);
		x = coll_frame(FERRY_MSG_COLL, m, 3 * 4, 8); /* a word too many */
		expect_body_bad(&x, &lim_fixed, "data bytes", "a segment with a word too many");
		fr_free(&x);
		x = coll_frame(FERRY_MSG_COLL_ACK, m, 0, 0); /* a segment on an ack */
		expect_body_bad(&x, &lim_fixed, "segment", "an acknowledgement with a segment");
		fr_free(&x);
		m.off = m.n = m.step = 0;
		x = coll_frame(FERRY_MSG_COLL_ACK, m, 0, 0); /* of an all-reduce */
		expect_body_bad(&x, &lim_fixed, "acknowledgement", "an all-reduce acknowledged");
		fr_free(&x);
		m.kind = FERRY_COLL_KIND_BCAST;
		m.op = 0;
		m.root = WORLD;
		x = coll_frame(FERRY_MSG_COLL_KICK, m, 0, 0);
		expect_body_bad(&x, &lim_fixed, "root", "a root outside the world");
		fr_free(&x);
	}
}

/* ---- REPL, REPL_SYNC (lib/ops/repl.c) ------------------------------------ */

/* a REPL frame of @n copies of keys 0.., each with @len floats (VLEN: valid) */
static struct fr repl_frame(uint32_t n, uint32_t kind, uint32_t owner, uint32_t len,
			    uint32_t count_field)
{
	struct ferry_frame f;
	struct ferry_msg_repl *m;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->token = 7;
	m->count = count_field;
	for (uint32_t i = 0; i < n; i++) {
		struct ferry_msg_copy *c = ferry__frame_put(&f, sizeof(*c));
		float *v;

		*c = (struct ferry_msg_copy){ .key = i, .len = len, .owner = owner, .kind = kind };
		v = ferry__frame_put(&f, ferry__copy_size(len) - sizeof(*c));
		for (uint32_t j = 0; j < len; j++)
			v[j] = val_of(i, j);
	}
	return fr_take(&f, FERRY_MSG_REPL, 1, 0);
}

Test(proto, repl_copies_parse_with_their_values)
{
	struct fr x = repl_frame(3, FERRY_COPY_VALUE, 2, VLEN, 3);
	struct ferry_proto_view v;
	const char *why = NULL;

	cr_assert_eq(ferry__proto_parse(x.buf, x.len, &lim_fixed, &v, &why), 0, "refused: %s",
		     why ? why : "?");
	cr_assert_eq(v.count, 3);
	cr_assert_eq(v.copies->kind, FERRY_COPY_VALUE);
	cr_assert_eq(((const float *)(v.copies + 1))[1], val_of(0, 1));
	fr_free(&x);
	/* a WANT carries no value */
	x = repl_frame(1, FERRY_COPY_WANT, 2, 0, 1);
	cr_assert_eq(ferry__proto_parse(x.buf, x.len, &lim_fixed, &v, &why), 0, "WANT refused");
	fr_free(&x);
}

Test(proto, repl_bad_copies_are_refused)
{
	struct fr x = repl_frame(2, 9, 2, VLEN, 2);

	expect_body_bad(&x, &lim_fixed, "kind", "unknown copy kind");
	fr_free(&x);
	x = repl_frame(2, FERRY_COPY_VALUE, WORLD, VLEN, 2);
	expect_body_bad(&x, &lim_fixed, "owner", "owner out of the world");
	fr_free(&x);
	x = repl_frame(2, FERRY_COPY_VALUE, 1, VLEN + 1, 2);
	expect_body_bad(&x, &lim_fixed, "length", "a value longer than the key's");
	fr_free(&x);
	x = repl_frame(1, FERRY_COPY_WANT, 1, VLEN, 1);
	expect_body_bad(&x, &lim_fixed, "length", "a WANT with a value");
	fr_free(&x);
	x = repl_frame(2, FERRY_COPY_VALUE, 1, VLEN, 3);
	expect_body_bad(&x, &lim_fixed, "exceeds", "count past the copies");
	fr_free(&x);
	x = repl_frame(3, FERRY_COPY_VALUE, 1, VLEN, 2);
	expect_body_bad(&x, &lim_fixed, "trailing", "a copy past the count");
	fr_free(&x);
	x = repl_frame(0, FERRY_COPY_VALUE, 1, VLEN, 0);
	expect_body_bad(&x, &lim_fixed, "count", "no copies");
	fr_free(&x);
}

Test(proto, repl_sync_flags_and_rank_are_checked)
{
	struct ferry_frame f;
	struct ferry_msg_repl_sync *m;
	struct fr x;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->dead = WORLD;
	x = fr_take(&f, FERRY_MSG_REPL_SYNC, 1, 0);
	expect_body_bad(&x, &lim_fixed, "rank", "a dead rank out of the world");
	fr_free(&x);
	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->dead = 1;
	m->flags = 4; /* 1: ECHO, 2: GONE */
	x = fr_take(&f, FERRY_MSG_REPL_SYNC, 1, 0);
	expect_body_bad(&x, &lim_fixed, "flags", "unknown flags");
	fr_free(&x);
	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->dead = 1;
	m->flags = FERRY_SYNC_F_ECHO | FERRY_SYNC_F_GONE;
	x = fr_take(&f, FERRY_MSG_REPL_SYNC, 1, 0);
	{
		struct ferry_proto_view v;
		const char *why = NULL;

		cr_expect_eq(ferry__proto_parse(x.buf, x.len, &lim_fixed, &v, &why), 0,
			     "an ECHO with GONE was refused: %s", why ? why : "");
	}
	fr_free(&x);
}

/* a push whose values travel as 16-bit codes (lib/ops/codec.c): the flag
 * says so, the bytes must match the codes, and nothing else may carry one */
Test(proto, compressed_push_frames_are_checked)
{
	size_t nv = op_nvals(op_keys, 3, &lim_fixed);
	struct ferry_proto_view v;
	const char *why = NULL;
	struct {
		uint8_t op;
		uint16_t flags;
		size_t floats; /* 4-byte words of values written */
		int ok;
	} cases[] = {
		{ FERRY_OP_PUSH, FERRY_OP_F_BF16, (nv + 1) / 2, 1 },
		{ FERRY_OP_PUSH, FERRY_OP_F_FP16, (nv + 1) / 2, 1 },
		{ FERRY_OP_PUSH, FERRY_OP_F_BF16, nv, 0 }, /* floats' bytes, not codes' */
		{ FERRY_OP_PUSH, FERRY_OP_F_BF16 | FERRY_OP_F_FP16, (nv + 1) / 2, 0 },
		{ FERRY_OP_PUSH, 4, (nv + 1) / 2, 0 },		    /* an unknown flag */
		{ FERRY_OP_SET, FERRY_OP_F_BF16, (nv + 1) / 2, 0 }, /* sets are exact */
		{ FERRY_OP_PULL, FERRY_OP_F_FP16, 0, 0 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct fr x =
			op_frame(cases[i].op, 0, 3, op_keys, NULL, 3, &lim_fixed, cases[i].floats);

		((struct ferry_msg_op *)(x.buf + sizeof(struct ferry_msg_hdr)))->flags =
			cases[i].flags;
		memset(&v, 0, sizeof(v));
		if (cases[i].ok) {
			cr_assert_eq(ferry__proto_parse(x.buf, x.len, &lim_fixed, &v, &why), 0,
				     "case %zu: %s", i, why ? why : "");
			cr_assert_null(v.vals);
			cr_assert_not_null(v.codes);
			cr_assert_eq(v.nvals, nv);
		} else {
			cr_assert_eq(ferry__proto_parse(x.buf, x.len, &lim_fixed, &v, &why),
				     -FERRY_E_PROTO, "case %zu was accepted", i);
		}
		fr_free(&x);
	}
}

/* ---- HOT_PUSH and HOT_ACK (lib/cons/hot.c) ---- */

/* HOT_PUSH frame @seq with entries idx 2i + 1, i < n, of @len floats each */
static struct fr hot_push_frame(uint64_t seq, uint32_t n, uint32_t len)
{
	struct ferry_frame f;
	struct ferry_msg_hot_push *m;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->seq = seq;
	m->count = n;
	for (uint32_t i = 0; i < n; i++) {
		struct ferry_msg_hot_ent *e = ferry__frame_put(&f, sizeof(*e));

		e->idx = 2 * i + 1;
		e->len = len;
	}
	for (uint32_t i = 0; i < n * len; i++)
		*(float *)ferry__frame_put(&f, sizeof(float)) = (float)i;
	return fr_take(&f, FERRY_MSG_HOT_PUSH, 1, 0);
}

static struct ferry_msg_hot_ent *hot_ent(struct fr *x, uint32_t i)
{
	return (struct ferry_msg_hot_ent *)((uint8_t *)fr_body(x) +
					    sizeof(struct ferry_msg_hot_push)) +
	       i;
}

Test(proto, hot_push_and_ack_frames_are_checked)
{
	struct ferry_proto_view v;
	struct fr x = hot_push_frame(9, 3, 5);

	expect_ok(&x, &lim_fixed, &v, "a good HOT_PUSH");
	cr_assert_eq(v.count, 3);
	cr_assert_eq(v.nvals, 15);
	cr_assert(v.vals[14] == 14.0f);
	fr_free(&x);
	x = hot_push_frame(0, 3, 5);
	expect_body_bad(&x, &lim_fixed, "number 0", "frame number 0");
	fr_free(&x);
	x = hot_push_frame(9, 3, 5);
	hot_ent(&x, 2)->idx = 3;
	expect_body_bad(&x, &lim_fixed, "ascending", "an index repeated");
	fr_free(&x);
	x = hot_push_frame(9, 3, 5);
	hot_ent(&x, 1)->len = 0;
	expect_body_bad(&x, &lim_fixed, "length", "an empty value");
	fr_free(&x);
	x = hot_push_frame(9, 3, 5);
	hot_ent(&x, 1)->len = 7; /* 6 would fit in the padding: the handler checks it */
	expect_body_bad(&x, &lim_fixed, "value bytes", "a length past the values");
	fr_free(&x);
	x = hot_push_frame(9, 3, 5);
	fr_resize(&x, -8);
	expect_body_bad(&x, &lim_fixed, "value bytes", "values cut short");
	fr_free(&x);
	x = hot_push_frame(9, 3, 5);
	((struct ferry_msg_hot_push *)fr_body(&x))->count = 1000;
	expect_body_bad(&x, &lim_fixed, "count", "a count past the frame");
	fr_free(&x);
	x = hot_push_frame(9, 3, 5);
	((struct ferry_msg_hot_push *)fr_body(&x))->count = 0;
	expect_body_bad(&x, &lim_fixed, "no entries", "no entries");
	fr_free(&x);

	x = fixed_frame(FERRY_MSG_HOT_ACK, sizeof(struct ferry_msg_hot_ack), 0);
	((struct ferry_msg_hot_ack *)fr_body(&x))->seq = 4;
	expect_ok(&x, &lim_fixed, &v, "a good HOT_ACK");
	((struct ferry_msg_hot_ack *)fr_body(&x))->seq = 0;
	expect_body_bad(&x, &lim_fixed, "number 0", "an answer to frame 0");
	fr_free(&x);
}

/* ---- ESSP_SUB and ESSP_VAL (lib/cons/essp.c) ---- */

/* ESSP_SUB of keys 10, 11, .. (@n of them) */
static struct fr essp_sub_frame(uint32_t n, uint32_t flags)
{
	struct ferry_frame f;
	struct ferry_msg_essp_sub *m;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->done = 3;
	m->id = 7;
	m->count = n;
	m->flags = flags;
	for (uint32_t i = 0; i < n; i++)
		*(uint64_t *)ferry__frame_put(&f, sizeof(uint64_t)) = 10 + i;
	return fr_take(&f, FERRY_MSG_ESSP_SUB, 1, 0);
}

/* ESSP_VAL of keys 20, 21, .. (@n, each of lim_perkey's length) */
static struct fr essp_val_frame(uint32_t n)
{
	struct ferry_frame f;
	struct ferry_msg_essp_val *m;
	uint32_t nv = 0;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->fresh = 5;
	m->count = n;
	for (uint32_t i = 0; i < n; i++) {
		struct ferry_msg_essp_ent *e = ferry__frame_put(&f, sizeof(*e));

		e->key = 20 + i;
		e->len = key_lens[20 + i];
		e->tag = 2;
		e->id = 7;
		nv += e->len;
	}
	for (uint32_t i = 0; i < nv; i++)
		*(float *)ferry__frame_put(&f, sizeof(float)) = (float)i;
	return fr_take(&f, FERRY_MSG_ESSP_VAL, 1, 0);
}

static struct ferry_msg_essp_ent *essp_ent(struct fr *x, uint32_t i)
{
	return (struct ferry_msg_essp_ent *)((uint8_t *)fr_body(x) +
					     sizeof(struct ferry_msg_essp_val)) +
	       i;
}

Test(proto, essp_sub_and_val_frames_are_checked)
{
	struct ferry_proto_view v;
	struct fr x = essp_sub_frame(3, 0);

	expect_ok(&x, &lim_perkey, &v, "a good ESSP_SUB");
	cr_assert_eq(v.count, 3);
	cr_assert_eq(((const uint64_t *)v.data)[2], 12);
	fr_free(&x);
	x = essp_sub_frame(3, FERRY_ESSP_UNSUB);
	expect_ok(&x, &lim_perkey, &v, "a good UNSUB");
	fr_free(&x);
	x = essp_sub_frame(3, 4);
	expect_body_bad(&x, &lim_perkey, "flags", "unknown flags");
	fr_free(&x);
	x = essp_sub_frame(3, 3u << 8);
	expect_body_bad(&x, &lim_perkey, "hops", "passed on 3 times");
	fr_free(&x);
	x = essp_sub_frame(3, FERRY_ESSP_UNSUB | 1u << 8);
	expect_body_bad(&x, &lim_perkey, "hops", "an UNSUB passed on");
	fr_free(&x);
	x = essp_sub_frame(3, 2u << 8);
	expect_ok(&x, &lim_perkey, &v, "a SUB passed on twice");
	((struct ferry_msg_essp_sub *)fr_body(&x))->origin = WORLD;
	expect_body_bad(&x, &lim_perkey, "origin", "an origin past the world");
	fr_free(&x);
	x = essp_sub_frame(3, 0);
	((uint64_t *)((uint8_t *)fr_body(&x) + sizeof(struct ferry_msg_essp_sub)))[1] = NKEYS;
	expect_body_bad(&x, &lim_perkey, "out of range", "a key past the table");
	fr_free(&x);
	x = essp_sub_frame(3, 0);
	((struct ferry_msg_essp_sub *)fr_body(&x))->count = 4;
	expect_body_bad(&x, &lim_perkey, "exceeds", "a count past the frame");
	fr_free(&x);
	x = essp_sub_frame(3, 0);
	((struct ferry_msg_essp_sub *)fr_body(&x))->count = 1;
	expect_body_bad(&x, &lim_perkey, "trailing", "keys after the count");
	fr_free(&x);
	x = essp_sub_frame(3, 0);
	((struct ferry_msg_essp_sub *)fr_body(&x))->count = 0;
	expect_body_bad(&x, &lim_perkey, "no keys", "no keys");
	fr_free(&x);

	x = essp_val_frame(4);
	expect_ok(&x, &lim_perkey, &v, "a good ESSP_VAL");
	cr_assert_eq(v.count, 4);
	cr_assert_eq(v.nvals, key_lens[20] + key_lens[21] + key_lens[22] + key_lens[23]);
	fr_free(&x);
	x = essp_val_frame(4);
	essp_ent(&x, 1)->len += 1;
	expect_body_bad(&x, &lim_perkey, "length differs", "a length other than the key's");
	fr_free(&x);
	x = essp_val_frame(4);
	essp_ent(&x, 3)->key = NKEYS + 1;
	expect_body_bad(&x, &lim_perkey, "out of range", "a key past the table");
	fr_free(&x);
	x = essp_val_frame(4);
	fr_resize(&x, -8);
	expect_body_bad(&x, &lim_perkey, "value bytes", "values cut short");
	fr_free(&x);
	x = essp_val_frame(4);
	((struct ferry_msg_essp_val *)fr_body(&x))->count = 1000;
	expect_body_bad(&x, &lim_perkey, "exceeds", "a count past the frame");
	fr_free(&x);
	x = essp_val_frame(4);
	((struct ferry_msg_essp_val *)fr_body(&x))->count = 0;
	expect_body_bad(&x, &lim_perkey, "no entries", "no entries");
	fr_free(&x);
}

/* ---- CONS_PUSH and CONS_ACK (lib/cons/push.c) ---- */

/* CONS_PUSH of keys @keys[0 .. n) (per-key lengths of lim_perkey, idx i),
 * batch @seq of @total keys */
static struct fr cons_push_frame(uint64_t seq, uint32_t total, const uint64_t *keys, uint32_t n)
{
	struct ferry_frame f;
	struct ferry_msg_cons_push *m;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->seq = seq;
	m->total = total;
	m->count = n;
	for (uint32_t i = 0; i < n; i++) {
		struct ferry_msg_cons_key *k = ferry__frame_put(&f, sizeof(*k));

		k->key = keys[i];
		k->idx = i;
		k->len = key_lens[keys[i]];
		k->attempt = 1;
	}
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = 0; j < key_lens[keys[i]]; j++)
			*(float *)ferry__frame_put(&f, sizeof(float)) = val_of(keys[i], j);
	return fr_take(&f, FERRY_MSG_CONS_PUSH, 1, 0);
}

static struct ferry_msg_cons_key *cons_key(struct fr *x, uint32_t i)
{
	return (struct ferry_msg_cons_key *)((uint8_t *)fr_body(x) +
					     sizeof(struct ferry_msg_cons_push)) +
	       i;
}

Test(proto, cons_push_frames_are_checked_key_by_key)
{
	uint64_t keys[3] = { 4, 17, 99 };
	struct ferry_proto_view v;
	struct fr x = cons_push_frame(7, 5, keys, 3);

	expect_ok(&x, &lim_perkey, &v, "a good CONS_PUSH");
	cr_assert_eq(v.count, 3);
	cr_assert_eq(v.nvals, key_lens[4] + key_lens[17] + key_lens[99]);
	cr_assert(v.vals[0] == val_of(4, 0));
	fr_free(&x);

	x = cons_push_frame(7, 5, keys, 3);
	cons_key(&x, 2)->idx = 5;
	expect_body_bad(&x, &lim_perkey, "beyond the batch", "an index past the batch's total");
	fr_free(&x);
	x = cons_push_frame(7, 2, keys, 3);
	expect_body_bad(&x, &lim_perkey, "count", "more keys than the batch has");
	fr_free(&x);
	x = cons_push_frame(7, NKEYS + 1, keys, 3);
	expect_body_bad(&x, &lim_perkey, "larger", "a batch larger than the table");
	fr_free(&x);
	x = cons_push_frame(0, 5, keys, 3);
	expect_body_bad(&x, &lim_perkey, "number 0", "batch number 0");
	fr_free(&x);
	x = cons_push_frame(7, 5, keys, 3);
	cons_key(&x, 1)->key = NKEYS;
	expect_body_bad(&x, &lim_perkey, "out of range", "a key past the table");
	fr_free(&x);
	x = cons_push_frame(7, 5, keys, 3);
	cons_key(&x, 0)->len++;
	expect_body_bad(&x, &lim_perkey, "length", "a length other than the table's");
	fr_free(&x);
	x = cons_push_frame(7, 5, keys, 3);
	fr_resize(&x, -8);
	expect_body_bad(&x, &lim_perkey, "value bytes", "values cut short");
	fr_free(&x);
	x = cons_push_frame(7, 5, keys, 3);
	((struct ferry_msg_cons_push *)fr_body(&x))->count = 1000;
	expect_body_bad(&x, &lim_perkey, "count", "a count past the frame");
	fr_free(&x);
}

static struct fr cons_ack_frame(uint32_t n, int32_t status, uint32_t hint)
{
	struct ferry_frame f;
	struct ferry_msg_cons_ack *m;

	ferry__frame_begin(&f);
	m = ferry__frame_put(&f, sizeof(*m));
	m->seq = 3;
	m->count = n;
	for (uint32_t i = 0; i < n; i++) {
		struct ferry_msg_cons_st *st = ferry__frame_put(&f, sizeof(*st));

		st->idx = i;
		st->status = status;
		st->hint = hint;
	}
	return fr_take(&f, FERRY_MSG_CONS_ACK, 2, 0);
}

Test(proto, cons_ack_frames_are_checked)
{
	struct ferry_proto_view v;
	struct fr x = cons_ack_frame(4, -EAGAIN, 3);

	expect_ok(&x, &lim_fixed, &v, "a good CONS_ACK");
	cr_assert_eq(v.count, 4);
	fr_free(&x);
	x = cons_ack_frame(4, 0, WORLD); /* applied: no hint */
	expect_ok(&x, &lim_fixed, &v, "a CONS_ACK without hints");
	fr_free(&x);
	x = cons_ack_frame(2, 5, WORLD);
	expect_body_bad(&x, &lim_fixed, "positive", "a positive status");
	fr_free(&x);
	x = cons_ack_frame(2, -EAGAIN, WORLD + 1);
	expect_body_bad(&x, &lim_fixed, "hint", "a hint past the world");
	fr_free(&x);
	x = cons_ack_frame(2, 0, WORLD);
	((struct ferry_msg_cons_ack *)fr_body(&x))->count = 3;
	expect_body_bad(&x, &lim_fixed, "count", "more answers than the frame holds");
	fr_free(&x);
	x = cons_ack_frame(2, 0, WORLD);
	fr_resize(&x, 16);
	expect_body_bad(&x, &lim_fixed, "trailing", "bytes after the answers");
	fr_free(&x);
}

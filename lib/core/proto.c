/* SPDX-License-Identifier: MIT */
/*
 * proto.c - validation of received frames. Nothing here trusts a field
 * before checking it: lengths against the frame, counts against lengths
 * (with overflow checks), keys against the table, ranks against the world.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/proto.h"
#include "ferry/ferry.h"

void ferry__frame_begin(struct ferry_frame *f)
{
	f->buf = NULL;
	f->len = 0;
	f->cap = 0;
	ferry__frame_put(f, sizeof(struct ferry_msg_hdr));
}

void *ferry__frame_put(struct ferry_frame *f, size_t n)
{
	void *p;

	if (f->len == SIZE_MAX)
		return NULL;
	if (f->len + n > f->cap) {
		size_t cap = f->cap ? f->cap * 2 : 256;
		uint8_t *b;

		while (cap < f->len + n)
			cap *= 2;
		b = realloc(f->buf, cap);
		if (!b) {
			f->len = SIZE_MAX;
			return NULL;
		}
		f->buf = b;
		f->cap = cap;
	}
	p = f->buf + f->len;
	memset(p, 0, n);
	f->len += n;
	return p;
}

int ferry__frame_finish(struct ferry_frame *f, uint8_t type, uint32_t src, uint32_t table)
{
	size_t pad;

	if (f->len == SIZE_MAX || !f->buf)
		return -ENOMEM;
	pad = (FERRY_MSG_ALIGN - f->len % FERRY_MSG_ALIGN) % FERRY_MSG_ALIGN;
	if (pad && !ferry__frame_put(f, pad))
		return -ENOMEM;
	if (f->len > FERRY_MSG_MAX)
		return -EMSGSIZE;
	ferry__proto_hdr_init((struct ferry_msg_hdr *)f->buf, type, (uint32_t)f->len, src, table);
	return 0;
}

void ferry__frame_free(struct ferry_frame *f)
{
	free(f->buf);
	f->buf = NULL;
	f->len = f->cap = 0;
}

/* the fixed body size of each type */
static size_t proto_body_size(uint8_t type)
{
	switch (type) {
	case FERRY_MSG_HELLO:
		return sizeof(struct ferry_msg_hello);
	case FERRY_MSG_RESUME:
		return sizeof(struct ferry_msg_resume);
	case FERRY_MSG_ACK:
		return sizeof(struct ferry_msg_ack);
	case FERRY_MSG_OP:
		return sizeof(struct ferry_msg_op);
	case FERRY_MSG_REPLY:
		return sizeof(struct ferry_msg_reply);
	case FERRY_MSG_LOCALIZE:
	case FERRY_MSG_HANDOVER_REQ:
	case FERRY_MSG_HANDOVER:
	case FERRY_MSG_LOC_ACK:
	case FERRY_MSG_HANDOVER_DONE:
		return sizeof(struct ferry_msg_move);
	case FERRY_MSG_BARRIER:
	case FERRY_MSG_BARRIER_REL:
	case FERRY_MSG_TABLE_FREE:
	case FERRY_MSG_TABLE_FREE_ACK:
		return sizeof(struct ferry_msg_barrier);
	case FERRY_MSG_TABLE:
	case FERRY_MSG_TABLE_ACK:
		return sizeof(struct ferry_msg_table);
	case FERRY_MSG_CHUNK:
		return sizeof(struct ferry_msg_chunk);
	case FERRY_MSG_CLOCK:
		return sizeof(struct ferry_msg_clock);
	case FERRY_MSG_CONS_PUSH:
		return sizeof(struct ferry_msg_cons_push);
	case FERRY_MSG_CONS_ACK:
		return sizeof(struct ferry_msg_cons_ack);
	case FERRY_MSG_HOT_PUSH:
		return sizeof(struct ferry_msg_hot_push);
	case FERRY_MSG_HOT_ACK:
		return sizeof(struct ferry_msg_hot_ack);
	case FERRY_MSG_ESSP_SUB:
		return sizeof(struct ferry_msg_essp_sub);
	case FERRY_MSG_ESSP_VAL:
		return sizeof(struct ferry_msg_essp_val);
	case FERRY_MSG_ESSP_KICK:
		return sizeof(struct ferry_msg_essp_kick);
	case FERRY_MSG_COLL:
	case FERRY_MSG_COLL_ACK:
	case FERRY_MSG_COLL_KICK:
	case FERRY_MSG_COLL_KEYS:
	case FERRY_MSG_COLL_PUT:
		return sizeof(struct ferry_msg_coll);
	case FERRY_MSG_MGR_DEAD:
		return sizeof(struct ferry_msg_mgr);
	case FERRY_MSG_REJOIN_ASK:
	case FERRY_MSG_REJOIN_VIEW:
		return sizeof(struct ferry_msg_rejoin);
	case FERRY_MSG_OP_FWD:
		return sizeof(struct ferry_msg_op_fwd);
	case FERRY_MSG_HEARTBEAT:
		return sizeof(struct ferry_msg_heartbeat);
	case FERRY_MSG_REPL:
		return sizeof(struct ferry_msg_repl);
	case FERRY_MSG_REPL_ACK:
		return sizeof(struct ferry_msg_repl_ack);
	case FERRY_MSG_REPL_SYNC:
		return sizeof(struct ferry_msg_repl_sync);
	}
	return 0;
}

/* a frame is padded to FERRY_MSG_ALIGN; @left bytes remain where @need are due */
static int proto_pad_ok(size_t left, size_t need)
{
	return left >= need && left - need < FERRY_MSG_ALIGN;
}

#define PROTO_FAIL(msg)                \
	do {                           \
		*why_p = (msg);        \
		return -FERRY_E_PROTO; \
	} while (0)

static int proto_parse_op(const uint8_t *p, size_t left, const struct ferry_proto_limits *lim,
			  struct ferry_proto_view *v, const char **why_p)
{
	const struct ferry_msg_op *op = v->body;
	size_t nvals = 0;

	if (op->origin >= lim->world)
		PROTO_FAIL("op: origin rank out of range");
	if (op->op < FERRY_OP_PULL || op->op > FERRY_OP_SET)
		PROTO_FAIL("op: unknown operation");
	if (op->count == 0)
		PROTO_FAIL("op: no keys");
	if (op->count > left / sizeof(struct ferry_msg_key))
		PROTO_FAIL("op: key count exceeds the frame");
	v->count = op->count;
	v->keys = (const struct ferry_msg_key *)p;
	for (uint32_t i = 0; i < op->count; i++) {
		const struct ferry_msg_key *k = &v->keys[i];

		if (lim->num_keys && k->key >= lim->num_keys)
			PROTO_FAIL("op: key out of range");
		if (k->len != ferry__proto_value_len(lim, k->key))
			PROTO_FAIL("op: value length differs from the table's");
		nvals += k->len;
	}
	p += (size_t)op->count * sizeof(struct ferry_msg_key);
	left -= (size_t)op->count * sizeof(struct ferry_msg_key);
	if (op->op == FERRY_OP_PULL)
		nvals = 0;
	if (op->flags & ~(FERRY_OP_F_BF16 | FERRY_OP_F_FP16))
		PROTO_FAIL("op: unknown flags");
	if (op->flags) {
		if (op->op != FERRY_OP_PUSH || op->flags == (FERRY_OP_F_BF16 | FERRY_OP_F_FP16))
			PROTO_FAIL("op: a value code on something else than one push code");
		if (!proto_pad_ok(left, nvals * sizeof(uint16_t)))
			PROTO_FAIL("op: value bytes differ from the keys' lengths");
		v->vals = NULL;
		v->codes = (const uint16_t *)p;
		v->nvals = nvals;
		return 0;
	}
	if (!proto_pad_ok(left, nvals * sizeof(float)))
		PROTO_FAIL("op: value bytes differ from the keys' lengths");
	v->vals = (const float *)p;
	v->nvals = nvals;
	return 0;
}

/* CONS_PUSH: count keys (each idx below total, the table's length), then
 * their values */
static int proto_parse_cons_push(const uint8_t *p, size_t left,
				 const struct ferry_proto_limits *lim, struct ferry_proto_view *v,
				 const char **why_p)
{
	const struct ferry_msg_cons_push *m = v->body;
	const struct ferry_msg_cons_key *ks = (const struct ferry_msg_cons_key *)p;
	size_t nvals = 0;

	if (m->count == 0 || m->total == 0 || m->count > m->total)
		PROTO_FAIL("cons push: key count out of range");
	/* the receiver keeps 4 bytes per key of the batch: no more keys than
	 * the table has, nor than one call may name (2^26, as ops) */
	if ((lim->num_keys && m->total > lim->num_keys) || m->total > (1u << 26))
		PROTO_FAIL("cons push: batch larger than the table or 2^26 keys");
	if (m->seq == 0)
		PROTO_FAIL("cons push: batch number 0");
	if (m->count > left / sizeof(*ks))
		PROTO_FAIL("cons push: key count exceeds the frame");
	for (uint32_t i = 0; i < m->count; i++) {
		if (ks[i].idx >= m->total)
			PROTO_FAIL("cons push: index beyond the batch");
		if (lim->num_keys && ks[i].key >= lim->num_keys)
			PROTO_FAIL("cons push: key out of range");
		if (ks[i].len != ferry__proto_value_len(lim, ks[i].key))
			PROTO_FAIL("cons push: value length differs from the table's");
		nvals += ks[i].len;
	}
	p += (size_t)m->count * sizeof(*ks);
	left -= (size_t)m->count * sizeof(*ks);
	if (!proto_pad_ok(left, nvals * sizeof(float)))
		PROTO_FAIL("cons push: value bytes differ from the keys' lengths");
	v->count = m->count;
	v->data = ks;
	v->vals = (const float *)p;
	v->nvals = nvals;
	return 0;
}

/* HOT_PUSH: count entries, idx ascending, each len that of a value (the
 * handler checks idx and len against the table's hot keys), then their
 * values */
static int proto_parse_hot_push(const uint8_t *p, size_t left, struct ferry_proto_view *v,
				const char **why_p)
{
	const struct ferry_msg_hot_push *m = v->body;
	const struct ferry_msg_hot_ent *es = (const struct ferry_msg_hot_ent *)p;
	size_t nvals = 0;

	if (m->seq == 0)
		PROTO_FAIL("hot push: frame number 0");
	if (m->count == 0 || m->pad)
		PROTO_FAIL("hot push: no entries, or a nonzero pad");
	if (m->count > left / sizeof(*es))
		PROTO_FAIL("hot push: entry count exceeds the frame");
	for (uint32_t i = 0; i < m->count; i++) {
		if (i && es[i].idx <= es[i - 1].idx)
			PROTO_FAIL("hot push: entries not in ascending order");
		if (es[i].len == 0 || es[i].len > (1u << 22))
			PROTO_FAIL("hot push: value length out of range");
		nvals += es[i].len;
	}
	p += (size_t)m->count * sizeof(*es);
	left -= (size_t)m->count * sizeof(*es);
	if (nvals > left / sizeof(float) || !proto_pad_ok(left, nvals * sizeof(float)))
		PROTO_FAIL("hot push: value bytes differ from the entries' lengths");
	v->count = m->count;
	v->data = es;
	v->vals = (const float *)p;
	v->nvals = nvals;
	return 0;
}

/* ESSP_SUB: count keys in range; ESSP_VAL: count entries, each key in
 * range with its value's length, then the values */
static int proto_parse_essp(uint8_t type, const uint8_t *p, size_t left,
			    const struct ferry_proto_limits *lim, struct ferry_proto_view *v,
			    const char **why_p)
{
	size_t nvals = 0;

	if (type == FERRY_MSG_ESSP_SUB) {
		const struct ferry_msg_essp_sub *m = v->body;
		const uint64_t *ks = (const uint64_t *)p;

		if (m->count == 0 || (m->flags & ~(FERRY_ESSP_UNSUB | 0xff00u)) ||
		    FERRY_ESSP_HOPS(m->flags) > FERRY_ESSP_HOPS_MAX ||
		    ((m->flags & FERRY_ESSP_UNSUB) && FERRY_ESSP_HOPS(m->flags)))
			PROTO_FAIL("essp sub: no keys, unknown flags or too many hops");
		if (m->origin >= lim->world)
			PROTO_FAIL("essp sub: origin rank out of range");
		if (m->count > left / sizeof(*ks))
			PROTO_FAIL("essp sub: key count exceeds the frame");
		for (uint32_t i = 0; i < m->count; i++)
			if (lim->num_keys && ks[i] >= lim->num_keys)
				PROTO_FAIL("essp sub: key out of range");
		if (!proto_pad_ok(left - (size_t)m->count * sizeof(*ks), 0))
			PROTO_FAIL("essp sub: trailing bytes after the keys");
		v->count = m->count;
		v->data = ks;
		return 0;
	}
	const struct ferry_msg_essp_val *m = v->body;
	const struct ferry_msg_essp_ent *es = (const struct ferry_msg_essp_ent *)p;

	if (m->count == 0 || m->pad)
		PROTO_FAIL("essp val: no entries, or a nonzero pad");
	if (m->count > left / sizeof(*es))
		PROTO_FAIL("essp val: entry count exceeds the frame");
	for (uint32_t i = 0; i < m->count; i++) {
		if (lim->num_keys && es[i].key >= lim->num_keys)
			PROTO_FAIL("essp val: key out of range");
		if (es[i].len != ferry__proto_value_len(lim, es[i].key))
			PROTO_FAIL("essp val: value length differs from the table's");
		nvals += es[i].len;
	}
	p += (size_t)m->count * sizeof(*es);
	left -= (size_t)m->count * sizeof(*es);
	if (nvals > left / sizeof(float) || !proto_pad_ok(left, nvals * sizeof(float)))
		PROTO_FAIL("essp val: value bytes differ from the entries' lengths");
	v->count = m->count;
	v->data = es;
	v->vals = (const float *)p;
	v->nvals = nvals;
	return 0;
}

static int proto_parse_move(uint8_t type, const uint8_t *p, size_t left,
			    const struct ferry_proto_limits *lim, struct ferry_proto_view *v,
			    const char **why_p)
{
	const struct ferry_msg_move *mv = v->body;
	size_t nvals = 0;

	if (mv->requester >= lim->world)
		PROTO_FAIL("move: requester rank out of range");
	if (mv->count == 0)
		PROTO_FAIL("move: no keys");
	if (mv->count > left / sizeof(struct ferry_msg_mv))
		PROTO_FAIL("move: key count exceeds the frame");
	v->count = mv->count;
	v->mvs = (const struct ferry_msg_mv *)p;
	for (uint32_t i = 0; i < mv->count; i++) {
		const struct ferry_msg_mv *m = &v->mvs[i];

		if (lim->num_keys && m->key >= lim->num_keys)
			PROTO_FAIL("move: key out of range");
		if (m->landing != FERRY_LANDING_NONE && m->landing >= FERRY_INBOX_MAX_ENTRIES)
			PROTO_FAIL("move: landing entry out of range");
		if (type == FERRY_MSG_HANDOVER_DONE && m->landing == FERRY_LANDING_NONE)
			PROTO_FAIL("move: hand-over done without a landing entry");
		if (type == FERRY_MSG_HANDOVER) {
			if (m->len != ferry__proto_value_len(lim, m->key))
				PROTO_FAIL("move: value length differs from the table's");
			nvals += m->len;
		} else if (m->len != 0) {
			PROTO_FAIL("move: length set where no value travels");
		}
	}
	left -= (size_t)mv->count * sizeof(struct ferry_msg_mv);
	if (!proto_pad_ok(left, nvals * sizeof(float)))
		PROTO_FAIL("move: value bytes differ from the keys' lengths");
	v->vals = (const float *)(p + (size_t)mv->count * sizeof(struct ferry_msg_mv));
	v->nvals = nvals;
	return 0;
}

/*
 * A landing inbox a peer announces (TABLE body, TABLE_ACK trailer): none (all
 * zero), or 1 .. FERRY_INBOX_MAX_ENTRIES entries of a 64-byte multiple up to
 * FERRY_INBOX_MAX_STRIDE, FERRY_INBOX_BYTES in all unless it is one entry,
 * at an address whose range does not wrap. Return: NULL, or what is wrong.
 */
static const char *proto_check_inbox(uint64_t addr, uint64_t rkey, uint32_t entries,
				     uint32_t stride)
{
	uint64_t bytes = (uint64_t)entries * stride;

	if (!entries)
		return addr || rkey || stride ? "inbox: address, key or stride without entries" :
						NULL;
	if (entries > FERRY_INBOX_MAX_ENTRIES)
		return "inbox: more entries than the limit";
	if (!addr)
		return "inbox: entries without an address";
	if (!stride || stride % 64 || stride > FERRY_INBOX_MAX_STRIDE)
		return "inbox: entry stride not a multiple of 64 up to 16 MiB";
	if (entries > 1 && bytes > FERRY_INBOX_BYTES)
		return "inbox: more than 4 MiB of entries";
	if (addr > UINT64_MAX - bytes)
		return "inbox: address range wraps";
	return NULL;
}

/*
 * REPL: known kinds, owners in the world, keys of the table each followed by
 * exactly its value (padded), nothing after the last. Who may send which
 * copy, only lib/ops/repl.c can tell.
 */
static int proto_parse_repl(const uint8_t *p, size_t left, const struct ferry_proto_limits *lim,
			    struct ferry_proto_view *v, const char **why_p)
{
	const struct ferry_msg_repl *m = v->body;

	if (m->pad)
		PROTO_FAIL("repl: padding not zero");
	if (m->count == 0 || m->count > left / sizeof(struct ferry_msg_copy))
		PROTO_FAIL("repl: copy count out of range");
	v->count = m->count;
	v->copies = (const struct ferry_msg_copy *)p;
	for (uint32_t i = 0; i < m->count; i++) {
		const struct ferry_msg_copy *c = (const void *)p;
		size_t sz;

		if (left < sizeof(*c))
			PROTO_FAIL("repl: copy count exceeds the frame");
		if (c->kind < FERRY_COPY_VALUE || c->kind > FERRY_COPY_WANT)
			PROTO_FAIL("repl: unknown copy kind");
		if (c->pad)
			PROTO_FAIL("repl: padding not zero");
		if (c->owner >= lim->world)
			PROTO_FAIL("repl: owner rank out of range");
		if (!ferry__proto_value_len(lim, c->key))
			PROTO_FAIL("repl: key out of range");
		if (c->len !=
		    (c->kind == FERRY_COPY_WANT ? 0 : ferry__proto_value_len(lim, c->key)))
			PROTO_FAIL("repl: value length differs from the table's");
		sz = ferry__copy_size(c->len);
		if (left < sz)
			PROTO_FAIL("repl: value exceeds the frame");
		p += sz;
		left -= sz;
	}
	if (left)
		PROTO_FAIL("trailing bytes after the copies");
	return 0;
}

/*
 * A collective's frame: known kind, type and operator (none for a
 * broadcast), a root in the world, a step below 2 world + 2 (the ring has
 * 2 (world - 1) steps, recursive doubling log2(world) + 2), a segment inside
 * the collective's count, and exactly its elements after the body. What only
 * the collective can check (the sender is the peer of that step, the
 * segment is the next one expected, the signature matches) lib/coll/ checks.
 */
static int proto_parse_coll(uint8_t type, const uint8_t *p, size_t left,
			    const struct ferry_proto_limits *lim, struct ferry_proto_view *v,
			    const char **why_p)
{
	const struct ferry_msg_coll *m = v->body;
	uint32_t esz = ferry__dtype_size(m->dtype);

	if (!lim)
		PROTO_FAIL("coll: no world");
	if (m->kind < FERRY_COLL_KIND_ALLREDUCE || m->kind > FERRY_COLL_KIND_BCAST)
		PROTO_FAIL("coll: unknown collective");
	if (!esz)
		PROTO_FAIL("coll: unknown element type");
	if (m->kind == FERRY_COLL_KIND_BCAST ? m->op != 0 : (m->op < 1 || m->op > 3))
		PROTO_FAIL("coll: unknown operator");
	if (m->algo < 1 || m->algo > 2)
		PROTO_FAIL("coll: unknown algorithm");
	if (m->root >= lim->world || (m->kind == FERRY_COLL_KIND_ALLREDUCE && m->root))
		PROTO_FAIL("coll: root out of range");
	if (m->step >= 2 * (uint64_t)lim->world + 2)
		PROTO_FAIL("coll: step out of range");
	if (m->count == 0 || m->count > UINT64_MAX / esz)
		PROTO_FAIL("coll: element count out of range");
	if (type == FERRY_MSG_COLL_KEYS) {
		/* n: the receiver's WRITE-with-immediate slot + 1 (lib/coll/coll.h) */
		if (m->off || m->step)
			PROTO_FAIL("coll: segment on a frame of keys");
		if (left != sizeof(struct ferry_msg_coll_keys))
			PROTO_FAIL("coll: keys of the wrong size");
		v->coll = m;
		v->data = p;
		return 0;
	}
	if (type == FERRY_MSG_COLL_PUT) {
		if (m->n == 0 || m->off > m->count || m->n > m->count - m->off)
			PROTO_FAIL("coll: put of a segment outside the collective");
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("coll: data after a put");
		v->coll = m;
		v->data = NULL;
		v->count = m->n;
		return 0;
	}
	if (type != FERRY_MSG_COLL) {
		if (m->n || m->off || m->step)
			PROTO_FAIL("coll: segment on a frame without data");
		if (type == FERRY_MSG_COLL_ACK && m->kind != FERRY_COLL_KIND_BCAST)
			PROTO_FAIL("coll: acknowledgement of a collective other than a broadcast");
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("trailing bytes after the body");
		return 0;
	}
	if (m->n == 0 || m->off > m->count || m->n > m->count - m->off)
		PROTO_FAIL("coll: segment outside the collective");
	if (!proto_pad_ok(left, (size_t)m->n * esz))
		PROTO_FAIL("coll: data bytes differ from the segment's elements");
	v->coll = m;
	v->data = p;
	v->count = m->n;
	return 0;
}

int ferry__proto_parse(const void *buf, size_t len, const struct ferry_proto_limits *lim,
		       struct ferry_proto_view *view, const char **why_p)
{
	const struct ferry_msg_hdr *hdr = buf;
	const uint8_t *p = buf;
	size_t body, left;
	const char *dummy;

	if (!why_p)
		why_p = &dummy;
	if (len < sizeof(*hdr))
		PROTO_FAIL("frame shorter than its header");
	if (hdr->len != len)
		PROTO_FAIL("frame length differs from the header's");
	memset(view, 0, sizeof(*view));
	view->hdr = hdr;
	body = proto_body_size(hdr->type);
	if (!body)
		PROTO_FAIL("unknown message type");
	if (len - sizeof(*hdr) < body)
		PROTO_FAIL("frame shorter than its body");
	view->body = p + sizeof(*hdr);
	p += sizeof(*hdr) + body;
	left = len - sizeof(*hdr) - body;

	switch (hdr->type) {
	case FERRY_MSG_OP:
		if (!lim)
			PROTO_FAIL("op: no table");
		return proto_parse_op(p, left, lim, view, why_p);
	case FERRY_MSG_LOCALIZE:
	case FERRY_MSG_HANDOVER_REQ:
	case FERRY_MSG_HANDOVER:
	case FERRY_MSG_LOC_ACK:
	case FERRY_MSG_HANDOVER_DONE:
		if (!lim)
			PROTO_FAIL("move: no table");
		return proto_parse_move(hdr->type, p, left, lim, view, why_p);
	case FERRY_MSG_REPLY: {
		const struct ferry_msg_reply *r = view->body;

		if (r->count == 0 || r->count > left / sizeof(uint32_t))
			PROTO_FAIL("reply: index count out of range");
		if (r->op < FERRY_OP_PULL || r->op > FERRY_OP_SET)
			PROTO_FAIL("reply: unknown operation");
		if (r->status > 0)
			PROTO_FAIL("reply: positive status");
		if (r->flags & ~FERRY_REPLY_F_SLOTS)
			PROTO_FAIL("reply: unknown flags");
		view->count = r->count;
		view->idx = (const uint32_t *)p;
		left -= (size_t)r->count * sizeof(uint32_t);
		p += (size_t)r->count * sizeof(uint32_t);
		if (r->flags & FERRY_REPLY_F_SLOTS) {
			/* the indices end 8-aligned when count is even; else 4 bytes pad */
			size_t skip = (r->count & 1) ? sizeof(uint32_t) : 0;

			if (left < skip || (left - skip) / sizeof(uint64_t) < r->count)
				PROTO_FAIL("reply: slot hints exceed the frame");
			view->slots = (const uint64_t *)(p + skip);
			left -= skip + (size_t)r->count * sizeof(uint64_t);
			p += skip + (size_t)r->count * sizeof(uint64_t);
		}
		if (left % sizeof(float))
			PROTO_FAIL("reply: value bytes not a whole number of floats");
		if (r->op != FERRY_OP_PULL && !proto_pad_ok(left, 0))
			PROTO_FAIL("reply: values on a reply without any");
		view->vals = (const float *)p;
		view->nvals = left / sizeof(float);
		return 0;
	}
	case FERRY_MSG_TABLE:
	case FERRY_MSG_TABLE_ACK: {
		const struct ferry_msg_table *m = view->body;
		const char *bad = proto_check_inbox(m->inbox_addr, m->inbox_rkey, m->inbox_entries,
						    m->inbox_stride);

		if (bad)
			PROTO_FAIL(bad);
		if (m->init > 2)
			PROTO_FAIL("table: unknown initializer");
		if (m->sparse > 1)
			PROTO_FAIL("table: sparse is neither 0 nor 1");
		if (m->consistency > FERRY_CONS_ESSP)
			PROTO_FAIL("table: unknown consistency model");
		if (hdr->type == FERRY_MSG_TABLE) {
			if (!proto_pad_ok(left, 0))
				PROTO_FAIL("trailing bytes after the body");
			return 0;
		}
		/* an arena trailer of exactly world entries, or none */
		if (!left)
			return 0;
		if (!lim || left != (size_t)lim->world * sizeof(struct ferry_msg_arena))
			PROTO_FAIL("table ack: arena list does not match the world size");
		view->arenas = (const struct ferry_msg_arena *)p;
		view->count = lim->world;
		for (uint32_t r = 0; r < lim->world; r++) {
			const struct ferry_msg_arena *a = &view->arenas[r];

			bad = proto_check_inbox(a->inbox_addr, a->inbox_rkey, a->inbox_entries,
						a->inbox_stride);
			if (bad)
				PROTO_FAIL(bad);
		}
		return 0;
	}
	case FERRY_MSG_CHUNK: {
		const struct ferry_msg_chunk *m = view->body;

		if (m->chunk == FERRY_CHUNK_INBOX) {
			if (m->shift || !m->rkey)
				PROTO_FAIL("chunk: an inbox grant with a shift, or without a key");
		} else if (m->chunk >= FERRY_CHUNKS_MAX) {
			PROTO_FAIL("chunk: index out of range");
		} else if (m->shift < 6 || m->shift > 31)
			PROTO_FAIL("chunk: slots per chunk out of range");
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("trailing bytes after the body");
		return 0;
	}
	case FERRY_MSG_COLL:
	case FERRY_MSG_COLL_ACK:
	case FERRY_MSG_COLL_KICK:
	case FERRY_MSG_COLL_KEYS:
	case FERRY_MSG_COLL_PUT:
		view->coll = view->body;
		return proto_parse_coll(hdr->type, p, left, lim, view, why_p);
	case FERRY_MSG_MGR_DEAD: {
		const struct ferry_msg_mgr *m = view->body;

		if (!lim || m->rank >= lim->world || m->rank == hdr->src || m->pad)
			PROTO_FAIL("mgr: rank out of range");
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("trailing bytes after the body");
		return 0;
	}
	case FERRY_MSG_REJOIN_ASK:
	case FERRY_MSG_REJOIN_VIEW: {
		const struct ferry_msg_rejoin *m = view->body;

		if (!lim || m->rank == 0 || m->rank >= lim->world || m->rank == hdr->src || m->pad)
			PROTO_FAIL("rejoin: rank out of range");
		if (m->state > (hdr->type == FERRY_MSG_REJOIN_VIEW ? FERRY_REJOIN_TAKEOVER : 0))
			PROTO_FAIL("rejoin: state out of range");
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("trailing bytes after the body");
		return 0;
	}
	case FERRY_MSG_OP_FWD: {
		const struct ferry_msg_op_fwd *m = view->body;

		/* @dst may be the sender: a node replays queued operations to
		 * itself when a key arrives there */
		if (!lim || m->dst >= lim->world)
			PROTO_FAIL("op fwd: rank out of range");
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("trailing bytes after the body");
		return 0;
	}
	case FERRY_MSG_REPL:
		if (!lim)
			PROTO_FAIL("repl: no table");
		return proto_parse_repl(p, left, lim, view, why_p);
	case FERRY_MSG_CONS_PUSH:
		if (!lim)
			PROTO_FAIL("cons push: no table");
		return proto_parse_cons_push(p, left, lim, view, why_p);
	case FERRY_MSG_CONS_ACK: {
		const struct ferry_msg_cons_ack *m = view->body;

		if (!lim)
			PROTO_FAIL("cons ack: no table");
		if (m->count == 0 || m->count > left / sizeof(struct ferry_msg_cons_st))
			PROTO_FAIL("cons ack: answer count out of range");
		view->count = m->count;
		view->data = p;
		for (uint32_t i = 0; i < m->count; i++) {
			const struct ferry_msg_cons_st *st =
				(const struct ferry_msg_cons_st *)p + i;

			if (st->status > 0)
				PROTO_FAIL("cons ack: positive status");
			if (st->hint > lim->world)
				PROTO_FAIL("cons ack: hint rank out of range");
		}
		if (!proto_pad_ok(left, (size_t)m->count * sizeof(struct ferry_msg_cons_st)))
			PROTO_FAIL("cons ack: trailing bytes after the answers");
		return 0;
	}
	case FERRY_MSG_HOT_PUSH:
		if (!lim)
			PROTO_FAIL("hot push: no table");
		return proto_parse_hot_push(p, left, view, why_p);
	case FERRY_MSG_HOT_ACK: {
		const struct ferry_msg_hot_ack *m = view->body;

		if (!lim || m->seq == 0)
			PROTO_FAIL("hot ack: no table, or frame number 0");
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("trailing bytes after the body");
		return 0;
	}
	case FERRY_MSG_ESSP_SUB:
	case FERRY_MSG_ESSP_VAL:
		if (!lim)
			PROTO_FAIL("essp: no table");
		return proto_parse_essp(hdr->type, p, left, lim, view, why_p);
	case FERRY_MSG_REPL_SYNC: {
		const struct ferry_msg_repl_sync *m = view->body;

		if (!lim || m->dead >= lim->world)
			PROTO_FAIL("repl sync: rank out of range");
		if (m->flags & ~(FERRY_SYNC_F_ECHO | FERRY_SYNC_F_GONE))
			PROTO_FAIL("repl sync: unknown flags");
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("trailing bytes after the body");
		return 0;
	}
	default:
		if (!proto_pad_ok(left, 0))
			PROTO_FAIL("trailing bytes after the body");
		return 0;
	}
}

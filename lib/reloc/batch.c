/* SPDX-License-Identifier: MIT */
/*
 * batch.c - a batch: the move entries for one destination, in frames of at
 * most FERRY_RELOC_FRAME_BYTES (one entry whose value is larger goes alone, up to
 * FERRY_MSG_MAX). ferry__reloc_batch_add sends the frame built so far when the
 * next entry would not fit, so a batch of any size goes out in pieces; the
 * user's call may be as large as memory allows. Pieces of a bounded size
 * pipeline (the requester installs one while the next is sent) and keep the
 * transport's buffers within the sizes it reuses (tcp: TCP_RBUF_KEEP,
 * TCP_SPARE_MAX) instead of mapping fresh memory for every batch.
 *
 * A HANDOVER frame carries values. A value of at least FERRY_RELOC_IOV_BYTES is
 * not copied here: the frame goes out as an iovec that points into the slot
 * (the slot is MOVED, so no writer changes it until it is freed); smaller
 * ones are copied into b->vals, one iovec for a run of them. The slots the
 * values came from leave service only once the transport accepted the frame
 * (then they are freed after a grace period); a frame that could not be
 * built or sent puts its keys back into service here (undo->restore), so no
 * value is lost. Memory: f holds at most FERRY_RELOC_FRAME_BYTES of entries, vals
 * at most FERRY_RELOC_FRAME_BYTES of values, items one entry per key of the frame
 * being built (all three are kept from frame to frame of a batch and freed
 * at its end).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "lib/ops/ops.h"
#include "lib/reloc/batch.h"

void ferry__reloc_batch_init(struct ferry_reloc_batch *b, uint8_t type, uint32_t dst,
			     uint32_t requester, const struct ferry_reloc_undo *undo)
{
	memset(b, 0, sizeof(*b));
	b->undo = undo;
	b->type = type;
	b->dst = dst;
	b->requester = requester;
}

/*
 * Send the frame built so far: the entries from f, then each value in entry
 * order (from vals, or from its slot), then the padding. Return: 0 or a
 * negative errno (-ENOMEM: a buffer could not grow; -EMSGSIZE).
 */
static int batch_send(struct ferry *fy, struct ferry_table *t, struct ferry_reloc_batch *b)
{
	static const uint8_t zeros[FERRY_MSG_ALIGN];
	struct iovec iov[2 * FERRY_RELOC_FRAME_IOVS + 3];
	size_t total, small = 0;
	struct ferry_msg_move *m;
	bool run = false; /* iov[n - 1] is a run of small values */
	int n = 0;

	if (b->f.len == SIZE_MAX || b->vals.len == SIZE_MAX)
		return -ENOMEM;
	total = b->f.len + b->vbytes;
	if (total + FERRY_MSG_ALIGN > FERRY_MSG_MAX)
		return -EMSGSIZE;
	iov[n++] = (struct iovec){ .iov_base = b->f.buf, .iov_len = b->f.len };
	for (uint32_t i = 0; i < b->nitems; i++) {
		const struct ferry_reloc_item *it = &b->items[i];

		if (!it->vbytes)
			continue;
		if (it->vbytes >= FERRY_RELOC_IOV_BYTES) {
			iov[n++] = (struct iovec){ .iov_base = it->s->val, .iov_len = it->vbytes };
			run = false;
			continue;
		}
		/* a run of small values: one iovec into vals */
		if (run)
			iov[n - 1].iov_len += it->vbytes;
		else
			iov[n++] = (struct iovec){ .iov_base = b->vals.buf + small,
						   .iov_len = it->vbytes };
		run = true;
		small += it->vbytes;
	}
	if (total % FERRY_MSG_ALIGN) {
		size_t pad = FERRY_MSG_ALIGN - total % FERRY_MSG_ALIGN;

		iov[n++] = (struct iovec){ .iov_base = (void *)zeros, .iov_len = pad };
		total += pad;
	}
	ferry__proto_hdr_init((struct ferry_msg_hdr *)b->f.buf, b->type, (uint32_t)total, fy->rank,
			      t->id);
	m = (struct ferry_msg_move *)(b->f.buf + sizeof(struct ferry_msg_hdr));
	m->count = b->count;
	ferry__tl_stamp_keys(fy, ferry__tl_send_step(b->type), &b->items[0].key, sizeof(*b->items),
			     b->nitems);
	return ferry__sendv(fy, b->dst, iov, n);
}

/* send the frame built so far; settle the slots it carried; keep the buffers */
static int batch_flush(struct ferry *fy, struct ferry_table *t, struct ferry_reloc_batch *b)
{
	int rc;

	if (!b->nitems)
		return 0;
	rc = batch_send(fy, t, b);
	for (uint32_t i = 0; i < b->nitems; i++) {
		struct ferry_reloc_item *it = &b->items[i];

		if (it->s && !rc)
			ferry__arena_free_deferred(&t->arena, ferry__arena_idx(&t->arena, it->s));
		else if (it->s)
			b->undo->restore(fy, t, it->s, it->key, b->requester);
		else if (rc && b->type == FERRY_MSG_LOCALIZE)
			b->undo->unstart(fy, t, it->key, it->slot, rc);
		else if (rc && b->type == FERRY_MSG_HANDOVER_REQ)
			/* replicas: the old owner failed before the takeover,
			 * which ends the requester's move */
			(void)ferry__repl_want(t, it->key, b->requester);
	}
	if (rc)
		ferry_err("reloc: table %u: cannot send %u moves (type %u) to rank %u: %s; %s",
			  t->id, b->nitems, b->type, b->dst, ferry_strerror(rc),
			  b->type == FERRY_MSG_LOCALIZE ? "their localize fails, the keys stay "
							  "where they are" :
							  "the keys stay live here");
	/* the next frame starts in the same buffers (a failed one: fresh) */
	if (b->f.len == SIZE_MAX)
		ferry__frame_free(&b->f);
	if (b->vals.len == SIZE_MAX)
		ferry__frame_free(&b->vals);
	b->f.len = 0;
	b->vals.len = 0;
	b->vbytes = 0;
	b->nbig = 0;
	b->count = 0;
	b->nitems = 0;
	if (rc && !b->rc)
		b->rc = rc;
	return rc;
}

int ferry__reloc_batch_end(struct ferry *fy, struct ferry_table *t, struct ferry_reloc_batch *b)
{
	batch_flush(fy, t, b);
	ferry__frame_free(&b->f);
	ferry__frame_free(&b->vals);
	free(b->items);
	b->items = NULL;
	b->items_cap = 0;
	return b->rc;
}

int ferry__reloc_batch_add(struct ferry *fy, struct ferry_table *t, struct ferry_reloc_batch *b,
			   uint64_t key, uint32_t slot, uint32_t landing, uint32_t ticket,
			   struct ferry_slot *s, int with_value)
{
	uint32_t len = with_value ? ferry__value_len(t, key) : 0;
	size_t vb = (size_t)len * sizeof(float);
	size_t need = sizeof(struct ferry_msg_mv) + vb;
	struct ferry_msg_mv *mv;
	int rc = 0;

	/* room for the entry, its value and the padding: else send what we have */
	if (b->nitems && (b->f.len + b->vbytes + need + FERRY_MSG_ALIGN > FERRY_RELOC_FRAME_BYTES ||
			  (vb >= FERRY_RELOC_IOV_BYTES && b->nbig == FERRY_RELOC_FRAME_IOVS)))
		rc = batch_flush(fy, t, b);
	if (b->nitems == b->items_cap) {
		uint32_t cap = b->items_cap ? 2 * b->items_cap : 64;
		struct ferry_reloc_item *items = realloc(b->items, cap * sizeof(*items));

		if (!items) {
			/* cannot track the key: settle it now as a failed send would */
			if (s)
				b->undo->restore(fy, t, s, key, b->requester);
			else if (b->type == FERRY_MSG_LOCALIZE)
				b->undo->unstart(fy, t, key, slot, -ENOMEM);
			ferry_err("reloc: table %u: out of memory for a move of key %llu; it "
				  "stays where it is",
				  t->id, (unsigned long long)key);
			return -ENOMEM;
		}
		b->items = items;
		b->items_cap = cap;
	}
	if (!b->nitems) {
		struct ferry_msg_move *m;

		b->f.len = 0;
		ferry__frame_put(&b->f, sizeof(struct ferry_msg_hdr));
		m = ferry__frame_put(&b->f, sizeof(*m));
		if (m)
			m->requester = b->requester;
		b->count = 0;
	}
	mv = ferry__frame_put(&b->f, sizeof(*mv));
	if (mv) {
		mv->key = key;
		mv->slot = slot;
		mv->len = len;
		mv->landing = landing;
		mv->ticket = ticket;
	}
	b->count++;
	if (with_value && vb >= FERRY_RELOC_IOV_BYTES) {
		b->nbig++;
	} else if (with_value) {
		float *dst = ferry__frame_put(&b->vals, vb);

		if (dst)
			memcpy(dst, s->val, vb);
	}
	b->vbytes += vb;
	b->items[b->nitems++] = (struct ferry_reloc_item){
		.key = key, .slot = slot, .vbytes = (uint32_t)vb, .s = s
	};
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * batch.h - move entries for one destination, sent in bounded frames
 * (batch.c). reloc.c builds every LOCALIZE, HANDOVER_REQ, HANDOVER,
 * HANDOVER_DONE and LOC_ACK with it.
 */
#ifndef FERRY_LIB_RELOC_BATCH_H
#define FERRY_LIB_RELOC_BATCH_H

#include "lib/core/core.h"

#define FERRY_RELOC_FRAME_BYTES (1u << 20)
#define FERRY_RELOC_IOV_BYTES 512u  /* a value this large goes from its slot */
#define FERRY_RELOC_FRAME_IOVS 256u /* of them, per frame (with runs: 2 iovecs each) */

/*
 * What a frame that could not go undoes, reloc.c's (batch.c calls nothing
 * there): @restore puts a taken slot back into service; @unstart gives back
 * a LOCALIZE's reserved slot and fails its waiters with @status.
 * Progress thread or the localizing worker, rcu_read_lock held.
 */
struct ferry_reloc_undo {
	void (*restore)(struct ferry *fy, struct ferry_table *t, struct ferry_slot *s, uint64_t key,
			uint32_t requester);
	void (*unstart)(struct ferry *fy, struct ferry_table *t, uint64_t key, uint32_t slot,
			int status);
};

struct ferry_reloc_item {
	uint64_t key;
	uint32_t slot;	      /* LOCALIZE: the slot reserved here */
	uint32_t ticket;      /* LOCALIZE: the move's ticket */
	uint32_t vbytes;      /* HANDOVER: the value's bytes in the frame, else 0 */
	struct ferry_slot *s; /* HANDOVER(_DONE): the slot the value left from */
};

struct ferry_reloc_batch {
	uint8_t type;
	uint32_t dst;
	uint32_t requester;
	struct ferry_frame f; /* header, struct ferry_msg_move, the entries */
	uint32_t count;
	struct ferry_frame vals;	/* HANDOVER: the values below FERRY_RELOC_IOV_BYTES */
	size_t vbytes;			/* HANDOVER: all value bytes of the frame */
	uint32_t nbig;			/* values sent from their slot */
	struct ferry_reloc_item *items; /* the frame's keys, to settle after the send */
	uint32_t nitems, items_cap;
	int rc; /* first send failure */
	const struct ferry_reloc_undo *undo;
};

/* an empty batch of @type for @dst; @requester: the move's new owner */
void ferry__reloc_batch_init(struct ferry_reloc_batch *b, uint8_t type, uint32_t dst,
			     uint32_t requester, const struct ferry_reloc_undo *undo);
/*
 * Add one move entry for @key. @s: the taken slot of a HANDOVER or
 * HANDOVER_DONE (settled after the send), else NULL; @with_value: the
 * slot's value goes in a HANDOVER; @slot: the requester's slot; @landing: its
 * landing entry, or FERRY_LANDING_NONE; @ticket: the requester's tag of the
 * move, passed on as it came. A LOCALIZE entry is undone if its
 * frame cannot go. Return: 0, or the failure of a frame sent to make room
 * (its keys were settled: freed after the send, or undone).
 */
int ferry__reloc_batch_add(struct ferry *fy, struct ferry_table *t, struct ferry_reloc_batch *b,
			   uint64_t key, uint32_t slot, uint32_t landing, uint32_t ticket,
			   struct ferry_slot *s, int with_value);
/* send what is left and free the batch's memory; Return: the first failure */
int ferry__reloc_batch_end(struct ferry *fy, struct ferry_table *t, struct ferry_reloc_batch *b);

#endif /* FERRY_LIB_RELOC_BATCH_H */

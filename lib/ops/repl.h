/* SPDX-License-Identifier: MIT */
/*
 * repl.h - what repl.c (copies, held replies) and failover.c (the takeover
 * after a failure) share; lib/ops/ only. Progress thread, like both files.
 */
#ifndef FERRY_LIB_OPS_REPL_H
#define FERRY_LIB_OPS_REPL_H

#include "lib/ops/internal.h"

struct repl_copy {
	uint32_t owner; /* the rank whose live key it copies */
	uint32_t from;	/* the rank that sent it (a hand-over's old owner, or the owner) */
	uint32_t len;
	/* the last copy put was an ADOPT (a live owner's, after a failure):
	 * with r >= 2 only such a copy makes a new home's record (failover.c,
	 * step 0); the others come from updates a move may have overtaken */
	uint32_t adopt;
	float v[];
};

struct repl_want {
	uint64_t key;
	uint32_t req;
	/* 0, or the order in which the new home of a failed home's key
	 * recorded @req as its owner (ferry__repl_want_head): the head of the
	 * chain of moves asked there after the failure */
	uint32_t head;
};

struct repl_held {
	struct repl_held *next;
	uint64_t token;
	uint32_t origin;
	uint32_t nwait;	      /* frames not acknowledged yet */
	uint32_t *wait;	      /* per rank: REPL frames it has not acknowledged */
	struct ferry_frame f; /* the REPLY */
};

struct ferry_repl {
	struct ferry_keymap copies; /* key -> struct repl_copy * */
	/* home: the moves that wait after a failure (WANT), (key, requester)
	 * pairs, several per key in a chain; emptied by the takeover. Bound:
	 * one per move under way to a key homed here when a node failed */
	struct repl_want *wants;
	size_t nwants, wants_cap;
	uint32_t head_seq; /* the last repl_want.head handed out */
	struct repl_held *held;
	uint64_t next_token;
	uint8_t **synced; /* per failed rank: which ranks sent their SYNC (world bytes) */
	bool *done;	  /* per failed rank: takeover done */
	/* per rank: 1 while a takeover (or a decision after one) ends its
	 * failure; the homes that died with them (failover.c) */
	uint8_t *gone;
	/* per failed rank: when every live node had echoed (monotonic ns); the
	 * takeover waits the lease and a margin after it (fencing) */
	int64_t *ready_ns;
	/* takeovers ended here (any failed rank): a replicated request that
	 * waits when one ends fails at once (lib/ops/request.c): a node that
	 * forwarded it toward the dead rank before it knew has dropped it */
	atomic_uint takeovers;
	uint64_t copy_bytes;
};

/* builders of REPL frames, one per destination, begun on first use */
struct repl_out {
	struct ferry_frame *f; /* world entries */
	uint32_t *count;
	uint64_t token;
};

uint32_t ferry__repl_backups_as(const struct ferry_table *t, uint64_t key, uint32_t owner,
				uint32_t spare, uint32_t out[FERRY_REPL_MAX], uint32_t *home_p);
/* @rank is one of @set's @n ranks */
bool ferry__repl_in(const uint32_t *set, uint32_t n, uint32_t rank);
/* a copy of @key (owner @owner; its value @val, or read from @s) to each of
 * @owner's backups but this node and @skip (world: none); Return: 0 or a
 * negative errno, and *@n_p (if not NULL): how many went */
int ferry__repl_out_backups(struct ferry *fy, struct ferry_table *t, struct repl_out *o,
			    uint64_t key, uint32_t owner, uint32_t kind, const struct ferry_slot *s,
			    const float *val, uint32_t skip, uint32_t *sent_p, uint32_t *n_p);
int ferry__repl_out_init(struct repl_out *o, uint32_t world);
int ferry__repl_out_send(struct ferry *fy, struct ferry_table *t, struct repl_out *o, uint32_t dst);
/* room for one copy to @dst (the caller fills it); NULL: out of memory */
struct ferry_msg_copy *ferry__repl_out_add(struct ferry *fy, struct ferry_table *t,
					   struct repl_out *o, uint32_t dst, uint32_t *sent_p);
/* a copy of @key with its value: @val, or read from the live slot @s */
int ferry__repl_out_copy(struct ferry *fy, struct ferry_table *t, struct repl_out *o, uint32_t dst,
			 uint64_t key, uint32_t owner, uint32_t kind, const struct ferry_slot *s,
			 const float *val, uint32_t *sent_p);
void ferry__repl_out_fini(struct repl_out *o, uint32_t world);
/* send the held reply at *@pp and unlink it */
void ferry__repl_release(struct ferry *fy, struct ferry_table *t, struct repl_held **pp);
/* note that @req's move of @key waits (WANT; @head: ferry__repl_want_head's);
 * Return: 0 or -ENOMEM */
int ferry__repl_want_add(struct ferry_table *t, uint64_t key, uint32_t req, bool head);
void ferry__repl_copy_del(struct ferry_table *t, uint64_t key);
/* keep a copy (@val NULL: the key's initial value; @adopt: it is an ADOPT) */
int ferry__repl_copy_put(struct ferry_table *t, uint64_t key, uint32_t owner, uint32_t from,
			 const float *val, uint32_t len, bool adopt);
/* the REPL and REPL_ACK handlers */
void ferry__repl_on_repl(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v);
void ferry__repl_on_ack(struct ferry *fy, struct ferry_table *t, uint32_t src,
			const struct ferry_proto_view *v);

#endif /* FERRY_LIB_OPS_REPL_H */

/* SPDX-License-Identifier: MIT */
/*
 * proto.h - Ferry's wire format, one for every transport.
 *
 * The frame header and its checks live in transport/base/frame.h, which the
 * transports share; this file has the bodies the core sends and receives.
 * Every frame a node receives passes ferry__proto_check_hdr() in its
 * transport and ferry__proto_parse() in the core's dispatcher before any
 * field is used; a frame that fails is logged once and its connection
 * dropped.
 *
 * docs/protocol.md describes each body; the structs below are the source.
 */
#ifndef FERRY_LIB_PROTO_H
#define FERRY_LIB_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "transport/base/frame.h"

enum ferry_op {
	FERRY_OP_PULL = 1,
	FERRY_OP_PUSH,
	FERRY_OP_SET,
};

/* FERRY_MSG_OP: count entries, then (push, set) their values back to back */
struct ferry_msg_op {
	uint32_t origin; /* rank that waits for the reply */
	uint32_t worker; /* worker index there */
	uint64_t req;	 /* ticket there */
	uint8_t op;	 /* enum ferry_op */
	uint8_t hops;	 /* forwards so far */
	uint16_t flags;	 /* FERRY_OP_F_*: how a push's values travel */
	uint32_t count;
};

/* a push's values as 16-bit codes (lib/ops/codec.c), padded to 8 bytes */
#define FERRY_OP_F_BF16 1u
#define FERRY_OP_F_FP16 2u

struct ferry_msg_key {
	uint64_t key;
	uint32_t idx; /* position in the origin's request */
	uint32_t len; /* floats of this key's value */
};

/* FERRY_MSG_REPLY: count idx values (uint32), then (pull) the values */
struct ferry_msg_reply {
	uint64_t req;
	uint32_t worker;
	uint32_t count;
	int32_t status; /* 0 or a negative errno for every key of this reply */
	uint32_t owner; /* rank that applied them: a location hint */
	uint8_t op;
	uint8_t flags; /* FERRY_REPLY_F_* */
	uint8_t pad[6];
};

/* after the indices: count uint64 slot hints, (slot << 32) | epoch, one per
 * key, for origins that read slots one-sided */
#define FERRY_REPLY_F_SLOTS 1u

/*
 * FERRY_MSG_LOCALIZE, _HANDOVER_REQ, _LOC_ACK, _HANDOVER_DONE: count struct ferry_msg_mv.
 * FERRY_MSG_HANDOVER: count struct ferry_msg_mv, then the values back to back.
 */
struct ferry_msg_move {
	uint32_t requester; /* the new owner */
	uint32_t count;
};

struct ferry_msg_mv {
	uint64_t key;
	uint32_t slot;	  /* the slot the requester prepared */
	uint32_t len;	  /* floats (HANDOVER); 0 otherwise */
	uint32_t landing; /* the requester's landing entry for a one-sided
			   * hand-over, or FERRY_LANDING_NONE; HANDOVER_DONE
			   * names the entry written (never NONE) */
	uint32_t ticket;  /* the requester's tag of this move, unguessable: the home
			   * passes it on in HANDOVER_REQ, the old owner and
			   * the home echo it; the requester takes a HANDOVER,
			   * HANDOVER_DONE or LOC_ACK only with its own */
};

/*
 * Landing inboxes: per table and node, entries a peer may RDMA WRITE a
 * handed-over value into (the arena itself is registered for remote reads
 * only). The limits below bound what a peer may announce; lib/reloc.c sizes
 * the inbox within them.
 */
#define FERRY_LANDING_NONE 0xffffffffu
#define FERRY_INBOX_MAX_ENTRIES 1024u
#define FERRY_INBOX_BYTES (4u << 20)	   /* the inbox's size, unless one entry is bigger */
#define FERRY_INBOX_MAX_STRIDE (16u << 20) /* one entry: the largest value, 2^22 floats */

/* FERRY_MSG_BARRIER, FERRY_MSG_BARRIER_REL */
struct ferry_msg_barrier {
	uint64_t gen;
	int32_t status; /* REL: 0, or -FERRY_E_PEER: the barrier cannot complete */
	uint32_t rank;	/* REL with a status: the rank that failed */
};

/* FERRY_MSG_CHUNK: chunk @chunk of the sender's arena of the header's table
 * (slots [chunk << shift, (chunk + 1) << shift)) is readable with @rkey */
#define FERRY_CHUNKS_MAX 256u /* = FERRY_ARENA_CHUNKS_MAX */
struct ferry_msg_chunk {
	uint32_t chunk; /* < FERRY_CHUNKS_MAX, or FERRY_CHUNK_INBOX */
	uint32_t shift; /* 6 .. 31, the same in every CHUNK of one sender and table;
			 * 0 with FERRY_CHUNK_INBOX */
	uint64_t rkey;
};

/* a CHUNK of this index grants the receiver its region of the sender's
 * landing inbox (lib/reloc/inbox.c): @rkey, sent to that receiver alone */
#define FERRY_CHUNK_INBOX 0xffffffffu

/* FERRY_MSG_MGR_DEAD: from a node to itself only: the membership manager
 * (lib/mgr/) saw @rank's membership end at @epoch; the progress thread then
 * declares it failed */
struct ferry_msg_mgr {
	uint64_t epoch; /* the manager's epoch (etcd: the revision of the delete) */
	uint32_t rank;	/* < world, never the sender */
	uint32_t pad;
};

/*
 * FERRY_MSG_REJOIN_ASK (rank 0 to itself and to each rank it holds live,
 * @state 0) and FERRY_MSG_REJOIN_VIEW (the answer, to rank 0): how does the
 * sender hold @rank? Asked when a replacement for @rank asks rank 0 to
 * rejoin (lib/core/rejoin.c); @seq pairs an answer with its ask.
 */
enum ferry_rejoin_state {
	FERRY_REJOIN_FAILED = 0,  /* failed, and no takeover of it waits here */
	FERRY_REJOIN_ALIVE = 1,	  /* alive here */
	FERRY_REJOIN_TAKEOVER = 2 /* failed, and a takeover of it still waits here */
};

struct ferry_msg_rejoin {
	uint32_t rank;	/* 1 .. world-1, never the sender */
	uint32_t seq;	/* rank 0's number of the ask */
	uint32_t state; /* VIEW: enum ferry_rejoin_state; ASK: 0 */
	uint32_t pad;
};

/*
 * FERRY_MSG_COLL: one segment of one step of a collective (lib/coll/), then
 * n elements of the collective's type; _COLL_ACK and _COLL_KICK: the body
 * only (n = 0, off = 0). Every field but off, n and step is the collective's
 * signature, the same in every frame of it: a node that receives one that
 * differs from its own call fails that collective with -FERRY_E_MISMATCH.
 */
enum ferry_coll_kind {
	FERRY_COLL_KIND_ALLREDUCE = 1,
	FERRY_COLL_KIND_REDUCE,
	FERRY_COLL_KIND_BCAST,
};

struct ferry_msg_coll {
	uint64_t seq;	/* the sender's collective number: every node calls
			 * collectives in one order, numbered from 0 */
	uint64_t count; /* elements of the whole collective */
	uint64_t off;	/* first element of this segment */
	uint32_t n;	/* elements in this segment (0: ACK, KICK) */
	uint32_t step;	/* the algorithm's step, < 2 world + 2 */
	uint8_t kind;	/* enum ferry_coll_kind */
	uint8_t dtype;	/* enum ferry_dtype */
	uint8_t op;	/* enum ferry_redop; 0 for a broadcast */
	uint8_t algo;	/* enum ferry_coll_algo, never AUTO */
	uint32_t root;	/* reduce, broadcast: the root (an index in the group);
			 * 0 for an all-reduce */
	uint64_t group; /* 0: every node; else the group's id (ferry_group_create):
			 * seq, root and step count within the group */
};

/*
 * FERRY_MSG_COLL_KEYS: a struct ferry_msg_coll (off, n, step 0), then this:
 * where the sender of the frame lets the receiver WRITE the segments of
 * that collective (lib/coll/put.c). A key of 0: not there (send by message).
 * FERRY_MSG_COLL_PUT: a struct ferry_msg_coll naming a segment (off, n,
 * step) whose elements the sender has written into the receiver's memory,
 * and whose WRITE completed; no data follows.
 */
struct ferry_msg_coll_keys {
	uint64_t buf_addr; /* the working buffer: in-place steps (all-gather, chain) */
	uint64_t buf_rkey;
	uint64_t land_addr; /* the landing buffer: reduce-scatter steps of the ring */
	uint64_t land_rkey;
};

/* bytes per element of an enum ferry_dtype, 0 for an unknown one */
static inline uint32_t ferry__dtype_size(uint32_t dtype)
{
	return dtype >= 1 && dtype <= 3 ? (dtype == 1 ? 4u : 8u) : 0u;
}

/* FERRY_MSG_HEARTBEAT: the sender's beat number (lib/core/heartbeat.c) */
struct ferry_msg_heartbeat {
	uint64_t seq;
	/* the lease (lib/core/heartbeat.c): a beat carries its sender's
	 * monotonic clock at the send (@sent_ns, nonzero); the receiver answers
	 * at once with an echo (@seq and @sent_ns 0, @echo_ns the beat's
	 * @sent_ns), which renews the beat's sender's lease from it */
	uint64_t sent_ns;
	uint64_t echo_ns;
};

/*
 * FERRY_MSG_REPL: count copies, each a struct ferry_msg_copy followed by its
 * len floats, padded to 8 bytes (lib/ops/repl.c). @token nonzero: the
 * receiver answers REPL_ACK{token} once it holds them (the owner holds the
 * replies to the updates they carry until then).
 */
struct ferry_msg_repl {
	uint64_t token;
	uint32_t count;
	uint32_t pad; /* 0 */
};

enum ferry_copy_kind {
	FERRY_COPY_VALUE = 1, /* a backup copy of @owner's live key */
	FERRY_COPY_ADOPT,     /* the same, after a failure: the receiver, if it is the
			       * key's home, records @owner as the key's owner */
	FERRY_COPY_MOVE,      /* home -> every live node, when the old owner of a key
			       * in motion failed: @owner, the last requester,
			       * finishes its move with the value; the others drop theirs */
	FERRY_COPY_WANT,      /* len 0: the sender's move of the key waits, and its
			       * home failed; to the new home */
};

struct ferry_msg_copy {
	uint64_t key;
	uint32_t len;	/* floats: the key's value length */
	uint32_t owner; /* the rank whose live key this copies */
	uint32_t kind;	/* enum ferry_copy_kind */
	uint32_t pad;	/* 0 */
};

/* bytes of one copy with its value, padded */
static inline size_t ferry__copy_size(uint32_t len)
{
	return sizeof(struct ferry_msg_copy) + (((size_t)len * sizeof(float) + 7) & ~(size_t)7);
}

/* FERRY_MSG_REPL_ACK */
struct ferry_msg_repl_ack {
	uint64_t token;
};

/*
 * FERRY_MSG_REPL_SYNC: the sender knows @dead failed and sent every copy it
 * owed because of it (flags 0); with FERRY_SYNC_F_ECHO: the answer to the
 * receiver's SYNC, so everything the receiver sent before its SYNC has been
 * handled by the sender
 */
#define FERRY_SYNC_F_ECHO 1u
/* the sender knows the dead rank's process is gone (no lease to wait out) */
#define FERRY_SYNC_F_GONE 2u
struct ferry_msg_repl_sync {
	uint32_t dead;
	uint32_t flags;
};

/*
 * FERRY_MSG_OP_FWD (table scope): the sender forwarded keys of the origin's
 * request @req of worker @worker to rank @dst, which will answer for them
 * (lib/ops/serve.c). The origin then waits on @dst too: if @dst fails, the
 * request fails at once with -FERRY_E_PEER instead of waiting for a reply
 * that will not come.
 */
struct ferry_msg_op_fwd {
	uint32_t worker;
	uint32_t dst;
	uint64_t req;
};

/* FERRY_MSG_TABLE: the fields that must agree; _TABLE_ACK: status + field */
struct ferry_msg_table {
	uint64_t num_keys;
	uint64_t lens_hash; /* hash of the per-key lengths, or of value_len */
	uint64_t capacity;
	uint32_t value_len;
	uint32_t placement;
	uint32_t vnodes;
	uint32_t mode;
	uint32_t no_local_fast_path;
	int32_t status;	    /* TABLE_ACK: 0 or -FERRY_E_MISMATCH */
	uint32_t field;	    /* TABLE_ACK: which field differed (enum below) */
	uint32_t from_rank; /* TABLE_ACK: the rank that differed */
	uint32_t pad;
	/* TABLE: where the sender's arena is, for one-sided access (0 if none) */
	uint64_t arena_addr;
	uint64_t arena_rkey;
	uint64_t arena_stride;
	/* TABLE: the sender's landing inbox (all 0 if none) */
	uint64_t inbox_addr;
	uint64_t inbox_rkey;
	uint32_t inbox_entries; /* 1 .. FERRY_INBOX_MAX_ENTRIES */
	uint32_t inbox_stride;	/* bytes per entry: a multiple of 64, at most
				 * FERRY_INBOX_MAX_STRIDE */
	/* TABLE (version 4): initial values, which must agree */
	uint32_t init; /* enum ferry_init */
	float init_a, init_b;
	uint32_t sparse;
	uint64_t init_seed;
	/* TABLE: the consistency model (enum ferry_consistency) and its bound */
	uint32_t consistency;
	uint32_t staleness;
	/* TABLE (replication): backups per key, which must agree */
	uint32_t replicas;
	uint32_t pad2;
	/* TABLE: hot keys (lib/cons/hot.c), which must agree: their count,
	 * the sync interval and a hash of the sorted keys */
	uint32_t hot_count;
	uint32_t hot_sync_ms;
	uint64_t hot_hash;
};

/* FERRY_MSG_CLOCK (node scope): the sender's clock, which never goes down;
 * every push it buffered in clocks below it is applied at the owner */
struct ferry_msg_clock {
	uint64_t clock;
};

/*
 * FERRY_MSG_CONS_PUSH (table scope): keys of batch @seq of the sender's
 * buffered deltas (lib/cons/push.c), @count entries, then their values. A
 * key is applied at most once per (sender, table, seq, idx): a copy that
 * comes again (the same @attempt) gets the answer recorded the first time.
 */
struct ferry_msg_cons_push {
	uint64_t seq;	/* the sender's batch number for this table, from 1 */
	uint32_t total; /* keys in the whole batch: every idx is below it */
	uint32_t count;
};

struct ferry_msg_cons_key {
	uint64_t key;
	uint32_t idx;	  /* position in the batch */
	uint32_t len;	  /* floats of the key's value */
	uint32_t attempt; /* + 1 each time the sender routes the key anew */
	uint32_t pad;
};

/* FERRY_MSG_CONS_ACK (table scope): @count answers after the body */
struct ferry_msg_cons_ack {
	uint64_t seq;
	uint32_t count;
	uint32_t pad;
};

struct ferry_msg_cons_st {
	uint32_t idx;
	uint32_t attempt;
	int32_t status; /* 0 applied; -EAGAIN not live here (see hint); else not applied */
	uint32_t hint;	/* -EAGAIN: the rank to try next (world: none) */
};

/*
 * FERRY_MSG_HOT_PUSH (table scope): frame @seq of the sender's hot-key
 * deltas (lib/cons/hot.c), numbered from 1 per (sender, table); @count
 * entries (idx ascending), then their values. A receiver applies frame seq
 * only right after seq - 1, once, and answers HOT_ACK with the last frame it
 * applied from the sender.
 */
struct ferry_msg_hot_push {
	uint64_t seq;
	uint32_t count;
	uint32_t pad;
};

struct ferry_msg_hot_ent {
	uint32_t idx; /* position in the table's sorted hot keys */
	uint32_t len; /* floats of the key's value */
};

/* FERRY_MSG_HOT_ACK (table scope): every frame up to @seq is applied */
struct ferry_msg_hot_ack {
	uint64_t seq;
};

/*
 * FERRY_MSG_ESSP_SUB (table scope): node @origin reads @count keys (after
 * the body) of an ESSP table and asks their owner to push their values at
 * each global clock (lib/cons/essp.c), under subscription @id; @flags
 * FERRY_ESSP_UNSUB: stop. @done: every batch of @origin's buffered deltas
 * of this table numbered up to it is settled (each applied key is in every
 * value read after this frame arrives). A rank where a key is not live
 * passes it on toward its owner (FERRY_ESSP_HOPS counts the passes, at most
 * FERRY_ESSP_HOPS_MAX); @origin is the sender unless passed on.
 */
struct ferry_msg_essp_sub {
	uint64_t done;
	uint32_t id;
	uint32_t count;
	uint32_t flags;
	uint32_t origin;
};

#define FERRY_ESSP_UNSUB 1u
#define FERRY_ESSP_HOPS(flags) (((flags) >> 8) & 0xffu)
#define FERRY_ESSP_HOPS_MAX 2u

/*
 * FERRY_MSG_ESSP_VAL (table scope): @count values of keys the receiver
 * subscribed at the sender, each read there after the sender saw every node
 * at clock @fresh or more (so each holds every update of clocks below it);
 * entries, then their values.
 */
struct ferry_msg_essp_val {
	uint64_t fresh;
	uint32_t count;
	uint32_t pad;
};

struct ferry_msg_essp_ent {
	uint64_t key;
	uint64_t tag; /* the value holds every applied delta of the receiver's batches up to it */
	uint32_t id;  /* the receiver's subscription it answers */
	uint32_t len; /* floats of the key's value */
};

/* FERRY_MSG_ESSP_KICK (node scope, to self only): the global clock here
 * reached @clock */
struct ferry_msg_essp_kick {
	uint64_t clock;
};

/* TABLE_ACK (one-sided transports): world entries after the body, rank order:
 * each rank's arena (remote read) and landing inbox (remote write) */
struct ferry_msg_arena {
	uint64_t addr;
	uint64_t rkey;
	uint64_t inbox_addr; /* 0: no inbox, hand-overs to this rank go by message */
	uint64_t inbox_rkey;
	uint32_t inbox_entries;
	uint32_t inbox_stride;
};

enum ferry_table_field {
	FERRY_TF_NONE = 0,
	FERRY_TF_NUM_KEYS,
	FERRY_TF_VALUE_LENS,
	FERRY_TF_CAPACITY,
	FERRY_TF_PLACEMENT,
	FERRY_TF_VNODES,
	FERRY_TF_MODE,
	FERRY_TF_FAST_PATH,
	FERRY_TF_INIT,
	FERRY_TF_SPARSE,
	FERRY_TF_CONSISTENCY,
	FERRY_TF_REPLICAS,
	FERRY_TF_HOT,
};

/* what a frame's keys are checked against */
struct ferry_proto_limits {
	uint32_t world;
	uint64_t num_keys;	    /* 0: any key (a sparse table) */
	uint32_t value_len;	    /* when value_lens is NULL */
	const uint32_t *value_lens; /* per key, or NULL */
};

/* A parsed, validated view into a received frame (points into it). */
struct ferry_proto_view {
	const struct ferry_msg_hdr *hdr;
	const void *body; /* the fixed part: struct ferry_msg_op, _reply, _move, ... */
	uint32_t count;
	const struct ferry_msg_key *keys;     /* OP */
	const struct ferry_msg_mv *mvs;	      /* LOCALIZE, HANDOVER_REQ, HANDOVER, LOC_ACK */
	const uint32_t *idx;		      /* REPLY */
	const uint64_t *slots;		      /* REPLY with FERRY_REPLY_F_SLOTS */
	const struct ferry_msg_arena *arenas; /* TABLE_ACK with a trailer */
	const struct ferry_msg_coll *coll;    /* COLL, COLL_ACK, COLL_KICK */
	const struct ferry_msg_copy *copies;  /* REPL */
	const void *data;		      /* COLL: the segment's elements */
	const float *vals;		      /* values, where the type has them */
	const uint16_t *codes;		      /* OP with FERRY_OP_F_BF16/FP16: nvals codes
					       * instead of vals (NULL) */
	size_t nvals;			      /* floats at vals */
};

/**
 * ferry__proto_parse - validate a whole frame and give a view into it
 * @buf, @len: the frame; ferry__proto_check_hdr() passed on it
 * @lim: the table's limits for types that carry keys; for the others only
 *       lim->world is used (TABLE_ACK's trailer); may be NULL then; for REPLY the value count cannot be checked here (the
 *       origin knows it), so vals/nvals cover everything after the indices
 * @view: filled in on success
 * @why_p: on failure, a static description of the bad field
 *
 * Return: 0, or -FERRY_E_PROTO.
 */
int ferry__proto_parse(const void *buf, size_t len, const struct ferry_proto_limits *lim,
		       struct ferry_proto_view *view, const char **why_p);

/** ferry__proto_value_len - floats for @key under @lim (0 when out of range) */
static inline uint32_t ferry__proto_value_len(const struct ferry_proto_limits *lim, uint64_t key)
{
	if (lim->num_keys && key >= lim->num_keys)
		return 0;
	return lim->value_lens ? lim->value_lens[key] : lim->value_len;
}

/* ---- building frames ---------------------------------------------------- */

struct ferry_frame {
	uint8_t *buf;
	size_t len, cap;
};

/* append @n bytes (zeroed); NULL on allocation failure (the frame is then
 * poisoned and ferry__frame_finish fails) */
void *ferry__frame_put(struct ferry_frame *f, size_t n);
/* pad to FERRY_MSG_ALIGN and write the header; the frame starts with room
 * for it (ferry__frame_begin). Return: 0 or -ENOMEM / -EMSGSIZE. */
int ferry__frame_finish(struct ferry_frame *f, uint8_t type, uint32_t src, uint32_t table);
void ferry__frame_begin(struct ferry_frame *f);
void ferry__frame_free(struct ferry_frame *f);

#endif /* FERRY_LIB_PROTO_H */

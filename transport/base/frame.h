/* SPDX-License-Identifier: MIT */
/*
 * frame.h - the frame header every Ferry message starts with, and the
 * checks of it that the transports and the core share (transport/base/).
 *
 * A frame is a 16-byte header followed by a body whose layout depends on the
 * type (lib/core/proto.h has the bodies the core uses). Integers are
 * little-endian (the host order of every supported machine; a big-endian
 * host is refused at build time). A frame's length is a multiple of 8
 * (padded with zeros at the end), so frames packed back to back in a buffer
 * that starts 8-byte aligned stay aligned.
 *
 *   0      2   3    4          8          12         16
 *   +------+---+----+----------+----------+----------+---- body ...
 *   |magic |ver|type| len      | src rank | table id |
 *   +------+---+----+----------+----------+----------+----
 *
 * A transport frames its byte stream with len after
 * ferry__proto_check_hdr() passed, and answers HELLO and BYE itself; every
 * other type goes up to the core's dispatcher. The type numbers are the
 * registry of the wire: one list for every layer.
 */
#ifndef FERRY_TRANSPORT_BASE_FRAME_H
#define FERRY_TRANSPORT_BASE_FRAME_H

#include <stddef.h>
#include <stdint.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "Ferry's wire format assumes a little-endian host"
#endif

#define FERRY_MSG_MAGIC 0x5946u /* "FY" on the wire */
/* 2: landing inboxes (table trailer, move entries); 3: barrier releases carry a
 * status (a failed rank breaks the barrier); 4: sessions that survive a lost
 * link (RESUME after the HELLO, ACK), sparse tables (any 64-bit key) and
 * initial values in TABLE, CHUNK (arenas registered a chunk at a time),
 * collectives (COLL, COLL_ACK, COLL_KICK); 5: COLL's group (collectives of
 * node groups); 6: OP's flags (compressed pushes), CONS_PUSH and CONS_ACK,
 * rdma's sessions (numbered chunks, RESUME, the HELLO's incarnation); 7:
 * OP_FWD; older peers are refused */
#define FERRY_PROTO_VERSION 10
#define FERRY_MSG_MAX (64u << 20) /* largest frame, header included */
#define FERRY_MSG_ALIGN 8u	  /* every frame's len is a multiple: frames stay aligned */

enum ferry_msg_type {
	FERRY_MSG_HELLO = 1,	  /* connection handshake (transports) */
	FERRY_MSG_OP,		  /* pull / push / set of keys, maybe forwarded */
	FERRY_MSG_REPLY,	  /* results back to the origin */
	FERRY_MSG_LOCALIZE,	  /* requester -> home: move these keys to me */
	FERRY_MSG_HANDOVER_REQ,	  /* home -> current owner: give them to X */
	FERRY_MSG_HANDOVER,	  /* old owner -> new owner: keys and values */
	FERRY_MSG_LOC_ACK,	  /* home -> requester: already yours */
	FERRY_MSG_BARRIER,	  /* node -> rank 0 */
	FERRY_MSG_BARRIER_REL,	  /* rank 0 -> every node */
	FERRY_MSG_TABLE,	  /* node -> rank 0: my table parameters */
	FERRY_MSG_TABLE_ACK,	  /* rank 0 -> every node: verdict */
	FERRY_MSG_HANDOVER_DONE,  /* old owner -> new owner: values already written
				      one-sided into the requester's landing entries */
	FERRY_MSG_BYE,		  /* header only: the sender closes on purpose
				      (transports consume it; the core never sees it) */
	FERRY_MSG_TABLE_FREE,	  /* node -> rank 0: I destroyed this table */
	FERRY_MSG_TABLE_FREE_ACK, /* rank 0 -> every node: all did; free it */
	FERRY_MSG_RESUME,	  /* right after a stream transport's HELLO: where the
				      session resumes (transports only) */
	FERRY_MSG_ACK,		  /* frames delivered so far (transports only) */
	FERRY_MSG_CHUNK,	  /* node -> every node: a chunk of my arena, and its rkey */
	FERRY_MSG_COLL,		  /* a collective's data: one segment of one step */
	FERRY_MSG_COLL_ACK,	  /* broadcast: a node has all of it (-> root) */
	FERRY_MSG_COLL_KICK,	  /* to self: a started collective has frames to replay */
	FERRY_MSG_HEARTBEAT = 22, /* node -> every node and itself: alive (lib/core/heartbeat.c) */
	FERRY_MSG_REPL = 23,	  /* owner -> backup: copies of values (lib/ops/repl.c) */
	FERRY_MSG_REPL_ACK = 24,  /* backup -> owner: the copies of a REPL are held */
	FERRY_MSG_REPL_SYNC = 25, /* node -> every node: my copies after a failure are sent */
	FERRY_MSG_MGR_DEAD = 32,  /* to self: the membership manager saw a node leave */
	FERRY_MSG_OP_FWD = 33,	  /* forwarder -> origin: an OP of yours went on to rank N */
	/* 36 .. 45: consistency models (lib/cons/) */
	FERRY_MSG_CLOCK = 36,	  /* node -> every node: my clock; my pushes of clocks
			       * below it are applied at their owners */
	FERRY_MSG_CONS_PUSH = 37, /* node -> owner: a numbered batch of buffered deltas */
	FERRY_MSG_CONS_ACK = 38,  /* owner -> node: per key, applied (once) or not here */
	FERRY_MSG_HOT_PUSH = 39,  /* node -> every node: a numbered frame of hot-key deltas */
	FERRY_MSG_HOT_ACK = 40,	  /* node -> sender: its hot frames up to seq are applied */
	FERRY_MSG_ESSP_SUB = 43,  /* reader -> owner: (un)subscribe keys to ESSP's pushes */
	FERRY_MSG_ESSP_VAL = 44,  /* owner -> subscriber: values fresh to a global clock */
	FERRY_MSG_ESSP_KICK = 45, /* to self: the global clock moved here; push */
	/* 46 .. 47: collectives' puts by one-sided WRITE (lib/coll/put.c) */
	FERRY_MSG_COLL_KEYS = 46, /* receiver -> its sender: where a collective may WRITE */
	FERRY_MSG_COLL_PUT = 47,  /* writer -> receiver: a segment's WRITE has landed */
	/* 48 .. 49: a replacement node's ask (lib/core/rejoin.c) */
	FERRY_MSG_REJOIN_ASK = 48,  /* rank 0 -> each live rank: do you hold rank r failed? */
	FERRY_MSG_REJOIN_VIEW = 49, /* a live rank -> rank 0: its answer */
	/* 50: the loop transport's own (transport/loop/loop.c), never the core's:
	 * a write_imm's notice or acknowledgement between threads of one process */
	FERRY_MSG_LOOP_IMM = 50,
	FERRY_MSG_TYPE_MAX
};

/*
 * The token proof (transport/base/auth.h) that opens a connection when the
 * cluster has a token, before its HELLO. Outside the enum on purpose: they
 * never travel inside a session, so ferry__proto_check_hdr() refuses them
 * there like any unknown type.
 */
#define FERRY_MSG_AUTH 30	/* a nonce */
#define FERRY_MSG_AUTH_PROOF 31 /* a MAC over both nonces */

struct ferry_msg_hdr {
	uint16_t magic;
	uint8_t version;
	uint8_t type;
	uint32_t len; /* whole frame, header included */
	uint32_t src; /* sender's rank */
	uint32_t table;
};

/* FERRY_MSG_HELLO: the first frame on every connection, both ways */
struct ferry_msg_hello {
	uint64_t cluster_id;
	uint32_t rank;
	uint32_t world;
};

/*
 * FERRY_MSG_RESUME: a stream transport's second handshake frame, right after
 * its HELLO, both ways. The frames of a session (everything but HELLO,
 * RESUME and ACK) are numbered 1, 2, ... per direction, in the order sent;
 * the stream keeps that order, so the number travels implicitly.
 * @incarnation: random per transport instance; a reconnection must present
 *               the one the session began with (else it is another process)
 * @delivered:   frames of the peer's that this end handed to its core: the
 *               peer resends from @delivered + 1
 * @sent:        frames this end numbered for the peer so far (>= the peer's
 *               @delivered, or frames were lost: the session cannot resume)
 */
struct ferry_msg_resume {
	uint64_t incarnation;
	uint64_t delivered;
	uint64_t sent;
};

/* FERRY_MSG_ACK: @delivered frames of the receiver's have been handed to its
 * core (cumulative; never more than were sent); the sender may forget them */
struct ferry_msg_ack {
	uint64_t delivered;
};

/* a frame type numbered in a session (not HELLO, RESUME or ACK) */
static inline int ferry__proto_sequenced(uint8_t type)
{
	return type != FERRY_MSG_HELLO && type != FERRY_MSG_RESUME && type != FERRY_MSG_ACK;
}

/**
 * ferry__proto_check_hdr - validate a frame header
 * @hdr: the first sizeof(struct ferry_msg_hdr) bytes of a frame
 * @world: ranks are < @world
 * @why_p: on failure, a static description of what was wrong
 *
 * Checks magic, version, type, src and that len lies within
 * [sizeof(hdr), FERRY_MSG_MAX]. Context: any thread.
 * Return: 0 or -FERRY_E_PROTO.
 */
int ferry__proto_check_hdr(const struct ferry_msg_hdr *hdr, uint32_t world, const char **why_p);

/**
 * ferry__proto_check_hello - is a HELLO frame one of our cluster's?
 * @frame: the peer's HELLO frame (header and body, at least @len bytes)
 * @cluster_id, @world, @rank: ours
 * @dialed: the rank we dialed, or -1 for a connection the peer opened (the
 *          peer must then have the higher rank: lower ranks wait to be dialed)
 * @why, @wlen: on failure, what was wrong, for the log
 *
 * The transports' shared handshake rule. Context: any thread.
 * Return: the peer's rank, or -1.
 */
int ferry__proto_check_hello(const void *frame, size_t len, uint64_t cluster_id, uint32_t world,
			     uint32_t rank, int dialed, char *why, size_t wlen);

/** ferry__proto_hdr_init - fill a header for @type with total frame length @len */
void ferry__proto_hdr_init(struct ferry_msg_hdr *hdr, uint8_t type, uint32_t len, uint32_t src,
			   uint32_t table);

#endif /* FERRY_TRANSPORT_BASE_FRAME_H */

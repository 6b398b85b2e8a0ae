/* SPDX-License-Identifier: MIT */
/*
 * dispatch.c - the frame dispatcher: what the transport's progress thread
 * calls for every frame, peer failure and one-sided completion.
 *
 *   transport (progress thread)      dispatch.c                    modules
 *   ---------------------------      ----------                    -------
 *   on_msg(src, frame) ------------> type registered? scope TABLE:
 *                                    look the table up, parse the
 *                                    frame against its limits;
 *                                    scope NODE: parse against the
 *                                    world  -----------------------> handler(fy, t, src, view)
 *   on_rdma_done(ctx, status) -----> ctx->done(fy, ctx, status) ---> the module that posted it
 *   on_write_imm(src, tag) --------> the tag's module registered? -> imm_fns[user](fy, src, bits)
 *   on_peer_failed(src) -----------> ferry__node_peer_failed: mark src failed,
 *                                    run the modules' listeners, wake waiters
 *
 * Modules register their handlers before the node starts
 * (ferry__dispatch_register, from lib/ferry.c's ferry_open), as UCX's
 * active-message handlers: the core never calls a module by name, so
 * node.c sits at the bottom and the modules above it. A frame of a type
 * nobody registered, or one that fails its parse, is a protocol error: the
 * sender is dropped and the node keeps serving everyone else.
 *
 * Context: every function here but ferry__dispatch_register runs on the
 * progress thread (on_rdma_done also on a worker inside ferry__node_poll,
 * and with tcp's FERRY_TCP_WORKER_POLL=1 every handler: one at a time all
 * the same), with rcu_read_lock taken here around the handler.
 */
#include <errno.h>

#include "lib/core/core.h"
#include "lib/core/timeline.h"

int ferry__dispatch_register(struct ferry *fy, uint8_t type, enum ferry_dispatch_scope scope,
			     ferry_msg_fn fn)
{
	/* the transports' own types (HELLO, RESUME, ACK, BYE) never reach the core */
	if (!fn || type == 0 || type >= FERRY_MSG_TYPE_MAX || !ferry__proto_sequenced(type) ||
	    type == FERRY_MSG_BYE ||
	    (scope != FERRY_DISPATCH_NODE && scope != FERRY_DISPATCH_TABLE)) {
		ferry_err("dispatch: cannot register a handler for frame type %u (scope %d): a "
			  "bug in the module that asked",
			  type, (int)scope);
		return -EINVAL;
	}
	if (fy->handlers[type].fn) {
		ferry_err("dispatch: frame type %u has a handler already: two modules claim it",
			  type);
		return -EEXIST;
	}
	fy->handlers[type] = (struct ferry_msg_handler){ .fn = fn, .scope = scope };
	return 0;
}

int ferry__dispatch_register_imm(struct ferry *fy, uint32_t user, ferry_imm_fn fn)
{
	if (!fn || user == 0 || user >= FERRY_TP_IMM_USERS) {
		ferry_err("dispatch: cannot register a WRITE-with-immediate handler for module %u: "
			  "a bug in the module that asked",
			  user);
		return -EINVAL;
	}
	if (fy->imm_fns[user]) {
		ferry_err("dispatch: WRITE-with-immediate module %u has a handler already: two "
			  "modules claim it",
			  user);
		return -EEXIST;
	}
	fy->imm_fns[user] = fn;
	return 0;
}

static void dispatch_on_thread_start(void *core)
{
	urcu_memb_register_thread();
}

static void dispatch_on_thread_stop(void *core)
{
	urcu_memb_unregister_thread();
}

static void dispatch_on_peer_failed(void *core, uint32_t src, int err)
{
	struct ferry *fy = core;

	/* no lease to wait out (heartbeat.c, fencing) */
	if (err == -ECONNREFUSED && src < fy->world)
		atomic_store_explicit(&fy->gone[src], 1, memory_order_relaxed);
	ferry__node_peer_failed(fy, src);
}

static struct ferry_table *dispatch_table(struct ferry *fy, uint32_t id)
{
	if (id >= FERRY_MAX_TABLES)
		return NULL;
	return rcu_dereference(fy->tables[id]);
}

/* drop a peer that broke the protocol; the others keep being served */
static void dispatch_proto_error(struct ferry *fy, uint32_t src, uint8_t type, const char *why)
{
	ferry_err("proto: rank %u sent a malformed message (type %u): %s; dropping rank %u", src,
		  type, why, src);
	ferry__node_peer_failed(fy, src);
}

static void dispatch_on_msg(void *core, uint32_t src, const void *buf, size_t len)
{
	struct ferry *fy = core;
	const struct ferry_msg_hdr *hdr = buf;
	struct ferry_proto_limits node_lim = { .world = fy->world };
	const struct ferry_msg_handler *h = NULL;
	struct ferry_proto_view v;
	struct ferry_table *t = NULL;
	const char *why = "unexpected message type";
	uint8_t type = len >= sizeof(*hdr) ? hdr->type : 0;

	if (src >= fy->world || atomic_load_explicit(&fy->failed[src], memory_order_relaxed))
		return;
	/* a sign of life for the failure detector (heartbeat.c) */
	if (!atomic_load_explicit(&fy->heard[src], memory_order_relaxed))
		atomic_store_explicit(&fy->heard[src], 1, memory_order_relaxed);
	if (type != FERRY_MSG_HEARTBEAT) {
		atomic_fetch_add_explicit(&fy->msgs_recv, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&fy->bytes_recv, len, memory_order_relaxed);
	}

	if (type && type < FERRY_MSG_TYPE_MAX)
		h = &fy->handlers[type];
	if (!h || !h->fn) {
		dispatch_proto_error(fy, src, type, why);
		return;
	}
	urcu_memb_read_lock();
	if (h->scope == FERRY_DISPATCH_TABLE) {
		t = dispatch_table(fy, hdr->table);
		if (!t && hdr->table < fy->ntables) {
			/* destroyed here, still used there: drop the message only */
			ferry_warn("table %u: rank %u used a table this node destroyed; message "
				   "dropped",
				   hdr->table, src);
			goto out;
		}
		if (!t)
			why = "unknown table";
		else if (ferry__proto_parse(buf, len, &t->lim, &v, &why))
			t = NULL;
		if (t) {
			ferry__tl_frame(fy, &v); /* timeline.h: the receive steps */
			h->fn(fy, t, src, &v);
		} else {
			dispatch_proto_error(fy, src, type, why);
		}
	} else if (!ferry__proto_parse(buf, len, &node_lim, &v, &why)) {
		h->fn(fy, NULL, src, &v);
	} else {
		dispatch_proto_error(fy, src, type, why);
	}
out:
	urcu_memb_read_unlock();
}

static void dispatch_on_rdma_done(void *core, void *ctx, int status)
{
	struct ferry_rdma_ctx *c = ctx;

	urcu_memb_read_lock();
	c->done(core, ctx, status);
	urcu_memb_read_unlock();
}

/* a write_imm() landed: the tag's module, as a frame's type picks its handler */
static void dispatch_on_write_imm(void *core, uint32_t src, uint32_t tag)
{
	struct ferry *fy = core;
	uint32_t user = tag >> FERRY_TP_IMM_USER_SHIFT;

	if (src >= fy->world || atomic_load_explicit(&fy->failed[src], memory_order_relaxed))
		return;
	if (tag > FERRY_TP_IMM_TAG_MASK || !fy->imm_fns[user]) {
		ferry_err("proto: rank %u sent a WRITE with immediate tag %#x, which no module of "
			  "this node takes; dropping rank %u",
			  src, tag, src);
		ferry__node_peer_failed(fy, src);
		return;
	}
	atomic_fetch_add_explicit(&fy->msgs_recv, 1, memory_order_relaxed);
	urcu_memb_read_lock();
	fy->imm_fns[user](fy, src, tag & ((1u << FERRY_TP_IMM_USER_SHIFT) - 1));
	urcu_memb_read_unlock();
}

const struct ferry_tp_handler ferry__dispatch_handler = {
	.on_write_imm = dispatch_on_write_imm,
	.on_rdma_done = dispatch_on_rdma_done,
	.on_msg = dispatch_on_msg,
	.on_peer_failed = dispatch_on_peer_failed,
	.on_thread_start = dispatch_on_thread_start,
	.on_thread_stop = dispatch_on_thread_stop,
};

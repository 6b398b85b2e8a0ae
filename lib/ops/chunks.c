/* SPDX-License-Identifier: MIT */
/*
 * chunks.c - one-sided access to arenas that grow a chunk at a time.
 *
 * An arena is registered a chunk at a time (lib/store/store.h, "Chunks"):
 * ferry__ops_chunk_reg() is its on_chunk hook, which registers the chunk's
 * bytes for remote reads. Peers learn each chunk's rkey from a CHUNK frame:
 *
 *   owner A                                   peer B
 *   arena_alloc -> on_chunk: mem_reg(chunk c)
 *   ... a slot of c is published ...
 *   progress thread, before a REPLY that       CHUNK{c, shift, rkey}: recorded
 *   names a slot (a hint) goes out:            in peer_chunks[A]
 *   CHUNK{c, shift, rkey} to every peer  ----> REPLY{.., slot hint} : a later
 *   REPLY{.., slot hint}  ------------------->  pull of the key is one READ
 *
 * A peer learns a slot of A only from a REPLY of A, and A's frames to B
 * arrive in the order A queued them, so B knows the rkey of every chunk a
 * hint of A names. (A hint whose chunk B does not know falls back to a
 * message, which is only slower.)
 *
 * Memory: this node's MR per chunk (at most FERRY_ARENA_CHUNKS_MAX); per
 * peer one struct ferry_peer_chunks (FERRY_CHUNKS_MAX rkeys, 4 KiB), only
 * on transports with one-sided reads.
 */
#include <errno.h>
#include <stdlib.h>

#include "lib/ops/internal.h"

_Static_assert(FERRY_CHUNKS_MAX == FERRY_ARENA_CHUNKS_MAX,
	       "one chunk limit on the wire and in the arena");

int ferry__ops_chunk_reg(void *arg, struct ferry_arena *a, uint32_t c)
{
	struct ferry_table *t = arg;
	struct ferry *fy = t->fy;
	struct ferry_tp_mr *mr = calloc(1, fy->tp->ops->mr_size);
	uint32_t first, n;
	int rc;

	if (!mr)
		return -ENOMEM;
	ferry__arena_chunk_span(a, c, &first, &n);
	rc = fy->tp->ops->mem_reg(fy->tp, a->base + (size_t)first * a->stride,
				  (size_t)n * a->stride, FERRY_TP_ACCESS_REMOTE_READ, mr);
	if (rc) {
		free(mr);
		ferry_err("table %u: cannot register chunk %u of the arena (%zu bytes) on rank %u: "
			  "%s; new keys and localizes here fail until memory can be registered "
			  "(raise the memlock limit, ulimit -l)",
			  t->id, c, (size_t)n * a->stride, fy->rank, ferry_strerror(rc));
		return rc;
	}
	__atomic_store_n(&t->chunk_mr[c], mr, __ATOMIC_RELEASE);
	__atomic_fetch_add(&t->registered, (uint64_t)n * a->stride, __ATOMIC_RELAXED);
	return 0;
}

struct ferry_tp_mr *ferry__ops_chunk_mr(const struct ferry_table *t, uint32_t slot)
{
	uint32_t c = slot >> t->arena.chunk_shift;

	return c < FERRY_ARENA_CHUNKS_MAX ? __atomic_load_n(&t->chunk_mr[c], __ATOMIC_ACQUIRE) :
					    NULL;
}

void ferry__ops_chunks_announce(struct ferry *fy, struct ferry_table *t)
{
	uint32_t ready = __atomic_load_n(&t->arena.chunks_ready, __ATOMIC_ACQUIRE);

	for (; t->chunks_announced < ready; t->chunks_announced++) {
		uint32_t c = t->chunks_announced;
		struct ferry_tp_mr *mr = __atomic_load_n(&t->chunk_mr[c], __ATOMIC_ACQUIRE);
		struct ferry_msg_chunk *m;
		struct ferry_frame f;

		if (!mr)
			continue; /* a transport that registers nothing */
		ferry__frame_begin(&f);
		m = ferry__frame_put(&f, sizeof(*m));
		if (m)
			*m = (struct ferry_msg_chunk){ .chunk = c,
						       .shift = t->arena.chunk_shift,
						       .rkey = mr->rkey };
		if (!m || ferry__frame_finish(&f, FERRY_MSG_CHUNK, fy->rank, t->id)) {
			/* peers read this chunk's slots by message: slower only */
			ferry_err("table %u: out of memory announcing chunk %u of the arena", t->id,
				  c);
			ferry__frame_free(&f);
			continue;
		}
		for (uint32_t r = 0; r < fy->world; r++)
			if (r != fy->rank)
				(void)ferry__send(fy, r, f.buf,
						  f.len); /* a failed peer: nothing to tell */
		ferry__frame_free(&f);
	}
}

int ferry__ops_peer_rkey(const struct ferry_table *t, uint32_t rank, uint32_t slot, uint64_t *rkey)
{
	const struct ferry_peer_chunks *pc = &t->peer_chunks[rank];
	uint32_t shift = __atomic_load_n(&pc->shift, __ATOMIC_ACQUIRE), c;

	if (!shift)
		return 0;
	c = slot >> shift;
	if (c >= FERRY_CHUNKS_MAX || !__atomic_load_n(&pc->c[c].valid, __ATOMIC_ACQUIRE))
		return 0;
	*rkey = pc->c[c].rkey;
	return 1;
}

/* a peer's chunk: progress thread, rcu_read_lock held */
static void ops_on_chunk(struct ferry *fy, struct ferry_table *t, uint32_t src,
			 const struct ferry_proto_view *v)
{
	const struct ferry_msg_chunk *m = v->body;
	struct ferry_peer_chunks *pc;
	uint32_t shift;

	if (!t->peer_chunks || src == fy->rank) {
		ferry_err("proto: rank %u announced an arena chunk of table %u, which has no "
			  "one-sided access here; dropping rank %u",
			  src, t->id, src);
		ferry__node_peer_failed(fy, src);
		return;
	}
	if (m->chunk == FERRY_CHUNK_INBOX) {
		/* its inbox region for us (lib/reloc/inbox.c); a peer may renew it */
		if (t->inbox_grant)
			t->inbox_grant[src] = m->rkey;
		return;
	}
	pc = &t->peer_chunks[src];
	shift = __atomic_load_n(&pc->shift, __ATOMIC_RELAXED);
	if (shift && shift != m->shift) {
		ferry_err("proto: rank %u changed the chunk size of table %u (2^%u slots, was "
			  "2^%u); dropping rank %u",
			  src, t->id, m->shift, shift, src);
		ferry__node_peer_failed(fy, src);
		return;
	}
	pc->c[m->chunk].rkey = m->rkey;
	__atomic_store_n(&pc->c[m->chunk].valid, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&pc->shift, m->shift, __ATOMIC_RELEASE);
}

int ferry__ops_chunks_attach(struct ferry *fy)
{
	return ferry__dispatch_register(fy, FERRY_MSG_CHUNK, FERRY_DISPATCH_TABLE, ops_on_chunk);
}

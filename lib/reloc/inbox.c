/* SPDX-License-Identifier: MIT */
/*
 * inbox.c - the landing inbox: per table and node, entries a peer RDMA
 * WRITEs a handed-over value into, registered for remote writes only, so
 * that the arena needs no remote write access (reloc.c has the protocol).
 * One region per peer, each registered on its own, its rkey sent to that
 * peer alone: a peer can write its own region of this node's inbox and
 * nothing else here (docs/rdma.md, "What a member can read and write").
 *
 *   entries: | region of rank 0 | region of rank 1 | ... (this rank skipped)
 *              k entries, MR 0     k entries, MR 1
 *
 * The requester reserves an entry, in the region of the node it expects to
 * hand the key over (its location hint), when it starts a localize and frees
 * it when the key is installed, or when the home says it was ours already.
 * Another node that hands it over finds the entry outside its region and
 * sends the value by message. Free lists and busy marks under
 * table.pend.lock.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "lib/reloc/inbox.h"

/* the region of @writer in @owner's inbox: regions skip the owner itself */
static inline uint32_t inbox_region(uint32_t owner, uint32_t writer)
{
	return writer < owner ? writer : writer - 1;
}

/*
 * Size: one region of k entries per peer, k = what FERRY_INBOX_MAX_ENTRIES
 * (1024) entries and FERRY_INBOX_BYTES (4 MiB) hold, shared out among the
 * world - 1 peers, and at most the arena's capacity. The inbox is pinned
 * memory on RDMA (it counts against the memlock limit) per table and node, so
 * it is bounded; with more peers than the budget has entries (k = 0) there is
 * none, and every hand-over to this node goes by message, where the value
 * bytes cost about what they cost by write. Classic mode never moves keys:
 * no inbox. Each region is registered on its own, for remote writes only;
 * its rkey goes to its peer alone (ferry__reloc_inbox_grant).
 *
 * Context: table build, before the table is published. Return: 0 (also when
 * there is no inbox: transport without one-sided writes, or its registration
 * failed, logged) or -ENOMEM.
 */
int ferry__reloc_inbox_init(struct ferry *fy, struct ferry_table *t)
{
	const struct ferry_tp_ops *ops = fy->tp->ops;
	const uint32_t need = FERRY_TP_CAP_READ | FERRY_TP_CAP_WRITE;
	const uint32_t peers = fy->world - 1;
	struct ferry_inbox *in = &t->inbox;
	size_t stride = ((size_t)t->max_len * sizeof(float) + 63) & ~(size_t)63;
	size_t k, n, bytes;
	uint32_t regs = 0;
	uint8_t *base;
	int rc;

	if (!ops->mem_reg || !ops->write || (ops->caps & need) != need ||
	    t->params.mode == FERRY_MODE_CLASSIC || !t->arena.capacity || !peers)
		return 0;
	n = FERRY_INBOX_BYTES / stride;
	if (n < 1)
		n = 1; /* one entry larger than the budget: the wire allows it alone */
	if (n > FERRY_INBOX_MAX_ENTRIES)
		n = FERRY_INBOX_MAX_ENTRIES;
	k = n / peers;
	if (k > t->arena.capacity)
		k = t->arena.capacity;
	if (!k)
		return 0;
	n = k * peers;
	bytes = n * stride;
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		return -ENOMEM;
	in->mrs = calloc(peers, sizeof(*in->mrs));
	in->free = malloc(n * sizeof(*in->free));
	in->nfree_r = calloc(peers, sizeof(*in->nfree_r));
	in->busy = calloc(n, sizeof(*in->busy));
	if (!in->mrs || !in->free || !in->nfree_r || !in->busy) {
		rc = -ENOMEM;
		goto err_free;
	}
	for (regs = 0; regs < peers; regs++) {
		in->mrs[regs] = calloc(1, ops->mr_size);
		rc = in->mrs[regs] ? ops->mem_reg(fy->tp, base + regs * k * stride, k * stride,
						  FERRY_TP_ACCESS_REMOTE_WRITE, in->mrs[regs]) :
				     -ENOMEM;
		if (rc == -ENOMEM && !in->mrs[regs])
			goto err_free;
		if (rc) {
			ferry_warn("reloc: table %u: cannot register a landing inbox of %zu bytes "
				   "on rank %u (%s); keys localized to it are handed over by "
				   "message",
				   t->id, bytes, fy->rank, ferry_strerror(rc));
			free(in->mrs[regs]);
			in->mrs[regs] = NULL;
			rc = 0;
			goto err_free;
		}
	}
	for (uint32_t r = 0; r < peers; r++) {
		for (size_t i = 0; i < k; i++) /* the region's first entry on top */
			in->free[r * k + i] = (uint32_t)(r * k + k - 1 - i);
		in->nfree_r[r] = (uint32_t)k;
	}
	in->nfree = (uint32_t)n;
	in->n = (uint32_t)n;
	in->k = (uint32_t)k;
	in->stride = (uint32_t)stride;
	in->bytes = bytes;
	in->base = base;
	return 0;

err_free:
	while (in->mrs && regs--) {
		ops->mem_dereg(fy->tp, in->mrs[regs]);
		free(in->mrs[regs]);
	}
	free(in->mrs);
	free(in->free);
	free(in->nfree_r);
	free(in->busy);
	in->mrs = NULL;
	in->free = NULL;
	in->nfree_r = NULL;
	in->busy = NULL;
	munmap(base, bytes);
	return rc;
}

/* table free: no handler sees the table any more */
void ferry__reloc_inbox_fini(struct ferry *fy, struct ferry_table *t)
{
	struct ferry_inbox *in = &t->inbox;

	if (!in->base)
		return;
	for (uint32_t r = 0; r + 1 < fy->world; r++) {
		if (fy->tp)
			fy->tp->ops->mem_dereg(fy->tp, in->mrs[r]);
		free(in->mrs[r]);
	}
	free(in->mrs);
	free(in->free);
	free(in->nfree_r);
	free(in->busy);
	munmap(in->base, in->bytes);
	in->base = NULL;
	in->n = in->nfree = 0;
}

/*
 * ferry__reloc_inbox_grant - tell each peer the rkey of its region of this
 * node's inbox, and it alone (a CHUNK frame of index FERRY_CHUNK_INBOX)
 *
 * Context: the creating thread, once the table's create succeeded: every peer
 * has the table by then (it sent its TABLE before rank 0 acknowledged).
 */
void ferry__reloc_inbox_grant(struct ferry *fy, struct ferry_table *t)
{
	struct ferry_inbox *in = &t->inbox;

	if (!in->base)
		return;
	for (uint32_t r = 0; r < fy->world; r++) {
		struct {
			struct ferry_msg_hdr h;
			struct ferry_msg_chunk c;
		} f;

		if (r == fy->rank)
			continue;
		memset(&f, 0, sizeof(f));
		ferry__proto_hdr_init(&f.h, FERRY_MSG_CHUNK, sizeof(f), fy->rank, t->id);
		f.c.chunk = FERRY_CHUNK_INBOX;
		f.c.rkey = in->mrs[inbox_region(fy->rank, r)]->rkey;
		(void)ferry__send(fy, r, &f, sizeof(f)); /* a failed peer writes nothing */
	}
}

int ferry__reloc_inbox_writable(const struct ferry_table *t, uint32_t owner, uint32_t entries,
				uint32_t idx)
{
	uint32_t me = t->fy->rank, world = t->fy->world, k, r;

	if (owner == me || world < 2 || entries % (world - 1))
		return 0;
	k = entries / (world - 1);
	r = inbox_region(owner, me);
	return idx >= r * k && idx < r * k + k;
}

void ferry__reloc_inbox_usage(struct ferry_table *t, uint32_t *entries_p, uint32_t *nfree_p)
{
	pthread_mutex_lock(&t->pend.lock);
	*entries_p = t->inbox.n;
	*nfree_p = t->inbox.nfree;
	pthread_mutex_unlock(&t->pend.lock);
}

/* reserve a landing entry in @writer's region, or FERRY_LANDING_NONE; t->pend.lock held */
uint32_t ferry__inbox_get(struct ferry_table *t, uint32_t writer)
{
	struct ferry_inbox *in = &t->inbox;
	uint32_t idx, r;

	if (!in->base || writer == t->fy->rank || writer >= t->fy->world)
		return FERRY_LANDING_NONE;
	r = inbox_region(t->fy->rank, writer);
	if (!in->nfree_r[r])
		return FERRY_LANDING_NONE;
	idx = in->free[r * in->k + --in->nfree_r[r]];
	in->nfree--;
	in->busy[idx] = 1;
	return idx;
}

/* give a reserved entry back (FERRY_LANDING_NONE: nothing); t->pend.lock held */
void ferry__inbox_put(struct ferry_table *t, uint32_t idx)
{
	struct ferry_inbox *in = &t->inbox;
	uint32_t r;

	if (idx == FERRY_LANDING_NONE)
		return;
	if (idx >= in->n || !in->busy[idx]) {
		/* a bug here, never a peer's doing: entries are ours to track */
		ferry_err("reloc: table %u: landing entry %u freed twice (or never reserved); "
			  "kept out of the free list",
			  t->id, idx);
		assert(!"landing entry freed twice");
		return;
	}
	r = idx / in->k;
	in->busy[idx] = 0;
	in->free[r * in->k + in->nfree_r[r]++] = idx;
	in->nfree++;
}

const float *ferry__inbox_entry(const struct ferry_table *t, uint32_t idx)
{
	return (const float *)(t->inbox.base + (size_t)idx * t->inbox.stride);
}

/* SPDX-License-Identifier: MIT */
/*
 * inbox.c - the landing inbox: per table and node, entries a peer RDMA
 * WRITEs a handed-over value into, registered for remote writes only, so
 * that the arena needs no remote write access (reloc.c has the protocol).
 * The requester reserves an entry when it starts a localize and frees it
 * when the key is installed, or when the home says it was ours already.
 * Free list and busy marks under table.pend.lock.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "lib/reloc/inbox.h"

/*
 * Size: one entry per key that can be on its way here (the arena's
 * capacity), at most FERRY_INBOX_MAX_ENTRIES (1024) and FERRY_INBOX_BYTES
 * (4 MiB) in all, but at least one entry. The inbox is pinned memory on RDMA
 * (it counts against the memlock limit) per table and node, so it is
 * bounded; 4 MiB holds 1024 values of 1024 floats. Keys localized beyond it
 * at once are handed over by message, where the value bytes cost about what
 * they cost by write. Classic mode never moves keys: no inbox.
 *
 * Context: table build, before the table is published. Return: 0 (also when
 * there is no inbox: transport without one-sided writes, or its registration
 * failed, logged) or -ENOMEM.
 */
int ferry__reloc_inbox_init(struct ferry *fy, struct ferry_table *t)
{
	const struct ferry_tp_ops *ops = fy->tp->ops;
	const uint32_t need = FERRY_TP_CAP_READ | FERRY_TP_CAP_WRITE;
	struct ferry_inbox *in = &t->inbox;
	size_t stride = ((size_t)t->max_len * sizeof(float) + 63) & ~(size_t)63;
	size_t n, bytes;
	uint8_t *base;
	int rc;

	if (!ops->mem_reg || !ops->write || (ops->caps & need) != need ||
	    t->params.mode == FERRY_MODE_CLASSIC || !t->arena.capacity)
		return 0;
	n = FERRY_INBOX_BYTES / stride;
	if (n < 1)
		n = 1;
	if (n > FERRY_INBOX_MAX_ENTRIES)
		n = FERRY_INBOX_MAX_ENTRIES;
	if (n > t->arena.capacity)
		n = t->arena.capacity;
	bytes = n * stride;
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		return -ENOMEM;
	in->mr = calloc(1, ops->mr_size);
	in->free = malloc(n * sizeof(*in->free));
	in->busy = calloc(n, sizeof(*in->busy));
	if (!in->mr || !in->free || !in->busy) {
		rc = -ENOMEM;
		goto err_free;
	}
	rc = ops->mem_reg(fy->tp, base, bytes, FERRY_TP_ACCESS_REMOTE_WRITE, in->mr);
	if (rc) {
		ferry_warn("reloc: table %u: cannot register a landing inbox of %zu bytes on rank "
			   "%u (%s); keys localized to it are handed over by message",
			   t->id, bytes, fy->rank, ferry_strerror(rc));
		rc = 0;
		goto err_free;
	}
	for (size_t i = 0; i < n; i++) /* entry 0 on top */
		in->free[i] = (uint32_t)(n - 1 - i);
	in->nfree = (uint32_t)n;
	in->n = (uint32_t)n;
	in->stride = (uint32_t)stride;
	in->bytes = bytes;
	in->base = base;
	return 0;

err_free:
	free(in->mr);
	free(in->free);
	free(in->busy);
	in->mr = NULL;
	in->free = NULL;
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
	if (fy->tp)
		fy->tp->ops->mem_dereg(fy->tp, in->mr);
	free(in->mr);
	free(in->free);
	free(in->busy);
	munmap(in->base, in->bytes);
	in->base = NULL;
	in->n = in->nfree = 0;
}

void ferry__reloc_inbox_usage(struct ferry_table *t, uint32_t *entries_p, uint32_t *nfree_p)
{
	pthread_mutex_lock(&t->pend.lock);
	*entries_p = t->inbox.n;
	*nfree_p = t->inbox.nfree;
	pthread_mutex_unlock(&t->pend.lock);
}

/* reserve a landing entry, or FERRY_LANDING_NONE; t->pend.lock held */
uint32_t ferry__inbox_get(struct ferry_table *t)
{
	struct ferry_inbox *in = &t->inbox;
	uint32_t idx;

	if (!in->nfree)
		return FERRY_LANDING_NONE;
	idx = in->free[--in->nfree];
	in->busy[idx] = 1;
	return idx;
}

/* give a reserved entry back (FERRY_LANDING_NONE: nothing); t->pend.lock held */
void ferry__inbox_put(struct ferry_table *t, uint32_t idx)
{
	struct ferry_inbox *in = &t->inbox;

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
	in->busy[idx] = 0;
	in->free[in->nfree++] = idx;
}

const float *ferry__inbox_entry(const struct ferry_table *t, uint32_t idx)
{
	return (const float *)(t->inbox.base + (size_t)idx * t->inbox.stride);
}

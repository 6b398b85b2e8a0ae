/* SPDX-License-Identifier: MIT */
/*
 * dsgd.h - the trainer's pieces that its files share (not an API): the plan
 * (plan.c builds it: cells, row runs, buffers' sizes), one node's run of
 * its workers (dsgd.c), and the launchers (launch.c: nodes as threads or
 * as forked processes, mf_train()).
 */
#ifndef FERRY_BENCH_MF_DSGD_H
#define FERRY_BENCH_MF_DSGD_H

#include <stddef.h>
#include <stdint.h>

#include "mf.h"

/* keys per batched call outside the SGD pass (localize, set, evaluation) */
#define MF_CHUNK_KEYS 4096
#define MF_CHUNK_BYTES (2u << 20)

/* Read-only after mf_plan_build: shared by every worker (and every forked node). */
struct mf_plan {
	int nw; /* workers */
	uint64_t rows, cols;
	uint64_t *rb, *cb;	/* nw + 1 row and column block boundaries */
	size_t *cell;		/* nw * nw + 1 offsets of cell (w, b) = w * nw + b */
	struct mf_entry *train; /* grouped by cell, by row within a cell */
	size_t *tcell;		/* nw + 1 offsets of each worker's test entries */
	struct mf_entry *test;	/* grouped by worker, by row within a worker */
	size_t max_run;		/* longest row run of a cell */
	uint64_t *keys;		/* keys[k] = k: slices of it name key ranges */
	size_t chunk;		/* keys per batched call outside the SGD pass */
};

/* the worker of row i: the largest w with rb[w] = floor(w * rows / nw) <= i */
static inline int mf_row_worker(const struct mf_plan *p, uint32_t i)
{
	return (int)((((uint64_t)i + 1) * (uint64_t)p->nw - 1) / p->rows);
}

static inline int mf_col_block(const struct mf_plan *p, uint32_t j)
{
	return (int)((((uint64_t)j + 1) * (uint64_t)p->nw - 1) / p->cols);
}

/* Return: 0, -ENOMEM. Context: before any node starts. */
int mf_plan_build(const struct mf_config *cfg, const struct mf_matrix *train,
		  const struct mf_matrix *test, struct mf_plan *p);
void mf_plan_free(struct mf_plan *p);

/* Run one node's workers on @fy; the calling thread is worker 0. Return: 0
 * or the first error. */
int mf_node_run(struct ferry *fy, const struct mf_config *cfg, const struct mf_plan *p,
		struct mf_result *res);

#endif /* FERRY_BENCH_MF_DSGD_H */

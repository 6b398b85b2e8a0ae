/* SPDX-License-Identifier: MIT */
/*
 * plan.c - the DSGD plan (dsgd.h): row and column blocks, the entries
 * grouped by cell and by row within a cell, the test entries by worker,
 * and the sizes of the workers' buffers. Built once, read-only after.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dsgd.h"

void mf_plan_free(struct mf_plan *p)
{
	free(p->rb);
	free(p->cb);
	free(p->cell);
	free(p->train);
	free(p->tcell);
	free(p->test);
	free(p->keys);
	memset(p, 0, sizeof(*p));
}

/*
 * Group @m's entries by @group(entry) (ngroups groups), by row within a group:
 * a stable counting sort by row, then one by group.
 */
static int mf_group(const struct mf_plan *p, const struct mf_matrix *m, int by_cell, size_t ngroups,
		    size_t **off_p, struct mf_entry **out_p)
{
	size_t *rowoff = calloc(p->rows + 1, sizeof(*rowoff));
	size_t *off = calloc(ngroups + 1, sizeof(*off));
	struct mf_entry *tmp = malloc((m->nnz ? m->nnz : 1) * sizeof(*tmp));
	struct mf_entry *out = malloc((m->nnz ? m->nnz : 1) * sizeof(*out));
	int rc = -ENOMEM;

	if (!rowoff || !off || !tmp || !out)
		goto err;
	for (size_t k = 0; k < m->nnz; k++)
		rowoff[m->e[k].i + 1]++;
	for (uint64_t i = 0; i < p->rows; i++)
		rowoff[i + 1] += rowoff[i];
	for (size_t k = 0; k < m->nnz; k++)
		tmp[rowoff[m->e[k].i]++] = m->e[k];

	for (size_t k = 0; k < m->nnz; k++) {
		size_t g = (size_t)mf_row_worker(p, tmp[k].i);

		if (by_cell)
			g = g * (size_t)p->nw + (size_t)mf_col_block(p, tmp[k].j);
		off[g + 1]++;
	}
	for (size_t g = 0; g < ngroups; g++)
		off[g + 1] += off[g];
	for (size_t k = 0; k < m->nnz; k++) {
		size_t g = (size_t)mf_row_worker(p, tmp[k].i);

		if (by_cell)
			g = g * (size_t)p->nw + (size_t)mf_col_block(p, tmp[k].j);
		out[off[g]++] = tmp[k];
	}
	/* the scatter advanced every offset to the group's end: shift back */
	memmove(off + 1, off, ngroups * sizeof(*off));
	off[0] = 0;
	free(rowoff);
	free(tmp);
	*off_p = off;
	*out_p = out;
	return 0;
err:
	free(rowoff);
	free(off);
	free(tmp);
	free(out);
	return rc;
}

int mf_plan_build(const struct mf_config *cfg, const struct mf_matrix *train,
		  const struct mf_matrix *test, struct mf_plan *p)
{
	size_t nkeys = train->rows + train->cols;
	int nw = cfg->nodes * cfg->threads;
	size_t bytes;
	int rc;

	memset(p, 0, sizeof(*p));
	p->nw = nw;
	p->rows = train->rows;
	p->cols = train->cols;
	p->rb = malloc((size_t)(nw + 1) * sizeof(*p->rb));
	p->cb = malloc((size_t)(nw + 1) * sizeof(*p->cb));
	p->keys = malloc(nkeys * sizeof(*p->keys));
	if (!p->rb || !p->cb || !p->keys) {
		rc = -ENOMEM;
		goto err;
	}
	for (int w = 0; w <= nw; w++) {
		p->rb[w] = (uint64_t)w * p->rows / (uint64_t)nw;
		p->cb[w] = (uint64_t)w * p->cols / (uint64_t)nw;
	}
	for (size_t k = 0; k < nkeys; k++)
		p->keys[k] = k;
	rc = mf_group(p, train, 1, (size_t)nw * (size_t)nw, &p->cell, &p->train);
	if (rc)
		goto err;
	rc = mf_group(p, test, 0, (size_t)nw, &p->tcell, &p->test);
	if (rc)
		goto err;
	for (size_t c = 0; c < (size_t)nw * (size_t)nw; c++) {
		size_t k = p->cell[c];

		while (k < p->cell[c + 1]) {
			size_t r = k;

			while (r < p->cell[c + 1] && p->train[r].i == p->train[k].i)
				r++;
			if (r - k > p->max_run)
				p->max_run = r - k;
			k = r;
		}
	}
	bytes = (size_t)cfg->rank * sizeof(float);
	p->chunk = MF_CHUNK_BYTES / bytes;
	if (p->chunk > MF_CHUNK_KEYS)
		p->chunk = MF_CHUNK_KEYS;
	if (!p->chunk)
		p->chunk = 1;
	return 0;
err:
	mf_plan_free(p);
	return rc;
}

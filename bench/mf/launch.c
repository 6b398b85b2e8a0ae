/* SPDX-License-Identifier: MIT */
/*
 * launch.c - mf_train(): checks the configuration, builds the plan, and
 * runs the nodes as threads of this process or as forked processes, each
 * through mf_node_run() (dsgd.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsgd.h"

struct mf_node_thread {
	struct ferry *fy;
	const struct mf_config *cfg;
	const struct mf_plan *plan;
	struct mf_result *res;
	int rc;
};

static void *mf_node_thread_main(void *arg)
{
	struct mf_node_thread *nt = arg;

	nt->rc = mf_node_run(nt->fy, nt->cfg, nt->plan, nt->res);
	return NULL;
}

static int mf_train_threads(const struct mf_config *cfg, const struct mf_plan *p,
			    struct ferry_params *fp, struct mf_result *res)
{
	struct ferry **fys = calloc((size_t)cfg->nodes, sizeof(*fys));
	struct mf_node_thread *nts = calloc((size_t)cfg->nodes, sizeof(*nts));
	pthread_t *tids = calloc((size_t)cfg->nodes, sizeof(*tids));
	int started = 0, rc;

	if (!fys || !nts || !tids) {
		rc = -ENOMEM;
		goto out_free;
	}
	rc = ferry_local_cluster_open(cfg->nodes, fp, fys);
	if (rc) {
		fprintf(stderr, "ferry-mf: ferry_local_cluster_open(%d) failed: %s\n", cfg->nodes,
			ferry_strerror(rc));
		goto out_free;
	}
	for (; started < cfg->nodes; started++) {
		nts[started] = (struct mf_node_thread){
			.fy = fys[started], .cfg = cfg, .plan = p, .res = res
		};
		rc = -pthread_create(&tids[started], NULL, mf_node_thread_main, &nts[started]);
		if (rc) {
			fprintf(stderr, "ferry-mf: pthread_create failed: %s\n", strerror(-rc));
			break;
		}
	}
	/* nodes that started and miss a peer time out in their first collective call */
	for (int n = 0; n < started; n++) {
		pthread_join(tids[n], NULL);
		if (!rc)
			rc = nts[n].rc;
	}
	for (int n = 0; n < cfg->nodes; n++)
		ferry_close(fys[n]);
out_free:
	free(fys);
	free(nts);
	free(tids);
	return rc;
}

static int mf_train_procs(const struct mf_config *cfg, const struct mf_plan *p,
			  struct ferry_params *fp, struct mf_result *res)
{
	size_t wbytes = 0, fbytes = 0;
	struct mf_config ccfg = *cfg;
	struct mf_factors cout, *uout = cfg->out;
	struct mf_result *shared;
	float *fshared = NULL;
	pid_t *pids;
	int rc, me;

	pids = calloc((size_t)cfg->nodes, sizeof(*pids));
	if (!pids)
		return -ENOMEM;
	/* rank 0's child writes the figures where the parent can read them */
	shared = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
		      0);
	if (shared == MAP_FAILED) {
		rc = -errno;
		goto out_free;
	}
	memset(shared, 0, sizeof(*shared));
	/* and the factors, for --save */
	if (cfg->out) {
		wbytes = p->rows * cfg->rank * sizeof(float);
		fbytes = wbytes + p->cols * cfg->rank * sizeof(float);
		fshared = mmap(NULL, fbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
			       0);
		if (fshared == MAP_FAILED) {
			rc = -errno;
			fshared = NULL;
			goto out_unmap;
		}
		cout = (struct mf_factors){ .rows = p->rows,
					    .cols = p->cols,
					    .rank = cfg->rank,
					    .w = fshared,
					    .h = (float *)((char *)fshared + wbytes) };
		ccfg.out = &cout;
		cfg = &ccfg;
	}
	fflush(NULL); /* the children must not print the parent's buffers again */
	me = ferry_local_cluster_fork(cfg->nodes, fp, pids);
	if (me < 0) {
		rc = me;
		fprintf(stderr, "ferry-mf: ferry_local_cluster_fork(%d) failed: %s\n", cfg->nodes,
			ferry_strerror(rc));
		goto out_unmap;
	}
	if (me != FERRY_LOCAL_PARENT) {
		struct ferry *fy;

		rc = ferry_open(fp, &fy);
		if (rc) {
			fprintf(stderr, "ferry-mf: node %d: ferry_open failed: %s\n", me,
				ferry_strerror(rc));
		} else {
			rc = mf_node_run(fy, cfg, p, shared);
			ferry_close(fy);
		}
		fflush(NULL);
		_exit(rc ? 1 : 0);
	}
	rc = 0;
	for (int n = 0; n < cfg->nodes; n++) {
		int status;

		while (waitpid(pids[n], &status, 0) < 0) {
			if (errno != EINTR) {
				status = -1;
				break;
			}
		}
		if (status != 0) {
			if (WIFSIGNALED(status))
				fprintf(stderr, "ferry-mf: node %d (pid %d) died of signal %d\n", n,
					(int)pids[n], WTERMSIG(status));
			else
				fprintf(stderr, "ferry-mf: node %d (pid %d) failed\n", n,
					(int)pids[n]);
			if (!rc)
				rc = -FERRY_E_PEER;
		}
	}
	memcpy(res, shared, sizeof(*res));
	if (fshared && !rc) {
		memcpy(uout->w, fshared, wbytes);
		memcpy(uout->h, (char *)fshared + wbytes, fbytes - wbytes);
	}
out_unmap:
	if (fshared)
		munmap(fshared, fbytes);
	munmap(shared, sizeof(*shared));
out_free:
	free(pids);
	return rc;
}

int mf_train(const struct mf_config *cfg, const struct mf_matrix *train,
	     const struct mf_matrix *test, struct mf_result *res)
{
	struct ferry_params fp;
	struct mf_plan plan;
	int rc;

	if (cfg->nodes < 1 || cfg->threads < 1 || cfg->nodes > 1024 || cfg->threads > 1024 ||
	    !cfg->rank || cfg->epochs < 1 || cfg->epochs > MF_MAX_EPOCHS || !train->rows ||
	    !train->cols || train->rows > MF_MAX_DIM || train->cols > MF_MAX_DIM ||
	    test->rows != train->rows || test->cols != train->cols || !(cfg->lr > 0) ||
	    !(cfg->decay > 0) || !(cfg->reg >= 0) || !(cfg->init >= 0) ||
	    !(cfg->time_budget >= 0) || (cfg->start && cfg->start->rank != cfg->rank) ||
	    (cfg->out && (cfg->out->rows != train->rows || cfg->out->cols != train->cols ||
			  cfg->out->rank != cfg->rank)))
		return -EINVAL;
	memset(res, 0, sizeof(*res));
	rc = mf_plan_build(cfg, train, test, &plan);
	if (rc)
		return rc;
	ferry_params_init(&fp);
	fp.transport = cfg->transport;
	if (cfg->procs)
		rc = mf_train_procs(cfg, &plan, &fp, res);
	else
		rc = mf_train_threads(cfg, &plan, &fp, res);
	mf_plan_free(&plan);
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * test_mf.c - ferry-mf's DSGD trainer on a local Ferry cluster.
 *
 * A small synthetic matrix of rank 4 with noise stddev 0.1: whatever the
 * number of nodes, threads or the mode, SGD must bring the test RMSE within
 * 1.5x of the noise in a few epochs. A lost or doubled push, a block handed
 * on too early, or a pull of a stale value shows up as a higher RMSE.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <math.h>

#include "bench/mf/mf.h"

#define NOISE 0.1
#define EPOCHS 6

static struct mf_matrix train, test;

static void make_data(void)
{
	struct mf_synth_params p = { .rows = 2000,
				     .cols = 500,
				     .nnz = 100000,
				     .test_nnz = 5000,
				     .rank = 4,
				     .noise = NOISE,
				     .seed = 2024 };

	cr_assert_eq(mf_synth_generate(&p, &train, &test), 0);
}

static void free_data(void)
{
	mf_matrix_free(&train);
	mf_matrix_free(&test);
}

TestSuite(mf, .init = make_data, .fini = free_data, .timeout = 90);

static void config(struct mf_config *cfg, int nodes, int threads, enum mf_mode mode)
{
	mf_config_init(cfg);
	cfg->nodes = nodes;
	cfg->threads = threads;
	cfg->mode = mode;
	cfg->rank = 8;
	cfg->lr = 0.1;
	cfg->reg = 0.02;
	cfg->epochs = EPOCHS;
	cfg->seed = 7;
}

static void train_and_check(const struct mf_config *cfg, struct mf_result *res)
{
	int rc = mf_train(cfg, &train, &test, res);

	cr_assert_eq(rc, 0, "mf_train: %s", ferry_strerror(rc));
	cr_assert_eq(res->epochs, EPOCHS);
	for (int e = 0; e < res->epochs; e++)
		cr_log_info("%d node(s) x %d thread(s) %s%s: epoch %d %.3f s train loss %.5f test "
			    "RMSE %.5f remote ops %.0f",
			    cfg->nodes, cfg->threads, cfg->mode ? "classic" : "dynamic",
			    cfg->procs ? " (processes)" : "", e + 1, res->ep[e].seconds,
			    res->ep[e].train_mse, res->ep[e].test_rmse, res->ep[e].remote_ops);
	cr_assert(res->ep[0].test_rmse > 3 * NOISE, "the first epoch already fit: %f",
		  res->ep[0].test_rmse);
	cr_assert(res->ep[EPOCHS - 1].test_rmse < 1.5 * NOISE,
		  "test RMSE %f after %d epochs; expected below %f", res->ep[EPOCHS - 1].test_rmse,
		  EPOCHS, 1.5 * NOISE);
	cr_assert(res->ep[EPOCHS - 1].train_mse < res->ep[0].train_mse);
}

static struct mf_result res, res2;

Test(mf, dynamic_one_node_converges)
{
	struct mf_config cfg;

	config(&cfg, 1, 1, MF_MODE_DYNAMIC);
	train_and_check(&cfg, &res);
}

Test(mf, dynamic_four_nodes_converge)
{
	struct mf_config cfg;

	config(&cfg, 4, 1, MF_MODE_DYNAMIC);
	train_and_check(&cfg, &res);
}

Test(mf, dynamic_two_nodes_two_threads_converge)
{
	struct mf_config cfg;

	config(&cfg, 2, 2, MF_MODE_DYNAMIC);
	train_and_check(&cfg, &res);
}

Test(mf, dynamic_two_processes_converge)
{
	struct mf_config cfg;

	config(&cfg, 2, 1, MF_MODE_DYNAMIC);
	cfg.procs = 1;
	train_and_check(&cfg, &res);
}

/* classic converges the same way; dynamic mode keeps the SGD pass local */
Test(mf, classic_converges_and_dynamic_stays_local)
{
	struct mf_config cfg;
	double dyn = 0, cls = 0;

	config(&cfg, 2, 1, MF_MODE_CLASSIC);
	train_and_check(&cfg, &res);
	config(&cfg, 2, 1, MF_MODE_DYNAMIC);
	train_and_check(&cfg, &res2);
	for (int e = 1; e < EPOCHS; e++) {
		cls += res.ep[e].remote_ops;
		dyn += res2.ep[e].remote_ops;
	}
	/* classic: about half of the ~200k key operations per epoch leave the node;
	 * dynamic: only the evaluation's and the figures' */
	cr_assert(cls > 0, "classic mode sent no key operation to another node");
	cr_assert(dyn * 4 < cls, "dynamic mode sent %.0f key operations away, classic %.0f", dyn,
		  cls);
}

Test(mf, rejects_bad_configurations)
{
	struct mf_config cfg;

	config(&cfg, 0, 1, MF_MODE_DYNAMIC);
	cr_assert_eq(mf_train(&cfg, &train, &test, &res), -EINVAL);
	config(&cfg, 1, 1, MF_MODE_DYNAMIC);
	cfg.epochs = MF_MAX_EPOCHS + 1;
	cr_assert_eq(mf_train(&cfg, &train, &test, &res), -EINVAL);
	config(&cfg, 1, 1, MF_MODE_DYNAMIC);
	cfg.rank = 0;
	cr_assert_eq(mf_train(&cfg, &train, &test, &res), -EINVAL);
}

/* SPDX-License-Identifier: MIT */
/*
 * test_mf_data.c - ferry-mf's trainer with real-data features: factors out
 * (--save), factors in (--load), the time budget, the per-epoch figures.
 *
 * The data: tests/data/movielens-tiny/ratings.csv (MovieLens' layout, made
 * by its make.py), held out 10% at random.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "bench/mf/mf.h"

#define FIXTURE FERRY_SOURCE_DIR "/tests/data/movielens-tiny/"

static struct mf_ids users, items;
static struct mf_matrix train, test;

static void load(void)
{
	struct mf_matrix all;
	char err[512];

	cr_assert_eq(mf_ratings_read(FIXTURE "ratings.csv", MF_FORMAT_CSV, &users, &items, 1, &all,
				     NULL, err, sizeof(err)),
		     0, "%s", err);
	cr_assert_eq(mf_split(&all, all.nnz / 10, 3, &train, &test), 0);
}

static void unload(void)
{
	mf_matrix_free(&train);
	mf_matrix_free(&test);
	mf_ids_free(&users);
	mf_ids_free(&items);
}

TestSuite(mf_data, .init = load, .fini = unload, .timeout = 120);

static void config(struct mf_config *cfg, int nodes, int procs, int epochs)
{
	mf_config_init(cfg);
	cfg->nodes = nodes;
	cfg->procs = procs;
	cfg->rank = 4;
	cfg->lr = 0.05;
	cfg->epochs = epochs;
}

static struct mf_result res, res2;

/*
 * The factors --save writes are the ones training ended with: evaluating
 * them here gives the last epoch's test RMSE. Training on from them
 * (--load) starts where the first run ended, far below a fresh start.
 */
static void out_and_start(int nodes, int procs)
{
	struct mf_factors out;
	struct mf_config cfg;
	double sq = 0;
	int rc;

	config(&cfg, nodes, procs, 8);
	cr_assert_eq(mf_factors_alloc(&out, train.rows, train.cols, cfg.rank), 0);
	cfg.out = &out;
	rc = mf_train(&cfg, &train, &test, &res);
	cr_assert_eq(rc, 0, "mf_train: %s", ferry_strerror(rc));
	for (size_t k = 0; k < test.nnz; k++) {
		const struct mf_entry *e = &test.e[k];
		double dot = 0;

		for (uint32_t d = 0; d < cfg.rank; d++)
			dot += (double)out.w[e->i * cfg.rank + d] * out.h[e->j * cfg.rank + d];
		sq += ((double)e->v - dot) * ((double)e->v - dot);
	}
	cr_log_info("%d nodes%s: last epoch's test RMSE %.5f, from the saved factors %.5f", nodes,
		    procs ? " (processes)" : "", res.ep[7].test_rmse, sqrt(sq / test.nnz));
	cr_assert_float_eq(sqrt(sq / test.nnz), res.ep[7].test_rmse, 1e-3,
			   "the factors out are not the trained ones");

	config(&cfg, nodes, procs, 1);
	cfg.start = &out;
	cfg.lr = 0.05 * pow(0.95, 8);
	rc = mf_train(&cfg, &train, &test, &res2);
	cr_assert_eq(rc, 0, "mf_train (continued): %s", ferry_strerror(rc));
	cr_log_info("continued: train loss %.5f (fresh first epoch %.5f, last %.5f)",
		    res2.ep[0].train_mse, res.ep[0].train_mse, res.ep[7].train_mse);
	cr_assert_lt(res2.ep[0].train_mse, 1.1 * res.ep[7].train_mse,
		     "a continued run did not start from the loaded factors");
	cr_assert_lt(res2.ep[0].train_mse, 0.5 * res.ep[0].train_mse);
	mf_factors_free(&out);
}

Test(mf_data, factors_out_are_the_trained_ones_and_training_continues_from_them)
{
	out_and_start(2, 0);
}

Test(mf_data, factors_out_and_in_with_processes)
{
	out_and_start(3, 1);
}

Test(mf_data, a_start_of_another_rank_is_refused)
{
	struct mf_factors st;
	struct mf_config cfg;

	config(&cfg, 1, 0, 1);
	cr_assert_eq(mf_factors_alloc(&st, train.rows, train.cols, cfg.rank + 1), 0);
	cfg.start = &st;
	cr_assert_eq(mf_train(&cfg, &train, &test, &res), -EINVAL);
	cfg.start = NULL;
	cfg.out = &st;
	cr_assert_eq(mf_train(&cfg, &train, &test, &res), -EINVAL);
	mf_factors_free(&st);
}

/*
 * 1000 epochs of a few milliseconds under a 0.3 s budget: training stops
 * early, every node at the same epoch (a disagreement would hang a barrier
 * and time the test out), and the figures add up.
 */
Test(mf_data, the_time_budget_stops_every_node_at_the_same_epoch)
{
	struct mf_config cfg;
	int rc;

	config(&cfg, 3, 0, 1000);
	cfg.threads = 2;
	cfg.time_budget = 0.3;
	rc = mf_train(&cfg, &train, &test, &res);
	cr_assert_eq(rc, 0, "mf_train: %s", ferry_strerror(rc));
	cr_log_info("%d epochs, the last ending at %.3f s", res.epochs,
		    res.ep[res.epochs - 1].elapsed);
	cr_assert_eq(res.budget_stop, 1);
	cr_assert_lt(res.epochs, 1000);
	cr_assert_gt(res.epochs, 1);
	for (int e = 1; e < res.epochs; e++)
		cr_assert_gt(res.ep[e].elapsed, res.ep[e - 1].elapsed);
	/*
	 * An epoch starts only when one as long as the last (or the mean) ends
	 * inside the budget: so the epoch before the last ended inside it, and
	 * the last overshoots by at most its own length (a load spike).
	 */
	cr_assert_leq(res.ep[res.epochs - 2].elapsed, 0.3);

	config(&cfg, 2, 0, 3);
	cfg.time_budget = 1e6;
	cr_assert_eq(mf_train(&cfg, &train, &test, &res), 0);
	cr_assert_eq(res.epochs, 3);
	cr_assert_eq(res.budget_stop, 0);
}

Test(mf_data, every_epoch_reports_bytes_and_rmse)
{
	struct mf_config cfg;
	double two;

	config(&cfg, 2, 0, 3);
	cr_assert_eq(mf_train(&cfg, &train, &test, &res), 0);
	for (int e = 0; e < 3; e++) {
		/* dynamic mode sends the column blocks every subepoch */
		cr_assert_gt(res.ep[e].bytes_sent, train.cols * cfg.rank * sizeof(float) / 2,
			     "epoch %d sent %.0f bytes", e + 1, res.ep[e].bytes_sent);
		cr_assert(isfinite(res.ep[e].test_rmse));
		cr_assert_gt(res.ep[e].elapsed, 0);
	}
	two = res.ep[1].bytes_sent;
	/* one node moves no factors: only its own statistics and barrier frames */
	config(&cfg, 1, 0, 2);
	cr_assert_eq(mf_train(&cfg, &train, &test, &res), 0);
	cr_log_info("bytes sent in epoch 2: %.0f with 2 nodes, %.0f with 1", two,
		    res.ep[1].bytes_sent);
	cr_assert_lt(res.ep[1].bytes_sent, two / 10);
}

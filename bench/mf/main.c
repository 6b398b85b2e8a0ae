/* SPDX-License-Identifier: MIT */
/*
 * main.c - ferry-mf: matrix factorization by DSGD on a local Ferry cluster.
 *
 * Reads a MatrixMarket file or generates a low-rank matrix, trains in
 * dynamic mode (parameter blocking by ferry_localize), classic mode (static
 * placement) or both, and prints a line per epoch and a summary; --json
 * writes the same figures to a file. See docs/mf.md.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bjson.h"
#include "mf.h"

enum {
	MODE_DYNAMIC = 1,
	MODE_CLASSIC = 2,
	MODE_BOTH = 3
};

struct opts {
	struct mf_config cfg;
	int modes;
	const char *input;
	const char *synthetic;
	const char *json;
	long long test_nnz; /* -1: the default, 5% */
	struct mf_synth_params synth;
	/* real data (docs/mf.md, "Data") */
	enum mf_format format;	     /* --format: of --input and --test */
	enum mf_format input_format; /* of --input, as read */
	const char *test_file;	     /* --test FILE */
	double test_frac;	     /* --test-frac; < 0: not given */
	const char *save_dir;
	const char *load_dir;
	int rank_set;		    /* --rank given */
	struct mf_ids users, items; /* raw ids of a rating file (raw_ids) */
	int raw_ids;
	struct mf_factors start; /* --load */
	size_t test_unknown;	 /* test ratings of ids training never saw, left out */
};

static const char *const transport_names[] = {
	[FERRY_TRANSPORT_AUTO] = "auto",
	[FERRY_TRANSPORT_TCP] = "tcp",
	[FERRY_TRANSPORT_RDMA] = "rdma",
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ferry-mf (--synthetic ROWSxCOLS:NNZ[:RANK[:NOISE]] | --input FILE) "
		"[options]\n"
		"\n"
		"Matrix factorization by distributed SGD with parameter blocking (DSGD) on a local\n"
		"Ferry cluster. Prints a line per epoch and a summary.\n"
		"\n"
		"data:\n"
		"  --synthetic SPEC   ROWSxCOLS:NNZ[:RANK[:NOISE]] random low-rank matrix with NNZ\n"
		"                     training entries (true rank 10, noise stddev 0.1 by default)\n"
		"  --input FILE       ratings: MatrixMarket 'coordinate real general', or\n"
		"                     user,item,rating lines (MovieLens ratings.csv, ratings.dat\n"
		"                     with '::', u.data with tabs); raw ids become 0..n-1\n"
		"  --format F         auto (default: by the first line), mm, csv, tsv or dat\n"
		"  --test-nnz N       test entries: generated besides the training ones, or held\n"
		"                     out of the file (default: 5%% of NNZ)\n"
		"  --test-frac F      hold out this fraction of the file's entries instead\n"
		"  --test FILE        read the test entries from FILE (same kind as --input;\n"
		"                     ratings of ids the training data lack are left out)\n"
		"cluster:\n"
		"  --nodes N          Ferry nodes (default 2)\n"
		"  --threads T        worker threads per node (default 1)\n"
		"  --procs            nodes are forked processes (default: threads of this process)\n"
		"  --transport T      tcp, rdma or auto (default auto: rdma when a device is usable)\n"
		"  --mode M           dynamic (localize, default), classic (static placement) or both\n"
		"  --consistency C    seq (default), eventual, ssp:S or essp:S: the factor table's\n"
		"                     model; other than seq, a worker ends each block with\n"
		"                     ferry_clock() instead of a barrier (docs/consistency.md)\n"
		"  --push-codec C     none (default), bf16 or fp16: pushes travel as 16-bit values\n"
		"                     with error feedback; residuals flushed per block\n"
		"                     (docs/compression.md)\n"
		"training:\n"
		"  --rank R           factor rank (default 16)\n"
		"  --lr X             learning rate of the first epoch (default 0.05)\n"
		"  --decay X          learning rate factor per epoch (default 0.95)\n"
		"  --reg X            L2 regularization (default 0.02)\n"
		"  --init X           initial factors uniform in +-X/rank^(1/4) (default 0.5)\n"
		"  --epochs N         epochs (default 10, at most %d)\n"
		"  --seed N           data and initial factors (default 1)\n"
		"  --time-budget SEC  stop when one more epoch would end later than SEC seconds\n"
		"                     after the first one started (default: none)\n"
		"  --load DIR         start from the factors --save wrote (continue training)\n"
		"output:\n"
		"  --json FILE        write the summary and the per-epoch figures as JSON\n"
		"  --save DIR         write the factors after training (docs/mf.md: the format)\n"
		"  --help             this text\n"
		"  --version          Ferry's version\n"
		"\n"
		"examples: ferry-mf --synthetic 100000x10000:2000000 --rank 100 --mode both\n"
		"          ferry-mf --input ml-latest-small/ratings.csv --test-frac 0.1 --save f/\n",
		MF_MAX_EPOCHS);
}

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* a bad command line: the cause, then the usage; Return: the exit status 2 */
static int bad(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "ferry-mf: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n\n");
	usage(stderr);
	return 2;
}

static int parse_ll(const char *s, long long lo, long long hi, long long *v_p)
{
	long long v;
	char *end;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*v_p = v;
	return 0;
}

/* "seq", "eventual", "ssp:S", "essp:S" into @cfg; 0 or -1 */
static int parse_consistency(const char *s, struct mf_config *cfg)
{
	long long v = 0;

	if (!strcmp(s, "seq")) {
		cfg->consistency = FERRY_CONS_SEQUENTIAL;
	} else if (!strcmp(s, "eventual")) {
		cfg->consistency = FERRY_CONS_EVENTUAL;
	} else if (!strncmp(s, "ssp:", 4) && !parse_ll(s + 4, 0, 1000, &v)) {
		cfg->consistency = FERRY_CONS_SSP;
	} else if (!strncmp(s, "essp:", 5) && !parse_ll(s + 5, 0, 1000, &v)) {
		cfg->consistency = FERRY_CONS_ESSP;
	} else {
		return -1;
	}
	cfg->staleness = (uint32_t)v;
	return 0;
}

static int parse_double(const char *s, double lo, double hi, double *v_p)
{
	double v;
	char *end;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi))
		return -EINVAL;
	*v_p = v;
	return 0;
}

/* Return: 0 to run, 1 after --help, 2 for bad options (the message is out). */
static int parse_args(int argc, char **argv, struct opts *o)
{
	enum {
		OPT_NODES = 256,
		OPT_THREADS,
		OPT_RANK,
		OPT_LR,
		OPT_DECAY,
		OPT_REG,
		OPT_INIT,
		OPT_EPOCHS,
		OPT_TRANSPORT,
		OPT_MODE,
		OPT_CONSISTENCY,
		OPT_PUSH_CODEC,
		OPT_SEED,
		OPT_PROCS,
		OPT_INPUT,
		OPT_SYNTHETIC,
		OPT_TEST_NNZ,
		OPT_JSON,
		OPT_FORMAT,
		OPT_TEST,
		OPT_TEST_FRAC,
		OPT_TIME_BUDGET,
		OPT_SAVE,
		OPT_LOAD,
		OPT_HELP,
		OPT_VERSION,
	};
	static const struct option longopts[] = {
		{ "nodes", required_argument, NULL, OPT_NODES },
		{ "threads", required_argument, NULL, OPT_THREADS },
		{ "rank", required_argument, NULL, OPT_RANK },
		{ "lr", required_argument, NULL, OPT_LR },
		{ "decay", required_argument, NULL, OPT_DECAY },
		{ "reg", required_argument, NULL, OPT_REG },
		{ "init", required_argument, NULL, OPT_INIT },
		{ "epochs", required_argument, NULL, OPT_EPOCHS },
		{ "transport", required_argument, NULL, OPT_TRANSPORT },
		{ "mode", required_argument, NULL, OPT_MODE },
		{ "consistency", required_argument, NULL, OPT_CONSISTENCY },
		{ "push-codec", required_argument, NULL, OPT_PUSH_CODEC },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "procs", no_argument, NULL, OPT_PROCS },
		{ "input", required_argument, NULL, OPT_INPUT },
		{ "synthetic", required_argument, NULL, OPT_SYNTHETIC },
		{ "test-nnz", required_argument, NULL, OPT_TEST_NNZ },
		{ "json", required_argument, NULL, OPT_JSON },
		{ "format", required_argument, NULL, OPT_FORMAT },
		{ "test", required_argument, NULL, OPT_TEST },
		{ "test-frac", required_argument, NULL, OPT_TEST_FRAC },
		{ "time-budget", required_argument, NULL, OPT_TIME_BUDGET },
		{ "save", required_argument, NULL, OPT_SAVE },
		{ "load", required_argument, NULL, OPT_LOAD },
		{ "help", no_argument, NULL, OPT_HELP },
		{ "version", no_argument, NULL, OPT_VERSION },
		{ NULL, 0, NULL, 0 },
	};
	struct mf_config *cfg = &o->cfg;
	long long v;
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_NODES:
			if (parse_ll(optarg, 1, 1024, &v))
				return bad("--nodes '%s': expected an integer from 1 to 1024",
					   optarg);
			cfg->nodes = (int)v;
			break;
		case OPT_THREADS:
			if (parse_ll(optarg, 1, 1024, &v))
				return bad("--threads '%s': expected an integer from 1 to 1024",
					   optarg);
			cfg->threads = (int)v;
			break;
		case OPT_RANK:
			if (parse_ll(optarg, 1, 65536, &v))
				return bad("--rank '%s': expected an integer from 1 to 65536",
					   optarg);
			cfg->rank = (uint32_t)v;
			o->rank_set = 1;
			break;
		case OPT_LR:
			if (parse_double(optarg, 1e-12, 1e3, &cfg->lr))
				return bad("--lr '%s': expected a number > 0", optarg);
			break;
		case OPT_DECAY:
			if (parse_double(optarg, 1e-12, 1e3, &cfg->decay))
				return bad("--decay '%s': expected a number > 0 (e.g. 0.95)",
					   optarg);
			break;
		case OPT_REG:
			if (parse_double(optarg, 0, 1e6, &cfg->reg))
				return bad("--reg '%s': expected a number >= 0", optarg);
			break;
		case OPT_INIT:
			if (parse_double(optarg, 0, 1e6, &cfg->init))
				return bad("--init '%s': expected a number >= 0", optarg);
			break;
		case OPT_EPOCHS:
			if (parse_ll(optarg, 1, MF_MAX_EPOCHS, &v))
				return bad("--epochs '%s': expected an integer from 1 to 1000",
					   optarg);
			cfg->epochs = (int)v;
			break;
		case OPT_TRANSPORT:
			if (!strcmp(optarg, "tcp"))
				cfg->transport = FERRY_TRANSPORT_TCP;
			else if (!strcmp(optarg, "rdma"))
				cfg->transport = FERRY_TRANSPORT_RDMA;
			else if (!strcmp(optarg, "auto"))
				cfg->transport = FERRY_TRANSPORT_AUTO;
			else
				return bad("--transport '%s': expected tcp, rdma or auto", optarg);
			break;
		case OPT_MODE:
			if (!strcmp(optarg, "dynamic"))
				o->modes = MODE_DYNAMIC;
			else if (!strcmp(optarg, "classic"))
				o->modes = MODE_CLASSIC;
			else if (!strcmp(optarg, "both"))
				o->modes = MODE_BOTH;
			else
				return bad("--mode '%s': expected dynamic, classic or both",
					   optarg);
			break;
		case OPT_CONSISTENCY:
			if (parse_consistency(optarg, cfg))
				return bad("--consistency '%s': expected seq, eventual, ssp:S or "
					   "essp:S (S: the staleness bound in clocks, 0 .. 1000)",
					   optarg);
			break;
		case OPT_PUSH_CODEC:
			if (!strcmp(optarg, "none"))
				cfg->push_codec = FERRY_CODEC_NONE;
			else if (!strcmp(optarg, "bf16"))
				cfg->push_codec = FERRY_CODEC_BF16;
			else if (!strcmp(optarg, "fp16"))
				cfg->push_codec = FERRY_CODEC_FP16;
			else
				return bad("--push-codec '%s': expected none, bf16 or fp16",
					   optarg);
			break;
		case OPT_SEED:
			if (parse_ll(optarg, 0, LLONG_MAX, &v))
				return bad("--seed '%s': expected an integer >= 0", optarg);
			cfg->seed = (uint64_t)v;
			break;
		case OPT_PROCS:
			cfg->procs = 1;
			break;
		case OPT_INPUT:
			o->input = optarg;
			break;
		case OPT_SYNTHETIC:
			o->synthetic = optarg;
			break;
		case OPT_TEST_NNZ:
			if (parse_ll(optarg, 0, LLONG_MAX, &o->test_nnz))
				return bad("--test-nnz '%s': expected an integer >= 0", optarg);
			break;
		case OPT_JSON:
			o->json = optarg;
			break;
		case OPT_FORMAT:
			if (mf_format_parse(optarg, &o->format))
				return bad("--format '%s': expected auto, mm, csv, tsv or dat",
					   optarg);
			break;
		case OPT_TEST:
			o->test_file = optarg;
			break;
		case OPT_TEST_FRAC:
			if (parse_double(optarg, 0, 0.99, &o->test_frac))
				return bad("--test-frac '%s': expected a number from 0 to 0.99",
					   optarg);
			break;
		case OPT_TIME_BUDGET:
			if (parse_double(optarg, 1e-3, 1e9, &cfg->time_budget))
				return bad("--time-budget '%s': expected seconds > 0", optarg);
			break;
		case OPT_SAVE:
			o->save_dir = optarg;
			break;
		case OPT_LOAD:
			o->load_dir = optarg;
			break;
		case OPT_HELP:
			usage(stdout);
			return 1;
		case OPT_VERSION:
			printf("ferry-mf (Ferry %s)\n", ferry_version());
			return 1;
		default:
			if (optopt >= OPT_NODES)
				return bad("option '%s' needs a value", argv[optind - 1]);
			return bad("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return bad("unexpected argument '%s'", argv[optind]);
	if (!o->input == !o->synthetic)
		return bad("%s", o->input ?
					 "give either --input or --synthetic, not both" :
					 "no data: give --synthetic ROWSxCOLS:NNZ or --input FILE");
	if ((o->test_file != NULL) + (o->test_nnz >= 0) + (o->test_frac >= 0) > 1)
		return bad("give one of --test, --test-nnz and --test-frac");
	if (o->synthetic && (o->test_file || o->test_frac >= 0))
		return bad("--test and --test-frac go with --input; --synthetic generates "
			   "--test-nnz test entries");
	if (o->save_dir && o->modes == MODE_BOTH)
		return bad("--save keeps one run's factors: give --mode dynamic or classic");
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --load: the factors and, for a rating file, the ids they belong to */
static int load_start(struct opts *o)
{
	char err[512];
	int rc;

	rc = mf_factors_load(o->load_dir, &o->start, &o->users, &o->items, &o->raw_ids, err,
			     sizeof(err));
	if (rc) {
		fprintf(stderr, "ferry-mf: --load: %s\n", err);
		return rc;
	}
	if (o->rank_set && o->cfg.rank != o->start.rank) {
		fprintf(stderr,
			"ferry-mf: --load %s holds factors of rank %u, --rank asks for %u; leave "
			"--rank out to continue at rank %u\n",
			o->load_dir, o->start.rank, o->cfg.rank, o->start.rank);
		return -EINVAL;
	}
	o->cfg.rank = o->start.rank;
	o->cfg.start = &o->start;
	printf("load: %s: %" PRIu64 " x %" PRIu64 " factors of rank %u (%s ids)\n", o->load_dir,
	       o->start.rows, o->start.cols, o->start.rank, o->raw_ids ? "raw" : "index");
	return 0;
}

/* one file of --input or --test: MatrixMarket, or ratings through the id maps */
static int read_file(struct opts *o, const char *path, int add, struct mf_matrix *m_p,
		     enum mf_format *fmt_p)
{
	enum mf_format fmt = o->format;
	char err[512];
	int rc;

	if (fmt == MF_FORMAT_AUTO) {
		rc = mf_format_detect(path, &fmt, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "ferry-mf: %s\n", err);
			return rc;
		}
	}
	if (fmt == MF_FORMAT_MM)
		rc = mf_mmio_read(path, m_p, err, sizeof(err));
	else
		rc = mf_ratings_read(path, fmt, &o->users, &o->items, add, m_p,
				     add ? NULL : &o->test_unknown, err, sizeof(err));
	if (rc)
		fprintf(stderr, "ferry-mf: %s\n", err);
	*fmt_p = fmt;
	return rc;
}

/* the data of --input, with its test part (--test FILE, or held out) */
static int load_file(struct opts *o, struct mf_matrix *train, struct mf_matrix *test)
{
	enum mf_format fmt, tfmt;
	struct mf_matrix all;
	size_t ntest;
	int rc;

	rc = read_file(o, o->input, 1, &all, &fmt);
	if (rc)
		return rc;
	o->input_format = fmt;
	if (o->load_dir && o->raw_ids != (fmt != MF_FORMAT_MM)) {
		fprintf(stderr,
			"ferry-mf: --load %s holds factors of a %s; --input %s is a %s: load "
			"factors saved from the same kind of file\n",
			o->load_dir, o->raw_ids ? "rating file (raw ids)" : "MatrixMarket file",
			o->input, fmt == MF_FORMAT_MM ? "MatrixMarket file" : "rating file");
		rc = -EINVAL;
		goto err_free;
	}
	if (fmt == MF_FORMAT_MM && o->load_dir &&
	    (o->start.rows > all.rows || o->start.cols > all.cols)) {
		fprintf(stderr,
			"ferry-mf: --load %s holds %" PRIu64 " x %" PRIu64 " factors, more than "
			"%s's %" PRIu64 " x %" PRIu64 "\n",
			o->load_dir, o->start.rows, o->start.cols, o->input, all.rows, all.cols);
		rc = -EINVAL;
		goto err_free;
	}
	o->raw_ids = fmt != MF_FORMAT_MM;
	if (o->test_file) {
		/* with --format auto, the test file's layout may differ (ratings.dat, test.csv) */
		rc = read_file(o, o->test_file, 0, test, &tfmt);
		if (rc)
			goto err_free;
		if ((tfmt == MF_FORMAT_MM) != (fmt == MF_FORMAT_MM)) {
			fprintf(stderr,
				"ferry-mf: --test %s and --input %s must both be "
				"MatrixMarket files or both rating files\n",
				o->test_file, o->input);
			rc = -EINVAL;
			goto err_free_test;
		}
		if (test->rows > all.rows || test->cols > all.cols) {
			fprintf(stderr,
				"ferry-mf: --test %s is %" PRIu64 " x %" PRIu64 ", larger than "
				"--input %s (%" PRIu64 " x %" PRIu64 ")\n",
				o->test_file, test->rows, test->cols, o->input, all.rows, all.cols);
			rc = -EINVAL;
			goto err_free_test;
		}
		test->rows = all.rows;
		test->cols = all.cols;
		*train = all;
		if (o->test_unknown)
			printf("data: %zu ratings of --test %s name a user or item the training "
			       "data lack: left out\n",
			       o->test_unknown, o->test_file);
		return 0;
	}
	if (o->test_frac >= 0)
		ntest = (size_t)llround(o->test_frac * (double)all.nnz);
	else
		ntest = o->test_nnz >= 0 ? (size_t)o->test_nnz : all.nnz / 20;
	if (ntest >= all.nnz) {
		fprintf(stderr,
			"ferry-mf: holding out %zu test entries leaves no training entries: "
			"%s has %zu\n",
			ntest, o->input, all.nnz);
		rc = -EINVAL;
		goto err_free;
	}
	rc = mf_split(&all, ntest, o->cfg.seed, train, test);
	if (rc) {
		fprintf(stderr, "ferry-mf: splitting %s failed: %s\n", o->input, strerror(-rc));
		goto err_free;
	}
	return 0;

err_free_test:
	mf_matrix_free(test);
err_free:
	mf_matrix_free(&all);
	return rc;
}

static int load_data(struct opts *o, struct mf_matrix *train, struct mf_matrix *test)
{
	double t0 = now_s();
	int rc;

	if (o->load_dir) {
		rc = load_start(o);
		if (rc)
			return rc;
	}
	if (o->synthetic) {
		if (o->load_dir && o->raw_ids) {
			fprintf(stderr,
				"ferry-mf: --load %s holds factors of a rating file (raw "
				"ids); --synthetic has none\n",
				o->load_dir);
			return -EINVAL;
		}
		o->synth.seed = o->cfg.seed;
		o->synth.test_nnz = o->test_nnz >= 0 ? (size_t)o->test_nnz : o->synth.nnz / 20;
		rc = mf_synth_generate(&o->synth, train, test);
		if (rc) {
			fprintf(stderr, "ferry-mf: generating the synthetic matrix failed: %s\n",
				strerror(-rc));
			return rc;
		}
		printf("data: synthetic %" PRIu64 " x %" PRIu64 ", true rank %u, noise %g: "
		       "%zu training and %zu test entries (%.2f s)\n",
		       train->rows, train->cols, o->synth.rank, o->synth.noise, train->nnz,
		       test->nnz, now_s() - t0);
		return 0;
	}
	rc = load_file(o, train, test);
	if (rc)
		return rc;
	printf("data: %s, %" PRIu64 " %s x %" PRIu64 " %s: %zu training and %zu test entries "
	       "(%.2f s)\n",
	       o->input, train->rows, o->raw_ids ? "users" : "rows", train->cols,
	       o->raw_ids ? "items" : "columns", train->nnz, test->nnz, now_s() - t0);
	return 0;
}

static const char *const cons_names[] = { "seq", "eventual", "ssp", "essp" };
static const char *const codec_names[] = { "none", "bf16", "fp16" };

static json_t *json_run(const struct mf_result *r)
{
	const struct mf_epoch *last = r->epochs ? &r->ep[r->epochs - 1] : NULL;
	json_t *run = json_object(), *eps = json_array();

	if (!run || !eps) {
		json_decref(run);
		json_decref(eps);
		return NULL;
	}
	bjson_set_num(run, "mean_epoch_seconds", mf_mean_epoch_seconds(r));
	bjson_set_num(run, "setup_seconds", r->setup_seconds);
	bjson_set_num(run, "final_test_rmse", last ? last->test_rmse : NAN);
	bjson_set_num(run, "final_train_loss", last ? last->train_mse : NAN);
	bjson_set_bool(run, "stopped_by_time_budget", r->budget_stop);
	bjson_set(run, "epochs", eps);
	for (int e = 0; e < r->epochs; e++) {
		const struct mf_epoch *ep = &r->ep[e];
		json_t *o = json_object();

		if (bjson_append(eps, o))
			break;
		bjson_set_int(o, "epoch", e + 1);
		bjson_set_num(o, "seconds", ep->seconds);
		bjson_set_num(o, "comm_share", ep->comm_share);
		bjson_set_num(o, "localize_share", ep->reloc_share);
		bjson_set_num(o, "wait_share", ep->wait_share);
		bjson_set_num(o, "train_loss", ep->train_mse);
		bjson_set_num(o, "train_rmse", sqrt(ep->train_mse));
		bjson_set_num(o, "test_rmse", ep->test_rmse);
		bjson_set_num(o, "elapsed_seconds", ep->elapsed);
		bjson_set_num(o, "bytes_sent", ep->bytes_sent);
		bjson_set_num(o, "lr", ep->lr);
		bjson_set_num(o, "local_ops", ep->local_ops);
		bjson_set_num(o, "remote_ops", ep->remote_ops);
	}
	{
		double hits = 0, misses = 0, stale[FERRY_STALENESS_BUCKETS] = { 0 };
		json_t *js = json_array();

		for (int e = 0; e < r->epochs; e++) {
			hits += r->ep[e].copy_hits;
			misses += r->ep[e].copy_misses;
			for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++)
				stale[b] += r->ep[e].stale[b];
		}
		/* null: no read went through a consistency model's copies */
		bjson_set(run, "copy_hit_share",
			  bjson_opt(hits + misses > 0,
				    hits + misses > 0 ? hits / (hits + misses) : 0));
		/* reads by clocks behind (SSP, ESSP), the last bucket and beyond */
		bjson_set(run, "staleness", js);
		for (int b = 0; js && b < FERRY_STALENESS_BUCKETS; b++)
			bjson_append(js, bjson_num(stale[b]));
	}
	return run;
}

static int write_json(const struct opts *o, const struct mf_matrix *train,
		      const struct mf_matrix *test, const struct mf_result *res)
{
	const struct mf_config *cfg = &o->cfg;
	json_t *root = json_object(), *runs = json_object();
	int rc;

	if (!root || !runs) {
		json_decref(root);
		json_decref(runs);
		fprintf(stderr, "ferry-mf: cannot write --json %s: out of memory\n", o->json);
		return -ENOMEM;
	}
	bjson_set_str(root, "program", "ferry-mf");
	bjson_set_str(root, "ferry_version", ferry_version());
	bjson_set_str(root, "data", o->input ? o->input : o->synthetic);
	bjson_set_str(root, "format", o->input ? mf_format_name(o->input_format) : "synthetic");
	bjson_set_str(root, "test", o->test_file ? o->test_file : "held out");
	bjson_set_int(root, "test_left_out", (int64_t)o->test_unknown);
	bjson_set(root, "time_budget", bjson_opt(o->cfg.time_budget > 0, o->cfg.time_budget));
	bjson_set_str(root, "load", o->load_dir);
	bjson_set_str(root, "save", o->save_dir);
	bjson_set_int(root, "rows", (int64_t)train->rows);
	bjson_set_int(root, "cols", (int64_t)train->cols);
	bjson_set_int(root, "train_nnz", (int64_t)train->nnz);
	bjson_set_int(root, "test_nnz", (int64_t)test->nnz);
	bjson_set_int(root, "nodes", cfg->nodes);
	bjson_set_int(root, "threads", cfg->threads);
	bjson_set_bool(root, "procs", cfg->procs);
	bjson_set_str(root, "transport", transport_names[cfg->transport]);
	bjson_set_int(root, "rank", cfg->rank);
	bjson_set_int(root, "epochs", cfg->epochs);
	bjson_set_int(root, "seed", (int64_t)cfg->seed);
	bjson_set_num(root, "lr", cfg->lr);
	bjson_set_num(root, "decay", cfg->decay);
	bjson_set_num(root, "reg", cfg->reg);
	bjson_set_num(root, "init", cfg->init);
	bjson_set(root, "runs", runs);
	bjson_set_str(root, "consistency", cons_names[cfg->consistency]);
	bjson_set_int(root, "staleness", cfg->staleness);
	bjson_set_str(root, "push_codec", codec_names[cfg->push_codec]);
	if (o->modes & MODE_DYNAMIC)
		bjson_set(runs, "dynamic", json_run(&res[0]));
	if (o->modes & MODE_CLASSIC)
		bjson_set(runs, "classic", json_run(&res[1]));
	if (o->modes == MODE_BOTH) {
		double d = mf_mean_epoch_seconds(&res[0]), c = mf_mean_epoch_seconds(&res[1]);

		bjson_set_num(root, "speedup", d > 0 ? c / d : NAN);
	}
	rc = bjson_write(root, o->json, "ferry-mf");
	json_decref(root);
	return rc;
}

static void summary(const char *mode, const struct mf_result *r)
{
	const struct mf_epoch *last = &r->ep[r->epochs - 1];
	double comm = 0;

	for (int e = 0; e < r->epochs; e++)
		comm += r->ep[e].comm_share + r->ep[e].wait_share;
	printf("%s: %d epochs%s, mean %.3f s per epoch, comm+wait %.1f%%, setup %.2f s, "
	       "final train loss %.5f, test RMSE %.5f\n",
	       mode, r->epochs, r->budget_stop ? " (the time budget's)" : "",
	       mf_mean_epoch_seconds(r), 100 * comm / r->epochs, r->setup_seconds, last->train_mse,
	       last->test_rmse);
	{
		double stale[FERRY_STALENESS_BUCKETS] = { 0 }, n = 0;

		for (int e = 0; e < r->epochs; e++)
			for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++)
				stale[b] += r->ep[e].stale[b];
		for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++)
			n += stale[b];
		double hits = 0, misses = 0;

		for (int e = 0; e < r->epochs; e++) {
			hits += r->ep[e].copy_hits;
			misses += r->ep[e].copy_misses;
		}
		if (hits + misses > 0)
			printf("%s: reads served from the node's copy: %.1f%% of %.0f\n", mode,
			       100 * hits / (hits + misses), hits + misses);
		if (n > 0) {
			printf("%s: reads by staleness (clocks behind: share):", mode);
			for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++)
				if (stale[b] > 0)
					printf(" %d%s: %.3f", b,
					       b == FERRY_STALENESS_BUCKETS - 1 ? "+" : "",
					       stale[b] / n);
			printf("\n");
		}
	}
}

/* --save: the factors of run @r, with the ids they belong to */
static int save_factors(struct opts *o, struct mf_factors *fx, const struct mf_result *r)
{
	const struct mf_epoch *last = &r->ep[r->epochs - 1];
	json_t *tr = json_object();
	char err[512];
	int rc;

	bjson_set_str(tr, "data", o->input ? o->input : o->synthetic);
	bjson_set_str(tr, "mode", o->cfg.mode == MF_MODE_CLASSIC ? "classic" : "dynamic");
	bjson_set_int(tr, "epochs", r->epochs);
	bjson_set_str(tr, "loaded_from", o->load_dir);
	bjson_set_num(tr, "final_train_loss", last->train_mse);
	bjson_set_num(tr, "final_test_rmse", last->test_rmse);
	bjson_set_num(tr, "lr_next_epoch", last->lr * o->cfg.decay);
	rc = mf_factors_save(o->save_dir, fx, o->raw_ids ? &o->users : NULL,
			     o->raw_ids ? &o->items : NULL, tr, err, sizeof(err));
	json_decref(tr);
	if (rc)
		fprintf(stderr, "ferry-mf: --save: %s\n", err);
	else
		printf("save: %s: %" PRIu64 " x %" PRIu64 " factors of rank %u\n", o->save_dir,
		       fx->rows, fx->cols, fx->rank);
	return rc;
}

int main(int argc, char **argv)
{
	static struct mf_result res[2]; /* dynamic, classic */
	struct mf_matrix train = { 0 }, test = { 0 };
	struct opts o = { .modes = MODE_DYNAMIC, .test_nnz = -1, .test_frac = -1 };
	struct mf_factors out = { 0 };
	int rc;

	mf_config_init(&o.cfg);
	o.synth = (struct mf_synth_params){ .rank = 10, .noise = 0.1 };
	rc = parse_args(argc, argv, &o);
	if (rc)
		return rc == 1 ? 0 : 2;
	if (o.synthetic) {
		char err[512];

		if (mf_synth_parse(o.synthetic, &o.synth, err, sizeof(err)))
			return bad("--synthetic: %s", err);
	}
	rc = load_data(&o, &train, &test);
	if (rc)
		goto out;
	if (o.save_dir) {
		rc = mf_factors_alloc(&out, train.rows, train.cols, o.cfg.rank);
		if (rc) {
			fprintf(stderr, "ferry-mf: --save: no memory for the factors: %s\n",
				strerror(-rc));
			goto out;
		}
		o.cfg.out = &out;
	}

	o.cfg.progress = stdout;
	for (int m = 0; m < 2; m++) {
		const char *name = m ? "classic" : "dynamic";
		char tag[32];

		if (!(o.modes & (1 << m)))
			continue;
		o.cfg.mode = m ? MF_MODE_CLASSIC : MF_MODE_DYNAMIC;
		snprintf(tag, sizeof(tag), "[%s]", name);
		o.cfg.tag = tag;
		printf("%s %d node%s x %d thread%s (%s), transport %s, rank %u, lr %g, decay %g, "
		       "reg %g, %d epochs\n",
		       tag, o.cfg.nodes, o.cfg.nodes > 1 ? "s" : "", o.cfg.threads,
		       o.cfg.threads > 1 ? "s" : "", o.cfg.procs ? "processes" : "threads",
		       transport_names[o.cfg.transport], o.cfg.rank, o.cfg.lr, o.cfg.decay,
		       o.cfg.reg, o.cfg.epochs);
		fflush(stdout);
		rc = mf_train(&o.cfg, &train, &test, &res[m]);
		if (rc) {
			fprintf(stderr, "ferry-mf: %s training failed: %s\n", name,
				ferry_strerror(rc));
			goto out;
		}
		summary(name, &res[m]);
		if (o.save_dir) {
			rc = save_factors(&o, &out, &res[m]);
			if (rc)
				goto out;
		}
	}
	if (o.modes == MODE_BOTH) {
		double d = mf_mean_epoch_seconds(&res[0]), c = mf_mean_epoch_seconds(&res[1]);

		printf("epoch time: dynamic %.3f s, classic %.3f s: dynamic is %.2fx faster\n", d,
		       c, d > 0 ? c / d : NAN);
	}
	if (o.json)
		rc = write_json(&o, &train, &test, res);
out:
	mf_matrix_free(&train);
	mf_matrix_free(&test);
	mf_factors_free(&out);
	mf_factors_free(&o.start);
	mf_ids_free(&o.users);
	mf_ids_free(&o.items);
	return rc ? 1 : 0;
}

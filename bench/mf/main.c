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
};

static const char *const transport_names[] = {
	[FERRY_TRANSPORT_AUTO] = "auto",
	[FERRY_TRANSPORT_TCP] = "tcp",
	[FERRY_TRANSPORT_RDMA] = "rdma",
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ferry-mf (--synthetic ROWSxCOLS:NNZ[:RANK[:NOISE]] | --input FILE.mtx) "
		"[options]\n"
		"\n"
		"Matrix factorization by distributed SGD with parameter blocking (DSGD) on a local\n"
		"Ferry cluster. Prints a line per epoch and a summary.\n"
		"\n"
		"data:\n"
		"  --synthetic SPEC   ROWSxCOLS:NNZ[:RANK[:NOISE]] random low-rank matrix with NNZ\n"
		"                     training entries (true rank 10, noise stddev 0.1 by default)\n"
		"  --input FILE       MatrixMarket 'coordinate real general' file\n"
		"  --test-nnz N       test entries: generated besides the training ones, or held\n"
		"                     out of the file (default: 5%% of NNZ)\n"
		"cluster:\n"
		"  --nodes N          Ferry nodes (default 2)\n"
		"  --threads T        worker threads per node (default 1)\n"
		"  --procs            nodes are forked processes (default: threads of this process)\n"
		"  --transport T      tcp, rdma or auto (default auto: rdma when a device is usable)\n"
		"  --mode M           dynamic (localize, default), classic (static placement) or both\n"
		"training:\n"
		"  --rank R           factor rank (default 16)\n"
		"  --lr X             learning rate of the first epoch (default 0.05)\n"
		"  --decay X          learning rate factor per epoch (default 0.95)\n"
		"  --reg X            L2 regularization (default 0.02)\n"
		"  --init X           initial factors uniform in +-X/rank^(1/4) (default 0.5)\n"
		"  --epochs N         epochs (default 10, at most %d)\n"
		"  --seed N           data and initial factors (default 1)\n"
		"output:\n"
		"  --json FILE        write the summary and the per-epoch figures as JSON\n"
		"  --help             this text\n"
		"  --version          Ferry's version\n"
		"\n"
		"example: ferry-mf --synthetic 100000x10000:2000000 --rank 100 --mode both\n",
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
		OPT_SEED,
		OPT_PROCS,
		OPT_INPUT,
		OPT_SYNTHETIC,
		OPT_TEST_NNZ,
		OPT_JSON,
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
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "procs", no_argument, NULL, OPT_PROCS },
		{ "input", required_argument, NULL, OPT_INPUT },
		{ "synthetic", required_argument, NULL, OPT_SYNTHETIC },
		{ "test-nnz", required_argument, NULL, OPT_TEST_NNZ },
		{ "json", required_argument, NULL, OPT_JSON },
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
		return bad("%s",
			   o->input ?
				   "give either --input or --synthetic, not both" :
				   "no data: give --synthetic ROWSxCOLS:NNZ or --input FILE.mtx");
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int load_data(struct opts *o, struct mf_matrix *train, struct mf_matrix *test)
{
	double t0 = now_s();
	char err[512];
	int rc;

	if (o->synthetic) {
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
	} else {
		struct mf_matrix all;
		size_t ntest;

		rc = mf_mmio_read(o->input, &all, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "ferry-mf: %s\n", err);
			return rc;
		}
		ntest = o->test_nnz >= 0 ? (size_t)o->test_nnz : all.nnz / 20;
		if (ntest >= all.nnz) {
			fprintf(stderr,
				"ferry-mf: --test-nnz %zu leaves no training entries: %s has %zu\n",
				ntest, o->input, all.nnz);
			mf_matrix_free(&all);
			return -EINVAL;
		}
		rc = mf_split(&all, ntest, o->cfg.seed, train, test);
		if (rc) {
			fprintf(stderr, "ferry-mf: splitting %s failed: %s\n", o->input,
				strerror(-rc));
			mf_matrix_free(&all);
			return rc;
		}
		printf("data: %s, %" PRIu64 " x %" PRIu64 ": %zu training and %zu test entries "
		       "(%.2f s)\n",
		       o->input, train->rows, train->cols, train->nnz, test->nnz, now_s() - t0);
	}
	return 0;
}

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
		bjson_set_num(o, "test_rmse", ep->test_rmse);
		bjson_set_num(o, "lr", ep->lr);
		bjson_set_num(o, "local_ops", ep->local_ops);
		bjson_set_num(o, "remote_ops", ep->remote_ops);
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
	printf("%s: %d epochs, mean %.3f s per epoch, comm+wait %.1f%%, setup %.2f s, "
	       "final train loss %.5f, test RMSE %.5f\n",
	       mode, r->epochs, mf_mean_epoch_seconds(r), 100 * comm / r->epochs, r->setup_seconds,
	       last->train_mse, last->test_rmse);
}

int main(int argc, char **argv)
{
	static struct mf_result res[2]; /* dynamic, classic */
	struct mf_matrix train = { 0 }, test = { 0 };
	struct opts o = { .modes = MODE_DYNAMIC, .test_nnz = -1 };
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
	if (load_data(&o, &train, &test))
		return 1;

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
	return rc ? 1 : 0;
}

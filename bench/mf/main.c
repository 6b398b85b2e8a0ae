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
		"  --consistency C    seq (default), eventual, ssp:S or essp:S: the factor table's\n"
		"                     model; other than seq, a worker ends each block with\n"
		"                     ferry_clock() instead of a barrier (docs/consistency.md)\n"
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
		{ "consistency", required_argument, NULL, OPT_CONSISTENCY },
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
		case OPT_CONSISTENCY:
			if (parse_consistency(optarg, cfg))
				return bad("--consistency '%s': expected seq, eventual, ssp:S or "
					   "essp:S (S: the staleness bound in clocks, 0 .. 1000)",
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

static void json_num(FILE *f, const char *name, double v, const char *sep)
{
	if (isfinite(v))
		fprintf(f, "\"%s\": %.6g%s", name, v, sep);
	else
		fprintf(f, "\"%s\": null%s", name, sep);
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static const char *const cons_names[] = { "seq", "eventual", "ssp", "essp" };

static void json_run(FILE *f, const char *mode, const struct mf_result *r)
{
	const struct mf_epoch *last = r->epochs ? &r->ep[r->epochs - 1] : NULL;
	double stale[FERRY_STALENESS_BUCKETS] = { 0 };

	fprintf(f, "    \"%s\": {\n      ", mode);
	json_num(f, "mean_epoch_seconds", mf_mean_epoch_seconds(r), ", ");
	json_num(f, "setup_seconds", r->setup_seconds, ", ");
	json_num(f, "final_test_rmse", last ? last->test_rmse : NAN, ", ");
	json_num(f, "final_train_loss", last ? last->train_mse : NAN, ",\n");
	fprintf(f, "      \"epochs\": [\n");
	for (int e = 0; e < r->epochs; e++) {
		const struct mf_epoch *ep = &r->ep[e];

		fprintf(f, "        { \"epoch\": %d, ", e + 1);
		json_num(f, "seconds", ep->seconds, ", ");
		json_num(f, "comm_share", ep->comm_share, ", ");
		json_num(f, "localize_share", ep->reloc_share, ", ");
		json_num(f, "wait_share", ep->wait_share, ", ");
		json_num(f, "train_loss", ep->train_mse, ", ");
		json_num(f, "test_rmse", ep->test_rmse, ", ");
		json_num(f, "lr", ep->lr, ", ");
		json_num(f, "local_ops", ep->local_ops, ", ");
		json_num(f, "remote_ops", ep->remote_ops, " }");
		fprintf(f, "%s\n", e + 1 < r->epochs ? "," : "");
	}
	{
		double hits = 0, misses = 0;

		for (int e = 0; e < r->epochs; e++) {
			hits += r->ep[e].copy_hits;
			misses += r->ep[e].copy_misses;
		}
		fprintf(f, "      ],\n      ");
		json_num(f, "copy_hit_share", hits + misses > 0 ? hits / (hits + misses) : NAN,
			 ",\n");
	}
	fprintf(f, "      \"staleness\": [");
	for (int e = 0; e < r->epochs; e++)
		for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++)
			stale[b] += r->ep[e].stale[b];
	for (int b = 0; b < FERRY_STALENESS_BUCKETS; b++)
		fprintf(f, "%.0f%s", stale[b], b + 1 < FERRY_STALENESS_BUCKETS ? ", " : "");
	fprintf(f, "]\n    }");
}

static int write_json(const struct opts *o, const struct mf_matrix *train,
		      const struct mf_matrix *test, const struct mf_result *res)
{
	const struct mf_config *cfg = &o->cfg;
	FILE *f = fopen(o->json, "w");
	int rc = 0;

	if (!f) {
		rc = -errno;
		fprintf(stderr, "ferry-mf: cannot write --json %s: %s\n", o->json, strerror(-rc));
		return rc;
	}
	fprintf(f, "{\n  \"program\": \"ferry-mf\",\n  \"ferry_version\": ");
	json_str(f, ferry_version());
	fprintf(f, ",\n  \"data\": ");
	json_str(f, o->input ? o->input : o->synthetic);
	fprintf(f,
		",\n  \"rows\": %" PRIu64 ", \"cols\": %" PRIu64
		", \"train_nnz\": %zu, \"test_nnz\": %zu,\n",
		train->rows, train->cols, train->nnz, test->nnz);
	fprintf(f, "  \"nodes\": %d, \"threads\": %d, \"procs\": %s, \"transport\": \"%s\",\n",
		cfg->nodes, cfg->threads, cfg->procs ? "true" : "false",
		transport_names[cfg->transport]);
	fprintf(f, "  \"rank\": %u, \"epochs\": %d, \"seed\": %" PRIu64 ",\n  ", cfg->rank,
		cfg->epochs, cfg->seed);
	json_num(f, "lr", cfg->lr, ", ");
	json_num(f, "decay", cfg->decay, ", ");
	json_num(f, "reg", cfg->reg, ", ");
	json_num(f, "init", cfg->init, ",\n");
	fprintf(f, "  \"consistency\": \"%s\", \"staleness\": %u,\n", cons_names[cfg->consistency],
		cfg->staleness);
	fprintf(f, "  \"runs\": {\n");
	if (o->modes & MODE_DYNAMIC)
		json_run(f, "dynamic", &res[0]);
	if (o->modes == MODE_BOTH)
		fprintf(f, ",\n");
	if (o->modes & MODE_CLASSIC)
		json_run(f, "classic", &res[1]);
	fprintf(f, "\n  }");
	if (o->modes == MODE_BOTH) {
		double d = mf_mean_epoch_seconds(&res[0]), c = mf_mean_epoch_seconds(&res[1]);

		fprintf(f, ",\n  ");
		json_num(f, "speedup", d > 0 ? c / d : NAN, "");
	}
	fprintf(f, "\n}\n");
	if (ferror(f))
		rc = -EIO;
	if (fclose(f) && !rc)
		rc = -errno;
	if (rc)
		fprintf(stderr, "ferry-mf: writing --json %s failed: %s\n", o->json, strerror(-rc));
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

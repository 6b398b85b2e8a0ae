/* SPDX-License-Identifier: MIT */
/*
 * ferry-bench - Ferry's benchmark suite, each figure beside a baseline taken
 * in the same run: the options, and the scenarios' run (report.c prints the
 * context, the table and writes the JSON file). The scenarios are in local.c, remote.c and localize.c; fb.h says how they
 * run on threads, processes or an externally launched cluster.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fb.h"
#include "fb_git.h"

static const char usage_text[] =
	"usage: ferry-bench [options]\n"
	"\n"
	"Scenarios and what they run on:\n"
	"  -s, --scenario LIST     local,remote,localize or all (default all);\n"
	"                          localize = move,batch-localize,hot-key;\n"
	"                          memory (not in all): 4 processes, bytes per node\n"
	"                          against the bytes of values each holds\n"
	"                          replicas (not in all): push with replicas = 1\n"
	"                          and 2 against 0, same run; failover (not in\n"
	"                          all): 20 SIGKILLs and SIGSTOPs, time to the\n"
	"                          first push that succeeds on a key the dead\n"
	"                          node owned\n"
	"      --mode MODE         dynamic (default) or classic (static placement)\n"
	"      --no-fast-path      local keys too go through the progress thread\n"
	"  -t, --transport KIND    tcp (default), rdma or auto (loop: the tests'\n"
	"                          one-process transport with emulated one-sided reads)\n"
	"      --procs             nodes are forked processes (default: threads)\n"
	"      --external          this process is one node of a cluster launched\n"
	"                          from outside: FERRY_RANK, FERRY_WORLD,\n"
	"                          FERRY_RENDEZVOUS (and FERRY_BIND_ADDR) say which\n"
	"      --wait MODE         blocking (default): Ferry's threads and the raw\n"
	"                          baselines wait alike, spinning briefly then sleeping;\n"
	"                          busy-poll: all of them spin, never sleep;\n"
	"                          both: every scenario in each mode, in one run\n"
	"      --busy-poll         the same as --wait busy-poll\n"
	"      --pin               each node process on a CPU of its own (rank mod the\n"
	"                          allowed CPUs), with all its threads: the raw\n"
	"                          baseline's client and server too (--procs or\n"
	"                          --external)\n"
	"      --timeline          localize (move rows) and push: the median time of\n"
	"                          each step on each node (lib/core/timeline.h;\n"
	"                          threads or --procs)\n"
	"      --hw-oneway LIST    with --timeline: BYTES:US,... published one-way\n"
	"                          latencies of a NIC (ascending bytes); each table\n"
	"                          adds a projection: its wire steps at those\n"
	"                          figures, its CPU steps as measured\n"
	"      --bind ADDR         address the nodes (and the raw baseline) use\n"
	"      --link NAME         what the link is, for the record (default\n"
	"                          loopback, or external)\n"
	"      --timeout-ms MS     Ferry's bound on every wait\n"
	"\n"
	"How much:\n"
	"  -q, --quick             a short run (< 20 s): CI's smoke test\n"
	"      --sizes LIST        value sizes in bytes (default 8,64,512,4096,65536;\n"
	"                          K suffix allowed; multiples of 4)\n"
	"      --keys LIST         local: keys (default 10000,10000000; 1e7 allowed)\n"
	"      --mem-keys LIST     memory: keys of the whole table (default 1e6)\n"
	"      --threads LIST      local: reader threads (default 1 and the cores)\n"
	"      --cell-ms MS        local: time per measured cell (default 200)\n"
	"      --mem-mb MB         local: skip sizes whose table and baseline array\n"
	"                          need more (default 2048)\n"
	"      --iters N           remote, localize: timed operations per row\n"
	"                          (default 2000)\n"
	"      --windows LIST      remote: requests in flight (default 8,64)\n"
	"      --batch N           remote: keys per batch call (default 100)\n"
	"      --localize-sizes L  batch localize value sizes (default 8,8192)\n"
	"      --localize-batch N  keys per batch localize (default 1000)\n"
	"      --localize-reps N   timed batches (default 20)\n"
	"      --hot-seconds S     hot-key run time (default 2)\n"
	"      --hot-nodes N       hot-key nodes (default 2; external: the cluster)\n"
	"\n"
	"Baselines other than the built-in raw TCP ones (for --transport rdma):\n"
	"      --baseline-file F   perftest output (ib_read_lat: pull; ib_send_lat,\n"
	"                          else ib_write_lat, doubled: a message round trip,\n"
	"                          the busy-poll rows' floor); repeatable\n"
	"      --baseline-events F ib_send_lat -e output (sleeping on CQ events),\n"
	"                          doubled: the blocking rows' message floor (without\n"
	"                          it they are compared with the busy-polling one)\n"
	"      --baseline-cmd CMD  run CMD (sh -c) per value size, {bytes} replaced,\n"
	"                          and parse its perftest output\n"
	"      --baseline-us P50[,P99]  a raw round trip measured elsewhere\n"
	"      --baseline-cycles   the perftest figures are cycles (perftest -C, whose\n"
	"                          header still says usec): divide by the cpu MHz\n"
	"\n"
	"Output:\n"
	"  -j, --json FILE         also write the context and results as JSON\n"
	"  -v, --verbose           say what runs\n"
	"  -h, --help              this text\n"
	"      --version           Ferry's version and the commit this was built from\n"
	"\n"
	"Exit status: 0; 1 when something broke (an operation failed, a lost update);\n"
	"2 for bad options. Never on speed.\n";

enum {
	OPT_MODE = 256,
	OPT_NO_FAST_PATH,
	OPT_PROCS,
	OPT_EXTERNAL,
	OPT_BUSY_POLL,
	OPT_WAIT,
	OPT_PIN,
	OPT_BIND,
	OPT_LINK,
	OPT_TIMEOUT,
	OPT_SIZES,
	OPT_KEYS,
	OPT_MEM_KEYS,
	OPT_THREADS,
	OPT_CELL_MS,
	OPT_MEM_MB,
	OPT_ITERS,
	OPT_WINDOWS,
	OPT_BATCH,
	OPT_LSIZES,
	OPT_LBATCH,
	OPT_LREPS,
	OPT_HOT_S,
	OPT_HOT_NODES,
	OPT_BASE_FILE,
	OPT_BASE_CMD,
	OPT_BASE_US,
	OPT_BASE_CYCLES,
	OPT_BASE_EVENTS,
	OPT_HW_ONEWAY,
	OPT_TIMELINE,
};

static const struct option long_opts[] = {
	{ "scenario", required_argument, NULL, 's' },
	{ "mode", required_argument, NULL, OPT_MODE },
	{ "no-fast-path", no_argument, NULL, OPT_NO_FAST_PATH },
	{ "transport", required_argument, NULL, 't' },
	{ "procs", no_argument, NULL, OPT_PROCS },
	{ "external", no_argument, NULL, OPT_EXTERNAL },
	{ "busy-poll", no_argument, NULL, OPT_BUSY_POLL },
	{ "wait", required_argument, NULL, OPT_WAIT },
	{ "pin", no_argument, NULL, OPT_PIN },
	{ "timeline", no_argument, NULL, OPT_TIMELINE },
	{ "bind", required_argument, NULL, OPT_BIND },
	{ "link", required_argument, NULL, OPT_LINK },
	{ "timeout-ms", required_argument, NULL, OPT_TIMEOUT },
	{ "quick", no_argument, NULL, 'q' },
	{ "sizes", required_argument, NULL, OPT_SIZES },
	{ "keys", required_argument, NULL, OPT_KEYS },
	{ "mem-keys", required_argument, NULL, OPT_MEM_KEYS },
	{ "threads", required_argument, NULL, OPT_THREADS },
	{ "cell-ms", required_argument, NULL, OPT_CELL_MS },
	{ "mem-mb", required_argument, NULL, OPT_MEM_MB },
	{ "iters", required_argument, NULL, OPT_ITERS },
	{ "windows", required_argument, NULL, OPT_WINDOWS },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "localize-sizes", required_argument, NULL, OPT_LSIZES },
	{ "localize-batch", required_argument, NULL, OPT_LBATCH },
	{ "localize-reps", required_argument, NULL, OPT_LREPS },
	{ "hot-seconds", required_argument, NULL, OPT_HOT_S },
	{ "hot-nodes", required_argument, NULL, OPT_HOT_NODES },
	{ "baseline-file", required_argument, NULL, OPT_BASE_FILE },
	{ "baseline-cmd", required_argument, NULL, OPT_BASE_CMD },
	{ "baseline-us", required_argument, NULL, OPT_BASE_US },
	{ "baseline-cycles", no_argument, NULL, OPT_BASE_CYCLES },
	{ "baseline-events", required_argument, NULL, OPT_BASE_EVENTS },
	{ "hw-oneway", required_argument, NULL, OPT_HW_ONEWAY },
	{ "json", required_argument, NULL, 'j' },
	{ "verbose", no_argument, NULL, 'v' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

static int bad_option(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int bad_option(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "ferry-bench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n\n%s", usage_text);
	return 2;
}

/* a number with an optional K/M/G suffix (binary) or in 1e7 notation */
static int parse_num(const char *s, double lo, double hi, double *v)
{
	char *end;
	double d;

	errno = 0;
	d = strtod(s, &end);
	if (end == s || errno)
		return -1;
	if (*end == 'K' || *end == 'k')
		d *= 1024, end++;
	else if (*end == 'M' || *end == 'm')
		d *= 1048576, end++;
	else if (*end == 'G' || *end == 'g')
		d *= 1073741824.0, end++;
	if (*end || d < lo || d > hi)
		return -1;
	*v = d;
	return 0;
}

static int parse_list(const char *s, double lo, double hi, int integer, double *out, int *n)
{
	char buf[256], *save = NULL;

	if (strlen(s) >= sizeof(buf))
		return -1;
	snprintf(buf, sizeof(buf), "%s", s);
	*n = 0;
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		double v;

		if (*n >= FB_MAX_LIST || parse_num(tok, lo, hi, &v))
			return -1;
		if (integer && v != (double)(uint64_t)v)
			return -1;
		out[(*n)++] = v;
	}
	return *n ? 0 : -1;
}

struct opt_seen {
	int sizes, keys, memkeys, threads, cell, iters, windows, lsizes, lreps, hot_s;
};

/* --hw-oneway: "8:0.82,4096:2.25" */
static int parse_hw(const char *s, struct fb_opts *o)
{
	o->nhw = 0;
	while (*s) {
		char *end;
		unsigned long b = strtoul(s, &end, 10);
		double us;

		if (end == s || *end != ':' || b > UINT32_MAX || o->nhw == 8)
			return -1;
		s = end + 1;
		us = strtod(s, &end);
		if (end == s || !(us > 0) || (*end && *end != ','))
			return -1;
		if (o->nhw && b <= o->hw_bytes[o->nhw - 1])
			return -1;
		o->hw_bytes[o->nhw] = (uint32_t)b;
		o->hw_us[o->nhw++] = us;
		s = *end ? end + 1 : end;
	}
	return o->nhw ? 0 : -1;
}

static int parse_opts(int argc, char **argv, struct fb_opts *o)
{
	struct opt_seen seen = { 0 };
	const char *files[4];
	int nfiles = 0;
	const char *events_file = NULL;
	double v[FB_MAX_LIST], d;
	int c, n;
	size_t off = 0;

	memset(o, 0, sizeof(*o));
	o->scenarios = FB_SCEN_ALL;
	o->transport = FERRY_TRANSPORT_TCP;
	o->mode = FERRY_MODE_DYNAMIC;
	o->batch = 100;
	o->lbatch = 1000;
	o->hot_nodes = 2;
	o->mem_mb = 2048;
	for (int i = 0; i < argc && off < sizeof(o->cmdline); i++)
		off += (size_t)snprintf(o->cmdline + off, sizeof(o->cmdline) - off, "%s%s",
					i ? " " : "", argv[i]);

	while ((c = getopt_long(argc, argv, "s:t:qj:vh", long_opts, NULL)) != -1) {
		switch (c) {
		case 's': {
			char buf[128], *save = NULL;

			snprintf(buf, sizeof(buf), "%s", optarg);
			o->scenarios = 0;
			for (char *tok = strtok_r(buf, ",", &save); tok;
			     tok = strtok_r(NULL, ",", &save)) {
				if (!strcmp(tok, "local"))
					o->scenarios |= FB_SCEN_LOCAL;
				else if (!strcmp(tok, "remote"))
					o->scenarios |= FB_SCEN_REMOTE;
				else if (!strcmp(tok, "localize"))
					o->scenarios |= FB_SCEN_LOCALIZE;
				else if (!strcmp(tok, "move"))
					o->scenarios |= FB_SCEN_MOVE;
				else if (!strcmp(tok, "batch-localize"))
					o->scenarios |= FB_SCEN_LBATCH;
				else if (!strcmp(tok, "hot-key"))
					o->scenarios |= FB_SCEN_HOT;
				else if (!strcmp(tok, "memory"))
					o->scenarios |= FB_SCEN_MEMORY;
				else if (!strcmp(tok, "replicas"))
					o->scenarios |= FB_SCEN_REPL;
				else if (!strcmp(tok, "failover"))
					o->scenarios |= FB_SCEN_FAILOVER;
				else if (!strcmp(tok, "all"))
					o->scenarios |= FB_SCEN_ALL;
				else
					return bad_option(
						"unknown scenario '%s' (local, remote, "
						"localize, move, batch-localize, "
						"hot-key, memory, replicas, failover, all)",
						tok);
			}
			if (!o->scenarios)
				return bad_option("--scenario '%s' names none", optarg);
			break;
		}
		case OPT_MODE:
			if (!strcmp(optarg, "dynamic"))
				o->mode = FERRY_MODE_DYNAMIC;
			else if (!strcmp(optarg, "classic"))
				o->mode = FERRY_MODE_CLASSIC;
			else
				return bad_option("--mode '%s': want dynamic or classic", optarg);
			break;
		case OPT_NO_FAST_PATH:
			o->no_fast_path = 1;
			break;
		case 't':
			if (!strcmp(optarg, "tcp"))
				o->transport = FERRY_TRANSPORT_TCP;
			else if (!strcmp(optarg, "rdma"))
				o->transport = FERRY_TRANSPORT_RDMA;
			else if (!strcmp(optarg, "auto"))
				o->transport = FERRY_TRANSPORT_AUTO;
			else if (!strcmp(optarg, "loop"))
				o->transport = FERRY_TRANSPORT_LOOP;
			else
				return bad_option("--transport '%s': want tcp, rdma or auto",
						  optarg);
			break;
		case OPT_PROCS:
			if (o->nodes_as == FB_NODES_EXTERNAL)
				return bad_option("%s",
						  "--procs and --external exclude each other");
			o->nodes_as = FB_NODES_PROCS;
			break;
		case OPT_EXTERNAL:
			if (o->nodes_as == FB_NODES_PROCS)
				return bad_option("%s",
						  "--procs and --external exclude each other");
			o->nodes_as = FB_NODES_EXTERNAL;
			break;
		case OPT_BUSY_POLL:
			o->busy_poll = 1;
			o->wait_both = 0;
			break;
		case OPT_WAIT:
			o->busy_poll = !strcmp(optarg, "busy-poll");
			o->wait_both = !strcmp(optarg, "both");
			if (!o->busy_poll && !o->wait_both && strcmp(optarg, "blocking"))
				return bad_option(
					"--wait '%s': expected blocking, busy-poll or both",
					optarg);
			break;
		case OPT_TIMELINE:
			o->timeline = 1;
			break;
		case OPT_PIN:
			o->pin = 1;
			break;
		case OPT_BIND:
			o->bind_addr = optarg;
			break;
		case OPT_LINK:
			o->link = optarg;
			break;
		case OPT_TIMEOUT:
			if (parse_num(optarg, 100, 3600000, &d))
				return bad_option("--timeout-ms '%s': want 100 to 3600000", optarg);
			o->timeout_ms = (int)d;
			break;
		case 'q':
			o->quick = 1;
			break;
		case OPT_SIZES:
		case OPT_LSIZES:
			if (parse_list(optarg, 4, 4 << 20, 1, v, &n))
				return bad_option("bad size list '%s' (4 B to 4 MiB each)", optarg);
			for (int i = 0; i < n; i++) {
				if ((uint64_t)v[i] % 4)
					return bad_option(
						"sizes are whole floats: '%s' has one that "
						"is not a multiple of 4",
						optarg);
				if (c == OPT_SIZES)
					o->sizes[i] = (uint32_t)v[i];
				else
					o->lsizes[i] = (uint32_t)v[i];
			}
			if (c == OPT_SIZES)
				o->nsizes = n, seen.sizes = 1;
			else
				o->nlsizes = n, seen.lsizes = 1;
			break;
		case OPT_MEM_KEYS:
			if (parse_list(optarg, 4096, 1e9, 1, v, &n))
				return bad_option("--mem-keys '%s': want counts from 4096 to 1e9",
						  optarg);
			for (int i = 0; i < n; i++)
				o->memkeys[i] = (uint64_t)v[i];
			o->nmemkeys = n;
			seen.memkeys = 1;
			break;
		case OPT_KEYS:
			if (parse_list(optarg, 1, 1e9, 1, v, &n))
				return bad_option("--keys '%s': want counts from 1 to 1e9", optarg);
			for (int i = 0; i < n; i++)
				o->keys[i] = (uint64_t)v[i];
			o->nkeys = n;
			seen.keys = 1;
			break;
		case OPT_THREADS:
			if (parse_list(optarg, 1, 256, 1, v, &n))
				return bad_option("--threads '%s': want counts from 1 to 256",
						  optarg);
			for (int i = 0; i < n; i++)
				o->threads[i] = (int)v[i];
			o->nthreads = n;
			seen.threads = 1;
			break;
		case OPT_CELL_MS:
			if (parse_num(optarg, 1, 600000, &d))
				return bad_option("--cell-ms '%s': want 1 to 600000", optarg);
			o->cell_s = d / 1000;
			seen.cell = 1;
			break;
		case OPT_MEM_MB:
			if (parse_num(optarg, 1, 1 << 30, &d))
				return bad_option("--mem-mb '%s': want a size in MiB", optarg);
			o->mem_mb = (size_t)d;
			break;
		case OPT_ITERS:
			if (parse_num(optarg, 10, 1e8, &d))
				return bad_option("--iters '%s': want 10 to 1e8", optarg);
			o->iters = (long)d;
			seen.iters = 1;
			break;
		case OPT_WINDOWS:
			if (parse_list(optarg, 1, 512, 1, v, &n))
				return bad_option("--windows '%s': want 1 to 512 each", optarg);
			for (int i = 0; i < n; i++)
				o->windows[i] = (int)v[i];
			o->nwindows = n;
			seen.windows = 1;
			break;
		case OPT_BATCH:
			if (parse_num(optarg, 1, 1000, &d) || d != (double)(int)d)
				return bad_option("--batch '%s': want 1 to 1000", optarg);
			o->batch = (uint32_t)d;
			break;
		case OPT_LBATCH:
			if (parse_num(optarg, 1, 100000, &d) || d != (double)(int)d)
				return bad_option("--localize-batch '%s': want 1 to 100000",
						  optarg);
			o->lbatch = (uint32_t)d;
			break;
		case OPT_LREPS:
			if (parse_num(optarg, 1, 100000, &d) || d != (double)(int)d)
				return bad_option("--localize-reps '%s': want 1 to 100000", optarg);
			o->lreps = (int)d;
			seen.lreps = 1;
			break;
		case OPT_HOT_S:
			if (parse_num(optarg, 0.01, 3600, &d))
				return bad_option("--hot-seconds '%s': want 0.01 to 3600", optarg);
			o->hot_s = d;
			seen.hot_s = 1;
			break;
		case OPT_HOT_NODES:
			if (parse_num(optarg, 2, 64, &d) || d != (double)(int)d)
				return bad_option("--hot-nodes '%s': want 2 to 64", optarg);
			o->hot_nodes = (int)d;
			break;
		case OPT_BASE_FILE:
			if (nfiles >= 4)
				return bad_option("%s", "at most 4 --baseline-file options");
			files[nfiles++] = optarg;
			break;
		case OPT_BASE_CYCLES:
			o->pt_cycles = 1;
			break;
		case OPT_BASE_EVENTS:
			events_file = optarg;
			break;
		case OPT_HW_ONEWAY:
			if (parse_hw(optarg, o))
				return bad_option("--hw-oneway '%s': want BYTES:US,... (up to 8, "
						  "ascending bytes, microseconds > 0)",
						  optarg);
			break;
		case OPT_BASE_CMD:
			o->baseline_cmd = optarg;
			break;
		case OPT_BASE_US: {
			char *end;

			o->given_us = strtod(optarg, &end);
			o->given_p99_us = 0;
			if (*end == ',')
				o->given_p99_us = strtod(end + 1, &end);
			if (*end || o->given_us <= 0 || o->given_p99_us < 0)
				return bad_option("--baseline-us '%s': want P50[,P99] in "
						  "microseconds",
						  optarg);
			break;
		}
		case 'j':
			o->json_path = optarg;
			break;
		case 'v':
			o->verbose = 1;
			break;
		case 'h':
			fputs(usage_text, stdout);
			exit(0);
		case 'V':
			printf("ferry-bench (Ferry %s, commit %s)\n", ferry_version(),
			       FB_GIT_COMMIT);
			exit(0);
		default:
			/* getopt_long already named the option */
			fprintf(stderr, "\n%s", usage_text);
			return 2;
		}
	}
	if (optind < argc)
		return bad_option("unexpected argument '%s'", argv[optind]);
	for (int i = 0; i < nfiles; i++) {
		struct fb_perftest pt = { 0 };

		if (fb_perftest_file(files[i], o->pt_cycles, &pt))
			return bad_option("--baseline-file '%s': no perftest latency result in "
					  "it%s",
					  files[i],
					  o->pt_cycles ? " (or no cpu MHz in /proc/cpuinfo)" : "");
		if (pt.is_send)
			o->pt_send = pt;
		else if (pt.is_write)
			o->pt_write = pt;
		else
			o->pt_read = pt;
	}
	if (events_file) {
		struct fb_perftest pt = { 0 };

		if (fb_perftest_file(events_file, o->pt_cycles, &pt) || !pt.is_send)
			return bad_option("--baseline-events '%s': no ib_send_lat result in it%s",
					  events_file,
					  o->pt_cycles ? " (or no cpu MHz in /proc/cpuinfo)" : "");
		pt.events = 1;
		o->pt_events = pt;
	}

	if (o->pin && o->nodes_as == FB_NODES_THREADS)
		return bad_option("%s", "--pin needs --procs or --external: nodes that are threads "
					"of one process share its progress threads' CPUs");
	if (o->wait_both && o->nodes_as == FB_NODES_EXTERNAL)
		return bad_option("%s", "--wait both needs nodes this run opens (threads or "
					"--procs): an external cluster has one wait mode; run it "
					"twice, with and without --busy-poll");

	/* what --quick changes, unless given */
	if (!seen.sizes) {
		static const uint32_t full[] = { 8, 64, 512, 4096, 65536 }, quick[] = { 8, 4096 };
		const uint32_t *s = o->quick ? quick : full;

		o->nsizes = o->quick ? 2 : 5;
		memcpy(o->sizes, s, (size_t)o->nsizes * sizeof(*s));
	}
	if (!seen.lsizes) {
		o->lsizes[0] = 8;
		o->lsizes[1] = 8192;
		o->nlsizes = 2;
	}
	if (!seen.memkeys) {
		o->memkeys[0] = o->quick ? 100000 : 1000000;
		o->nmemkeys = 1;
	}
	if (!seen.keys) {
		o->keys[0] = 10000;
		o->keys[1] = 10000000;
		o->nkeys = o->quick ? 1 : 2;
	}
	if (!seen.threads) {
		long cores = sysconf(_SC_NPROCESSORS_ONLN);

		o->threads[0] = 1;
		o->nthreads = 1;
		if (!o->quick && cores > 1)
			o->threads[o->nthreads++] = (int)(cores > 256 ? 256 : cores);
	}
	if (!seen.cell)
		o->cell_s = o->quick ? 0.03 : 0.2;
	if (!seen.iters)
		o->iters = o->quick ? 200 : 2000;
	if (!seen.windows) {
		o->windows[0] = o->quick ? 16 : 8;
		o->windows[1] = 64;
		o->nwindows = o->quick ? 1 : 2;
	}
	if (!seen.lreps)
		o->lreps = o->quick ? 3 : 20;
	if (!seen.hot_s)
		o->hot_s = o->quick ? 0.5 : 2;
	if (!o->link)
		o->link = o->nodes_as == FB_NODES_EXTERNAL ? "external" : "loopback";
	return 0;
}

int main(int argc, char **argv)
{
	struct fb_context ctx;
	struct fb_shared *sh;
	struct fb_opts o;
	int rc, is_rank0 = 1;

	rc = parse_opts(argc, argv, &o);
	if (rc)
		return rc;
	/* the results outlive forked nodes: share them */
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("ferry-bench: mmap");
		return 1;
	}
	fb_context_get(&ctx);
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* first, from a process that has run no node yet: its forked nodes inherit
	 * nothing of the threads of a cluster run before (seen: a forked node that
	 * never closed after a replicas run in the same process) */
	if (o.scenarios & FB_SCEN_FAILOVER)
		fb_failover(&o, sh);
	/* --wait both: the whole run in blocking mode, then again busy-polling */
	for (int pass = 0; pass < (o.wait_both ? 2 : 1); pass++) {
		if (o.wait_both)
			o.busy_poll = pass;
		sh->busy_poll = o.busy_poll;
		if (o.scenarios & FB_SCEN_LOCAL)
			fb_local(&o, sh);
		if (o.scenarios & FB_SCEN_REMOTE)
			fb_remote(&o, sh);
		if (o.scenarios & FB_SCEN_LOCALIZE)
			fb_localize(&o, sh, o.scenarios);
		if (o.scenarios & FB_SCEN_MEMORY)
			fb_memory(&o, sh);
		if (o.scenarios & FB_SCEN_REPL)
			fb_replicas(&o, sh);
	}
	is_rank0 = fb_cluster_rank() == 0;
	fb_cluster_close();
	fb_context_load(ctx.load1, sizeof(ctx.load1));

	if (is_rank0) {
		if (fb_report(&o, &ctx, sh))
			atomic_fetch_add(&sh->failures, 1);
	} else {
		printf("ferry-bench: node %d of an external cluster: rank 0 prints the results\n",
		       fb_cluster_rank());
	}
	rc = atomic_load(&sh->failures);
	if (rc) {
		fprintf(stderr, "ferry-bench: %d failure%s (see above); figures are incomplete\n",
			rc, rc > 1 ? "s" : "");
		return 1;
	}
	return 0;
}

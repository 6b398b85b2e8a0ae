/* SPDX-License-Identifier: MIT */
/*
 * report.c - what ferry-bench prints and writes once its scenarios ran: the
 * run's context (commit, kernel, CPU, load), the table of results, the
 * goals' lines, the floors each wait mode was compared with, and the JSON
 * file. main.c parses the options and runs the scenarios.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bjson.h"
#include "fb.h"
#include "fb_git.h"

/* ---- context -------------------------------------------------------------- */

static void read_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");

	buf[0] = '\0';
	if (f) {
		if (fgets(buf, (int)len, f))
			buf[strcspn(buf, "\n")] = '\0';
		fclose(f);
	}
}

void fb_context_load(char *buf, size_t len)
{
	char l[128];

	read_line("/proc/loadavg", l, sizeof(l));
	/* the three averages only */
	{
		char *p = l;

		for (int i = 0; i < 3 && p; i++)
			p = strchr(p + 1, ' ');
		if (p)
			*p = '\0';
	}
	snprintf(buf, len, "%s", l);
}

void fb_context_get(struct fb_context *c)
{
	struct utsname u;
	FILE *f;
	time_t now = time(NULL);
	struct tm tm;

	memset(c, 0, sizeof(*c));
	snprintf(c->commit, sizeof(c->commit), "%s", FB_GIT_COMMIT);
	if (!uname(&u))
		snprintf(c->kernel, sizeof(c->kernel), "%s %s %s", u.sysname, u.release, u.machine);
	f = fopen("/proc/cpuinfo", "r");
	if (f) {
		char line[256];

		while (fgets(line, sizeof(line), f)) {
			char *p = strchr(line, ':');

			if (!strncmp(line, "model name", 10) && p) {
				p++;
				while (*p == ' ' || *p == '\t')
					p++;
				p[strcspn(p, "\n")] = '\0';
				snprintf(c->cpu, sizeof(c->cpu), "%s", p);
				break;
			}
		}
		fclose(f);
	}
	if (!c->cpu[0])
		snprintf(c->cpu, sizeof(c->cpu), "unknown");
	c->cores = sysconf(_SC_NPROCESSORS_ONLN);
	fb_context_load(c->load0, sizeof(c->load0));
	gmtime_r(&now, &tm);
	strftime(c->date, sizeof(c->date), "%Y-%m-%dT%H:%M:%SZ", &tm);
}

const char *fb_transport_name(enum ferry_transport_kind k)
{
	switch (k) {
	case FERRY_TRANSPORT_RDMA:
		return "rdma";
	case FERRY_TRANSPORT_TCP:
		return "tcp";
	case FERRY_TRANSPORT_LOOP:
		return "loop";
	default:
		return "auto";
	}
}

static const char *nodes_as_name(enum fb_nodes_as a)
{
	return a == FB_NODES_PROCS ? "processes" : a == FB_NODES_EXTERNAL ? "external" : "threads";
}

/* ---- the table ------------------------------------------------------------ */

static void print_us(double us)
{
	if (us <= 0)
		printf(" %10s", "-");
	else if (us < 10)
		printf(" %10.3f", us);
	else
		printf(" %10.1f", us);
}

static void print_rule(void)
{
	printf("-----------------------------------------------------------------------------"
	       "-----------------------------------------------------------------------------"
	       "-----------------------------------------------------------------------------"
	       "---------------------------\n");
}

static void print_header(const struct fb_opts *o, const struct fb_context *c)
{
	print_rule();
	printf(" ferry-bench %s (commit %s)   transport %s   mode %s%s   nodes as %s   %s   "
	       "link %s\n",
	       ferry_version(), c->commit, fb_transport_name(o->transport),
	       o->mode == FERRY_MODE_CLASSIC ? "classic" : "dynamic",
	       o->no_fast_path ? " (no fast path)" : "", nodes_as_name(o->nodes_as),
	       o->wait_both ? "wait both (blocking, then busy-poll)" :
	       o->busy_poll ? "busy-poll" :
			      "blocking",
	       o->link);
	printf(" %s   %s x %ld   load %s   %s%s\n", c->kernel, c->cpu, c->cores, c->load0, c->date,
	       o->quick ? "   QUICK" : "");
	printf(" ratio = Ferry time per operation / baseline time (p50 against p50; throughput "
	       "rows: ops/s inverted); SUSPECT: Ferry below\n its physical floor, so the "
	       "baseline was not measured right; wait: blk = blocking, busy = busy-poll%s\n",
	       o->pin ? "; every node process pinned to a CPU" : "");
	print_rule();
	printf(" %-8s %-13s %4s %7s %9s %3s %2s %10s %10s %10s %10s %10s %10s %12s %9s %-18s %10s "
	       "%10s %10s %10s %10s %12s %7s  %s\n",
	       "scenario", "op", "wait", "bytes", "keys", "thr", "wr", "min[us]", "mean[us]",
	       "sd[us]", "p50[us]", "p99[us]", "p99.9[us]", "ops/s", "MB/s", "baseline",
	       "b.min[us]", "b.mean[us]", "b.sd[us]", "b.p50[us]", "b.p99[us]", "b.ops/s", "ratio",
	       "note");
}

static void print_row(const struct fb_result *r)
{
	printf(" %-8s %-13s %4s %7u %9llu %3u %2d", r->scenario, r->op,
	       r->busy_poll ? "busy" : "blk", r->value_bytes, (unsigned long long)r->keys,
	       r->threads, r->writer);
	print_us(r->min_us);
	print_us(r->mean_us);
	print_us(r->stdev_us);
	print_us(r->p50_us);
	print_us(r->p99_us);
	print_us(r->p999_us);
	printf(" %12.0f %9.1f %-18s", r->ops_per_s, r->mb_per_s, r->baseline);
	print_us(r->base_min_us);
	print_us(r->base_mean_us);
	print_us(r->base_stdev_us);
	print_us(r->base_p50_us);
	print_us(r->base_p99_us);
	if (r->base_ops_per_s > 0)
		printf(" %12.0f", r->base_ops_per_s);
	else
		printf(" %12s", "-");
	if (r->ratio > 0)
		printf(" %7.2f", r->ratio);
	else
		printf(" %7s", "-");
	printf("  %s%s%s\n", r->suspect ? "SUSPECT baseline" : "",
	       r->suspect && r->note[0] ? "; " : "", r->note);
}

/* ---- goals: reported, never judged by the exit status --------------------- */

/* the worst (largest) and the smallest ratio of a goal's rows; any row below its floor */
struct goal {
	double worst, low;
	int suspect;
};

static void goal_add(struct goal *g, const struct fb_result *r)
{
	if (r->ratio <= 0)
		return;
	if (r->ratio > g->worst)
		g->worst = r->ratio;
	if (!g->low || r->ratio < g->low)
		g->low = r->ratio;
	g->suspect |= r->suspect;
}

/* A ratio below 1 against a floor says the baseline is broken: never "met". */
static void goal_print(const char *what, const struct goal *g, double limit)
{
	if (g->worst <= 0)
		return;
	if (g->suspect)
		printf("#   %-40s %6.2f  baseline SUSPECT: a row at %.2f is below its floor\n",
		       what, g->worst, g->low);
	else
		printf("#   %-40s %6.2f  %s\n", what, g->worst,
		       g->worst <= limit ? "met" : "MISSED");
}

static void print_goals(const struct fb_opts *o, const struct fb_shared *sh, int busy)
{
	int n = atomic_load(&sh->nresults);
	struct goal local = { 0 }, remote = { 0 }, home = { 0 }, third = { 0 };
	double b8 = -1, b8k = -1;
	int seen_hot = 0, rows = 0;

	for (int i = 0; i < n; i++) {
		const struct fb_result *r = &sh->results[i];

		if (r->busy_poll != busy)
			continue;
		rows++;
		/* the goal is about pulls alone; writer rows show the interference */
		if (!strcmp(r->scenario, "local") && !strcmp(r->op, "pull") && !r->writer)
			goal_add(&local, r);
		if (!strcmp(r->scenario, "remote") && !strcmp(r->op, "pull"))
			goal_add(&remote, r);
		if (!strcmp(r->op, "move-home"))
			goal_add(&home, r);
		if (!strcmp(r->op, "move-third"))
			goal_add(&third, r);
		if (!strncmp(r->op, "batch", 5) && r->value_bytes == 8)
			b8 = r->ops_per_s;
		if (!strncmp(r->op, "batch", 5) && r->value_bytes == 8192)
			b8k = r->mb_per_s;
		if (!strcmp(r->op, "hot-key"))
			seen_hot = 1;
	}
	if (!rows)
		return;
	printf("# goals, %s (benchmark goals, not tests; worst row shown):\n",
	       busy ? "busy-poll" : "blocking");
	if (o->mode == FERRY_MODE_CLASSIC) {
		/* localize moves nothing there: its rows say nothing about relocation */
		home.worst = third.worst = 0;
		b8 = b8k = -1;
		printf("#   relocation goals: not applicable in classic mode\n");
	}
	goal_print("local pull (no writer) <= 1.5 x randcopy", &local, 1.5);
	goal_print("remote pull p50 <= 1.5 x raw round trip", &remote, 1.5);
	goal_print("move, owner = home <= 2 round trips", &home, 2);
	goal_print("move, owner != home <= 3 round trips", &third, 3);
	if (b8 >= 0)
		printf("#   %-40s %6.2fM %s\n", "batch localize, 8 B >= 3e6 keys/s", b8 / 1e6,
		       b8 >= 3e6 ? "met" : "MISSED");
	if (b8k >= 0)
		printf("#   %-40s %6.2fG %s\n", "batch localize, 8 KiB >= 1 GB/s", b8k / 1e3,
		       b8k >= 1e3 ? "met" : "MISSED");
	if (seen_hot)
		printf("#   %-40s        %s\n", "hot key loses no update",
		       atomic_load(&sh->failures) ? "see FAILED above" : "met");
}

/*
 * The perftest floors the rows were compared with, one line per wait mode and
 * floor: like for like, a blocking row against a floor that sleeps on CQ
 * events when one was given (--baseline-events), a busy-poll row against one
 * that busy-polls
 */
static void print_floors(const struct fb_shared *sh)
{
	int n = atomic_load(&sh->nresults), shown = 0;

	for (int i = 0; i < n; i++) {
		const struct fb_result *r = &sh->results[i];
		int seen = 0;

		if (strncmp(r->baseline, "ib_", 3) && strncmp(r->baseline, "2xib_", 5))
			continue;
		for (int j = 0; j < i && !seen; j++)
			seen = sh->results[j].busy_poll == r->busy_poll &&
			       !strcmp(sh->results[j].baseline, r->baseline);
		if (seen)
			continue;
		if (!shown++)
			printf("# floors (perftest in this run; which one each row is compared "
			       "with):\n");
		printf("#   %-4s rows: %-20s p50 %.2f us, p99 %.2f us (%s)\n",
		       r->busy_poll ? "busy" : "blk", r->baseline, r->base_p50_us, r->base_p99_us,
		       strstr(r->baseline, "-e/")  ? "sleeping on CQ events, as blocking waits" :
		       strstr(r->baseline, "read") ? "one READ, busy-polling" :
		       r->busy_poll		   ? "busy-polling, as busy-poll waits" :
						     "busy-polling: NOT like for like, no "
						     "--baseline-events given");
	}
}

/* ---- JSON ----------------------------------------------------------------- */

/* through the tools' one writer (bench/common/bjson.h); plot.sh reads it with jq */
static int json_write(const char *path, const struct fb_opts *o, const struct fb_context *c,
		      const struct fb_shared *sh)
{
	int n = atomic_load(&sh->nresults), nf = atomic_load(&sh->failures);
	json_t *root = json_object(), *ctx = json_object(), *res = json_array();
	json_t *fails = json_array();
	int rc;

	if (!root || !ctx || !res || !fails) {
		json_decref(root);
		json_decref(ctx);
		json_decref(res);
		json_decref(fails);
		fprintf(stderr, "ferry-bench: cannot write %s: out of memory\n", path);
		return -1;
	}
	bjson_set(root, "context", ctx);
	bjson_set_str(ctx, "program", "ferry-bench");
	bjson_set_str(ctx, "ferry_version", ferry_version());
	bjson_set_str(ctx, "git_commit", c->commit);
	bjson_set_str(ctx, "kernel", c->kernel);
	bjson_set_str(ctx, "cpu", c->cpu);
	bjson_set_int(ctx, "cores", c->cores);
	bjson_set_str(ctx, "transport", fb_transport_name(o->transport));
	bjson_set_str(ctx, "mode", o->mode == FERRY_MODE_CLASSIC ? "classic" : "dynamic");
	bjson_set_int(ctx, "no_fast_path", o->no_fast_path);
	bjson_set_str(ctx, "nodes_as", nodes_as_name(o->nodes_as));
	bjson_set_int(ctx, "busy_poll", o->wait_both ? 0 : o->busy_poll);
	bjson_set_str(ctx, "wait", o->wait_both ? "both" : o->busy_poll ? "busy-poll" : "blocking");
	bjson_set_bool(ctx, "pin", o->pin);
	bjson_set_str(ctx, "link", o->link);
	bjson_set_int(ctx, "quick", o->quick);
	bjson_set_str(ctx, "date", c->date);
	bjson_set_str(ctx, "loadavg_start", c->load0);
	bjson_set_str(ctx, "loadavg_end", c->load1);
	bjson_set_str(ctx, "command", o->cmdline);
	bjson_set(root, "results", res);
	for (int i = 0; i < n; i++) {
		const struct fb_result *r = &sh->results[i];
		json_t *row = json_object();

		if (bjson_append(res, row))
			break;
		bjson_set_str(row, "scenario", r->scenario);
		bjson_set_str(row, "op", r->op);
		bjson_set_int(row, "value_bytes", r->value_bytes);
		bjson_set_int(row, "keys", (int64_t)r->keys);
		bjson_set_int(row, "threads", r->threads);
		bjson_set_int(row, "writer", r->writer);
		/* a figure a scenario does not measure is 0 in the record: null here */
		bjson_set_str(row, "wait", r->busy_poll ? "busy-poll" : "blocking");
		bjson_set(row, "min_us", bjson_opt(r->min_us > 0, r->min_us));
		bjson_set(row, "mean_us", bjson_opt(r->mean_us > 0, r->mean_us));
		bjson_set(row, "stdev_us", bjson_opt(r->mean_us > 0, r->stdev_us));
		bjson_set(row, "p50_us", bjson_opt(r->p50_us > 0, r->p50_us));
		bjson_set(row, "p99_us", bjson_opt(r->p99_us > 0, r->p99_us));
		bjson_set(row, "p999_us", bjson_opt(r->p999_us > 0, r->p999_us));
		bjson_set(row, "ops_per_s", bjson_opt(r->ops_per_s > 0, r->ops_per_s));
		bjson_set(row, "mb_per_s", bjson_opt(r->mb_per_s > 0, r->mb_per_s));
		bjson_set(row, "baseline", r->baseline[0] ? bjson_str(r->baseline) : json_null());
		bjson_set(row, "baseline_min_us", bjson_opt(r->base_min_us > 0, r->base_min_us));
		bjson_set(row, "baseline_mean_us", bjson_opt(r->base_mean_us > 0, r->base_mean_us));
		bjson_set(row, "baseline_stdev_us",
			  bjson_opt(r->base_mean_us > 0, r->base_stdev_us));
		bjson_set(row, "baseline_p50_us", bjson_opt(r->base_p50_us > 0, r->base_p50_us));
		bjson_set(row, "baseline_p99_us", bjson_opt(r->base_p99_us > 0, r->base_p99_us));
		bjson_set(row, "baseline_ops_per_s",
			  bjson_opt(r->base_ops_per_s > 0, r->base_ops_per_s));
		bjson_set(row, "ratio", bjson_opt(r->ratio > 0, r->ratio));
		/* a latency row below its floor: the baseline is broken (null: no floor here) */
		bjson_set(row, "baseline_suspect",
			  r->base_p50_us > 0 && strcmp(r->op, "hot-key") ?
				  json_boolean(r->suspect) :
				  json_null());
		if (r->extra_name[0])
			bjson_set_num(row, r->extra_name, r->extra);
		bjson_set_str(row, "note", r->note);
	}
	bjson_set(root, "failures", fails);
	for (int i = 0; i < nf && i < 8; i++)
		bjson_append(fails, bjson_str(sh->failure_msg[i]));
	rc = bjson_write(root, path, "ferry-bench");
	json_decref(root);
	return rc ? -1 : 0;
}

int fb_report(const struct fb_opts *o, const struct fb_context *ctx, struct fb_shared *sh)
{
	int n = atomic_load(&sh->nresults);

	print_header(o, ctx);
	for (int i = 0; i < n; i++)
		print_row(&sh->results[i]);
	print_rule();
	printf(" load at the end: %s\n", ctx->load1);
	print_goals(o, sh, 0);
	print_goals(o, sh, 1);
	print_floors(sh);
	return o->json_path ? json_write(o->json_path, o, ctx, sh) : 0;
}

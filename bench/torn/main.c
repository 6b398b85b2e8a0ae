/* SPDX-License-Identifier: MIT */
/*
 * ferry-torn - the torn-read storm of test_onesided, for as many one-sided
 * READs as asked (10^8 by default): writers on node 0 keep setting whole
 * values (every float the same number) while node 1 pulls them one-sided
 * over the loop transport, which serves each READ's cache lines in a random
 * order with pauses between them (FERRY_LOOP_ADVERSARIAL=1). Every value
 * read is checked; the figures are READs, torn images the seal rejected
 * (retries), pulls that fell back to a message, torn values returned (must
 * be 0) and READs per second. docs/consistency.md reports a run.
 *
 * Exit status: 0; 1 when a torn value was returned or a pull failed; 2 for
 * bad options. Never on speed.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/torn.h"
#include "ferry/ferry.h"

#define TORN_MAX_SIZES 8

static const char usage_text[] =
	"usage: ferry-torn [options]\n"
	"  -n, --reads N        one-sided READs in all (default 1e8; 1e6 style allowed)\n"
	"  -s, --sizes LIST     value sizes in bytes, multiples of 4 (default 8,256,4096)\n"
	"      --shares LIST    the READs' split over the sizes (default 90,8,2: a 4 KiB\n"
	"                       READ is 65 lines, each after a pause, so it is slow;\n"
	"                       equal shares when only --sizes is given)\n"
	"  -w, --writers N      writer threads on the owner (default 2)\n"
	"      --max-seconds S  bound per size (default 3600)\n"
	"      --in-order       serve READs in address order (FERRY_LOOP_ADVERSARIAL=0),\n"
	"                       to compare\n"
	"  -h, --help           this text\n"
	"      --version        Ferry's version\n";

static int parse_list(const char *s, double *out, int max)
{
	int n = 0;
	char *end;

	while (*s && n < max) {
		out[n++] = strtod(s, &end);
		if (end == s)
			return -1;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return *s ? -1 : n;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "reads", required_argument, NULL, 'n' },
		{ "sizes", required_argument, NULL, 's' },
		{ "shares", required_argument, NULL, 'S' },
		{ "writers", required_argument, NULL, 'w' },
		{ "max-seconds", required_argument, NULL, 'm' },
		{ "in-order", no_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	double sizes[TORN_MAX_SIZES] = { 8, 256, 4096 }, shares[TORN_MAX_SIZES] = { 90, 8, 2 };
	int nsizes = 3, nshares = 3, writers = 2, in_order = 0, sizes_given = 0, shares_given = 0,
	    c;
	double reads = 1e8, max_seconds = 3600, share_sum = 0;
	long total_torn = 0;
	uint64_t total_reads = 0, total_retries = 0;
	int failed = 0;

	while ((c = getopt_long(argc, argv, "n:s:w:h", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			reads = strtod(optarg, NULL);
			break;
		case 's':
			nsizes = parse_list(optarg, sizes, TORN_MAX_SIZES);
			sizes_given = 1;
			break;
		case 'S':
			nshares = parse_list(optarg, shares, TORN_MAX_SIZES);
			shares_given = 1;
			break;
		case 'w':
			writers = atoi(optarg);
			break;
		case 'm':
			max_seconds = strtod(optarg, NULL);
			break;
		case 'o':
			in_order = 1;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		case 'V':
			printf("ferry-torn (Ferry %s)\n", ferry_version());
			return 0;
		default:
			fputs(usage_text, stderr);
			return 2;
		}
	}
	if (nsizes < 1 || reads < 1 || writers < 1 || max_seconds <= 0 ||
	    (shares_given && nshares != nsizes)) {
		fprintf(stderr, "ferry-torn: bad options (give one share per size)\n%s",
			usage_text);
		return 2;
	}
	if (sizes_given && !shares_given) /* equal shares */
		for (int i = 0; i < nsizes; i++)
			shares[i] = 1;
	for (int i = 0; i < nsizes; i++) {
		if (sizes[i] < 4 || (long)sizes[i] % 4) {
			fprintf(stderr, "ferry-torn: size %g is not a multiple of 4 bytes\n",
				sizes[i]);
			return 2;
		}
		share_sum += shares[i];
	}
	setenv("FERRY_TRANSPORT", "loop", 1);
	setenv("FERRY_LOOP_ADVERSARIAL", in_order ? "0" : "1", 1);
	ferry_log_set(FERRY_LOG_ERROR, NULL, NULL);

	printf("ferry-torn: %.0f one-sided READs, %s, %d writers\n", reads,
	       in_order ? "in address order" : "lines in a random order (adversarial)", writers);
	printf("%8s %6s %12s %12s %10s %12s %6s %10s %8s %10s\n", "bytes", "lines", "READs",
	       "rejected", "fallbacks", "values", "torn", "writes", "seconds", "READs/s");
	for (int i = 0; i < nsizes; i++) {
		uint32_t bytes = (uint32_t)sizes[i];
		struct torn_cfg cfg = {
			.value_len = bytes / 4,
			.keys = bytes >= 4096 ? 8 : 16,
			.writers = writers,
			.batch = bytes >= 4096 ? 4 : 8,
			.reads = (long)(reads * shares[i] / share_sum),
			.max_seconds = max_seconds,
			.pause_ns = bytes * 5 > 2000 ? bytes * 5 : 2000,
			.timeout_ms = 60000,
		};
		/* a slot: 32-byte header, the value, the 8-byte seal, in 64-byte lines */
		unsigned lines = (unsigned)((32 + bytes + 8 + 63) / 64);
		struct torn_result r;
		int rc;

		if (!cfg.reads)
			continue;
		rc = torn_run(&cfg, &r);
		printf("%8u %6u %12llu %12llu %10llu %12ld %6ld %10ld %8.1f %10.0f\n", bytes, lines,
		       (unsigned long long)r.onesided_reads, (unsigned long long)r.retries,
		       (unsigned long long)r.fallbacks, r.values, r.torn, r.writes, r.seconds,
		       r.seconds > 0 ? (double)r.onesided_reads / r.seconds : 0);
		fflush(stdout);
		if (rc || r.torn) {
			fprintf(stderr, "ferry-torn: %u bytes: %s%s\n", bytes,
				rc ? ferry_strerror(rc) : "torn value: ", r.why);
			failed = 1;
		}
		total_reads += r.onesided_reads;
		total_retries += r.retries;
		total_torn += r.torn;
	}
	printf("in all: %llu one-sided READs, %llu torn images rejected by the seal, %ld torn "
	       "values returned\n",
	       (unsigned long long)total_reads, (unsigned long long)total_retries, total_torn);
	return failed;
}

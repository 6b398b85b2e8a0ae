/* SPDX-License-Identifier: MIT */
/*
 * torn.h - the torn-read storm: writers on node 0 keep setting whole values
 * (every float of a value the same number, so a torn copy shows), while
 * node 1 pulls them one-sided, and every value read is checked. Run on the
 * loop transport with FERRY_LOOP_ADVERSARIAL=1 (the caller sets both), it
 * serves each READ's cache lines in a random order with pauses between them.
 * test_onesided runs it for 10^6 reads; bench/torn (ferry-torn) for as many
 * as asked.
 */
#ifndef FERRY_TEST_TORN_H
#define FERRY_TEST_TORN_H

#include <stdint.h>

struct torn_cfg {
	uint32_t value_len; /* floats per value */
	uint32_t keys;	    /* keys the writers set, all owned by node 0 */
	int writers;	    /* writer threads on node 0 */
	uint32_t batch;	    /* keys per pull (one READ each; at most 16) */
	long reads;	    /* stop once this many one-sided READs were checked, */
	double max_seconds; /* or after this long */
	unsigned pause_ns;  /* a writer pauses up to this long after each set */
	int timeout_ms;	    /* the nodes' bound on every wait */
};

struct torn_result {
	long values;		 /* values pulled and checked */
	long torn;		 /* of them, with floats that differ */
	long changes;		 /* pulls that found a key's value changed */
	long writes;		 /* sets by the writers */
	uint64_t onesided_reads; /* READs posted (each one a whole slot checked) */
	uint64_t retries;	 /* READs whose image failed the check: read again */
	uint64_t fallbacks;	 /* pulls that went by message after 16 tries */
	double seconds;
	char why[256]; /* the first torn value, or what failed */
};

/* 0, or a negative errno (res->why says what); res->torn counts torn values */
int torn_run(const struct torn_cfg *cfg, struct torn_result *res);

#endif

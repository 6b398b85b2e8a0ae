/* SPDX-License-Identifier: MIT */
/*
 * ferry-tp-check - one rank of the transport suite's message cases, run as
 * one process per rank (ci/netns-test.sh: one rank per network namespace).
 * The transport suite (tests/transport/test_transport.c) opens its nodes as
 * threads of one process; this drives the same transport layer
 * (transport/transport.h) with the same traffic and checks
 * (tests/common/tnode.h) between ranks that a launcher started, configured
 * by the environment like an application (torchrun RANK WORLD_SIZE
 * MASTER_ADDR MASTER_PORT, or FERRY_*): the listen address is picked as
 * ferry_open() picks it, the address blobs go through the same bootstrap.
 *
 * The cases, each ended by a barrier through the transport itself
 * (tn_sync(): marks come after a rank's frames, in order):
 *
 *   sizes     every rank sends every size class (16 B .. 8 MiB, one frame
 *             each) to every rank, itself included; each arrives intact
 *   fifo      --senders threads per rank each send --count frames (16 B ..
 *             128 KiB) to every rank at once: every frame arrives, in order
 *             per (rank, thread), intact
 *   flood     every rank sends --flood frames of 1 MiB to every other rank
 *             while each acks every frame from its progress thread: all
 *             frames and all acks arrive (no deadlock of two full sockets)
 *   baddst    a send to rank world or UINT32_MAX fails with -EINVAL
 *   bye       the last rank closes (fini, which says BYE) and exits; every
 *             other rank hears on_peer_failed(last, -FERRY_E_PEER) once,
 *             a send to it then fails with -FERRY_E_PEER, and the others
 *             still exchange frames with each other and themselves
 *
 * Throughout: every handler runs on the progress thread, frames are 8-byte
 * aligned, no frame is torn, lost, reordered or repeated. One-sided read and
 * write run only where the transport has them (caps): tcp has none, and
 * rdma's need a device (none in a namespace here), so they stay the suite's.
 *
 * One line per rank: "ok" with each case's time, or "FAILED" with the case
 * and what differed; exit status 0 or 1 (2: bad usage).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "common/args.h"
#include "lib/core/bootstrap.h"
#include "lib/core/config.h"
#include "transport/transport.h"
#include "common/tnode.h"

#define MIB (1u << 20)

static const char usage[] =
	"usage: ferry-tp-check [--senders N] [--count N] [--flood N] [--wait-ms MS]\n"
	"  One rank of the transport suite's message cases across processes (one\n"
	"  per host or network namespace), configured by the environment like an\n"
	"  application (torchrun RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT or\n"
	"  FERRY_*; FERRY_TRANSPORT=tcp or rdma). Prints one line and exits 0 (ok)\n"
	"  or 1 (FAILED).\n"
	"  --senders N   threads per rank in the fifo case (default 4, at most 5)\n"
	"  --count N     frames each sends to each rank (default 500)\n"
	"  --flood N     frames of 1 MiB to each peer in the flood case (default 16)\n"
	"  --wait-ms MS  bound on each wait for frames (default 20000)\n"
	"  --version     print Ferry's version\n";

/* the sender ids that number frames (tnode.h): each case its own */
enum {
	SIZES_SENDER = 0,
	FIFO_SENDER0 = 1, /* .. FIFO_SENDER0 + senders - 1 */
	MAX_FIFO_SENDERS = 5,
	FLOOD_SENDER = 6,
	BYE_SENDER = 7,
};

struct run {
	struct tnode n;
	uint32_t rank, world, all; /* all: bit r for every rank */
	long senders, count, flood;
	int wait_ms;
	uint32_t round;		     /* tn_sync() rounds so far */
	uint64_t want[TN_MAX_NODES]; /* data frames rank r sent this one so far */
	char report[640];	     /* the "ok" line's details */
	size_t rlen;
};

static int failed(const struct run *r, const char *cs, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int failed(const struct run *r, const char *cs, const char *fmt, ...)
{
	char why[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	printf("ferry-tp-check: rank %u of %u: FAILED: %s: %s\n", r->rank, r->world, cs, why);
	fflush(stdout);
	return 1;
}

static void note(struct run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note(struct run *r, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (r->rlen >= sizeof(r->report))
		return;
	va_start(ap, fmt);
	w = vsnprintf(r->report + r->rlen, sizeof(r->report) - r->rlen, fmt, ap);
	va_end(ap);
	r->rlen += w > 0 ? (size_t)w : 0;
}

/* after a case: every frame the ranks in @live sent here came (and no more),
 * nothing bad was seen, and the barrier through the transport passed */
static int settle(struct run *r, const char *cs, uint32_t live)
{
	struct tnode *n = &r->n;
	char why[512];
	int ret;

	for (uint32_t src = 0; src < r->world; src++) {
		if (!(live & (1u << src)))
			continue;
		if (!WAIT_FOR(n, n->frames[src] >= r->want[src], r->wait_ms))
			return failed(r, cs, "%llu of %llu frames from rank %u after %d ms",
				      (unsigned long long)LOCKED(n, n->frames[src]),
				      (unsigned long long)r->want[src], src, r->wait_ms);
	}
	ret = tn_sync(n, live, ++r->round, r->wait_ms);
	if (ret)
		return failed(r, cs, "the barrier after it: %s", ferry_strerror(ret));
	/* each rank's mark follows the frames it sent in the case, before any of the next */
	for (uint32_t src = 0; src < r->world; src++)
		if ((live & (1u << src)) && LOCKED(n, n->frames_at_mark[src]) != r->want[src])
			return failed(r, cs, "%llu frames from rank %u, %llu sent",
				      (unsigned long long)LOCKED(n, n->frames_at_mark[src]), src,
				      (unsigned long long)r->want[src]);
	if (tn_clean(n, why, sizeof(why)))
		return failed(r, cs, "%s", why);
	return 0;
}

static int case_sizes(struct run *r)
{
	struct tnode *n = &r->n;
	int64_t t0 = tn_now_ms();
	uint64_t bytes = 0;
	int ret;

	for (size_t i = 0; i < tn_nsize_classes; i++)
		bytes += tn_size_classes[i];
	for (uint32_t dst = 0; dst < r->world; dst++)
		for (size_t i = 0; i < tn_nsize_classes; i++) {
			ret = tn_send_frame(n, dst, SIZES_SENDER, (uint32_t)i, tn_size_classes[i]);
			if (ret)
				return failed(r, "sizes", "send of %u bytes to rank %u: %s",
					      tn_size_classes[i], dst, ferry_strerror(ret));
		}
	for (uint32_t src = 0; src < r->world; src++)
		r->want[src] += tn_nsize_classes;
	for (uint32_t src = 0; src < r->world; src++) {
		/* before this rank's barrier mark no rank sends the next case's frames */
		if (!WAIT_FOR(n, n->frames[src] >= r->want[src], r->wait_ms))
			break; /* settle() says what is missing */
		if (LOCKED(n, n->bytes[src]) != bytes)
			return failed(r, "sizes", "%llu bytes from rank %u, %llu sent",
				      (unsigned long long)LOCKED(n, n->bytes[src]), src,
				      (unsigned long long)bytes);
	}
	if (settle(r, "sizes", r->all))
		return 1;
	note(r, "sizes: %zu frames of %u B .. %u MiB from each rank intact (%lld ms); ",
	     tn_nsize_classes, tn_size_classes[0], tn_size_classes[tn_nsize_classes - 1] / MIB,
	     (long long)(tn_now_ms() - t0));
	return 0;
}

static int case_fifo(struct run *r)
{
	struct tn_sender args[MAX_FIFO_SENDERS];
	struct tnode *n = &r->n;
	pthread_barrier_t go;
	int64_t t0 = tn_now_ms();
	int errors = 0, first = 0;
	long started = 0;

	pthread_barrier_init(&go, NULL, (unsigned)r->senders);
	for (long s = 0; s < r->senders; s++) {
		args[s] = (struct tn_sender){
			.n = n,
			.sender = FIFO_SENDER0 + (uint32_t)s,
			.count = (uint32_t)r->count,
			.go = &go,
		};
		if (pthread_create(&args[s].thread, NULL, tn_sender_main, &args[s]))
			break;
		started++;
	}
	if (started < r->senders) {
		/* the started ones wait at the barrier for the others, sending nothing; the
		 * process ends with them */
		return failed(r, "fifo", "pthread_create failed");
	}
	for (long s = 0; s < r->senders; s++) {
		pthread_join(args[s].thread, NULL);
		if (args[s].errors && !errors++)
			first = args[s].first_err;
	}
	pthread_barrier_destroy(&go);
	if (errors)
		return failed(r, "fifo", "%d senders had sends fail, the first with %s", errors,
			      ferry_strerror(first));
	for (uint32_t src = 0; src < r->world; src++)
		r->want[src] += (uint64_t)r->senders * (uint64_t)r->count;
	if (settle(r, "fifo", r->all))
		return 1;
	for (uint32_t src = 0; src < r->world; src++)
		for (long s = 0; s < r->senders; s++)
			if (LOCKED(n, n->next_seq[src][FIFO_SENDER0 + s]) != r->count)
				return failed(r, "fifo", "rank %u sender %ld: %u of %ld frames",
					      src, s, LOCKED(n, n->next_seq[src][FIFO_SENDER0 + s]),
					      r->count);
	note(r, "fifo: %ld threads x %ld frames to every rank at once, all in order (%lld ms); ",
	     r->senders, r->count, (long long)(tn_now_ms() - t0));
	return 0;
}

static int case_flood(struct run *r)
{
	struct tn_flood args[TN_MAX_NODES];
	struct tnode *n = &r->n;
	uint32_t started = 0;
	int64_t t0;
	int ret;

	if (r->world < 2 || !r->flood)
		return 0;
	pthread_mutex_lock(&n->lock);
	n->echo = 1;
	pthread_mutex_unlock(&n->lock);
	/* every rank acks before any floods */
	ret = tn_sync(n, r->all, ++r->round, r->wait_ms);
	if (ret)
		return failed(r, "flood", "the barrier before it: %s", ferry_strerror(ret));
	t0 = tn_now_ms();
	for (uint32_t dst = 0; dst < r->world; dst++) {
		if (dst == r->rank)
			continue;
		args[dst] = (struct tn_flood){
			.n = n,
			.dst = dst,
			.count = (uint32_t)r->flood,
			.len = MIB,
			.sender = FLOOD_SENDER,
		};
		if (pthread_create(&args[dst].thread, NULL, tn_flood_main, &args[dst]))
			break;
		started |= 1u << dst;
	}
	/* every thread started ends by itself: join them before anything else */
	for (uint32_t dst = 0; dst < r->world; dst++)
		if (started & (1u << dst))
			pthread_join(args[dst].thread, NULL);
	if (started != (r->all & ~(1u << r->rank)))
		return failed(r, "flood", "pthread_create failed");
	for (uint32_t dst = 0; dst < r->world; dst++)
		if (dst != r->rank && args[dst].errors)
			return failed(r, "flood", "%d sends to rank %u failed", args[dst].errors,
				      dst);
	for (uint32_t src = 0; src < r->world; src++) {
		if (src == r->rank)
			continue;
		r->want[src] += (uint64_t)r->flood;
		if (!WAIT_FOR(n,
			      n->frames[src] == r->want[src] && n->acks[src] == (uint64_t)r->flood,
			      r->wait_ms))
			return failed(r, "flood",
				      "%llu of %llu frames and %llu of %ld acks from rank %u after "
				      "%lld ms: stuck",
				      (unsigned long long)LOCKED(n, n->frames[src]),
				      (unsigned long long)r->want[src],
				      (unsigned long long)LOCKED(n, n->acks[src]), r->flood, src,
				      (long long)(tn_now_ms() - t0));
	}
	/* every frame to here came: nothing is left to ack */
	pthread_mutex_lock(&n->lock);
	n->echo = 0;
	pthread_mutex_unlock(&n->lock);
	if (settle(r, "flood", r->all))
		return 1;
	note(r, "flood: %ld x 1 MiB to every peer, all acked by the progress threads (%lld ms); ",
	     r->flood, (long long)(tn_now_ms() - t0));
	return 0;
}

static int case_baddst(struct run *r)
{
	int a = tn_send_frame(&r->n, r->world, 0, 0, 64);
	int b = tn_send_frame(&r->n, UINT32_MAX, 0, 0, 64);

	if (a != -EINVAL || b != -EINVAL)
		return failed(r, "baddst", "sends to rank %u and %u returned %d and %d, not %d",
			      r->world, UINT32_MAX, a, b, -EINVAL);
	note(r, "baddst: refused; ");
	return 0;
}

/* the last rank leaves; the others see it once, cannot send to it, and go on */
static int case_bye(struct run *r)
{
	const uint32_t last = r->world - 1;
	const uint32_t live = r->all & ~(1u << last);
	struct tnode *n = &r->n;
	int64_t t0;
	int ret;

	if (r->world < 2)
		return 0;
	if (r->rank == last) {
		tn_fini(n);
		usleep(100 * 1000);
		if (LOCKED(n, n->stops) != 1 || LOCKED(n, n->starts) != 1 ||
		    LOCKED(n, n->after_fini))
			return failed(r, "bye",
				      "the progress thread started %d and stopped %d times; %d "
				      "handler calls after fini()",
				      LOCKED(n, n->starts), LOCKED(n, n->stops),
				      LOCKED(n, n->after_fini));
		note(r, "bye: this rank left (fini said BYE; its progress thread stopped once, "
			"no handler after)");
		return 0;
	}
	t0 = tn_now_ms();
	if (!WAIT_FOR(n, n->failed[last] > 0, r->wait_ms))
		return failed(r, "bye", "never heard that rank %u left (%d ms)", last, r->wait_ms);
	if (LOCKED(n, n->failed_err[last]) != -FERRY_E_PEER)
		return failed(r, "bye", "rank %u failed with %s, not %s", last,
			      ferry_strerror(LOCKED(n, n->failed_err[last])),
			      ferry_strerror(-FERRY_E_PEER));
	usleep(300 * 1000);
	for (uint32_t src = 0; src < r->world; src++) {
		int want = src == last;

		if (LOCKED(n, n->failed[src]) != want)
			return failed(r, "bye", "on_peer_failed(%u) ran %d times, not %d", src,
				      LOCKED(n, n->failed[src]), want);
	}
	ret = tn_send_frame(n, last, BYE_SENDER, 0, 64);
	if (ret != -FERRY_E_PEER)
		return failed(r, "bye", "a send to rank %u, which left, returned %s, not %s", last,
			      ferry_strerror(ret), ferry_strerror(-FERRY_E_PEER));
	/* the others still talk: 100 frames to each, itself included */
	for (uint32_t dst = 0; dst < r->world; dst++) {
		if (!(live & (1u << dst)))
			continue;
		for (uint32_t i = 0; i < 100; i++) {
			ret = tn_send_frame(n, dst, BYE_SENDER, i, 64 + 8 * (i % 64));
			if (ret)
				return failed(r, "bye", "send to rank %u after rank %u left: %s",
					      dst, last, ferry_strerror(ret));
		}
		r->want[dst] += 100;
	}
	if (settle(r, "bye", live))
		return 1;
	note(r,
	     "bye: rank %u left: seen once (-FERRY_E_PEER) after %lld ms, a send to it "
	     "fails with -FERRY_E_PEER, the others go on",
	     last, (long long)(LOCKED(n, n->failed_ms[last]) - t0));
	return 0;
}

static const struct ferry_tp_ops *pick(enum ferry_transport_kind kind, const char **why_p)
{
	switch (kind) {
	case FERRY_TRANSPORT_AUTO:
	case FERRY_TRANSPORT_TCP:
		return &ferry__tcp_ops;
	case FERRY_TRANSPORT_RDMA:
#ifdef FERRY_HAVE_RDMA
		if (!ferry__rdma_ops.probe || !ferry__rdma_ops.probe(why_p))
			return &ferry__rdma_ops;
		return NULL;
#else
		*why_p = "this build has no RDMA transport";
		return NULL;
#endif
	case FERRY_TRANSPORT_LOOP:
		*why_p = "the loop transport's one-sided access works inside one process only";
		return NULL;
	}
	*why_p = "unknown transport";
	return NULL;
}

/* bootstrap and connect, as ferry_open() does: 0 or 1 after a FAILED line */
static int start(struct run *r, struct ferry_config *c)
{
	const struct ferry_tp_ops *ops;
	struct ferry_tp_config tcfg;
	struct ferry_addr mine, *addrs;
	const void *blobs[TN_MAX_NODES];
	size_t lens[TN_MAX_NODES];
	const char *why = "its probe failed";
	uint64_t cid;
	int ret;

	r->rank = (uint32_t)c->rank;
	r->world = (uint32_t)c->world;
	if (c->world > TN_MAX_NODES)
		return failed(r, "start", "a world of %d; this program runs at most %d ranks",
			      c->world, TN_MAX_NODES);
	r->all = (1u << r->world) - 1;
	ops = pick(c->transport, &why);
	if (!ops)
		return failed(r, "start", "no transport: %s (use FERRY_TRANSPORT=tcp)", why);
	tcfg = (struct ferry_tp_config){
		.rank = r->rank,
		.world = r->world,
		.bind_addr = c->bind_addr,
		.adv_addr = c->adv_addr,
		.busy_poll = c->busy_poll,
		.timeout_ms = c->timeout_ms,
	};
	ret = tn_start(&r->n, ops, &tcfg);
	if (ret)
		return failed(r, "start", "the %s transport did not start: %s", ops->name,
			      ferry_strerror(ret));
	memset(&mine, 0, sizeof(mine));
	memcpy(mine.buf, r->n.addr, r->n.addr_len);
	mine.len = (uint32_t)r->n.addr_len;
	addrs = calloc(r->world, sizeof(*addrs));
	if (!addrs)
		return failed(r, "start", "calloc");
	ret = ferry__bootstrap(c, &mine, addrs, &cid);
	if (ret) {
		free(addrs);
		return failed(r, "start", "the bootstrap: %s (the log says why)",
			      ferry_strerror(ret));
	}
	for (uint32_t i = 0; i < r->world; i++) {
		blobs[i] = addrs[i].buf;
		lens[i] = addrs[i].len;
	}
	r->n.tp->cfg.cluster_id = cid;
	ret = ops->connect(r->n.tp, blobs, lens);
	free(addrs);
	if (ret)
		return failed(r, "start", "connect: %s (the log says why)", ferry_strerror(ret));
	if (!WAIT_FOR(&r->n, r->n.starts == 1, r->wait_ms))
		return failed(r, "start", "the progress thread never started");
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "senders", required_argument, NULL, 's' },
		{ "count", required_argument, NULL, 'c' },
		{ "flood", required_argument, NULL, 'f' },
		{ "wait-ms", required_argument, NULL, 'w' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static struct run r = { .senders = 4, .count = 500, .flood = 16, .wait_ms = 20000 };
	struct ferry_config c;
	long wait_ms = r.wait_ms;
	int o, ret, bad;

	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
		case 'c':
		case 'f':
		case 'w':
			if (targ_num(optarg,
				     o == 's' ? 1 :
				     o == 'w' ? 100 :
						0,
				     o == 's' ? MAX_FIFO_SENDERS :
				     o == 'w' ? 600000 :
						100000,
				     o == 's' ? &r.senders :
				     o == 'c' ? &r.count :
				     o == 'f' ? &r.flood :
						&wait_ms)) {
				fprintf(stderr, "ferry-tp-check: bad value '%s'\n%s", optarg,
					usage);
				return 2;
			}
			break;
		case 'V':
			printf("ferry-tp-check (Ferry %s)\n", ferry_version());
			return 0;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ferry-tp-check: unexpected argument '%s'\n%s", argv[optind],
			usage);
		return 2;
	}
	r.wait_ms = (int)wait_ms;

	memset(&c, 0, sizeof(c));
	ret = ferry__config_resolve(NULL, &c);
	if (ret) {
		printf("ferry-tp-check: FAILED: the configuration: %s (the log says why)\n",
		       ferry_strerror(ret));
		return 1;
	}
	if (start(&r, &c)) {
		tn_fini(&r.n);
		return 1;
	}
	bad = case_sizes(&r) || case_fifo(&r) || case_flood(&r) || case_baddst(&r) || case_bye(&r);
	if (!bad)
		printf("ferry-tp-check: rank %u of %u over %s: ok: %s; one-sided: %s\n", r.rank,
		       r.world, r.n.ops->name, r.report,
		       r.n.ops->caps & (FERRY_TP_CAP_READ | FERRY_TP_CAP_WRITE) ?
			       "not run across processes (the suite runs it)" :
			       "none in this transport (caps 0), not run");
	fflush(stdout);
	tn_fini(&r.n);
	return bad;
}

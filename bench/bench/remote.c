/* SPDX-License-Identifier: MIT */
/*
 * remote.c - the remote scenario: rank 0 works on keys whose home and owner
 * is rank 1.
 *
 *   pull, push         one key, synchronous: p50 / p99 / p99.9 per operation
 *   pull-wN, push-wN   N requests in flight (async tickets, N distinct keys,
 *                      the oldest waited for first): operations per second
 *   pull-batchB, ...   one synchronous call on B keys: latency per call, keys/s
 *
 * The baseline of each row runs between the same two nodes: a raw TCP
 * ping-pong (latency rows: in rounds alternating with the row's own, so both
 * see the same load) or a stream with N in flight right after the row
 * (throughput rows), whose request and reply carry the bytes Ferry's own
 * frames carried for that operation, read off ferry_stats() around one
 * warm-up call. With perftest figures given (--baseline-file,
 * --baseline-cmd, --baseline-us), those are the latency baseline instead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fb.h"

#define REMOTE_KEYS 1024 /* keys per node in the table */

int fb_base_begin(struct fb_node *n, size_t req, size_t rep, long iters, int is_pull,
		  uint32_t bytes, struct fb_basemeter *m)
{
	const struct fb_opts *o = n->o;
	const struct fb_perftest *pt = NULL;
	struct fb_perftest cmd_pt = { 0 };
	int rc;

	memset(m, 0, sizeof(*m));
	m->rtt.fd = -1;
	if (o->given_us > 0) {
		snprintf(m->b.name, sizeof(m->b.name), "given");
		m->b.p50_us = o->given_us;
		m->b.p99_us = o->given_p99_us;
		return 0;
	}
	if (o->baseline_cmd) {
		rc = fb_perftest_cmd(o->baseline_cmd, bytes, o->pt_cycles, &cmd_pt);
		if (rc) {
			fb_failf(n->sh, "--baseline-cmd gave no perftest result for %u bytes",
				 bytes);
			return -1;
		}
		pt = &cmd_pt;
	} else if (o->pt_read.set || o->pt_write.set || o->pt_send.set || o->pt_events.set) {
		/*
		 * a pull is one READ; a message round trip is two one-way
		 * messages: SENDs (as Ferry's frames) when measured, else WRITEs;
		 * the blocking rows' floor sleeps on CQ events as they do
		 */
		if (is_pull)
			pt = o->pt_read.set ? &o->pt_read : NULL;
		else if (!o->busy_poll && o->pt_events.set)
			pt = &o->pt_events;
		else
			pt = o->pt_send.set ? &o->pt_send : o->pt_write.set ? &o->pt_write : NULL;
		if (!pt) /* only the other kind was given */
			pt = o->pt_read.set  ? &o->pt_read :
			     o->pt_send.set  ? &o->pt_send :
			     o->pt_write.set ? &o->pt_write :
					       &o->pt_events;
	}
	if (pt) {
		double k = pt->is_write ? 2 : 1;

		snprintf(m->b.name, sizeof(m->b.name), "%sib_%s_lat%s/%u", pt->is_write ? "2x" : "",
			 pt->is_send  ? "send" :
			 pt->is_write ? "write" :
					"read",
			 pt->events ? "-e" : "", pt->bytes);
		m->b.p50_us = pt->p50_us * k;
		m->b.p99_us = pt->p99_us * k;
		return 0;
	}
	/* a one-sided read sends no frame: compare with the value's bytes */
	if (req < 8)
		req = 8;
	if (rep < bytes)
		rep = bytes;
	m->cap = iters;
	m->lat = malloc((size_t)iters * sizeof(*m->lat));
	if (!m->lat)
		return -1;
	rc = fb_rtt_open(&m->rtt, n->raw_addr, n->raw_port, req, rep, o->busy_poll);
	if (!rc)
		rc = fb_rtt_run(&m->rtt, iters / 10 + 2, NULL);
	if (rc) {
		fb_failf(n->sh, "raw TCP ping-pong with %s:%d: %s", n->raw_addr, n->raw_port,
			 strerror(-rc));
		fb_rtt_close(&m->rtt);
		free(m->lat);
		m->lat = NULL;
		return -1;
	}
	m->live = 1;
	return 0;
}

int fb_base_chunk(struct fb_node *n, struct fb_basemeter *m, long k)
{
	int rc;

	if (!m->live)
		return 0;
	if (k > m->cap - m->n)
		k = m->cap - m->n;
	rc = fb_rtt_run(&m->rtt, k, m->lat + m->n);
	if (rc) {
		fb_failf(n->sh, "raw TCP ping-pong: %s", strerror(-rc));
		return -1;
	}
	m->n += k;
	return 0;
}

int fb_base_end(struct fb_node *n, struct fb_basemeter *m)
{
	int rc = 0;

	if (m->live) {
		/* whatever the chunks left out */
		if (m->n < m->cap)
			rc = fb_base_chunk(n, m, m->cap - m->n);
		if (!rc)
			fb_base_from_lat(&m->b, "tcp-pingpong", m->lat, m->n);
		fb_rtt_close(&m->rtt);
	}
	free(m->lat);
	m->lat = NULL;
	m->live = 0;
	return rc;
}

struct remote_frames {
	size_t req, rep; /* bytes rank 0 sent and received for one call */
};

static int remote_call(struct fb_node *n, struct ferry_table *t, int push, const uint64_t *keys,
		       size_t nk, float *buf)
{
	return push ? ferry_push(n->w, t, keys, nk, buf) : ferry_pull(n->w, t, keys, nk, buf);
}

/* one warm-up call, and the bytes it put on the wire */
static int remote_frames(struct fb_node *n, struct ferry_table *t, int push, const uint64_t *keys,
			 size_t nk, float *buf, struct remote_frames *f)
{
	struct ferry_stats a, b;
	int rc;

	ferry_stats(n->fy, &a);
	rc = remote_call(n, t, push, keys, nk, buf);
	ferry_stats(n->fy, &b);
	f->req = (size_t)(b.bytes_sent - a.bytes_sent);
	f->rep = (size_t)(b.bytes_recv - a.bytes_recv);
	return rc;
}

static int remote_sync(struct fb_node *n, struct ferry_table *t, uint32_t bytes, int push,
		       const uint64_t *keys, size_t nk, float *buf, struct remote_frames *f)
{
	const struct fb_opts *o = n->o;
	long iters = nk > 1 ? o->iters / 4 + FB_ROUNDS : o->iters;
	int64_t *lat = malloc((size_t)iters * sizeof(*lat));
	struct fb_result res = { 0 };
	struct fb_basemeter m;
	int64_t total = 0;
	long done = 0;
	int rc;

	if (!lat)
		return -1;
	rc = remote_frames(n, t, push, keys, nk, buf, f);
	for (long i = 0; i < iters / 10 && !rc; i++)
		rc = remote_call(n, t, push, keys, nk, buf);
	if (rc) {
		fb_fail(n, push ? "remote push" : "remote pull", rc);
		free(lat);
		return -1;
	}
	if (fb_base_begin(n, f->req, f->rep, iters, !push, bytes, &m)) {
		free(lat);
		return -1;
	}
	for (int round = 0; round < FB_ROUNDS && !rc; round++) {
		long end = iters * (round + 1) / FB_ROUNDS;

		for (long k = done; k < end && !rc; k++) {
			int64_t t0 = fb_now_ns();

			rc = remote_call(n, t, push, keys, nk, buf);
			lat[k] = fb_now_ns() - t0;
			total += lat[k];
		}
		if (!rc && fb_base_chunk(n, &m, end - done))
			rc = -EIO;
		done = end;
	}
	if (rc) {
		if (rc != -EIO)
			fb_fail(n, push ? "remote push" : "remote pull", rc);
		fb_base_end(n, &m);
		free(lat);
		return -1;
	}
	if (fb_base_end(n, &m)) {
		free(lat);
		return -1;
	}
	fb_sort(lat, (size_t)iters);
	snprintf(res.scenario, sizeof(res.scenario), "remote");
	if (nk > 1)
		snprintf(res.op, sizeof(res.op), "%s-batch%zu", push ? "push" : "pull", nk);
	else
		snprintf(res.op, sizeof(res.op), "%s", push ? "push" : "pull");
	res.value_bytes = bytes;
	res.threads = 1;
	res.keys = nk;
	fb_result_lat(&res, lat, (size_t)iters);
	/* keys per second: one call moves nk values */
	res.ops_per_s = total > 0 ? (double)iters * (double)nk * 1e9 / (double)total : 0;
	res.mb_per_s = res.ops_per_s * bytes / 1e6;
	snprintf(res.note, sizeof(res.note), "frames %zu/%zu B", f->req, f->rep);
	fb_result_base(&res, &m.b);
	fb_result_add(n->sh, &res);
	free(lat);
	return 0;
}

static int remote_window(struct fb_node *n, struct ferry_table *t, uint32_t bytes, int push,
			 const uint64_t *keys, int window, const struct remote_frames *f)
{
	const struct fb_opts *o = n->o;
	long count = o->iters * 2, warm = count / 10 + window, total = count + warm;
	uint32_t len = bytes / 4;
	float *bufs = calloc((size_t)window * len, sizeof(float));
	uint64_t *tickets = calloc((size_t)window, sizeof(*tickets));
	int64_t *start = calloc((size_t)window, sizeof(*start));
	int64_t *lat = malloc((size_t)count * sizeof(*lat));
	struct fb_result res = { 0 };
	int64_t t0 = 0, t1;
	long started = 0, done = 0;
	int rc = 0;

	if (!bufs || !tickets || !start || !lat) {
		rc = -ENOMEM;
		goto out;
	}
	/* slot i always carries key i: one request per key in flight */
	while (done < total && !rc) {
		if (started < total && started - done < window) {
			int s = (int)(started % window);

			start[s] = fb_now_ns();
			rc = push ? ferry_push_start(n->w, t, &keys[s], 1, bufs + (size_t)s * len,
						     &tickets[s]) :
				    ferry_pull_start(n->w, t, &keys[s], 1, bufs + (size_t)s * len,
						     &tickets[s]);
			started++;
			continue;
		}
		{
			int s = (int)(done % window);

			rc = ferry_wait(n->w, tickets[s]);
			t1 = fb_now_ns();
			if (done >= warm)
				lat[done - warm] = t1 - start[s];
			if (++done == warm)
				t0 = t1;
		}
	}
	/* collect what is still in flight after a failure */
	while (rc && done < started) {
		ferry_wait(n->w, tickets[done % window]);
		done++;
	}
	if (rc) {
		fb_fail(n, push ? "remote push_start/wait" : "remote pull_start/wait", rc);
		goto out;
	}
	t1 = fb_now_ns();
	fb_sort(lat, (size_t)count);
	snprintf(res.scenario, sizeof(res.scenario), "remote");
	snprintf(res.op, sizeof(res.op), "%s-w%d", push ? "push" : "pull", window);
	res.value_bytes = bytes;
	res.threads = 1;
	res.keys = (uint64_t)window;
	fb_result_lat(&res, lat, (size_t)count);
	res.ops_per_s = (double)count * 1e9 / (double)(t1 - t0);
	res.mb_per_s = res.ops_per_s * bytes / 1e6;
	snprintf(res.baseline, sizeof(res.baseline), "tcp-stream");
	if (o->given_us > 0 || o->baseline_cmd || o->pt_read.set || o->pt_write.set ||
	    o->pt_send.set || o->pt_events.set) {
		snprintf(res.baseline, sizeof(res.baseline), "none");
	} else {
		size_t req = f->req < 8 ? 8 : f->req, rep = f->rep < bytes ? bytes : f->rep;

		rc = fb_raw_stream(n->raw_addr, n->raw_port, req, rep, window, count, o->busy_poll,
				   &res.base_ops_per_s);
		if (rc) {
			fb_failf(n->sh, "raw TCP stream: %s", strerror(-rc));
			goto out;
		}
	}
	fb_result_add(n->sh, &res);
out:
	free(bufs);
	free(tickets);
	free(start);
	free(lat);
	return rc ? -1 : 0;
}

static int remote_size(struct fb_node *n, struct ferry_table *t, uint32_t bytes)
{
	const struct fb_opts *o = n->o;
	size_t nb = o->batch, maxw = 1, nk;
	uint64_t *keys;
	float *buf;
	struct remote_frames fpull, fpush;
	int bad = 0;

	for (int i = 0; i < o->nwindows; i++)
		if ((size_t)o->windows[i] > maxw)
			maxw = (size_t)o->windows[i];
	nk = nb > maxw ? nb : maxw;
	keys = malloc(nk * sizeof(*keys));
	buf = calloc(nk, bytes);
	if (!keys || !buf) {
		free(keys);
		free(buf);
		return -1;
	}
	if (fb_keys_homed(t, (uint64_t)n->world * REMOTE_KEYS, 1, 0, keys, nk) != nk) {
		fb_failf(n->sh, "remote: rank 1 is home of fewer than %zu keys", nk);
		bad = 1;
	}
	for (size_t i = 0; i < nk * bytes / 4; i++)
		buf[i] = 1e-7f;
	bad = bad || remote_sync(n, t, bytes, 0, keys, 1, buf, &fpull);
	bad = bad || remote_sync(n, t, bytes, 1, keys, 1, buf, &fpush);
	for (int i = 0; i < o->nwindows && !bad; i++) {
		bad = remote_window(n, t, bytes, 0, keys, o->windows[i], &fpull) ||
		      remote_window(n, t, bytes, 1, keys, o->windows[i], &fpush);
	}
	if (nb > 1 && !bad) {
		struct remote_frames fb;

		bad = remote_sync(n, t, bytes, 0, keys, nb, buf, &fb) ||
		      remote_sync(n, t, bytes, 1, keys, nb, buf, &fb);
	}
	free(keys);
	free(buf);
	return bad ? -1 : 0;
}

static int remote_node(struct fb_node *n)
{
	const struct fb_opts *o = n->o;
	int bad = 0;

	for (int si = 0; si < o->nsizes; si++) {
		struct ferry_table *t;

		if (fb_table_create(n, (uint64_t)n->world * REMOTE_KEYS, o->sizes[si], &t))
			return -1;
		if (n->rank == 0 && !bad)
			bad = remote_size(n, t, o->sizes[si]);
		if (fb_phase_end(n, 0))
			bad = 1;
		ferry_table_destroy(t);
	}
	return bad ? -1 : 0;
}

int fb_remote(const struct fb_opts *o, struct fb_shared *sh)
{
	return fb_cluster_run(o, sh, 2, remote_node, NULL, "remote");
}

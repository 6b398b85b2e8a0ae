/* SPDX-License-Identifier: MIT */
/*
 * raw.c - the baselines: what the same link does without Ferry.
 *
 *   rank 0 (client)                          rank 1 (fb_raw_srv thread)
 *   connect, TCP_NODELAY --- hdr{req,rep} -->  accept
 *   ping-pong: req bytes  ------------------>  read req bytes
 *              <------------------ rep bytes   write rep bytes
 *   stream:    the same with `window` requests in flight
 *   close    ------------------------------->  EOF: next connection
 *
 * Request and reply sizes are those of Ferry's own frames for the operation
 * measured beside it (the scenario reads them off ferry_stats), so the ratio
 * is Ferry's time over the raw round trip of the same bytes.
 *
 * Both sides wait as Ferry's do in the run compared (docs/benchmarks.md,
 * "Like for like"):
 *
 *                  client (as Ferry's worker)      server (as Ferry's progress thread)
 *   blocking       spins FB_RAW_SPIN_NS, then      blocks in recv (epoll_wait(-1))
 *                  blocks in poll
 *   --busy-poll    spins on non-blocking recv      spins on non-blocking recv
 *
 * perftest output (ib_read_lat, ib_write_lat) is parsed here too, for the
 * rdma transport: its "t_typical" is the p50. ib_write_lat reports half a
 * round trip; the caller doubles it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fb.h"

#define RAW_MAGIC 0x46425257u /* "FBRW" */

struct raw_hdr {
	uint32_t magic;
	uint32_t req;
	uint32_t rep;
	uint32_t pad;
};

struct fb_raw_srv {
	int lfd;
	int busy;
	atomic_int stop;
	pthread_t th;
};

enum raw_wait {
	RAW_BLOCK, /* blocking recv */
	RAW_SPIN,  /* non-blocking recv in a loop */
	RAW_HYBRID /* spin for FB_RAW_SPIN_NS, then block until the bytes come */
};

static int raw_read_full(int fd, void *buf, size_t len, enum raw_wait wait)
{
	int64_t spin_until = wait == RAW_HYBRID ? fb_now_ns() + FB_RAW_SPIN_NS : 0;
	char *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, wait == RAW_BLOCK ? 0 : MSG_DONTWAIT);

		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			if (wait == RAW_HYBRID && fb_now_ns() >= spin_until) {
				struct pollfd pfd = { .fd = fd, .events = POLLIN };

				poll(&pfd, 1, 1000);
			}
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n ? -errno : -ECONNRESET;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int raw_write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			struct pollfd pfd = { .fd = fd, .events = POLLOUT };

			poll(&pfd, 1, 100);
			continue;
		}
		if (n <= 0)
			return -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void raw_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void raw_serve_conn(struct fb_raw_srv *s, int fd)
{
	struct raw_hdr h;
	char *buf;
	size_t max;

	raw_nodelay(fd);
	if (raw_read_full(fd, &h, sizeof(h), RAW_BLOCK) || h.magic != RAW_MAGIC ||
	    h.req > (64u << 20) || h.rep > (64u << 20))
		return;
	max = h.req > h.rep ? h.req : h.rep;
	buf = calloc(1, max ? max : 1);
	if (!buf)
		return;
	for (;;) {
		if (raw_read_full(fd, buf, h.req, s->busy ? RAW_SPIN : RAW_BLOCK))
			break;
		if (raw_write_full(fd, buf, h.rep))
			break;
	}
	free(buf);
}

static void *raw_srv_main(void *arg)
{
	struct fb_raw_srv *s = arg;

	while (!atomic_load(&s->stop)) {
		struct pollfd pfd = { .fd = s->lfd, .events = POLLIN };
		int fd;

		if (poll(&pfd, 1, 50) <= 0)
			continue;
		fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		raw_serve_conn(s, fd);
		close(fd);
	}
	return NULL;
}

int fb_raw_srv_start(const char *addr, int busy, struct fb_raw_srv **srv_p, int *port_p)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	struct fb_raw_srv *s;
	int one = 1, rc;

	if (!addr || !*addr)
		sa.sin_addr.s_addr = htonl(INADDR_ANY);
	else if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->busy = busy;
	s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s->lfd < 0) {
		rc = -errno;
		goto err_free;
	}
	setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(s->lfd, 4) ||
	    getsockname(s->lfd, (struct sockaddr *)&sa, &sl)) {
		rc = -errno;
		goto err_close;
	}
	rc = pthread_create(&s->th, NULL, raw_srv_main, s);
	if (rc) {
		rc = -rc;
		goto err_close;
	}
	*port_p = ntohs(sa.sin_port);
	*srv_p = s;
	return 0;

err_close:
	close(s->lfd);
err_free:
	free(s);
	return rc;
}

void fb_raw_srv_stop(struct fb_raw_srv *s)
{
	if (!s)
		return;
	atomic_store(&s->stop, 1);
	pthread_join(s->th, NULL);
	close(s->lfd);
	free(s);
}

static int raw_connect(const char *addr, int port, size_t req, size_t rep)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct raw_hdr h = { .magic = RAW_MAGIC, .req = (uint32_t)req, .rep = (uint32_t)rep };
	int fd, rc;

	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		return -EINVAL;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		rc = -errno;
		close(fd);
		return rc;
	}
	raw_nodelay(fd);
	rc = raw_write_full(fd, &h, sizeof(h));
	if (rc) {
		close(fd);
		return rc;
	}
	return fd;
}

int fb_rtt_open(struct fb_rtt *r, const char *addr, int port, size_t req, size_t rep, int busy)
{
	size_t max = req > rep ? req : rep;

	memset(r, 0, sizeof(*r));
	r->fd = -1;
	r->buf = calloc(1, max ? max : 1);
	if (!r->buf)
		return -ENOMEM;
	r->fd = raw_connect(addr, port, req, rep);
	if (r->fd < 0) {
		int rc = r->fd;

		free(r->buf);
		r->buf = NULL;
		return rc;
	}
	r->req = req;
	r->rep = rep;
	r->busy = busy;
	return 0;
}

int fb_rtt_run(struct fb_rtt *r, long n, int64_t *lat)
{
	int rc = 0;

	for (long i = 0; i < n && !rc; i++) {
		int64_t t0 = fb_now_ns();

		rc = raw_write_full(r->fd, r->buf, r->req);
		if (!rc)
			rc = raw_read_full(r->fd, r->buf, r->rep, r->busy ? RAW_SPIN : RAW_HYBRID);
		if (lat)
			lat[i] = fb_now_ns() - t0;
	}
	return rc;
}

void fb_rtt_close(struct fb_rtt *r)
{
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
	free(r->buf);
	r->buf = NULL;
}

int fb_raw_stream(const char *addr, int port, size_t req, size_t rep, int window, long count,
		  int busy, double *ops_p)
{
	char *out = calloc(1, req ? req : 1), *in = calloc(1, rep ? rep : 1);
	long sent = 0, done = 0, warm = count / 10 + 1;
	size_t out_off = 0, in_off = 0;
	int64_t t0 = 0, idle_since = 0;
	int fd, rc = 0;

	if (!out || !in) {
		rc = -ENOMEM;
		goto out_free;
	}
	fd = raw_connect(addr, port, req, rep);
	if (fd < 0) {
		rc = fd;
		goto out_free;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	count += warm;
	while (done < count && !rc) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int want_out = sent < count && sent - done < window;
		ssize_t n;

		if (want_out)
			pfd.events |= POLLOUT;
		/*
		 * Blocking mode waits as a Ferry worker waits for its tickets: it
		 * tries without waiting, and sleeps in poll only once nothing moved
		 * for FB_RAW_SPIN_NS; --busy-poll never sleeps.
		 */
		if (!busy && idle_since && fb_now_ns() - idle_since >= FB_RAW_SPIN_NS) {
			if (poll(&pfd, 1, 1000) < 0 && errno != EINTR) {
				rc = -errno;
				break;
			}
			idle_since = 0;
		} else {
			pfd.revents = POLLIN | (want_out ? POLLOUT : 0);
		}
		long moved = sent + done;
		size_t offs = out_off + in_off;
		if ((pfd.revents & POLLOUT) && want_out) {
			n = send(fd, out + out_off, req - out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
			if (n > 0) {
				out_off += (size_t)n;
				if (out_off == req) {
					out_off = 0;
					sent++;
				}
			} else if (n < 0 && errno != EAGAIN && errno != EINTR) {
				rc = -errno;
			}
		}
		if (pfd.revents & (POLLIN | POLLERR | POLLHUP)) {
			n = recv(fd, in + in_off, rep - in_off, MSG_DONTWAIT);
			if (n > 0) {
				in_off += (size_t)n;
				if (in_off == rep) {
					in_off = 0;
					if (++done == warm)
						t0 = fb_now_ns();
				}
			} else if (n == 0) {
				rc = -ECONNRESET;
			} else if (errno != EAGAIN && errno != EINTR) {
				rc = -errno;
			}
		}
		if (sent + done != moved || out_off + in_off != offs)
			idle_since = 0;
		else if (!idle_since)
			idle_since = fb_now_ns();
	}
	if (!rc) {
		int64_t dt = fb_now_ns() - t0;

		*ops_p = dt > 0 ? (double)(count - warm) * 1e9 / (double)dt : 0;
	}
	close(fd);
out_free:
	free(out);
	free(in);
	return rc;
}

/* ---- perftest ----------------------------------------------------------- */

static double cpu_mhz(void)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	double mhz = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "cpu MHz", 7)) {
			char *c = strchr(line, ':');

			if (c)
				mhz = strtod(c + 1, NULL);
			break;
		}
	}
	fclose(f);
	return mhz;
}

/*
 * The result table of perftest's latency tests:
 *   #bytes #iterations t_min[usec] t_max[usec] t_typical[usec] t_avg[usec]
 *     t_stdev[usec] 99% percentile[usec] 99.9% percentile[usec]
 *   64     1000        29.10       ...
 * With -C the figures are cycles (the header may still say [usec]): they are
 * divided by the CPU's MHz.
 */
int fb_perftest_parse(const char *text, int force_cycles, struct fb_perftest *pt)
{
	const char *hdr = strstr(text, "#bytes");
	int col_typ = -1, col_99 = -1, ncol = 0, cycles = 0;
	double v[16], scale = 1;
	const char *p, *eol;
	char line[512];
	int n = 0;

	if (!hdr)
		return -ENOENT;
	pt->is_send = strstr(text, "Send Latency") ? 1 : 0;
	pt->is_write = strstr(text, "RDMA_Write") || pt->is_send ? 1 : 0;
	eol = strchr(hdr, '\n');
	if (!eol)
		return -ENOENT;
	snprintf(line, sizeof(line), "%.*s", (int)(eol - hdr), hdr);
	cycles = force_cycles || strstr(line, "[cycles]") != NULL;
	/* the two-word "99% percentile[...]" headers count as one column */
	for (char *tok = strtok(line, " \t"); tok; tok = strtok(NULL, " \t")) {
		if (!strncmp(tok, "percentile", 10))
			continue;
		if (!strncmp(tok, "t_typical", 9))
			col_typ = ncol;
		else if (!strcmp(tok, "99%"))
			col_99 = ncol;
		ncol++;
	}
	if (col_typ < 0)
		return -ENOENT;
	for (p = eol + 1; *p; p = eol + 1) {
		char *end;

		eol = strchr(p, '\n');
		if (!eol)
			eol = p + strlen(p);
		n = 0;
		snprintf(line, sizeof(line), "%.*s", (int)(eol - p), p);
		for (char *s = line; n < 16;) {
			double d = strtod(s, &end);

			if (end == s)
				break;
			v[n++] = d;
			s = end;
		}
		if (n > col_typ && n >= 3)
			break;
		n = 0;
		if (!*eol)
			break;
	}
	if (n <= col_typ)
		return -ENOENT;
	if (cycles) {
		double mhz = cpu_mhz();

		if (mhz <= 0)
			return -ENOENT;
		scale = 1.0 / mhz;
	}
	pt->bytes = (uint32_t)v[0];
	pt->p50_us = v[col_typ] * scale;
	pt->p99_us = col_99 >= 0 && col_99 < n ? v[col_99] * scale : 0;
	pt->set = pt->p50_us > 0;
	return pt->set ? 0 : -ENOENT;
}

static char *slurp(FILE *f)
{
	size_t cap = 8192, len = 0;
	char *buf = malloc(cap);

	while (buf) {
		size_t n = fread(buf + len, 1, cap - len - 1, f);

		len += n;
		if (len + 1 < cap)
			break;
		cap *= 2;
		char *nb = realloc(buf, cap);

		if (!nb) {
			free(buf);
			return NULL;
		}
		buf = nb;
	}
	if (buf)
		buf[len] = '\0';
	return buf;
}

int fb_perftest_file(const char *path, int cycles, struct fb_perftest *pt)
{
	FILE *f = fopen(path, "r");
	char *text;
	int rc;

	if (!f)
		return -errno;
	text = slurp(f);
	fclose(f);
	if (!text)
		return -ENOMEM;
	rc = fb_perftest_parse(text, cycles, pt);
	free(text);
	if (!rc)
		snprintf(pt->source, sizeof(pt->source), "%s", path);
	return rc;
}

int fb_perftest_cmd(const char *cmd, uint32_t bytes, int cycles, struct fb_perftest *pt)
{
	char buf[1024], num[16];
	const char *p = cmd, *m;
	size_t off = 0;
	char *text;
	FILE *f;
	int rc;

	snprintf(num, sizeof(num), "%u", bytes);
	while ((m = strstr(p, "{bytes}")) && off < sizeof(buf)) {
		off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%.*s%s", (int)(m - p), p,
					num);
		p = m + 7;
	}
	if (off < sizeof(buf))
		off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%s", p);
	if (off >= sizeof(buf))
		return -E2BIG;
	f = popen(buf, "r");
	if (!f)
		return -errno;
	text = slurp(f);
	rc = pclose(f);
	if (!text)
		return -ENOMEM;
	if (rc)
		fprintf(stderr, "ferry-bench: baseline command exited with status %d: %s\n", rc,
			buf);
	rc = fb_perftest_parse(text, cycles, pt);
	free(text);
	if (!rc)
		snprintf(pt->source, sizeof(pt->source), "cmd");
	return rc;
}

/* SPDX-License-Identifier: MIT */
/*
 * etcdsrv.c - a real etcd for a test (etcdsrv.h).
 */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef FERRY_HAVE_ETCD
#include <curl/curl.h>
#endif

#include "common/etcdsrv.h"

int64_t ed_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ed_free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

void ed_skip_unless_available(void)
{
#ifndef FERRY_HAVE_ETCD
	cr_skip_test("libferry was built without libcurl: no etcd manager");
#endif
	if (system("command -v etcd >/dev/null 2>&1"))
		cr_skip_test("no etcd binary (Debian: etcd-server; bash ci/deps.sh build)");
}

#ifdef FERRY_HAVE_ETCD
static size_t ed_sink(char *p, size_t sz, size_t n, void *arg)
{
	struct {
		char b[4096];
		size_t len;
	} *o = arg;
	size_t len = sz * n, room = sizeof(o->b) - 1 - o->len;

	memcpy(o->b + o->len, p, len < room ? len : room);
	o->len += len < room ? len : room;
	o->b[o->len] = 0;
	return len;
}

/* POST @body to @path of the test's etcd; the HTTP code, the answer in @out */
long ed_post(const struct etcd_srv *s, const char *path, const char *body, char *out, size_t outlen)
{
	struct {
		char b[4096];
		size_t len;
	} o = { .len = 0 };
	char url[128];
	long code = 0;
	CURL *h = curl_easy_init();

	snprintf(url, sizeof(url), "%s%s", s->url, path);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, ed_sink);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &o);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
	if (curl_easy_perform(h) == CURLE_OK)
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_cleanup(h);
	if (out)
		snprintf(out, outlen, "%s", o.b);
	return code;
}

#endif

/* start etcd on @s's folder and ports and wait until it answers */
void ed_spawn(struct etcd_srv *s)
{
	char log[96], cluster[128];
	int64_t deadline;

	snprintf(cluster, sizeof(cluster), "ferrytest=%s", s->purl);
	snprintf(log, sizeof(log), "%s/etcd.log", s->dir);
	s->pid = fork();
	cr_assert_geq(s->pid, 0);
	if (s->pid == 0) {
		/* never outlive the test process, even when an assertion ends it */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (!freopen(log, "a", stdout) || !freopen(log, "a", stderr))
			_exit(126);
		execlp("etcd", "etcd", "--name", "ferrytest", "--data-dir", s->dir,
		       "--listen-client-urls", s->url, "--advertise-client-urls", s->url,
		       "--listen-peer-urls", s->purl, "--initial-advertise-peer-urls", s->purl,
		       "--initial-cluster", cluster, (char *)NULL);
		_exit(127);
	}
	deadline = ed_now_ms() + 15000;
#ifdef FERRY_HAVE_ETCD
	while (ed_post(s, "/v3/kv/range", "{\"key\":\"AA==\"}", NULL, 0) != 200) {
		cr_assert_lt(ed_now_ms(), deadline, "etcd did not come up in 15 s (see %s)", log);
		cr_assert_eq(waitpid(s->pid, NULL, WNOHANG), 0, "etcd exited (see %s)", log);
		usleep(50000);
	}
#else
	(void)deadline;
#endif
}

void ed_up(struct etcd_srv *s)
{
	snprintf(s->dir, sizeof(s->dir), "/tmp/ferry-etcd-XXXXXX");
	cr_assert(mkdtemp(s->dir));
	snprintf(s->url, sizeof(s->url), "http://127.0.0.1:%d", ed_free_port());
	snprintf(s->purl, sizeof(s->purl), "http://127.0.0.1:%d", ed_free_port());
	ed_spawn(s);
}

/* stop etcd (SIGTERM, SIGKILL after 5 s) and reap it; the folder stays */
void ed_stop(struct etcd_srv *s)
{
	int64_t deadline = ed_now_ms() + 5000;

	kill(s->pid, SIGTERM);
	while (waitpid(s->pid, NULL, WNOHANG) == 0) {
		if (ed_now_ms() > deadline) {
			kill(s->pid, SIGKILL);
			waitpid(s->pid, NULL, 0);
			break;
		}
		usleep(20000);
	}
}

void ed_down(struct etcd_srv *s)
{
	char cmd[128];

	ed_stop(s);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", s->dir);
	cr_assert_eq(system(cmd), 0);
}

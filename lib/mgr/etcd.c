/* SPDX-License-Identifier: MIT */
/*
 * etcd.c - the etcd membership manager (mgr.h), through etcd's v3 API as
 * its JSON gateway serves it (libcurl for HTTP, jansson for JSON).
 *
 *   <prefix>/<cluster id, 16 hex>/members/<rank, 8 digits>
 *       = {"rank": r, "world": w, "pid": p, "host": h}, attached to the
 *         node's lease (TTL = params.etcd_ttl seconds)
 *
 *   start (ferry_open, after the rendezvous gave the cluster id)
 *     lease/grant {TTL} -> ID          (an endpoint that refuses: the next;
 *                                       none: the error, with the URLs)
 *     kv/put {key, value, lease: ID}
 *     kv/range over the prefix until every rank's key is there (bounded by
 *       the node's timeout; the missing ranks named) -> epoch = revision
 *   the manager's thread (one per node), a curl multi handle:
 *     lease/keepalive {ID} every TTL/3 s
 *     watch {create_request: prefix, start_revision = epoch + 1}: a stream
 *       of JSON lines; a DELETE of rank r's key (its lease ended: r stopped
 *       renewing) -> epoch = its revision, cfg->declare_dead(r)
 *     a watch that ends (etcd restarted, compaction): range again (a key
 *       gone meanwhile is a death too), then watch from that revision + 1
 *   ferry_close: wake the thread and join it (quiesce: no departure is
 *     declared any more), close the node (its goodbye reaches the others
 *     first), then lease/revoke {ID} (leave), so the key goes at once
 *
 * Gateway prefix: etcd 3.4 (Debian 12) serves /v3/ and /v3beta/; 3.3 only
 * /v3beta/, 3.5 only /v3/. The first request tries /v3/ and falls back to
 * /v3beta/ on a 404. etcd's JSON carries 64-bit integers as strings.
 *
 * Bounds: one watch line is at most 16 MiB (a longer one ends the watch,
 * which starts again); the thread holds two requests at most.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "lib/core/core.h"
#include "lib/mgr/mgr.h"

#define ETCD_LINE_MAX (16u << 20)
#define ETCD_REQ_TIMEOUT_MS 5000
#define ETCD_CONNECT_TIMEOUT_MS 2000
#define ETCD_MAX_ENDPOINTS 16

struct etcd_buf {
	char *p;
	size_t len, cap;
	bool overflow;
};

struct etcd {
	struct ferry *fy;
	int (*declare_dead)(struct ferry *fy, uint32_t rank, uint64_t epoch);
	char *eps[ETCD_MAX_ENDPOINTS];
	int neps, cur;	 /* the endpoint in use */
	const char *api; /* "/v3" or "/v3beta" */
	int ttl;
	char prefix[256]; /* ".../members/" */
	char *pfx_b64, *end_b64;
	char lease[32]; /* the lease ID, decimal */
	uint64_t epoch; /* atomic */
	bool *gone;	/* per rank: declared (the thread) */
	pthread_t th;
	bool th_started;
	bool stop; /* atomic */
	CURLM *multi;
	/* the thread's requests */
	CURL *ka, *watch;
	struct etcd_buf ka_buf, watch_buf;
	struct curl_slist *hdrs;
	char *watch_body;
	int64_t watch_from; /* the watch's start revision */
	bool lease_lost_logged;
	bool ka_failing;    /* renewals fail now (logged once) */
	bool watch_failing; /* the watch ended, no line since (logged once) */
};

static int64_t etcd_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- base64 (etcd's keys and values are bytes) -------------------------- */

static const char b64_abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_enc(const char *s, size_t n)
{
	char *o = malloc(4 * ((n + 2) / 3) + 1), *q = o;

	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)(uint8_t)s[i] << 16;

		if (i + 1 < n)
			v |= (uint32_t)(uint8_t)s[i + 1] << 8;
		if (i + 2 < n)
			v |= (uint8_t)s[i + 2];
		*q++ = b64_abc[v >> 18 & 63];
		*q++ = b64_abc[v >> 12 & 63];
		*q++ = i + 1 < n ? b64_abc[v >> 6 & 63] : '=';
		*q++ = i + 2 < n ? b64_abc[v & 63] : '=';
	}
	*q = 0;
	return o;
}

/* decode into @out (at most @cap - 1 bytes, NUL-terminated); -1 if bad */
static int b64_dec(const char *s, char *out, size_t cap)
{
	size_t n = 0;
	uint32_t v = 0;
	int bits = 0;

	for (; *s && *s != '='; s++) {
		const char *c = strchr(b64_abc, *s);

		if (!c)
			return -1;
		v = v << 6 | (uint32_t)(c - b64_abc);
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			if (n + 1 >= cap)
				return -1;
			out[n++] = (char)(v >> bits & 0xff);
		}
	}
	out[n] = 0;
	return (int)n;
}

/* ---- requests ------------------------------------------------------------ */

static size_t etcd_collect(char *p, size_t sz, size_t n, void *arg)
{
	struct etcd_buf *b = arg;
	size_t len = sz * n;

	if (b->len + len + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *q;

		while (cap < b->len + len + 1)
			cap *= 2;
		if (cap > ETCD_LINE_MAX + 4096 || !(q = realloc(b->p, cap))) {
			b->overflow = true;
			return 0; /* curl fails the transfer */
		}
		b->p = q;
		b->cap = cap;
	}
	memcpy(b->p + b->len, p, len);
	b->len += len;
	b->p[b->len] = 0;
	return len;
}

static CURL *etcd_easy(struct etcd *e, const char *path, const char *body, struct etcd_buf *b,
		       long timeout_ms)
{
	char url[512];
	CURL *h = curl_easy_init();

	if (!h)
		return NULL;
	snprintf(url, sizeof(url), "%s%s%s", e->eps[e->cur], e->api, path);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_COPYPOSTFIELDS, body);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, e->hdrs);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, etcd_collect);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)ETCD_CONNECT_TIMEOUT_MS);
	if (timeout_ms)
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
	return h;
}

static int etcd_curl_errno(CURLcode c)
{
	switch (c) {
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_COULDNT_RESOLVE_HOST:
		return -EHOSTUNREACH;
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	case CURLE_OUT_OF_MEMORY:
		return -ENOMEM;
	default:
		return -EIO;
	}
}

/*
 * POST @req (consumed) to @path and parse the answer into *@resp_p. Tries
 * each endpoint once, from the one in use; the first request also finds the
 * gateway's prefix. Return: 0; -ECONNREFUSED, -ETIMEDOUT, ... (the last
 * endpoint's, with *@why_p its description); -EPROTO (an answer that is not
 * a 200 with JSON).
 */
static int etcd_call(struct etcd *e, const char *path, json_t *req, json_t **resp_p, char *why,
		     size_t whylen)
{
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	int rc = -ENOMEM;

	json_decref(req);
	if (!body)
		return rc;
	for (int tries = 0; tries < e->neps; tries++) {
		struct etcd_buf b = { 0 };
		long code = 0;
		CURLcode c;
		CURL *h = etcd_easy(e, path, body, &b, ETCD_REQ_TIMEOUT_MS);

		if (!h)
			break;
		c = curl_easy_perform(h);
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
		curl_easy_cleanup(h);
		if (c == CURLE_OK && code == 404 && !strcmp(e->api, "/v3")) {
			free(b.p);
			e->api = "/v3beta"; /* etcd 3.3 */
			tries--;
			continue;
		}
		if (c != CURLE_OK) {
			rc = etcd_curl_errno(c);
			snprintf(why, whylen, "%s: %s", e->eps[e->cur], curl_easy_strerror(c));
			free(b.p);
			e->cur = (e->cur + 1) % e->neps;
			continue;
		}
		if (code != 200 || !b.p || !(*resp_p = json_loads(b.p, 0, NULL))) {
			snprintf(why, whylen, "%s%s%s: HTTP %ld: %.200s", e->eps[e->cur], e->api,
				 path, code, b.p ? b.p : "(no body)");
			free(b.p);
			rc = -EPROTO;
			break;
		}
		free(b.p);
		rc = 0;
		break;
	}
	free(body);
	return rc;
}

/* an int64 that etcd sends as a string (or a number); -1 when absent */
static int64_t etcd_int(json_t *v)
{
	if (json_is_integer(v))
		return json_integer_value(v);
	if (json_is_string(v))
		return strtoll(json_string_value(v), NULL, 10);
	return -1;
}

static int64_t etcd_revision(json_t *resp)
{
	return etcd_int(json_object_get(json_object_get(resp, "header"), "revision"));
}

/* the rank a key of the prefix names, or -1 */
static int64_t etcd_key_rank(struct etcd *e, const char *key_b64)
{
	char key[512], *end;
	size_t pl = strlen(e->prefix);
	long long r;

	if (!key_b64 || b64_dec(key_b64, key, sizeof(key)) < 0 || strncmp(key, e->prefix, pl))
		return -1;
	errno = 0;
	r = strtoll(key + pl, &end, 10);
	if (errno || *end || end == key + pl || r < 0 || r >= e->fy->world)
		return -1;
	return r;
}

static void etcd_epoch_at_least(struct etcd *e, int64_t rev)
{
	uint64_t cur = __atomic_load_n(&e->epoch, __ATOMIC_RELAXED);

	while (rev > 0 && (uint64_t)rev > cur &&
	       !__atomic_compare_exchange_n(&e->epoch, &cur, (uint64_t)rev, 0, __ATOMIC_RELEASE,
					    __ATOMIC_RELAXED))
		;
}

/* the manager's thread: @rank's key went at @rev */
static void etcd_gone(struct etcd *e, uint32_t rank, int64_t rev)
{
	int rc;

	if (rank == e->fy->rank || e->gone[rank])
		return;
	e->gone[rank] = true;
	etcd_epoch_at_least(e, rev);
	ferry_info("membership: etcd: rank %u's key is gone at revision %lld (its lease of %d s "
		   "ended: it stopped renewing)",
		   rank, (long long)rev, e->ttl);
	rc = e->declare_dead(e->fy, rank, (uint64_t)rev);
	if (rc)
		ferry_err("membership: could not hand rank %u's death to the progress thread: %s",
			  rank, ferry_strerror(rc));
}

/*
 * kv/range over the prefix. @present: per rank, set when its key is there.
 * Return: the count of ranks present and *@rev_p the revision, or a
 * negative errno (@why says).
 */
static int etcd_range(struct etcd *e, bool *present, int64_t *rev_p, char *why, size_t whylen)
{
	json_t *resp = NULL, *kvs;
	size_t i;
	int rc, n = 0;

	rc = etcd_call(e, "/kv/range",
		       json_pack("{s:s, s:s, s:b}", "key", e->pfx_b64, "range_end", e->end_b64,
				 "keys_only", 1),
		       &resp, why, whylen);
	if (rc)
		return rc;
	memset(present, 0, e->fy->world * sizeof(*present));
	kvs = json_object_get(resp, "kvs");
	for (i = 0; json_is_array(kvs) && i < json_array_size(kvs); i++) {
		int64_t r = etcd_key_rank(
			e, json_string_value(json_object_get(json_array_get(kvs, i), "key")));

		if (r >= 0 && !present[r]) {
			present[r] = true;
			n++;
		}
	}
	*rev_p = etcd_revision(resp);
	json_decref(resp);
	return n;
}

/* ---- the manager's thread ------------------------------------------------ */

static void etcd_watch_line(struct etcd *e, const char *line)
{
	json_t *j = json_loads(line, 0, NULL), *res, *evs;
	int64_t rev;

	if (!j)
		return;
	if (e->watch_failing)
		ferry_warn("membership: etcd: watching %s again from revision %lld", e->prefix,
			   (long long)e->watch_from);
	e->watch_failing = false;
	res = json_object_get(j, "result");
	rev = etcd_revision(res);
	if (json_is_true(json_object_get(res, "canceled"))) {
		ferry_warn("membership: etcd canceled the watch on %s (%s); watching again",
			   e->prefix,
			   json_string_value(json_object_get(res, "cancel_reason")) ?: "compacted");
		e->watch_from = 0; /* range again */
	}
	evs = json_object_get(res, "events");
	for (size_t i = 0; json_is_array(evs) && i < json_array_size(evs); i++) {
		json_t *ev = json_array_get(evs, i), *kv = json_object_get(ev, "kv");
		const char *type = json_string_value(json_object_get(ev, "type"));
		int64_t r = etcd_key_rank(e, json_string_value(json_object_get(kv, "key")));
		int64_t mod = etcd_int(json_object_get(kv, "mod_revision"));

		if (mod > 0 && mod + 1 > e->watch_from)
			e->watch_from = mod + 1;
		if (r >= 0 && type && !strcmp(type, "DELETE"))
			etcd_gone(e, (uint32_t)r, mod > 0 ? mod : rev);
	}
	json_decref(j);
}

static size_t etcd_watch_data(char *p, size_t sz, size_t n, void *arg)
{
	struct etcd *e = arg;
	struct etcd_buf *b = &e->watch_buf;
	size_t len = sz * n;
	char *nl;

	if (etcd_collect(p, sz, n, b) != len)
		return 0;
	while ((nl = memchr(b->p, '\n', b->len))) {
		*nl = 0;
		etcd_watch_line(e, b->p);
		b->len -= (size_t)(nl + 1 - b->p);
		memmove(b->p, nl + 1, b->len);
		b->p[b->len] = 0;
	}
	if (b->len > ETCD_LINE_MAX)
		return 0;
	return len;
}

/* range, declare whoever is gone, and watch from there */
static void etcd_watch_start(struct etcd *e)
{
	bool *present = calloc(e->fy->world, sizeof(*present));
	char why[512] = "", *body;
	int64_t rev = 0;
	json_t *req;
	int n;

	if (!present)
		return;
	if (e->watch_from <= 0) {
		n = etcd_range(e, present, &rev, why, sizeof(why));
		if (n < 0) {
			free(present);
			return; /* etcd unreachable: try again later */
		}
		for (uint32_t r = 0; r < e->fy->world; r++)
			if (!present[r])
				etcd_gone(e, r, rev);
		e->watch_from = rev + 1;
	}
	free(present);
	req = json_pack("{s:{s:s, s:s, s:I}}", "create_request", "key", e->pfx_b64, "range_end",
			e->end_b64, "start_revision", (json_int_t)e->watch_from);
	body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	if (!body)
		return;
	e->watch_buf.len = 0;
	e->watch_buf.overflow = false;
	e->watch = etcd_easy(e, "/watch", body, &e->watch_buf, 0);
	free(body);
	if (!e->watch)
		return;
	curl_easy_setopt(e->watch, CURLOPT_WRITEFUNCTION, etcd_watch_data);
	curl_easy_setopt(e->watch, CURLOPT_WRITEDATA, e);
	curl_multi_add_handle(e->multi, e->watch);
}

static void etcd_ka_done(struct etcd *e, CURLcode c)
{
	json_t *j = NULL;
	long code = 0;

	curl_easy_getinfo(e->ka, CURLINFO_RESPONSE_CODE, &code);
	if (c == CURLE_OK && code == 200 && e->ka_buf.p)
		j = json_loads(e->ka_buf.p, 0, NULL);
	if (j) {
		int64_t ttl = etcd_int(json_object_get(json_object_get(j, "result"), "TTL"));

		if (ttl <= 0 && !e->lease_lost_logged) {
			e->lease_lost_logged = true;
			ferry_err(
				"membership: etcd: rank %u's lease %s expired before it was "
				"renewed (the process was stopped or cut off for more than %d s): "
				"the other nodes have declared it failed; close it and start a "
				"replacement",
				e->fy->rank, e->lease, e->ttl);
		}
		json_decref(j);
		if (e->ka_failing)
			ferry_warn("membership: etcd: rank %u's lease renewed again at %s",
				   e->fy->rank, e->eps[e->cur]);
		e->ka_failing = false;
	} else {
		/* once per outage: a renewal is tried every third of the TTL */
		if (!e->ka_failing)
			ferry_warn("membership: etcd: renewing rank %u's lease at %s failed (%s, "
				   "HTTP %ld); trying again every %d ms, and the next endpoint",
				   e->fy->rank, e->eps[e->cur], curl_easy_strerror(c), code,
				   e->ttl * 1000 / 3);
		e->ka_failing = true;
		e->cur = (e->cur + 1) % e->neps;
	}
}

static void *etcd_thread(void *arg)
{
	struct etcd *e = arg;
	int64_t next_ka = etcd_now_ms() + e->ttl * 1000 / 3, next_watch = 0;
	char body[64];

	snprintf(body, sizeof(body), "{\"ID\":\"%s\"}", e->lease);
	while (!__atomic_load_n(&e->stop, __ATOMIC_ACQUIRE)) {
		int64_t now = etcd_now_ms(), wait;
		struct CURLMsg *msg;
		int running, left;

		if (!e->ka && now >= next_ka) {
			e->ka_buf.len = 0;
			e->ka = etcd_easy(e, "/lease/keepalive", body, &e->ka_buf,
					  e->ttl * 1000 / 3 > 0 ? e->ttl * 1000 / 3 : 300);
			if (e->ka)
				curl_multi_add_handle(e->multi, e->ka);
			next_ka = now + e->ttl * 1000 / 3;
		}
		if (!e->watch && now >= next_watch) {
			etcd_watch_start(e);
			next_watch = now + 250;
		}
		curl_multi_perform(e->multi, &running);
		while ((msg = curl_multi_info_read(e->multi, &left))) {
			CURL *h = msg->easy_handle;

			if (msg->msg != CURLMSG_DONE)
				continue;
			curl_multi_remove_handle(e->multi, h);
			if (h == e->ka) {
				etcd_ka_done(e, msg->data.result);
				e->ka = NULL;
			} else if (h == e->watch) {
				/* once per outage; every 250 ms it is tried again */
				if (!__atomic_load_n(&e->stop, __ATOMIC_ACQUIRE) &&
				    !e->watch_failing)
					ferry_warn("membership: etcd: the watch on %s ended (%s); "
						   "watching again from revision %lld",
						   e->prefix, curl_easy_strerror(msg->data.result),
						   (long long)e->watch_from);
				e->watch_failing = true;
				e->watch = NULL;
				next_watch = etcd_now_ms() + 250;
			}
			curl_easy_cleanup(h);
		}
		wait = (e->ka ? 1000 : next_ka - etcd_now_ms());
		if (!e->watch && next_watch - etcd_now_ms() < wait)
			wait = next_watch - etcd_now_ms();
		if (wait < 1)
			wait = 1;
		if (wait > 1000)
			wait = 1000;
		curl_multi_poll(e->multi, NULL, 0, (int)wait, NULL);
	}
	return NULL;
}

/* ---- start and stop ------------------------------------------------------ */

static void etcd_free(struct etcd *e)
{
	if (e->ka) {
		curl_multi_remove_handle(e->multi, e->ka);
		curl_easy_cleanup(e->ka);
	}
	if (e->watch) {
		curl_multi_remove_handle(e->multi, e->watch);
		curl_easy_cleanup(e->watch);
	}
	if (e->multi)
		curl_multi_cleanup(e->multi);
	curl_slist_free_all(e->hdrs);
	for (int i = 0; i < e->neps; i++)
		free(e->eps[i]);
	free(e->pfx_b64);
	free(e->end_b64);
	free(e->ka_buf.p);
	free(e->watch_buf.p);
	free(e->gone);
	free(e);
}

static int etcd_endpoints(struct etcd *e, const char *list)
{
	const char *s = list;

	while (*s) {
		size_t n = strcspn(s, ",");
		char *ep;

		if (n) {
			if (e->neps == ETCD_MAX_ENDPOINTS || !(ep = strndup(s, n)))
				return -EINVAL;
			while (n && ep[n - 1] == '/')
				ep[--n] = 0;
			if (strncmp(ep, "http://", 7) && strncmp(ep, "https://", 8)) {
				ferry_err("membership: etcd endpoint '%s' is not an http:// or "
					  "https:// URL (FERRY_ETCD_ENDPOINTS: "
					  "http://host:port[,http://host:port...])",
					  ep);
				free(ep);
				return -EINVAL;
			}
			e->eps[e->neps++] = ep;
		}
		s += n;
		if (*s == ',')
			s++;
	}
	if (!e->neps) {
		ferry_err("membership: no etcd endpoint in '%s'", list);
		return -EINVAL;
	}
	return 0;
}

/* wait until every rank's key is there; the epoch is that revision */
static int etcd_wait_members(struct etcd *e, char *why, size_t whylen)
{
	uint32_t world = e->fy->world;
	bool *present = calloc(world, sizeof(*present));
	int64_t deadline = etcd_now_ms() + e->fy->timeout_ms, rev = 0;
	int n = 0;

	if (!present)
		return -ENOMEM;
	for (;;) {
		n = etcd_range(e, present, &rev, why, whylen);
		if (n < 0 || (uint32_t)n == world || etcd_now_ms() >= deadline)
			break;
		usleep(20000);
	}
	if (n >= 0 && (uint32_t)n < world) {
		char missing[256] = "";
		size_t len = 0;

		for (uint32_t r = 0; r < world && len < sizeof(missing) - 16; r++)
			if (!present[r])
				len += (size_t)snprintf(missing + len, sizeof(missing) - len,
							"%s%u", len ? " " : "", r);
		ferry_err("membership: etcd: timed out after %d ms waiting for ranks %s of %u to "
			  "register under %s; check that they were given the same "
			  "FERRY_ETCD_ENDPOINTS",
			  e->fy->timeout_ms, missing, world, e->prefix);
		n = -FERRY_E_NOJOIN;
	}
	free(present);
	if (n >= 0)
		etcd_epoch_at_least(e, rev);
	e->watch_from = rev + 1;
	return n < 0 ? n : 0;
}

static pthread_once_t etcd_curl_once = PTHREAD_ONCE_INIT;
static int etcd_curl_rc;

/* once per process: libcurl's global state (never cleaned up: other users
 * of libcurl in the process may need it) */
static void etcd_curl_init(void)
{
	etcd_curl_rc = curl_global_init(CURL_GLOBAL_DEFAULT) ? -ENOMEM : 0;
}

static int etcd_start(struct ferry *fy, const struct ferry_mgr_cfg *cfg, void **state_p)
{
	struct etcd *e = calloc(1, sizeof(*e));
	char why[512] = "", host[128] = "?", key[320], end[320], *kb = NULL, *vb = NULL, *val;
	json_t *resp = NULL;
	int64_t id;
	int rc;

	if (!e)
		return -ENOMEM;
	e->fy = fy;
	e->declare_dead = cfg->declare_dead;
	e->ttl = cfg->ttl;
	e->api = "/v3";
	pthread_once(&etcd_curl_once, etcd_curl_init);
	rc = etcd_curl_rc;
	if (!rc)
		rc = etcd_endpoints(e, cfg->endpoints);
	if (rc)
		goto err;
	e->gone = calloc(fy->world, sizeof(*e->gone));
	e->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
	e->multi = curl_multi_init();
	snprintf(e->prefix, sizeof(e->prefix), "%s/%016" PRIx64 "/members/", cfg->prefix,
		 fy->cluster_id);
	snprintf(key, sizeof(key), "%s%08u", e->prefix, fy->rank);
	snprintf(end, sizeof(end), "%s", e->prefix);
	end[strlen(end) - 1]++; /* '/' + 1: the end of the prefix's range */
	e->pfx_b64 = b64_enc(e->prefix, strlen(e->prefix));
	e->end_b64 = b64_enc(end, strlen(end));
	kb = b64_enc(key, strlen(key));
	if (!e->gone || !e->hdrs || !e->multi || !e->pfx_b64 || !e->end_b64 || !kb) {
		rc = -ENOMEM;
		goto err;
	}
	/* the lease */
	rc = etcd_call(e, "/lease/grant", json_pack("{s:i}", "TTL", e->ttl), &resp, why,
		       sizeof(why));
	if (rc) {
		ferry_err("membership: rank %u cannot reach etcd (%s): %s; check "
			  "FERRY_ETCD_ENDPOINTS and that etcd is running there",
			  fy->rank, cfg->endpoints, why);
		goto err;
	}
	id = etcd_int(json_object_get(resp, "ID"));
	json_decref(resp);
	resp = NULL;
	if (id <= 0) {
		ferry_err("membership: etcd at %s granted no lease", e->eps[e->cur]);
		rc = -EPROTO;
		goto err;
	}
	snprintf(e->lease, sizeof(e->lease), "%" PRId64, id);
	/* the key */
	gethostname(host, sizeof(host) - 1);
	val = NULL;
	{
		json_t *v = json_pack("{s:i, s:i, s:i, s:s}", "rank", (int)fy->rank, "world",
				      (int)fy->world, "pid", (int)getpid(), "host", host);

		val = v ? json_dumps(v, JSON_COMPACT) : NULL;
		json_decref(v);
	}
	vb = val ? b64_enc(val, strlen(val)) : NULL;
	free(val);
	if (!vb) {
		rc = -ENOMEM;
		goto err;
	}
	rc = etcd_call(e, "/kv/put",
		       json_pack("{s:s, s:s, s:s}", "key", kb, "value", vb, "lease", e->lease),
		       &resp, why, sizeof(why));
	json_decref(resp);
	resp = NULL;
	if (rc) {
		ferry_err("membership: rank %u cannot register in etcd: %s", fy->rank, why);
		goto err;
	}
	rc = etcd_wait_members(e, why, sizeof(why));
	if (rc) {
		if (rc != -FERRY_E_NOJOIN)
			ferry_err("membership: rank %u lost etcd while waiting for the others: %s",
				  fy->rank, why);
		goto err_revoke;
	}
	rc = pthread_create(&e->th, NULL, etcd_thread, e);
	if (rc) {
		rc = -rc;
		ferry_err("membership: cannot start the etcd thread: %s", strerror(-rc));
		goto err_revoke;
	}
	e->th_started = true;
	ferry_info("membership: etcd: rank %u of %u registered under %s (lease %s, %d s); every "
		   "rank is a member at revision %llu",
		   fy->rank, fy->world, e->prefix, e->lease, e->ttl, (unsigned long long)e->epoch);
	free(kb);
	free(vb);
	*state_p = e;
	return 0;
err_revoke:
	etcd_call(e, "/lease/revoke", json_pack("{s:s}", "ID", e->lease), &resp, why, sizeof(why));
	json_decref(resp);
err:
	free(kb);
	free(vb);
	etcd_free(e);
	return rc;
}

static uint64_t etcd_epoch(const void *state)
{
	const struct etcd *e = state;

	return __atomic_load_n(&e->epoch, __ATOMIC_ACQUIRE);
}

static void etcd_quiesce(void *state)
{
	struct etcd *e = state;

	__atomic_store_n(&e->stop, true, __ATOMIC_RELEASE);
	if (e->th_started) {
		curl_multi_wakeup(e->multi);
		pthread_join(e->th, NULL);
		e->th_started = false;
	}
}

static void etcd_leave(void *state)
{
	struct etcd *e = state;
	json_t *resp = NULL;
	char why[256];

	etcd_quiesce(e);
	/* the key goes at once, rather than when the lease runs out */
	if (etcd_call(e, "/lease/revoke", json_pack("{s:s}", "ID", e->lease), &resp, why,
		      sizeof(why)))
		ferry_dbg("membership: revoking lease %s: %s (it ends within %d s anyway)",
			  e->lease, why, e->ttl);
	json_decref(resp);
	etcd_free(e);
}

const struct ferry_mgr_ops ferry__mgr_etcd_ops = {
	.size = sizeof(struct ferry_mgr_ops),
	.name = "etcd",
	.start = etcd_start,
	.epoch = etcd_epoch,
	.quiesce = etcd_quiesce,
	.leave = etcd_leave,
};

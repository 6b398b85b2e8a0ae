/* SPDX-License-Identifier: MIT */
/* log.c - levels, a callback, FERRY_LOG_LEVEL; error strings. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "transport/base/log.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = FERRY_LOG_WARN;
static ferry_log_cb_t log_cb;
static void *log_arg;

static int log_parse_level(const char *s)
{
	static const char *const names[] = { "none", "error", "warn", "info", "debug" };

	for (int i = 0; i < 5; i++)
		if (!strcasecmp(s, names[i]))
			return i;
	if (s[0] >= '0' && s[0] <= '4' && s[1] == '\0')
		return s[0] - '0';
	return -1;
}

static void log_init(void)
{
	const char *s = getenv("FERRY_LOG_LEVEL");
	int lvl;

	if (!s || !*s)
		return;
	lvl = log_parse_level(s);
	if (lvl < 0) {
		fprintf(stderr,
			"ferry: FERRY_LOG_LEVEL=%s is not a level; use none, error, warn, "
			"info, debug or 0-4\n",
			s);
		return;
	}
	log_level = lvl;
}

void ferry_log_set(enum ferry_log_level level, ferry_log_cb_t cb, void *arg)
{
	pthread_once(&log_once, log_init);
	if (!getenv("FERRY_LOG_LEVEL"))
		__atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
	log_arg = arg;
	__atomic_store_n(&log_cb, cb, __ATOMIC_RELEASE);
}

int ferry__log_enabled(enum ferry_log_level level)
{
	pthread_once(&log_once, log_init);
	return (int)level <= __atomic_load_n(&log_level, __ATOMIC_RELAXED) &&
	       level != FERRY_LOG_NONE;
}

void ferry__log(enum ferry_log_level level, const char *fmt, ...)
{
	static const char *const tags[] = { "", "error", "warn", "info", "debug" };
	ferry_log_cb_t cb = __atomic_load_n(&log_cb, __ATOMIC_ACQUIRE);
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (cb) {
		cb(level, line, log_arg);
		return;
	}
	fprintf(stderr, "ferry %s: %s\n", tags[level], line);
}

const char *ferry_strerror(int err)
{
	static const char *const own[] = {
		[FERRY_E_CLOSED - FERRY_ERRNO_BASE] = "the Ferry node was closed",
		[FERRY_E_MISMATCH - FERRY_ERRNO_BASE] = "nodes disagree on parameters",
		[FERRY_E_PROTO - FERRY_ERRNO_BASE] = "a peer sent a malformed message",
		[FERRY_E_PEER - FERRY_ERRNO_BASE] = "a peer failed or disconnected",
		[FERRY_E_NOJOIN - FERRY_ERRNO_BASE] = "a rank never joined the cluster",
		[FERRY_E_NODEV - FERRY_ERRNO_BASE] = "the requested transport is not usable here",
	};

	if (err < 0)
		err = -err;
	if (err >= FERRY_ERRNO_BASE && err < FERRY_E_MAX)
		return own[err - FERRY_ERRNO_BASE];
	if (err >= FERRY_ERRNO_BASE)
		return "unknown Ferry error";
	return strerror(err);
}

const char *ferry_version(void)
{
	return FERRY_VERSION_STRING;
}

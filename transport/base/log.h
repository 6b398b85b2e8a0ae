/* SPDX-License-Identifier: MIT */
/* log.h - Ferry's internal logging: one line per event, logged once, where seen. */
#ifndef FERRY_TRANSPORT_BASE_LOG_H
#define FERRY_TRANSPORT_BASE_LOG_H

#include "ferry/ferry.h"

#if defined(__GNUC__)
#define FERRY_HIDDEN __attribute__((visibility("hidden")))
#define FERRY_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FERRY_HIDDEN
#define FERRY_PRINTF(a, b)
#endif

/* 1 when lines of @level are emitted (reads FERRY_LOG_LEVEL once) */
int ferry__log_enabled(enum ferry_log_level level);
/* the rank this process's node has, for the line prefix and FERRY_LOG_FILE's
 * %r; a process holding nodes of several ranks shows "*" */
void ferry__log_set_rank(int rank);
void ferry__log(enum ferry_log_level level, const char *fmt, ...) FERRY_PRINTF(2, 3);

#define FERRY_LOG(lvl, ...)                           \
	do {                                          \
		if (ferry__log_enabled(lvl))          \
			ferry__log(lvl, __VA_ARGS__); \
	} while (0)
#define ferry_err(...) FERRY_LOG(FERRY_LOG_ERROR, __VA_ARGS__)
#define ferry_warn(...) FERRY_LOG(FERRY_LOG_WARN, __VA_ARGS__)
#define ferry_info(...) FERRY_LOG(FERRY_LOG_INFO, __VA_ARGS__)
#define ferry_dbg(...) FERRY_LOG(FERRY_LOG_DEBUG, __VA_ARGS__)

#endif

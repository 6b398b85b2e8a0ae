/* SPDX-License-Identifier: MIT */
/*
 * log.c - levels, a callback, FERRY_LOG_LEVEL; the line prefix, the log
 * file and the subsystem filter; error strings.
 *
 * A line is built whole (prefix, message, newline) and written with one
 * write(2), so lines of the threads and processes of one node, or of several
 * ranks sharing a file or a terminal, never interleave inside a line:
 *
 *   FERRY_LOG_FORMAT (default "%t %h:%p r%r ferry %l: %m")
 *     %t time of day (local, ms)   %D date          %h host (short name)
 *     %p pid   %r rank ("?" before it is known, "*" when nodes of several
 *     ranks share the process)   %l level   %s subsystem   %m message   %%
 *   FERRY_LOG_FILE  a path, %h %p %r expanded as above (NCCL_DEBUG_FILE's
 *     way); opened on the first line, again when the pid or rank in the name
 *     changes (after a fork, once the rank is known); stderr when unset
 *   FERRY_LOG_SUBSYS  "bootstrap,config" keeps the warn, info and debug lines
 *     of those subsystems, "^tcp" drops tcp's; an error line always passes.
 *     A line's subsystem is the word before the first ':' of its message
 *     ("tcp: cannot listen ...").
 *
 * Context: any thread. The settings are read once; the rank is set by the
 * core's config (ferry__log_set_rank) and read with relaxed atomics.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "transport/base/log.h"

#define LOG_SUBSYS_MAX 16
#define LOG_RANK_UNKNOWN (-1)
#define LOG_RANK_SEVERAL (-2)

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = FERRY_LOG_WARN;
static ferry_log_cb_t log_cb;
static void *log_arg;

static char log_host[64];
static char log_fmt[256] = "%t %h:%p r%r ferry %l: %m";
static char log_path[512]; /* FERRY_LOG_FILE as given; "" for stderr */
static char log_subsys[LOG_SUBSYS_MAX][24];
static int log_nsubsys;
static int log_subsys_exclude;

/* the rank, and the pid whose config set it (0: guessed from the launcher's
 * variables); under log_file_lock, read with relaxed atomics */
static int log_rank = LOG_RANK_UNKNOWN;
static int log_rank_pid;

/* the open log file: its expanded name and descriptor, under log_file_lock */
static pthread_mutex_t log_file_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_file_name[512];
static int log_fd = -1;

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

/* the rank a launcher gave, before the config says it: only for the prefix */
static int log_env_rank(void)
{
	static const char *const vars[] = { "FERRY_RANK", "RANK",     "OMPI_COMM_WORLD_RANK",
					    "PMIX_RANK",  "PMI_RANK", "SLURM_PROCID" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *s = getenv(vars[i]);
		char *end;
		long v;

		if (!s || !*s)
			continue;
		v = strtol(s, &end, 10);
		if (!*end && v >= 0 && v < 65536)
			return (int)v;
		return LOG_RANK_UNKNOWN;
	}
	return LOG_RANK_UNKNOWN;
}

static void log_parse_subsys(const char *s)
{
	if (*s == '^') {
		log_subsys_exclude = 1;
		s++;
	}
	while (*s && log_nsubsys < LOG_SUBSYS_MAX) {
		size_t n = strcspn(s, ",");

		if (n && n < sizeof(log_subsys[0])) {
			memcpy(log_subsys[log_nsubsys], s, n);
			log_subsys[log_nsubsys++][n] = '\0';
		}
		s += n;
		if (*s == ',')
			s++;
	}
}

static void log_atfork_child(void)
{
	/* a thread of the parent may have held it while it forked */
	pthread_mutex_init(&log_file_lock, NULL);
}

static void log_init(void)
{
	const char *s = getenv("FERRY_LOG_LEVEL");
	char *dot;

	if (s && *s) {
		int lvl = log_parse_level(s);

		if (lvl < 0)
			fprintf(stderr,
				"ferry: FERRY_LOG_LEVEL=%s is not a level; use none, error, warn, "
				"info, debug or 0-4\n",
				s);
		else
			log_level = lvl;
	}
	if (gethostname(log_host, sizeof(log_host)))
		snprintf(log_host, sizeof(log_host), "?");
	log_host[sizeof(log_host) - 1] = '\0';
	dot = strchr(log_host, '.');
	if (dot && dot != log_host)
		*dot = '\0';
	s = getenv("FERRY_LOG_FORMAT");
	if (s && *s)
		snprintf(log_fmt, sizeof(log_fmt), "%s", s);
	s = getenv("FERRY_LOG_FILE");
	if (s && *s)
		snprintf(log_path, sizeof(log_path), "%s", s);
	s = getenv("FERRY_LOG_SUBSYS");
	if (s && *s)
		log_parse_subsys(s);
	log_rank = log_env_rank();
	pthread_atfork(NULL, NULL, log_atfork_child);
}

void ferry__log_set_rank(int rank)
{
	int pid = (int)getpid();

	pthread_once(&log_once, log_init);
	pthread_mutex_lock(&log_file_lock);
	/* a second node of another rank in this process (a local cluster) */
	if (log_rank_pid == pid && log_rank != rank)
		rank = LOG_RANK_SEVERAL;
	__atomic_store_n(&log_rank, rank, __ATOMIC_RELAXED);
	__atomic_store_n(&log_rank_pid, pid, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&log_file_lock);
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

/* the word before the first ':' of @msg when it looks like a subsystem, else "" */
static void log_msg_subsys(const char *msg, char *buf, size_t len)
{
	size_t n = 0;

	while (n + 1 < len && msg[n] && msg[n] != ':' && msg[n] != ' ')
		n++;
	if (msg[n] != ':')
		n = 0;
	memcpy(buf, msg, n);
	buf[n] = '\0';
}

static int log_subsys_pass(enum ferry_log_level level, const char *subsys)
{
	int listed = 0;

	if (!log_nsubsys || level <= FERRY_LOG_ERROR)
		return 1;
	for (int i = 0; i < log_nsubsys && !listed; i++)
		listed = !strcmp(subsys, log_subsys[i]);
	return listed != log_subsys_exclude;
}

/* appends to @buf at *@off, never past @len - 1; keeps it terminated */
static void log_put(char *buf, size_t len, size_t *off, const char *s)
{
	size_t n = strlen(s);

	if (*off + 1 >= len)
		return;
	if (n > len - 1 - *off)
		n = len - 1 - *off;
	memcpy(buf + *off, s, n);
	*off += n;
	buf[*off] = '\0';
}

static void log_rank_str(char *buf, size_t len)
{
	int r = __atomic_load_n(&log_rank, __ATOMIC_RELAXED);
	int pid = __atomic_load_n(&log_rank_pid, __ATOMIC_RELAXED);

	/* a forked child that has not joined yet is not its parent's rank */
	if (pid && pid != (int)getpid())
		r = LOG_RANK_UNKNOWN;
	if (r == LOG_RANK_SEVERAL)
		snprintf(buf, len, "*");
	else if (r < 0)
		snprintf(buf, len, "?");
	else
		snprintf(buf, len, "%d", r);
}

/*
 * log_expand - @fmt with its % fields filled in; @allowed lists the fields
 * that may appear (others are copied as they are)
 */
static void log_expand(char *buf, size_t len, const char *fmt, const char *allowed,
		       enum ferry_log_level level, const char *subsys, const char *msg)
{
	static const char *const tags[] = { "", "error", "warn", "info", "debug" };
	size_t off = 0;
	char tmp[64];

	buf[0] = '\0';
	for (const char *f = fmt; *f; f++) {
		char one[2] = { *f, '\0' };

		if (*f != '%' || !f[1] || !strchr(allowed, f[1])) {
			log_put(buf, len, &off, one);
			continue;
		}
		f++;
		switch (*f) {
		case 't':
		case 'D': {
			struct timeval tv;
			struct tm tm;

			gettimeofday(&tv, NULL);
			localtime_r(&tv.tv_sec, &tm);
			if (*f == 't')
				snprintf(tmp, sizeof(tmp), "%02d:%02d:%02d.%03ld", tm.tm_hour,
					 tm.tm_min, tm.tm_sec, (long)tv.tv_usec / 1000);
			else
				snprintf(tmp, sizeof(tmp), "%04d-%02d-%02d", tm.tm_year + 1900,
					 tm.tm_mon + 1, tm.tm_mday);
			log_put(buf, len, &off, tmp);
			break;
		}
		case 'h':
			log_put(buf, len, &off, log_host);
			break;
		case 'p':
			snprintf(tmp, sizeof(tmp), "%d", (int)getpid());
			log_put(buf, len, &off, tmp);
			break;
		case 'r':
			log_rank_str(tmp, sizeof(tmp));
			log_put(buf, len, &off, tmp);
			break;
		case 'l':
			log_put(buf, len, &off, tags[level]);
			break;
		case 's':
			log_put(buf, len, &off, subsys);
			break;
		case 'm':
			log_put(buf, len, &off, msg);
			break;
		default: /* %% */
			log_put(buf, len, &off, "%");
			break;
		}
	}
}

/*
 * log_write - one line to the log file (opened, or reopened as its name
 * says), or to stderr when there is none or it cannot be opened. The file's
 * lock is held across the write: a descriptor closed by a reopen could
 * otherwise be reused (by a socket) before a late write reached it.
 */
static void log_write(const char *line, size_t n)
{
	char name[sizeof(log_file_name)];
	ssize_t w;
	int fd;

	if (!log_path[0]) {
		/* a short write (a full disk, a closed terminal) loses the rest of the line */
		w = write(STDERR_FILENO, line, n);
		(void)w;
		return;
	}
	log_expand(name, sizeof(name), log_path, "hpr%", FERRY_LOG_NONE, "", "");
	pthread_mutex_lock(&log_file_lock);
	if (log_fd < 0 || strcmp(name, log_file_name)) {
		fd = open(name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		/* say it once per name, on stderr, and log there */
		if (fd < 0 && strcmp(name, log_file_name))
			fprintf(stderr,
				"ferry: cannot open FERRY_LOG_FILE %s: %s; logging to stderr\n",
				name, strerror(errno));
		if (log_fd >= 0)
			close(log_fd);
		log_fd = fd;
		snprintf(log_file_name, sizeof(log_file_name), "%s", name);
	}
	w = write(log_fd >= 0 ? log_fd : STDERR_FILENO, line, n);
	(void)w;
	pthread_mutex_unlock(&log_file_lock);
}

void ferry__log(enum ferry_log_level level, const char *fmt, ...)
{
	ferry_log_cb_t cb = __atomic_load_n(&log_cb, __ATOMIC_ACQUIRE);
	char msg[1024], line[1400], subsys[24];
	size_t n;
	va_list ap;

	pthread_once(&log_once, log_init);
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_msg_subsys(msg, subsys, sizeof(subsys));
	if (!log_subsys_pass(level, subsys))
		return;
	if (cb) {
		cb(level, msg, log_arg);
		return;
	}
	log_expand(line, sizeof(line) - 1, log_fmt, "tDhprlsm%", level, subsys, msg);
	n = strlen(line);
	line[n++] = '\n';
	log_write(line, n);
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

	/* a peer's status may be any int: INT_MIN has no negation */
	unsigned int e = err < 0 ? 0u - (unsigned int)err : (unsigned int)err;

	if (e >= FERRY_ERRNO_BASE && e < FERRY_E_MAX)
		return own[e - FERRY_ERRNO_BASE];
	if (e >= FERRY_ERRNO_BASE)
		return "unknown Ferry error";
	return strerror((int)e);
}

const char *ferry_version(void)
{
	return FERRY_VERSION_STRING;
}

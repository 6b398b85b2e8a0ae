/* SPDX-License-Identifier: MIT */
/* session.c - see session.h. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "transport/base/log.h"
#include "transport/base/session.h"

int ferry__tp_env_ms(const char *tp, const char *name, int def, int *ms_p)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s) {
		*ms_p = def;
		return 0;
	}
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < 0 || v > INT_MAX / 2) {
		ferry_err("%s: %s=\"%s\" is not a number of milliseconds (0 or more); fix it or "
			  "unset it",
			  tp, name, s);
		return -EINVAL;
	}
	*ms_p = (int)v;
	return 0;
}

uint64_t ferry__tp_incarnation(const void *salt)
{
	uint64_t inc = 0;

	if (getrandom(&inc, sizeof(inc), GRND_NONBLOCK) != (ssize_t)sizeof(inc)) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		inc = ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)ts.tv_nsec ^
		      ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)salt;
	}
	return inc | 1;
}

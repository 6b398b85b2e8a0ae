/* SPDX-License-Identifier: MIT */
/* args.h - option parsing shared by the test programs (tests/rank/). */
#ifndef FERRY_TEST_ARGS_H
#define FERRY_TEST_ARGS_H

#include <errno.h>
#include <stdlib.h>

/* @s as a decimal in [@lo, @hi] into *@v_p (written only on success); 0 or -1 */
static inline int targ_num(const char *s, long lo, long hi, long *v_p)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*v_p = v;
	return 0;
}

#endif

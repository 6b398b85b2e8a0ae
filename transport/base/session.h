/* SPDX-License-Identifier: MIT */
/*
 * session.h - what the stream transports' sessions share (tcp/session.c,
 * rdma/session.c): their millisecond settings from the environment, and the
 * random incarnation a node gives its transport at init.
 */
#ifndef FERRY_TRANSPORT_BASE_SESSION_H
#define FERRY_TRANSPORT_BASE_SESSION_H

#include <stdint.h>

/*
 * ferry__tp_env_ms - the whole number of milliseconds in $@name (0 .. INT_MAX/2),
 * or @def when unset or empty. Return: 0, or -EINVAL with one log line naming
 * @tp (the transport) and the variable.
 */
int ferry__tp_env_ms(const char *tp, const char *name, int def, int *ms_p);

/* a random, nonzero incarnation (getrandom, else the clock, the pid and
 * @salt): 0 means "not known yet" to both sessions */
uint64_t ferry__tp_incarnation(const void *salt);

#endif /* FERRY_TRANSPORT_BASE_SESSION_H */

/* SPDX-License-Identifier: MIT */
/* transport.c - helpers transport.h hands to every transport. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "transport/transport.h"

int ferry__tp_parse_ipv4(const void *blob, size_t len, struct sockaddr_in *sa)
{
	char s[64], *colon, *end;
	unsigned long port;

	if (!blob || !len || len >= sizeof(s))
		return -EINVAL;
	memcpy(s, blob, len);
	s[len] = '\0';
	colon = strrchr(s, ':');
	if (!colon)
		return -EINVAL;
	*colon = '\0';
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || !port || port > 65535)
		return -EINVAL;
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, s, &sa->sin_addr) != 1)
		return -EINVAL;
	return 0;
}

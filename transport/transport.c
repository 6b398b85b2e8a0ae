/* SPDX-License-Identifier: MIT */
/* transport.c - helpers transport.h hands to every transport. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int ferry__tp_check_frame(const struct ferry_tp *tp, uint32_t dst, const struct iovec *iov,
			  int iovcnt, size_t *total_p)
{
	unsigned char hbuf[sizeof(struct ferry_msg_hdr)];
	const char *why = "shorter than a header";
	struct ferry_msg_hdr hdr;
	size_t total = 0, got = 0;

	for (int i = 0; i < iovcnt; i++) {
		size_t n = iov[i].iov_len;

		if (got < sizeof(hbuf)) {
			size_t take = n < sizeof(hbuf) - got ? n : sizeof(hbuf) - got;

			memcpy(hbuf + got, iov[i].iov_base, take);
			got += take;
		}
		total += n;
	}
	if (got == sizeof(hbuf)) {
		memcpy(&hdr, hbuf, sizeof(hdr));
		if (!ferry__proto_check_hdr(&hdr, tp->cfg.world, &why)) {
			if (hdr.len == total) {
				*total_p = total;
				return 0;
			}
			why = "its header's len differs from the bytes given";
		}
	}
	ferry_err("%s: rank %u: refusing a %zu-byte frame to rank %u: %s", tp->ops->name,
		  tp->cfg.rank, total, dst, why);
	return -EINVAL;
}

void ferry__tp_send_bye(struct ferry_tp *tp)
{
	struct ferry_msg_hdr bye;
	struct iovec iov = { .iov_base = &bye, .iov_len = sizeof(bye) };

	ferry__proto_hdr_init(&bye, FERRY_MSG_BYE, sizeof(bye), tp->cfg.rank, 0);
	for (uint32_t r = 0; r < tp->cfg.world; r++)
		if (r != tp->cfg.rank)
			tp->ops->send(tp, r, &iov, 1);
}

int ferry__tp_deadline(const struct ferry_tp *tp, struct timespec *ts)
{
	int timeout_ms = tp->cfg.timeout_ms > 0 ? tp->cfg.timeout_ms : 30000;

	ferry__deadline_ms(timeout_ms, ts);
	return timeout_ms;
}

/* SPDX-License-Identifier: MIT */
/*
 * netif.c - the address a node listens on and the one it tells its peers,
 * first rule that applies:
 *
 *   FERRY_BIND_ADDR (or params->bind_addr)   that address; 0.0.0.0 binds every
 *                                            interface and advertises the
 *                                            address the next rules give
 *   FERRY_SOCKET_IFNAME                      the IPv4 address of the first
 *                                            interface that matches (NCCL's
 *                                            syntax: "eth,ib" prefixes, "=eth0"
 *                                            exact names, "^docker,lo" all but)
 *   a rendezvous host:port                   the local address of the route to
 *                                            it (a UDP socket connect()ed there
 *                                            sends nothing; getsockname() says
 *                                            which source the kernel would use)
 *   none (PMIx)                              the first interface that is up with
 *                                            an IPv4 address, not loopback and
 *                                            not docker or virbr; else loopback
 *
 * The chosen address and the reason go into the config, which the log (info)
 * and ferry-info print. Context: ferry__config_resolve(), any thread.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/core/netif.h"
#include "transport/base/log.h"

#define NETIF_NAMES_MAX 16

struct netif_filter {
	int exclude; /* '^': every interface but those named */
	int exact;   /* '=': whole names, not prefixes */
	int n;
	char names[NETIF_NAMES_MAX][IF_NAMESIZE];
};

static void netif_parse(const char *s, struct netif_filter *f)
{
	memset(f, 0, sizeof(*f));
	if (*s == '^') {
		f->exclude = 1;
		s++;
	}
	if (*s == '=') {
		f->exact = 1;
		s++;
	}
	while (*s && f->n < NETIF_NAMES_MAX) {
		size_t n = strcspn(s, ",");

		if (n && n < IF_NAMESIZE) {
			memcpy(f->names[f->n], s, n);
			f->names[f->n++][n] = '\0';
		}
		s += n;
		if (*s == ',')
			s++;
	}
}

static int netif_named(const struct netif_filter *f, const char *ifname)
{
	for (int i = 0; i < f->n; i++)
		if (f->exact ? !strcmp(ifname, f->names[i]) :
			       !strncmp(ifname, f->names[i], strlen(f->names[i])))
			return 1;
	return 0;
}

/* does @ifname pass @f? (NULL: the default rule: no loopback, docker, virbr) */
static int netif_match(const struct netif_filter *f, const char *ifname, unsigned flags)
{
	static const struct netif_filter dflt = { .exclude = 1,
						  .n = 3,
						  .names = { "lo", "docker", "virbr" } };

	if (!f)
		return !(flags & IFF_LOOPBACK) && !netif_named(&dflt, ifname);
	if (f->exclude)
		return !(flags & IFF_LOOPBACK) && !netif_named(f, ifname);
	return netif_named(f, ifname);
}

/*
 * netif_by_name - the IPv4 address of the first interface that is up and
 * passes @f (NULL: the default rule), in the kernel's order; @have_p lists
 * what there is, for the error message. Return: 0 or -EADDRNOTAVAIL.
 */
static int netif_by_name(const struct netif_filter *f, char *addr, size_t alen, char *ifname,
			 char *have, size_t hlen)
{
	struct ifaddrs *ifs, *i;
	size_t off = 0;
	int rc = -EADDRNOTAVAIL;

	have[0] = '\0';
	if (getifaddrs(&ifs))
		return -errno;
	for (i = ifs; i; i = i->ifa_next) {
		char ip[INET_ADDRSTRLEN];

		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP))
			continue;
		inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, ip, sizeof(ip));
		if (off < hlen)
			off += (size_t)snprintf(have + off, hlen - off, "%s%s %s", off ? ", " : "",
						i->ifa_name, ip);
		if (rc && netif_match(f, i->ifa_name, i->ifa_flags)) {
			snprintf(addr, alen, "%s", ip);
			snprintf(ifname, IF_NAMESIZE, "%s", i->ifa_name);
			rc = 0;
		}
	}
	freeifaddrs(ifs);
	return rc;
}

/* the local address of the route to c's rendezvous; 0 or a negative errno (logged) */
static int netif_route(const struct ferry_config *c, char *addr, size_t alen)
{
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_DGRAM }, *res;
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	char port[8];
	int fd, rc;

	snprintf(port, sizeof(port), "%d", c->rdv_port ? c->rdv_port : 9);
	rc = getaddrinfo(c->rdv_host, port, &hints, &res);
	if (rc) {
		ferry_err("config: cannot resolve the rendezvous host \"%s\" (from %s): %s; fix %s",
			  c->rdv_host, c->rdv_src,
			  rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc), c->rdv_var);
		return -EHOSTUNREACH;
	}
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		freeaddrinfo(res);
		return rc;
	}
	rc = connect(fd, res->ai_addr, res->ai_addrlen) ||
			     getsockname(fd, (struct sockaddr *)&sa, &sl) ?
		     -errno :
		     0;
	freeaddrinfo(res);
	close(fd);
	if (rc) {
		ferry_err(
			"config: no route from this host to the rendezvous %s:%d (from %s): %s; "
			"check %s, or choose the interface with FERRY_SOCKET_IFNAME or the address "
			"with FERRY_BIND_ADDR",
			c->rdv_host, c->rdv_port, c->rdv_src, strerror(-rc), c->rdv_var);
		return rc;
	}
	inet_ntop(AF_INET, &sa.sin_addr, addr, (socklen_t)alen);
	return 0;
}

/*
 * netif_advertise - the address peers can reach this node at, by every rule
 * but FERRY_BIND_ADDR; @why receives the reason
 */
static int netif_advertise(const struct ferry_config *c, int have_rdv, char *addr, size_t alen,
			   char *why, size_t wlen)
{
	const char *s = getenv("FERRY_SOCKET_IFNAME");
	char ifname[IF_NAMESIZE], have[512];
	struct netif_filter f;
	int rc;

	if (s && *s) {
		netif_parse(s, &f);
		rc = netif_by_name(&f, addr, alen, ifname, have, sizeof(have));
		if (rc) {
			ferry_err(
				"config: FERRY_SOCKET_IFNAME=%s matches no interface that is up with "
				"an IPv4 address (this host has: %s); name one of those, or unset it",
				s, have[0] ? have : "none");
			return rc;
		}
		snprintf(why, wlen, "interface %s, from FERRY_SOCKET_IFNAME=%s", ifname, s);
		return 0;
	}
	if (have_rdv) {
		rc = netif_route(c, addr, alen);
		if (rc)
			return rc;
		snprintf(why, wlen, "the local address of the route to the rendezvous %.64s:%d",
			 c->rdv_host, c->rdv_port);
		return 0;
	}
	if (!netif_by_name(NULL, addr, alen, ifname, have, sizeof(have))) {
		snprintf(why, wlen,
			 "interface %s: the first up, not loopback, docker or virbr (no rendezvous "
			 "to route to; FERRY_SOCKET_IFNAME picks another)",
			 ifname);
		return 0;
	}
	snprintf(addr, alen, "127.0.0.1");
	snprintf(why, wlen, "loopback: this host has no other interface up with an IPv4 address");
	return 0;
}

int ferry__netif_pick(struct ferry_config *c, const char *given, const char *given_src,
		      int have_rdv)
{
	struct in_addr in;
	int rc;

	if (given && *given && !(inet_pton(AF_INET, given, &in) == 1 && in.s_addr == INADDR_ANY)) {
		snprintf(c->bind_addr, sizeof(c->bind_addr), "%s", given);
		snprintf(c->adv_addr, sizeof(c->adv_addr), "%s", given);
		snprintf(c->bind_why, sizeof(c->bind_why), "from %s", given_src);
		return 0;
	}
	rc = netif_advertise(c, have_rdv, c->adv_addr, sizeof(c->adv_addr), c->bind_why,
			     sizeof(c->bind_why));
	if (rc)
		return rc;
	if (given && *given) {
		char why[sizeof(c->bind_why)];

		/* every interface, and peers told the one that reaches them */
		snprintf(c->bind_addr, sizeof(c->bind_addr), "0.0.0.0");
		snprintf(why, sizeof(why), "%s", c->bind_why);
		snprintf(c->bind_why, sizeof(c->bind_why),
			 "%.40s=0.0.0.0: every interface; peers are told %.64s (%.100s)", given_src,
			 c->adv_addr, why);
		return 0;
	}
	snprintf(c->bind_addr, sizeof(c->bind_addr), "%s", c->adv_addr);
	return 0;
}

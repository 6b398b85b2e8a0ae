/* SPDX-License-Identifier: MIT */
/*
 * ferry-info - what Ferry sees on this machine: the version, the effective
 * configuration (every option, its value and where it came from), the
 * transports built in and whether each can run, the RDMA devices with their
 * ports, states, MTUs and GIDs, the memlock limit, and the transport "auto"
 * would pick, and the address this node would listen on and why. It changes
 * nothing. Sections: -c config, -d devices, -v version (all by default).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#ifdef FERRY_HAVE_RDMA
#include <arpa/inet.h>
#include <net/if.h>

#include <infiniband/verbs.h>
#endif

#include "lib/core/config.h"
#include "transport/transport.h"

static void print_limit(const char *what, rlim_t v)
{
	if (v == RLIM_INFINITY)
		printf("  %-22s unlimited\n", what);
	else
		printf("  %-22s %llu KiB\n", what, (unsigned long long)v / 1024);
}

#ifdef FERRY_HAVE_RDMA
static const char *port_state(enum ibv_port_state s)
{
	switch (s) {
	case IBV_PORT_ACTIVE:
		return "ACTIVE";
	case IBV_PORT_DOWN:
		return "DOWN";
	case IBV_PORT_INIT:
		return "INIT";
	case IBV_PORT_ARMED:
		return "ARMED";
	default:
		return "other";
	}
}

static const char *gid_type(uint32_t type)
{
	switch (type) {
	case IBV_GID_TYPE_IB:
		return "IB";
	case IBV_GID_TYPE_ROCE_V1:
		return "RoCE v1";
	case IBV_GID_TYPE_ROCE_V2:
		return "RoCE v2";
	default:
		return "other";
	}
}

/* the valid GIDs of @port with their types and interfaces, from the device's whole table */
static void print_gids(struct ibv_context *ctx, int nports, int port)
{
	struct ibv_gid_entry *gids;
	size_t max = 0;
	ssize_t n;

	/* the table holds every port's entries: room for all of them */
	for (int p = 1; p <= nports; p++) {
		struct ibv_port_attr pa;

		if (!ibv_query_port(ctx, (uint8_t)p, &pa))
			max += (size_t)pa.gid_tbl_len;
	}
	if (!max)
		return;
	gids = calloc(max, sizeof(*gids));
	if (!gids) {
		printf("      GIDs: no memory to read the table\n");
		return;
	}
	n = ibv_query_gid_table(ctx, gids, max, 0);
	if (n < 0)
		printf("      GIDs: cannot read the table (%s)\n", strerror((int)-n));
	for (ssize_t i = 0; i < n; i++) {
		const struct ibv_gid_entry *g = &gids[i];
		char addr[INET6_ADDRSTRLEN], ifname[IF_NAMESIZE];

		if (g->port_num != (uint32_t)port)
			continue;
		if (!inet_ntop(AF_INET6, g->gid.raw, addr, sizeof(addr)))
			snprintf(addr, sizeof(addr), "?");
		if (!g->ndev_ifindex || !if_indextoname(g->ndev_ifindex, ifname))
			ifname[0] = '\0';
		printf("      gid[%u] %s %s%s%s\n", g->gid_index, addr, gid_type(g->gid_type),
		       ifname[0] ? " on " : "", ifname);
	}
	free(gids);
}

static void print_rdma_devices(void)
{
	struct ibv_device **list;
	int n = 0;

	list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		printf("  none (ibv_get_device_list found no device; see docs/rdma.md for "
		       "SoftRoCE)\n");
		if (list)
			ibv_free_device_list(list);
		return;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		struct ibv_context *ctx = ibv_open_device(list[i]);
		struct ibv_device_attr da;

		if (!ctx || ibv_query_device(ctx, &da)) {
			printf("  %s: cannot open (%s)\n", name,
			       ctx ? "query failed" : "open failed");
			if (ctx)
				ibv_close_device(ctx);
			continue;
		}
		printf("  %s: %u port(s), max_qp %d, max_mr_size %llu\n", name, da.phys_port_cnt,
		       da.max_qp, (unsigned long long)da.max_mr_size);
		for (int p = 1; p <= da.phys_port_cnt; p++) {
			struct ibv_port_attr pa;

			if (ibv_query_port(ctx, (uint8_t)p, &pa))
				continue;
			printf("    port %d: %s, active MTU %d, link %s\n", p, port_state(pa.state),
			       128 << pa.active_mtu,
			       pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" :
									  "InfiniBand");
			print_gids(ctx, da.phys_port_cnt, p);
		}
		ibv_close_device(ctx);
	}
	ibv_free_device_list(list);
}
#endif

static const char usage[] =
	"usage: ferry-info [-c] [-d] [-v] [-h]\n"
	"\n"
	"Prints what Ferry sees on this machine; changes nothing. With no option,\n"
	"every section.\n"
	"\n"
	"  -c, --config    the options, their values and the effective configuration:\n"
	"                  rank, world, rendezvous, and the address this node would\n"
	"                  listen on and why (FERRY_BIND_ADDR, FERRY_SOCKET_IFNAME or\n"
	"                  the route to the rendezvous)\n"
	"  -d, --devices   the transports and whether each can run, the RDMA devices\n"
	"                  with ports, MTUs and GIDs, and the memlock limit\n"
	"  -v, --version   Ferry's version, and whether this build has RDMA and PMIx\n"
	"  -h, --help      this text\n"
	"\n"
	"Exit status: 0; 2 on a bad option.\n";

static void print_version(void)
{
	printf("Ferry %s (rdma: %s, pmix: %s)\n", ferry_version(),
#ifdef FERRY_HAVE_RDMA
	       "yes",
#else
	       "no",
#endif
#ifdef FERRY_HAVE_PMIX
	       "yes"
#else
	       "no"
#endif
	);
}

static void print_config(void)
{
	struct ferry_config c;
	int rc;

	printf("Options (params > FERRY_* > launchers' variables > default):\n");
	printf("  %-22s %-14s %s\n", "variable", "value", "meaning");
	for (const struct ferry_option *o = ferry__options; o->env; o++) {
		const char *v = getenv(o->env);

		printf("  %-22s %-14s %s (default: %s)\n", o->env, v ? v : "(unset)", o->what,
		       o->def);
	}
	fflush(stdout);
	rc = ferry__config_resolve(NULL, &c);
	if (rc) {
		printf("\nEffective configuration: invalid (%s; the log line says why)\n",
		       ferry_strerror(rc));
		return;
	}
	printf("\nEffective configuration:\n");
	printf("  rank %d of %d (from %s)\n", c.rank, c.world, c.rank_src);
	if (c.use_pmix)
		printf("  addresses exchanged through PMIx (no rendezvous given)\n");
	else
		printf("  rendezvous %s:%d (from %s)\n", c.rdv_host, c.rdv_port, c.rdv_src);
	printf("  listen on %s, peers dial %s\n    because: %s\n", c.bind_addr, c.adv_addr,
	       c.bind_why);
	printf("  timeout %d ms, busy poll %s\n", c.timeout_ms, c.busy_poll ? "on" : "off");
	{
		const char *ep = getenv("FERRY_ETCD_ENDPOINTS");

		if (!ep || !*ep)
			printf("  membership: embedded (rank 0; docs/membership.md)\n");
		else
#ifdef FERRY_HAVE_ETCD
			printf("  membership: etcd at %s, lease %s s (FERRY_ETCD_TTL), prefix %s\n",
			       ep, getenv("FERRY_ETCD_TTL") ? getenv("FERRY_ETCD_TTL") : "5",
			       getenv("FERRY_ETCD_PREFIX") ? getenv("FERRY_ETCD_PREFIX") :
							     "/ferry");
#else
			printf("  membership: etcd at %s asked for, but this build has no etcd "
			       "manager (no libcurl): ferry_open will refuse it\n",
			       ep);
#endif
	}
}

static void print_devices(void)
{
	const struct ferry_tp_ops *tps[] = {
		&ferry__tcp_ops,
#ifdef FERRY_HAVE_RDMA
		&ferry__rdma_ops,
#endif
	};
	const char *pick = "tcp";
	struct rlimit rl;

	printf("Transports:\n");
	for (size_t i = 0; i < sizeof(tps) / sizeof(tps[0]); i++) {
		const char *why = NULL;
		int ok = tps[i]->probe ? tps[i]->probe(&why) : 0;

		printf("  %-6s %s%s%s\n", tps[i]->name, ok ? "unusable: " : "usable",
		       ok && why ? why : "", ok && !why ? ferry_strerror(ok) : "");
		if (!ok && tps[i] != &ferry__tcp_ops)
			pick = tps[i]->name;
	}
#ifndef FERRY_HAVE_RDMA
	printf("  rdma   not built (libibverbs-dev and librdmacm-dev were missing)\n");
#endif
	printf("  auto would pick: %s\n", pick);

	printf("\nRDMA devices:\n");
#ifdef FERRY_HAVE_RDMA
	print_rdma_devices();
#else
	printf("  (not built with RDMA)\n");
#endif

	printf("\nLimits:\n");
	if (!getrlimit(RLIMIT_MEMLOCK, &rl)) {
		print_limit("memlock (soft)", rl.rlim_cur);
		print_limit("memlock (hard)", rl.rlim_max);
		if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (64ull << 20))
			printf("  note: RDMA registers every table's arena; raise the limit with "
			       "`ulimit -l unlimited` or memlock in /etc/security/limits.conf\n");
	}
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", no_argument, NULL, 'c' },
		{ "devices", no_argument, NULL, 'd' },
		{ "version", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int config = 0, devices = 0, version = 0, o;

	while ((o = getopt_long(argc, argv, "cdvh", opts, NULL)) != -1) {
		switch (o) {
		case 'c':
			config = 1;
			break;
		case 'd':
			devices = 1;
			break;
		case 'v':
			version = 1;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ferry-info: unexpected argument '%s'\n%s", argv[optind], usage);
		return 2;
	}
	if (!config && !devices && !version)
		config = devices = version = 1;
	if (version)
		print_version();
	if (config) {
		if (version)
			putchar('\n');
		print_config();
	}
	if (devices) {
		if (version || config)
			putchar('\n');
		print_devices();
	}
	return 0;
}

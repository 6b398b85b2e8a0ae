/* SPDX-License-Identifier: MIT */
/*
 * device.c - what the RDMA transport runs on: the memlock check, the device,
 * port and GID it picks, the probe, the listening cm_id (whose verbs context
 * everything else lives on), the protection domain, the completion channel
 * and CQs sized to the device, and the peers' message buffers in one
 * registered region.
 *
 * Context: init() and fini() on their caller's thread, before the progress
 * thread starts and after it stopped; ferry__rdma_probe() and ferry__rdma_memlock_check()
 * (which mem_reg() calls too) on any thread.
 *
 * Resources (init)
 *
 *   rdma_cm picks the device from the bind address, so the listening cm_id is
 *   bound first and its verbs context (rdma_cm's own, kept open by
 *   rdma_get_devices() until fini) is the one everything else lives on:
 *
 *     listen cm_id (bind_addr:0) --> ibv_context --> PD --> send CQ, recv CQ
 *                                                        (one completion channel)
 *                                                   --> one registered region:
 *                                                       per peer RDMA_RECVS receive
 *                                                       and RDMA_SBUFS send buffers
 *                                                       of RDMA_CHUNK bytes
 *
 *   ibv_fork_init() runs before any of it (see docs/rdma.md, "fork").
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "transport/rdma/rdma.h"

/* bytes this process registered through this transport (RLIMIT_MEMLOCK check) */
uint64_t ferry__rdma_pinned;

static void rdma_bytes_str(uint64_t n, char *buf, size_t len)
{
	if (n >= (1ull << 30))
		snprintf(buf, len, "%.1f GiB", (double)n / (1ull << 30));
	else if (n >= (1u << 20))
		snprintf(buf, len, "%.1f MiB", (double)n / (1u << 20));
	else
		snprintf(buf, len, "%" PRIu64 " KiB", n >> 10);
}

int ferry__rdma_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK))
		return -errno;
	return 0;
}

/* ---- memlock ------------------------------------------------------------ */

/* 1 when the process holds CAP_IPC_LOCK, which exempts it from RLIMIT_MEMLOCK */
static int rdma_has_ipc_lock(void)
{
	char line[256];
	FILE *f = fopen("/proc/self/status", "re");
	int ret = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long caps;

		if (sscanf(line, "CapEff: %llx", &caps) == 1) {
			ret = !!(caps & (1ull << 14)); /* CAP_IPC_LOCK */
			break;
		}
	}
	fclose(f);
	return ret;
}

/*
 * ferry__rdma_memlock_check - will registering @more bytes fit under RLIMIT_MEMLOCK?
 * @what: what needs them, for the log
 *
 * Counts what this transport registered in the process so far; the kernel
 * also counts other pinned memory, so this catches the common case (a small
 * default limit) with a clear message, not every case.
 * Return: 0, or -ENOMEM after logging the limit and how to raise it.
 */
int ferry__rdma_memlock_check(uint32_t rank, uint64_t more, const char *what)
{
	char need[32], lim[32], have_s[32];
	struct rlimit rl;
	uint64_t have;

	if (getrlimit(RLIMIT_MEMLOCK, &rl) || rl.rlim_cur == RLIM_INFINITY)
		return 0;
	have = __atomic_load_n(&ferry__rdma_pinned, __ATOMIC_RELAXED);
	if (have + more <= rl.rlim_cur || rdma_has_ipc_lock())
		return 0;
	rdma_bytes_str(more, need, sizeof(need));
	rdma_bytes_str(rl.rlim_cur, lim, sizeof(lim));
	rdma_bytes_str(have, have_s, sizeof(have_s));
	ferry_err(
		"rdma: rank %u: registering %s needs %s of locked memory (%s registered already) but the "
		"memlock limit (RLIMIT_MEMLOCK) is %s; raise it with `ulimit -l unlimited` "
		"before starting the process, or with a memlock line in "
		"/etc/security/limits.conf (e.g. `* - memlock unlimited`); containers need "
		"--ulimit memlock=-1",
		rank, what, need, have_s, lim);
	return -ENOMEM;
}

/* ---- device, port and GID ----------------------------------------------- */

/* the first active port of @dev, 0 when none; *err_p the errno of a failed open */
static uint8_t rdma_active_port(struct ibv_device *dev, int *err_p)
{
	struct ibv_device_attr da;
	struct ibv_context *ctx;
	uint8_t port = 0;

	*err_p = 0;
	ctx = ibv_open_device(dev);
	if (!ctx) {
		*err_p = errno ? errno : ENODEV;
		return 0;
	}
	if (!ibv_query_device(ctx, &da)) {
		for (uint8_t p = 1; p <= da.phys_port_cnt && !port; p++) {
			struct ibv_port_attr pa;

			if (!ibv_query_port(ctx, p, &pa) && pa.state == IBV_PORT_ACTIVE)
				port = p;
		}
	}
	ibv_close_device(ctx);
	return port;
}

/*
 * ferry__rdma_pick_device - FERRY_RDMA_DEVICE, or the first device with an active port
 * @name: receives the device's name (IBV_SYSFS_NAME_MAX bytes)
 * @port_p: receives its first active port
 * @why_p: on failure, the reason (static, per thread)
 *
 * Opens and closes what it looks at; leaves nothing open. Context: any thread.
 * Return: 0 or -FERRY_E_NODEV.
 */
int ferry__rdma_pick_device(char *name, uint8_t *port_p, const char **why_p)
{
	static __thread char why[192];
	const char *want = getenv("FERRY_RDMA_DEVICE");
	struct ibv_device **list;
	int n = 0, err = 0, ret = -FERRY_E_NODEV;
	uint8_t port = 0;

	if (want && !*want)
		want = NULL;
	list = ibv_get_device_list(&n);
	if (!list || n <= 0) {
		*why_p = "no RDMA device (ibv_get_device_list found none)";
		goto out_free;
	}
	for (int i = 0; i < n; i++) {
		const char *dn = ibv_get_device_name(list[i]);

		if (want && strcmp(dn, want))
			continue;
		port = rdma_active_port(list[i], &err);
		if (port) {
			snprintf(name, IBV_SYSFS_NAME_MAX, "%s", dn);
			*port_p = port;
			ret = 0;
			goto out_free;
		}
		if (want || n == 1) {
			if (err)
				snprintf(why, sizeof(why),
					 "cannot open device %s: %s (is /dev/infiniband "
					 "there?)",
					 dn, strerror(err));
			else
				snprintf(why, sizeof(why), "device %s has no active port", dn);
			*why_p = why;
			goto out_free;
		}
	}
	if (want)
		snprintf(why, sizeof(why), "FERRY_RDMA_DEVICE=%s does not exist", want);
	else
		snprintf(why, sizeof(why), "none of the %d RDMA devices has an active port", n);
	*why_p = why;
out_free:
	if (list)
		ibv_free_device_list(list);
	return ret;
}

/*
 * rdma_open_device - open the device named @name, to read its GID table
 * @ctx_p: receives the context; the caller closes it
 *
 * Return: 0, or a negative errno (-ENODEV when no device has that name).
 */
static int rdma_open_device(const char *name, struct ibv_context **ctx_p)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	int ret = -ENODEV;

	for (int i = 0; list && list[i]; i++) {
		if (strcmp(ibv_get_device_name(list[i]), name))
			continue;
		ctx = ibv_open_device(list[i]);
		if (!ctx) {
			ret = errno ? -errno : -ENODEV;
			break;
		}
		*ctx_p = ctx;
		ret = 0;
		break;
	}
	if (list)
		ibv_free_device_list(list);
	return ret;
}

/*
 * the IPv4 address GID @idx of @ctx's port @port maps, when it is a RoCE v2
 * IPv4 GID (::ffff:a.b.c.d); -1 when it is not, is empty, or @ctx is NULL
 */
static int rdma_gid_ipv4(struct ibv_context *ctx, uint8_t port, int idx, struct in_addr *in)
{
	struct ibv_gid_entry e;
	struct in6_addr a6;

	if (!ctx || ibv_query_gid_ex(ctx, port, (uint32_t)idx, &e, 0) ||
	    e.gid_type != IBV_GID_TYPE_ROCE_V2)
		return -1;
	memcpy(&a6, e.gid.raw, sizeof(a6));
	if (!IN6_IS_ADDR_V4MAPPED(&a6))
		return -1;
	memcpy(&in->s_addr, &a6.s6_addr[12], 4);
	return 0;
}

/* FERRY_RDMA_GID_INDEX: -1 when unset; -2 (logged) when malformed */
static int rdma_env_gid_index(void)
{
	const char *s = getenv("FERRY_RDMA_GID_INDEX");
	char *end;
	long v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < 0 || v > 65535) {
		ferry_err("rdma: FERRY_RDMA_GID_INDEX=%s is not a GID index (0, 1, ...)", s);
		return -2;
	}
	return (int)v;
}

/*
 * ferry__rdma_pick_addr - the IPv4 address to listen on, and its GID index
 *
 * rdma_cm resolves the GID from the address itself; the GID table (its first
 * RDMA_GID_SCAN entries, through ibv_query_gid_ex()) serves to find the
 * device's address where the bind address cannot carry rdma_cm (loopback, or
 * unspecified), and to warn when FERRY_RDMA_GID_INDEX names a GID of another
 * address. A device that cannot be opened to read it counts as one without
 * GIDs (logged). Return: 0 or a negative errno (logged).
 */
int ferry__rdma_pick_addr(struct rdma_tp *t, const char *host)
{
	uint32_t rank = t->base.cfg.rank;
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM };
	struct in_addr in = { 0 }, g;
	struct ibv_context *ctx = NULL;
	int env_idx = rdma_env_gid_index(), found = -1, ret;
	char ip[INET_ADDRSTRLEN];

	if (env_idx == -2)
		return -EINVAL;
	if (host && *host && inet_pton(AF_INET, host, &in) != 1) {
		struct addrinfo *res;

		ret = getaddrinfo(host, NULL, &hints, &res);
		if (ret) {
			ferry_err("rdma: cannot resolve the bind address \"%s\" to IPv4: %s", host,
				  gai_strerror(ret));
			return -EADDRNOTAVAIL;
		}
		in = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
		freeaddrinfo(res);
	}
	ret = rdma_open_device(t->dev_name, &ctx);
	if (ret)
		ferry_warn("rdma: rank %u: cannot open device %s to read its GID table: %s; is "
			   "/dev/infiniband there and readable by this user?",
			   rank, t->dev_name, strerror(-ret));
	if (!in.s_addr || (ntohl(in.s_addr) >> 24) == 127) {
		/* rdma_cm cannot use loopback: take the device's own IPv4 address */
		int ok = -1;

		if (env_idx >= 0) {
			ok = rdma_gid_ipv4(ctx, t->port_num, env_idx, &g);
			found = env_idx;
		}
		for (int i = 0; env_idx < 0 && i < RDMA_GID_SCAN && ok; i++) {
			ok = rdma_gid_ipv4(ctx, t->port_num, i, &g);
			found = i;
		}
		if (ok) {
			ferry_err("rdma: rank %u: the bind address \"%s\" cannot carry rdma_cm and "
				  "device %s port %u has no RoCE v2 IPv4 GID%s to use instead; set "
				  "FERRY_BIND_ADDR to the IPv4 address of the interface %s sits on",
				  rank, host && *host ? host : "(none)", t->dev_name, t->port_num,
				  env_idx >= 0 ? " at FERRY_RDMA_GID_INDEX" : "", t->dev_name);
			ret = -EADDRNOTAVAIL;
			goto out_close;
		}
		inet_ntop(AF_INET, &g, ip, sizeof(ip));
		ferry_info(
			"rdma: rank %u: rdma_cm cannot use the bind address \"%s\"; listening on "
			"%s, the address of %s (GID index %d), instead",
			rank, host && *host ? host : "(none)", ip, t->dev_name, found);
		in = g;
	} else {
		for (int i = 0; i < RDMA_GID_SCAN && found < 0; i++)
			if (!rdma_gid_ipv4(ctx, t->port_num, i, &g) && g.s_addr == in.s_addr)
				found = i;
		if (env_idx >= 0 &&
		    (rdma_gid_ipv4(ctx, t->port_num, env_idx, &g) || g.s_addr != in.s_addr))
			ferry_warn(
				"rdma: rank %u: FERRY_RDMA_GID_INDEX=%d is not the RoCE v2 GID of "
				"the bind address %s on %s port %u; rdma_cm uses the address's "
				"own GID%s",
				rank, env_idx, host, t->dev_name, t->port_num,
				found >= 0 ? "" : " (none among the first 16 entries)");
		else if (env_idx >= 0)
			found = env_idx;
	}
	t->gid_index = found;
	t->src_sa = (struct sockaddr_in){ .sin_family = AF_INET, .sin_addr = in };
	ret = 0;
out_close:
	if (ctx)
		ibv_close_device(ctx);
	return ret;
}

/*
 * ferry__rdma_probe - can this transport run here?
 *
 * The device FERRY_RDMA_DEVICE (or any) must exist and have an active port,
 * and rdma_cm's device node must be there. Cheap; leaves nothing open.
 */
int ferry__rdma_probe(const char **why_p)
{
	char name[IBV_SYSFS_NAME_MAX];
	const char *why = NULL;
	uint8_t port;
	int ret;

	ret = ferry__rdma_pick_device(name, &port, &why);
	if (!ret && access("/dev/infiniband/rdma_cm", R_OK | W_OK)) {
		why = "rdma_cm is unavailable (/dev/infiniband/rdma_cm is missing or not "
		      "accessible: load rdma_ucm)";
		ret = -FERRY_E_NODEV;
	}
	if (ret && why_p)
		*why_p = why;
	return ret;
}

/* ---- listening cm_id ----------------------------------------------------- */

/*
 * ferry__rdma_tp_listen - create the event channel and the listening cm_id on the bind
 * address; the cm_id's device becomes ours
 */
int ferry__rdma_tp_listen(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank;
	struct sockaddr_in sa = t->src_sa;
	struct rdma_conn *l;
	const char *dn;
	char ip[INET_ADDRSTRLEN];
	int ret;

	inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
	t->ec = rdma_create_event_channel();
	if (!t->ec) {
		ret = -errno;
		ferry_err("rdma: rank %u: rdma_create_event_channel: %s (is rdma_ucm loaded?)", me,
			  strerror(errno));
		return ret ? ret : -FERRY_E_NODEV;
	}
	ret = ferry__rdma_set_nonblock(t->ec->fd);
	if (ret)
		goto err_destroy_channel;
	l = calloc(1, sizeof(*l));
	if (!l) {
		ret = -ENOMEM;
		goto err_destroy_channel;
	}
	l->kind = RDMA_CONN_LISTEN;
	l->rank = UINT32_MAX;
	if (rdma_create_id(t->ec, &l->id, l, RDMA_PS_TCP)) {
		ret = -errno;
		ferry_err("rdma: rank %u: rdma_create_id: %s", me, strerror(errno));
		goto err_free_listen;
	}
	if (rdma_bind_addr(l->id, (struct sockaddr *)&sa) || rdma_listen(l->id, 128)) {
		ret = -errno;
		ferry_err("rdma: rank %u: cannot listen on %s: %s; the address must belong to this "
			  "host and to the interface of an RDMA device: set FERRY_BIND_ADDR to it, "
			  "or FERRY_SOCKET_IFNAME to that interface",
			  me, ip, strerror(errno));
		goto err_destroy_id;
	}
	if (!l->id->verbs) {
		ret = -EADDRNOTAVAIL;
		ferry_err("rdma: rank %u: the bind address %s is not on an RDMA device's "
			  "interface; set FERRY_BIND_ADDR to the IPv4 address of the interface %s "
			  "sits on",
			  me, ip, t->dev_name);
		goto err_destroy_id;
	}
	dn = ibv_get_device_name(l->id->verbs->device);
	if (strcmp(dn, t->dev_name)) {
		if (getenv("FERRY_RDMA_DEVICE") && *getenv("FERRY_RDMA_DEVICE")) {
			ret = -EADDRNOTAVAIL;
			ferry_err("rdma: rank %u: the bind address %s belongs to device %s, not to "
				  "FERRY_RDMA_DEVICE=%s; bind to an address of %s's interface",
				  me, ip, dn, t->dev_name, t->dev_name);
			goto err_destroy_id;
		}
		ferry_info("rdma: rank %u: the bind address %s belongs to device %s; using it", me,
			   ip, dn);
		snprintf(t->dev_name, sizeof(t->dev_name), "%s", dn);
	}
	if (l->id->port_num)
		t->port_num = l->id->port_num;
	sa.sin_port = rdma_get_src_port(l->id);
	snprintf(t->addr, sizeof(t->addr), "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
	t->ctx = l->id->verbs;
	t->listen = l;
	return 0;

err_destroy_id:
	rdma_destroy_id(l->id);
err_free_listen:
	free(l);
err_destroy_channel:
	rdma_destroy_event_channel(t->ec);
	t->ec = NULL;
	return ret;
}

void ferry__rdma_unlisten(struct rdma_tp *t)
{
	if (t->listen) {
		rdma_destroy_id(t->listen->id);
		free(t->listen);
		t->listen = NULL;
	}
	rdma_destroy_event_channel(t->ec);
	t->ec = NULL;
}

/* ---- verbs resources ----------------------------------------------------- */

/* size the queues to the device; Return: 0 or a negative errno (logged) */
int ferry__rdma_query(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank, world = t->base.cfg.world;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	uint32_t depth = RDMA_SQ_DEPTH;
	int ret;

	ret = ibv_query_device(t->ctx, &da);
	if (!ret)
		ret = ibv_query_port(t->ctx, t->port_num, &pa);
	if (ret) {
		ferry_err("rdma: rank %u: querying %s: %s", me, t->dev_name, strerror(ret));
		return -ret;
	}
	if ((uint32_t)da.max_qp_wr < depth)
		depth = (uint32_t)da.max_qp_wr;
	/* one send CQ holds every peer's work requests */
	if (world > 1 && (uint64_t)depth * world + 64 > (uint64_t)da.max_cqe)
		depth = (uint32_t)((da.max_cqe - 64) / world);
	if (depth < RDMA_SQ_MIN || (uint32_t)da.max_qp_wr < RDMA_RECVS ||
	    (uint64_t)RDMA_RECVS * world + 64 > (uint64_t)da.max_cqe) {
		ferry_err("rdma: rank %u: device %s is too small for %u nodes (max_qp_wr %d, "
			  "max_cqe %d)",
			  me, t->dev_name, world, da.max_qp_wr, da.max_cqe);
		return -ENOSPC;
	}
	t->sq_depth = depth;
	t->max_rd = RDMA_MAX_RD;
	if ((uint32_t)da.max_qp_rd_atom < t->max_rd)
		t->max_rd = (uint32_t)da.max_qp_rd_atom;
	if ((uint32_t)da.max_qp_init_rd_atom < t->max_rd)
		t->max_rd = (uint32_t)da.max_qp_init_rd_atom;
	t->max_msg = pa.max_msg_sz ? pa.max_msg_sz : UINT32_MAX;
	/* FERRY_RDMA_INLINE: bytes of inline data asked (0: none); FERRY_RDMA_CORK_US: the
	 * gap under which a small frame may wait behind sends in flight (0: never; docs/rdma.md) */
	t->inline_want =
		(uint32_t)ferry__rdma_env_int("FERRY_RDMA_INLINE", 0, 4096, RDMA_INLINE_WANT);
	t->cork_ns = ferry__rdma_env_int("FERRY_RDMA_CORK_US", 0, 1000000, RDMA_CORK_US) * 1000;
	ferry_dbg("rdma: rank %u: %s port %u (active MTU %d bytes), GID index %d, send queue %u, "
		  "%u READs in flight",
		  me, t->dev_name, t->port_num, 128 << pa.active_mtu, t->gid_index, t->sq_depth,
		  t->max_rd);
	return 0;
}

/* PD, completion channel, the two CQs */
int ferry__rdma_verbs_init(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank, world = t->base.cfg.world;
	int ret;

	t->pd = ibv_alloc_pd(t->ctx);
	if (!t->pd) {
		ret = -errno;
		ferry_err("rdma: rank %u: ibv_alloc_pd: %s", me, strerror(errno));
		return ret ? ret : -ENOMEM;
	}
	t->cc = ibv_create_comp_channel(t->ctx);
	if (!t->cc) {
		ret = -errno;
		ferry_err("rdma: rank %u: ibv_create_comp_channel: %s", me, strerror(errno));
		goto err_dealloc_pd;
	}
	ret = ferry__rdma_set_nonblock(t->cc->fd);
	if (ret)
		goto err_destroy_channel;
	t->scq = ibv_create_cq(t->ctx, (int)(t->sq_depth * world + 64), NULL, t->cc, 0);
	if (!t->scq) {
		ret = -errno;
		ferry_err("rdma: rank %u: ibv_create_cq: %s", me, strerror(errno));
		goto err_destroy_channel;
	}
	t->rcq = ibv_create_cq(t->ctx, (int)(RDMA_RECVS * world + 64), NULL, t->cc, 0);
	if (!t->rcq) {
		ret = -errno;
		ferry_err("rdma: rank %u: ibv_create_cq: %s", me, strerror(errno));
		goto err_destroy_scq;
	}
	if (!t->base.cfg.busy_poll &&
	    (ibv_req_notify_cq(t->scq, 0) || ibv_req_notify_cq(t->rcq, 0))) {
		ret = -EIO;
		ferry_err("rdma: rank %u: ibv_req_notify_cq failed", me);
		goto err_destroy_rcq;
	}
	return 0;

err_destroy_rcq:
	ibv_destroy_cq(t->rcq);
err_destroy_scq:
	ibv_destroy_cq(t->scq);
err_destroy_channel:
	ibv_destroy_comp_channel(t->cc);
err_dealloc_pd:
	ibv_dealloc_pd(t->pd);
	return ret ? ret : -ENOMEM;
}

void ferry__rdma_verbs_fini(struct rdma_tp *t)
{
	ibv_destroy_cq(t->rcq);
	ibv_destroy_cq(t->scq);
	ibv_destroy_comp_channel(t->cc);
	ibv_dealloc_pd(t->pd);
}

/* ---- peers and their buffers --------------------------------------------- */

/* the peers and their buffers: one region, registered once */
int ferry__rdma_peers_init(struct rdma_tp *t)
{
	uint32_t me = t->base.cfg.rank, world = t->base.cfg.world, r;
	size_t per = (size_t)(RDMA_RECVS + RDMA_SBUFS) * RDMA_CHUNK;
	int ret;

	t->peers = calloc(world, sizeof(*t->peers));
	t->dirty = calloc(world, sizeof(*t->dirty));
	t->up = calloc(world, sizeof(*t->up));
	t->dials = calloc(world, sizeof(*t->dials));
	if (!t->peers || !t->dirty || !t->up || !t->dials) {
		ret = -ENOMEM;
		goto err_free;
	}
	t->region_len = per * (world - 1);
	if (t->region_len) {
		ret = ferry__rdma_memlock_check(me, t->region_len, "the message buffers");
		if (ret)
			goto err_free;
		t->region = mmap(NULL, t->region_len, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (t->region == MAP_FAILED) {
			ret = -errno;
			t->region = NULL;
			ferry_err("rdma: rank %u: cannot map %zu bytes of buffers: %s", me,
				  t->region_len, strerror(errno));
			goto err_free;
		}
		t->region_mr = ibv_reg_mr(t->pd, t->region, t->region_len, IBV_ACCESS_LOCAL_WRITE);
		if (!t->region_mr) {
			ret = -errno;
			ferry_err("rdma: rank %u: registering %zu bytes of message buffers failed: "
				  "%s%s",
				  me, t->region_len, strerror(errno),
				  errno == ENOMEM || errno == EPERM || errno == EAGAIN ?
					  "; check the memlock limit (`ulimit -l`; raise it with "
					  "`ulimit -l unlimited`, or memlock in "
					  "/etc/security/limits.conf)" :
					  "");
			goto err_unmap;
		}
		__atomic_add_fetch(&ferry__rdma_pinned, t->region_len, __ATOMIC_RELAXED);
		t->pinned = t->region_len;
	}
	for (r = 0; r < world; r++) {
		struct rdma_peer *p = &t->peers[r];

		ret = -pthread_mutex_init(&p->lock, NULL);
		if (!ret) {
			/* the back-pressure wait is bounded on the monotonic clock */
			ret = -ferry__cond_init_monotonic(&p->q_drained);
			if (ret)
				pthread_mutex_destroy(&p->lock);
		}
		if (!ret && r != me) {
			size_t slot = r < me ? r : r - 1;

			p->sig = calloc(t->sq_depth, sizeof(*p->sig));
			if (!p->sig) {
				pthread_cond_destroy(&p->q_drained);
				pthread_mutex_destroy(&p->lock);
				ret = -ENOMEM;
			}
			p->rbuf = (unsigned char *)t->region + slot * per;
			p->sbuf = p->rbuf + (size_t)RDMA_RECVS * RDMA_CHUNK;
		}
		if (ret)
			goto err_destroy_peers;
		p->rank = r;
	}
	for (r = 0; r < me; r++)
		t->dials[r].backoff_ms = RDMA_RETRY_MIN_MS;
	t->missing = world - 1;
	return 0;

err_destroy_peers:
	while (r--) {
		free(t->peers[r].sig);
		pthread_cond_destroy(&t->peers[r].q_drained);
		pthread_mutex_destroy(&t->peers[r].lock);
	}
	if (t->region_mr) {
		ibv_dereg_mr(t->region_mr);
		__atomic_sub_fetch(&ferry__rdma_pinned, t->pinned, __ATOMIC_RELAXED);
		t->region_mr = NULL;
		t->pinned = 0;
	}
err_unmap:
	if (t->region)
		munmap(t->region, t->region_len);
	t->region = NULL;
err_free:
	free(t->dials);
	free(t->up);
	free(t->dirty);
	free(t->peers);
	t->peers = NULL;
	return ret;
}

void ferry__rdma_peers_fini(struct rdma_tp *t)
{
	for (uint32_t r = 0; r < t->base.cfg.world; r++) {
		struct rdma_peer *p = &t->peers[r];
		struct rdma_qent *e, *next;

		for (e = p->q_head; e; e = next) {
			next = e->next;
			free(e->op);
			free(e);
		}
		free(p->asm_buf);
		free(p->sig);
		pthread_cond_destroy(&p->q_drained);
		pthread_mutex_destroy(&p->lock);
	}
	if (t->region_mr) {
		ibv_dereg_mr(t->region_mr);
		__atomic_sub_fetch(&ferry__rdma_pinned, t->pinned, __ATOMIC_RELAXED);
	}
	if (t->region)
		munmap(t->region, t->region_len);
	free(t->dials);
	free(t->up);
	free(t->dirty);
	free(t->peers);
	t->peers = NULL;
}

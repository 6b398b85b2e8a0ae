/* SPDX-License-Identifier: MIT */
/*
 * config.c - where rank, world and the rendezvous come from, in order:
 * params, FERRY_* variables, torchrun (RANK WORLD_SIZE MASTER_ADDR
 * MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*), PMI (PMI_RANK PMI_SIZE), Slurm
 * (SLURM_PROCID SLURM_NTASKS). The log says which source was used.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "lib/core/config.h"
#include "lib/core/netif.h"
#include "transport/base/log.h"

const struct ferry_option ferry__options[] = {
	{ "FERRY_RANK", "rank", "launcher's", "this node's rank, 0 .. world-1" },
	{ "FERRY_WORLD", "world", "launcher's, else 1", "number of nodes" },
	{ "FERRY_RENDEZVOUS", "rendezvous", "MASTER_ADDR:MASTER_PORT+1, else PMIx",
	  "host:port where rank 0 gathers the nodes' addresses" },
	{ "FERRY_BIND_ADDR", "bind_addr", "the route's address",
	  "address this node listens on; 0.0.0.0: every interface, peers told the route's" },
	{ "FERRY_SOCKET_IFNAME", "-", "the route to the rendezvous",
	  "interface to listen on: eth,ib prefixes; =eth0 exact; ^docker,lo all but" },
	{ "FERRY_TRANSPORT", "transport", "auto",
	  "auto, tcp or rdma (loop: tests, one-sided access emulated in one process)" },
	{ "FERRY_TIMEOUT_MS", "timeout_ms", "30000", "bound on every wait, in milliseconds" },
	{ "FERRY_BUSY_POLL", "busy_poll", "0", "1: spin instead of sleeping (lower latency)" },
	{ "FERRY_MEM_LIMIT", "mem_limit", "none",
	  "bytes of table values a node may hold (K, M, G suffixes); past it: ENOMEM" },
	{ "FERRY_TOKEN", "token", "none",
	  "the cluster's shared secret: every connection proves it; none: anyone may join" },
	{ "FERRY_TOKEN_FILE", "-", "none", "a file whose first line is the token (keep it 0600)" },
	{ "FERRY_HEARTBEAT_MS", "heartbeat_ms", "5000",
	  "a peer silent this long is failed (beats every quarter of it); 0: off" },
	{ "FERRY_REJOIN", "rejoin", "0",
	  "1: ask a running cluster to take this node back for a failed rank; refused yet" },
	{ "FERRY_RECONNECT_MS", "-", "1000",
	  "tcp, rdma: bound on re-establishing a broken link; 0: it fails the peer" },
	{ "FERRY_LOG_LEVEL", "ferry_log_set()", "warn", "none, error, warn, info, debug" },
	{ "FERRY_LOG_FORMAT", "-", "%t %h:%p r%r ferry %l: %m",
	  "line prefix: %t time %D date %h host %p pid %r rank %l level %s subsystem %m message" },
	{ "FERRY_LOG_FILE", "-", "stderr", "log file; %h host, %p pid, %r rank in the name" },
	{ "FERRY_LOG_SUBSYS", "-", "all",
	  "subsystems whose warn/info/debug lines to keep (bootstrap,tcp) or drop (^tcp)" },
	{ "FERRY_TCP_FAULT_RESET_MS", "-", "0", "tests: break a tcp connection every N ms" },
	{ "FERRY_CONS_FAULT_EVERY", "-", "0",
	  "tests: every Nth push batch frame of a consistency model is lost or fails" },
	{ "FERRY_RDMA_FAULT_BREAK_MS", "-", "0", "tests: break an rdma link every N ms" },
	{ "FERRY_COLL_ALGO", "ferry_coll_algo_set()", "auto",
	  "collectives: auto (by size), doubling (and binomial tree) or ring (and chain)" },
	{ "FERRY_COLL_CROSSOVER", "-", "262144",
	  "collectives: bytes from which auto takes the ring" },
	{ "FERRY_COLL_ZCOPY", "-", "1",
	  "collectives: 0 offers no memory and writes none (ring and chain by message)" },
	{ "FERRY_COLL_ZCOPY_MIN", "-", "65536",
	  "collectives: bytes from which ring and chain put by WRITE (same on every node)" },
	{ "FERRY_COLL_POLL", "-", "1",
	  "collectives over tcp: 0: the progress thread takes every frame, a waiter only yields" },
	{ "FERRY_COLL_IMM", "-", "1",
	  "collectives: 0 puts segments as WRITE + a COLL_PUT frame, not WRITE with immediate" },
	{ "FERRY_COLL_YIELD", "-", "auto",
	  "collectives: 1: a waiter with nothing to read yields at once; auto: if ranks > CPUs here" },
	{ "FERRY_RDMA_DEVICE", "-", "first with an active port", "RDMA device to use" },
	{ "FERRY_RDMA_GID_INDEX", "-", "the RoCE v2 GID of the IPv4 address",
	  "GID index for RoCE" },
	{ NULL, NULL, NULL, NULL },
};

#define CONFIG_TOKEN_MAX 4096 /* bytes of a token */
#define CONFIG_TOKEN_SHORT 16 /* fewer can be guessed from a recorded handshake */

/* the first line of @path into @buf; Return: its length, or -EINVAL logged */
static int config_token_file(const char *path, char *buf, size_t len)
{
	struct stat st;
	size_t n;
	FILE *f;

	f = fopen(path, "re");
	if (!f) {
		ferry_err("config: cannot read FERRY_TOKEN_FILE=%s: %s; fix the path or its "
			  "permissions",
			  path, strerror(errno));
		return -EINVAL;
	}
	if (!fstat(fileno(f), &st) && (st.st_mode & 077))
		ferry_warn("config: the token file %s can be read by other users (mode %03o); "
			   "chmod 600 it",
			   path, (unsigned)(st.st_mode & 0777));
	n = fread(buf, 1, len - 1, f);
	fclose(f);
	buf[n] = '\0';
	buf[strcspn(buf, "\r\n")] = '\0';
	return (int)strlen(buf);
}

/* the token: params, FERRY_TOKEN, FERRY_TOKEN_FILE; 0 or -EINVAL logged */
static int config_token(const struct ferry_params *params, struct ferry_config *c)
{
	const char *env = getenv("FERRY_TOKEN"), *file = getenv("FERRY_TOKEN_FILE");
	char buf[CONFIG_TOKEN_MAX + 1];
	const char *tok = NULL;
	size_t len;
	int rc;

	if (params->token) {
		tok = params->token;
		c->auth_src = "the token parameter";
	} else if (env && *env) {
		if (file && *file) {
			ferry_err("config: both FERRY_TOKEN and FERRY_TOKEN_FILE are set; unset "
				  "one of them");
			return -EINVAL;
		}
		tok = env;
		c->auth_src = "FERRY_TOKEN";
	} else if (file && *file) {
		rc = config_token_file(file, buf, sizeof(buf));
		if (rc < 0)
			return rc;
		tok = buf;
		c->auth_src = "FERRY_TOKEN_FILE";
	}
	if (!tok) {
		int rdv = c->rank == 0 && !c->use_pmix; /* this node serves the rendezvous */
		int open_bind = strncmp(c->bind_addr, "127.", 4) != 0;
		int open_rdv = rdv && strncmp(c->rdv_host, "127.", 4) &&
			       strcmp(c->rdv_host, "localhost");

		if (c->world > 1 && (open_bind || open_rdv))
			ferry_warn(
				"config: no cluster token: anyone who can reach %s:%d or this "
				"node's transport port (%s) may join this cluster; set FERRY_TOKEN "
				"(or FERRY_TOKEN_FILE) to the same secret on every node, e.g. the "
				"output of `head -c 32 /dev/urandom | base64`",
				c->rdv_host, c->rdv_port, c->bind_addr);
		return 0;
	}
	len = strlen(tok);
	if (!len || len > CONFIG_TOKEN_MAX) {
		ferry_err("config: the token from %s is %s; give 1 to %d bytes", c->auth_src,
			  len ? "too long" : "empty", CONFIG_TOKEN_MAX);
		return -EINVAL;
	}
	if (len < CONFIG_TOKEN_SHORT)
		ferry_warn("config: the token from %s has %zu bytes: an eavesdropper can try "
			   "guesses against a recorded handshake; use %d or more random ones",
			   c->auth_src, len, CONFIG_TOKEN_SHORT * 2);
	rc = ferry__auth_key_from_token(tok, len, c->auth_key);
	ferry__auth_wipe(buf, sizeof(buf));
	if (rc)
		return rc;
	c->auth = 1;
	return 0;
}

void ferry_params_init(struct ferry_params *p)
{
	memset(p, 0, sizeof(*p));
	p->rank = -1;
	p->rendezvous_fd = -1;
	p->busy_poll = -1;
}

/* a whole non-negative decimal int, or -1 */
static int config_int(const char *s)
{
	char *end;
	long v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < 0 || v > INT_MAX)
		return -1;
	return (int)v;
}

/*
 * The rejoin switch: params.rejoin (1 yes, -1 no, 0 not set), then
 * FERRY_REJOIN (0 or 1) into c->rejoin. A rejoin asks the running cluster's
 * rank 0 (rejoin.c), which no replacement passes yet (docs/faults.md, "A
 * replacement node"); what can be refused without asking is refused here,
 * before the node listens or dials anything.
 * Return: 0, or -EINVAL after one log line.
 */
static int config_rejoin(const struct ferry_params *params, struct ferry_config *c)
{
	const char *s = NULL, *src = "params.rejoin";
	int rejoin = params->rejoin;

	if (rejoin < -1 || rejoin > 1) {
		ferry_err("config: rejoin %d is not -1 (no), 0 (from FERRY_REJOIN) or 1 (yes)",
			  rejoin);
		return -EINVAL;
	}
	if (!rejoin && (s = getenv("FERRY_REJOIN")) && *s) {
		rejoin = config_int(s);
		src = "FERRY_REJOIN";
		if (rejoin < 0 || rejoin > 1) {
			ferry_err("config: FERRY_REJOIN=%s is not 0 or 1", s);
			return -EINVAL;
		}
	}
	c->rejoin = rejoin > 0;
	if (!c->rejoin)
		return 0;
	if (c->world <= 1) {
		ferry_err("config: %s asks to replace a failed node of a running cluster, but the "
			  "world is 1 (from %s): there is no cluster to rejoin; give the cluster's "
			  "FERRY_WORLD and the failed node's FERRY_RANK, or unset FERRY_REJOIN",
			  src, c->rank_src);
		return -EINVAL;
	}
	if (c->rank == 0) {
		ferry_err("config: %s asks to replace rank 0, which no cluster can take back: rank "
			  "0 runs the barrier and the table handshakes, and a cluster that lost it "
			  "cannot coordinate (docs/membership.md); start the whole cluster again "
			  "and ferry_restore() its last checkpoint",
			  src);
		return -EINVAL;
	}
	if (c->use_pmix) {
		ferry_err("config: %s: a replacement finds its cluster at rank 0's rendezvous, and "
			  "this node has none (its addresses would come through PMIx); give the "
			  "cluster's FERRY_RENDEZVOUS=host:port",
			  src);
		return -EINVAL;
	}
	return 0;
}

struct config_src {
	const char *rank, *world, *name;
};

static const struct config_src config_srcs[] = {
	{ "FERRY_RANK", "FERRY_WORLD", "FERRY_RANK/FERRY_WORLD" },
	{ "RANK", "WORLD_SIZE", "torchrun RANK/WORLD_SIZE" },
	{ "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI OMPI_COMM_WORLD_RANK/SIZE" },
	{ "PMI_RANK", "PMI_SIZE", "PMI_RANK/PMI_SIZE" },
	{ "SLURM_PROCID", "SLURM_NTASKS", "Slurm SLURM_PROCID/SLURM_NTASKS" },
};

static int config_split_hostport(const char *s, struct ferry_config *c)
{
	const char *colon = strrchr(s, ':');
	size_t hl;
	int port;

	if (!colon || colon == s)
		return -EINVAL;
	hl = (size_t)(colon - s);
	if (hl >= sizeof(c->rdv_host))
		return -EINVAL;
	port = config_int(colon + 1);
	if (port < 0 || port > 65535)
		return -EINVAL;
	memcpy(c->rdv_host, s, hl);
	c->rdv_host[hl] = '\0';
	c->rdv_port = port;
	return 0;
}

/*
 * config_pmix - no rendezvous was given to a node of a world > 1: use the
 * PMIx server of the launcher (mpirun, srun --mpi=pmix) when there is one
 * and this build can talk to it; else say what to set
 */
static int config_pmix(struct ferry_config *c)
{
	int launched = getenv("PMIX_RANK") && getenv("PMIX_NAMESPACE");

#ifdef FERRY_HAVE_PMIX
	if (launched) {
		c->use_pmix = 1;
		c->rdv_src = c->rdv_var = "PMIx";
		snprintf(c->rdv_host, sizeof(c->rdv_host), "(PMIx)");
		return 0;
	}
	ferry_err("config: rank %d of %d has no rendezvous address; set FERRY_RENDEZVOUS=host:port "
		  "(where rank 0 listens) or MASTER_ADDR and MASTER_PORT, or start the ranks "
		  "with a PMIx launcher (mpirun, srun --mpi=pmix), whose server Ferry uses when no "
		  "rendezvous is set",
		  c->rank, c->world);
#else
	ferry_err("config: rank %d of %d has no rendezvous address; set FERRY_RENDEZVOUS=host:port "
		  "(where rank 0 listens) or MASTER_ADDR and MASTER_PORT%s",
		  c->rank, c->world,
		  launched ?
			  "; a PMIx launcher started this process, but this build of Ferry has no "
			  "PMIx (libpmix-dev was missing when it was built)" :
			  " (this build of Ferry has no PMIx: libpmix-dev was missing when it "
			  "was built)");
#endif
	return -EINVAL;
}

int ferry__config_resolve(const struct ferry_params *params, struct ferry_config *c)
{
	struct ferry_params dflt;
	const char *s;
	int v, rc;

	if (!params) {
		ferry_params_init(&dflt);
		params = &dflt;
	}
	memset(c, 0, sizeof(*c));
	c->rank = params->rank;
	c->world = params->world;
	c->rdv_fd = params->rendezvous_fd;
	c->rank_src = "params";

	if (c->rank < 0 || c->world <= 0) {
		for (size_t i = 0; i < sizeof(config_srcs) / sizeof(config_srcs[0]); i++) {
			const char *r = getenv(config_srcs[i].rank);
			const char *w = getenv(config_srcs[i].world);

			if (!r && !w)
				continue;
			if (c->rank < 0)
				c->rank = config_int(r);
			if (c->world <= 0)
				c->world = config_int(w);
			c->rank_src = config_srcs[i].name;
			if (c->rank < 0 || c->world <= 0) {
				ferry_err(
					"config: %s is set but not a valid rank and world (%s=%s, "
					"%s=%s); set both to whole numbers",
					c->rank_src, config_srcs[i].rank, r ? r : "(unset)",
					config_srcs[i].world, w ? w : "(unset)");
				return -EINVAL;
			}
			break;
		}
	}
	if (c->rank < 0 && c->world <= 0) {
		c->rank = 0;
		c->world = 1;
		c->rank_src = "default (a single node)";
	}
	if (c->rank < 0 || c->world <= 0 || c->rank >= c->world || c->world > 65535) {
		ferry_err("config: rank %d of world %d (from %s) is invalid; rank must be 0 .. "
			  "world-1 and world 1 .. 65535",
			  c->rank, c->world, c->rank_src);
		return -EINVAL;
	}

	ferry__log_set_rank(c->rank);

	s = params->rendezvous;
	c->rdv_src = "params";
	c->rdv_var = "the rendezvous parameter";
	if (!s) {
		s = getenv("FERRY_RENDEZVOUS");
		c->rdv_src = c->rdv_var = "FERRY_RENDEZVOUS";
	}
	if (s) {
		if (config_split_hostport(s, c)) {
			ferry_err("config: rendezvous '%s' (from %s) is not host:port", s,
				  c->rdv_src);
			return -EINVAL;
		}
	} else if (getenv("MASTER_ADDR") && getenv("MASTER_PORT")) {
		/* torch's own store listens on MASTER_PORT: take the next one */
		v = config_int(getenv("MASTER_PORT"));
		if (v < 0 || v >= 65535 || strlen(getenv("MASTER_ADDR")) >= sizeof(c->rdv_host)) {
			ferry_err("config: MASTER_ADDR/MASTER_PORT are not a usable address; set "
				  "FERRY_RENDEZVOUS=host:port");
			return -EINVAL;
		}
		snprintf(c->rdv_host, sizeof(c->rdv_host), "%s", getenv("MASTER_ADDR"));
		c->rdv_port = v + 1;
		c->rdv_src = "torchrun MASTER_ADDR/MASTER_PORT+1";
		c->rdv_var = "MASTER_ADDR";
	} else if (c->world > 1 && !(c->rank == 0 && c->rdv_fd >= 0)) {
		rc = config_pmix(c);
		if (rc)
			return rc;
	} else {
		snprintf(c->rdv_host, sizeof(c->rdv_host), "127.0.0.1");
		c->rdv_src = "default";
	}

	if (params->bind_addr) {
		s = params->bind_addr;
		rc = ferry__netif_pick(c, s, "the bind_addr parameter", !c->use_pmix);
	} else {
		s = getenv("FERRY_BIND_ADDR");
		rc = ferry__netif_pick(c, s, "FERRY_BIND_ADDR", !c->use_pmix);
	}
	if (rc)
		return rc;

	c->transport = params->transport;
	if (c->transport < FERRY_TRANSPORT_AUTO || c->transport > FERRY_TRANSPORT_LOOP) {
		ferry_err("config: transport %d is not FERRY_TRANSPORT_AUTO, _TCP, _RDMA or _LOOP",
			  (int)c->transport);
		return -EINVAL;
	}
	if (c->transport == FERRY_TRANSPORT_AUTO && (s = getenv("FERRY_TRANSPORT"))) {
		if (!strcasecmp(s, "tcp"))
			c->transport = FERRY_TRANSPORT_TCP;
		else if (!strcasecmp(s, "rdma"))
			c->transport = FERRY_TRANSPORT_RDMA;
		else if (!strcasecmp(s, "loop"))
			c->transport = FERRY_TRANSPORT_LOOP;
		else if (strcasecmp(s, "auto")) {
			ferry_err("config: FERRY_TRANSPORT=%s is not auto, tcp, rdma or loop", s);
			return -EINVAL;
		}
	}

	c->timeout_ms = params->timeout_ms;
	if (c->timeout_ms <= 0) {
		s = getenv("FERRY_TIMEOUT_MS");
		c->timeout_ms = s ? config_int(s) : 30000;
		if (c->timeout_ms <= 0) {
			ferry_err("config: FERRY_TIMEOUT_MS=%s is not a positive number of ms", s);
			return -EINVAL;
		}
	}
	c->busy_poll = params->busy_poll;
	if (c->busy_poll > 1) {
		ferry_err("config: busy_poll %d is not -1 (from FERRY_BUSY_POLL), 0 or 1",
			  c->busy_poll);
		return -EINVAL;
	}
	if (c->busy_poll < 0) {
		s = getenv("FERRY_BUSY_POLL");
		c->busy_poll = s ? config_int(s) : 0;
		if (c->busy_poll < 0 || c->busy_poll > 1) {
			ferry_err("config: FERRY_BUSY_POLL=%s is not 0 or 1", s);
			return -EINVAL;
		}
	}
	c->mem_limit = params->mem_limit;
	if (!c->mem_limit && (s = getenv("FERRY_MEM_LIMIT")) && *s) {
		char *end;
		unsigned long long lim;

		errno = 0;
		lim = strtoull(s, &end, 10);
		if (*end == 'K' || *end == 'k')
			lim <<= 10, end++;
		else if (*end == 'M' || *end == 'm')
			lim <<= 20, end++;
		else if (*end == 'G' || *end == 'g')
			lim <<= 30, end++;
		if (errno || *end || !lim || *s == '-') {
			ferry_err("config: FERRY_MEM_LIMIT=%s is not a positive number of bytes "
				  "(K, M, G suffixes allowed)",
				  s);
			return -EINVAL;
		}
		c->mem_limit = lim;
	}
	rc = config_token(params, c);
	if (rc)
		return rc;
	c->heartbeat_ms = params->heartbeat_ms;
	if (c->heartbeat_ms < -1) {
		ferry_err("config: heartbeat_ms %d is not -1 (off), 0 (from FERRY_HEARTBEAT_MS) or "
			  "a number of ms",
			  c->heartbeat_ms);
		return -EINVAL;
	}
	if (!c->heartbeat_ms) {
		s = getenv("FERRY_HEARTBEAT_MS");
		c->heartbeat_ms = s ? config_int(s) : FERRY_HEARTBEAT_MS_DEFAULT;
		if (c->heartbeat_ms < 0) {
			ferry_err("config: FERRY_HEARTBEAT_MS=%s is not a number of ms (0: off)",
				  s);
			return -EINVAL;
		}
		if (!c->heartbeat_ms)
			c->heartbeat_ms = -1;
	}
	if (c->heartbeat_ms > 0 && c->heartbeat_ms < 8) {
		ferry_err("config: a heartbeat timeout of %d ms is below the 8 ms minimum; raise "
			  "FERRY_HEARTBEAT_MS (or params.heartbeat_ms)",
			  c->heartbeat_ms);
		return -EINVAL;
	}
	rc = config_rejoin(params, c);
	if (rc)
		return rc;
	if (c->use_pmix)
		ferry_info("config: rank %d of %d (from %s), addresses through PMIx (no "
			   "rendezvous given)",
			   c->rank, c->world, c->rank_src);
	else
		ferry_info("config: rank %d of %d (from %s), rendezvous %s:%d (from %s)", c->rank,
			   c->world, c->rank_src, c->rdv_host, c->rdv_port, c->rdv_src);
	ferry_info("config: listening on %s, peers dial %s (%s)", c->bind_addr, c->adv_addr,
		   c->bind_why);
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * Ferry: an RDMA-native parameter store with dynamic parameter allocation.
 *
 * Every call that can fail returns 0 or a negative errno; Ferry's own failures
 * use codes at or above FERRY_ERRNO_BASE (returned negated, like errnos), and
 * ferry_strerror() explains both ranges. Output arguments come last, end in
 * _p, and are written only on success.
 */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1
#define FERRY_VERSION_PATCH 0
#define FERRY_VERSION_STRING "0.1.0"

/* Ferry's own error codes; functions return them negated. */
#define FERRY_ERRNO_BASE 4096
enum ferry_errno {
	FERRY_E_CLOSED = FERRY_ERRNO_BASE, /* the node was closed */
	FERRY_E_MISMATCH,		   /* nodes disagree (table parameters) */
	FERRY_E_PROTO,			   /* a peer sent a malformed message */
	FERRY_E_PEER,			   /* a peer failed or disconnected */
	FERRY_E_NOJOIN,			   /* a rank never joined the cluster */
	FERRY_E_NODEV,			   /* the requested transport is unusable */
	FERRY_E_MAX
};

/**
 * ferry_strerror - describe an error code
 * @err: a negative errno or negative Ferry code (the sign is ignored)
 *
 * Return: a static string; never NULL.
 */
FERRY_API const char *ferry_strerror(int err);

/**
 * ferry_version - the library's version string, e.g. "0.1.0"
 */
FERRY_API const char *ferry_version(void);

/* ---- logging ---------------------------------------------------------- */

enum ferry_log_level {
	FERRY_LOG_NONE = 0,
	FERRY_LOG_ERROR,
	FERRY_LOG_WARN,
	FERRY_LOG_INFO,
	FERRY_LOG_DEBUG,
};

typedef void (*ferry_log_cb_t)(enum ferry_log_level level, const char *msg, void *arg);

/**
 * ferry_log_set - route log lines to a callback and set the level
 * @level: lines above this level are dropped. FERRY_LOG_LEVEL (error, warn,
 *         info, debug, or 0-4) in the environment overrides it at first use.
 * @cb: receives each line without a trailing newline; NULL restores stderr
 * @arg: passed to @cb
 *
 * Context: process-wide; call before ferry_open() to be race free.
 */
FERRY_API void ferry_log_set(enum ferry_log_level level, ferry_log_cb_t cb, void *arg);

/* ---- nodes ------------------------------------------------------------ */

enum ferry_transport_kind {
	FERRY_TRANSPORT_AUTO = 0, /* rdma when a usable device and port exist, else tcp */
	FERRY_TRANSPORT_TCP,
	FERRY_TRANSPORT_RDMA,
	FERRY_TRANSPORT_LOOP, /* tests: tcp messages, one-sided access emulated in one process */
};

/**
 * struct ferry_params - how a node joins its cluster
 *
 * Zero (or -1 where noted) means "not set": the value then comes from the
 * FERRY_* environment variables, then from the launchers' own (torchrun,
 * Open MPI, PMI, Slurm), then from the default. ferry_params_init() fills in
 * the "not set" values.
 */
struct ferry_params {
	int rank;		/* -1: not set */
	int world;		/* 0: not set */
	const char *rendezvous; /* "host:port" of rank 0; NULL: not set */
	int rendezvous_fd;	/* rank 0 only: a listening socket to use; -1: none */
	const char *bind_addr;	/* address this node listens on ("0.0.0.0": all, peers told the
				 * route's); NULL: FERRY_BIND_ADDR, FERRY_SOCKET_IFNAME, or the
				 * local address of the route to the rendezvous */
	enum ferry_transport_kind transport; /* AUTO: FERRY_TRANSPORT or auto */
	int timeout_ms;			     /* bound on every wait; 0: FERRY_TIMEOUT_MS or 30000 */
	int busy_poll; /* -1: FERRY_BUSY_POLL or 0; 1: spin instead of sleeping */
	/* bytes this node may spend on table values (slots in use, all tables);
	 * past it, what needs a new slot here (a localize, a sparse key's first
	 * use) fails with -ENOMEM and the node goes on. 0: FERRY_MEM_LIMIT, or
	 * none */
	uint64_t mem_limit;
	/* the cluster's shared secret, any bytes up to a NUL: every connection
	 * (the rendezvous, each transport link) proves it without sending it,
	 * and one that cannot is refused. NULL: FERRY_TOKEN, then the first
	 * line of the file FERRY_TOKEN_FILE names, else none (anyone who can
	 * reach the ports may join: docs/security.md) */
	const char *token;
	/* the membership manager (docs/membership.md): NULL: FERRY_ETCD_ENDPOINTS,
	 * or none: the embedded one (rank 0). "http://host:port[,http://...]":
	 * etcd keeps the membership, each node's key held by a lease */
	const char *etcd_endpoints;
	/* seconds a node's etcd lease lives without a renewal: a node that stops
	 * (killed, stopped, cut off) is declared dead within about this; 0:
	 * FERRY_ETCD_TTL or 5 */
	int etcd_ttl;
	/* failure detector: a peer from which nothing arrived for this many ms
	 * (every node sends a heartbeat each quarter of it) is declared failed.
	 * 0: FERRY_HEARTBEAT_MS, or 5000; -1: off (only transport events, such
	 * as a reset connection, fail a peer, and tables with replicas are not
	 * fenced: docs/faults.md, "Fencing") */
	int heartbeat_ms;
	/* 1: this process replaces a failed node (the same rank) of a running
	 * cluster instead of forming a new one: it asks the cluster's rank 0 at
	 * the rendezvous; 0: FERRY_REJOIN, or no; -1: no. No replacement is
	 * admitted yet: ferry_open fails with rank 0's verdict (-EOPNOTSUPP for
	 * a rank failed at rank 0 and every live rank, -EEXIST for one alive
	 * somewhere, -EAGAIN when a live rank did not answer) and a line that
	 * says what to do
	 * instead; -EINVAL for rank 0 or a world of 1 (docs/faults.md, "A
	 * replacement node") */
	int rejoin;
};

/**
 * ferry_params_init - set every field of @params to "not set"
 */
FERRY_API void ferry_params_init(struct ferry_params *params);

struct ferry;
struct ferry_table;
struct ferry_worker;

/**
 * ferry_open - join the cluster as one node
 * @params: may be NULL (everything from the environment)
 * @fy_p: receives the node handle on success
 *
 * Rank 0 gathers every node's address and hands out the list; every node
 * then connects to every other one. All waits are bounded by the timeout;
 * a timeout names the ranks that never arrived (-FERRY_E_NOJOIN).
 *
 * Context: any thread; blocks until the whole world has joined.
 * Return: 0, or a negative errno / Ferry code.
 */
FERRY_API int ferry_open(const struct ferry_params *params, struct ferry **fy_p);

/**
 * ferry_close - leave the cluster
 *
 * Stops the network. Workers and tables that still exist keep their memory
 * until destroyed, and every operation on them returns -FERRY_E_CLOSED. The
 * node's memory goes when the last of them is destroyed.
 *
 * Context: not concurrently with operations of this node's workers.
 */
FERRY_API void ferry_close(struct ferry *fy);

FERRY_API int ferry_rank(const struct ferry *fy);
FERRY_API int ferry_world(const struct ferry *fy);

/**
 * ferry_barrier - wait until every node has entered the barrier
 *
 * Return: 0, -ETIMEDOUT (naming the missing ranks in the log), -FERRY_E_CLOSED.
 */
FERRY_API int ferry_barrier(struct ferry *fy);

/**
 * ferry_epoch - the membership epoch this node has seen
 *
 * With etcd as the manager, the etcd revision of the last membership change
 * this node saw (every node registered; later, a node's key gone): it only
 * grows, and two nodes that saw the same changes report the same value. With
 * the embedded manager (rank 0), 0.
 */
FERRY_API uint64_t ferry_epoch(const struct ferry *fy);

/* ---- tables ----------------------------------------------------------- */

enum ferry_placement {
	FERRY_PLACEMENT_RANGE = 0, /* contiguous blocks of keys per node */
	FERRY_PLACEMENT_HASH,	   /* consistent-hash ring with virtual nodes */
};

enum ferry_mode {
	FERRY_MODE_DYNAMIC = 0, /* localize moves keys (Lapse) */
	FERRY_MODE_CLASSIC,	/* static placement: localize does nothing */
};

/*
 * A table's consistency model (docs/consistency.md, "Models"). SEQUENTIAL is
 * what every operation on a table had before the others existed, and keeps
 * its code path. The others buffer pushes on the pushing node and serve pulls
 * from a per-node cache; ferry_clock() ends a worker's iteration.
 */
enum ferry_consistency {
	FERRY_CONS_SEQUENTIAL = 0, /* every operation done at the owner before it returns */
	FERRY_CONS_EVENTUAL,	   /* pushes buffered; reads from a copy until the next clock */
	FERRY_CONS_SSP,		   /* stale synchronous parallel, bound `staleness` clocks */
	FERRY_CONS_ESSP,	   /* SSP, and read keys refreshed eagerly at each clock */
};

/* the values a key has before its first write (see ferry_table_params) */
enum ferry_init {
	FERRY_INIT_ZERO = 0, /* every float 0 */
	FERRY_INIT_UNIFORM,  /* uniform in [init_a, init_b) */
	FERRY_INIT_NORMAL,   /* normal, mean init_a, standard deviation init_b */
};

/* how pushes travel on the wire (struct ferry_table_params.push_codec) */
enum ferry_push_codec {
	FERRY_CODEC_NONE = 0, /* 32-bit floats: exact */
	FERRY_CODEC_BF16 = 1, /* bfloat16 with error feedback */
	FERRY_CODEC_FP16 = 2, /* IEEE 754 half with error feedback (saturates at 65504) */
};

struct ferry_table_params {
	uint64_t num_keys;	    /* keys are 0 .. num_keys-1; 0 with sparse */
	uint32_t value_len;	    /* floats per value, when value_lens is NULL */
	const uint32_t *value_lens; /* optional: floats per key, num_keys entries */
	enum ferry_placement placement;
	uint32_t vnodes; /* hash ring: virtual nodes per node; 0: 1024 */
	enum ferry_mode mode;
	int no_local_fast_path; /* 1: even local keys go through messages */
	uint64_t capacity;	/* slots per node; 0: every key + 64 (sparse: 2^20) */
	/*
	 * sparse = 1: keys are any uint64_t (num_keys 0, one value_len). A key
	 * comes into being at its home when it is first used; until then it
	 * reads as its initial value, and no node spends memory on it.
	 */
	int sparse;
	/* initial values, computed from (init_seed, key, index) alone, so every
	 * node and every run agrees without a message */
	enum ferry_init init;
	float init_a, init_b;
	uint64_t init_seed;
	/* location hints this node keeps for keys it does not own (16 bytes
	 * each; a power of two); 0: 65536. Need not agree across nodes. */
	uint64_t loc_cache;
	/* consistency model (must agree); staleness: SSP/ESSP's bound s in
	 * clocks (must agree; 0 for the others); cons_bytes: bytes this node
	 * may spend on cached values and unsent deltas of this table (need not
	 * agree; 0: 64 MiB). */
	enum ferry_consistency consistency;
	uint32_t staleness;
	uint64_t cons_bytes;
	/*
	 * replicas: backup copies of each key on other nodes (0, 1 or 2; 0:
	 * none, today's speed; below the number of nodes). With r >= 1, a push
	 * or set is acknowledged only once every backup of the key holds it,
	 * and when a node fails its keys fail over to their backups
	 * (docs/faults.md). Not with sparse. Must agree.
	 */
	uint32_t replicas;
	/*
	 * push_codec: how this node's pushes travel (docs/compression.md).
	 * BF16 and FP16 send 16 bits per value; what rounding leaves out is
	 * kept here, per worker and key, and added to that key's next push
	 * (error feedback), so no part of a delta is dropped: ferry_flush()
	 * sends what is kept, exactly. Need not agree across nodes. Only with
	 * SEQUENTIAL consistency and one value_len; ferry_push_start() is then
	 * -EOPNOTSUPP. codec_keys: keys a worker keeps residuals for (0:
	 * 65536); past it, a push first flushes them.
	 */
	enum ferry_push_codec push_codec;
	uint32_t codec_keys;
	/*
	 * Hot keys (NuPS; docs/consistency.md, "Hot keys"): hot_keys[0 ..
	 * hot_count) have a replica on every node. A pull of one reads this
	 * node's replica; a push adds to it and to this node's deltas, which
	 * every node sends to every other in the background, every
	 * hot_sync_ms (0: 10; at most 60000), summed per key, applied once at
	 * every replica. ferry_flush() sends them at once and waits until
	 * every node applied them. A set of a hot key is -EINVAL (they start
	 * at params.init). With SSP or ESSP a clock also sends them, and
	 * the bound holds for them. Distinct keys below num_keys, at most
	 * FERRY_HOT_MAX; not with sparse or push_codec. Must agree.
	 */
	const uint64_t *hot_keys;
	uint32_t hot_count;
	uint32_t hot_sync_ms;
	/*
	 * hot_auto: instead of hot_keys, up to hot_auto keys (at most
	 * FERRY_HOT_MAX) are chosen from what the nodes access: each node
	 * counts its pulls and pushes of the table's keys (Misra-Gries, 320 x
	 * hot_auto bytes at most), and every ferry_hot_update() makes the keys
	 * counted most across all nodes the hot keys, until the next. The table
	 * starts with none. SEQUENTIAL or EVENTUAL dense tables, without push_codec
	 * (docs/consistency.md, "Hot keys"). Must agree.
	 */
	uint32_t hot_auto;
};

#define FERRY_HOT_MAX 65536u /* most hot keys of a table */

/**
 * ferry_table_create - create a table on every node (collective)
 * @fy: the node
 * @params: must be equal on every node
 * @table_p: receives the table
 *
 * Every node calls it, in the same order. Values start at their initial
 * value (params->init: zeros by default). Returns once every node has
 * created the table, so any node may use it at once.
 *
 * Return: 0; -EINVAL for bad parameters; -FERRY_E_MISMATCH when nodes passed
 * different parameters (the log names the field); -ETIMEDOUT.
 */
FERRY_API int ferry_table_create(struct ferry *fy, const struct ferry_table_params *params,
				 struct ferry_table **table_p);

/**
 * ferry_table_destroy - give up this node's side of a table
 *
 * Every node calls it (in the same order as the creates). This node stops
 * using @table at once but keeps serving the other nodes (messages and
 * one-sided access to its registered memory) until every live node has
 * destroyed it; the memory is freed then, at this node's next
 * ferry_table_create, ferry_table_destroy or ferry_close, and the table's id
 * is reused by a later create. A node that never destroys it holds the
 * others' memory until they close (or, at their next create, for at most the
 * timeout, with a warning).
 *
 * Context: after this node's workers stopped using it (waited for every
 * ticket on it); never blocks.
 */
FERRY_API void ferry_table_destroy(struct ferry_table *table);

/* what one node holds for a table: memory follows what it owns */
struct ferry_table_stats {
	uint64_t keys_owned;	   /* keys live on this node */
	uint64_t keys_away;	   /* keys homed here that live on another node */
	uint64_t dir_bytes;	   /* directory: owned keys, owner records, location cache */
	uint64_t slots;		   /* slots of the arena */
	uint64_t slot_bytes;	   /* bytes per slot (header, value, seal) */
	uint64_t registered_bytes; /* registered with the transport (pinned on RDMA) */
	uint64_t backups;	   /* replicas: copies of other nodes' keys kept here */
	uint64_t backup_bytes;	   /* their bytes, with their map */
	uint64_t slots_free;	   /* slots once used and free again (keys that left, after
				    * their grace period): touched memory a key that comes
				    * takes before any fresh slot */
};

/** ferry_table_stats - this node's share of @table. Return: 0 or -EINVAL. */
FERRY_API int ferry_table_stats(struct ferry_table *table, struct ferry_table_stats *stats_p);

/** ferry_table_home - the home node of @key, or a negative errno */
FERRY_API int ferry_table_home(const struct ferry_table *table, uint64_t key);

/** ferry_table_value_len - floats stored for @key, or 0 when out of range */
FERRY_API uint32_t ferry_table_value_len(const struct ferry_table *table, uint64_t key);

/* ---- workers and operations ------------------------------------------ */

/**
 * ferry_worker_create - a handle for one application thread
 *
 * Registers the calling thread with RCU; the worker must be used and
 * destroyed by that same thread.
 */
FERRY_API int ferry_worker_create(struct ferry *fy, struct ferry_worker **worker_p);
FERRY_API void ferry_worker_destroy(struct ferry_worker *worker);

/*
 * Batched operations. @keys has @n entries; @vals / @deltas hold the values
 * of those keys back to back (value_len floats each). Duplicate keys are
 * allowed: each occurrence is one operation, applied in array order.
 *
 * The synchronous calls return when every key is done. Their effect on one
 * key is sequentially consistent with every other synchronous operation on
 * it, whatever relocations run meanwhile. On a table with another
 * consistency model (enum ferry_consistency) a push returns once buffered on
 * this node and a pull may return a copy within the model's bound; a set
 * writes through (docs/consistency.md, "Models").
 *
 * Return: 0; -EINVAL (NULL buffer, n == 0 with a NULL keys is fine),
 * -ERANGE (a key out of range), -ETIMEDOUT, -FERRY_E_PEER, -FERRY_E_CLOSED.
 */
FERRY_API int ferry_pull(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			 size_t n, float *vals);
FERRY_API int ferry_push(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			 size_t n, const float *deltas);
FERRY_API int ferry_set(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			size_t n, const float *vals);
/**
 * ferry_localize - move ownership of @keys to this node
 *
 * Afterwards the calling node's workers reach these keys in place, without a
 * message, until another node localizes them. In classic mode it does
 * nothing. Return: as above, and -ENOSPC when the table's capacity is full.
 */
FERRY_API int ferry_localize(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			     size_t n);

/**
 * ferry_clock - end the calling worker's current iteration (clock)
 *
 * A worker's clock starts at the node's clock when the worker is created,
 * and goes up by one per call; the node's clock is the least clock of its
 * workers (so every worker of a node that uses a table with a model keeps
 * calling it, or is destroyed: one that stops holds every node's SSP and
 * ESSP workers back, up to the timeout). When the node's clock
 * moves on, the pushes this node buffered for EVENTUAL, SSP and ESSP tables
 * are sent to their owners (one batch per table, coalesced per key) and
 * applied there before the other nodes hear of the new clock. On SSP and
 * ESSP tables a worker then waits until the slowest node is at most
 * `staleness` clocks behind it (the least bound of this node's such tables).
 *
 * Context: @w's thread. Return: 0; -ETIMEDOUT (the log names the slowest rank
 * and its clock); -FERRY_E_PEER (the slowest node failed); what a push
 * returns (the deltas of that batch are then dropped, logged);
 * -FERRY_E_CLOSED.
 */
FERRY_API int ferry_clock(struct ferry_worker *w);

/** ferry_clock_get - @w's clock: the clock its reads and pushes belong to */
FERRY_API uint64_t ferry_clock_get(const struct ferry_worker *w);

/**
 * ferry_hot_update - choose a hot_auto table's hot keys again (collective)
 *
 * Every node calls it once, with one of its workers, while no worker of any
 * node has an operation on @t under way (for example between two
 * ferry_barrier()s); it returns on each node once every node has the new
 * hot keys. Each node's hot_auto most counted keys are summed across the
 * nodes, and the hot_auto highest sums (ties: the lower key) are the new
 * hot keys, the same on every node. A key that stops being hot gets its
 * replica's value (which holds every push) in its slot; a key that becomes
 * hot gets its slot's value in every replica: nothing pushed is lost or
 * counted twice. The counts are halved after, so older accesses weigh less.
 * Transient memory: 16 x world x hot_auto bytes.
 *
 * Return: 0; -EINVAL (no hot_auto, not @t's node: logged); -ETIMEDOUT,
 * -FERRY_E_PEER (a node did not take part: the hot keys may then differ
 * between nodes; recreate the table); -ENOMEM; -FERRY_E_CLOSED.
 */
FERRY_API int ferry_hot_update(struct ferry_worker *w, struct ferry_table *t);

/**
 * ferry_hot_keys - @t's hot keys on this node, ascending, into @keys
 * (the first @cap of them; @keys may be NULL when @cap is 0)
 *
 * Return: how many hot keys @t has (more than @cap when they did not all
 * fit); -EINVAL (a NULL table, or @keys NULL with @cap > 0).
 */
FERRY_API int ferry_hot_keys(struct ferry_table *t, uint64_t *keys, uint32_t cap);

/**
 * ferry_flush - send this node's buffered pushes of @t now and drop its
 * cached values of @t
 *
 * On a SEQUENTIAL table it does nothing, but for a push_codec: there it
 * sends, exactly, what @w's compressed pushes of @t left out (their
 * residuals). After every node flushed and then passed a ferry_barrier(),
 * every pull on every node returns every push made before the flushes.
 * Context: @w's thread. Return: as ferry_push().
 */
FERRY_API int ferry_flush(struct ferry_worker *w, struct ferry_table *t);

/*
 * Asynchronous variants: start the operation and hand back a ticket. The
 * buffers stay the caller's and must stay valid until ferry_wait() or
 * ferry_test() reports the ticket done. Operations of one worker on one key
 * take effect in the order they were started. A start that fails leaves no
 * ticket behind. On a table with a consistency model other than SEQUENTIAL
 * the pull, push and set variants return -EOPNOTSUPP (localize works).
 */
FERRY_API int ferry_pull_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			       size_t n, float *vals, uint64_t *ticket_p);
FERRY_API int ferry_push_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			       size_t n, const float *deltas, uint64_t *ticket_p);
FERRY_API int ferry_set_start(struct ferry_worker *w, struct ferry_table *t, const uint64_t *keys,
			      size_t n, const float *vals, uint64_t *ticket_p);
FERRY_API int ferry_localize_start(struct ferry_worker *w, struct ferry_table *t,
				   const uint64_t *keys, size_t n, uint64_t *ticket_p);

/**
 * ferry_wait - wait for a ticket (bounded by the node's timeout)
 *
 * Return: the operation's result (0 or negative); -ENOENT for an unknown or
 * already collected ticket.
 */
FERRY_API int ferry_wait(struct ferry_worker *w, uint64_t ticket);

/**
 * ferry_test - poll a ticket
 *
 * Return: -EAGAIN while it runs; otherwise as ferry_wait(), and the ticket is
 * collected.
 */
FERRY_API int ferry_test(struct ferry_worker *w, uint64_t ticket);

/* ---- collectives ------------------------------------------------------ */

/*
 * Collectives over every node of the cluster, or of a group of nodes (below;
 * docs/collectives.md). Every
 * node calls the same collectives in the same order, with the same count,
 * type, operator and root; a node that finds another's call different fails
 * that collective with -FERRY_E_MISMATCH (logged) and every later one too.
 * They run beside tables and workers, from any application thread, one
 * collective per call; the buffers are the caller's and must not be touched
 * until the collective is done. Buffers are aligned to their element size.
 * A node numbers its collectives in the order their calls start: threads of
 * one node that start collectives concurrently must order them themselves,
 * the same way on every node.
 *
 * Algorithms (by the size of the buffer, count x element size):
 *  - below the crossover (FERRY_COLL_CROSSOVER_DEFAULT; FERRY_COLL_CROSSOVER
 *    bytes in the environment) the latency-bound one: recursive doubling for
 *    all-reduce and reduce (a fix-up step for a world that is not a power of
 *    two), a binomial tree for broadcast;
 *  - from it up the bandwidth-bound one: a ring (reduce-scatter, then
 *    all-gather) for all-reduce and reduce, a pipelined chain along the ring
 *    for broadcast.
 * Every node gets bit-identical results.
 *
 * A peer failure ends every collective under way at once with -FERRY_E_PEER,
 * and every later one fails at once too; so does a timeout (-ETIMEDOUT): the
 * nodes are out of step after it.
 */
enum ferry_dtype {
	FERRY_FLOAT32 = 1,
	FERRY_FLOAT64,
	FERRY_INT64,
};

enum ferry_redop {
	FERRY_SUM = 1,
	FERRY_MAX,
	FERRY_MIN,
};

enum ferry_coll_algo {
	FERRY_COLL_ALGO_AUTO = 0, /* by size: the crossover below */
	FERRY_COLL_ALGO_DOUBLING, /* recursive doubling; broadcast: binomial tree */
	FERRY_COLL_ALGO_RING,	  /* ring; broadcast: pipelined chain */
};

/* bytes from which AUTO takes the ring (measured: docs/collectives.md) */
#define FERRY_COLL_CROSSOVER_DEFAULT (256u << 10)

/* a started collective: ferry_coll_wait() or ferry_coll_test() collects it */
struct ferry_coll;

/**
 * ferry_allreduce - combine every node's @src element by element into every
 * node's @dst
 * @src: @count elements; @src == @dst combines in place (no other overlap)
 * @dst: receives the result on every node
 * @count: elements; 0 returns at once (every node must pass 0 then)
 * @dtype, @op: FERRY_FLOAT32 / FERRY_FLOAT64 / FERRY_INT64 (sums of which
 *              wrap); FERRY_SUM / FERRY_MAX / FERRY_MIN
 *
 * Context: any application thread; blocks until done, bounded by the node's
 * timeout. Return: 0; -EINVAL (a NULL or misaligned buffer, an unknown type
 * or operator, overlapping buffers: logged); -EBUSY (16 collectives started
 * and not collected); -FERRY_E_PEER, -FERRY_E_MISMATCH, -ETIMEDOUT,
 * -FERRY_E_CLOSED, -ENOMEM.
 */
FERRY_API int ferry_allreduce(struct ferry *fy, const void *src, void *dst, size_t count,
			      enum ferry_dtype dtype, enum ferry_redop op);

/**
 * ferry_reduce - as ferry_allreduce, but only @root's @dst receives the
 * result; @dst is not used (may be NULL) on the other nodes
 *
 * Return: as ferry_allreduce, and -EINVAL for a root out of range.
 */
FERRY_API int ferry_reduce(struct ferry *fy, const void *src, void *dst, size_t count,
			   enum ferry_dtype dtype, enum ferry_redop op, int root);

/**
 * ferry_broadcast - copy @root's @buf into every node's @buf
 *
 * Returns on the root once every node has the data. Return: as
 * ferry_allreduce.
 */
FERRY_API int ferry_broadcast(struct ferry *fy, void *buf, size_t count, enum ferry_dtype dtype,
			      int root);

/**
 * ferry_allreduce_start - start an all-reduce and hand back its handle
 * @coll_p: receives the handle, written only on success
 *
 * The collective makes progress on the node's progress thread while the
 * caller does other work. At most 16 per node are started and not yet
 * collected. A start that fails leaves no handle behind. ferry_reduce_start
 * and ferry_broadcast_start likewise.
 */
FERRY_API int ferry_allreduce_start(struct ferry *fy, const void *src, void *dst, size_t count,
				    enum ferry_dtype dtype, enum ferry_redop op,
				    struct ferry_coll **coll_p);
FERRY_API int ferry_reduce_start(struct ferry *fy, const void *src, void *dst, size_t count,
				 enum ferry_dtype dtype, enum ferry_redop op, int root,
				 struct ferry_coll **coll_p);
FERRY_API int ferry_broadcast_start(struct ferry *fy, void *buf, size_t count,
				    enum ferry_dtype dtype, int root, struct ferry_coll **coll_p);

/**
 * ferry_coll_wait - wait for a started collective and free its handle
 *
 * Context: any thread, once per handle. Return: the collective's result.
 */
FERRY_API int ferry_coll_wait(struct ferry_coll *coll);

/**
 * ferry_coll_test - poll a started collective
 *
 * Return: -EAGAIN while it runs (the handle stays); otherwise its result,
 * and the handle is freed.
 */
FERRY_API int ferry_coll_test(struct ferry_coll *coll);

/**
 * ferry_coll_algo_set - force an algorithm on this node (tests, benchmarks)
 * @algo: FERRY_COLL_ALGO_AUTO restores the choice by size; FERRY_COLL_ALGO
 *        (auto, doubling, ring) in the environment sets it at ferry_open
 *
 * Every node must choose alike (a difference is a -FERRY_E_MISMATCH).
 * Context: between collectives. Return: 0 or -EINVAL.
 */
FERRY_API int ferry_coll_algo_set(struct ferry *fy, enum ferry_coll_algo algo);

/*
 * Groups: collectives among some of the nodes. A group is an ordered list
 * of member ranks; a member's index in it is its rank in the group (roots
 * of ferry_group_reduce/_broadcast are such indices). Every member creates
 * the group with the same list in the same order, and only members do
 * (no communication: the list itself names the group, so two groups of
 * one node must differ in their members or their order). Collectives of
 * a group follow the rules above among its members, numbered per group:
 * groups run side by side, and a failure of a node ends only the
 * collectives of the groups it is a member of (and of the whole cluster).
 * Frames of a group that a slower member has not created yet are kept
 * (for at most 16 such groups, 64 collectives into each).
 */
struct ferry_group;

/**
 * ferry_group_create - this node's handle to the group of @ranks
 * @ranks: @n distinct ranks of the world, this node's among them
 * @group_p: receives the handle, written only on success
 *
 * Context: any application thread. Return: 0; -EINVAL (a bad list, logged:
 * empty, a rank out of range or twice, this node missing); -EEXIST (this
 * node has a group of that list); -ENOMEM.
 */
FERRY_API int ferry_group_create(struct ferry *fy, const uint32_t *ranks, size_t n,
				 struct ferry_group **group_p);

/**
 * ferry_group_destroy - free a group's handle (NULL: nothing)
 *
 * Call it once the group's collectives are collected, on every member;
 * ferry_close frees the groups left. Return: 0, or -EBUSY (collectives
 * started and not collected; the group stays).
 */
FERRY_API int ferry_group_destroy(struct ferry_group *group);

/* the collectives above, among the members of @group: same arguments and
 * errors, with roots as member indices */
FERRY_API int ferry_group_allreduce(struct ferry_group *group, const void *src, void *dst,
				    size_t count, enum ferry_dtype dtype, enum ferry_redop op);
FERRY_API int ferry_group_reduce(struct ferry_group *group, const void *src, void *dst,
				 size_t count, enum ferry_dtype dtype, enum ferry_redop op,
				 int root);
FERRY_API int ferry_group_broadcast(struct ferry_group *group, void *buf, size_t count,
				    enum ferry_dtype dtype, int root);
FERRY_API int ferry_group_allreduce_start(struct ferry_group *group, const void *src, void *dst,
					  size_t count, enum ferry_dtype dtype, enum ferry_redop op,
					  struct ferry_coll **coll_p);
FERRY_API int ferry_group_reduce_start(struct ferry_group *group, const void *src, void *dst,
				       size_t count, enum ferry_dtype dtype, enum ferry_redop op,
				       int root, struct ferry_coll **coll_p);
FERRY_API int ferry_group_broadcast_start(struct ferry_group *group, void *buf, size_t count,
					  enum ferry_dtype dtype, int root,
					  struct ferry_coll **coll_p);

/* ---- statistics ------------------------------------------------------- */

struct ferry_stats {
	uint64_t local_ops;	  /* key operations served in place */
	uint64_t remote_ops;	  /* key operations sent to another node */
	uint64_t served_ops;	  /* key operations this node applied for others */
	uint64_t forwards;	  /* key operations this node passed on */
	uint64_t relocations_in;  /* keys that moved to this node */
	uint64_t relocations_out; /* keys that moved away from this node */
	uint64_t msgs_sent;
	uint64_t msgs_recv;
	uint64_t bytes_sent;
	uint64_t bytes_recv;
	uint64_t onesided_reads;     /* one-sided reads posted (pulls, retries included) */
	uint64_t onesided_retries;   /* reads repeated because the slot was being written */
	uint64_t onesided_fallbacks; /* pulls that fell back to a message (moved, stale) */
	/* key reads of SSP and ESSP tables by observed staleness: how many
	 * clocks the value read was behind the reader's clock (the value held
	 * every update of clocks below reader clock - i); the last bucket
	 * counts FERRY_STALENESS_BUCKETS - 1 clocks and more */
#define FERRY_STALENESS_BUCKETS 17
	uint64_t staleness[FERRY_STALENESS_BUCKETS];
	/* key reads of tables with a model other than SEQUENTIAL: served from
	 * this node's copy, or pulled from the owner (then kept as the copy);
	 * keys ESSP re-read eagerly at clock boundaries */
	uint64_t cons_hits, cons_misses, cons_refreshed;
	/* ESSP's owner pushes (docs/consistency.md, "ESSP"): keys this node
	 * subscribed to at their owners; values it pushed, as an owner, to
	 * subscribers; pushed values it took as its copies; and those it
	 * refused (its own deltas in flight or newer, an older value, a
	 * subscription it dropped or renewed since) */
	uint64_t essp_subscribed, essp_pushed, essp_taken, essp_refused;
	/* bytes the transport's message buffers hold now (tcp: the send logs'
	 * chunks, their reuse pools, the receive buffers' written pages; 0
	 * for a transport that does not say, and once the node is closed).
	 * They follow what is in flight: tcp gives a burst's back within 2 x
	 * 100 ms of its end (docs/transport-tcp.md, "Memory") */
	uint64_t tp_buffer_bytes;
	/* ranks this node holds failed, declared here (transport, heartbeat,
	 * membership manager) or learned from a peer; a failed rank stays
	 * failed for the node's life (docs/faults.md) */
	uint64_t peers_failed;
};

/**
 * ferry_stats - counters of this node since it opened
 * @fy: the node (may be closed)
 * @stats_p: filled in
 */
FERRY_API int ferry_stats(struct ferry *fy, struct ferry_stats *stats_p);

/* ---- checkpoints ------------------------------------------------------ */

/*
 * A checkpoint of a table is a folder: one shard file per node (the keys it
 * owned and their values, shard-<rank>-of-<world>.fck) and manifest.json
 * (the table's parameters, the node count, each shard's file, key count,
 * size and XXH3-64 checksum), written by rank 0 last, so a folder with a
 * manifest holds a whole checkpoint (docs/checkpoints.md). The folder must
 * be one every node can read and write (a shared file system, or one
 * machine).
 *
 * Consistency: every operation acknowledged on any node before that node
 * called the checkpoint is in it, and none started after the call returned.
 * Every node calls it at the same point (a clock boundary of training):
 * once its workers finished every operation on the table they started
 * (synchronous calls returned, tickets waited), and none starts another
 * until ferry_table_checkpoint_start() returns. The call marks the point: a
 * barrier, a copy of the values this node owns into memory, a barrier; the
 * shard is written afterwards, while training goes on.
 */
struct ferry_checkpoint;

/**
 * ferry_table_checkpoint_start - mark a checkpoint of @table (collective)
 * @table: the table; every node calls it, in the same order as its other
 *         collectives (barriers, all-reduces, creates)
 * @dir: the folder (created if missing); every node passes the same
 * @ckpt_p: receives the handle: pass it to ferry_checkpoint_wait()
 *
 * Returns once every node copied what it owns: training may go on. A
 * thread of this node writes the shard meanwhile.
 *
 * Context: any application thread, as said above. Return: 0; -EINVAL;
 * -ENOMEM (the copy); -EBUSY (a key was moving at the mark: an operation
 * was still under way); mkdir's or unlink's -errno for the folder (logged);
 * -ETIMEDOUT, -FERRY_E_PEER (a barrier). A failure on any node fails every
 * node, and leaves no handle.
 */
FERRY_API int ferry_table_checkpoint_start(struct ferry_table *table, const char *dir,
					   struct ferry_checkpoint **ckpt_p);

/**
 * ferry_checkpoint_wait - finish a checkpoint (collective) and free @ckpt
 *
 * Waits for this node's shard, then every node's status and checksum go to
 * every node (an all-reduce) and rank 0 writes the manifest. Every node
 * returns the same result: the checkpoint is whole, or it failed somewhere
 * (the node that failed logged the file and the cause).
 *
 * Context: the thread that started it, before @table is destroyed or the
 * node closed; a collective: every node calls it in the same order as its
 * other collectives. Return: 0; -EIO (a node could
 * not write its shard or the manifest); -ETIMEDOUT, -FERRY_E_PEER.
 */
FERRY_API int ferry_checkpoint_wait(struct ferry_checkpoint *ckpt);

/** ferry_table_checkpoint - ferry_table_checkpoint_start(), then ferry_checkpoint_wait() */
FERRY_API int ferry_table_checkpoint(struct ferry_table *table, const char *dir);

/**
 * ferry_table_restore - load a checkpoint into @table (collective)
 * @table: a table created with the same num_keys, value lengths, sparse
 *         flag and initial values as the checkpointed one; placement, mode,
 *         capacity and the node count may differ
 * @dir: the checkpoint's folder
 *
 * Every node reads the manifest and every shard, checks sizes and
 * checksums, and keeps the values of the keys it owns now; only once every
 * node found the whole checkpoint good does any node install them, so a bad
 * checkpoint leaves the table as it was on every node. A sparse key that is
 * not in the checkpoint reads as its initial value afterwards.
 *
 * Context: every node, with no operation on @table running on any node
 * (as for ferry_table_checkpoint_start); returns once every node installed.
 * Return: 0; -ENOENT (no manifest or a shard missing); -EBADMSG (a file is
 * truncated or corrupt: the log names the file and the fault);
 * -FERRY_E_MISMATCH (the checkpoint is of another kind of table: the log
 * names the field); -EBUSY (a key of the checkpoint found no node that
 * owns it: an operation ran meanwhile); -ENOMEM, -ENOSPC; -ETIMEDOUT,
 * -FERRY_E_PEER. When any node fails, every node fails (with its own
 * error, or else the lowest error of the cluster) and the table is
 * unchanged (docs/checkpoints.md).
 */
FERRY_API int ferry_table_restore(struct ferry_table *table, const char *dir);

/* ---- local clusters (tests, demos) ------------------------------------- */

/**
 * ferry_local_cluster_open - @n nodes inside this process, over loopback
 * @n: number of nodes
 * @params: template (rank, world and rendezvous are set here); may be NULL
 * @fys: receives @n node handles, rank i at index i
 *
 * Each node is opened on a thread of its own; the ports are chosen by the OS.
 * Nodes listen on 127.0.0.1, or on FERRY_BIND_ADDR when set (RDMA needs the
 * address of the RDMA interface); the rendezvous stays on 127.0.0.1.
 */
FERRY_API int ferry_local_cluster_open(int n, const struct ferry_params *params,
				       struct ferry **fys);

/**
 * ferry_local_cluster_fork - @n forked processes, one node each
 * @n: number of processes
 * @params: receives, in each child, the rank, world and rendezvous to pass
 *          to ferry_open()
 * @pids: in the parent, receives the @n child pids
 *
 * The children share a rendezvous socket that the parent bound to port 0
 * before forking; child 0 serves it.
 *
 * Return: in child i, i (0 <= i < @n); in the parent, FERRY_LOCAL_PARENT;
 * a negative errno on failure (no child then remains).
 */
#define FERRY_LOCAL_PARENT 0x7fffffff
FERRY_API int ferry_local_cluster_fork(int n, struct ferry_params *params, pid_t *pids);

#ifdef __cplusplus
}
#endif
#endif /* FERRY_FERRY_H */

/* SPDX-License-Identifier: MIT */
/*
 * mf.h - ferry-mf: matrix factorization by distributed SGD (DSGD) on Ferry.
 *
 * The reusable part of the ferry-mf benchmark (the static library
 * ferry_mf_core): a MatrixMarket reader, a synthetic low-rank generator and
 * the DSGD trainer. The trainer uses only the public API, <ferry/ferry.h>.
 *
 * Every function that can fail returns 0 or a negative errno and never
 * exits; where a message helps, it is written to a caller's buffer (@err)
 * or to stderr, naming the cause.
 */
#ifndef FERRY_BENCH_MF_H
#define FERRY_BENCH_MF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <ferry/ferry.h>

/* ---- matrices --------------------------------------------------------- */

/* one observed entry; indices are 0-based */
struct mf_entry {
	uint32_t i;
	uint32_t j;
	float v;
};

struct mf_matrix {
	uint64_t rows;
	uint64_t cols;
	size_t nnz;
	struct mf_entry *e; /* nnz entries, malloc'd; owned by the matrix */
};

/* largest number of rows or columns: indices are stored in 32 bits */
#define MF_MAX_DIM ((uint64_t)UINT32_MAX)

/** mf_matrix_free - free @m's entries and zero it; @m may be zeroed already */
void mf_matrix_free(struct mf_matrix *m);

/**
 * mf_mmio_read - read a MatrixMarket coordinate file
 * @path: the file
 * @m_p: receives the matrix (0-based indices) on success
 * @err: receives a message "PATH:LINE: what is wrong" on failure; may be NULL
 * @errlen: size of @err
 *
 * Accepts "%%MatrixMarket matrix coordinate real|integer general" with
 * 1-based indices; comment lines (%) and blank lines are skipped.
 *
 * Return: 0; -EINVAL for a wrong header, an out-of-range index, a malformed,
 * truncated or missing line, or extra entries; -ENOMEM; the -errno of
 * fopen() or a read error.
 */
int mf_mmio_read(const char *path, struct mf_matrix *m_p, char *err, size_t errlen);

/**
 * mf_mmio_write - write @m as a MatrixMarket coordinate real general file
 *
 * Return: 0 or a negative errno.
 */
int mf_mmio_write(const char *path, const struct mf_matrix *m);

/* ---- synthetic data ----------------------------------------------------- */

struct mf_synth_params {
	uint64_t rows;
	uint64_t cols;
	size_t nnz;	 /* training entries */
	size_t test_nnz; /* test entries, drawn the same way */
	uint32_t rank;	 /* true rank */
	double noise;	 /* stddev of the Gaussian noise added to each entry */
	uint64_t seed;
};

/**
 * mf_synth_parse - parse "ROWSxCOLS:NNZ[:RANK[:NOISE]]"
 * @spec: the string
 * @p: rows, cols, nnz, and rank and noise when given, are written; other
 *     fields are left alone (set the defaults first)
 * @err: receives a message on failure; may be NULL
 *
 * Return: 0 or -EINVAL.
 */
int mf_synth_parse(const char *spec, struct mf_synth_params *p, char *err, size_t errlen);

/**
 * mf_synth_generate - a random low-rank matrix with noise
 *
 * W* (rows x rank) and H* (cols x rank) have independent N(0, 1/sqrt(rank))
 * entries (variance 1/sqrt(rank)), so that w*.h* has variance 1; each entry
 * sits at a uniformly random (i, j) and has the value w*_i.h*_j + N(0,
 * noise^2). The same parameters give the same matrices, bit for bit.
 *
 * Return: 0, -EINVAL or -ENOMEM.
 */
int mf_synth_generate(const struct mf_synth_params *p, struct mf_matrix *train_p,
		      struct mf_matrix *test_p);

/**
 * mf_split - move @test_nnz random entries of @all into a test matrix
 * @all: emptied on success (its entries move to the outputs)
 *
 * Return: 0, -EINVAL (more test entries than there are) or -ENOMEM.
 */
int mf_split(struct mf_matrix *all, size_t test_nnz, uint64_t seed, struct mf_matrix *train_p,
	     struct mf_matrix *test_p);

/* ---- random numbers: xoshiro256**, seeded by splitmix64 ---------------- */

struct mf_rng {
	uint64_t s[4];
};

static inline uint64_t mf_splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* a stream of its own for every (seed, stream) pair */
static inline void mf_rng_init(struct mf_rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t x = seed ^ mf_splitmix64(&stream);

	for (int i = 0; i < 4; i++)
		r->s[i] = mf_splitmix64(&x);
}

static inline uint64_t mf_rng_next(struct mf_rng *r)
{
	uint64_t *s = r->s;
	uint64_t res = ((s[1] * 5) << 7 | (s[1] * 5) >> 57) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = s[3] << 45 | s[3] >> 19;
	return res;
}

/* uniform in [0, 1) */
static inline double mf_rng_uniform(struct mf_rng *r)
{
	return (double)(mf_rng_next(r) >> 11) * 0x1.0p-53;
}

/* uniform in [0, n) for n > 0 (multiply-shift; the bias is below 2^-32) */
static inline uint64_t mf_rng_below(struct mf_rng *r, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)mf_rng_next(r) * n) >> 64);
}

/* standard normal (Box-Muller, one value per call) */
double mf_rng_normal(struct mf_rng *r);

/* ---- training ------------------------------------------------------------ */

enum mf_mode {
	MF_MODE_DYNAMIC = 0, /* W rows localized once, H blocks rotate by localize */
	MF_MODE_CLASSIC,     /* static placement: the same SGD, remote accesses stay */
};

#define MF_MAX_EPOCHS 1000

struct mf_config {
	int nodes;   /* Ferry nodes of the local cluster */
	int threads; /* worker threads per node */
	int procs;   /* 1: nodes are forked processes; 0: threads of this process */
	enum ferry_transport_kind transport;
	enum mf_mode mode;
	uint32_t rank;	 /* factor rank (value_len of every key) */
	double lr;	 /* learning rate of the first epoch */
	double decay;	 /* lr *= decay after every epoch */
	double reg;	 /* L2 regularization */
	double init;	 /* initial factors uniform in [-init, init] / rank^(1/4) */
	int epochs;	 /* 1 .. MF_MAX_EPOCHS */
	uint64_t seed;	 /* initial factors */
	FILE *progress;	 /* a line per epoch goes here; NULL: quiet */
	const char *tag; /* prefix of the progress lines; may be NULL */
	/* the factor table's consistency model (docs/consistency.md); with one
	 * other than SEQUENTIAL the workers end each block with ferry_clock()
	 * instead of meeting at a barrier */
	enum ferry_consistency consistency;
	uint32_t staleness; /* SSP, ESSP: the bound s */
};

/** mf_config_init - the defaults (2 nodes x 1 thread, dynamic, rank 16, ...) */
void mf_config_init(struct mf_config *cfg);

struct mf_epoch {
	double seconds;	    /* wall time of the SGD pass (evaluation excluded) */
	double comm_share;  /* share of worker time in non-local Ferry calls */
	double reloc_share; /* of which: in ferry_localize */
	double wait_share;  /* share of worker time in barriers */
	double train_mse;   /* mean squared error of the training entries, as seen by SGD */
	double test_rmse;   /* after the epoch; NaN without test entries */
	double lr;	    /* learning rate used */
	double local_ops;   /* key operations served in place, all nodes */
	double remote_ops;  /* key operations sent to another node, all nodes */
	/* reads of the factor table by clocks behind (SSP, ESSP), all nodes */
	double stale[FERRY_STALENESS_BUCKETS];
	double copy_hits, copy_misses; /* reads from a node's copy / from the owner */
};

struct mf_result {
	int epochs; /* epochs done */
	double setup_seconds;
	struct mf_epoch ep[MF_MAX_EPOCHS];
};

/**
 * mf_train - factorize @train by DSGD on a local Ferry cluster
 * @cfg: nodes, threads, mode, hyper-parameters
 * @train: the training entries (dimensions rows x cols)
 * @test: test entries of the same dimensions; may have nnz 0
 * @res: filled with the per-epoch figures
 *
 * Opens cfg->nodes nodes (threads of this process, or forked processes with
 * cfg->procs), trains, and closes them again. Errors are reported on stderr
 * naming the failing call.
 *
 * Context: a forked child (cfg->procs) runs only inside this function and
 * ends with _exit(); the caller sees only the parent return.
 * Return: 0, -EINVAL (bad @cfg), -ENOMEM, or the error of a Ferry call.
 */
int mf_train(const struct mf_config *cfg, const struct mf_matrix *train,
	     const struct mf_matrix *test, struct mf_result *res);

/** mf_mean_epoch_seconds - mean SGD time per epoch of @res (0 without epochs) */
double mf_mean_epoch_seconds(const struct mf_result *res);

#endif /* FERRY_BENCH_MF_H */

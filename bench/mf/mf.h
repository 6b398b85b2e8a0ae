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

/* a data file being read: where, for error messages */
struct mf_parse {
	const char *path;
	size_t line; /* 0: not in a line */
	char *err;   /* the message, "path:line: ...", or NULL */
	size_t errlen;
};

/** mf_parse_fail - write "path:line: <fmt>" into @c's err; return @rc */
int mf_parse_fail(struct mf_parse *c, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

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

/* ---- rating files and id maps (ratings.c) --------------------------------- */

enum mf_format {
	MF_FORMAT_AUTO = 0, /* by the first line: mf_format_detect() */
	MF_FORMAT_MM,	    /* MatrixMarket coordinate (mf_mmio_read) */
	MF_FORMAT_CSV,	    /* user,item,rating[,...]; MovieLens ratings.csv */
	MF_FORMAT_TSV,	    /* user<TAB>item<TAB>rating[...]; MovieLens u.data */
	MF_FORMAT_DAT,	    /* user::item::rating[::...]; MovieLens ratings.dat */
};

/** mf_format_name - "auto", "mm", "csv", "tsv" or "dat" */
const char *mf_format_name(enum mf_format fmt);

/** mf_format_parse - the format named @s; Return: 0 or -EINVAL */
int mf_format_parse(const char *s, enum mf_format *fmt_p);

/**
 * mf_format_detect - the format of @path from its first line that is not
 * blank or a comment: a '%%MatrixMarket' header, then '::', a tab, a comma
 *
 * Return: 0, -EINVAL (cannot tell; @err says so) or the -errno of fopen().
 */
int mf_format_detect(const char *path, enum mf_format *fmt_p, char *err, size_t errlen);

/*
 * Raw ids (strings) to dense indices 0..n-1 in the order they were first
 * seen. Memory: one copy of each id, and at most 4 slots of 4 bytes per id
 * (the hash table is kept at most half full).
 */
struct mf_ids {
	size_t n;	/* ids */
	size_t cap;	/* entries of @names */
	char **names;	/* names[k]: the raw id of dense index k */
	uint32_t *slot; /* hcap slots: dense index + 1, 0 for empty */
	size_t hcap;	/* a power of 2, 0 before the first id */
};

/**
 * mf_ids_get - the dense index of the raw id @raw (@len bytes)
 * @add: give a new id the next index; 0: an unknown id is -ENOENT
 *
 * Return: 0, -ENOENT, -E2BIG (MF_MAX_DIM - 1 ids already) or -ENOMEM.
 */
int mf_ids_get(struct mf_ids *ids, const char *raw, size_t len, int add, uint32_t *idx_p);

/** mf_ids_free - free @ids and zero it; @ids may be zeroed already */
void mf_ids_free(struct mf_ids *ids);

/**
 * mf_ratings_read - read a csv, tsv or dat rating file (ratings.c says what
 * each looks like); a first line whose rating is not a number is a header
 * @users, @items: the id maps, extended when @add
 * @add: 1 for training data; 0 for test data, whose ratings of ids the maps
 *       do not hold are left out and counted in *@unknown_p
 * @m_p: receives the ratings; its rows and cols are the maps' sizes
 *
 * Return: 0; -EINVAL with "PATH:LINE: cause" in @err for a malformed line;
 * -ENOMEM; -E2BIG (too many ids); the -errno of fopen().
 */
int mf_ratings_read(const char *path, enum mf_format fmt, struct mf_ids *users,
		    struct mf_ids *items, int add, struct mf_matrix *m_p, size_t *unknown_p,
		    char *err, size_t errlen);

/* ---- factors on disk (factors.c; docs/mf.md, "Saved factors") ----------- */

struct mf_factors {
	uint64_t rows, cols;
	uint32_t rank;
	float *w; /* rows x rank, row-major */
	float *h; /* cols x rank */
};

/** mf_factors_alloc - room for rows x rank and cols x rank floats; Return: 0, -EINVAL, -ENOMEM */
int mf_factors_alloc(struct mf_factors *f, uint64_t rows, uint64_t cols, uint32_t rank);

/** mf_factors_free - free @f and zero it */
void mf_factors_free(struct mf_factors *f);

struct json_t;

/**
 * mf_factors_save - write @fx into the folder @dir (created when missing)
 * @users, @items: the raw ids of the rows and columns; NULL: the 1-based
 *                 indices of a MatrixMarket file
 * @extra: a JSON value stored under "training" in factors.json; may be NULL
 *
 * Return: 0 or a negative errno, the cause in @err.
 */
int mf_factors_save(const char *dir, struct mf_factors *fx, const struct mf_ids *users,
		    const struct mf_ids *items, struct json_t *extra, char *err, size_t errlen);

/**
 * mf_factors_load - read what mf_factors_save() wrote
 * @users, @items: empty maps; with raw ids they receive the saved ids at
 *                 their saved indices
 * @raw_p: receives 1 for raw ids, 0 for MatrixMarket indices
 *
 * Return: 0; -EINVAL (a file does not match factors.json, a value is not
 * finite, an id repeats) or another negative errno, the cause in @err.
 */
int mf_factors_load(const char *dir, struct mf_factors *fx_p, struct mf_ids *users,
		    struct mf_ids *items, int *raw_p, char *err, size_t errlen);

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
	/* start from these factors (--load): rows and columns they hold take their values,
	 * the others (new ids) start at random; rank must equal @rank; NULL: all random */
	const struct mf_factors *start;
	/* receives the factors after the last epoch (--save): allocated by the caller for the
	 * training matrix's rows, cols and @rank; NULL: not wanted */
	struct mf_factors *out;
	/* seconds from the first epoch's start; 0: none. After an epoch, training stops when
	 * another epoch as long as this one would end past it (all nodes decide alike) */
	double time_budget;
	/* the factor table's consistency model (docs/consistency.md); with one
	 * other than SEQUENTIAL the workers end each block with ferry_clock()
	 * instead of meeting at a barrier */
	enum ferry_consistency consistency;
	uint32_t staleness; /* SSP, ESSP: the bound s */
	/* how pushes travel (docs/compression.md); with a codec every worker
	 * flushes its residuals at the end of each block, so a block's
	 * updates are whole when the next worker takes it */
	enum ferry_push_codec push_codec;
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
	double elapsed;	    /* seconds from the first epoch's start to this one's end,
			       evaluation included (the workers' mean) */
	double bytes_sent;  /* bytes the nodes sent during the epoch (float: ~7 digits) */
	/* reads of the factor table by clocks behind (SSP, ESSP), all nodes */
	double stale[FERRY_STALENESS_BUCKETS];
	double copy_hits, copy_misses; /* reads from a node's copy / from the owner */
};

struct mf_result {
	int epochs;	 /* epochs done */
	int budget_stop; /* 1: stopped before cfg->epochs by cfg->time_budget */
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

/* SPDX-License-Identifier: MIT */
/*
 * hot.h - what hot.c (the sync, the frames, the table's life) and hotops.c
 * (pulls, pushes and sets of a table with hot keys) share. Private to
 * lib/cons/; cons.h declares what the rest of lib/cons/ calls.
 */
#ifndef FERRY_LIB_CONS_HOT_H
#define FERRY_LIB_CONS_HOT_H

#include "lib/cons/cons.h"
#include "lib/cons/topk.h"

struct hot_frame {
	uint64_t seq;
	struct ferry_frame f;
};

/* hot_auto: this node's counts of the table's accesses (hotops.c counts,
 * hotauto.c chooses from them); bound: topk.h's, for cap = 4 x hot_auto
 * (at least 64), 80 bytes per counter at most: 320 x hot_auto bytes (5 KiB at
 * least) */
struct ferry_hot_count {
	pthread_mutex_t lock; /* guards s; taken once per call of the table */
	struct ferry_topk s;
	uint32_t max; /* hot_auto: most keys chosen */
};

/* one table's hot keys on this node; bound: hot.c's header (3 x the hot values,
 * 17 B per hot key, 16 B per rank) */
struct ferry_hot {
	struct ferry_table *t;
	const struct ferry_cons_hooks *inner; /* the model's hooks; NULL: SEQUENTIAL */
	uint32_t n;			      /* hot keys */
	uint64_t *keys;			      /* sorted */
	uint64_t *offs;			      /* n + 1: each key's floats in val, pend */
	uint32_t sync_ms;
	bool ssp; /* SSP or ESSP: reads wait for the bound (hot_ssp_read) */
	pthread_mutex_t lock;
	pthread_cond_t cond; /* a batch done, a kick, stop */
	float *val;	     /* the replicas */
	float *pend;	     /* this node's deltas not yet in a batch */
	uint8_t *dirty;	     /* pend[i] holds a delta */
	uint32_t ndirty;
	/* the batch in flight: frames (sync thread), last_seq (lock) */
	struct hot_frame *fr;
	uint32_t nfr;
	uint64_t last_seq; /* the last frame number given out */
	uint64_t *acked;   /* per rank: the last frame it applied */
	uint64_t taken;	   /* batches taken from pend */
	uint64_t done;	   /* batches every live node applied */
	uint64_t want;	   /* a flush waits for this batch */
	uint64_t *rx;	   /* per sender rank: the last of its frames applied here */
	bool stop, running;
	pthread_t thr;
	struct ferry_hot_stats st;
	struct ferry_hot_count *count; /* hot_auto, else NULL; survives an update */
	_Atomic uint64_t fault_rx, fault_tx;
};

/* the position of @key among the hot keys, or -1 */
static inline int64_t hot_index(const struct ferry_hot *h, uint64_t key)
{
	uint32_t lo = 0, hi = h->n;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (h->keys[mid] < key)
			lo = mid + 1;
		else if (h->keys[mid] > key)
			hi = mid;
		else
			return mid;
	}
	return -1;
}

/* hot.c: a state for the @n sorted, distinct @keys of @t, each replica at
 * its initial value, no thread. Return: NULL (out of memory) */
struct ferry_hot *ferry__hot_new(struct ferry_table *t, const uint64_t *keys, uint32_t n);
/* hot.c: what ferry__hot_new made (its thread stopped), and the counts */
void ferry__hot_free(struct ferry_hot *h);
/* hot.c: @h counts accesses for hot_auto. Return: 0 or -ENOMEM */
int ferry__hot_count_init(struct ferry_hot *h, uint32_t hot_auto);

/* hotops.c: the table's hooks (they wrap the model's, kept in inner) */
extern const struct ferry_cons_hooks ferry__hot_hooks;

#endif /* FERRY_LIB_CONS_HOT_H */

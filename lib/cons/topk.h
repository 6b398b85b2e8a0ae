/* SPDX-License-Identifier: MIT */
/*
 * topk.h - the most accessed keys of a table, counted in bounded memory
 * (Misra-Gries: at most cap counters; a key accessed more than total/cap
 * times is always among them, and its count is low by at most total/cap).
 * hot_auto (lib/cons/hotauto.c) chooses its hot keys from it. A leaf:
 * calls nothing of Ferry. Not thread-safe: the caller serializes.
 */
#ifndef FERRY_LIB_CONS_TOPK_H
#define FERRY_LIB_CONS_TOPK_H

#include <stdint.h>

struct ferry_topk_ent {
	uint64_t key; /* key + 1: 0 marks a free entry */
	uint64_t cnt;
};

/* bound: 5 x cap entries of 16 bytes at most (the table, at most half full
 * and a power of 2: 2 to 4 x cap; tmp: cap) */
struct ferry_topk {
	struct ferry_topk_ent *e;
	struct ferry_topk_ent *tmp; /* cap entries: the survivors of a rebuild */
	uint32_t cap;		    /* most counters */
	uint32_t n;		    /* counters in use */
	uint32_t mask;		    /* table entries - 1 */
	uint64_t cuts;		    /* times every counter was lowered (the count's error) */
};

/* Return: 0 or -ENOMEM (nothing allocated) */
int ferry__topk_init(struct ferry_topk *s, uint32_t cap);
void ferry__topk_fini(struct ferry_topk *s);
/* count @by more accesses of @key */
void ferry__topk_add(struct ferry_topk *s, uint64_t key, uint64_t by);
/* the @k keys counted most, most first (ties: the lower key first), into
 * @keys and @cnts. Return: how many (at most k, at most the counters) */
uint32_t ferry__topk_top(const struct ferry_topk *s, uint32_t k, uint64_t *keys, uint64_t *cnts);
/* halve every count (counters that reach 0 go): older accesses weigh less */
void ferry__topk_decay(struct ferry_topk *s);

#endif /* FERRY_LIB_CONS_TOPK_H */

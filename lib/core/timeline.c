/* SPDX-License-Identifier: MIT */
/*
 * timeline.c - the per-node stamp buffer of timeline.h: a fixed array filled
 * through one atomic index, so the progress thread and the workers stamp
 * without a lock; ferry-bench reads it between runs.
 */
#include <errno.h>
#include <stdlib.h>

#include "lib/core/proto.h"
#include "lib/core/timeline.h"
#include "transport/base/log.h"

void ferry__tl_put(struct ferry_tl *tl, enum ferry_tl_step step, uint64_t key)
{
	uint64_t i;

	if (!step)
		return;
	i = atomic_fetch_add_explicit(&tl->n, 1, memory_order_relaxed);
	if (i >= tl->cap)
		return;
	tl->ev[i] = (struct ferry_tl_ev){ .key = key, .ns = ferry__tl_now(), .step = step };
}

void ferry__tl_put_keys(struct ferry_tl *tl, enum ferry_tl_step step, const uint64_t *key0,
			size_t stride, size_t n)
{
	const char *p = (const char *)key0;

	for (size_t i = 0; i < n; i++, p += stride)
		ferry__tl_put(tl, step, *(const uint64_t *)(const void *)p);
}

enum ferry_tl_step ferry__tl_send_step(uint8_t type)
{
	switch (type) {
	case FERRY_MSG_LOCALIZE:
		return FERRY_TL_LOC_POST;
	case FERRY_MSG_HANDOVER_REQ:
		return FERRY_TL_LOC_HOME_FWD;
	case FERRY_MSG_HANDOVER:
	case FERRY_MSG_HANDOVER_DONE:
		return FERRY_TL_LOC_NOTICE_SENT;
	default:
		return 0;
	}
}

void ferry__tl_put_frame(struct ferry_tl *tl, const struct ferry_proto_view *v)
{
	enum ferry_tl_step step = 0;

	switch (v->hdr->type) {
	case FERRY_MSG_LOCALIZE:
		step = FERRY_TL_LOC_HOME_RECV;
		break;
	case FERRY_MSG_HANDOVER_REQ:
		step = FERRY_TL_LOC_OWNER_RECV;
		break;
	case FERRY_MSG_HANDOVER:
	case FERRY_MSG_HANDOVER_DONE:
		step = FERRY_TL_LOC_NOTICE_RECV;
		break;
	case FERRY_MSG_OP:
		ferry__tl_put_keys(tl, FERRY_TL_OP_RECV, &v->keys[0].key, sizeof(v->keys[0]),
				   v->count);
		return;
	default:
		return;
	}
	ferry__tl_put_keys(tl, step, &v->mvs[0].key, sizeof(v->mvs[0]), v->count);
}

int ferry__tl_enable(struct ferry *fy, uint64_t cap)
{
	struct ferry_tl *tl, *none = NULL;

	if (!cap || cap > (1ull << 26)) {
		ferry_err("timeline: %llu events asked; give 1 to %llu", (unsigned long long)cap,
			  1ull << 26);
		return -EINVAL;
	}
	tl = calloc(1, sizeof(*tl) + cap * sizeof(tl->ev[0]));
	if (!tl) {
		ferry_err("timeline: out of memory for %llu events (%llu bytes); ask for fewer",
			  (unsigned long long)cap, (unsigned long long)(cap * sizeof(tl->ev[0])));
		return -ENOMEM;
	}
	tl->cap = cap;
	if (!atomic_compare_exchange_strong(&fy->tl, &none, tl)) {
		free(tl);
		return -EALREADY;
	}
	return 0;
}

void ferry__tl_reset(struct ferry *fy)
{
	struct ferry_tl *tl = atomic_load(&fy->tl);

	if (tl)
		atomic_store(&tl->n, 0);
}

size_t ferry__tl_events(struct ferry *fy, const struct ferry_tl_ev **ev_p, uint64_t *dropped_p)
{
	struct ferry_tl *tl = atomic_load(&fy->tl);
	uint64_t n;

	*ev_p = NULL;
	*dropped_p = 0;
	if (!tl)
		return 0;
	n = atomic_load(&tl->n);
	*ev_p = tl->ev;
	*dropped_p = n > tl->cap ? n - tl->cap : 0;
	return (size_t)(n > tl->cap ? tl->cap : n);
}

void ferry__tl_free(struct ferry *fy)
{
	free(atomic_load(&fy->tl));
	atomic_store(&fy->tl, NULL);
}

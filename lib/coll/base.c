/* SPDX-License-Identifier: MIT */
/*
 * base.c - what every collective algorithm shares: a range of the working
 * buffer sent as COLL frames of at most FERRY_COLL_SEG_BYTES of data each,
 * the reduction kernels, keeping a frame for later, and completion.
 *
 * A COLL frame on the wire:
 *
 *   +--------+---------------------------------------------+------+-----+
 *   | header | seq count off n step kind dtype op algo root| data | pad |
 *   +--------+---------------------------------------------+------+-----+
 *     16 B     40 B (struct ferry_msg_coll)                   n x esz  to 8
 *
 * The data goes out from the caller's buffer through an iovec: the
 * transport copies what the socket does not take at once, so the buffer is
 * the collective's again when the send returns.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "lib/coll/coll.h"

int ferry__coll_send_msg(struct ferry_coll *c, uint32_t dst, uint32_t step, uint64_t off,
			 uint64_t n)
{
	static const uint64_t zeros;
	const uint64_t seg = FERRY_COLL_SEG_BYTES / c->esz;
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_coll b;
	} f;
	struct iovec iov[3];
	int rc;

	while (n) {
		uint64_t k = n < seg ? n : seg;
		size_t bytes = (size_t)k * c->esz;
		size_t pad = (FERRY_MSG_ALIGN - bytes % FERRY_MSG_ALIGN) % FERRY_MSG_ALIGN;

		f.b = c->sig;
		f.b.off = off;
		f.b.n = (uint32_t)k;
		f.b.step = step;
		ferry__proto_hdr_init(&f.h, FERRY_MSG_COLL, (uint32_t)(sizeof(f) + bytes + pad),
				      c->fy->rank, 0);
		iov[0] = (struct iovec){ .iov_base = &f, .iov_len = sizeof(f) };
		iov[1] = (struct iovec){ .iov_base = (uint8_t *)c->buf + off * c->esz,
					 .iov_len = bytes };
		iov[2] = (struct iovec){ .iov_base = (void *)&zeros, .iov_len = pad };
		rc = ferry__sendv(c->fy, ferry__coll_rank(c->colls, dst), iov, pad ? 3 : 2);
		if (rc)
			return rc;
		off += k;
		n -= k;
	}
	return 0;
}

int ferry__coll_send_ctl(struct ferry_coll *c, uint32_t dst, uint8_t type)
{
	struct {
		struct ferry_msg_hdr h;
		struct ferry_msg_coll b;
	} f;

	f.b = c->sig;
	f.b.off = 0;
	f.b.n = 0;
	f.b.step = 0;
	ferry__proto_hdr_init(&f.h, type, sizeof(f), c->fy->rank, 0);
	return ferry__send(c->fy, ferry__coll_rank(c->colls, dst), &f, sizeof(f));
}

/*
 * The kernels: plain loops the compiler vectorizes. MAX and MIN keep the
 * first operand unless the second is strictly greater (smaller), so with a
 * fixed operand order every node gets the same bits also for -0/+0 and NaN.
 * Integer sums wrap (unsigned arithmetic: no undefined overflow).
 */
#define COLL_SUM(T, NAME)                                                            \
	static void coll_sum_##NAME(T *restrict acc, const T *restrict in, size_t n) \
	{                                                                            \
		for (size_t i = 0; i < n; i++)                                       \
			acc[i] = acc[i] + in[i];                                     \
	}

/* inf: @in is the first operand, which wins a tie */
#define COLL_KERNELS(T, NAME)                                                                  \
	static void coll_max_##NAME(T *restrict acc, const T *restrict in, size_t n, bool inf) \
	{                                                                                      \
		if (inf)                                                                       \
			for (size_t i = 0; i < n; i++)                                         \
				acc[i] = acc[i] > in[i] ? acc[i] : in[i];                      \
		else                                                                           \
			for (size_t i = 0; i < n; i++)                                         \
				acc[i] = in[i] > acc[i] ? in[i] : acc[i];                      \
	}                                                                                      \
	static void coll_min_##NAME(T *restrict acc, const T *restrict in, size_t n, bool inf) \
	{                                                                                      \
		if (inf)                                                                       \
			for (size_t i = 0; i < n; i++)                                         \
				acc[i] = acc[i] < in[i] ? acc[i] : in[i];                      \
		else                                                                           \
			for (size_t i = 0; i < n; i++)                                         \
				acc[i] = in[i] < acc[i] ? in[i] : acc[i];                      \
	}

COLL_SUM(float, f32)
COLL_SUM(double, f64)
COLL_SUM(uint64_t, u64)
COLL_KERNELS(float, f32)
COLL_KERNELS(double, f64)
COLL_KERNELS(int64_t, i64)

/*
 * op(first, second), the first operand winning a tie:
 *   max, in_first:  acc = acc > in ? acc : in   (in wins ties)
 *   max, !in_first: acc = in > acc ? in : acc   (acc wins ties)
 * Sums commute bit for bit in IEEE arithmetic: their order does not matter.
 */
void ferry__coll_reduce(const struct ferry_coll *c, void *acc, const void *in, size_t n,
			bool in_first)
{
	switch (c->sig.dtype * 4 + c->sig.op) {
	case FERRY_FLOAT32 * 4 + FERRY_SUM:
		coll_sum_f32(acc, in, n);
		break;
	case FERRY_FLOAT32 * 4 + FERRY_MAX:
		coll_max_f32(acc, in, n, in_first);
		break;
	case FERRY_FLOAT32 * 4 + FERRY_MIN:
		coll_min_f32(acc, in, n, in_first);
		break;
	case FERRY_FLOAT64 * 4 + FERRY_SUM:
		coll_sum_f64(acc, in, n);
		break;
	case FERRY_FLOAT64 * 4 + FERRY_MAX:
		coll_max_f64(acc, in, n, in_first);
		break;
	case FERRY_FLOAT64 * 4 + FERRY_MIN:
		coll_min_f64(acc, in, n, in_first);
		break;
	case FERRY_INT64 * 4 + FERRY_SUM:
		coll_sum_u64(acc, in, n);
		break;
	case FERRY_INT64 * 4 + FERRY_MAX:
		coll_max_i64(acc, in, n, in_first);
		break;
	case FERRY_INT64 * 4 + FERRY_MIN:
		coll_min_i64(acc, in, n, in_first);
		break;
	default:
		break; /* checked at the start and in every frame */
	}
}

int ferry__coll_keep(struct ferry_coll_early **head, struct ferry_coll_early **tail, uint32_t src,
		     const void *frame, size_t len)
{
	struct ferry_coll_early *e = malloc(sizeof(*e) + len);

	if (!e)
		return -ENOMEM;
	e->next = NULL;
	e->src = src;
	e->len = (uint32_t)len;
	memcpy(e->frame, frame, len);
	if (*tail)
		(*tail)->next = e;
	else
		*head = e;
	*tail = e;
	return 0;
}

void ferry__coll_finish(struct ferry_coll *c, int status)
{
	struct ferry_colls *cs = c->colls;
	struct ferry_coll **pp;

	if (c->state == FERRY_COLL_DONE)
		return;
	for (pp = &cs->active; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	while (c->early) {
		struct ferry_coll_early *e = c->early;

		c->early = e->next;
		free(e);
	}
	c->early_tail = NULL;
	c->status = status;
	c->state = FERRY_COLL_DONE;
	atomic_store_explicit(&c->done, true, memory_order_release);
	pthread_cond_broadcast(&cs->cond);
}

void ferry__coll_early_free(struct ferry_coll_early *e)
{
	while (e) {
		struct ferry_coll_early *next = e->next;

		free(e);
		e = next;
	}
}

bool ferry__coll_poll_enabled(const struct ferry *fy)
{
	const char *e = getenv("FERRY_COLL_POLL");

	if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
		ferry_warn("coll: FERRY_COLL_POLL=%s is not 0 or 1; using 1", e);
	return fy->tp_polls && (fy->tp->ops->caps & FERRY_TP_CAP_POLL_MSG) &&
	       !(e && !strcmp(e, "0"));
}

bool ferry__coll_yield_decide(const char *setting, const char *ompi, const char *local, long cpus)
{
	char *end;
	long n;

	if (setting && !strcmp(setting, "1"))
		return true;
	if (setting && !strcmp(setting, "0"))
		return false;
	if (setting && *setting && strcmp(setting, "auto"))
		ferry_warn("coll: FERRY_COLL_YIELD=%s is not auto, 0 or 1; using auto", setting);
	if (ompi && !strcmp(ompi, "1"))
		return true;
	if (!local || !*local || cpus <= 0)
		return false;
	errno = 0;
	n = strtol(local, &end, 10);
	return !errno && !*end && n > cpus;
}

static bool coll_yield_now(void)
{
	const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");

	if (!local)
		local = getenv("LOCAL_WORLD_SIZE");
	return ferry__coll_yield_decide(getenv("FERRY_COLL_YIELD"),
					getenv("OMPI_MCA_mpi_oversubscribe"), local,
					sysconf(_SC_NPROCESSORS_ONLN));
}

void ferry__coll_colls_init(struct ferry_colls *cs, struct ferry *fy)
{
	cs->fy = fy;
	cs->n = fy->world;
	cs->me = fy->rank;
	cs->poll = ferry__coll_poll_enabled(fy);
	cs->yield_now = coll_yield_now();
	pthread_mutex_init(&cs->lock, NULL);
	ferry__cond_init_monotonic(&cs->cond);
}

void ferry__coll_colls_fini(struct ferry_colls *cs)
{
	ferry__coll_early_free(cs->ahead);
	pthread_mutex_destroy(&cs->lock);
	pthread_cond_destroy(&cs->cond);
	free(cs->ranks);
	free(cs->index);
}

/* SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "common/cluster.h"

struct tc_arg {
	struct tc *c;
	int rank;
	const struct ferry_table_params *tp;
	int (*fn)(struct tc *c, int rank, void *arg);
	void *arg;
	int rc;
};

static void *tc_create_thread(void *p)
{
	struct tc_arg *a = p;

	a->rc = ferry_table_create(a->c->fy[a->rank], a->tp, &a->c->t[a->rank]);
	return NULL;
}

static void *tc_fn_thread(void *p)
{
	struct tc_arg *a = p;

	a->rc = a->fn(a->c, a->rank, a->arg);
	return NULL;
}

static int tc_spawn(struct tc *c, void *(*body)(void *), struct tc_arg *args)
{
	pthread_t th[TC_MAX];
	int rc = 0;

	for (int i = 0; i < c->n; i++)
		pthread_create(&th[i], NULL, body, &args[i]);
	for (int i = 0; i < c->n; i++) {
		pthread_join(th[i], NULL);
		if (args[i].rc && !rc)
			rc = args[i].rc;
	}
	return rc;
}

int tc_open(struct tc *c, int n, const struct ferry_table_params *tp, int timeout_ms)
{
	struct ferry_params p;
	struct tc_arg args[TC_MAX];
	int rc;

	memset(c, 0, sizeof(*c));
	c->n = n;
	ferry_params_init(&p);
	p.transport = FERRY_TRANSPORT_TCP;
	if (getenv("FERRY_TRANSPORT"))
		p.transport = FERRY_TRANSPORT_AUTO;
	p.timeout_ms = timeout_ms;
	rc = ferry_local_cluster_open(n, &p, c->fy);
	if (rc || !tp)
		return rc;
	for (int i = 0; i < n; i++)
		args[i] = (struct tc_arg){ .c = c, .rank = i, .tp = tp };
	return tc_spawn(c, tc_create_thread, args);
}

void tc_close(struct tc *c)
{
	for (int i = 0; i < c->n; i++) {
		ferry_table_destroy(c->t[i]);
		ferry_close(c->fy[i]);
	}
	memset(c, 0, sizeof(*c));
}

int tc_run(struct tc *c, int (*fn)(struct tc *c, int rank, void *arg), void *arg)
{
	struct tc_arg args[TC_MAX];

	for (int i = 0; i < c->n; i++)
		args[i] = (struct tc_arg){ .c = c, .rank = i, .fn = fn, .arg = arg };
	return tc_spawn(c, tc_fn_thread, args);
}

unsigned long long tc_msgs(struct tc *c)
{
	unsigned long long sum = 0;

	for (int i = 0; i < c->n; i++) {
		struct ferry_stats s;

		ferry_stats(c->fy[i], &s);
		sum += s.msgs_sent;
	}
	return sum;
}

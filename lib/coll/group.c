/* SPDX-License-Identifier: MIT */
/*
 * group.c - node groups: making and freeing a group's handle, its id, and
 * the frames of groups a node has not made yet (docs/collectives.md,
 * "Groups"). The collectives themselves run in coll.c on the group's
 * struct ferry_colls, as on the whole cluster's.
 */
#include <errno.h>
#include <stdlib.h>

#include "lib/coll/coll.h"

uint64_t ferry__coll_group_id(const uint32_t *ranks, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull ^ n;

	for (size_t i = 0; i < n; i++) {
		h ^= ranks[i];
		h *= 0x100000001b3ull;
		h ^= h >> 29;
	}
	return h ? h : 1;
}

int ferry_group_create(struct ferry *fy, const uint32_t *ranks, size_t n,
		       struct ferry_group **group_p)
{
	struct ferry_colls *world, *cs;
	struct ferry_group *g;
	struct ferry_coll_early **pp;
	uint64_t id;
	size_t i;

	if (!fy || !ranks || !group_p || !n) {
		ferry_err("coll: ferry_group_create: %s; pass the node, the member ranks, their "
			  "count and &group",
			  !fy	 ? "the node is NULL" :
			  !ranks ? "the rank list is NULL" :
			  !n	 ? "a group of 0 members" :
				   "no place for the handle");
		return -EINVAL;
	}
	if (n > fy->world) {
		ferry_err("coll: ferry_group_create: %zu members in a world of %u", n, fy->world);
		return -EINVAL;
	}
	g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	cs = &g->cs;
	ferry__coll_colls_init(cs, fy);
	cs->n = (uint32_t)n;
	cs->me = UINT32_MAX;
	cs->ranks = malloc(n * sizeof(*cs->ranks));
	cs->index = malloc(fy->world * sizeof(*cs->index));
	if (!cs->ranks || !cs->index) {
		ferry__coll_colls_fini(cs);
		free(g);
		return -ENOMEM;
	}
	for (i = 0; i < fy->world; i++)
		cs->index[i] = -1;
	for (i = 0; i < n; i++) {
		if (ranks[i] >= fy->world || cs->index[ranks[i]] >= 0) {
			ferry_err("coll: ferry_group_create: member %zu, rank %u, is %s; list each "
				  "rank of the world (0 .. %u) at most once",
				  i, ranks[i],
				  ranks[i] >= fy->world ? "out of range" : "listed twice",
				  fy->world - 1);
			ferry__coll_colls_fini(cs);
			free(g);
			return -EINVAL;
		}
		cs->ranks[i] = ranks[i];
		cs->index[ranks[i]] = (int32_t)i;
		if (ranks[i] == fy->rank)
			cs->me = (uint32_t)i;
	}
	if (cs->me == UINT32_MAX) {
		ferry_err("coll: ferry_group_create: this node (rank %u) is not in the list; only "
			  "members create a group",
			  fy->rank);
		ferry__coll_colls_fini(cs);
		free(g);
		return -EINVAL;
	}
	id = ferry__coll_group_id(ranks, n);
	cs->id = id;
	world = fy->coll;
	pthread_mutex_lock(&world->glock);
	for (struct ferry_colls *o = world->groups; o; o = o->next)
		if (o->id == id) {
			pthread_mutex_unlock(&world->glock);
			ferry_err("coll: ferry_group_create: a group of these %zu members exists "
				  "on this node already; use it, or destroy it first",
				  n);
			ferry__coll_colls_fini(cs);
			free(g);
			return -EEXIST;
		}
	/* a member that failed before: nothing of this group can complete */
	for (i = 0; i < n; i++)
		if (ranks[i] != fy->rank && atomic_load(&fy->failed[ranks[i]])) {
			cs->broken = -FERRY_E_PEER;
			cs->broken_rank = ranks[i];
		}
	/* frames that came first, in arrival order; a non-member's are dropped */
	for (pp = &world->orphans; *pp;) {
		struct ferry_coll_early *e = *pp;
		const struct ferry_msg_coll *m = ferry__coll_frame_body(e);

		if (m->group != id) {
			pp = &e->next;
			continue;
		}
		*pp = e->next;
		e->next = NULL;
		if (cs->index[e->src] < 0) {
			ferry_warn("coll: rank %u sent a frame of a group it is not a member of; "
				   "dropped",
				   e->src);
			free(e);
			continue;
		}
		e->src = (uint32_t)cs->index[e->src];
		if (cs->ahead_tail)
			cs->ahead_tail->next = e;
		else
			cs->ahead = e;
		cs->ahead_tail = e;
	}
	world->orphans_tail = NULL;
	for (struct ferry_coll_early *e = world->orphans; e; e = e->next)
		world->orphans_tail = e;
	cs->next = world->groups;
	world->groups = cs;
	pthread_mutex_unlock(&world->glock);
	*group_p = g;
	return 0;
}

int ferry_group_destroy(struct ferry_group *g)
{
	struct ferry_colls *cs, *world, **pp;

	if (!g)
		return 0;
	cs = &g->cs;
	world = cs->fy->coll;
	pthread_mutex_lock(&world->glock);
	pthread_mutex_lock(&cs->lock);
	if (cs->nstarted) {
		pthread_mutex_unlock(&cs->lock);
		pthread_mutex_unlock(&world->glock);
		ferry_err("coll: ferry_group_destroy: %u collectives of the group are started and "
			  "not collected; wait for them first",
			  cs->nstarted);
		return -EBUSY;
	}
	pthread_mutex_unlock(&cs->lock);
	for (pp = &world->groups; *pp && *pp != cs; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = cs->next;
	pthread_mutex_unlock(&world->glock);
	ferry__coll_colls_fini(cs);
	free(g);
	return 0;
}

/* a frame of a group not made here (yet): kept, within bounds, until
 * ferry_group_create() makes it. world->glock held. Return: a protocol
 * error of the sender */
const char *ferry__coll_orphan(struct ferry_colls *world, uint32_t src,
			       const struct ferry_proto_view *v)
{
	const struct ferry_msg_coll *m = v->coll;
	uint64_t ids[FERRY_COLL_ORPHAN_GROUPS];
	unsigned nids = 0, k;

	if (m->seq >= FERRY_COLL_WINDOW)
		return "coll: a frame of a group not made here, too far ahead";
	/* the groups kept for (at most FERRY_COLL_ORPHAN_GROUPS): is this one? */
	for (struct ferry_coll_early *e = world->orphans; e; e = e->next) {
		const struct ferry_msg_coll *o = ferry__coll_frame_body(e);

		for (k = 0; k < nids && ids[k] != o->group; k++)
			;
		if (k == nids)
			ids[nids++] = o->group;
	}
	for (k = 0; k < nids && ids[k] != m->group; k++)
		;
	if (k == nids && nids >= FERRY_COLL_ORPHAN_GROUPS)
		return "coll: frames of too many groups not made here";
	if (ferry__coll_keep(&world->orphans, &world->orphans_tail, src, v->hdr, v->hdr->len))
		ferry_err("coll: no memory to keep a frame of group %016llx from rank %u; it is "
			  "lost and that collective will time out",
			  (unsigned long long)m->group, src);
	return NULL;
}

void ferry__coll_groups_free(struct ferry_colls *world)
{
	/* groups the application did not destroy go with the node */
	while (world->groups) {
		struct ferry_colls *g = world->groups;

		world->groups = g->next;
		ferry__coll_colls_fini(g);
		free(ferry__coll_to_group(g));
	}
	ferry__coll_early_free(world->orphans);
	world->orphans = world->orphans_tail = NULL;
}

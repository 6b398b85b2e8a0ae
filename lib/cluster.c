/* SPDX-License-Identifier: MIT */
/*
 * cluster.c - local clusters for tests and demos: N nodes as threads of this
 * process (ferry_local_cluster_open) or as N forked processes
 * (ferry_local_cluster_fork), meeting at a rendezvous on loopback.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "lib/core/bootstrap.h"

/* ---- local clusters ---------------------------------------------------- */

/* where local nodes listen: loopback, unless FERRY_BIND_ADDR names the RDMA
 * interface's address (rdma_cm cannot use 127.0.0.1) */
static const char *node_local_bind(void)
{
	const char *s = getenv("FERRY_BIND_ADDR");

	return s && *s ? s : "127.0.0.1";
}

struct cluster_arg {
	struct ferry_params params;
	struct ferry *fy;
	int rc;
};

static void *cluster_open_thread(void *p)
{
	struct cluster_arg *a = p;

	a->rc = ferry_open(&a->params, &a->fy);
	return NULL;
}

int ferry_local_cluster_open(int n, const struct ferry_params *params, struct ferry **fys)
{
	struct cluster_arg *args;
	pthread_t *th;
	char rdv[64];
	int lfd, port, rc = 0;

	if (n <= 0 || n > 65535 || !fys)
		return -EINVAL;
	lfd = ferry__listen_tcp("127.0.0.1", 0, 128);
	if (lfd < 0)
		return lfd;
	port = ferry__socket_port(lfd);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", port);
	args = calloc((size_t)n, sizeof(*args));
	th = calloc((size_t)n, sizeof(*th));
	if (!args || !th) {
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if (params)
			args[i].params = *params;
		else
			ferry_params_init(&args[i].params);
		args[i].params.rank = i;
		args[i].params.world = n;
		args[i].params.rendezvous = rdv;
		args[i].params.rendezvous_fd = i == 0 ? lfd : -1;
		if (!args[i].params.bind_addr)
			args[i].params.bind_addr = node_local_bind();
		if (pthread_create(&th[i], NULL, cluster_open_thread, &args[i])) {
			/* the others time out without this rank; collect them */
			args[i].rc = -EAGAIN;
			th[i] = 0;
		}
	}
	for (int i = 0; i < n; i++) {
		if (th[i])
			pthread_join(th[i], NULL);
		if (args[i].rc && !rc)
			rc = args[i].rc;
	}
	for (int i = 0; i < n; i++) {
		if (rc && !args[i].rc)
			ferry_close(args[i].fy);
		else if (!rc)
			fys[i] = args[i].fy;
	}
out:
	free(args);
	free(th);
	close(lfd);
	return rc;
}

int ferry_local_cluster_fork(int n, struct ferry_params *params, pid_t *pids)
{
	static char rdv[64];
	int lfd, port;

	if (n <= 0 || n > 65535 || !params || !pids)
		return -EINVAL;
	lfd = ferry__listen_tcp("127.0.0.1", 0, 128);
	if (lfd < 0)
		return lfd;
	port = ferry__socket_port(lfd);
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", port);
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();

		if (pid < 0) {
			int rc = -errno;

			for (int j = 0; j < i; j++)
				kill(pids[j], SIGKILL);
			for (int j = 0; j < i; j++)
				waitpid(pids[j], NULL, 0);
			close(lfd);
			return rc;
		}
		if (pid == 0) {
			params->rank = i;
			params->world = n;
			params->rendezvous = rdv;
			if (!params->bind_addr)
				params->bind_addr = node_local_bind();
			if (i == 0) {
				params->rendezvous_fd = lfd;
			} else {
				params->rendezvous_fd = -1;
				close(lfd);
			}
			return i;
		}
		pids[i] = pid;
	}
	close(lfd);
	return FERRY_LOCAL_PARENT;
}

/* SPDX-License-Identifier: MIT */
/*
 * etcdsrv.h - a real etcd (Debian's etcd-server) for a test: started on
 * loopback with free ports and a temporary data folder, stopped and removed
 * after (test_etcd, and test_repl's failover with etcd as the manager).
 * Each call asserts (Criterion) on what it cannot do.
 */
#ifndef FERRY_TESTS_COMMON_ETCDSRV_H
#define FERRY_TESTS_COMMON_ETCDSRV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct etcd_srv {
	pid_t pid;
	char dir[64];
	char url[64];  /* clients */
	char purl[64]; /* peers */
};

int64_t ed_now_ms(void);
/* a TCP port free on 127.0.0.1 now */
int ed_free_port(void);
/* skips the test (with the reason) without libcurl or the etcd binary */
void ed_skip_unless_available(void);
#ifdef FERRY_HAVE_ETCD
/* POST @body to @path of @s; the HTTP code, the answer in @out */
long ed_post(const struct etcd_srv *s, const char *path, const char *body, char *out,
	     size_t outlen);
#endif
/* start etcd on @s's folder and ports and wait until it answers */
void ed_spawn(struct etcd_srv *s);
/* a new folder and ports, then ed_spawn */
void ed_up(struct etcd_srv *s);
/* stop etcd (SIGTERM, SIGKILL after 5 s) and reap it; the folder stays */
void ed_stop(struct etcd_srv *s);
/* ed_stop, and remove the folder */
void ed_down(struct etcd_srv *s);

#endif /* FERRY_TESTS_COMMON_ETCDSRV_H */

/* SPDX-License-Identifier: MIT */
/*
 * Integration: what the log tells a person who started the nodes wrong, and
 * the log's own settings. Each node is a forked process configured by the
 * environment alone, as an application under a launcher would be; its log
 * goes to a file through FERRY_LOG_FILE, which the test reads.
 *
 * The parent calls nothing of Ferry's before it forks, so every child reads
 * the FERRY_LOG_* variables it was given.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ferry/ferry.h"

#define LOG_MAX 16384

/* the variables a launcher or a user may have left in the test's environment */
static const char *const launcher_vars[] = {
	"RANK",
	"WORLD_SIZE",
	"MASTER_ADDR",
	"MASTER_PORT",
	"FERRY_RANK",
	"FERRY_WORLD",
	"FERRY_RENDEZVOUS",
	"FERRY_BIND_ADDR",
	"FERRY_SOCKET_IFNAME",
	"FERRY_LOG_LEVEL",
	"FERRY_LOG_FILE",
	"FERRY_LOG_FORMAT",
	"FERRY_LOG_SUBSYS",
	"FERRY_TIMEOUT_MS",
	"OMPI_COMM_WORLD_RANK",
	"OMPI_COMM_WORLD_SIZE",
	"PMIX_RANK",
	"PMIX_NAMESPACE",
	"PMI_RANK",
	"PMI_SIZE",
	"SLURM_PROCID",
	"SLURM_NTASKS",
};

static char tmpdir[64];

static void msg_setup(void)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-msg.XXXXXX");
	cr_assert_not_null(mkdtemp(tmpdir));
}

static void msg_teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd))
		cr_log_warn("could not remove %s", tmpdir);
}

/*
 * msg_spawn - fork a node: the environment cleared of launchers' variables,
 * then @env ("NAME=value", NULL-terminated), its log in tmpdir/@log;
 * it opens the node (and closes it if that worked) and exits 0 or 1
 */
static pid_t msg_spawn(const char *const *env, const char *log)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char path[256];
		struct ferry *fy;
		int rc;

		for (size_t i = 0; i < sizeof(launcher_vars) / sizeof(launcher_vars[0]); i++)
			unsetenv(launcher_vars[i]);
		for (; *env; env++)
			putenv((char *)*env);
		snprintf(path, sizeof(path), "%s/%s", tmpdir, log);
		setenv("FERRY_LOG_FILE", path, 0);
		setenv("FERRY_TRANSPORT", "tcp", 1);
		rc = ferry_open(NULL, &fy);
		if (!rc)
			ferry_close(fy);
		_exit(rc ? 1 : 0);
	}
	return pid;
}

static int msg_wait(pid_t pid)
{
	int st;

	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st), "node %d died of signal %d", (int)pid, WTERMSIG(st));
	return WEXITSTATUS(st);
}

/* the whole log file tmpdir/@name, "" when there is none */
static void msg_read(const char *name, char *buf, size_t len)
{
	char path[256];
	size_t n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	f = fopen(path, "r");
	if (f) {
		n = fread(buf, 1, len - 1, f);
		fclose(f);
	}
	buf[n] = '\0';
}

/* a TCP port nobody listens on right now */
static int msg_free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

TestSuite(messages, .init = msg_setup, .fini = msg_teardown, .timeout = 60);

Test(messages, bind_failure_names_the_settings)
{
	static const char *const env[] = { "FERRY_RANK=0", "FERRY_WORLD=1",
					   /* TEST-NET-2: on no host */
					   "FERRY_BIND_ADDR=198.51.100.77", NULL };
	char log[LOG_MAX];

	cr_assert_eq(msg_wait(msg_spawn(env, "bind.log")), 1, "the node opened");
	msg_read("bind.log", log, sizeof(log));
	cr_assert(strstr(log, "cannot listen on 198.51.100.77"), "%s", log);
	cr_assert(strstr(log, "FERRY_BIND_ADDR") && strstr(log, "FERRY_SOCKET_IFNAME"),
		  "the fix is not named:\n%s", log);
}

Test(messages, bad_rendezvous_host_names_master_addr)
{
	static const char *const env[] = { "RANK=1", "WORLD_SIZE=2",
					   "MASTER_ADDR=no-such-host.invalid", "MASTER_PORT=29999",
					   NULL };
	/* with the bind address given, the bootstrap is the first to resolve it */
	static const char *const env_bind[] = { "RANK=1",
						"WORLD_SIZE=2",
						"MASTER_ADDR=no-such-host.invalid",
						"MASTER_PORT=29999",
						"FERRY_BIND_ADDR=127.0.0.1",
						"FERRY_TIMEOUT_MS=2000",
						NULL };
	char log[LOG_MAX];

	cr_assert_eq(msg_wait(msg_spawn(env, "route.log")), 1);
	msg_read("route.log", log, sizeof(log));
	cr_assert(strstr(log, "no-such-host.invalid") && strstr(log, "fix MASTER_ADDR"), "%s", log);
	cr_assert_null(strstr(log, "FERRY_RENDEZVOUS"), "names the wrong variable:\n%s", log);

	cr_assert_eq(msg_wait(msg_spawn(env_bind, "join.log")), 1);
	msg_read("join.log", log, sizeof(log));
	cr_assert(strstr(log, "no-such-host.invalid") && strstr(log, "fix MASTER_ADDR"), "%s", log);
	cr_assert_null(strstr(log, "FERRY_RENDEZVOUS"), "names the wrong variable:\n%s", log);
}

Test(messages, bad_rendezvous_host_names_ferry_rendezvous)
{
	static const char *const env[] = { "FERRY_RANK=1", "FERRY_WORLD=2",
					   "FERRY_RENDEZVOUS=no-such-host.invalid:29999",
					   /* a torchrun variable left over must not be blamed */
					   "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29999", NULL };
	char log[LOG_MAX];

	cr_assert_eq(msg_wait(msg_spawn(env, "rdv.log")), 1);
	msg_read("rdv.log", log, sizeof(log));
	cr_assert(strstr(log, "no-such-host.invalid") && strstr(log, "fix FERRY_RENDEZVOUS"), "%s",
		  log);
	cr_assert_null(strstr(log, "MASTER_ADDR"), "names the wrong variable:\n%s", log);
}

Test(messages, two_rank_zeros_say_so)
{
	char rdv[64], both[2 * LOG_MAX], log[LOG_MAX];
	const char *env[] = { "FERRY_RANK=0", "FERRY_WORLD=2", "FERRY_TIMEOUT_MS=3000", rdv, NULL };
	pid_t a, b;

	snprintf(rdv, sizeof(rdv), "FERRY_RENDEZVOUS=127.0.0.1:%d", msg_free_port());
	a = msg_spawn(env, "first.log");
	usleep(300 * 1000); /* the first one listens */
	b = msg_spawn(env, "second.log");
	cr_assert_eq(msg_wait(b), 1, "the second rank 0 opened");
	cr_assert_eq(msg_wait(a), 1, "the first rank 0 opened without its rank 1");
	msg_read("second.log", log, sizeof(log));
	snprintf(both, sizeof(both), "%s", log);
	cr_assert(strstr(log, "two processes claim rank 0"), "second:\n%s", log);
	msg_read("first.log", log, sizeof(log));
	strcat(both, log);
	cr_assert(strstr(log, "two processes claim rank 0"), "first:\n%s", log);
	cr_assert_null(strstr(both, "Address already in use"), "%s", both);
}

Test(messages, different_world_sizes_name_both)
{
	char rdv[64], log[LOG_MAX];
	const char *env0[] = { "FERRY_RANK=0", "FERRY_WORLD=3", "FERRY_TIMEOUT_MS=3000", rdv,
			       NULL };
	const char *env1[] = { "FERRY_RANK=1", "FERRY_WORLD=2", "FERRY_TIMEOUT_MS=3000", rdv,
			       NULL };
	pid_t a, b;

	snprintf(rdv, sizeof(rdv), "FERRY_RENDEZVOUS=127.0.0.1:%d", msg_free_port());
	a = msg_spawn(env0, "r0.log");
	b = msg_spawn(env1, "r1.log");
	cr_assert_eq(msg_wait(b), 1);
	cr_assert_eq(msg_wait(a), 1);
	msg_read("r1.log", log, sizeof(log));
	cr_assert(strstr(log, "world of 3") && strstr(log, "world of 2"), "rank 1:\n%s", log);
	cr_assert_null(strstr(log, "disagree on parameters"), "rank 1:\n%s", log);
	msg_read("r0.log", log, sizeof(log));
	cr_assert(strstr(log, "world of 2") && strstr(log, "world of 3"), "rank 0:\n%s", log);
}

Test(messages, no_rendezvous_says_how_to_give_one)
{
	static const char *const env[] = { "FERRY_RANK=1", "FERRY_WORLD=2", NULL };
	char log[LOG_MAX];

	cr_assert_eq(msg_wait(msg_spawn(env, "none.log")), 1);
	msg_read("none.log", log, sizeof(log));
	cr_assert(strstr(log, "no rendezvous address") && strstr(log, "FERRY_RENDEZVOUS") &&
			  strstr(log, "PMIx"),
		  "%s", log);
}

/* ---- the log's own settings ---------------------------------------------- */

Test(log, every_line_says_time_host_pid_and_rank)
{
	static const char *const env[] = { "FERRY_RANK=0", "FERRY_WORLD=1", "FERRY_LOG_LEVEL=info",
					   NULL };
	char log[LOG_MAX], host[64], want[128], *dot;
	pid_t pid;

	msg_setup();
	pid = msg_spawn(env, "prefix.log");
	cr_assert_eq(msg_wait(pid), 0);
	msg_read("prefix.log", log, sizeof(log));
	msg_teardown();
	gethostname(host, sizeof(host));
	host[sizeof(host) - 1] = '\0';
	dot = strchr(host, '.');
	if (dot)
		*dot = '\0';
	snprintf(want, sizeof(want), " %s:%d r0 ferry info: config:", host, (int)pid);
	cr_assert(strstr(log, want), "no line with \"%s\":\n%s", want, log);
	/* the time of day first: HH:MM:SS.mmm */
	cr_assert(log[2] == ':' && log[5] == ':' && log[8] == '.' && log[12] == ' ', "%s", log);
	for (char *l = log; *l; l = strchr(l, '\n') + 1)
		cr_assert(strstr(l, " r0 ferry ") && strstr(l, " r0 ferry ") < strchr(l, '\n'),
			  "a line without the prefix: %s", l);
}

Test(log, file_name_pattern_and_format)
{
	static const char *const env[] = { "FERRY_RANK=0", "FERRY_WORLD=1", "FERRY_LOG_LEVEL=info",
					   "FERRY_LOG_FORMAT=[%l|%s|%r] %m", NULL };
	char log[LOG_MAX], host[64], name[160], *dot;
	pid_t pid;

	msg_setup();
	pid = msg_spawn(env, "f.%h.%r.%p.log");
	cr_assert_eq(msg_wait(pid), 0);
	gethostname(host, sizeof(host));
	host[sizeof(host) - 1] = '\0';
	dot = strchr(host, '.');
	if (dot)
		*dot = '\0';
	snprintf(name, sizeof(name), "f.%s.0.%d.log", host, (int)pid);
	msg_read(name, log, sizeof(log));
	msg_teardown();
	cr_assert(strstr(log, "[info|config|0] config: rank 0 of 1"), "%s:\n%s", name, log);
}

Test(log, subsystems_kept_and_dropped)
{
	static const char *const keep[] = { "FERRY_RANK=0", "FERRY_WORLD=1", "FERRY_LOG_LEVEL=info",
					    "FERRY_LOG_SUBSYS=config", NULL };
	static const char *const drop[] = { "FERRY_RANK=0", "FERRY_WORLD=1", "FERRY_LOG_LEVEL=info",
					    "FERRY_LOG_SUBSYS=^config", NULL };
	char log[LOG_MAX];

	msg_setup();
	cr_assert_eq(msg_wait(msg_spawn(keep, "keep.log")), 0);
	cr_assert_eq(msg_wait(msg_spawn(drop, "drop.log")), 0);
	msg_read("keep.log", log, sizeof(log));
	cr_assert(strstr(log, "info: config:"), "%s", log);
	cr_assert_null(strstr(log, "info: node:"), "%s", log);
	msg_read("drop.log", log, sizeof(log));
	msg_teardown();
	cr_assert_null(strstr(log, "info: config:"), "%s", log);
	cr_assert(strstr(log, "info: node:"), "%s", log);
}

/* SPDX-License-Identifier: MIT */
/*
 * bjson.c - the tools' JSON writer on jansson (bjson.h says what it fixes).
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bjson.h"

/*
 * Set when a value could not be made (jansson returns NULL only when out of
 * memory here): bjson_write() then refuses to write a partial document. The
 * tools build their documents on one thread; the flag is atomic anyway.
 */
static atomic_int bjson_oom;

json_t *bjson_num(double v)
{
	if (!isfinite(v))
		return json_null();
	/* counts stay integers; 2^53 is where doubles stop holding every integer */
	if (v == trunc(v) && fabs(v) < 9007199254740992.0)
		return json_integer((json_int_t)v);
	return json_real(v);
}

json_t *bjson_opt(int have, double v)
{
	return have ? bjson_num(v) : json_null();
}

json_t *bjson_str(const char *s)
{
	json_t *j;
	char *copy;

	if (!s)
		return json_null();
	j = json_string(s);
	if (j)
		return j;
	/* not UTF-8 (a kernel or CPU string from somewhere odd): keep the ASCII */
	copy = strdup(s);
	if (!copy)
		return NULL;
	for (char *p = copy; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	j = json_string(copy);
	free(copy);
	return j;
}

int bjson_set(json_t *obj, const char *key, json_t *v)
{
	if (!v || json_object_set_new(obj, key, v)) {
		atomic_store(&bjson_oom, 1);
		return -ENOMEM;
	}
	return 0;
}

int bjson_append(json_t *arr, json_t *v)
{
	if (!v || json_array_append_new(arr, v)) {
		atomic_store(&bjson_oom, 1);
		return -ENOMEM;
	}
	return 0;
}

int bjson_write(json_t *root, const char *path, const char *prog)
{
	const size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10);
	FILE *f;
	int rc = 0;

	if (!root || atomic_load(&bjson_oom)) {
		fprintf(stderr, "%s: not writing %s: out of memory while building the JSON\n", prog,
			path);
		return -ENOMEM;
	}
	f = strcmp(path, "-") ? fopen(path, "w") : stdout;
	if (!f) {
		rc = -errno;
		fprintf(stderr, "%s: cannot write %s: %s\n", prog, path, strerror(-rc));
		return rc;
	}
	if (json_dumpf(root, f, flags) || fputc('\n', f) == EOF)
		rc = ferror(f) && errno ? -errno : -EIO;
	if (f == stdout) {
		if (fflush(f) && !rc)
			rc = -errno;
	} else if (fclose(f) && !rc) {
		rc = -errno;
	}
	if (rc)
		fprintf(stderr, "%s: writing %s failed: %s\n", prog, path, strerror(-rc));
	return rc;
}

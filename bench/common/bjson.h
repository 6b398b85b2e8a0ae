/* SPDX-License-Identifier: MIT */
/*
 * bjson.h - the one JSON writer of Ferry's tools (ferry-bench, ferry-mf,
 * ferry-dp, ferry-coll-mpi), on Debian's jansson.
 *
 * A tool builds its document as a jansson tree and writes it with
 * bjson_write(). The helpers here fix what every tool must do alike:
 *
 *   - a missing or meaningless figure is JSON null, never 0 (bjson_num()
 *     turns NaN and the infinities into null; bjson_opt() takes a flag);
 *   - counts stay integers (10000000, not 1e+07), other figures keep 10
 *     significant digits;
 *   - keys keep the order a tool set them in, two spaces of indentation;
 *   - a write that fails says so once, naming the tool and the file, and
 *     returns a negative errno.
 *
 * The bjson_set_*() calls never fail silently: a key whose value could not
 * be made (out of memory) marks the object, and bjson_write() refuses to
 * write a document that has such a mark (-ENOMEM), so a file on disk is
 * always complete.
 */
#ifndef FERRY_BENCH_BJSON_H
#define FERRY_BENCH_BJSON_H

#include <jansson.h>
#include <stdint.h>

/** bjson_num - @v as a JSON number: an integer when it is one, null when not finite */
json_t *bjson_num(double v);

/** bjson_opt - bjson_num(@v) when @have, else null */
json_t *bjson_opt(int have, double v);

/** bjson_str - @s as a JSON string (null for NULL; bytes that are not UTF-8 become '?') */
json_t *bjson_str(const char *s);

/*
 * bjson_set - set @obj[@key] = @v, taking @v's reference (NULL @v: out of
 * memory, remembered for bjson_write()). Return: 0 or -ENOMEM.
 */
int bjson_set(json_t *obj, const char *key, json_t *v);

static inline int bjson_set_num(json_t *obj, const char *key, double v)
{
	return bjson_set(obj, key, bjson_num(v));
}

static inline int bjson_set_int(json_t *obj, const char *key, int64_t v)
{
	return bjson_set(obj, key, json_integer(v));
}

static inline int bjson_set_str(json_t *obj, const char *key, const char *s)
{
	return bjson_set(obj, key, bjson_str(s));
}

static inline int bjson_set_bool(json_t *obj, const char *key, int b)
{
	return bjson_set(obj, key, json_boolean(b));
}

/* bjson_append - append @v to the array @arr, taking its reference; Return: 0 or -ENOMEM */
int bjson_append(json_t *arr, json_t *v);

/**
 * bjson_write - write @root to @path ("-": standard output)
 * @root: the document (an object or array); the caller keeps its reference
 * @path: the file, replaced
 * @prog: the tool's name, for the message on failure
 *
 * Return: 0, -ENOMEM when a value of the tree could not be made, or the
 * negative errno of the write; the cause is printed to stderr once.
 */
int bjson_write(json_t *root, const char *path, const char *prog);

#endif /* FERRY_BENCH_BJSON_H */

/* SPDX-License-Identifier: MIT */
/* ckpt_int.h - what ckpt.c lends restore.c (lib/ckpt/) */
#ifndef FERRY_LIB_CKPT_INT_H
#define FERRY_LIB_CKPT_INT_H

#include <jansson.h>

struct ferry_table;

/* the table's parameters that a restore must match, as the manifest's
 * "table" object (a new reference; NULL without memory). Any thread. */
json_t *ferry__ckpt_table_json(const struct ferry_table *t);
/* fsync a folder (a rename in it is durable after). Return: 0 or -errno. */
int ferry__ckpt_fsync_dir(const char *dir);

#endif /* FERRY_LIB_CKPT_INT_H */

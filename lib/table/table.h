/* SPDX-License-Identifier: MIT */
/* table.h - what the table module (lib/table/) offers lib/ferry.c. */
#ifndef FERRY_LIB_TABLE_H
#define FERRY_LIB_TABLE_H

#include "lib/core/core.h"

/* register the TABLE and TABLE_ACK handlers; before the node starts */
int ferry__table_attach(struct ferry *fy);
/* free the tables destroyed here whose fence has not passed: the node
 * closes (its peers see it leave). Before the transport stops. */
void ferry__table_close(struct ferry *fy);

#endif /* FERRY_LIB_TABLE_H */

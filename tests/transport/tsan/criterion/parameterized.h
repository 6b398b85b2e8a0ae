/* SPDX-License-Identifier: MIT */
/* parameterized.h - see criterion.h: the stand-in keeps everything there */
#include "criterion.h"

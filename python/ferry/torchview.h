/* SPDX-License-Identifier: MIT */
/*
 * The C view of a torch tensor that the optional C++ module ferry._torchview
 * (torchview.cpp) fills from the tensor's at::Tensor, in one call of about
 * 10 ns, where reading six Python attributes costs 0.3-0.4 us (docs/python.md,
 * "Per-call overhead"). arrays.c reaches it through a capsule; C and C++ both
 * include this header. Internal: never installed.
 */
#ifndef FERRY_PY_TORCHVIEW_H
#define FERRY_PY_TORCHVIEW_H

#include <stdint.h>

#define FERRY_TVIEW_CAPSULE "ferry._torchview._api"
#define FERRY_TVIEW_VERSION 1

struct ferry_tview {
	void *data;	/* the first element, storage offset applied */
	int64_t numel;	/* elements */
	int64_t shape0; /* the first dimension; 1 for a 0-d tensor */
	int ndim;
	int itemsize; /* 0: a dtype ferry names no format for */
	char fmt;     /* the buffer-protocol letter ('f', 'q', ...), or 0 */
	unsigned char cpu, contiguous, requires_grad;
	unsigned char lazy;    /* a negative or conjugate view (x.resolve_neg()) */
	unsigned char strided; /* 0: sparse, or no storage: the other fields unset */
};

struct ferry_tview_api {
	int version; /* FERRY_TVIEW_VERSION */
	/*
	 * Fills @v from @obj. 0: filled; 1: not handled (a subclass of
	 * torch.Tensor other than Parameter, which may override attributes,
	 * or a tensor torch threw on): the caller reads the attributes
	 * instead. Never raises; needs the GIL.
	 */
	int (*get)(PyObject *obj, struct ferry_tview *v);
};

#endif /* FERRY_PY_TORCHVIEW_H */

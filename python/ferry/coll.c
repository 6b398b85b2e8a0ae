// SPDX-License-Identifier: MIT
/* _ferry: the collectives and the handles of their started forms */
#include <errno.h>
#include <string.h>

#include "pyferry.h"

/* ---- collectives ------------------------------------------------------ */

static int coll_dtype(struct arr *a, enum ferry_dtype *dt_p)
{
	char c = fmt_letter(&a->view);

	if (c == 'f' && a->view.itemsize == 4)
		*dt_p = FERRY_FLOAT32;
	else if (c == 'd' && a->view.itemsize == 8)
		*dt_p = FERRY_FLOAT64;
	else if ((c == 'q' || c == 'l') && a->view.itemsize == 8)
		*dt_p = FERRY_INT64;
	else {
		PyErr_Format(PyExc_TypeError,
			     "ferry: collectives take float32, float64 or int64, not format '%s'",
			     a->view.format ? a->view.format : "B");
		return -1;
	}
	return 0;
}

static int coll_op(const char *s, enum ferry_redop *op_p)
{
	if (!strcmp(s, "sum"))
		*op_p = FERRY_SUM;
	else if (!strcmp(s, "max"))
		*op_p = FERRY_MAX;
	else if (!strcmp(s, "min"))
		*op_p = FERRY_MIN;
	else {
		PyErr_Format(PyExc_ValueError, "ferry: op must be 'sum', 'max' or 'min', not '%s'",
			     s);
		return -1;
	}
	return 0;
}

typedef struct {
	PyObject_HEAD struct ferry_coll *c;
	struct arr src, dst;
	PyObject *result;
	NodeObject *node;
	int rc;
} CollObject;

static void coll_finish(CollObject *c, int rc)
{
	c->c = NULL;
	c->rc = rc;
	arr_release(&c->src);
	arr_release(&c->dst);
}

static PyObject *coll_wait(CollObject *c, PyObject *unused)
{
	int rc;

	if (c->c) {
		Py_BEGIN_ALLOW_THREADS;
		rc = ferry_coll_wait(c->c);
		Py_END_ALLOW_THREADS;
		coll_finish(c, rc);
	}
	if (c->rc)
		return raise_rc(c->rc, "ferry collective");
	Py_INCREF(c->result);
	return c->result;
}

static PyObject *coll_test(CollObject *c, PyObject *unused)
{
	if (c->c) {
		int rc = ferry_coll_test(c->c);

		if (rc == -EAGAIN)
			Py_RETURN_FALSE;
		coll_finish(c, rc);
	}
	if (c->rc)
		return raise_rc(c->rc, "ferry collective");
	Py_RETURN_TRUE;
}

static void coll_dealloc(CollObject *c)
{
	if (c->c) {
		int rc;

		Py_BEGIN_ALLOW_THREADS;
		rc = ferry_coll_wait(c->c);
		Py_END_ALLOW_THREADS;
		coll_finish(c, rc);
	}
	Py_XDECREF(c->result);
	Py_XDECREF(c->node);
	PyObject_Free(c);
}

enum coll_kind {
	C_ALLREDUCE,
	C_REDUCE,
	C_BROADCAST
};

/* allreduce(src, dst=None, op="sum"), reduce(src, dst=None, op="sum",
 * root=0), broadcast(buf, root=0); dst None: in place, into src */
static PyObject *node_coll(NodeObject *n, PyObject *args, PyObject *kw, enum coll_kind k, int async)
{
	static char *kw_red[] = { "src", "dst", "op", "root", NULL };
	static char *kw_bc[] = { "buf", "root", NULL };
	PyObject *osrc, *odst = Py_None;
	const char *ops = "sum";
	int root = 0, rc, inplace;
	enum ferry_dtype dt, dt2;
	enum ferry_redop op = FERRY_SUM;
	struct arr src = { .held = 0 }, dst = { .held = 0 };
	struct ferry_coll *c = NULL;
	size_t count;

	if (k == C_BROADCAST) {
		if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i", kw_bc, &osrc, &root))
			return NULL;
	} else if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Osi", kw_red, &osrc, &odst, &ops,
						&root)) {
		return NULL;
	}
	if (node_check(n) || (k != C_BROADCAST && coll_op(ops, &op)))
		return NULL;
	inplace = odst == Py_None || odst == osrc;
	if (arr_get(osrc, k == C_BROADCAST ? "buf" : "src", k == C_BROADCAST || inplace, 0, &src))
		return NULL;
	if (coll_dtype(&src, &dt))
		goto err;
	count = (size_t)(src.view.len / src.view.itemsize);
	if (!inplace) {
		if (arr_get(odst, "dst", 1, 0, &dst) || coll_dtype(&dst, &dt2))
			goto err;
		if (dt2 != dt || dst.view.len != src.view.len) {
			PyErr_SetString(PyExc_ValueError,
					"ferry: dst must have the type and size of src");
			goto err;
		}
	}
	{
		void *s = src.view.buf, *d = inplace ? s : dst.view.buf;

		Py_BEGIN_ALLOW_THREADS;
		if (k == C_ALLREDUCE)
			rc = async ? ferry_allreduce_start(n->fy, s, d, count, dt, op, &c) :
				     ferry_allreduce(n->fy, s, d, count, dt, op);
		else if (k == C_REDUCE)
			rc = async ? ferry_reduce_start(n->fy, s, d, count, dt, op, root, &c) :
				     ferry_reduce(n->fy, s, d, count, dt, op, root);
		else
			rc = async ? ferry_broadcast_start(n->fy, s, count, dt, root, &c) :
				     ferry_broadcast(n->fy, s, count, dt, root);
		Py_END_ALLOW_THREADS;
	}
	if (rc) {
		raise_rc(rc, k == C_ALLREDUCE ? "ferry_allreduce" :
			     k == C_REDUCE    ? "ferry_reduce" :
						"ferry_broadcast");
		goto err;
	}
	if (async) {
		CollObject *co = PyObject_New(CollObject, &CollType);

		if (!co) {
			Py_BEGIN_ALLOW_THREADS;
			ferry_coll_wait(c);
			Py_END_ALLOW_THREADS;
			goto err;
		}
		co->c = c;
		co->src = src;
		co->dst = dst;
		co->rc = 0;
		co->result = inplace ? osrc : odst;
		Py_INCREF(co->result);
		Py_INCREF(n);
		co->node = n;
		return (PyObject *)co;
	}
	arr_release(&src);
	arr_release(&dst);
	odst = inplace ? osrc : odst;
	Py_INCREF(odst);
	return odst;
err:
	arr_release(&src);
	arr_release(&dst);
	return NULL;
}

#define COLLFN(name, k, async)                                      \
	PyObject *name(NodeObject *n, PyObject *args, PyObject *kw) \
	{                                                           \
		return node_coll(n, args, kw, k, async);            \
	}
COLLFN(node_allreduce, C_ALLREDUCE, 0)
COLLFN(node_reduce, C_REDUCE, 0)
COLLFN(node_broadcast, C_BROADCAST, 0)
COLLFN(node_allreduce_async, C_ALLREDUCE, 1)
COLLFN(node_reduce_async, C_REDUCE, 1)
COLLFN(node_broadcast_async, C_BROADCAST, 1)

static PyMethodDef coll_methods[] = {
	{ "wait", (PyCFunction)coll_wait, METH_NOARGS, "wait; returns the result buffer" },
	{ "test", (PyCFunction)coll_test, METH_NOARGS, "True when done" },
	{ NULL }
};

PyTypeObject CollType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.CollHandle",
	.tp_basicsize = sizeof(CollObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "a started collective: wait() or test()",
	.tp_dealloc = (destructor)coll_dealloc,
	.tp_methods = coll_methods,
};

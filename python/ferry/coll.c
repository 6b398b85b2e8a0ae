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
	static const char *const names[] = { "sum", "max", "min", NULL };
	static const enum ferry_redop ops[] = { FERRY_SUM, FERRY_MAX, FERRY_MIN };
	int i = name_pick(s, "op", names);

	if (i < 0)
		return -1;
	*op_p = ops[i];
	return 0;
}

typedef struct {
	PyObject_HEAD struct ferry_coll *c;
	struct arr src, dst;
	PyObject *result;
	PyObject *owner; /* the Node or the Group: outlives the collective */
	int rc;
} CollObject;

/* a group of nodes (Node.group): its handle, until destroy() or the close */
typedef struct {
	PyObject_HEAD NodeObject *node;
	struct ferry_group *g; /* NULL once destroyed */
	PyObject *ranks;       /* tuple of the member ranks, in order */
	int index;	       /* this node's among them */
} GroupObject;

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
	Py_XDECREF(c->owner);
	PyObject_Free(c);
}

enum coll_kind {
	C_ALLREDUCE,
	C_REDUCE,
	C_BROADCAST
};

/*
 * allreduce(src, dst=None, op="sum"), reduce(src, dst=None, op="sum",
 * root=0), broadcast(buf, root=0); dst None: in place, into src. On @g
 * when not NULL (its members; roots are member indices), else on every node.
 * @owner (the Node or the Group) is held by an asynchronous handle.
 */
static PyObject *coll_run(NodeObject *n, struct ferry_group *g, PyObject *owner, PyObject *args,
			  PyObject *kw, enum coll_kind k, int async)
{
	static char *kw_red[] = { "src", "dst", "op", "root", NULL };
	static char *kw_bc[] = { "buf", "root", NULL };
	static const char *const fns[2][3] = {
		{ "ferry_allreduce", "ferry_reduce", "ferry_broadcast" },
		{ "ferry_group_allreduce", "ferry_group_reduce", "ferry_group_broadcast" },
	};
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
		struct ferry_coll **cp = async ? &c : NULL;

		Py_BEGIN_ALLOW_THREADS;
		if (g && k == C_ALLREDUCE)
			rc = cp ? ferry_group_allreduce_start(g, s, d, count, dt, op, cp) :
				  ferry_group_allreduce(g, s, d, count, dt, op);
		else if (g && k == C_REDUCE)
			rc = cp ? ferry_group_reduce_start(g, s, d, count, dt, op, root, cp) :
				  ferry_group_reduce(g, s, d, count, dt, op, root);
		else if (g)
			rc = cp ? ferry_group_broadcast_start(g, s, count, dt, root, cp) :
				  ferry_group_broadcast(g, s, count, dt, root);
		else if (k == C_ALLREDUCE)
			rc = cp ? ferry_allreduce_start(n->fy, s, d, count, dt, op, cp) :
				  ferry_allreduce(n->fy, s, d, count, dt, op);
		else if (k == C_REDUCE)
			rc = cp ? ferry_reduce_start(n->fy, s, d, count, dt, op, root, cp) :
				  ferry_reduce(n->fy, s, d, count, dt, op, root);
		else
			rc = cp ? ferry_broadcast_start(n->fy, s, count, dt, root, cp) :
				  ferry_broadcast(n->fy, s, count, dt, root);
		Py_END_ALLOW_THREADS;
	}
	if (rc) {
		raise_rc(rc, fns[g != NULL][k]);
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
		Py_INCREF(owner);
		co->owner = owner;
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

#define COLLFN(name, k, async)                                               \
	PyObject *name(NodeObject *n, PyObject *args, PyObject *kw)          \
	{                                                                    \
		return coll_run(n, NULL, (PyObject *)n, args, kw, k, async); \
	}
COLLFN(node_allreduce, C_ALLREDUCE, 0)
COLLFN(node_reduce, C_REDUCE, 0)
COLLFN(node_broadcast, C_BROADCAST, 0)
COLLFN(node_allreduce_async, C_ALLREDUCE, 1)
COLLFN(node_reduce_async, C_REDUCE, 1)
COLLFN(node_broadcast_async, C_BROADCAST, 1)

/* ---- groups ----------------------------------------------------------- */

static int group_check(GroupObject *gr)
{
	if (node_check(gr->node))
		return -1;
	if (!gr->g) {
		PyErr_SetString(PyExc_ValueError, "ferry: the group was destroyed");
		return -1;
	}
	return 0;
}

#define GROUPFN(name, k, async)                                                       \
	static PyObject *name(GroupObject *gr, PyObject *args, PyObject *kw)          \
	{                                                                             \
		if (group_check(gr))                                                  \
			return NULL;                                                  \
		return coll_run(gr->node, gr->g, (PyObject *)gr, args, kw, k, async); \
	}
GROUPFN(group_allreduce, C_ALLREDUCE, 0)
GROUPFN(group_reduce, C_REDUCE, 0)
GROUPFN(group_broadcast, C_BROADCAST, 0)
GROUPFN(group_allreduce_async, C_ALLREDUCE, 1)
GROUPFN(group_reduce_async, C_REDUCE, 1)
GROUPFN(group_broadcast_async, C_BROADCAST, 1)

/*
 * Node.group(ranks): the ranks are checked here, each fault its own
 * message (the C library would say -EINVAL and log the reason).
 */
PyObject *node_group(NodeObject *n, PyObject *args, PyObject *kw)
{
	static char *kwl[] = { "ranks", NULL };
	PyObject *oranks, *seq = NULL, *tuple = NULL;
	uint32_t *ranks = NULL;
	GroupObject *gr = NULL;
	struct ferry_group *g;
	Py_ssize_t nr;
	int world, me, index = -1, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O", kwl, &oranks) || node_check(n))
		return NULL;
	world = ferry_world(n->fy);
	me = ferry_rank(n->fy);
	seq = PySequence_Fast(oranks, "ferry: ranks must be a sequence of ints (a list of ranks)");
	if (!seq)
		return NULL;
	nr = PySequence_Fast_GET_SIZE(seq);
	if (nr < 1 || nr > world) {
		PyErr_Format(PyExc_ValueError,
			     "ferry: a group has 1 to %d (the world) ranks, not %zd", world, nr);
		goto err;
	}
	ranks = PyMem_Calloc((size_t)nr, sizeof(*ranks));
	tuple = PyTuple_New(nr);
	if (!ranks || !tuple) {
		PyErr_NoMemory();
		goto err;
	}
	for (Py_ssize_t i = 0; i < nr; i++) {
		PyObject *o = PySequence_Fast_GET_ITEM(seq, i);
		long r = PyLong_Check(o) ? PyLong_AsLong(o) : -2;

		if (r == -1 && PyErr_Occurred())
			goto err;
		if (!PyLong_Check(o) || r < 0 || r >= world) {
			PyErr_Format(PyExc_ValueError,
				     "ferry: group member %zd is %R: ranks are ints 0 .. %d", i, o,
				     world - 1);
			goto err;
		}
		for (Py_ssize_t j = 0; j < i; j++)
			if (ranks[j] == (uint32_t)r) {
				PyErr_Format(PyExc_ValueError,
					     "ferry: rank %ld is in the group twice", r);
				goto err;
			}
		ranks[i] = (uint32_t)r;
		if (r == me)
			index = (int)i;
		PyTuple_SET_ITEM(tuple, i, PyLong_FromLong(r));
		if (!PyTuple_GET_ITEM(tuple, i))
			goto err;
	}
	if (index < 0) {
		PyErr_Format(PyExc_ValueError,
			     "ferry: this node (rank %d) is not in the group %R: only members "
			     "create a group",
			     me, tuple);
		goto err;
	}
	gr = PyObject_New(GroupObject, &GroupType);
	if (!gr)
		goto err;
	gr->g = NULL;
	gr->ranks = tuple;
	tuple = NULL;
	Py_INCREF(n);
	gr->node = n;
	gr->index = index;
	rc = ferry_group_create(n->fy, ranks, (size_t)nr, &g);
	if (rc) {
		raise_rc(rc, rc == -EEXIST ? "ferry_group_create: this node has a group of these "
					     "ranks already; use it, or destroy() it first" :
					     "ferry_group_create");
		goto err;
	}
	gr->g = g;
	PyMem_Free(ranks);
	Py_DECREF(seq);
	return (PyObject *)gr;
err:
	Py_XDECREF(gr);
	Py_XDECREF(tuple);
	PyMem_Free(ranks);
	Py_DECREF(seq);
	return NULL;
}

/* the close frees the groups left: after it, only forget the handle */
static int group_do_destroy(GroupObject *gr)
{
	int rc = 0;

	if (gr->g && !gr->node->closed && gr->node->fy)
		rc = ferry_group_destroy(gr->g);
	if (!rc)
		gr->g = NULL;
	return rc;
}

static PyObject *group_destroy(GroupObject *gr, PyObject *unused)
{
	int rc = group_do_destroy(gr);

	if (rc)
		return raise_rc(rc, "ferry_group_destroy: wait() its started collectives first");
	Py_RETURN_NONE;
}

static void group_dealloc(GroupObject *gr)
{
	/* no handle is left (each holds the group), so this cannot be busy */
	group_do_destroy(gr);
	Py_XDECREF(gr->ranks);
	Py_XDECREF(gr->node);
	PyObject_Free(gr);
}

static PyObject *group_exit(GroupObject *gr, PyObject *args)
{
	PyObject *r = group_destroy(gr, NULL);

	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

static PyMethodDef group_methods[] = {
	{ "__enter__", (PyCFunction)self_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)group_exit, METH_VARARGS, NULL },
	KWM("allreduce", group_allreduce, "allreduce(src, dst=None, op='sum') -> dst"),
	KWM("reduce", group_reduce, "reduce(src, dst=None, op='sum', root=0) -> dst; root: index"),
	KWM("broadcast", group_broadcast, "broadcast(buf, root=0) -> buf; root: member index"),
	KWM("allreduce_async", group_allreduce_async, "as allreduce; returns a handle"),
	KWM("reduce_async", group_reduce_async, "as reduce; returns a handle"),
	KWM("broadcast_async", group_broadcast_async, "as broadcast; returns a handle"),
	{ "destroy", (PyCFunction)group_destroy, METH_NOARGS,
	  "free this node's handle (every member)" },
	{ NULL }
};

static PyMemberDef group_members[] = {
	{ "ranks", T_OBJECT, offsetof(GroupObject, ranks), READONLY, "the member ranks, in order" },
	{ "rank", T_INT, offsetof(GroupObject, index), READONLY,
	  "this node's index among them (its rank in the group)" },
	{ "node", T_OBJECT, offsetof(GroupObject, node), READONLY, "the node" },
	{ NULL }
};

PyTypeObject GroupType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Group",
	.tp_basicsize = sizeof(GroupObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "a group of nodes for collectives (Node.group)",
	.tp_dealloc = (destructor)group_dealloc,
	.tp_methods = group_methods,
	.tp_members = group_members,
};

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

// SPDX-License-Identifier: MIT
/* _ferry: tables, their operations, and the handles of the asynchronous ones */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "pyferry.h"

static PyObject *np_empty;	   /* numpy.empty, imported at the first pull without out= */
static PyObject *torch_from_numpy; /* torch.from_numpy, once a tensor was seen */

/* ---- Table ------------------------------------------------------------ */

static int table_check(TableObject *t)
{
	if (!t->t) {
		PyErr_SetString(PyExc_ValueError, "ferry: the table was destroyed");
		return -1;
	}
	return node_check(t->node);
}

/* floats for @n keys: value_len each, or their own lengths */
static int table_floats(TableObject *t, const uint64_t *keys, size_t n, size_t *floats_p)
{
	size_t f = 0;

	if (t->value_len) {
		*floats_p = n * t->value_len;
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t l = ferry_table_value_len(t->t, keys[i]);

		if (!l) {
			char what[96];

			/* as the library says it for a table without value_lens */
			snprintf(what, sizeof(what), "ferry: key %llu (keys are 0 .. %llu)",
				 (unsigned long long)keys[i], (unsigned long long)t->num_keys - 1);
			raise_rc(-ERANGE, what);
			return -1;
		}
		f += l;
	}
	*floats_p = f;
	return 0;
}

/* values: float32, @floats of them, shaped (floats) or (n, value_len) */
static int vals_get(TableObject *t, PyObject *obj, const char *name, int writable, size_t n,
		    size_t floats, struct arr *a)
{
	const Py_buffer *v = &a->view;

	if (arr_get(obj, name, writable, 0, a))
		return -1;
	if (v->itemsize != 4 || fmt_letter(v) != 'f') {
		PyErr_Format(PyExc_TypeError,
			     "ferry: %s must be float32, not format '%s' (%zd bytes); use "
			     "x.astype(numpy.float32) or tensor.float()",
			     name, v->format ? v->format : "B", v->itemsize);
		goto err;
	}
	if ((size_t)v->len != floats * 4 ||
	    (v->ndim >= 2 && (size_t)a->shape0 != n && t->value_len)) {
		PyErr_Format(PyExc_ValueError,
			     "ferry: %s holds %zd floats in %d dimensions; %zu keys need %zu "
			     "(shape (%zu, %u) or (%zu,))",
			     name, v->len / 4, v->ndim, n, floats, n, t->value_len, floats);
		goto err;
	}
	return 0;
err:
	arr_release(a);
	return -1;
}

/* a new float32 array of @floats values, (n, value_len) when uniform */
static PyObject *out_new(TableObject *t, size_t n, size_t floats, int torch)
{
	PyObject *arr, *shape;

	if (!np_empty) {
		PyObject *np = PyImport_ImportModule("numpy");

		if (!np)
			return NULL;
		np_empty = PyObject_GetAttrString(np, "empty");
		Py_DECREF(np);
		if (!np_empty)
			return NULL;
	}
	if (t->value_len)
		shape = Py_BuildValue("(nI)", (Py_ssize_t)n, t->value_len);
	else
		shape = Py_BuildValue("(n)", (Py_ssize_t)floats);
	if (!shape)
		return NULL;
	arr = PyObject_CallFunction(np_empty, "Os", shape, "float32");
	Py_DECREF(shape);
	if (arr && torch) {
		PyObject *r;

		if (!torch_from_numpy) {
			PyObject *m = PyImport_ImportModule("torch");

			if (!m)
				goto err;
			torch_from_numpy = PyObject_GetAttrString(m, "from_numpy");
			Py_DECREF(m);
			if (!torch_from_numpy)
				goto err;
		}
		r = PyObject_CallOneArg(torch_from_numpy, arr);
		Py_DECREF(arr);
		return r;
	}
	return arr;
err:
	Py_DECREF(arr);
	return NULL;
}

enum op_kind {
	OP_PULL,
	OP_PUSH,
	OP_SET,
	OP_LOCALIZE
};
static const char *const op_names[] = { "ferry_pull", "ferry_push", "ferry_set", "ferry_localize" };

/* ---- Handle: an operation started and not yet collected ---------------- */

typedef struct {
	PyObject_HEAD TableObject *table;
	struct pyw *pw;
	uint64_t ticket;
	struct arr keys, vals;
	PyObject *result; /* what wait() returns: the pulled values, or None */
	enum op_kind op;
	int done, rc;
} HandleObject;

/* the ticket is collected: give back the buffers. Context: GIL held. */
static void handle_finish(HandleObject *h, int rc)
{
	h->done = 1;
	h->rc = rc;
	arr_release(&h->keys);
	arr_release(&h->vals);
	h->table->pending--;
}

/*
 * 0: @h may be collected here, its thread's; 1: it was just collected as
 * -ECANCELED, its worker being gone (its thread ended or closed the node:
 * the operation ended with the worker, its outcome unknown); -1: raised.
 */
static int handle_mine(HandleObject *h)
{
	if (!h->pw->w) {
		handle_finish(h, -ECANCELED);
		return 1;
	}
	if (pthread_equal(h->pw->tid, pthread_self()))
		return 0;
	PyErr_SetString(PyExc_RuntimeError, "ferry: a handle is waited for by the thread that "
					    "started it (its worker belongs to that thread)");
	return -1;
}

static PyObject *handle_raise(HandleObject *h)
{
	char what[128];

	if (h->rc != -ECANCELED)
		return raise_rc(h->rc, op_names[h->op]);
	snprintf(what, sizeof(what),
		 "%s: its worker is gone (the thread that started it ended, or closed the "
		 "node, before its wait())",
		 op_names[h->op]);
	return raise_rc(h->rc, what);
}

static PyObject *handle_result(HandleObject *h)
{
	if (h->rc)
		return handle_raise(h);
	Py_INCREF(h->result);
	return h->result;
}

static PyObject *handle_wait(HandleObject *h, PyObject *unused)
{
	int rc;

	if (!h->done) {
		if ((rc = handle_mine(h)))
			return rc > 0 ? handle_raise(h) : NULL;
		Py_BEGIN_ALLOW_THREADS;
		rc = ferry_wait(h->pw->w, h->ticket);
		Py_END_ALLOW_THREADS;
		handle_finish(h, rc);
	}
	return handle_result(h);
}

static PyObject *handle_test(HandleObject *h, PyObject *unused)
{
	int rc;

	if (!h->done) {
		if ((rc = handle_mine(h)))
			return rc > 0 ? handle_raise(h) : NULL;
		rc = ferry_test(h->pw->w, h->ticket);
		if (rc == -EAGAIN)
			Py_RETURN_FALSE;
		handle_finish(h, rc);
	}
	if (h->rc)
		return handle_raise(h);
	Py_RETURN_TRUE;
}

static PyObject *handle_done(HandleObject *h, void *unused)
{
	return PyBool_FromLong(h->done);
}

/*
 * A handle dropped before it was collected: its buffers must outlive the
 * operation, so wait for it here (its own thread); on another thread the
 * buffers are kept (leaked) rather than freed under a running operation.
 * With its worker gone, the operation ended with it: the buffers are free.
 */
static void handle_dealloc(HandleObject *h)
{
	if (!h->done) {
		if (!h->pw->w) {
			handle_finish(h, -ECANCELED);
		} else if (pthread_equal(h->pw->tid, pthread_self())) {
			int rc;

			Py_BEGIN_ALLOW_THREADS;
			rc = ferry_wait(h->pw->w, h->ticket);
			Py_END_ALLOW_THREADS;
			handle_finish(h, rc);
		} else {
			PyObject *et, *ev, *etb;

			/* a dealloc may run while an exception is being raised */
			PyErr_Fetch(&et, &ev, &etb);
			if (PyErr_WarnEx(PyExc_ResourceWarning,
					 "ferry: a handle was dropped on another thread before its "
					 "wait(); its buffers are kept",
					 1))
				PyErr_WriteUnraisable((PyObject *)h);
			PyErr_Restore(et, ev, etb);
			h->table->pending--;
			h->pw = NULL;
		}
	}
	if (h->pw)
		pyw_put(h->pw);
	Py_XDECREF(h->result);
	Py_XDECREF(h->table);
	PyObject_Free(h);
}

/* ---- operations ------------------------------------------------------- */

static PyObject *table_op(TableObject *t, PyObject *const *args, Py_ssize_t nargs,
			  PyObject *kwnames, enum op_kind op, int async)
{
	static const char *const kw_pull[] = { "keys", "out", NULL };
	static const char *const kw_push[] = { "keys", "deltas", NULL };
	static const char *const kw_set[] = { "keys", "values", NULL };
	static const char *const kw_loc[] = { "keys", NULL };
	static const char *const *const kws[] = { kw_pull, kw_push, kw_set, kw_loc };
	static const char *const fns[2][4] = {
		{ "pull", "push", "set", "localize" },
		{ "pull_async", "push_async", "set_async", "localize_async" },
	};
	PyObject *o[2], *okeys, *ovals, *result = NULL;
	struct arr keys, vals = { .held = 0 };
	size_t n, floats = 0;
	struct pyw *pw;
	uint64_t ticket = 0;
	int rc;

	if (args_objs(fns[async][op], args, nargs, kwnames, kws[op],
		      op == OP_PUSH || op == OP_SET ? 2 : 1, o))
		return NULL;
	okeys = o[0];
	ovals = op == OP_LOCALIZE || !o[1] ? Py_None : o[1];
	if (table_check(t))
		return NULL;
	pw = node_worker(t->node);
	if (!pw)
		return NULL;
	if (keys_get(okeys, &keys, &n))
		return NULL;
	if (op != OP_LOCALIZE && table_floats(t, keys.view.buf, n, &floats))
		goto err;
	if (op == OP_PULL && ovals == Py_None) {
		result = out_new(t, n, floats, keys.torch);
		if (!result)
			goto err;
		ovals = result;
	} else if (op == OP_PULL) {
		result = ovals;
		Py_INCREF(result);
	}
	if (op != OP_LOCALIZE && vals_get(t, ovals,
					  op == OP_PULL ? "out" :
					  op == OP_PUSH ? "deltas" :
							  "values",
					  op == OP_PULL, n, floats, &vals))
		goto err;
	Py_BEGIN_ALLOW_THREADS;
	switch (op) {
	case OP_PULL:
		rc = async ? ferry_pull_start(pw->w, t->t, keys.view.buf, n, vals.view.buf,
					      &ticket) :
			     ferry_pull(pw->w, t->t, keys.view.buf, n, vals.view.buf);
		break;
	case OP_PUSH:
		rc = async ? ferry_push_start(pw->w, t->t, keys.view.buf, n, vals.view.buf,
					      &ticket) :
			     ferry_push(pw->w, t->t, keys.view.buf, n, vals.view.buf);
		break;
	case OP_SET:
		rc = async ? ferry_set_start(pw->w, t->t, keys.view.buf, n, vals.view.buf,
					     &ticket) :
			     ferry_set(pw->w, t->t, keys.view.buf, n, vals.view.buf);
		break;
	default:
		rc = async ? ferry_localize_start(pw->w, t->t, keys.view.buf, n, &ticket) :
			     ferry_localize(pw->w, t->t, keys.view.buf, n);
	}
	Py_END_ALLOW_THREADS;
	if (rc) {
		raise_rc(rc, op_names[op]);
		goto err;
	}
	if (async) {
		HandleObject *h = PyObject_New(HandleObject, &HandleType);

		if (!h) {
			/* the operation runs on the caller's buffers: finish it */
			Py_BEGIN_ALLOW_THREADS;
			ferry_wait(pw->w, ticket);
			Py_END_ALLOW_THREADS;
			goto err;
		}
		Py_INCREF(t);
		h->table = t;
		h->pw = pw;
		atomic_fetch_add(&pw->refs, 1);
		h->ticket = ticket;
		h->keys = keys;
		h->vals = vals;
		h->result = result ? result : (Py_INCREF(Py_None), Py_None);
		h->op = op;
		h->done = 0;
		h->rc = 0;
		t->pending++;
		return (PyObject *)h;
	}
	arr_release(&keys);
	arr_release(&vals);
	if (result)
		return result;
	Py_RETURN_NONE;
err:
	arr_release(&keys);
	arr_release(&vals);
	Py_XDECREF(result);
	return NULL;
}

#define OPFN(name, op, async)                                                          \
	static PyObject *name(TableObject *t, PyObject *const *args, Py_ssize_t nargs, \
			      PyObject *kwnames)                                       \
	{                                                                              \
		return table_op(t, args, nargs, kwnames, op, async);                   \
	}
OPFN(table_pull, OP_PULL, 0)
OPFN(table_push, OP_PUSH, 0)
OPFN(table_set, OP_SET, 0)
OPFN(table_localize, OP_LOCALIZE, 0)
OPFN(table_pull_async, OP_PULL, 1)
OPFN(table_push_async, OP_PUSH, 1)
OPFN(table_set_async, OP_SET, 1)
OPFN(table_localize_async, OP_LOCALIZE, 1)

/*
 * Table._c_pull_loop(keys, out, iters) -> seconds: ferry_pull called @iters
 * times from C on this thread's worker, the same-run baseline of
 * python/bench/overhead.py (what a C program would see, minus nothing).
 */
static PyObject *table_c_pull_loop(TableObject *t, PyObject *args)
{
	PyObject *okeys, *oout;
	struct arr keys, out;
	struct timespec a, b;
	long iters;
	size_t n, floats;
	struct pyw *pw;
	int rc = 0;

	if (!PyArg_ParseTuple(args, "OOl", &okeys, &oout, &iters) || table_check(t))
		return NULL;
	pw = node_worker(t->node);
	if (!pw || keys_get(okeys, &keys, &n))
		return NULL;
	if (table_floats(t, keys.view.buf, n, &floats) ||
	    vals_get(t, oout, "out", 1, n, floats, &out)) {
		arr_release(&keys);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS;
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < iters && !rc; i++)
		rc = ferry_pull(pw->w, t->t, keys.view.buf, n, out.view.buf);
	clock_gettime(CLOCK_MONOTONIC, &b);
	Py_END_ALLOW_THREADS;
	arr_release(&keys);
	arr_release(&out);
	if (rc)
		return raise_rc(rc, "ferry_pull");
	return PyFloat_FromDouble((double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9);
}

/* Table.flush(): this node's buffered pushes sent, its copies dropped */
static PyObject *table_flush(TableObject *t, PyObject *unused)
{
	struct pyw *pw;

	if (table_check(t) || !(pw = node_worker(t->node)))
		return NULL;
	RETURN_CALL("ferry_flush", ferry_flush(pw->w, t->t));
}

/* hot_auto (docs/consistency.md, "Hot keys"): choose the hot keys again */
static PyObject *table_hot_update(TableObject *t, PyObject *unused)
{
	struct pyw *pw;

	if (table_check(t) || !(pw = node_worker(t->node)))
		return NULL;
	RETURN_CALL("ferry_hot_update", ferry_hot_update(pw->w, t->t));
}

/* this node's hot keys, ascending, as a uint64 array */
static PyObject *table_hot_keys(TableObject *t, PyObject *unused)
{
	PyObject *list, *np = NULL, *arr = NULL;
	uint64_t *keys;
	int n;

	if (table_check(t))
		return NULL;
	n = ferry_hot_keys(t->t, NULL, 0);
	if (n < 0)
		return raise_rc(n, "ferry_hot_keys");
	keys = PyMem_Malloc(((size_t)n + 1) * sizeof(*keys));
	if (!keys)
		return PyErr_NoMemory();
	n = ferry_hot_keys(t->t, keys, (uint32_t)n);
	list = PyList_New(n < 0 ? 0 : n);
	for (int i = 0; list && i < n; i++) {
		PyObject *k = PyLong_FromUnsignedLongLong(keys[i]);

		if (!k) {
			Py_CLEAR(list);
			break;
		}
		PyList_SET_ITEM(list, i, k);
	}
	PyMem_Free(keys);
	if (!list)
		return NULL;
	np = PyImport_ImportModule("numpy");
	if (np)
		arr = PyObject_CallMethod(np, "array", "Os", list, "uint64");
	Py_XDECREF(np);
	Py_DECREF(list);
	return arr;
}

/* ---- checkpoints ------------------------------------------------------ */

/* a checkpoint started (Table.checkpoint_async) and not yet waited for */
typedef struct {
	PyObject_HEAD TableObject *table;
	struct ferry_checkpoint *ck; /* NULL once waited for */
	pthread_t tid;
	int rc;
} CkptObject;

/*
 * The folder of a checkpoint (str, bytes or os.PathLike) into @path_p, a
 * bytes object the caller drops; and the rule every checkpoint and restore
 * keeps: no operation of this node on the table under way.
 */
static int ckpt_args(TableObject *t, PyObject *args, PyObject *kw, const char *fn,
		     PyObject **path_p)
{
	static char *kwl[] = { "dir", NULL };

	*path_p = NULL;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O&", kwl, PyUnicode_FSConverter, path_p))
		return -1;
	if (table_check(t))
		goto err;
	if (t->pending) {
		PyErr_Format(PyExc_RuntimeError,
			     "ferry: %s: %ld operations or checkpoints on this table were started "
			     "and not waited for; wait() them first (a checkpoint holds every "
			     "operation acknowledged before it, none under way)",
			     fn, t->pending);
		goto err;
	}
	return 0;
err:
	Py_CLEAR(*path_p);
	return -1;
}

/* Table.checkpoint(dir) and Table.restore(dir): collective, one C call */
static PyObject *ckpt_call(TableObject *t, PyObject *args, PyObject *kw, const char *fn,
			   int (*call)(struct ferry_table *, const char *), const char *cfn)
{
	PyObject *path;
	int rc;

	if (ckpt_args(t, args, kw, fn, &path))
		return NULL;
	Py_BEGIN_ALLOW_THREADS;
	rc = call(t->t, PyBytes_AS_STRING(path));
	Py_END_ALLOW_THREADS;
	Py_DECREF(path);
	if (rc)
		return raise_rc(rc, cfn);
	Py_RETURN_NONE;
}

static PyObject *table_checkpoint(TableObject *t, PyObject *args, PyObject *kw)
{
	return ckpt_call(t, args, kw, "checkpoint", ferry_table_checkpoint,
			 "ferry_table_checkpoint");
}

/* Table.checkpoint_async(dir) -> Checkpoint: the mark; wait() writes it out */
static PyObject *table_checkpoint_async(TableObject *t, PyObject *args, PyObject *kw)
{
	struct ferry_checkpoint *ck;
	CkptObject *c;
	PyObject *path;
	int rc;

	if (ckpt_args(t, args, kw, "checkpoint_async", &path))
		return NULL;
	c = PyObject_New(CkptObject, &CkptType);
	if (!c) {
		Py_DECREF(path);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS;
	rc = ferry_table_checkpoint_start(t->t, PyBytes_AS_STRING(path), &ck);
	Py_END_ALLOW_THREADS;
	Py_DECREF(path);
	if (rc) {
		c->table = NULL;
		c->ck = NULL;
		Py_DECREF(c);
		return raise_rc(rc, "ferry_table_checkpoint_start");
	}
	Py_INCREF(t);
	c->table = t;
	c->ck = ck;
	c->tid = pthread_self();
	c->rc = 0;
	t->pending++;
	return (PyObject *)c;
}

static PyObject *table_restore(TableObject *t, PyObject *args, PyObject *kw)
{
	return ckpt_call(t, args, kw, "restore", ferry_table_restore, "ferry_table_restore");
}

/* the collective end of the checkpoint. Context: GIL held, its thread. */
static void ckpt_finish(CkptObject *c)
{
	struct ferry_checkpoint *ck = c->ck;
	int rc;

	Py_BEGIN_ALLOW_THREADS;
	rc = ferry_checkpoint_wait(ck);
	Py_END_ALLOW_THREADS;
	c->ck = NULL;
	c->rc = rc;
	c->table->pending--;
}

static PyObject *ckpt_wait(CkptObject *c, PyObject *unused)
{
	if (c->ck) {
		if (!pthread_equal(c->tid, pthread_self())) {
			PyErr_SetString(PyExc_RuntimeError,
					"ferry: a checkpoint is waited for by the thread that "
					"started it (ferry_checkpoint_wait's rule)");
			return NULL;
		}
		ckpt_finish(c);
	}
	if (c->rc)
		return raise_rc(c->rc, "ferry_checkpoint_wait");
	Py_RETURN_NONE;
}

static PyObject *ckpt_done(CkptObject *c, void *unused)
{
	return PyBool_FromLong(!c->ck);
}

/*
 * Dropped before its wait(): the wait is a collective the other nodes make,
 * so make it here on its own thread (bounded by the node's timeout). On
 * another thread it cannot be finished: the checkpoint and its table are
 * kept (the table still counts it, so destroy() stays refused and the
 * table is never destroyed under the shard's writer).
 */
static void ckpt_dealloc(CkptObject *c)
{
	if (c->ck && pthread_equal(c->tid, pthread_self())) {
		ckpt_finish(c);
	} else if (c->ck) {
		PyObject *et, *ev, *etb;

		PyErr_Fetch(&et, &ev, &etb);
		if (PyErr_WarnEx(PyExc_ResourceWarning,
				 "ferry: a checkpoint was dropped on another thread before its "
				 "wait(); it is left unfinished, and its table is kept",
				 1))
			PyErr_WriteUnraisable((PyObject *)c);
		PyErr_Restore(et, ev, etb);
		c->table = NULL; /* its reference is kept */
	}
	Py_XDECREF(c->table);
	PyObject_Free(c);
}

static PyObject *table_destroy(TableObject *t, PyObject *unused)
{
	if (t->pending) {
		PyErr_Format(PyExc_RuntimeError,
			     "ferry: %ld operations on this table were started and not waited "
			     "for; wait() them before destroy()",
			     t->pending);
		return NULL;
	}
	if (t->t)
		ferry_table_destroy(t->t);
	t->t = NULL;
	Py_RETURN_NONE;
}

static void table_dealloc(TableObject *t)
{
	if (t->t)
		ferry_table_destroy(t->t);
	Py_XDECREF(t->node);
	PyObject_Free(t);
}

static PyObject *table_stats(TableObject *t, PyObject *unused)
{
	struct ferry_table_stats s;
	PyObject *d;
	int rc;

	if (table_check(t))
		return NULL;
	rc = ferry_table_stats(t->t, &s);
	if (rc)
		return raise_rc(rc, "ferry_table_stats");
	d = PyDict_New();
	if (!d)
		return NULL;
	STAT(d, s, keys_owned);
	STAT(d, s, keys_away);
	STAT(d, s, dir_bytes);
	STAT(d, s, slots);
	STAT(d, s, slot_bytes);
	STAT(d, s, registered_bytes);
	STAT(d, s, backups);
	STAT(d, s, backup_bytes);
	STAT(d, s, slots_free);
	return d;
}

static PyObject *table_home(TableObject *t, PyObject *arg)
{
	unsigned long long k = PyLong_AsUnsignedLongLong(arg);
	int rc;

	if (PyErr_Occurred() || table_check(t))
		return NULL;
	rc = ferry_table_home(t->t, k);
	if (rc < 0)
		return raise_rc(rc, "ferry_table_home");
	return PyLong_FromLong(rc);
}

static PyObject *table_vlen(TableObject *t, PyObject *arg)
{
	unsigned long long k = PyLong_AsUnsignedLongLong(arg);

	if (PyErr_Occurred() || table_check(t))
		return NULL;
	return PyLong_FromUnsignedLong(ferry_table_value_len(t->t, k));
}

/* Node.table(...): every field of struct ferry_table_params, enums by name */
PyObject *node_table(NodeObject *n, PyObject *args, PyObject *kw)
{
	static char *kwl[] = { "num_keys",
			       "value_len",
			       "value_lens",
			       "placement",
			       "vnodes",
			       "mode",
			       "no_local_fast_path",
			       "capacity",
			       "sparse",
			       "init",
			       "init_a",
			       "init_b",
			       "init_seed",
			       "loc_cache",
			       "consistency",
			       "staleness",
			       "cons_bytes",
			       "replicas",
			       "push_codec",
			       "codec_keys",
			       "hot_keys",
			       "hot_sync_ms",
			       "hot_auto",
			       NULL };
	static const char *const placements[] = { "range", "hash", NULL };
	static const char *const modes[] = { "dynamic", "classic", NULL };
	static const char *const inits[] = { "zero", "uniform", "normal", NULL };
	static const char *const models[] = { "sequential", "eventual", "ssp", "essp", NULL };
	static const char *const codecs[] = { "none", "bf16", "fp16", NULL };
	struct ferry_table_params tp = { 0 };
	struct uarg num_keys = { "num_keys", UINT64_MAX, 0 }, vlen = { "value_len", UINT32_MAX, 0 },
		    vnodes = { "vnodes", UINT32_MAX, 0 }, capacity = { "capacity", UINT64_MAX, 0 },
		    seed = { "init_seed", UINT64_MAX, 0 },
		    loc_cache = { "loc_cache", UINT64_MAX, 0 },
		    staleness = { "staleness", UINT32_MAX, 0 },
		    cons_bytes = { "cons_bytes", UINT64_MAX, 0 },
		    replicas = { "replicas", UINT32_MAX, 0 },
		    codec_keys = { "codec_keys", UINT32_MAX, 0 },
		    hot_sync = { "hot_sync_ms", UINT32_MAX, 0 },
		    hot_auto = { "hot_auto", UINT32_MAX, 0 };
	const char *splace = "range", *smode = "dynamic", *sinit = "zero", *scons = "sequential",
		   *scodec = "none";
	int placement, mode, init, cons, codec, nlfp = 0, sparse = 0;
	float a = 0, b = 0;
	PyObject *ovl = Py_None, *ohot = Py_None;
	struct arr vl = { .held = 0 }, hk = { .held = 0 };
	struct ferry_table *t;
	TableObject *to;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(
		    args, kw, "|$O&O&OsO&spO&psffO&O&sO&O&O&sO&OO&O&", kwl, uarg_conv, &num_keys,
		    uarg_conv, &vlen, &ovl, &splace, uarg_conv, &vnodes, &smode, &nlfp, uarg_conv,
		    &capacity, &sparse, &sinit, &a, &b, uarg_conv, &seed, uarg_conv, &loc_cache,
		    &scons, uarg_conv, &staleness, uarg_conv, &cons_bytes, uarg_conv, &replicas,
		    &scodec, uarg_conv, &codec_keys, &ohot, uarg_conv, &hot_sync, uarg_conv,
		    &hot_auto))
		return NULL;
	if ((placement = name_pick(splace, "placement", placements)) < 0 ||
	    (mode = name_pick(smode, "mode", modes)) < 0 ||
	    (init = name_pick(sinit, "init", inits)) < 0 ||
	    (cons = name_pick(scons, "consistency", models)) < 0 ||
	    (codec = name_pick(scodec, "push_codec", codecs)) < 0)
		return NULL;
	if (node_check(n))
		return NULL;
	tp = (struct ferry_table_params){ .num_keys = num_keys.v,
					  .value_len = (uint32_t)vlen.v,
					  .placement = placement,
					  .vnodes = (uint32_t)vnodes.v,
					  .mode = mode,
					  .no_local_fast_path = nlfp,
					  .capacity = capacity.v,
					  .sparse = sparse,
					  .init = init,
					  .init_a = a,
					  .init_b = b,
					  .init_seed = seed.v,
					  .loc_cache = loc_cache.v,
					  .consistency = cons,
					  .staleness = (uint32_t)staleness.v,
					  .cons_bytes = cons_bytes.v,
					  .replicas = (uint32_t)replicas.v,
					  .push_codec = codec,
					  .codec_keys = (uint32_t)codec_keys.v,
					  .hot_sync_ms = (uint32_t)hot_sync.v,
					  .hot_auto = (uint32_t)hot_auto.v };
	/* hot keys (docs/consistency.md, "Hot keys"): any sequence of keys, as
	 * for a pull; the C library checks count, range and repeats */
	if (ohot != Py_None) {
		if (arr_get(ohot, "hot_keys", 0, 1, &hk))
			return NULL;
		if (hk.view.itemsize != 8 || !hk.view.len || !fmt_letter(&hk.view) ||
		    !strchr("QqLl", fmt_letter(&hk.view))) {
			arr_release(&hk);
			PyErr_SetString(PyExc_ValueError,
					"ferry: hot_keys must be uint64 keys, at least one");
			return NULL;
		}
		tp.hot_keys = hk.view.buf;
		tp.hot_count =
			(uint32_t)(hk.view.len / 8 > UINT32_MAX ? UINT32_MAX : hk.view.len / 8);
	}
	if (ovl != Py_None) {
		if (arr_get(ovl, "value_lens", 0, 0, &vl)) {
			arr_release(&hk);
			return NULL;
		}
		if (vl.view.itemsize != 4 ||
		    (fmt_letter(&vl.view) != 'I' && fmt_letter(&vl.view) != 'i') ||
		    (uint64_t)vl.view.len / 4 != num_keys.v) {
			arr_release(&vl);
			arr_release(&hk);
			PyErr_Format(
				PyExc_ValueError,
				"ferry: value_lens must be uint32 with num_keys (%llu) entries",
				num_keys.v);
			return NULL;
		}
		tp.value_lens = vl.view.buf;
		tp.value_len = 0;
	}
	Py_BEGIN_ALLOW_THREADS;
	rc = ferry_table_create(n->fy, &tp, &t);
	Py_END_ALLOW_THREADS;
	arr_release(&vl);
	arr_release(&hk);
	if (rc)
		return raise_rc(rc, "ferry_table_create");
	to = PyObject_New(TableObject, &TableType);
	if (!to) {
		ferry_table_destroy(t);
		return NULL;
	}
	Py_INCREF(n);
	to->node = n;
	to->t = t;
	to->num_keys = num_keys.v;
	to->value_len = tp.value_lens ? 0 : tp.value_len;
	to->sparse = sparse;
	to->consistency = cons;
	to->pending = 0;
	return (PyObject *)to;
}

static PyMethodDef table_methods[] = {
	KWF("pull", table_pull, "pull(keys, out=None) -> values"),
	KWF("push", table_push, "push(keys, deltas): add"),
	KWF("set", table_set, "set(keys, values)"),
	KWF("localize", table_localize, "localize(keys): move the keys to this node"),
	KWF("pull_async", table_pull_async, "as pull; returns a handle"),
	KWF("push_async", table_push_async, "as push; returns a handle"),
	KWF("set_async", table_set_async, "as set; returns a handle"),
	KWF("localize_async", table_localize_async, "as localize; returns a handle"),
	{ "flush", (PyCFunction)table_flush, METH_NOARGS,
	  "send this node's buffered pushes now, drop its cached values (ferry_flush)" },
	{ "hot_update", (PyCFunction)table_hot_update, METH_NOARGS,
	  "hot_auto: choose the hot keys again from every node's accesses (collective)" },
	{ "hot_keys", (PyCFunction)table_hot_keys, METH_NOARGS,
	  "this node's hot keys, ascending, as a uint64 array" },
	KWM("checkpoint", table_checkpoint, "checkpoint(dir): write a checkpoint (collective)"),
	KWM("checkpoint_async", table_checkpoint_async,
	    "checkpoint_async(dir) -> Checkpoint: mark it; wait() finishes it (collective)"),
	KWM("restore", table_restore, "restore(dir): load a checkpoint (collective)"),
	{ "destroy", (PyCFunction)table_destroy, METH_NOARGS, "give up this node's side" },
	{ "_c_pull_loop", (PyCFunction)table_c_pull_loop, METH_VARARGS,
	  "benchmarks: (keys, out, iters) -> seconds of ferry_pull called from C" },
	{ "stats", (PyCFunction)table_stats, METH_NOARGS, "this node's share, a dict" },
	{ "home", (PyCFunction)table_home, METH_O, "home node of a key" },
	{ "value_len_of", (PyCFunction)table_vlen, METH_O, "floats stored for a key" },
	{ NULL }
};

static PyMemberDef table_members[] = {
	{ "num_keys", T_ULONGLONG, offsetof(TableObject, num_keys), READONLY, "keys (dense)" },
	{ "value_len", T_UINT, offsetof(TableObject, value_len), READONLY,
	  "floats per key (0: per key)" },
	{ "sparse", T_INT, offsetof(TableObject, sparse), READONLY, "any uint64 key" },
	{ "consistency", T_INT, offsetof(TableObject, consistency), READONLY,
	  "0 sequential, 1 eventual, 2 ssp, 3 essp" },
	{ "node", T_OBJECT, offsetof(TableObject, node), READONLY, "the node" },
	{ NULL }
};

static PyMethodDef handle_methods[] = {
	{ "wait", (PyCFunction)handle_wait, METH_NOARGS, "wait; returns the pulled values" },
	{ "test", (PyCFunction)handle_test, METH_NOARGS, "True when done (then collected)" },
	{ NULL }
};

static PyGetSetDef handle_getset[] = {
	{ "done", (getter)handle_done, NULL, "collected", NULL },
	{ NULL },
};

PyTypeObject TableType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Table",
	.tp_basicsize = sizeof(TableObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "a ferry table (Node.table)",
	.tp_dealloc = (destructor)table_dealloc,
	.tp_methods = table_methods,
	.tp_members = table_members,
};

PyTypeObject HandleType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Handle",
	.tp_basicsize = sizeof(HandleObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "a started operation: wait() or test()",
	.tp_dealloc = (destructor)handle_dealloc,
	.tp_methods = handle_methods,
	.tp_getset = handle_getset,
};

static PyMethodDef ckpt_methods[] = {
	{ "wait", (PyCFunction)ckpt_wait, METH_NOARGS,
	  "finish the checkpoint (collective; the thread that started it)" },
	{ NULL }
};

static PyGetSetDef ckpt_getset[] = {
	{ "done", (getter)ckpt_done, NULL, "waited for", NULL },
	{ NULL },
};

PyTypeObject CkptType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Checkpoint",
	.tp_basicsize = sizeof(CkptObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "a checkpoint marked and being written: wait() finishes it",
	.tp_dealloc = (destructor)ckpt_dealloc,
	.tp_methods = ckpt_methods,
	.tp_getset = ckpt_getset,
};

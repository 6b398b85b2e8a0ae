// SPDX-License-Identifier: MIT
/*
 * _ferry: the CPython extension under the `ferry` package (python/ferry/).
 *
 * A hand-written extension module over the public API (include/ferry/ferry.h)
 * and nothing else. Each call checks its arrays through the buffer protocol
 * (numpy arrays; CPU torch tensors through their zero-copy .numpy() view), so
 * the C library reads keys and writes values in the caller's own memory, and
 * drops the GIL for the whole of every call that can wait.
 *
 * Workers per thread: ferry's workers belong to one thread each. A Node keeps
 * a pthread key; the first operation a thread makes on the node creates its
 * worker (struct pyw) and stores it under the key, and the key's destructor
 * destroys it when the thread exits, on that thread, as ferry requires. An
 * asynchronous handle holds a reference on its worker, so a worker outlives
 * neither the thread's use of it nor its tickets.
 *
 *   Node ----- pnode (pthread key, refs: Node + each pyw)
 *    |            ^
 *   Table        pyw (one per thread and node; refs: the key's slot + handles)
 *    |            ^
 *   Handle ------/   (holds its Table, its pyw and the caller's buffers)
 *
 * Bounds: one pyw per (thread, node) that made a call; one Py_buffer pair per
 * handle not yet collected (at most FERRY_MAX_INFLIGHT per worker: the C
 * library refuses more).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <ferry/ferry.h>

static PyObject *ferry_error;	   /* ferry.Error, a subclass of OSError */
static PyObject *np_empty;	   /* numpy.empty, imported at the first pull without out= */
static PyObject *torch_from_numpy; /* torch.from_numpy, once a tensor was seen */

/* ---- errors ----------------------------------------------------------- */

/* raise ferry.Error(errno, "what: ferry_strerror(rc)"); returns NULL */
static PyObject *raise_rc(int rc, const char *what)
{
	PyObject *args = Py_BuildValue("(is)", -rc, "");
	PyObject *msg = PyUnicode_FromFormat("%s: %s", what, ferry_strerror(rc));

	if (args && msg) {
		PyTuple_SetItem(args, 1, msg); /* steals msg */
		msg = NULL;
		PyErr_SetObject(ferry_error, args);
	}
	Py_XDECREF(args);
	Py_XDECREF(msg);
	return NULL;
}

/* ---- shared node state and per-thread workers ------------------------- */

struct pnode {
	pthread_key_t key;
	atomic_long refs; /* the Node object and every pyw */
};

struct pyw {
	struct ferry_worker *w;
	pthread_t tid;
	atomic_long refs; /* the thread's key slot and every handle */
	struct pnode *pn;
};

static void pnode_put(struct pnode *pn)
{
	if (atomic_fetch_sub(&pn->refs, 1) == 1) {
		pthread_key_delete(pn->key);
		PyMem_RawFree(pn);
	}
}

/*
 * Drops a reference. The last one destroys the worker, which only its own
 * thread may do; a handle freed on another thread after its thread ended
 * leaves the worker behind (its memory only: the node is closed by then or
 * keeps serving without it).
 * Context: any thread, with or without the GIL (the key destructor has none).
 */
static void pyw_put(struct pyw *p)
{
	if (atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	if (pthread_equal(p->tid, pthread_self()))
		ferry_worker_destroy(p->w);
	pnode_put(p->pn);
	PyMem_RawFree(p);
}

/* the key's destructor: runs on the exiting thread */
static void pyw_key_dtor(void *v)
{
	pyw_put(v);
}

/* ---- Node ------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD struct ferry *fy;
	struct pnode *pn;
	int closed;
} NodeObject;

static PyTypeObject NodeType;

static int node_check(NodeObject *n)
{
	if (!n->fy || n->closed) {
		raise_rc(-FERRY_E_CLOSED, "ferry node");
		return -1;
	}
	return 0;
}

/* this thread's worker on @n, made at first use. Context: GIL held. */
static struct pyw *node_worker(NodeObject *n)
{
	struct pyw *p = pthread_getspecific(n->pn->key);
	struct ferry_worker *w;
	int rc;

	if (p)
		return p;
	rc = ferry_worker_create(n->fy, &w);
	if (rc) {
		raise_rc(rc, "ferry_worker_create");
		return NULL;
	}
	p = PyMem_RawMalloc(sizeof(*p));
	if (!p) {
		ferry_worker_destroy(w);
		PyErr_NoMemory();
		return NULL;
	}
	p->w = w;
	p->tid = pthread_self();
	atomic_init(&p->refs, 1);
	p->pn = n->pn;
	atomic_fetch_add(&n->pn->refs, 1);
	if (pthread_setspecific(n->pn->key, p)) {
		p->refs = 0;
		ferry_worker_destroy(w);
		pnode_put(n->pn);
		PyMem_RawFree(p);
		PyErr_NoMemory();
		return NULL;
	}
	return p;
}

static NodeObject *node_wrap(struct ferry *fy)
{
	NodeObject *n = PyObject_New(NodeObject, &NodeType);

	if (!n) {
		ferry_close(fy);
		return NULL;
	}
	n->fy = fy;
	n->closed = 0;
	n->pn = PyMem_RawMalloc(sizeof(*n->pn));
	if (!n->pn || pthread_key_create(&n->pn->key, pyw_key_dtor)) {
		PyMem_RawFree(n->pn);
		n->pn = NULL;
		Py_DECREF(n);
		PyErr_SetString(PyExc_RuntimeError,
				"ferry: no thread-local key left (PTHREAD_KEYS_MAX); close nodes "
				"that are no longer used");
		return NULL;
	}
	atomic_init(&n->pn->refs, 1);
	return n;
}

static void node_do_close(NodeObject *n)
{
	struct pyw *p;

	if (!n->fy || n->closed)
		return;
	n->closed = 1;
	p = pthread_getspecific(n->pn->key);
	Py_BEGIN_ALLOW_THREADS;
	if (p) {
		pthread_setspecific(n->pn->key, NULL);
		pyw_put(p);
	}
	ferry_close(n->fy);
	Py_END_ALLOW_THREADS;
}

static void node_dealloc(NodeObject *n)
{
	node_do_close(n);
	if (n->pn)
		pnode_put(n->pn);
	PyObject_Free(n);
}

static PyObject *node_close(NodeObject *n, PyObject *unused)
{
	node_do_close(n);
	Py_RETURN_NONE;
}

static PyObject *node_rank(NodeObject *n, void *unused)
{
	if (node_check(n))
		return NULL;
	return PyLong_FromLong(ferry_rank(n->fy));
}

static PyObject *node_world(NodeObject *n, void *unused)
{
	if (node_check(n))
		return NULL;
	return PyLong_FromLong(ferry_world(n->fy));
}

static PyObject *node_closed(NodeObject *n, void *unused)
{
	return PyBool_FromLong(!n->fy || n->closed);
}

static PyObject *node_barrier(NodeObject *n, PyObject *unused)
{
	int rc;

	if (node_check(n))
		return NULL;
	Py_BEGIN_ALLOW_THREADS;
	rc = ferry_barrier(n->fy);
	Py_END_ALLOW_THREADS;
	if (rc)
		return raise_rc(rc, "ferry_barrier");
	Py_RETURN_NONE;
}

#define STAT(d, s, f)                                              \
	do {                                                       \
		PyObject *v_ = PyLong_FromUnsignedLongLong((s).f); \
		if (!v_ || PyDict_SetItemString(d, #f, v_)) {      \
			Py_XDECREF(v_);                            \
			Py_DECREF(d);                              \
			return NULL;                               \
		}                                                  \
		Py_DECREF(v_);                                     \
	} while (0)

static PyObject *node_stats(NodeObject *n, PyObject *unused)
{
	struct ferry_stats s;
	PyObject *d;
	int rc;

	if (node_check(n))
		return NULL;
	rc = ferry_stats(n->fy, &s);
	if (rc)
		return raise_rc(rc, "ferry_stats");
	d = PyDict_New();
	if (!d)
		return NULL;
	STAT(d, s, local_ops);
	STAT(d, s, remote_ops);
	STAT(d, s, served_ops);
	STAT(d, s, forwards);
	STAT(d, s, relocations_in);
	STAT(d, s, relocations_out);
	STAT(d, s, msgs_sent);
	STAT(d, s, msgs_recv);
	STAT(d, s, bytes_sent);
	STAT(d, s, bytes_recv);
	STAT(d, s, onesided_reads);
	STAT(d, s, onesided_retries);
	STAT(d, s, onesided_fallbacks);
	return d;
}

/* ---- arrays ----------------------------------------------------------- */

/* an argument seen through the buffer protocol */
struct arr {
	Py_buffer view;
	int held;
	int torch; /* it was a torch tensor */
};

static void arr_release(struct arr *a)
{
	if (a->held)
		PyBuffer_Release(&a->view);
	a->held = 0;
}

/* the format's letter without a native byte-order prefix, or 0 */
static char fmt_letter(const Py_buffer *v)
{
	const char *f = v->format ? v->format : "B";

	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	if (!f[0] || f[1])
		return 0;
	return *f;
}

/*
 * Sees @obj through the buffer protocol, C-contiguous; a CPU torch tensor
 * through its .numpy() view (the same memory); with @keys, a list or an int
 * through numpy.asarray(obj, uint64) (a copy: lists have no such memory).
 */
static int arr_get(PyObject *obj, const char *name, int writable, int keys, struct arr *a)
{
	PyObject *conv = NULL;
	int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);

	a->held = 0;
	a->torch = 0;
	if (!PyObject_CheckBuffer(obj)) {
		if (PyObject_HasAttrString(obj, "__dlpack__") &&
		    PyObject_HasAttrString(obj, "numpy")) {
			/* a torch tensor: numpy() shares its memory; a CUDA tensor
			 * or one that requires grad raises here, saying why */
			conv = PyObject_CallMethod(obj, "numpy", NULL);
			if (!conv)
				return -1;
			a->torch = 1;
		} else if (keys && (PyList_Check(obj) || PyTuple_Check(obj) || PyLong_Check(obj))) {
			PyObject *np = PyImport_ImportModule("numpy");

			if (!np)
				return -1;
			conv = PyObject_CallMethod(np, "asarray", "Os", obj, "uint64");
			Py_DECREF(np);
			if (!conv)
				return -1;
			if (PyLong_Check(obj)) {
				PyObject *r = PyObject_CallMethod(conv, "reshape", "i", 1);

				Py_DECREF(conv);
				if (!(conv = r))
					return -1;
			}
		} else {
			PyErr_Format(
				PyExc_TypeError,
				"ferry: %s must be a numpy array or a CPU torch tensor, not %.80s",
				name, Py_TYPE(obj)->tp_name);
			return -1;
		}
		obj = conv;
	}
	if (PyObject_GetBuffer(obj, &a->view, flags)) {
		PyObject *t, *v, *tb;

		PyErr_Fetch(&t, &v, &tb);
		Py_XDECREF(t);
		Py_XDECREF(v);
		Py_XDECREF(tb);
		if (writable && !PyObject_GetBuffer(obj, &a->view, PyBUF_STRIDED_RO)) {
			int ro = a->view.readonly;

			PyBuffer_Release(&a->view);
			if (ro) {
				Py_XDECREF(conv);
				PyErr_Format(PyExc_ValueError, "ferry: %s is read-only", name);
				return -1;
			}
		}
		Py_XDECREF(conv);
		PyErr_Format(PyExc_ValueError,
			     "ferry: %s must be C-contiguous (numpy.ascontiguousarray(x) or "
			     "tensor.contiguous() makes a contiguous copy)",
			     name);
		return -1;
	}
	Py_XDECREF(conv); /* the view holds its own reference */
	a->held = 1;
	return 0;
}

/* keys: uint64 or int64, one dimension (or none) */
static int keys_get(PyObject *obj, struct arr *a, size_t *n_p)
{
	char c;

	if (arr_get(obj, "keys", 0, 1, a))
		return -1;
	c = fmt_letter(&a->view);
	if (a->view.itemsize != 8 ||
	    !(c == 'Q' || c == 'q' || (sizeof(long) == 8 && (c == 'L' || c == 'l')))) {
		PyErr_Format(PyExc_TypeError,
			     "ferry: keys must be uint64 or int64, not format '%s' (%zd bytes); "
			     "use keys.astype(numpy.uint64) or torch.int64",
			     a->view.format ? a->view.format : "B", a->view.itemsize);
		goto err;
	}
	if (a->view.ndim > 1) {
		PyErr_Format(PyExc_ValueError, "ferry: keys must be one-dimensional, not %d-D",
			     a->view.ndim);
		goto err;
	}
	*n_p = (size_t)(a->view.len / 8);
	return 0;
err:
	arr_release(a);
	return -1;
}

/* ---- Table ------------------------------------------------------------ */

typedef struct {
	PyObject_HEAD NodeObject *node;
	struct ferry_table *t;
	uint64_t num_keys;
	uint32_t value_len; /* 0: per key (value_lens) */
	int sparse;
	long pending; /* handles not yet collected (GIL) */
} TableObject;

static PyTypeObject TableType;

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
			PyErr_Format(PyExc_IndexError,
				     "ferry: key %llu is out of range (0 .. %llu)",
				     (unsigned long long)keys[i],
				     (unsigned long long)t->num_keys - 1);
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
	    (v->ndim >= 2 && (size_t)v->shape[0] != n && t->value_len)) {
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

static PyTypeObject HandleType;

/* the ticket is collected: give back the buffers. Context: GIL held. */
static void handle_finish(HandleObject *h, int rc)
{
	h->done = 1;
	h->rc = rc;
	arr_release(&h->keys);
	arr_release(&h->vals);
	h->table->pending--;
}

static int handle_mine(HandleObject *h)
{
	if (pthread_equal(h->pw->tid, pthread_self()))
		return 0;
	PyErr_SetString(PyExc_RuntimeError, "ferry: a handle is waited for by the thread that "
					    "started it (its worker belongs to that thread)");
	return -1;
}

static PyObject *handle_result(HandleObject *h)
{
	if (h->rc)
		return raise_rc(h->rc, op_names[h->op]);
	Py_INCREF(h->result);
	return h->result;
}

static PyObject *handle_wait(HandleObject *h, PyObject *unused)
{
	int rc;

	if (!h->done) {
		if (handle_mine(h))
			return NULL;
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
		if (handle_mine(h))
			return NULL;
		rc = ferry_test(h->pw->w, h->ticket);
		if (rc == -EAGAIN)
			Py_RETURN_FALSE;
		handle_finish(h, rc);
	}
	if (h->rc)
		return raise_rc(h->rc, op_names[h->op]);
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
 */
static void handle_dealloc(HandleObject *h)
{
	if (!h->done) {
		if (pthread_equal(h->pw->tid, pthread_self())) {
			int rc;

			Py_BEGIN_ALLOW_THREADS;
			rc = ferry_wait(h->pw->w, h->ticket);
			Py_END_ALLOW_THREADS;
			handle_finish(h, rc);
		} else {
			PyErr_WarnEx(PyExc_ResourceWarning,
				     "ferry: a handle was dropped on another thread before its "
				     "wait(); its buffers are kept",
				     1);
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

static PyObject *table_op(TableObject *t, PyObject *args, PyObject *kw, enum op_kind op, int async)
{
	static char *kw_pull[] = { "keys", "out", NULL };
	static char *kw_push[] = { "keys", "deltas", NULL };
	static char *kw_set[] = { "keys", "values", NULL };
	static char *kw_loc[] = { "keys", NULL };
	PyObject *okeys, *ovals = Py_None, *result = NULL;
	struct arr keys, vals = { .held = 0 };
	size_t n, floats = 0;
	struct pyw *pw;
	uint64_t ticket = 0;
	int rc;

	switch (op) {
	case OP_PULL:
		if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", kw_pull, &okeys, &ovals))
			return NULL;
		break;
	case OP_PUSH:
		if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", kw_push, &okeys, &ovals))
			return NULL;
		break;
	case OP_SET:
		if (!PyArg_ParseTupleAndKeywords(args, kw, "OO", kw_set, &okeys, &ovals))
			return NULL;
		break;
	default:
		if (!PyArg_ParseTupleAndKeywords(args, kw, "O", kw_loc, &okeys))
			return NULL;
	}
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

#define OPFN(name, op, async)                                               \
	static PyObject *name(TableObject *t, PyObject *args, PyObject *kw) \
	{                                                                   \
		return table_op(t, args, kw, op, async);                    \
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

/* the index of @s among the names (up to three), or -1 with ValueError */
static int name_index(const char *s, const char *what, const char *a, const char *b, const char *c)
{
	if (!strcmp(s, a))
		return 0;
	if (!strcmp(s, b))
		return 1;
	if (c && !strcmp(s, c))
		return 2;
	PyErr_Format(PyExc_ValueError, "ferry: %s must be '%s' or '%s'%s%s%s, not '%s'", what, a, b,
		     c ? " or '" : "", c ? c : "", c ? "'" : "", s);
	return -1;
}

/* Node.table(...): every field of struct ferry_table_params, enums as ints
 * (placement, mode and init by name) */
static PyObject *node_table(NodeObject *n, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {
		"num_keys",	      "value_len", "value_lens", "placement", "vnodes", "mode",
		"no_local_fast_path", "capacity",  "sparse",	 "init",      "init_a", "init_b",
		"init_seed",	      "loc_cache", NULL
	};
	struct ferry_table_params tp = { 0 };
	unsigned long long num_keys = 0, capacity = 0, seed = 0, loc_cache = 0;
	unsigned int vlen = 0, vnodes = 0;
	const char *splace = "range", *smode = "dynamic", *sinit = "zero";
	int placement, mode, init, nlfp = 0, sparse = 0;
	float a = 0, b = 0;
	PyObject *ovl = Py_None;
	struct arr vl = { .held = 0 };
	struct ferry_table *t;
	TableObject *to;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$KIOsIspKpsffKK", kwl, &num_keys, &vlen, &ovl,
					 &splace, &vnodes, &smode, &nlfp, &capacity, &sparse,
					 &sinit, &a, &b, &seed, &loc_cache))
		return NULL;
	placement = name_index(splace, "placement", "range", "hash", NULL);
	mode = name_index(smode, "mode", "dynamic", "classic", NULL);
	init = name_index(sinit, "init", "zero", "uniform", "normal");
	if (placement < 0 || mode < 0 || init < 0)
		return NULL;
	if (node_check(n))
		return NULL;
	tp = (struct ferry_table_params){ .num_keys = num_keys,
					  .value_len = vlen,
					  .placement = placement,
					  .vnodes = vnodes,
					  .mode = mode,
					  .no_local_fast_path = nlfp,
					  .capacity = capacity,
					  .sparse = sparse,
					  .init = init,
					  .init_a = a,
					  .init_b = b,
					  .init_seed = seed,
					  .loc_cache = loc_cache };
	if (ovl != Py_None) {
		if (arr_get(ovl, "value_lens", 0, 0, &vl))
			return NULL;
		if (vl.view.itemsize != 4 ||
		    (fmt_letter(&vl.view) != 'I' && fmt_letter(&vl.view) != 'i') ||
		    (uint64_t)vl.view.len / 4 != num_keys) {
			arr_release(&vl);
			PyErr_Format(
				PyExc_ValueError,
				"ferry: value_lens must be uint32 with num_keys (%llu) entries",
				num_keys);
			return NULL;
		}
		tp.value_lens = vl.view.buf;
		tp.value_len = 0;
	}
	Py_BEGIN_ALLOW_THREADS;
	rc = ferry_table_create(n->fy, &tp, &t);
	Py_END_ALLOW_THREADS;
	arr_release(&vl);
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
	to->num_keys = num_keys;
	to->value_len = tp.value_lens ? 0 : vlen;
	to->sparse = sparse;
	to->pending = 0;
	return (PyObject *)to;
}

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

static PyTypeObject CollType;

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

#define COLLFN(name, k, async)                                             \
	static PyObject *name(NodeObject *n, PyObject *args, PyObject *kw) \
	{                                                                  \
		return node_coll(n, args, kw, k, async);                   \
	}
COLLFN(node_allreduce, C_ALLREDUCE, 0)
COLLFN(node_reduce, C_REDUCE, 0)
COLLFN(node_broadcast, C_BROADCAST, 0)
COLLFN(node_allreduce_async, C_ALLREDUCE, 1)
COLLFN(node_reduce_async, C_REDUCE, 1)
COLLFN(node_broadcast_async, C_BROADCAST, 1)

/* ---- module functions ------------------------------------------------- */

/* "auto", "tcp", "rdma", "loop" -> enum ferry_transport_kind */
static int transport_kind(const char *s, enum ferry_transport_kind *k_p)
{
	static const char *const names[] = { "auto", "tcp", "rdma", "loop" };

	for (int i = 0; i < 4; i++)
		if (s && !strcmp(s, names[i])) {
			*k_p = (enum ferry_transport_kind)i;
			return 0;
		}
	PyErr_Format(PyExc_ValueError,
		     "ferry: transport must be 'auto', 'tcp', 'rdma' or 'loop', not '%s'", s);
	return -1;
}

static PyObject *mod_open(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = { "rank",	    "world",	 "rendezvous", "rendezvous_fd",
			       "bind_addr", "transport", "timeout_ms", "busy_poll",
			       "mem_limit", NULL };
	const char *tp = "auto";
	unsigned long long mem = 0;
	struct ferry_params p;
	struct ferry *fy;
	int rc;

	ferry_params_init(&p);
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|$iizizsiiK", kwl, &p.rank, &p.world,
					 &p.rendezvous, &p.rendezvous_fd, &p.bind_addr, &tp,
					 &p.timeout_ms, &p.busy_poll, &mem) ||
	    transport_kind(tp, &p.transport))
		return NULL;
	p.mem_limit = mem;
	Py_BEGIN_ALLOW_THREADS;
	rc = ferry_open(&p, &fy);
	Py_END_ALLOW_THREADS;
	if (rc)
		return raise_rc(rc, "ferry_open");
	return (PyObject *)node_wrap(fy);
}

static PyObject *mod_local_cluster(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = { "n", "transport", "timeout_ms", "busy_poll", "mem_limit", NULL };
	struct ferry_params p;
	unsigned long long mem = 0;
	const char *tp = "auto";
	struct ferry **fys;
	PyObject *list;
	int n, rc;

	ferry_params_init(&p);
	if (!PyArg_ParseTupleAndKeywords(args, kw, "i|$siiK", kwl, &n, &tp, &p.timeout_ms,
					 &p.busy_poll, &mem) ||
	    transport_kind(tp, &p.transport))
		return NULL;
	p.mem_limit = mem;
	if (n < 1 || n > 64) {
		PyErr_Format(PyExc_ValueError, "ferry: a local cluster has 1 to 64 nodes, not %d",
			     n);
		return NULL;
	}
	fys = PyMem_Calloc((size_t)n, sizeof(*fys));
	if (!fys)
		return PyErr_NoMemory();
	Py_BEGIN_ALLOW_THREADS;
	rc = ferry_local_cluster_open(n, &p, fys);
	Py_END_ALLOW_THREADS;
	if (rc) {
		PyMem_Free(fys);
		return raise_rc(rc, "ferry_local_cluster_open");
	}
	list = PyList_New(n);
	for (int i = 0; i < n; i++) {
		PyObject *o = list ? (PyObject *)node_wrap(fys[i]) : NULL;

		if (!o) {
			for (int j = i + (list ? 1 : 0); j < n; j++)
				ferry_close(fys[j]);
			Py_XDECREF(list);
			PyMem_Free(fys);
			return NULL;
		}
		PyList_SET_ITEM(list, i, o);
	}
	PyMem_Free(fys);
	return list;
}

static PyObject *mod_strerror(PyObject *self, PyObject *arg)
{
	long e = PyLong_AsLong(arg);

	if (PyErr_Occurred())
		return NULL;
	return PyUnicode_FromString(ferry_strerror((int)e));
}

/* ---- type and module tables ------------------------------------------- */

#define KWM(name, fn, doc)                                                               \
	{                                                                                \
		name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc \
	}

static PyObject *node_enter(PyObject *n, PyObject *unused)
{
	Py_INCREF(n);
	return n;
}

static PyObject *node_exit(NodeObject *n, PyObject *args)
{
	node_do_close(n);
	Py_RETURN_FALSE;
}

static PyMethodDef node_methods[] = {
	{ "__enter__", (PyCFunction)node_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)node_exit, METH_VARARGS, NULL },
	{ "close", (PyCFunction)node_close, METH_NOARGS, "leave the cluster (ferry_close)" },
	{ "barrier", (PyCFunction)node_barrier, METH_NOARGS, "wait for every node" },
	{ "stats", (PyCFunction)node_stats, METH_NOARGS, "this node's counters, a dict" },
	KWM("table", node_table, "create a table (collective)"),
	KWM("allreduce", node_allreduce, "allreduce(src, dst=None, op='sum') -> dst"),
	KWM("reduce", node_reduce, "reduce(src, dst=None, op='sum', root=0) -> dst"),
	KWM("broadcast", node_broadcast, "broadcast(buf, root=0) -> buf"),
	KWM("allreduce_async", node_allreduce_async, "as allreduce; returns a handle"),
	KWM("reduce_async", node_reduce_async, "as reduce; returns a handle"),
	KWM("broadcast_async", node_broadcast_async, "as broadcast; returns a handle"),
	{ NULL }
};

static PyGetSetDef node_getset[] = {
	{ "rank", (getter)node_rank, NULL, "this node's rank", NULL },
	{ "world", (getter)node_world, NULL, "nodes in the cluster", NULL },
	{ "closed", (getter)node_closed, NULL, "close() was called", NULL },
	{ NULL }
};

static PyMethodDef table_methods[] = {
	KWM("pull", table_pull, "pull(keys, out=None) -> values"),
	KWM("push", table_push, "push(keys, deltas): add"),
	KWM("set", table_set, "set(keys, values)"),
	KWM("localize", table_localize, "localize(keys): move the keys to this node"),
	KWM("pull_async", table_pull_async, "as pull; returns a handle"),
	KWM("push_async", table_push_async, "as push; returns a handle"),
	KWM("set_async", table_set_async, "as set; returns a handle"),
	KWM("localize_async", table_localize_async, "as localize; returns a handle"),
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
	{ "node", T_OBJECT, offsetof(TableObject, node), READONLY, "the node" },
	{ NULL }
};

static PyMethodDef handle_methods[] = {
	{ "wait", (PyCFunction)handle_wait, METH_NOARGS, "wait; returns the pulled values" },
	{ "test", (PyCFunction)handle_test, METH_NOARGS, "True when done (then collected)" },
	{ NULL }
};

static PyGetSetDef handle_getset[] = { { "done", (getter)handle_done, NULL, "collected", NULL },
				       { NULL } };

static PyMethodDef coll_methods[] = {
	{ "wait", (PyCFunction)coll_wait, METH_NOARGS, "wait; returns the result buffer" },
	{ "test", (PyCFunction)coll_test, METH_NOARGS, "True when done" },
	{ NULL }
};

static PyTypeObject NodeType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Node",
	.tp_basicsize = sizeof(NodeObject),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "a ferry node (ferry.open)",
	.tp_dealloc = (destructor)node_dealloc,
	.tp_methods = node_methods,
	.tp_getset = node_getset,
};

static PyTypeObject TableType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Table",
	.tp_basicsize = sizeof(TableObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "a ferry table (Node.table)",
	.tp_dealloc = (destructor)table_dealloc,
	.tp_methods = table_methods,
	.tp_members = table_members,
};

static PyTypeObject HandleType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Handle",
	.tp_basicsize = sizeof(HandleObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "a started operation: wait() or test()",
	.tp_dealloc = (destructor)handle_dealloc,
	.tp_methods = handle_methods,
	.tp_getset = handle_getset,
};

static PyTypeObject CollType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.CollHandle",
	.tp_basicsize = sizeof(CollObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "a started collective: wait() or test()",
	.tp_dealloc = (destructor)coll_dealloc,
	.tp_methods = coll_methods,
};

static PyMethodDef mod_methods[] = {
	KWM("open", mod_open, "join the cluster (ferry_open)"),
	KWM("local_cluster", mod_local_cluster, "n nodes in this process, over loopback"),
	{ "strerror", (PyCFunction)mod_strerror, METH_O, "describe an error code" },
	{ NULL }
};

static struct PyModuleDef mod_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "ferry._ferry",
	.m_doc = "libferry's C API (use the ferry package)",
	.m_size = -1,
	.m_methods = mod_methods,
};

PyMODINIT_FUNC PyInit__ferry(void);
PyMODINIT_FUNC PyInit__ferry(void)
{
	PyTypeObject *types[] = { &NodeType, &TableType, &HandleType, &CollType };
	const char *names[] = { "Node", "Table", "Handle", "CollHandle" };
	PyObject *m;

	for (size_t i = 0; i < 4; i++)
		if (PyType_Ready(types[i]))
			return NULL;
	m = PyModule_Create(&mod_def);
	if (!m)
		return NULL;
	ferry_error = PyErr_NewExceptionWithDoc(
		"ferry.Error",
		"a libferry call failed: errno is the error code (Ferry's own at or above "
		"E_BASE), strerror says what failed and why",
		PyExc_OSError, NULL);
	if (!ferry_error || PyModule_AddObjectRef(m, "Error", ferry_error))
		goto err;
	for (size_t i = 0; i < 4; i++)
		if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]))
			goto err;
	if (PyModule_AddIntConstant(m, "E_BASE", FERRY_ERRNO_BASE) ||
	    PyModule_AddIntConstant(m, "E_CLOSED", FERRY_E_CLOSED) ||
	    PyModule_AddIntConstant(m, "E_MISMATCH", FERRY_E_MISMATCH) ||
	    PyModule_AddIntConstant(m, "E_PROTO", FERRY_E_PROTO) ||
	    PyModule_AddIntConstant(m, "E_PEER", FERRY_E_PEER) ||
	    PyModule_AddIntConstant(m, "E_NOJOIN", FERRY_E_NOJOIN) ||
	    PyModule_AddIntConstant(m, "E_NODEV", FERRY_E_NODEV) ||
	    PyModule_AddStringConstant(m, "version", ferry_version()))
		goto err;
	return m;
err:
	Py_DECREF(m);
	return NULL;
}

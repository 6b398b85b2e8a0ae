// SPDX-License-Identifier: MIT
/*
 * _ferry: the CPython extension under the `ferry` package (python/ferry/).
 *
 * A hand-written extension module over the public API (include/ferry/ferry.h)
 * and nothing else. Each call checks its arrays through the buffer protocol
 * (numpy arrays; CPU torch tensors through their attributes: arrays.c), so
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
#include <errno.h>
#include <string.h>

#include "pyferry.h"

/* built with ferry._torchview (python/CMakeLists.txt sets FERRY_TORCH_FILE; arrays.c) */
#ifdef FERRY_TORCH_FILE
#define TORCHVIEW_BUILT 1
#else
#define TORCHVIEW_BUILT 0
#endif

static PyObject *ferry_error; /* ferry.Error, a subclass of OSError */

/* ---- errors ----------------------------------------------------------- */

/* raise ferry.Error(errno, "what: ferry_strerror(rc)"); returns NULL */
PyObject *raise_rc(int rc, const char *what)
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

static void pnode_put(struct pnode *pn)
{
	if (atomic_fetch_sub(&pn->refs, 1) == 1) {
		pthread_key_delete(pn->key);
		PyMem_RawFree(pn);
	}
}

/*
 * The worker goes when its thread leaves it: at the thread's exit (the key's
 * destructor) or when the thread closes the node. It must: a worker is
 * registered with RCU on its thread, and a registration that outlives its
 * thread makes every later synchronize_rcu() of the process read the dead
 * thread's memory. Handles that still hold the pyw then find w NULL: the
 * worker's destruction ended their operations (no buffer is touched after
 * it), and they report -ECANCELED.
 * Context: the pyw's own thread, with or without the GIL.
 */
static void pyw_leave(struct pyw *p)
{
	if (p->w)
		ferry_worker_destroy(p->w);
	p->w = NULL;
	pyw_put(p);
}

/*
 * Drops a reference; the last frees the pyw (its worker is gone by then,
 * unless this is its own thread, which may still destroy it).
 * Context: any thread, with or without the GIL (the key destructor has none).
 */
void pyw_put(struct pyw *p)
{
	if (atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	if (p->w && pthread_equal(p->tid, pthread_self()))
		ferry_worker_destroy(p->w);
	pnode_put(p->pn);
	PyMem_RawFree(p);
}

/* the key's destructor: runs on the exiting thread */
static void pyw_key_dtor(void *v)
{
	pyw_leave(v);
}

/* ---- Node ------------------------------------------------------------- */

int node_check(NodeObject *n)
{
	if (!n->fy || n->closed) {
		raise_rc(-FERRY_E_CLOSED, "ferry node");
		return -1;
	}
	return 0;
}

/* this thread's worker on @n, made at first use. Context: GIL held. */
struct pyw *node_worker(NodeObject *n)
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
		pyw_leave(p);
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
	if (node_check(n))
		return NULL;
	RETURN_CALL("ferry_barrier", ferry_barrier(n->fy));
}

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
	STAT(d, s, cons_hits);
	STAT(d, s, cons_misses);
	STAT(d, s, cons_refreshed);
	STAT(d, s, essp_subscribed);
	STAT(d, s, essp_pushed);
	STAT(d, s, essp_taken);
	STAT(d, s, essp_refused);
	STAT(d, s, tp_buffer_bytes);
	STAT(d, s, peers_failed);
	{
		PyObject *l = PyList_New(FERRY_STALENESS_BUCKETS);

		for (int i = 0; l && i < FERRY_STALENESS_BUCKETS; i++) {
			PyObject *v = PyLong_FromUnsignedLongLong(s.staleness[i]);

			if (!v)
				Py_CLEAR(l);
			else
				PyList_SET_ITEM(l, i, v);
		}
		if (!l || PyDict_SetItemString(d, "staleness", l)) {
			Py_XDECREF(l);
			Py_DECREF(d);
			return NULL;
		}
		Py_DECREF(l);
	}
	return d;
}

static PyObject *node_epoch(NodeObject *n, void *unused)
{
	if (node_check(n))
		return NULL;
	return PyLong_FromUnsignedLongLong(ferry_epoch(n->fy));
}

/* Node.clock(): ends this thread's iteration (ferry_clock on its worker) */
static PyObject *node_clock(NodeObject *n, PyObject *unused)
{
	struct pyw *pw;

	if (node_check(n) || !(pw = node_worker(n)))
		return NULL;
	RETURN_CALL("ferry_clock", ferry_clock(pw->w));
}

static PyObject *node_clock_get(NodeObject *n, PyObject *unused)
{
	struct pyw *pw;

	if (node_check(n) || !(pw = node_worker(n)))
		return NULL;
	return PyLong_FromUnsignedLongLong(ferry_clock_get(pw->w));
}

/* Node.coll_algo(name): "auto", "doubling" or "ring" (ferry_coll_algo_set) */
static PyObject *node_coll_algo(NodeObject *n, PyObject *arg)
{
	static const char *const names[] = { "auto", "doubling", "ring", NULL };
	const char *s = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
	int i, rc;

	if (!s) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_TypeError, "ferry: the algorithm is a str, not %.80s",
				     Py_TYPE(arg)->tp_name);
		return NULL;
	}
	if ((i = name_pick(s, "the algorithm", names)) < 0 || node_check(n))
		return NULL;
	rc = ferry_coll_algo_set(n->fy, (enum ferry_coll_algo)i);
	if (rc)
		return raise_rc(rc, "ferry_coll_algo_set");
	Py_RETURN_NONE;
}

/* __enter__ of the context managers (Node, Group): the object itself */
PyObject *self_enter(PyObject *n, PyObject *unused)
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
	{ "__enter__", (PyCFunction)self_enter, METH_NOARGS, NULL },
	{ "__exit__", (PyCFunction)node_exit, METH_VARARGS, NULL },
	{ "close", (PyCFunction)node_close, METH_NOARGS, "leave the cluster (ferry_close)" },
	{ "barrier", (PyCFunction)node_barrier, METH_NOARGS, "wait for every node" },
	{ "stats", (PyCFunction)node_stats, METH_NOARGS, "this node's counters, a dict" },
	KWM("table", node_table, "create a table (collective)"),
	KWM("group", node_group, "group(ranks): the group of these ranks, for collectives"),
	{ "clock", (PyCFunction)node_clock, METH_NOARGS,
	  "end this thread's iteration (ferry_clock): consistency models" },
	{ "clock_get", (PyCFunction)node_clock_get, METH_NOARGS, "this thread's clock" },
	{ "coll_algo", (PyCFunction)node_coll_algo, METH_O,
	  "coll_algo('auto' | 'doubling' | 'ring'): force the collectives' algorithm" },
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
	{ "epoch", (getter)node_epoch, NULL, "the membership epoch seen (etcd revision; 0)", NULL },
	{ NULL }
};

PyTypeObject NodeType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Node",
	.tp_basicsize = sizeof(NodeObject),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.tp_doc = "a ferry node (ferry.open)",
	.tp_dealloc = (destructor)node_dealloc,
	.tp_methods = node_methods,
	.tp_getset = node_getset,
};

/* ---- module functions ------------------------------------------------- */

/* "auto", "tcp", "rdma", "loop" -> enum ferry_transport_kind */
static int transport_kind(const char *s, enum ferry_transport_kind *k_p)
{
	static const char *const names[] = { "auto", "tcp", "rdma", "loop", NULL };
	int i = name_pick(s, "transport", names);

	if (i < 0)
		return -1;
	*k_p = (enum ferry_transport_kind)i;
	return 0;
}

/*
 * What the C library would take and then refuse with only a log line, or
 * read past: said here as the exception. The token and the endpoints are
 * copied by ferry_open; the Python strings need live only for the call.
 */
static int params_check(const struct ferry_params *p)
{
	if (p->token && !*p->token) {
		PyErr_SetString(PyExc_ValueError,
				"ferry: token is empty; pass the cluster's shared secret, or None "
				"for FERRY_TOKEN / FERRY_TOKEN_FILE");
		return -1;
	}
	if (p->etcd_ttl < 0) {
		PyErr_Format(
			PyExc_ValueError,
			"ferry: etcd_ttl is seconds, 1 or more (0: FERRY_ETCD_TTL or 5), not %d",
			p->etcd_ttl);
		return -1;
	}
	if (p->heartbeat_ms < -1) {
		PyErr_Format(
			PyExc_ValueError,
			"ferry: heartbeat_ms is milliseconds (0: FERRY_HEARTBEAT_MS or 5000; -1: "
			"off), not %d",
			p->heartbeat_ms);
		return -1;
	}
	return 0;
}

static PyObject *mod_open(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = { "rank",		"world",	  "rendezvous",
			       "rendezvous_fd", "bind_addr",	  "transport",
			       "timeout_ms",	"busy_poll",	  "mem_limit",
			       "token",		"etcd_endpoints", "etcd_ttl",
			       "heartbeat_ms",	"rejoin",	  NULL };
	const char *tp = "auto";
	struct uarg mem = { "mem_limit", UINT64_MAX, 0 };
	struct ferry_params p;
	struct ferry *fy;
	int rc;

	ferry_params_init(&p);
	if (!PyArg_ParseTupleAndKeywords(
		    args, kw, "|$iizizsiiO&zziii", kwl, &p.rank, &p.world, &p.rendezvous,
		    &p.rendezvous_fd, &p.bind_addr, &tp, &p.timeout_ms, &p.busy_poll, uarg_conv,
		    &mem, &p.token, &p.etcd_endpoints, &p.etcd_ttl, &p.heartbeat_ms, &p.rejoin) ||
	    transport_kind(tp, &p.transport) || params_check(&p))
		return NULL;
	p.mem_limit = mem.v;
	Py_BEGIN_ALLOW_THREADS;
	rc = ferry_open(&p, &fy);
	Py_END_ALLOW_THREADS;
	if (rc)
		return raise_rc(rc, "ferry_open");
	return (PyObject *)node_wrap(fy);
}

static PyObject *mod_local_cluster(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = { "n",	"transport",	  "timeout_ms", "busy_poll",	"mem_limit",
			       "token", "etcd_endpoints", "etcd_ttl",	"heartbeat_ms", NULL };
	struct ferry_params p;
	struct uarg mem = { "mem_limit", UINT64_MAX, 0 };
	const char *tp = "auto";
	struct ferry **fys;
	PyObject *list;
	int n, rc;

	ferry_params_init(&p);
	if (!PyArg_ParseTupleAndKeywords(args, kw, "i|$siiO&zzii", kwl, &n, &tp, &p.timeout_ms,
					 &p.busy_poll, uarg_conv, &mem, &p.token, &p.etcd_endpoints,
					 &p.etcd_ttl, &p.heartbeat_ms) ||
	    transport_kind(tp, &p.transport) || params_check(&p))
		return NULL;
	p.mem_limit = mem.v;
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

/* ---- the module ------------------------------------------------------- */

static PyMethodDef mod_methods[] = {
	KWM("open", mod_open, "join the cluster (ferry_open)"),
	KWM("local_cluster", mod_local_cluster, "n nodes in this process, over loopback"),
	{ "strerror", (PyCFunction)mod_strerror, METH_O, "describe an error code" },
	{ "_tensor_path", (PyCFunction)mod_tensor_path, METH_O,
	  "benchmarks: how torch tensors are read ('attrs', 'dlpack', 'strings'); returns the "
	  "previous" },
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
	PyTypeObject *types[] = { &NodeType, &TableType, &HandleType,
				  &CollType, &GroupType, &CkptType };
	const char *names[] = { "Node", "Table", "Handle", "CollHandle", "Group", "Checkpoint" };
	PyObject *m;

	for (size_t i = 0; i < 6; i++)
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
	for (size_t i = 0; i < 6; i++)
		if (PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]))
			goto err;
	if (PyModule_AddIntConstant(m, "E_BASE", FERRY_ERRNO_BASE) ||
	    PyModule_AddIntConstant(m, "E_CLOSED", FERRY_E_CLOSED) ||
	    PyModule_AddIntConstant(m, "E_MISMATCH", FERRY_E_MISMATCH) ||
	    PyModule_AddIntConstant(m, "E_PROTO", FERRY_E_PROTO) ||
	    PyModule_AddIntConstant(m, "E_PEER", FERRY_E_PEER) ||
	    PyModule_AddIntConstant(m, "E_NOJOIN", FERRY_E_NOJOIN) ||
	    PyModule_AddIntConstant(m, "E_NODEV", FERRY_E_NODEV) ||
	    PyModule_AddStringConstant(m, "version", ferry_version()) ||
	    PyModule_AddIntConstant(m, "_TORCHVIEW", TORCHVIEW_BUILT))
		goto err;
	return m;
err:
	Py_DECREF(m);
	return NULL;
}

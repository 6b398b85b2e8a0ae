/* SPDX-License-Identifier: MIT */
/*
 * What the files of the _ferry extension share (python/ferry/): module.c (errors, nodes,
 * per-thread workers, the module), arrays.c (arguments through the buffer protocol), table.c
 * (tables, operations, handles), coll.c (collectives). Internal: never installed.
 */
#ifndef FERRY_PY_PYFERRY_H
#define FERRY_PY_PYFERRY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <pthread.h>
#include <stdatomic.h>

#include <ferry/ferry.h>

struct pnode {
	pthread_key_t key;
	atomic_long refs; /* the Node object and every pyw */
};

struct pyw {
	struct ferry_worker *_Atomic w; /* NULL once its thread left it (module.c) */
	pthread_t tid;
	atomic_long refs; /* the thread's key slot and every handle */
	struct pnode *pn;
};

typedef struct {
	PyObject_HEAD struct ferry *fy;
	struct pnode *pn;
	int closed;
} NodeObject;

/* an argument seen through the buffer protocol */
struct arr {
	Py_buffer view;	   /* a torch tensor's is filled in here: obj holds it, no shape */
	Py_ssize_t shape0; /* the first dimension (ndim >= 1) */
	int held;
	int torch; /* it was a torch tensor */
};

typedef struct {
	PyObject_HEAD NodeObject *node;
	struct ferry_table *t;
	uint64_t num_keys;
	uint32_t value_len; /* 0: per key (value_lens) */
	int sparse;
	int consistency; /* enum ferry_consistency */
	long pending;	 /* handles and checkpoints not yet collected (GIL) */
} TableObject;

extern PyTypeObject NodeType, TableType, HandleType, CollType, GroupType, CkptType;

#define KWM(name, fn, doc)                                                               \
	{                                                                                \
		name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc \
	}

/* a method taking (self, args, nargs, kwnames): args_objs() parses it */
#define KWF(name, fn, doc)                                                                \
	{                                                                                 \
		name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL | METH_KEYWORDS, doc \
	}

/* returns from the caller: None once @call (an int expression, run without
 * the GIL) gave 0, else ferry.Error naming @what */
#define RETURN_CALL(what, call)                     \
	do {                                        \
		int rc_;                            \
		Py_BEGIN_ALLOW_THREADS;             \
		rc_ = (call);                       \
		Py_END_ALLOW_THREADS;               \
		if (rc_)                            \
			return raise_rc(rc_, what); \
		Py_RETURN_NONE;                     \
	} while (0)

/* a dict entry per counter; returns NULL from the caller on failure */
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

/* module.c */
PyObject *raise_rc(int rc, const char *what);
PyObject *self_enter(PyObject *n, PyObject *unused);
void pyw_put(struct pyw *p);
int node_check(NodeObject *n);
struct pyw *node_worker(NodeObject *n);

/* arrays.c */
struct uarg {
	const char *name;
	unsigned long long max, v; /* v: the default, then the value */
};
int uarg_conv(PyObject *o, void *p);
int name_pick(const char *s, const char *what, const char *const *names);
int args_objs(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
	      const char *const *names, int req, PyObject **objs);
void arr_release(struct arr *a);
char fmt_letter(const Py_buffer *v);
int arr_get(PyObject *obj, const char *name, int writable, int keys, struct arr *a);
int keys_get(PyObject *obj, struct arr *a, size_t *n_p);
PyObject *mod_tensor_path(PyObject *self, PyObject *arg);

/* table.c */
PyObject *node_table(NodeObject *n, PyObject *args, PyObject *kw);

/* coll.c */
PyObject *node_group(NodeObject *n, PyObject *args, PyObject *kw);

/* coll.c */
PyObject *node_allreduce(NodeObject *n, PyObject *args, PyObject *kw);
PyObject *node_reduce(NodeObject *n, PyObject *args, PyObject *kw);
PyObject *node_broadcast(NodeObject *n, PyObject *args, PyObject *kw);
PyObject *node_allreduce_async(NodeObject *n, PyObject *args, PyObject *kw);
PyObject *node_reduce_async(NodeObject *n, PyObject *args, PyObject *kw);
PyObject *node_broadcast_async(NodeObject *n, PyObject *args, PyObject *kw);

#endif /* FERRY_PY_PYFERRY_H */

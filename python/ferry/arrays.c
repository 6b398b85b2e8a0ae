// SPDX-License-Identifier: MIT
/* _ferry: arguments seen through the buffer protocol (module.c says why) */
#include <string.h>

#include "pyferry.h"

/* ---- arrays ----------------------------------------------------------- */

void arr_release(struct arr *a)
{
	if (a->held)
		PyBuffer_Release(&a->view);
	a->held = 0;
}

/* the format's letter without a native byte-order prefix, or 0 */
char fmt_letter(const Py_buffer *v)
{
	const char *f = v->format ? v->format : "B";

	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	if (!f[0] || f[1])
		return 0;
	return *f;
}

/* torch, once the program imported it: torch.Tensor and the dtypes we name */
static PyObject *tensor_type;
static const struct {
	const char *name, *fmt;
	Py_ssize_t size;
} tensor_dtypes[] = {
	{ "float32", "f", 4 }, { "int64", "q", 8 },   { "float64", "d", 8 },
	{ "int32", "i", 4 },   { "float16", "e", 2 }, { "int16", "h", 2 },
	{ "int8", "b", 1 },    { "uint8", "B", 1 },   { "bool", "?", 1 },
};
#define N_DTYPES (sizeof(tensor_dtypes) / sizeof(tensor_dtypes[0]))
static PyObject *tensor_dtype_objs[N_DTYPES];

/* @obj is a torch.Tensor; torch is never imported here, only looked up */
static int is_tensor(PyObject *obj)
{
	if (!tensor_type) {
		PyObject *nm = PyUnicode_InternFromString("torch");
		PyObject *m = nm ? PyImport_GetModule(nm) : NULL;

		Py_XDECREF(nm);
		if (!m) {
			PyErr_Clear();
			return 0;
		}
		for (size_t i = 0; i < N_DTYPES; i++)
			tensor_dtype_objs[i] = PyObject_GetAttrString(m, tensor_dtypes[i].name);
		tensor_type = PyObject_GetAttrString(m, "Tensor");
		Py_DECREF(m);
		PyErr_Clear();
		if (!tensor_type || !PyType_Check(tensor_type)) {
			Py_CLEAR(tensor_type);
			return 0;
		}
	}
	return PyObject_TypeCheck(obj, (PyTypeObject *)tensor_type);
}

/* a bool attribute of @obj: 1, 0, or -1 with an exception */
static int attr_true(PyObject *obj, const char *name)
{
	PyObject *v = PyObject_GetAttrString(obj, name);
	int r;

	if (!v)
		return -1;
	r = PyObject_IsTrue(v);
	Py_DECREF(v);
	return r;
}

/*
 * A CPU torch tensor seen in place, through its attributes (data_ptr, dtype,
 * shape), without the numpy view torch's .numpy() would build at several us
 * a call. The view holds a reference on the tensor until arr_release().
 */
static int tensor_get(PyObject *obj, const char *name, int writable, struct arr *a)
{
	PyObject *dt = NULL, *shape = NULL, *ptr = NULL;
	Py_ssize_t numel = 1, ndim;
	size_t k;
	int r;

	if ((r = attr_true(obj, "is_cpu")) <= 0) {
		if (!r)
			PyErr_Format(
				PyExc_TypeError,
				"ferry: %s is a torch tensor on a device; ferry reads and writes "
				"CPU memory (tensor.cpu() makes a copy there)",
				name);
		return -1;
	}
	if (writable && (r = attr_true(obj, "requires_grad"))) {
		if (r > 0)
			PyErr_Format(
				PyExc_RuntimeError,
				"ferry: %s requires grad: writing it would bypass autograd; pass "
				"tensor.data (the same memory)",
				name);
		return -1;
	}
	ptr = PyObject_CallMethod(obj, "is_contiguous", NULL);
	if (!ptr || (r = PyObject_IsTrue(ptr)) <= 0) {
		r = ptr ? r : -1;
		Py_XDECREF(ptr);
		if (!r)
			PyErr_Format(
				PyExc_ValueError,
				"ferry: %s must be C-contiguous (numpy.ascontiguousarray(x) or "
				"tensor.contiguous() makes a contiguous copy)",
				name);
		return -1;
	}
	Py_DECREF(ptr);
	dt = PyObject_GetAttrString(obj, "dtype");
	shape = dt ? PyObject_GetAttrString(obj, "shape") : NULL;
	if (!shape || !PyTuple_Check(shape))
		goto err;
	for (k = 0; k < N_DTYPES && tensor_dtype_objs[k] != dt; k++)
		;
	ndim = PyTuple_GET_SIZE(shape);
	for (Py_ssize_t i = 0; i < ndim; i++)
		numel *= PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
	a->shape0 = ndim ? PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 0)) : 1;
	ptr = PyObject_CallMethod(obj, "data_ptr", NULL);
	if (!ptr || PyErr_Occurred())
		goto err;
	memset(&a->view, 0, sizeof(a->view));
	a->view.buf = PyLong_AsVoidPtr(ptr);
	a->view.itemsize = k < N_DTYPES ? tensor_dtypes[k].size : 1;
	a->view.format = (char *)(k < N_DTYPES ? tensor_dtypes[k].fmt : "?torch");
	a->view.len = numel * a->view.itemsize;
	a->view.ndim = (int)ndim;
	a->view.obj = Py_NewRef(obj);
	a->held = 1;
	a->torch = 1;
	Py_DECREF(ptr);
	Py_DECREF(shape);
	Py_DECREF(dt);
	return PyErr_Occurred() ? (arr_release(a), -1) : 0;
err:
	Py_XDECREF(ptr);
	Py_XDECREF(shape);
	Py_XDECREF(dt);
	if (!PyErr_Occurred())
		PyErr_Format(PyExc_TypeError, "ferry: %s: a torch tensor without a usable shape",
			     name);
	return -1;
}

/*
 * Sees @obj through the buffer protocol, C-contiguous; a CPU torch tensor
 * in place (tensor_get); with @keys, a list or an int through
 * numpy.asarray(obj, uint64) (a copy: lists have no such memory).
 */
int arr_get(PyObject *obj, const char *name, int writable, int keys, struct arr *a)
{
	PyObject *conv = NULL;
	int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);

	a->held = 0;
	a->torch = 0;
	a->shape0 = 0;
	if (!PyObject_CheckBuffer(obj)) {
		if (is_tensor(obj)) {
			return tensor_get(obj, name, writable, a);
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
	a->shape0 = a->view.ndim >= 1 && a->view.shape ? a->view.shape[0] : 1;
	return 0;
}

/* keys: uint64 or int64, one dimension (or none) */
int keys_get(PyObject *obj, struct arr *a, size_t *n_p)
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

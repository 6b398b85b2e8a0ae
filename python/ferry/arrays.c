// SPDX-License-Identifier: MIT
/* _ferry: arguments seen through the buffer protocol (module.c says why) */
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

/*
 * Sees @obj through the buffer protocol, C-contiguous; a CPU torch tensor
 * through its .numpy() view (the same memory); with @keys, a list or an int
 * through numpy.asarray(obj, uint64) (a copy: lists have no such memory).
 */
int arr_get(PyObject *obj, const char *name, int writable, int keys, struct arr *a)
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

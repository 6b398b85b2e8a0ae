// SPDX-License-Identifier: MIT
/* _ferry: arguments seen through the buffer protocol (module.c says why) */
#include <stdio.h>
#include <string.h>

#include "pyferry.h"
#include "torchview.h"

/* ---- arguments --------------------------------------------------------- */

/*
 * The arguments of a METH_FASTCALL | METH_KEYWORDS method that takes objects
 * only (the operations, called in hot loops: PyArg_ParseTupleAndKeywords
 * costs about 0.1 us a call more). @names is NULL-terminated, the first @req
 * required; @objs receives borrowed references, NULL for an optional one not
 * passed. Returns 0, or -1 with a TypeError naming @fn.
 */
int args_objs(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
	      const char *const *names, int req, PyObject **objs)
{
	Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
	int n = 0;

	while (names[n])
		objs[n++] = NULL;
	if (nargs > n) {
		PyErr_Format(PyExc_TypeError, "ferry: %s() takes at most %d arguments (%zd given)",
			     fn, n, nargs);
		return -1;
	}
	for (Py_ssize_t i = 0; i < nargs; i++)
		objs[i] = args[i];
	for (Py_ssize_t j = 0; j < nkw; j++) {
		PyObject *k = PyTuple_GET_ITEM(kwnames, j);
		int i;

		for (i = 0; i < n && PyUnicode_CompareWithASCIIString(k, names[i]); i++)
			;
		if (i == n || objs[i]) {
			PyErr_Format(PyExc_TypeError, "ferry: %s() got %s keyword argument '%U'",
				     fn, i == n ? "an unexpected" : "a second", k);
			return -1;
		}
		objs[i] = args[nargs + j];
	}
	for (int i = 0; i < req; i++)
		if (!objs[i]) {
			PyErr_Format(PyExc_TypeError, "ferry: %s() missing argument '%s'", fn,
				     names[i]);
			return -1;
		}
	return 0;
}

/*
 * The index of @s in @names (NULL-terminated): the keyword arguments that
 * name an enum value ("range", "ssp", "ring"). Returns -1 with a ValueError
 * that lists them, for @what.
 */
int name_pick(const char *s, const char *what, const char *const *names)
{
	char list[160] = "";
	size_t len = 0;
	int i;

	for (i = 0; names[i]; i++)
		if (s && !strcmp(s, names[i]))
			return i;
	for (i = 0; names[i] && len < sizeof(list); i++)
		len += (size_t)snprintf(list + len, sizeof(list) - len, "%s'%s'",
					!i	     ? "" :
					names[i + 1] ? ", " :
						       " or ",
					names[i]);
	PyErr_Format(PyExc_ValueError, "ferry: %s must be %s, not '%s'", what, list,
		     s ? s : "(null)");
	return -1;
}

/*
 * An O& converter for unsigned parameters: @p is a struct uarg naming the
 * parameter and its largest value. PyArg's own "I" and "K" take -1 as
 * 2^32-1 or 2^64-1 without a word; this says which parameter and its range.
 */
int uarg_conv(PyObject *o, void *p)
{
	struct uarg *u = p;
	unsigned long long v;

	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "ferry: %s must be an int, not %.80s", u->name,
			     Py_TYPE(o)->tp_name);
		return 0;
	}
	v = PyLong_AsUnsignedLongLong(o);
	if ((v == (unsigned long long)-1 && PyErr_Occurred()) || v > u->max) {
		PyErr_Clear();
		PyErr_Format(PyExc_ValueError, "ferry: %s must be 0 .. %llu, not %R", u->name,
			     u->max, o);
		return 0;
	}
	u->v = v;
	return 1;
}

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

/* interned attribute names, and torch._C._to_dlpack */
static PyObject *s_is_cpu, *s_requires_grad, *s_is_contiguous, *s_dtype, *s_shape, *s_data_ptr;
static PyObject *to_dlpack;

/* the interned names and torch._C._to_dlpack (NULL when torch has none) */
static int tensor_names(void)
{
	PyObject *c;

	if (!(s_is_cpu = PyUnicode_InternFromString("is_cpu")) ||
	    !(s_requires_grad = PyUnicode_InternFromString("requires_grad")) ||
	    !(s_is_contiguous = PyUnicode_InternFromString("is_contiguous")) ||
	    !(s_dtype = PyUnicode_InternFromString("dtype")) ||
	    !(s_shape = PyUnicode_InternFromString("shape")) ||
	    !(s_data_ptr = PyUnicode_InternFromString("data_ptr")))
		return -1;
	c = PyImport_ImportModule("torch._C");
	to_dlpack = c ? PyObject_GetAttrString(c, "_to_dlpack") : NULL;
	Py_XDECREF(c);
	PyErr_Clear();
	return 0;
}

static void tview_load(void);

/*
 * Once the program imported torch: its Tensor type, dtypes, the names read
 * and the reader of tensors (tview_load). 1 when torch is there, 0 when
 * not (yet), -1 with an exception; torch is never imported here, only
 * looked up.
 */
static int torch_init(void)
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
		if (tensor_names())
			return -1;
		if (!tensor_type || !PyType_Check(tensor_type)) {
			Py_CLEAR(tensor_type);
			return 0;
		}
		tview_load();
	}
	return 1;
}

/* @obj is a torch.Tensor: 1, 0, or -1 with an exception */
static int is_tensor(PyObject *obj)
{
	int r = torch_init();

	return r <= 0 ? r : PyObject_TypeCheck(obj, (PyTypeObject *)tensor_type);
}

/*
 * How a torch tensor is read (Table._tensor_path; python/bench/overhead.py
 * measures each, docs/python.md has the figures):
 *  TP_ATEN    one call into the C++ module ferry._torchview, which reads the
 *             tensor's at::Tensor (torchview.h; about 10 ns a tensor): the
 *             default when that module was built and matches the torch
 *             imported (tview_load); a subclass of torch.Tensor other than
 *             Parameter goes by TP_ATTRS;
 *  TP_ATTRS   its attributes read one by one (is_cpu, requires_grad,
 *             is_contiguous(), dtype, shape, data_ptr()) by interned names
 *             and vectorcall (the default without _torchview: about 0.3 us a
 *             tensor);
 *  TP_DLPACK  one call of torch's C function _to_dlpack: a DLPack capsule
 *             holds the pointer, device, dtype, shape and strides, and a
 *             reference on the tensor until arr_release() (about 0.6 us: a
 *             heap allocation and a capsule per call);
 *  TP_STRINGS as TP_ATTRS with names made from C strings at every call (the
 *             first version, kept as the benchmark's baseline).
 * A per-tensor cache keyed by the tensor and its version counter was not
 * taken: resize_(), set_data and requires_grad_() change what it would cache
 * without a new version, and a stale pointer is a write to freed memory.
 */
enum tensor_path {
	TP_ATTRS,
	TP_DLPACK,
	TP_STRINGS,
	TP_ATEN,
};
static enum tensor_path tensor_path = TP_ATTRS;
static const char *const tensor_path_names[] = { "attrs", "dlpack", "strings", "aten" };

/* ferry._torchview's reader, NULL when it is not built or not usable */
static const struct ferry_tview_api *tview;

/*
 * Imports ferry._torchview when the torch imported is the one it was built
 * against: the same torch/__init__.py and version (FERRY_TORCH_FILE and
 * FERRY_TORCH_VERSION, set by python/CMakeLists.txt). Another torch (a
 * pip wheel, say) must not make the module load a second libtorch. The
 * module's own init checks that its libtorch_python made torch.Tensor.
 * Makes TP_ATEN the default; on any mismatch leaves TP_ATTRS, silently.
 */
static void tview_load(void)
{
#if defined(FERRY_TORCH_FILE) && defined(FERRY_TORCH_VERSION)
	PyObject *nm = PyUnicode_InternFromString("torch");
	PyObject *m = nm ? PyImport_GetModule(nm) : NULL;
	PyObject *file = m ? PyObject_GetAttrString(m, "__file__") : NULL;
	PyObject *ver = m ? PyObject_GetAttrString(m, "__version__") : NULL;
	int same = file && ver && PyUnicode_Check(file) && PyUnicode_Check(ver) &&
		   !PyUnicode_CompareWithASCIIString(file, FERRY_TORCH_FILE) &&
		   !PyUnicode_CompareWithASCIIString(ver, FERRY_TORCH_VERSION);
	const struct ferry_tview_api *api;

	Py_XDECREF(file);
	Py_XDECREF(ver);
	Py_XDECREF(m);
	Py_XDECREF(nm);
	PyErr_Clear();
	if (!same)
		return;
	/* PyCapsule_Import finds attributes only: the submodule first */
	m = PyImport_ImportModule("ferry._torchview");
	api = m ? PyCapsule_Import(FERRY_TVIEW_CAPSULE, 0) : NULL;
	Py_XDECREF(m);
	if (api && api->version == FERRY_TVIEW_VERSION) {
		tview = api;
		tensor_path = TP_ATEN;
	}
	PyErr_Clear();
#endif
}

/* the DLPack ABI (dmlc/dlpack, dlpack.h v0.x, which torch 1.13 exports) */
struct dl_tensor {
	void *data;
	int32_t device_type; /* 1: CPU */
	int32_t device_id;
	int32_t ndim;
	uint8_t code; /* 0 int, 1 uint, 2 float, 4 bfloat */
	uint8_t bits;
	uint16_t lanes;
	int64_t *shape;
	int64_t *strides; /* in elements; NULL: compact, C order */
	uint64_t byte_offset;
};

struct dl_managed_tensor {
	struct dl_tensor t;
	void *manager_ctx;
	void (*deleter)(struct dl_managed_tensor *self);
};

#define DL_CPU 1

/* ferry._ferry._tensor_path(name): sets the path, returns the one before (the
 * default: "aten" once torch was imported and _torchview fits it, else "attrs") */
PyObject *mod_tensor_path(PyObject *self, PyObject *arg)
{
	const char *s = PyUnicode_AsUTF8(arg);
	enum tensor_path old;

	if (!s || torch_init() < 0)
		return NULL;
	old = tensor_path;
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, tensor_path_names[i])) {
			if (i == TP_ATEN && !tview) {
				PyErr_SetString(PyExc_ValueError,
						"ferry: the 'aten' tensor path is not available "
						"(ferry._torchview not built, or another torch)");
				return NULL;
			}
			tensor_path = (enum tensor_path)i;
			return PyUnicode_FromString(tensor_path_names[old]);
		}
	PyErr_Format(PyExc_ValueError,
		     "ferry: the tensor path is 'aten', 'attrs', 'dlpack' or 'strings', not '%s'",
		     s);
	return NULL;
}

/* an attribute of @obj: by interned name, or (TP_STRINGS) by C string */
static PyObject *tattr(PyObject *obj, PyObject *name)
{
	if (tensor_path == TP_STRINGS)
		return PyObject_GetAttrString(obj, PyUnicode_AsUTF8(name));
	return PyObject_GetAttr(obj, name);
}

static PyObject *tcall(PyObject *obj, PyObject *name)
{
	if (tensor_path == TP_STRINGS)
		return PyObject_CallMethod(obj, PyUnicode_AsUTF8(name), NULL);
	return PyObject_CallMethodNoArgs(obj, name);
}

/* a bool attribute of @obj: 1, 0, or -1 with an exception */
static int attr_true(PyObject *obj, PyObject *name, int call)
{
	PyObject *v = call ? tcall(obj, name) : tattr(obj, name);
	int r;

	if (!v)
		return -1;
	r = v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v);
	Py_DECREF(v);
	return r;
}

static void err_device(const char *name)
{
	PyErr_Format(PyExc_TypeError,
		     "ferry: %s is a torch tensor on a device; ferry reads and writes "
		     "CPU memory (tensor.cpu() makes a copy there)",
		     name);
}

static void err_grad(const char *name)
{
	PyErr_Format(PyExc_RuntimeError,
		     "ferry: %s requires grad: writing it would bypass autograd; pass "
		     "tensor.data (the same memory)",
		     name);
}

static void err_contig(const char *name)
{
	PyErr_Format(PyExc_ValueError,
		     "ferry: %s must be C-contiguous (numpy.ascontiguousarray(x) or "
		     "tensor.contiguous() makes a contiguous copy)",
		     name);
}

static int tensor_get_attrs(PyObject *obj, const char *name, int writable, struct arr *a);

/* the buffer-protocol format of a DLPack type, or NULL */
static const char *dl_format(const struct dl_tensor *t)
{
	static const struct {
		uint8_t code, bits;
		const char *fmt;
	} map[] = {
		{ 2, 32, "f" }, { 2, 64, "d" }, { 2, 16, "e" }, { 0, 64, "q" }, { 0, 32, "i" },
		{ 0, 16, "h" }, { 0, 8, "b" },	{ 1, 8, "B" },	{ 6, 8, "?" },
	};

	if (t->lanes != 1)
		return NULL;
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (map[i].code == t->code && map[i].bits == t->bits)
			return map[i].fmt;
	return NULL;
}

/*
 * A CPU torch tensor through one DLPack export: the capsule keeps the
 * tensor's memory alive (view.obj) until arr_release(); its destructor,
 * torch's, calls the deleter, as the capsule is never renamed "used".
 */
static int tensor_get_dlpack(PyObject *obj, const char *name, int writable, struct arr *a)
{
	struct dl_managed_tensor *m;
	const struct dl_tensor *t;
	const char *fmt;
	Py_ssize_t numel = 1, expect = 1;
	PyObject *cap;
	int r;

	if (writable && (r = attr_true(obj, s_requires_grad, 0))) {
		if (r > 0)
			err_grad(name);
		return -1;
	}
	cap = PyObject_CallOneArg(to_dlpack, obj);
	if (!cap) {
		/* a tensor DLPack cannot describe (sparse, say): the attributes
		 * say what is wrong with it */
		PyErr_Clear();
		return tensor_get_attrs(obj, name, writable, a);
	}
	m = PyCapsule_GetPointer(cap, "dltensor");
	if (!m)
		goto err;
	t = &m->t;
	if (t->device_type != DL_CPU) {
		err_device(name);
		goto err;
	}
	for (int i = t->ndim - 1; i >= 0; i--) {
		/* C order; a dimension of 1 may have any stride (torch's rule) */
		if (t->strides && t->shape[i] != 1 && t->strides[i] != expect) {
			err_contig(name);
			goto err;
		}
		expect *= t->shape[i];
		numel *= t->shape[i];
	}
	fmt = dl_format(t);
	memset(&a->view, 0, sizeof(a->view));
	a->view.buf = (char *)t->data + t->byte_offset;
	a->view.itemsize = fmt ? t->bits / 8 : 1;
	a->view.format = (char *)(fmt ? fmt : "?torch");
	a->view.len = numel * a->view.itemsize;
	a->view.ndim = t->ndim;
	a->view.obj = cap; /* our reference */
	a->shape0 = t->ndim ? (Py_ssize_t)t->shape[0] : 1;
	a->held = 1;
	a->torch = 1;
	return 0;
err:
	Py_DECREF(cap);
	return -1;
}

/*
 * A CPU torch tensor seen in place, through its attributes (data_ptr, dtype,
 * shape), without the numpy view torch's .numpy() would build at several us
 * a call. The view holds a reference on the tensor until arr_release().
 */
static int tensor_get_attrs(PyObject *obj, const char *name, int writable, struct arr *a)
{
	PyObject *dt = NULL, *shape = NULL, *ptr = NULL;
	Py_ssize_t numel = 1, ndim;
	size_t k;
	int r;

	if ((r = attr_true(obj, s_is_cpu, 0)) <= 0) {
		if (!r)
			err_device(name);
		return -1;
	}
	if (writable && (r = attr_true(obj, s_requires_grad, 0))) {
		if (r > 0)
			err_grad(name);
		return -1;
	}
	if ((r = attr_true(obj, s_is_contiguous, 1)) <= 0) {
		if (!r)
			err_contig(name);
		return -1;
	}
	dt = tattr(obj, s_dtype);
	shape = dt ? tattr(obj, s_shape) : NULL;
	if (!shape || !PyTuple_Check(shape))
		goto err;
	for (k = 0; k < N_DTYPES && tensor_dtype_objs[k] != dt; k++)
		;
	ndim = PyTuple_GET_SIZE(shape);
	for (Py_ssize_t i = 0; i < ndim; i++)
		numel *= PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
	a->shape0 = ndim ? PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 0)) : 1;
	ptr = tcall(obj, s_data_ptr);
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
 * A CPU torch tensor seen in place through ferry._torchview (TP_ATEN); a
 * tensor it does not handle goes by its attributes. The view holds a
 * reference on the tensor until arr_release().
 */
static int tensor_get_aten(PyObject *obj, const char *name, int writable, struct arr *a)
{
	struct ferry_tview v;
	size_t k;

	if (tview->get(obj, &v))
		return tensor_get_attrs(obj, name, writable, a);
	if (!v.strided) {
		PyErr_Format(PyExc_TypeError,
			     "ferry: %s is a sparse torch tensor or one without memory of its own; "
			     "ferry reads dense memory (tensor.to_dense() makes a dense copy)",
			     name);
		return -1;
	}
	if (!v.cpu) {
		err_device(name);
		return -1;
	}
	if (writable && v.requires_grad) {
		err_grad(name);
		return -1;
	}
	if (!v.contiguous) {
		err_contig(name);
		return -1;
	}
	if (v.lazy) {
		PyErr_Format(PyExc_ValueError,
			     "ferry: %s is a negative or conjugate view, whose memory does not "
			     "hold its values (tensor.resolve_neg() or resolve_conj() makes a copy "
			     "that does)",
			     name);
		return -1;
	}
	for (k = 0; k < N_DTYPES && tensor_dtypes[k].fmt[0] != v.fmt; k++)
		;
	memset(&a->view, 0, sizeof(a->view));
	a->view.buf = v.data;
	a->view.itemsize = k < N_DTYPES ? tensor_dtypes[k].size : 1;
	a->view.format = (char *)(k < N_DTYPES ? tensor_dtypes[k].fmt : "?torch");
	a->view.len = (Py_ssize_t)v.numel * a->view.itemsize;
	a->view.ndim = v.ndim;
	a->view.obj = Py_NewRef(obj);
	a->shape0 = (Py_ssize_t)v.shape0;
	a->held = 1;
	a->torch = 1;
	return 0;
}

static int tensor_get(PyObject *obj, const char *name, int writable, struct arr *a)
{
	if (tensor_path == TP_ATEN)
		return tensor_get_aten(obj, name, writable, a);
	if (tensor_path == TP_DLPACK && to_dlpack)
		return tensor_get_dlpack(obj, name, writable, a);
	return tensor_get_attrs(obj, name, writable, a);
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
		int tr = is_tensor(obj);

		if (tr < 0) {
			return -1;
		} else if (tr) {
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

// SPDX-License-Identifier: MIT
/*
 * ferry._torchview: reads a torch tensor's data pointer, dtype, shape,
 * contiguity, device and requires_grad from its at::Tensor in one C++ call
 * (torchview.h), for arrays.c. Built only against Debian's libtorch-dev
 * headers of the torch that /usr/bin/python3 imports (python/CMakeLists.txt);
 * arrays.c imports it only when the running torch is that one (its
 * torch.__file__ and version), and this module's init checks that the
 * libtorch_python it linked is the instance that made torch.Tensor. Any
 * mismatch leaves the attribute path in use.
 *
 * No state: nothing about a tensor is kept between calls (a cached pointer
 * would outlive resize_() or t.data = ...).
 */
#include <torch/csrc/autograd/python_variable.h>

extern "C" {
#include "torchview.h"
}

namespace
{

char fmt_of(c10::ScalarType s, int *size)
{
	switch (s) {
	case c10::ScalarType::Float:
		*size = 4;
		return 'f';
	case c10::ScalarType::Long:
		*size = 8;
		return 'q';
	case c10::ScalarType::Double:
		*size = 8;
		return 'd';
	case c10::ScalarType::Int:
		*size = 4;
		return 'i';
	case c10::ScalarType::Half:
		*size = 2;
		return 'e';
	case c10::ScalarType::Short:
		*size = 2;
		return 'h';
	case c10::ScalarType::Char:
		*size = 1;
		return 'b';
	case c10::ScalarType::Byte:
		*size = 1;
		return 'B';
	case c10::ScalarType::Bool:
		*size = 1;
		return '?';
	default:
		*size = 0;
		return 0;
	}
}

int tview_get(PyObject *obj, struct ferry_tview *v) noexcept
{
	// torch.Tensor or Parameter only: a subclass may define
	// __torch_function__ or properties of its own, which the attributes honour
	if (!THPVariable_CheckExact(obj))
		return 1;
	try {
		const at::Tensor &t = THPVariable_Unpack(obj);

		v->strided = t.defined() && t.layout() == c10::kStrided && t.has_storage();
		if (!v->strided)
			return 0;
		v->cpu = t.is_cpu();
		v->requires_grad = t.requires_grad();
		v->lazy = t.is_neg() || t.is_conj();
		v->fmt = fmt_of(t.scalar_type(), &v->itemsize);
		v->ndim = (int)t.dim();
		v->shape0 = v->ndim ? t.sizes()[0] : 1;
		v->numel = t.numel();
		v->contiguous = t.is_contiguous();
		v->data = v->cpu ? t.data_ptr() : nullptr;
		return 0;
	} catch (...) {
		return 1;
	}
}

const struct ferry_tview_api api = { FERRY_TVIEW_VERSION, tview_get };

struct PyModuleDef mod = { PyModuleDef_HEAD_INIT,
			   "_torchview",
			   "ferry's reader of torch tensors (internal; torchview.h)",
			   -1,
			   nullptr,
			   nullptr,
			   nullptr,
			   nullptr,
			   nullptr };

} // namespace

PyMODINIT_FUNC PyInit__torchview(void)
{
	PyObject *torch = PyImport_ImportModule("torch"), *cls, *m, *cap;

	if (!torch)
		return nullptr;
	cls = PyObject_GetAttrString(torch, "Tensor");
	Py_DECREF(torch);
	if (!cls)
		return nullptr;
	Py_DECREF(cls); // torch holds it
	if (!THPVariableClass || THPVariableClass != cls) {
		PyErr_SetString(
			PyExc_ImportError,
			"ferry._torchview: the torch imported is not the one this module "
			"was built against (its libtorch_python did not make torch.Tensor)");
		return nullptr;
	}
	m = PyModule_Create(&mod);
	cap = m ? PyCapsule_New((void *)&api, FERRY_TVIEW_CAPSULE, nullptr) : nullptr;
	if (!cap || PyModule_AddObject(m, "_api", cap)) {
		Py_XDECREF(cap);
		Py_XDECREF(m);
		return nullptr;
	}
	return m;
}

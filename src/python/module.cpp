// posembed._C: the library's kernels over arrays, for the Python package.
//
// Functions take NumPy arrays or torch tensors (DLPack) and read and write their own memory:
// no copies. Every array is checked (python/arrays.h) before any kernel runs, so a bad
// argument raises posembed.errors' InvalidInputError (IdOutOfRangeError for an id outside its
// table) with posembed's message and leaves every output untouched. Kernels run with the GIL
// released. The Python layer (python/posembed) builds the user-facing API on top. The parts:
// kernels.cpp, positions.cpp, files.cpp, memory.cpp (storage lent to torch).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <exception>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/parallel.h"
#include "posembed/core/simd.h"
#include "python/bindings.h"
#include "python/memory.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace posembed::python {
namespace {

// A class of posembed.errors (a module that imports nothing of ours), alive as long as that
// module is imported: the pointer is borrowed.
PyObject* error_class(const char* name) {
  return nb::module_::import_("posembed.errors").attr(name).ptr();
}

}  // namespace
}  // namespace posembed::python

NB_MODULE(_C, m) {
  namespace py = posembed::python;
  m.doc() = "posembed's C++ kernels over NumPy arrays and torch tensors (no copies)";
  // posembed.errors' classes also derive from the built-in ones (IndexError; ValueError and
  // RuntimeError), so code written for nn.Embedding's errors catches ours.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const posembed::OutOfRange& e) {
      PyErr_SetString(py::error_class("IdOutOfRangeError"), e.what());
    } catch (const posembed::Error& e) {
      PyErr_SetString(py::error_class("InvalidInputError"), e.what());
    }
  });
  py::bind_kernels(m);
  py::bind_positions(m);
  py::bind_files(m);
  py::bind_memory(m);
  m.def("set_num_threads", &posembed::set_num_threads, "threads"_a);
  m.def("num_threads", &posembed::num_threads);
  m.def("simd_target", [] { return std::string(posembed::simd::target_name()); });
}

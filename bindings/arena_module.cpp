// Python bindings of the arena extension: one-line definitions; specgen/eval/arena.py owns the
// documentation and the CPU path.
#include <pybind11/pybind11.h>

#include "../csrc/arena/arena.h"

namespace py = pybind11;
using namespace specgen_arena;

PYBIND11_MODULE(_arena, m) {
  m.doc() = "Device memory shared between processes by file descriptor (see specgen.eval.arena)";
  py::register_local_exception<ArenaError>(m, "ArenaError", PyExc_RuntimeError);
  auto as_tuple = [](const Mapping& mapping) { return py::make_tuple(mapping.fd, mapping.ptr, mapping.size); };
  m.def("create", [as_tuple](int device, uint64_t nbytes) { return as_tuple(specgen_arena::create(device, nbytes)); },
        py::arg("device"), py::arg("nbytes"));
  m.def("open", [as_tuple](int device, int fd, uint64_t size) { return as_tuple(specgen_arena::open(device, fd, size)); },
        py::arg("device"), py::arg("fd"), py::arg("size"));
  m.def("close", &specgen_arena::close, py::arg("device"), py::arg("ptr"), py::arg("size"));
  m.def("cuda_compiled", &specgen_arena::cuda_compiled);
}

// Python bindings of the evaluation's digest extension: one-line definitions; specgen/eval/digest.py
// owns the documentation, argument checking and the fallback.
#include <pybind11/pybind11.h>

#include "../csrc/digest/digest.h"

namespace py = pybind11;
using namespace specgen_digest;

PYBIND11_MODULE(_digest, m) {
  m.doc() = "The evaluation's output digest (see specgen.eval.digest)";
  py::register_local_exception<DigestError>(m, "DigestError", PyExc_RuntimeError);
  py::enum_<DType>(m, "DType", py::module_local())
      .value("F32", DType::F32)
      .value("F64", DType::F64)
      .value("F16", DType::F16)
      .value("BF16", DType::BF16);
  m.def("host_digest", &host_digest, py::arg("data"), py::arg("n"), py::arg("dtype"), py::arg("seed"));
  m.def("device_digest", &device_digest, py::arg("device"), py::arg("data"), py::arg("n"), py::arg("dtype"), py::arg("seed"),
        py::arg("out"), py::arg("stream"));
  m.def("cuda_compiled", &cuda_compiled);
}

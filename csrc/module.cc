// redpp_onnx._core: the pybind11 view of the C++ core.
//
//   build_info()  what was compiled (contract version, onnxruntime C API version, SIMD dispatch)
//   contract()    the SplitConv contract constants compiled into the kernel, so that a test can
//                 check them against redpp_onnx/ops/schema.py
//   split_conv()  the kernel's compute core run directly on numpy arrays, on one thread
//                 (no onnxruntime session): for tests and micro-benchmarks of the core.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "split_conv.h"
#include "split_conv_contract.h"

namespace py = pybind11;
namespace k = redpp::contract;

namespace {

template <typename T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
redpp::TensorView<T> View(const Array<T>& a) {
  redpp::TensorView<T> v;
  v.data = a.data();
  v.shape.assign(a.shape(), a.shape() + a.ndim());
  v.given = true;
  return v;
}

py::array_t<float> SplitConv(const Array<float>& x, const Array<float>& kernels, const Array<int64_t>& offsets,
                             const Array<int32_t>& idx, std::optional<Array<float>> bias,
                             std::optional<Array<float>> scale, std::optional<Array<float>> shift,
                             std::vector<int64_t> strides, std::vector<int64_t> pads, std::vector<int64_t> dilations,
                             const std::string& activation, float clip_min, float clip_max) {
  redpp::SplitConvAttrs attrs;
  attrs.strides = std::move(strides);
  attrs.pads = std::move(pads);
  attrs.dilations = std::move(dilations);
  attrs.activation = -1;
  for (int code = 0; code < k::kNumActivations; ++code)
    if (activation == k::kActivationName[code]) attrs.activation = code;
  if (attrs.activation < 0) throw py::value_error("SplitConv: unknown activation '" + activation + "'");
  attrs.clip_min = clip_min;
  attrs.clip_max = clip_max;

  redpp::SplitConvInputs in;
  in.x = View(x);
  in.kernels = View(kernels);
  in.offsets = View(offsets);
  in.idx.data = idx.data();
  in.idx.elem_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;  // numpy input converted to int32 by pybind11
  in.idx.shape.assign(idx.shape(), idx.shape() + idx.ndim());
  in.idx.given = true;
  if (bias) in.bias = View(*bias);
  if (scale) in.scale = View(*scale);
  if (shift) in.shift = View(*shift);

  redpp::WeightPlan weights;
  if (std::string err = redpp::PlanWeights(in.kernels, in.offsets, in.idx, &weights); !err.empty())
    throw py::value_error(err);
  redpp::ConvPlan plan;
  if (std::string err = redpp::PlanConv(in, attrs, weights, &plan); !err.empty()) throw py::value_error(err);
  py::array_t<float> y(plan.out_shape);
  float* yp = y.mutable_data();
  bool ok = true;
  {
    py::gil_scoped_release release;
    for (size_t t = 0; t < plan.num_tasks() && ok; ++t) ok = redpp::RunSplitConvTask(in, attrs, weights, plan, yp, t);
  }
  if (!ok) throw std::bad_alloc();
  return y;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "redpp-onnx C++ core (SplitConv compute, build information)";
  m.def("build_info", [] {
    py::dict d;
    d["contract_version"] = k::kVersion;
    d["ort_api_version"] = ORT_API_VERSION;
    d["simd_target"] = redpp::SimdTarget();
#ifdef __VERSION__
    d["compiler"] = __VERSION__;
#endif
    return d;
  });
  m.def("contract", [] {
    py::dict d;
    d["domain"] = k::kDomain;
    d["op_type"] = k::kOpType;
    d["version"] = k::kVersion;
    py::list inputs;
    for (size_t i = 0; i < k::kNumInputs; ++i) {
      py::list types;
      for (int t : k::kInputElemTypes[i])
        if (t != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED) types.append(t);
      inputs.append(py::make_tuple(k::kInputName[i], types, k::kInputOptional[i]));
    }
    d["inputs"] = inputs;
    py::list acts;
    for (int a = 0; a < k::kNumActivations; ++a) acts.append(k::kActivationName[a]);
    d["activations"] = acts;
    py::list attrs;
    for (size_t a = 0; a < k::kNumAttrs; ++a) attrs.append(py::make_tuple(k::kAttrName[a], k::kAttrKind[a]));
    d["attributes"] = attrs;
    py::list refused;
    for (size_t a = 0; a < k::kNumRefusedAttrs; ++a) refused.append(k::kRefusedAttrName[a]);
    d["refused_attributes"] = refused;
    return d;
  });
  const float inf = std::numeric_limits<float>::infinity();
  m.def("split_conv", &SplitConv, py::arg("x"), py::arg("kernels"), py::arg("offsets"), py::arg("idx"),
        py::arg("bias") = py::none(), py::arg("scale") = py::none(), py::arg("shift") = py::none(),
        py::arg("strides") = std::vector<int64_t>{}, py::arg("pads") = std::vector<int64_t>{},
        py::arg("dilations") = std::vector<int64_t>{}, py::arg("activation") = "", py::arg("clip_min") = -inf,
        py::arg("clip_max") = inf,
        "Run SplitConv's C++ compute core on numpy arrays (one thread, no onnxruntime). Raises "
        "ValueError on input that breaks the contract.");
}

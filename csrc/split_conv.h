// SplitConv compute core: validation, planning and the per-tile computation.
//
// The contract (inputs, attributes, semantics) is defined in redpp_onnx/ops/schema.py; the
// generated split_conv_contract.h carries its constants. This file knows nothing about
// onnxruntime's API or Python: redpp_ops.cc (the onnxruntime kernel) and module.cc (the
// pybind11 module) are thin adapters over it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace redpp {

// A read-only view of one input tensor (row-major, contiguous). An empty tensor may have
// data == nullptr, so presence (an optional input was given) is its own flag.
template <typename T>
struct TensorView {
  const T* data = nullptr;
  std::vector<int64_t> shape;
  bool given = false;
  bool present() const { return given; }
};

struct SplitConvAttrs {
  std::vector<int64_t> strides;    // empty: 1 per spatial axis
  std::vector<int64_t> pads;       // empty: 0; else begins then ends (ONNX order)
  std::vector<int64_t> dilations;  // empty: 1 per spatial axis
  int activation = 0;              // contract::kActivation_*
  float clip_min = -std::numeric_limits<float>::infinity();
  float clip_max = std::numeric_limits<float>::infinity();
};

struct SplitConvInputs {
  TensorView<float> x, kernels;
  TensorView<int64_t> offsets;
  TensorView<int32_t> idx;
  TensorView<float> bias, scale, shift;
};

// Everything Compute needs, resolved and validated once per call.
struct SplitConvPlan {
  int64_t n = 0, c_in = 0, c_out = 0;
  int64_t h = 1, w = 1, kh = 1, kw = 1, ho = 1, wo = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  std::vector<int64_t> out_shape;
  // Per input channel c, the (output, local kernel) pairs with idx[c, o] >= 0, as CSR:
  // pairs pair_begin[c] .. pair_begin[c+1]-1 of pair_out / pair_kernel.
  std::vector<int64_t> pair_begin;
  std::vector<int32_t> pair_out, pair_kernel;
  int64_t max_kernels_per_channel = 0;
  int64_t tile = 0;             // output pixels per task
  int64_t tiles_per_image = 0;  // ceil(ho*wo / tile)
  bool direct_input = false;    // 1x1, stride 1, no pad: the input row is the im2col row
  size_t num_tasks() const { return static_cast<size_t>(n * tiles_per_image); }
};

// Attribute checks that do not need the inputs (done once, at kernel creation).
// Returns an error message, empty when valid.
std::string ValidateAttrs(const SplitConvAttrs& attrs);

// Validates the inputs against the contract and fills *plan. Returns an error message
// (empty when valid). Never reads out of bounds, whatever the inputs.
std::string PlanSplitConv(const SplitConvInputs& in, const SplitConvAttrs& attrs, SplitConvPlan* plan);

// Computes output tile `task` (0 <= task < plan.num_tasks()) into y. Tasks write disjoint
// parts of y and their results do not depend on how tasks are spread over threads.
// Returns false only when scratch memory could not be allocated.
bool RunSplitConvTask(const SplitConvInputs& in, const SplitConvAttrs& attrs, const SplitConvPlan& plan,
                      float* y, size_t task) noexcept;

// The instruction set the hot loops dispatched to on this CPU ("x86-64-v3" or "baseline").
const char* SimdTarget();

}  // namespace redpp

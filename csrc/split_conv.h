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

// The index map, whose element type is one of the contract's (int8, int16, int32): read only
// while the weight plan is built.
struct IndexView {
  const void* data = nullptr;
  int elem_type = 0;  // ONNXTensorElementDataType
  std::vector<int64_t> shape;
  bool given = false;
  bool present() const { return given; }
};

struct SplitConvInputs {
  TensorView<float> x, kernels;
  TensorView<int64_t> offsets;
  IndexView idx;
  TensorView<float> bias, scale, shift;
};

// Output pixels per task. The micro-kernels work on rows of exactly this many floats.
constexpr int64_t kTile = 64;

// What depends on the weights only (kernels, offsets, idx): validated once and, when they
// are constant initializers, built once when onnxruntime creates the kernel.
//
// Input channels that feed at least one output are cut into groups whose products
// (sum of k_c rows of kTile floats) fit a cache budget. For group g and output o, the
// product rows to add are rows[row_begin[g * c_out + o] .. row_begin[g * c_out + o + 1]),
// numbered within the group's product buffer (row = offsets[c] - group_base[g] + idx[c, o]).
//
// 1x1 kernels (one tap) take a fused path instead: a product would cost as much as the
// multiply-add it saves, so each output accumulates weight * input row directly; groups are
// then capped by channel count (their input rows stay in L1), slots[r] gives the position,
// within its group, of the channel of pair r and weights[r] its weight.
struct WeightPlan {
  int64_t c_in = 0, c_out = 0, num_kernels = 0, taps = 1;
  std::vector<int64_t> kernel_shape;
  std::vector<int32_t> channels;      // active channels, group by group
  std::vector<int64_t> group_begin;   // group g: channels[group_begin[g] .. group_begin[g + 1])
  std::vector<int64_t> group_base;    // first kernel of group g
  std::vector<int64_t> row_begin;     // size groups * c_out + 1
  std::vector<int32_t> rows;          // nnz(idx) entries
  std::vector<int32_t> slots;         // fused path only: nnz(idx) entries
  std::vector<float> weights;         // fused path only: nnz(idx) entries
  int64_t max_group_rows = 0;
  int64_t max_group_channels = 0;
  bool fused = false;                 // one tap: fused multiply-add path
  size_t num_groups() const { return group_base.size(); }
};

// What depends on X and the attributes: the convolution geometry and the tiling.
struct ConvPlan {
  int64_t n = 0, h = 1, w = 1, kh = 1, kw = 1, ho = 1, wo = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  bool direct_input = false;  // 1x1, stride 1, no padding: input rows are the im2col rows
  // per kernel column kj: output columns [ow_first, ow_last] read inside the input (im2col)
  std::vector<int64_t> ow_first, ow_last;
  std::vector<int64_t> out_shape;
  int64_t tiles_per_image = 0;
  size_t num_tasks() const { return static_cast<size_t>(n * tiles_per_image); }
};

// Attribute checks that do not need the inputs (done once, at kernel creation).
// Every function below returns an error message, empty when the input is valid.
std::string ValidateAttrs(const SplitConvAttrs& attrs);

// Validates kernels / offsets / idx against each other and builds the weight plan (which, on
// the fused path, copies the weights: rebuild it when the kernels' values change).
std::string PlanWeights(const TensorView<float>& kernels, const TensorView<int64_t>& offsets,
                        const IndexView& idx, WeightPlan* plan);

// Validates X, B, scale, shift against the weight plan and the attributes.
std::string PlanConv(const SplitConvInputs& in, const SplitConvAttrs& attrs, const WeightPlan& weights,
                     ConvPlan* plan);

// Computes output tile `task` (0 <= task < plan.num_tasks()) into y. Tasks write disjoint
// parts of y and their results do not depend on how tasks are spread over threads.
// Returns false only when scratch memory could not be allocated.
bool RunSplitConvTask(const SplitConvInputs& in, const SplitConvAttrs& attrs, const WeightPlan& weights,
                      const ConvPlan& plan, float* y, size_t task) noexcept;

// The micro-kernel set chosen for this CPU when the library loaded:
// "x86-64-v4" (AVX-512), "x86-64-v3" (AVX2 + FMA) or "baseline".
const char* SimdTarget();

}  // namespace redpp

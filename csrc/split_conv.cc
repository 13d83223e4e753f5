// SplitConv compute core. See split_conv.h and redpp_onnx/ops/schema.py.
//
// Work decomposition: one task = one tile of kTile consecutive output pixels of one image,
// for every output channel. The active input channels are taken group by group; for each
// channel c of a group the task
//   1. gathers the receptive fields of its pixels (im2col: taps rows of kTile floats),
//   2. computes the k_c products P[u] = U_c[u] . col once per unique kernel,
// then adds, for every output o, the product rows that o uses (its idx entries in the
// group) to the tile's accumulator. Bias initialises the accumulator; the per-output
// affine and the activation are applied when the tile is written out.
// The tiling depends on the shapes only, never on the number of threads, so results are
// bit-identical for any intra-op thread count.
#include "split_conv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "split_conv_contract.h"

namespace redpp {
namespace {

using contract::kActivation_Clip;
using contract::kActivation_Relu;

struct MicroKernels {
  void (*products)(const float* U, int64_t k, int64_t taps, const float* col, float* P);
  void (*scatter)(const int64_t* row_begin, const int32_t* rows, int64_t c_out, const float* P, float* ytile);
  void (*scatter_fma)(const int64_t* row_begin, const float* weights, const int32_t* slots, int64_t c_out,
                      const float* x, float* ytile);
  const char* name;
};

// One micro-kernel set per instruction set, chosen at load time (no -march=native: the
// library runs on any x86-64 and uses AVX-512 or AVX2 where the CPU has them).
#if defined(__x86_64__) && defined(__GNUC__)
#define REDPP_X86_DISPATCH 1
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
namespace isa_v4 {
constexpr int64_t kV = 16;
constexpr int kBlockKernels = 8;  // 8 x 2 accumulators of the 32 zmm registers
constexpr const char* kName = "x86-64-v4";
#include "split_conv_kernels.inc"
}  // namespace isa_v4
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
namespace isa_v3 {
constexpr int64_t kV = 8;
constexpr int kBlockKernels = 6;  // 6 x 2 accumulators of the 16 ymm registers
constexpr const char* kName = "x86-64-v3";
#include "split_conv_kernels.inc"
}  // namespace isa_v3
#pragma GCC pop_options
#endif
namespace isa_base {
constexpr int64_t kV = 4;
constexpr int kBlockKernels = 6;
constexpr const char* kName = "baseline";
#include "split_conv_kernels.inc"
}  // namespace isa_base

const MicroKernels& SelectKernels() {
#ifdef REDPP_X86_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return isa_v4::kKernels;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
    return isa_v3::kKernels;
#endif
  return isa_base::kKernels;
}

const MicroKernels& Kernels() {
  static const MicroKernels& k = SelectKernels();
  return k;
}

// Product rows a channel group may hold: 4096 rows of kTile floats = 1 MiB (per-core L2).
constexpr int64_t kGroupRowBudget = 4096;
// Fused (1x1) path: input rows a group may hold: 128 rows of kTile floats = 32 KiB (L1).
constexpr int64_t kFusedGroupChannels = 128;

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// floor(a / b) and ceil(a / b) for b > 0 and any a (no intermediate that can overflow).
inline int64_t FloorDiv(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); }
inline int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 && a > 0 ? 1 : 0); }

// Checked int64 arithmetic: false when the exact result does not fit.
inline bool Add(int64_t a, int64_t b, int64_t* r) { return !__builtin_add_overflow(a, b, r); }
inline bool Mul(int64_t a, int64_t b, int64_t* r) { return !__builtin_mul_overflow(a, b, r); }

// Receptive fields of output pixels [p0, p0 + len) of one input channel plane xc[h, w]:
// col[(ki * kw + kj) * kTile + t] = xc[ih, iw], or 0 outside the padded input and for t >= len.
void Im2Col(const float* xc, const ConvPlan& pl, int64_t p0, int64_t len, float* col) {
  const int64_t taps = pl.kh * pl.kw;
  if (len < kTile)
    for (int64_t j = 0; j < taps; ++j) std::fill(col + j * kTile + len, col + (j + 1) * kTile, 0.f);
  for (int64_t t0 = 0; t0 < len;) {
    const int64_t p = p0 + t0;
    const int64_t oh = p / pl.wo, ow0 = p % pl.wo;
    const int64_t seg = std::min(pl.wo - ow0, len - t0);  // pixels left on this output row
    for (int64_t ki = 0; ki < pl.kh; ++ki) {
      const int64_t ih = oh * pl.stride_h - pl.pad_h + ki * pl.dil_h;
      const bool row_in = ih >= 0 && ih < pl.h;
      const float* xrow = xc + (row_in ? ih : 0) * pl.w;
      for (int64_t kj = 0; kj < pl.kw; ++kj) {
        float* dst = col + (ki * pl.kw + kj) * kTile + t0;
        if (!row_in) {
          std::fill(dst, dst + seg, 0.f);
          continue;
        }
        // iw = ow * stride_w + base is inside [0, w) for ow in [lo, hi].
        const int64_t base = kj * pl.dil_w - pl.pad_w;
        const int64_t lo = std::max(ow0, pl.ow_first[kj]);
        const int64_t hi = std::min(ow0 + seg - 1, pl.ow_last[kj]);
        int64_t t = 0;
        for (int64_t ow = ow0; ow < std::min(lo, ow0 + seg); ++ow) dst[t++] = 0.f;
        if (pl.stride_w == 1) {
          for (int64_t ow = lo; ow <= hi; ++ow) dst[t++] = xrow[ow + base];
        } else {
          for (int64_t ow = lo; ow <= hi; ++ow) dst[t++] = xrow[ow * pl.stride_w + base];
        }
        while (t < seg) dst[t++] = 0.f;
      }
    }
    t0 += seg;
  }
}

// Per-thread scratch, 64-byte aligned, reused across calls.
struct Scratch {
  std::vector<float> storage;
  float* get(size_t floats) {
    if (storage.size() < floats + 16) storage.resize(floats + 16);
    const auto addr = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + ((64 - addr % 64) % 64) / sizeof(float);
  }
};

}  // namespace

const char* SimdTarget() { return Kernels().name; }

std::string ValidateAttrs(const SplitConvAttrs& a) {
  for (int64_t s : a.strides)
    if (s < 1) return "SplitConv: strides must be >= 1, got " + ShapeStr(a.strides);
  for (int64_t d : a.dilations)
    if (d < 1) return "SplitConv: dilations must be >= 1, got " + ShapeStr(a.dilations);
  for (int64_t p : a.pads)
    if (p < 0) return "SplitConv: pads must be >= 0, got " + ShapeStr(a.pads);
  if (a.pads.size() % 2 == 0) {
    const size_t nd = a.pads.size() / 2;
    for (size_t ax = 0; ax < nd; ++ax) {
      int64_t sum;
      if (!Add(a.pads[ax], a.pads[ax + nd], &sum))
        return "SplitConv: pads " + ShapeStr(a.pads) + ": begin + end of spatial axis " + std::to_string(ax) +
               " overflows int64";
    }
  }
  if (a.activation < 0 || a.activation >= contract::kNumActivations)
    return "SplitConv: unknown activation code " + std::to_string(a.activation);
  if (a.activation == kActivation_Clip && !(a.clip_min <= a.clip_max))
    return "SplitConv: clip_min must be <= clip_max";
  return {};
}

std::string PlanWeights(const TensorView<float>& kernels, const TensorView<int64_t>& offsets,
                        const IndexView& idx, WeightPlan* plan) {
  WeightPlan& wp = *plan;
  if (!kernels.present() || !offsets.present() || !idx.present())
    return "SplitConv: inputs kernels, offsets and idx are required";
  const auto& ks = kernels.shape;
  if (ks.size() != 2 && ks.size() != 3)
    return "SplitConv: kernels must have rank 2 [K, kl] or 3 [K, kh, kw], got shape " + ShapeStr(ks);
  if (ks[0] < 0) return "SplitConv: bad kernels shape " + ShapeStr(ks);
  for (size_t i = 1; i < ks.size(); ++i)
    if (ks[i] < 1) return "SplitConv: kernel spatial size must be >= 1, got kernels shape " + ShapeStr(ks);
  if (idx.shape.size() != 2 || idx.shape[0] < 0 || idx.shape[1] < 0)
    return "SplitConv: idx must have shape [C_in, C_out], got " + ShapeStr(idx.shape);
  int32_t (*read)(const void*, int64_t) = nullptr;
  switch (idx.elem_type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
      read = [](const void* p, int64_t i) -> int32_t { return static_cast<const int8_t*>(p)[i]; };
      break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
      read = [](const void* p, int64_t i) -> int32_t { return static_cast<const int16_t*>(p)[i]; };
      break;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
      read = [](const void* p, int64_t i) -> int32_t { return static_cast<const int32_t*>(p)[i]; };
      break;
    default:
      return "SplitConv: idx must be int8, int16 or int32, got element type " + std::to_string(idx.elem_type);
  }
  wp.c_in = idx.shape[0];
  wp.c_out = idx.shape[1];
  wp.num_kernels = ks[0];
  wp.kernel_shape.assign(ks.begin() + 1, ks.end());
  wp.taps = 1;
  for (int64_t d : wp.kernel_shape)
    if (!Mul(wp.taps, d, &wp.taps))
      return "SplitConv: kernels shape " + ShapeStr(ks) + ": the kernel size overflows int64";
  if (wp.c_in == std::numeric_limits<int64_t>::max()) return "SplitConv: bad idx shape " + ShapeStr(idx.shape);
  if (offsets.shape.size() != 1 || offsets.shape[0] != wp.c_in + 1)
    return "SplitConv: offsets must have shape [C_in + 1] = [" + std::to_string(wp.c_in + 1) + "], got " +
           ShapeStr(offsets.shape);
  const int64_t* off = offsets.data;
  if (off[0] != 0) return "SplitConv: offsets[0] must be 0, got " + std::to_string(off[0]);
  for (int64_t c = 0; c < wp.c_in; ++c)
    if (off[c + 1] < off[c])
      return "SplitConv: offsets must be non-decreasing, offsets[" + std::to_string(c + 1) + "] = " +
             std::to_string(off[c + 1]) + " < offsets[" + std::to_string(c) + "] = " + std::to_string(off[c]);
  if (off[wp.c_in] != wp.num_kernels)
    return "SplitConv: offsets[C_in] = " + std::to_string(off[wp.c_in]) + " must equal the number of kernels " +
           std::to_string(wp.num_kernels);

  // Range of every idx entry, and which channels are used at all.
  std::vector<int32_t> active;
  for (int64_t c = 0; c < wp.c_in; ++c) {
    const int64_t kc = off[c + 1] - off[c];
    bool used = false;
    for (int64_t o = 0; o < wp.c_out; ++o) {
      const int32_t u = read(idx.data, c * wp.c_out + o);
      if (u < -1 || u >= kc)
        return "SplitConv: idx[" + std::to_string(c) + ", " + std::to_string(o) + "] = " + std::to_string(u) +
               " is out of range: input channel " + std::to_string(c) + " has " + std::to_string(kc) +
               " kernels (valid: -1 .. " + std::to_string(kc - 1) + ")";
      used |= u >= 0;
    }
    if (used) active.push_back(static_cast<int32_t>(c));
  }

  // Groups of consecutive active channels within the budget (a channel alone may exceed it).
  wp.fused = wp.taps == 1;
  wp.channels.clear();
  wp.group_begin.assign(1, 0);
  wp.group_base.clear();
  wp.max_group_rows = 0;
  wp.max_group_channels = 0;
  for (size_t i = 0; i < active.size();) {
    const int64_t base = off[active[i]];
    size_t j = i + 1;
    while (j < active.size() && (wp.fused ? static_cast<int64_t>(j - i) < kFusedGroupChannels
                                          : off[active[j] + 1] - base <= kGroupRowBudget))
      ++j;
    wp.max_group_channels = std::max(wp.max_group_channels, static_cast<int64_t>(j - i));
    wp.channels.insert(wp.channels.end(), active.begin() + i, active.begin() + j);
    wp.group_begin.push_back(static_cast<int64_t>(wp.channels.size()));
    wp.group_base.push_back(base);
    wp.max_group_rows = std::max(wp.max_group_rows, off[active[j - 1] + 1] - base);
    i = j;
  }
  const size_t groups = wp.group_base.size();
  wp.row_begin.assign(groups * wp.c_out + 1, 0);
  wp.rows.clear();
  wp.slots.clear();
  wp.weights.clear();
  for (size_t g = 0; g < groups; ++g)
    for (int64_t o = 0; o < wp.c_out; ++o) {
      for (int64_t i = wp.group_begin[g]; i < wp.group_begin[g + 1]; ++i) {
        const int64_t c = wp.channels[i];
        const int32_t u = read(idx.data, c * wp.c_out + o);
        if (u < 0) continue;
        wp.rows.push_back(static_cast<int32_t>(off[c] - wp.group_base[g] + u));
        if (wp.fused) {
          wp.slots.push_back(static_cast<int32_t>(i - wp.group_begin[g]));
          wp.weights.push_back(kernels.data[off[c] + u]);
        }
      }
      wp.row_begin[g * wp.c_out + o + 1] = static_cast<int64_t>(wp.rows.size());
    }
  return {};
}

std::string PlanConv(const SplitConvInputs& in, const SplitConvAttrs& a, const WeightPlan& wp, ConvPlan* plan) {
  ConvPlan& pl = *plan;
  if (std::string e = ValidateAttrs(a); !e.empty()) return e;
  if (!in.x.present()) return "SplitConv: input X is required";
  const auto& xs = in.x.shape;
  if (xs.size() != 3 && xs.size() != 4)
    return "SplitConv: X must have rank 3 [N, C, L] or 4 [N, C, H, W], got shape " + ShapeStr(xs);
  const size_t nd = xs.size() - 2;
  for (int64_t d : xs)
    if (d < 0) return "SplitConv: X has a negative dimension " + ShapeStr(xs);
  if (wp.kernel_shape.size() != nd)
    return "SplitConv: kernels must have rank " + std::to_string(nd + 1) + " for a rank-" +
           std::to_string(xs.size()) + " X, got kernel shape " + ShapeStr(wp.kernel_shape);
  if (xs[1] != wp.c_in)
    return "SplitConv: X has " + std::to_string(xs[1]) + " channels but idx is [C_in, C_out] = " +
           ShapeStr({wp.c_in, wp.c_out});
  if ((!a.strides.empty() && a.strides.size() != nd) || (!a.dilations.empty() && a.dilations.size() != nd) ||
      (!a.pads.empty() && a.pads.size() != 2 * nd))
    return "SplitConv: for " + std::to_string(nd) + " spatial axes strides and dilations need " +
           std::to_string(nd) + " values and pads " + std::to_string(2 * nd) + "; got strides " +
           ShapeStr(a.strides) + ", pads " + ShapeStr(a.pads) + ", dilations " + ShapeStr(a.dilations);
  const std::pair<const TensorView<float>*, const char*> per_out[] = {
      {&in.bias, "B"}, {&in.scale, "scale"}, {&in.shift, "shift"}};
  for (const auto& [t, name] : per_out)
    if (t->present() && (t->shape.size() != 1 || t->shape[0] != wp.c_out))
      return std::string("SplitConv: ") + name + " must have shape [C_out] = [" + std::to_string(wp.c_out) +
             "], got " + ShapeStr(t->shape);

  // Geometry; 1-D is 2-D with a unit height. Every step is checked against int64 overflow:
  // the attributes are only bounded below, so their sums and products with the shapes can wrap.
  auto at = [](const std::vector<int64_t>& v, size_t i, int64_t dflt) { return v.empty() ? dflt : v[i]; };
  auto geometry = [&] {
    return " (X " + ShapeStr(xs) + ", kernel " + ShapeStr(wp.kernel_shape) + ", strides " + ShapeStr(a.strides) +
           ", pads " + ShapeStr(a.pads) + ", dilations " + ShapeStr(a.dilations) + ")";
  };
  // Output size of spatial axis ax: (in + pad_begin + pad_end - (dil * (k - 1) + 1)) / stride + 1.
  auto axis_size = [&](size_t ax, int64_t* out) -> std::string {
    const int64_t in_size = xs[2 + ax], k = wp.kernel_shape[ax];
    const int64_t stride = at(a.strides, ax, 1), dil = at(a.dilations, ax, 1);
    int64_t padded, reach, span;
    if (!Add(in_size, at(a.pads, ax, 0), &padded) || !Add(padded, at(a.pads, ax + nd, 0), &padded))
      return "SplitConv: pads overflow int64 with the input size " + std::to_string(in_size) + " of spatial axis " +
             std::to_string(ax) + geometry();
    if (!Mul(dil, k - 1, &reach) || !Add(reach, 1, &reach))
      return "SplitConv: dilations times the kernel size overflows int64 on spatial axis " + std::to_string(ax) +
             geometry();
    span = padded - reach;  // both >= 0: no overflow
    if (span < 0)
      return "SplitConv: the dilated kernel " + ShapeStr(wp.kernel_shape) + " is larger than the padded input " +
             ShapeStr(std::vector<int64_t>(xs.begin() + 2, xs.end())) + geometry();
    *out = span / stride + 1;  // span <= INT64_MAX - 1
    return {};
  };
  const size_t ax = nd - 1;  // the width axis
  pl.n = xs[0];
  pl.w = xs[2 + ax];
  pl.kw = wp.kernel_shape[ax];
  pl.stride_w = at(a.strides, ax, 1);
  pl.dil_w = at(a.dilations, ax, 1);
  pl.pad_w = at(a.pads, ax, 0);
  const int64_t pad_w_end = at(a.pads, ax + nd, 0);
  int64_t pad_h_end = 0;
  pl.h = pl.kh = pl.stride_h = pl.dil_h = pl.ho = 1;
  pl.pad_h = 0;
  if (nd == 2) {
    pl.h = xs[2];
    pl.kh = wp.kernel_shape[0];
    pl.stride_h = at(a.strides, 0, 1);
    pl.dil_h = at(a.dilations, 0, 1);
    pl.pad_h = at(a.pads, 0, 0);
    pad_h_end = at(a.pads, 2, 0);
    if (std::string e = axis_size(0, &pl.ho); !e.empty()) return e;
  }
  if (std::string e = axis_size(ax, &pl.wo); !e.empty()) return e;
  pl.out_shape = {pl.n, wp.c_out};
  if (nd == 2) pl.out_shape.push_back(pl.ho);
  pl.out_shape.push_back(pl.wo);
  // Pixels per image, pixels of the batch (tasks are counted from these) and the output's bytes.
  int64_t pixels, batch_pixels, elements, bytes;
  if (!Mul(pl.ho, pl.wo, &pixels) || !Mul(pl.n, pixels, &batch_pixels) || !Mul(batch_pixels, wp.c_out, &elements) ||
      !Mul(elements, static_cast<int64_t>(sizeof(float)), &bytes))
    return "SplitConv: the output shape " + ShapeStr(pl.out_shape) + " has more elements than int64 can count" +
           geometry();
  // Scratch rows per task (see RunSplitConvTask); only when there is work.
  if (elements > 0) {
    int64_t rows = wp.c_out;
    if (wp.num_groups() > 0) rows = std::max({rows, wp.fused ? wp.max_group_channels : wp.taps, wp.max_group_rows});
    int64_t scratch;
    if (!Mul(rows, kTile, &scratch) || !Mul(scratch, static_cast<int64_t>(sizeof(float)), &scratch))
      return "SplitConv: the scratch buffers of kernels shape [" + std::to_string(wp.num_kernels) + ", ...] " +
             ShapeStr(wp.kernel_shape) + " and " + std::to_string(wp.c_out) + " outputs overflow int64";
  }
  pl.tiles_per_image = CeilDiv(pixels, kTile);
  // For each kernel column kj, the output columns whose input column lies inside the image
  // (only read when a channel is gathered; without kernels, kw may be any size).
  const int64_t columns = wp.num_groups() > 0 ? pl.kw : 0;
  pl.ow_first.resize(columns);
  pl.ow_last.resize(columns);
  for (int64_t kj = 0; kj < columns; ++kj) {
    const int64_t base = kj * pl.dil_w - pl.pad_w;
    pl.ow_first[kj] = CeilDiv(-base, pl.stride_w);
    pl.ow_last[kj] = FloorDiv(pl.w - 1 - base, pl.stride_w);
  }
  pl.direct_input = pl.kh == 1 && pl.kw == 1 && pl.stride_h == 1 && pl.stride_w == 1 && pl.pad_h == 0 &&
                    pl.pad_w == 0 && pad_h_end == 0 && pad_w_end == 0;
  return {};
}

bool RunSplitConvTask(const SplitConvInputs& in, const SplitConvAttrs& a, const WeightPlan& wp,
                      const ConvPlan& pl, float* y, size_t task) noexcept {
  const MicroKernels& mk = Kernels();
  const int64_t img = static_cast<int64_t>(task) / pl.tiles_per_image;
  const int64_t p0 = (static_cast<int64_t>(task) % pl.tiles_per_image) * kTile;
  const int64_t pixels = pl.ho * pl.wo;
  const int64_t len = std::min(kTile, pixels - p0);
  const int64_t taps = wp.taps;

  thread_local Scratch col_scratch, prod_scratch, y_scratch;
  float *col = nullptr, *prod = nullptr, *ytile;
  try {  // sizes checked against overflow by PlanConv; no channel, no column scratch
    if (wp.num_groups() > 0) {
      col = col_scratch.get((wp.fused ? wp.max_group_channels : taps) * kTile);
      prod = wp.fused ? nullptr : prod_scratch.get(wp.max_group_rows * kTile);
    }
    ytile = y_scratch.get(wp.c_out * kTile);
  } catch (...) {  // bad_alloc, length_error: never out of this noexcept function
    return false;
  }

  for (int64_t o = 0; o < wp.c_out; ++o)
    std::fill(ytile + o * kTile, ytile + (o + 1) * kTile, in.bias.present() ? in.bias.data[o] : 0.f);

  const float* x_img = in.x.data + img * wp.c_in * pl.h * pl.w;
  const int64_t* off = in.offsets.data;
  for (size_t g = 0; g < wp.num_groups(); ++g) {
    for (int64_t i = wp.group_begin[g]; i < wp.group_begin[g + 1]; ++i) {
      const int64_t c = wp.channels[i];
      const float* xc = x_img + c * pl.h * pl.w;
      // The receptive fields of this channel: kTile floats per tap, zero past len. The fused
      // path stages the group's rows side by side in col.
      float* dst = wp.fused ? col + (i - wp.group_begin[g]) * kTile : col;
      const float* cols = dst;
      if (pl.direct_input && len == kTile && !wp.fused) {
        cols = xc + p0;  // the input row itself: one tap
      } else if (pl.direct_input) {
        std::memcpy(dst, xc + p0, len * sizeof(float));
        std::fill(dst + len, dst + kTile, 0.f);
      } else {
        Im2Col(xc, pl, p0, len, dst);
      }
      if (!wp.fused)
        mk.products(in.kernels.data + off[c] * taps, off[c + 1] - off[c], taps, cols,
                    prod + (off[c] - wp.group_base[g]) * kTile);
    }
    const int64_t* row_begin = wp.row_begin.data() + g * wp.c_out;
    if (wp.fused)
      mk.scatter_fma(row_begin, wp.weights.data(), wp.slots.data(), wp.c_out, col, ytile);
    else
      mk.scatter(row_begin, wp.rows.data(), wp.c_out, prod, ytile);
  }

  // Write out: affine, activation, only the tile's len pixels.
  const bool affine = in.scale.present() || in.shift.present();
  float* y_img = y + img * wp.c_out * pixels + p0;
  for (int64_t o = 0; o < wp.c_out; ++o) {
    const float* src = ytile + o * kTile;
    float* dst = y_img + o * pixels;
    const float s = in.scale.present() ? in.scale.data[o] : 1.f;
    const float b = in.shift.present() ? in.shift.data[o] : 0.f;
    if (affine)
      for (int64_t t = 0; t < len; ++t) dst[t] = src[t] * s + b;
    else
      std::memcpy(dst, src, len * sizeof(float));
    if (a.activation == kActivation_Relu)
      for (int64_t t = 0; t < len; ++t) dst[t] = dst[t] > 0.f ? dst[t] : 0.f;
    else if (a.activation == kActivation_Clip)
      for (int64_t t = 0; t < len; ++t) dst[t] = std::min(std::max(dst[t], a.clip_min), a.clip_max);
  }
  return true;
}

}  // namespace redpp

// SplitConv compute core. See split_conv.h and redpp_onnx/ops/schema.py.
//
// Work decomposition: one task = one tile of `plan.tile` consecutive output pixels of one
// image, for every output channel. For each input channel c a task
//   1. gathers the receptive fields of its pixels (im2col, kh*kw rows of tile floats),
//   2. computes the k_c products P[u] = U_c[u] . col once per unique kernel,
//   3. adds P[idx[c, o]] to the output rows of every o that uses it,
// and finishes with bias (added first), the per-output affine and the activation.
// The tiling depends on the shapes only, never on the number of threads, so results are
// bit-identical for any intra-op thread count.
#include "split_conv.h"

#include <algorithm>
#include <cmath>
#include <new>

#include "split_conv_contract.h"

// Runtime dispatch for the hot loops: GCC/Clang emit a baseline and an x86-64-v3
// (AVX2 + FMA) clone and pick one when the library loads (ifunc). Nothing is compiled for
// the build machine only.
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define REDPP_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define REDPP_HAVE_CLONES 1
#else
#define REDPP_SIMD_CLONES
#define REDPP_HAVE_CLONES 0
#endif

namespace redpp {
namespace {

using contract::kActivation_Clip;
using contract::kActivation_Relu;

std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// floor(a / b) and ceil(a / b) for b > 0 and any sign of a.
inline int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
inline int64_t CeilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// P[u, 0:len] = sum_j U[u, j] * col[j, 0:len] for u < k; rows of P and col have stride ld.
REDPP_SIMD_CLONES
void Products(const float* __restrict U, int64_t k, int64_t taps, const float* __restrict col, int64_t ld,
              int64_t len, float* __restrict P) {
  for (int64_t u = 0; u < k; ++u) {
    const float* uk = U + u * taps;
    float* p = P + u * ld;
    const float w0 = uk[0];
    for (int64_t t = 0; t < len; ++t) p[t] = w0 * col[t];
    for (int64_t j = 1; j < taps; ++j) {
      const float wj = uk[j];
      const float* cj = col + j * ld;
      for (int64_t t = 0; t < len; ++t) p[t] += wj * cj[t];
    }
  }
}

// y[o] += P[kernel] for every (o, kernel) pair of one input channel.
REDPP_SIMD_CLONES
void ScatterAdd(const int32_t* __restrict outs, const int32_t* __restrict kernels, int64_t pairs,
                const float* __restrict P, int64_t ld, float* __restrict y, int64_t y_stride, int64_t len) {
  for (int64_t i = 0; i < pairs; ++i) {
    const float* p = P + static_cast<int64_t>(kernels[i]) * ld;
    float* yo = y + static_cast<int64_t>(outs[i]) * y_stride;
    for (int64_t t = 0; t < len; ++t) yo[t] += p[t];
  }
}

REDPP_SIMD_CLONES
void Epilogue(float* __restrict y, int64_t len, float scale, float shift, bool affine, int act, float lo,
              float hi) {
  if (affine)
    for (int64_t t = 0; t < len; ++t) y[t] = y[t] * scale + shift;
  if (act == kActivation_Relu)
    for (int64_t t = 0; t < len; ++t) y[t] = y[t] > 0.f ? y[t] : 0.f;
  else if (act == kActivation_Clip)
    for (int64_t t = 0; t < len; ++t) y[t] = std::min(std::max(y[t], lo), hi);
}

// Receptive fields of output pixels [p0, p0 + len) of one input channel plane xc[h, w]:
// col[(ki * kw + kj) * ld + t] = xc[ih, iw] or 0 outside the padded input.
void Im2Col(const float* xc, const SplitConvPlan& pl, int64_t p0, int64_t len, float* col, int64_t ld) {
  for (int64_t t0 = 0; t0 < len;) {
    const int64_t p = p0 + t0;
    const int64_t oh = p / pl.wo, ow0 = p % pl.wo;
    const int64_t seg = std::min(pl.wo - ow0, len - t0);  // pixels left on this output row
    for (int64_t ki = 0; ki < pl.kh; ++ki) {
      const int64_t ih = oh * pl.stride_h - pl.pad_h + ki * pl.dil_h;
      const bool row_in = ih >= 0 && ih < pl.h;
      const float* xrow = xc + (row_in ? ih : 0) * pl.w;
      for (int64_t kj = 0; kj < pl.kw; ++kj) {
        float* dst = col + (ki * pl.kw + kj) * ld + t0;
        if (!row_in) {
          std::fill(dst, dst + seg, 0.f);
          continue;
        }
        // iw = ow * stride_w + base is inside [0, w) for ow in [lo, hi].
        const int64_t base = kj * pl.dil_w - pl.pad_w;
        const int64_t lo = std::max(ow0, CeilDiv(-base, pl.stride_w));
        const int64_t hi = std::min(ow0 + seg - 1, FloorDiv(pl.w - 1 - base, pl.stride_w));
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

}  // namespace

const char* SimdTarget() {
#if REDPP_HAVE_CLONES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
    return "x86-64-v3";
#endif
  return "baseline";
}

std::string ValidateAttrs(const SplitConvAttrs& a) {
  for (int64_t s : a.strides)
    if (s < 1) return "SplitConv: strides must be >= 1, got " + ShapeStr(a.strides);
  for (int64_t d : a.dilations)
    if (d < 1) return "SplitConv: dilations must be >= 1, got " + ShapeStr(a.dilations);
  for (int64_t p : a.pads)
    if (p < 0) return "SplitConv: pads must be >= 0, got " + ShapeStr(a.pads);
  if (a.activation < 0 || a.activation >= contract::kNumActivations)
    return "SplitConv: unknown activation code " + std::to_string(a.activation);
  if (a.activation == kActivation_Clip && !(a.clip_min <= a.clip_max))
    return "SplitConv: clip_min must be <= clip_max";
  return {};
}

std::string PlanSplitConv(const SplitConvInputs& in, const SplitConvAttrs& a, SplitConvPlan* plan) {
  SplitConvPlan& pl = *plan;
  if (std::string e = ValidateAttrs(a); !e.empty()) return e;
  if (!in.x.present() || !in.kernels.present() || !in.offsets.present() || !in.idx.present())
    return "SplitConv: inputs X, kernels, offsets and idx are required";
  const auto& xs = in.x.shape;
  if (xs.size() != 3 && xs.size() != 4)
    return "SplitConv: X must have rank 3 [N, C, L] or 4 [N, C, H, W], got shape " + ShapeStr(xs);
  const size_t nd = xs.size() - 2;
  const auto& ks = in.kernels.shape;
  if (ks.size() != nd + 1)
    return "SplitConv: kernels must have rank " + std::to_string(nd + 1) + " for a rank-" +
           std::to_string(xs.size()) + " X, got shape " + ShapeStr(ks);
  for (int64_t d : xs)
    if (d < 0) return "SplitConv: X has a negative dimension " + ShapeStr(xs);
  for (size_t i = 1; i < ks.size(); ++i)
    if (ks[i] < 1) return "SplitConv: kernel spatial size must be >= 1, got kernels shape " + ShapeStr(ks);
  if (ks[0] < 0) return "SplitConv: bad kernels shape " + ShapeStr(ks);
  if ((!a.strides.empty() && a.strides.size() != nd) || (!a.dilations.empty() && a.dilations.size() != nd) ||
      (!a.pads.empty() && a.pads.size() != 2 * nd))
    return "SplitConv: for " + std::to_string(nd) + " spatial axes strides and dilations need " +
           std::to_string(nd) + " values and pads " + std::to_string(2 * nd) + "; got strides " +
           ShapeStr(a.strides) + ", pads " + ShapeStr(a.pads) + ", dilations " + ShapeStr(a.dilations);

  pl.n = xs[0];
  pl.c_in = xs[1];
  const int64_t K = ks[0];
  const auto& is = in.idx.shape;
  if (is.size() != 2 || is[0] != pl.c_in)
    return "SplitConv: idx must have shape [C_in, C_out] with C_in = " + std::to_string(pl.c_in) +
           " (from X), got " + ShapeStr(is);
  pl.c_out = is[1];
  if (in.offsets.shape.size() != 1 || in.offsets.shape[0] != pl.c_in + 1)
    return "SplitConv: offsets must have shape [C_in + 1] = [" + std::to_string(pl.c_in + 1) + "], got " +
           ShapeStr(in.offsets.shape);
  const int64_t* off = in.offsets.data;
  if (off[0] != 0) return "SplitConv: offsets[0] must be 0, got " + std::to_string(off[0]);
  for (int64_t c = 0; c < pl.c_in; ++c)
    if (off[c + 1] < off[c])
      return "SplitConv: offsets must be non-decreasing, offsets[" + std::to_string(c + 1) + "] = " +
             std::to_string(off[c + 1]) + " < offsets[" + std::to_string(c) + "] = " + std::to_string(off[c]);
  if (off[pl.c_in] != K)
    return "SplitConv: offsets[C_in] = " + std::to_string(off[pl.c_in]) + " must equal the number of kernels " +
           std::to_string(K);
  const std::pair<const TensorView<float>*, const char*> per_out[] = {
      {&in.bias, "B"}, {&in.scale, "scale"}, {&in.shift, "shift"}};
  for (const auto& [t, name] : per_out)
    if (t->present() && (t->shape.size() != 1 || t->shape[0] != pl.c_out))
      return std::string("SplitConv: ") + name + " must have shape [C_out] = [" + std::to_string(pl.c_out) +
             "], got " + ShapeStr(t->shape);

  // Geometry; 1-D is 2-D with a unit height.
  auto at = [](const std::vector<int64_t>& v, size_t i, int64_t dflt) { return v.empty() ? dflt : v[i]; };
  const size_t ax = nd - 1;  // the width axis
  pl.w = xs[2 + ax];
  pl.kw = ks[1 + ax];
  pl.stride_w = at(a.strides, ax, 1);
  pl.dil_w = at(a.dilations, ax, 1);
  pl.pad_w = at(a.pads, ax, 0);
  const int64_t pad_w_end = at(a.pads, ax + nd, 0);
  int64_t pad_h_end = 0;
  if (nd == 2) {
    pl.h = xs[2];
    pl.kh = ks[1];
    pl.stride_h = at(a.strides, 0, 1);
    pl.dil_h = at(a.dilations, 0, 1);
    pl.pad_h = at(a.pads, 0, 0);
    pad_h_end = at(a.pads, 2, 0);
  }
  pl.ho = (pl.h + pl.pad_h + pad_h_end - pl.dil_h * (pl.kh - 1) - 1) / pl.stride_h + 1;
  pl.wo = (pl.w + pl.pad_w + pad_w_end - pl.dil_w * (pl.kw - 1) - 1) / pl.stride_w + 1;
  if (pl.h + pl.pad_h + pad_h_end - pl.dil_h * (pl.kh - 1) - 1 < 0 ||
      pl.w + pl.pad_w + pad_w_end - pl.dil_w * (pl.kw - 1) - 1 < 0)
    return "SplitConv: the dilated kernel " + ShapeStr(std::vector<int64_t>(ks.begin() + 1, ks.end())) +
           " is larger than the padded input " + ShapeStr(std::vector<int64_t>(xs.begin() + 2, xs.end()));
  pl.out_shape = {pl.n, pl.c_out};
  if (nd == 2) pl.out_shape.push_back(pl.ho);
  pl.out_shape.push_back(pl.wo);

  // Index map -> per-channel pair lists, with the range of every entry checked.
  const int32_t* idx = in.idx.data;
  pl.pair_begin.assign(pl.c_in + 1, 0);
  pl.pair_out.clear();
  pl.pair_kernel.clear();
  pl.max_kernels_per_channel = 0;
  for (int64_t c = 0; c < pl.c_in; ++c) {
    const int64_t kc = off[c + 1] - off[c];
    pl.max_kernels_per_channel = std::max(pl.max_kernels_per_channel, kc);
    for (int64_t o = 0; o < pl.c_out; ++o) {
      const int32_t u = idx[c * pl.c_out + o];
      if (u < -1 || u >= kc)
        return "SplitConv: idx[" + std::to_string(c) + ", " + std::to_string(o) + "] = " + std::to_string(u) +
               " is out of range: input channel " + std::to_string(c) + " has " + std::to_string(kc) +
               " kernels (valid: -1 .. " + std::to_string(kc - 1) + ")";
      if (u >= 0) {
        pl.pair_out.push_back(static_cast<int32_t>(o));
        pl.pair_kernel.push_back(u);
      }
    }
    pl.pair_begin[c + 1] = static_cast<int64_t>(pl.pair_out.size());
  }

  // Tiles: the output rows of a tile (c_out x tile floats) plus the scratch (products and
  // im2col) should stay in L2; at least 16 pixels; more tiles for small images so that a
  // batch-1 call still spreads over threads. Shapes only: no dependence on thread count.
  const int64_t pixels = pl.ho * pl.wo;
  const int64_t budget_floats = 48 * 1024;
  const int64_t per_pixel = pl.c_out + pl.max_kernels_per_channel + pl.kh * pl.kw;
  int64_t tile = std::max<int64_t>(16, budget_floats / std::max<int64_t>(per_pixel, 1));
  tile = std::min<int64_t>(tile, 1024);
  if (pl.n < 8) tile = std::min(tile, std::max<int64_t>(16, CeilDiv(pixels, 8)));
  tile = std::max<int64_t>(1, std::min(tile, pixels));
  tile = tile >= 16 ? tile / 8 * 8 : tile;
  pl.tile = tile;
  pl.tiles_per_image = pixels > 0 ? CeilDiv(pixels, tile) : 0;
  pl.direct_input = pl.kh == 1 && pl.kw == 1 && pl.stride_h == 1 && pl.stride_w == 1 && pl.pad_h == 0 &&
                    pl.pad_w == 0 && pad_h_end == 0 && pad_w_end == 0;
  return {};
}

bool RunSplitConvTask(const SplitConvInputs& in, const SplitConvAttrs& a, const SplitConvPlan& pl, float* y,
                      size_t task) noexcept {
  const int64_t img = static_cast<int64_t>(task) / pl.tiles_per_image;
  const int64_t p0 = (static_cast<int64_t>(task) % pl.tiles_per_image) * pl.tile;
  const int64_t pixels = pl.ho * pl.wo;
  const int64_t len = std::min(pl.tile, pixels - p0);
  const int64_t ld = pl.tile;
  const int64_t taps = pl.kh * pl.kw;

  // Scratch, reused across calls on the same thread.
  thread_local std::vector<float> col_buf, prod_buf;
  try {
    if (!pl.direct_input && col_buf.size() < static_cast<size_t>(taps * ld)) col_buf.resize(taps * ld);
    if (prod_buf.size() < static_cast<size_t>(pl.max_kernels_per_channel * ld))
      prod_buf.resize(pl.max_kernels_per_channel * ld);
  } catch (const std::bad_alloc&) {
    return false;
  }

  float* y_img = y + img * pl.c_out * pixels + p0;
  for (int64_t o = 0; o < pl.c_out; ++o)
    std::fill(y_img + o * pixels, y_img + o * pixels + len, in.bias.present() ? in.bias.data[o] : 0.f);

  const float* x_img = in.x.data + img * pl.c_in * pl.h * pl.w;
  const int64_t* off = in.offsets.data;
  for (int64_t c = 0; c < pl.c_in; ++c) {
    const int64_t pairs = pl.pair_begin[c + 1] - pl.pair_begin[c];
    if (pairs == 0) continue;  // every kernel of this channel is zero: nothing to compute
    const float* xc = x_img + c * pl.h * pl.w;
    // With a direct 1x1 input there is a single tap, so the row stride of col is unused.
    const float* col = xc + p0;
    if (!pl.direct_input) {
      Im2Col(xc, pl, p0, len, col_buf.data(), ld);
      col = col_buf.data();
    }
    const int64_t kc = off[c + 1] - off[c];
    const float* uc = in.kernels.data + off[c] * taps;
    const int32_t* outs = pl.pair_out.data() + pl.pair_begin[c];
    const int32_t* kers = pl.pair_kernel.data() + pl.pair_begin[c];
    Products(uc, kc, taps, col, ld, len, prod_buf.data());
    ScatterAdd(outs, kers, pairs, prod_buf.data(), ld, y_img, pixels, len);
  }

  const bool affine = in.scale.present() || in.shift.present();
  if (affine || a.activation != 0)
    for (int64_t o = 0; o < pl.c_out; ++o)
      Epilogue(y_img + o * pixels, len, in.scale.present() ? in.scale.data[o] : 1.f,
               in.shift.present() ? in.shift.data[o] : 0.f, affine, a.activation, a.clip_min, a.clip_max);
  return true;
}

}  // namespace redpp

// redpp_onnx._core: the pybind11 view of the C++ core.
//
//   build_info()  what was compiled (contract version, onnxruntime C API version, SIMD dispatch)
//   contract()    the SplitConv contract constants compiled into the kernel, so that a test can
//                 check them against redpp_onnx/ops/schema.py
//   split_conv()  the kernel's compute core run directly on numpy arrays, on one thread
//                 (no onnxruntime session): for tests and micro-benchmarks of the core.
//   decode_bank() the --codebook storage's two-part prefix codes decoded into float32 weights,
//                 bit for bit what the model's standard-ops decoder computes, with a checksum
//                 per tensor (redpp_onnx/storage.py, the format in redpp_onnx/passes/codebook.py).
//   rans_encode() / rans_decode()  the compact storage form's static rANS codes (csrc/rans.h,
//                 redpp_onnx/compact.py): ranks to words, and words to float32 weights with the
//                 same checksum as decode_bank.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "rans.h"
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


// ----------------------------------------------------------------------------- codebook decoding
//
// A bank stores the codes of several tensors: code i is a class field (W bits, `main`) and, when
// the layout has a suffix, an offset field of classes[cls] bits read at bit `pos` of `suffix`
// (fields laid end to end, little-endian bit order); code = base[cls] + offset. Direct layouts
// (no suffix) store the code itself in the class field. A tensor viewed as outer x channels x
// inner gets weight = table[channel_base[c] + code] (x channel_unit[c] when given), which is the
// float32 arithmetic of the ONNX decoder (Gather, then one float32 Mul). Every read is bounds
// checked: corrupt metadata gives an error, never a read out of the buffers.

struct CodeReader {
  const uint8_t* main8 = nullptr;
  const uint16_t* main16 = nullptr;
  const uint8_t* suffix = nullptr;
  size_t suffix_size = 0;
  uint64_t pos = 0;   // bit position in suffix
  uint64_t next = 0;  // index of the next code
  uint32_t bits[16] = {};
  uint32_t base[16] = {};
  uint32_t mask[16] = {};  // 2^bits - 1
  uint32_t n_classes = 0;
  uint32_t capacity = 0;  // every code is below this
  bool bad = false;
};

constexpr uint64_t kChunk = 512;  // codes decoded at a time (between bounds checks of the suffix stream)

// Reads the next `n` codes into codes[0..n). kChecked: every suffix read is bounds checked;
// otherwise the caller has made sure the suffix has 8 bytes past the last field these codes can
// start at (a code takes at most 16 bits).
template <int W, bool kSuffix, bool kChecked>
inline void ReadCodes(CodeReader& r, uint32_t* codes, uint64_t n) {
  uint64_t next = r.next, pos = r.pos;
  bool bad = false;
  const uint8_t* suffix = r.suffix;
  // the code of class c: its offset field from the suffix (if any)
  auto code = [&](uint32_t c) -> uint32_t {
    if constexpr (!kSuffix) {
      return c;
    } else {
      bad |= c >= r.n_classes;  // (bits, base and mask are 0 there)
      const uint64_t byte = pos >> 3;
      uint64_t word = 0;
      if constexpr (kChecked) {
        if (byte + 8 <= r.suffix_size) {
          std::memcpy(&word, suffix + byte, 8);
        } else {
          for (uint64_t j = 0; byte + j < r.suffix_size && j < 8; ++j) word |= uint64_t(suffix[byte + j]) << (8 * j);
        }
      } else {
        std::memcpy(&word, suffix + byte, 8);
      }
      const uint32_t value = r.base[c] + (uint32_t(word >> (pos & 7)) & r.mask[c]);
      pos += r.bits[c];
      return value;
    }
  };
  uint64_t k = 0;
  if constexpr (W == 16) {
    for (; k < n; ++k) codes[k] = code(r.main16[next + k]);
    next += n;
  } else if constexpr (W == 8) {
    for (; k < n; ++k) codes[k] = code(r.main8[next + k]);
    next += n;
  } else {  // 8 / W class fields a byte (reading whole bytes at a time measured no faster)
    for (; k < n; ++k, ++next) {
      const uint64_t bit = next * W;
      codes[k] = code((r.main8[bit >> 3] >> (bit & 7)) & ((1u << W) - 1));
    }
  }
  r.next = next;
  r.pos = pos;
  r.bad |= bad;
}

template <int W, bool kSuffix>
inline void ReadChunk(CodeReader& r, uint32_t* codes, uint64_t n) {
  if (!kSuffix || (r.pos >> 3) + n * 2 + 8 <= r.suffix_size) {
    ReadCodes<W, kSuffix, false>(r, codes, n);
  } else {
    ReadCodes<W, kSuffix, true>(r, codes, n);
  }
}

// out[k] = table[base + codes[k]] (x unit when kScaled), the values' bits added to the checksum.
// kChecked: every index bounds checked (else base + capacity <= table size was checked).
template <bool kScaled, bool kChecked>
inline bool Lookup(const uint32_t* codes, uint64_t n, float* out, const float* table, uint64_t table_size,
                   uint64_t base, float unit, uint64_t& s1, uint64_t& s2) {
  bool bad = false;
  const float* t = table + base;
  uint64_t a = s1, b2 = s2;
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t idx = codes[k];
    if constexpr (kChecked) {
      if (base + idx >= table_size) {
        bad = true;
        idx = -base;  // table[0]
      }
    }
    float v = t[idx];
    if constexpr (kScaled) v = v * unit;
    out[k] = v;
    uint32_t b;
    std::memcpy(&b, &v, 4);
    a += b;
    b2 += a;
  }
  s1 = a;
  s2 = b2;
  return bad;
}

template <int W, bool kSuffix, bool kScaled>
void DecodeSpan(CodeReader& r, float* out, const float* table, uint64_t table_size, uint64_t base, float unit,
                uint64_t count, uint64_t& s1, uint64_t& s2) {
  uint32_t codes[kChunk];
  const bool table_safe = base + r.capacity <= table_size;
  while (count) {
    const uint64_t n = count < kChunk ? count : kChunk;
    ReadChunk<W, kSuffix>(r, codes, n);
    if (table_safe) {
      Lookup<kScaled, false>(codes, n, out, table, table_size, base, unit, s1, s2);
    } else {
      r.bad |= Lookup<kScaled, true>(codes, n, out, table, table_size, base, unit, s1, s2);
    }
    out += n;
    count -= n;
  }
}

struct TensorJob {
  int64_t start = 0, outer = 1, channels = 1, inner = 0;
  float* out = nullptr;
  const float* table = nullptr;
  uint64_t table_size = 0;
  const int32_t* channel_base = nullptr;  // channels entries
  const float* channel_unit = nullptr;    // channels entries, or null
  uint64_t s1 = 0, s2 = 0;                // the checksum (redpp_onnx.passes.codebook.checksum)
};

// The checksum: s1 = sum of the values' bits, s2 = sum of the running sums s1 (= sum (n - i) b_i),
// both modulo 2^64.
template <int W, bool kSuffix, bool kScaled>
void DecodeTensor(CodeReader& r, TensorJob& job) {
  uint64_t s1 = 0, s2 = 0;
  float* out = job.out;
  for (int64_t o = 0; o < job.outer; ++o) {
    for (int64_t c = 0; c < job.channels; ++c) {
      const float unit = kScaled ? job.channel_unit[c] : 1.0f;
      DecodeSpan<W, kSuffix, kScaled>(r, out, job.table, job.table_size, uint64_t(uint32_t(job.channel_base[c])), unit,
                                      uint64_t(job.inner), s1, s2);
      out += job.inner;
    }
  }
  job.s1 = s1;
  job.s2 = s2;
}

template <int W, bool kSuffix>
void Skip(CodeReader& r, uint64_t n) {  // codes no job asked for (padding): read, not stored
  uint32_t codes[kChunk];
  while (n) {
    const uint64_t m = n < kChunk ? n : kChunk;
    ReadChunk<W, kSuffix>(r, codes, m);
    n -= m;
  }
}

template <int W, bool kSuffix>
void DecodeAll(CodeReader& r, std::vector<TensorJob>& jobs, uint64_t count) {
  for (TensorJob& job : jobs) {
    Skip<W, kSuffix>(r, uint64_t(job.start) - r.next);
    if (job.channel_unit) {
      DecodeTensor<W, kSuffix, true>(r, job);
    } else {
      DecodeTensor<W, kSuffix, false>(r, job);
    }
  }
  Skip<W, kSuffix>(r, count - r.next);
}

py::int_ Checksum128(uint64_t s1, uint64_t s2) {  // s2 * 2^64 + s1
  return py::int_((py::int_(s2) << py::int_(64)) | py::int_(s1));
}

template <typename T>
const T* Data(const py::array& a, const char* what, size_t min_size) {
  if (!py::isinstance<py::array_t<T>>(a) || !(a.flags() & py::array::c_style))
    throw py::value_error(std::string("decode_bank: ") + what + " must be a C-contiguous array of " +
                          py::str(py::dtype::of<T>()).cast<std::string>());
  if (size_t(a.size()) < min_size)
    throw py::value_error(std::string("decode_bank: ") + what + " has " + std::to_string(a.size()) +
                          " elements, fewer than the " + std::to_string(min_size) + " it needs");
  return static_cast<const T*>(a.data());
}

py::list DecodeBank(const py::array& main, int width, const std::vector<int64_t>& classes,
                    const std::optional<py::array>& suffix, int64_t count, const py::list& jobs_in) {
  static_assert(sizeof(float) == 4, "float32");
  {
    const uint16_t probe = 1;
    uint8_t first;
    std::memcpy(&first, &probe, 1);
    if (first != 1) throw py::value_error("decode_bank: needs a little-endian machine");
  }
  if (width != 1 && width != 2 && width != 4 && width != 8 && width != 16)
    throw py::value_error("decode_bank: class fields of 1, 2, 4, 8 or 16 bits, not " + std::to_string(width));
  if (count < 0 || count % 8) throw py::value_error("decode_bank: the bank's count must be a multiple of 8");
  CodeReader r;
  if (width == 16) {
    r.main16 = Data<uint16_t>(main, "main", size_t(count));
  } else {
    r.main8 = Data<uint8_t>(main, "main", size_t(count) * width / 8);
  }
  r.capacity = uint32_t(1) << width;  // direct codes; a suffix layout sets its own below
  const bool has_suffix = suffix.has_value();
  if (has_suffix) {
    if (width > 4) throw py::value_error("decode_bank: a suffix needs class fields of 1, 2 or 4 bits");
    if (classes.empty() || classes.size() > (size_t(1) << width))
      throw py::value_error("decode_bank: " + std::to_string(classes.size()) + " classes for " + std::to_string(width) +
                            "-bit class fields");
    uint64_t b = 0;
    for (size_t c = 0; c < classes.size(); ++c) {
      if (classes[c] < 0 || classes[c] > 16) throw py::value_error("decode_bank: a class of more than 16 bits");
      r.bits[c] = uint32_t(classes[c]);
      r.base[c] = uint32_t(b);
      r.mask[c] = (uint32_t(1) << classes[c]) - 1;
      b += uint64_t(1) << classes[c];
    }
    r.n_classes = uint32_t(classes.size());
    r.capacity = uint32_t(b);
    r.suffix = Data<uint8_t>(*suffix, "suffix", 3);
    r.suffix_size = size_t(suffix->size());
  }
  std::vector<TensorJob> jobs;
  std::vector<py::object> keep;  // the arrays stay referenced while the GIL is released
  int64_t end = 0;
  for (const py::handle& item : jobs_in) {
    auto t = item.cast<py::tuple>();
    if (t.size() != 8)
      throw py::value_error("decode_bank: a job is (start, out, table, outer, channels, inner, channel_base, "
                            "channel_unit)");
    TensorJob job;
    job.start = t[0].cast<int64_t>();
    job.outer = t[3].cast<int64_t>();
    job.channels = t[4].cast<int64_t>();
    job.inner = t[5].cast<int64_t>();
    if (job.start < end || job.outer < 0 || job.channels < 0 || job.inner < 0)
      throw py::value_error("decode_bank: jobs must be in bank order and not overlap");
    int64_t n = 0;
    if (__builtin_mul_overflow(job.outer, job.channels, &n) || __builtin_mul_overflow(n, job.inner, &n) ||
        n > count - job.start)
      throw py::value_error("decode_bank: a tensor goes past the end of its bank");
    end = job.start + n;
    auto out = t[1].cast<py::array>();
    if (!py::isinstance<py::array_t<float>>(out) || !(out.flags() & py::array::c_style) || !out.writeable() ||
        out.size() != n)
      throw py::value_error("decode_bank: out must be a writeable C-contiguous float32 array of the tensor's size");
    job.out = static_cast<float*>(out.mutable_data());
    auto table = t[2].cast<py::array>();
    job.table = Data<float>(table, "table", 1);
    job.table_size = uint64_t(table.size());
    auto channel_base = t[6].cast<py::array>();
    job.channel_base = Data<int32_t>(channel_base, "channel_base", size_t(job.channels));
    for (int64_t c = 0; c < job.channels; ++c)
      if (job.channel_base[c] < 0) throw py::value_error("decode_bank: a negative codebook start");
    if (!t[7].is_none()) {
      auto unit = t[7].cast<py::array>();
      job.channel_unit = Data<float>(unit, "channel_unit", size_t(job.channels));
      keep.push_back(unit);
    }
    keep.push_back(out);
    keep.push_back(table);
    keep.push_back(channel_base);
    jobs.push_back(job);
  }
  {
    py::gil_scoped_release release;
    switch (width * 2 + has_suffix) {
      case 2: DecodeAll<1, false>(r, jobs, uint64_t(count)); break;
      case 3: DecodeAll<1, true>(r, jobs, uint64_t(count)); break;
      case 4: DecodeAll<2, false>(r, jobs, uint64_t(count)); break;
      case 5: DecodeAll<2, true>(r, jobs, uint64_t(count)); break;
      case 8: DecodeAll<4, false>(r, jobs, uint64_t(count)); break;
      case 9: DecodeAll<4, true>(r, jobs, uint64_t(count)); break;
      case 16: DecodeAll<8, false>(r, jobs, uint64_t(count)); break;
      case 32: DecodeAll<16, false>(r, jobs, uint64_t(count)); break;
    }
  }
  if (r.bad) throw py::value_error("decode_bank: a code outside its class table or its codebook");
  if (has_suffix && r.suffix_size != r.pos / 8 + 3)
    throw py::value_error("decode_bank: the suffix stream has " + std::to_string(r.suffix_size) +
                          " bytes where the codes take " + std::to_string(r.pos) + " bits (expected " +
                          std::to_string(r.pos / 8 + 3) + " bytes)");
  py::list sums;
  for (const TensorJob& job : jobs) sums.append(Checksum128(job.s1, job.s2));
  return sums;
}

py::int_ Checksum(const py::array& values) {
  const float* v = Data<float>(values, "values", 0);
  const uint64_t n = uint64_t(values.size());
  uint64_t s1 = 0, s2 = 0;
  {
    py::gil_scoped_release release;
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t b;
      std::memcpy(&b, v + i, 4);
      s1 += b;
      s2 += s1;
    }
  }
  return Checksum128(s1, s2);
}


// ---------------------------------------------------------------------------- compact form (rANS)

redpp::rans::Layout RansLayout(int64_t outer, int64_t channels, int64_t inner, const Array<int32_t>& channel_model) {
  if (channels < 1 || channel_model.size() != channels)
    throw py::value_error("rans: channel_model must have one entry per channel");
  redpp::rans::Layout l;
  l.outer = outer;
  l.channels = channels;
  l.inner = inner;
  l.channel_model = channel_model.data();
  return l;
}

redpp::rans::Models RansModels(const Array<uint32_t>& freqs, const Array<int64_t>& starts, int scale_bits) {
  if (starts.ndim() != 1 || starts.size() < 2) throw py::value_error("rans: starts needs at least 2 entries");
  return redpp::rans::Models(freqs.data(), starts.data(), size_t(starts.size() - 1), size_t(freqs.size()), scale_bits);
}

py::array_t<uint8_t> RansEncode(const Array<uint16_t>& symbols, const Array<uint32_t>& freqs,
                                const Array<int64_t>& starts, int scale_bits, int64_t outer, int64_t channels,
                                int64_t inner, const Array<int32_t>& channel_model) {
  std::vector<uint32_t> words;
  try {
    auto models = RansModels(freqs, starts, scale_bits);
    auto layout = RansLayout(outer, channels, inner, channel_model);
    if (layout.count() != symbols.size()) throw std::invalid_argument("rans: symbols do not fill the shape");
    py::gil_scoped_release release;
    words = redpp::rans::Encode(symbols.data(), layout, models);
  } catch (const std::invalid_argument& err) {
    throw py::value_error(err.what());
  }
  py::array_t<uint8_t> out(py::ssize_t(words.size() * 4));
  std::memcpy(out.mutable_data(), words.data(), words.size() * 4);  // little-endian (checked by the decoder)
  return out;
}

py::int_ RansDecode(const py::array& stream, const Array<uint32_t>& freqs, const Array<int64_t>& starts,
                    int scale_bits, int64_t outer, int64_t channels, int64_t inner,
                    const Array<int32_t>& channel_model, const py::array& out, const py::array& table,
                    const Array<int32_t>& channel_base, const Array<int32_t>& channel_count,
                    const std::optional<py::array>& channel_unit) {
  {
    const uint16_t probe = 1;
    uint8_t first;
    std::memcpy(&first, &probe, 1);
    if (first != 1) throw py::value_error("rans_decode: needs a little-endian machine");
  }
  const uint8_t* bytes = Data<uint8_t>(stream, "stream", 0);
  if (stream.size() % 4) throw py::value_error("rans_decode: a stream of whole 32-bit words");
  std::vector<uint32_t> words(size_t(stream.size() / 4));
  std::memcpy(words.data(), bytes, words.size() * 4);
  if (!py::isinstance<py::array_t<float>>(out) || !(out.flags() & py::array::c_style) || !out.writeable())
    throw py::value_error("rans_decode: out must be a writeable C-contiguous float32 array");
  float* dst = static_cast<float*>(py::array(out).mutable_data());
  const float* tab = Data<float>(table, "table", 1);
  const int64_t table_size = int64_t(table.size());
  if (channel_base.size() != channels || channel_count.size() != channels)
    throw py::value_error("rans_decode: channel_base and channel_count need one entry per channel");
  const int32_t* base = channel_base.data();
  const int32_t* limit = channel_count.data();
  for (int64_t c = 0; c < channels; ++c)
    if (base[c] < 0 || limit[c] < 0 || int64_t(base[c]) + limit[c] > table_size)
      throw py::value_error("rans_decode: a channel's codebook is outside the table");
  const float* unit = nullptr;
  if (channel_unit) unit = Data<float>(*channel_unit, "channel_unit", size_t(channels));
  uint64_t s1 = 0, s2 = 0;
  try {
    auto models = RansModels(freqs, starts, scale_bits);
    auto layout = RansLayout(outer, channels, inner, channel_model);
    if (layout.count() != out.size()) throw std::invalid_argument("rans: out does not have the shape's size");
    py::gil_scoped_release release;
    bool bad = false;
    redpp::rans::Decode(words.data(), words.size(), layout, models, [&](int64_t i, int64_t ch, uint32_t rank) {
      if (int64_t(rank) >= limit[ch]) {
        bad = true;
        rank = 0;
      }
      const float v = unit ? tab[base[ch] + rank] * unit[ch] : tab[base[ch] + rank];
      dst[i] = v;
      uint32_t b;
      std::memcpy(&b, &v, 4);
      s1 += b;
      s2 += s1;
    });
    if (bad) throw std::invalid_argument("rans: a code outside its channel's codebook");
  } catch (const std::invalid_argument& err) {
    throw py::value_error(err.what());
  }
  return Checksum128(s1, s2);
}

}  // namespace

// The KDE hashing's binned Taylor moments (redpp_onnx/hashing/kde.py, _binned_density), the same
// float64 operations in the same order as its numpy form (bit-identical results, one pass instead
// of ten). No FMA: the build has no -march and contracts nothing across statements.
py::tuple KdeNearest(const py::array_t<double, py::array::c_style>& coords, double reach) {
  const int64_t n = coords.size();
  py::array_t<int64_t> nearest(n);
  py::array_t<double> delta(n);
  const double* c = coords.data();
  int64_t* k = nearest.mutable_data();
  double* d = delta.mutable_data();
  {
    py::gil_scoped_release release;
    for (int64_t i = 0; i < n; ++i) {
      const double shifted = c[i] + reach;
      const double up = shifted + 0.5;
      k[i] = static_cast<int64_t>(up);
      d[i] = shifted - static_cast<double>(k[i]);
    }
  }
  return py::make_tuple(nearest, delta);
}

py::array_t<double> KdeMoments(const py::array_t<int64_t, py::array::c_style>& nearest,
                               const py::array_t<double, py::array::c_style>& delta,
                               const py::array_t<double, py::array::c_style>& counts, int64_t i0, int64_t i1,
                               int64_t a, int64_t n_bins, int order) {
  if (i0 < 0 || i1 < i0 || i1 > nearest.size() || delta.size() != nearest.size() ||
      counts.size() != nearest.size() || order < 0 || n_bins < 0)
    throw py::value_error("kde_moments: inconsistent arguments");
  py::array_t<double> out({int64_t(order + 1), n_bins});
  double* b = out.mutable_data();
  std::fill(b, b + (order + 1) * n_bins, 0.0);
  const int64_t* k = nearest.data();
  const double* d = delta.data();
  const double* c = counts.data();
  bool sorted = true;
  for (int64_t i = i0; i < i1; ++i) {
    if (k[i] - a < 0 || k[i] - a >= n_bins) throw py::value_error("kde_moments: a value outside the bins");
    if (i > i0 && k[i] < k[i - 1]) sorted = false;
  }
  constexpr int kMaxOrder = 8;
  {
    py::gil_scoped_release release;
    if (sorted && order < kMaxOrder) {
      // nearest is non-decreasing: a bin's values are consecutive, summed in registers from 0 in
      // the same order as the scatter-adds below (the same numbers), and stored once
      double acc[kMaxOrder] = {0};
      int64_t j = i0 < i1 ? k[i0] - a : 0;
      for (int64_t i = i0; i < i1; ++i) {
        if (k[i] - a != j) {
          for (int o = 0; o <= order; ++o) b[o * n_bins + j] = acc[o], acc[o] = 0.0;
          j = k[i] - a;
        }
        double m = c[i];
        for (int o = 0; o <= order; ++o) {
          acc[o] += m;
          m = m * d[i];
        }
      }
      if (i0 < i1)
        for (int o = 0; o <= order; ++o) b[o * n_bins + j] = acc[o];
    } else {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t j = k[i] - a;
        double m = c[i];
        for (int o = 0; o <= order; ++o) {
          b[o * n_bins + j] += m;
          m = m * d[i];
        }
      }
    }
  }
  return out;
}

// 16-bit weights (float16 / bfloat16) of the streaming path (redpp_onnx/stream.py): the histogram
// of their bit patterns and a table lookup, without numpy's widening of the patterns to int64.
py::array_t<int64_t> Histogram16(const py::array_t<uint16_t, py::array::c_style>& bits) {
  py::array_t<int64_t> hist(int64_t(1) << 16);
  int64_t* h = hist.mutable_data();
  std::fill(h, h + (int64_t(1) << 16), int64_t(0));
  const uint16_t* b = bits.data();
  const int64_t n = bits.size();
  {
    py::gil_scoped_release release;
    for (int64_t i = 0; i < n; ++i) ++h[b[i]];
  }
  return hist;
}

py::array_t<uint16_t> Lookup16(const py::array_t<uint16_t, py::array::c_style>& table,
                               const py::array_t<uint16_t, py::array::c_style>& bits) {
  if (table.size() != (int64_t(1) << 16)) throw py::value_error("lookup16: the table needs 65536 entries");
  const int64_t n = bits.size();
  py::array_t<uint16_t> out(n);
  const uint16_t* t = table.data();
  const uint16_t* b = bits.data();
  uint16_t* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    for (int64_t i = 0; i < n; ++i) o[i] = t[b[i]];
  }
  return out;
}

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
  m.def("decode_bank", &DecodeBank, py::arg("main"), py::arg("width"), py::arg("classes"), py::arg("suffix"),
        py::arg("count"), py::arg("jobs"),
        "Decode one --codebook bank into float32 tensors (jobs: (start, out, table, outer, channels, inner, "
        "channel_base int32, channel_unit float32 or None), in bank order; out is written). Returns each job's "
        "checksum (redpp_onnx.passes.codebook.checksum of out). Raises ValueError on inconsistent input; never "
        "reads outside the arrays.");
  m.def("rans_encode", &RansEncode, py::arg("symbols"), py::arg("freqs"), py::arg("starts"),
        py::arg("scale_bits"), py::arg("outer"), py::arg("channels"), py::arg("inner"), py::arg("channel_model"),
        "Static rANS code of uint16 ranks (flat order; symbol i in channel (i // inner) % channels, coded with "
        "model channel_model[channel]: frequencies freqs[starts[m]:starts[m+1]] summing to 2^scale_bits). Returns "
        "the stream's bytes (uint8). Raises ValueError on a symbol outside its model or of frequency 0.");
  m.def("rans_decode", &RansDecode, py::arg("stream"), py::arg("freqs"), py::arg("starts"), py::arg("scale_bits"),
        py::arg("outer"), py::arg("channels"), py::arg("inner"), py::arg("channel_model"), py::arg("out"),
        py::arg("table"), py::arg("channel_base"), py::arg("channel_count"), py::arg("channel_unit") = py::none(),
        "Decode a rans_encode stream into out (float32): weight i = table[channel_base[ch] + rank] "
        "(* channel_unit[ch]). Returns the checksum of out. Raises ValueError on a corrupted, short or long "
        "stream or a rank outside its channel's channel_count values.");
  m.def("kde_nearest", &KdeNearest, py::arg("coords"), py::arg("reach"),
        "(nearest, delta): the KDE grid point nearest to coords + reach (int64) and the offset from it.");
  m.def("kde_moments", &KdeMoments, py::arg("nearest"), py::arg("delta"), py::arg("counts"), py::arg("i0"),
        py::arg("i1"), py::arg("a"), py::arg("n_bins"), py::arg("order"),
        "Binned Taylor moments (order + 1, n_bins) of values i0..i1: B[m, nearest - a] += counts * delta^m.");
  m.def("histogram16", &Histogram16, py::arg("bits"), "Counts (int64, 65536) of each 16-bit pattern in bits (uint16).");
  m.def("lookup16", &Lookup16, py::arg("table"), py::arg("bits"), "table[bits] for uint16 bits and a 65536-entry table.");
  m.def("checksum", &Checksum, py::arg("values"),
        "redpp_onnx.passes.codebook.checksum of a C-contiguous float32 array, in C++.");
}

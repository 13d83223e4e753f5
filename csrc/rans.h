// Static rANS coding of rank codes, for the compact storage form (redpp_onnx/compact.py).
//
// A 64-bit state, 32-bit output words (the "rans64" construction of F. Giesen's public-domain
// ryg_rans, written here from its description): a code of probability f / 2^S costs
// log2(2^S / f) bits plus < 2^-20 bit of rounding per symbol, and 8 bytes of final state per
// stream. Symbols are coded in reverse (the decoder reads forwards); each symbol's model is the
// model of its channel: symbol i is in channel (i / inner) % channels.
//
// Header-only and free of Python and onnxruntime, so that the decoder is the same code wherever
// it runs. Everything a caller passes in is checked; the decoder never reads outside the stream
// and reports a stream that does not end in the encoder's initial state.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace redpp {
namespace rans {

constexpr uint64_t kLow = uint64_t(1) << 31;  // the state stays in [kLow, kLow << 32)
constexpr int kMaxScaleBits = 31;

// Models: frequencies of model m are freqs[start[m] .. start[m + 1]), each model's summing to
// 2^scale_bits. cum[k] is the cumulative frequency before entry k within its model.
struct Models {
  const uint32_t* freqs = nullptr;
  std::vector<uint64_t> start;  // n_models + 1 entries
  std::vector<uint32_t> cum;    // one per entry, within its model
  int scale_bits = 0;

  Models(const uint32_t* f, const int64_t* starts, size_t n_models, size_t n_freqs, int s) : freqs(f), scale_bits(s) {
    if (s < 1 || s > kMaxScaleBits) throw std::invalid_argument("rans: scale_bits must be 1.." + std::to_string(kMaxScaleBits));
    start.resize(n_models + 1);
    cum.resize(n_freqs);
    for (size_t m = 0; m <= n_models; ++m) {
      if (starts[m] < 0 || uint64_t(starts[m]) > n_freqs || (m && starts[m] <= starts[m - 1]))
        throw std::invalid_argument("rans: model starts must increase within the frequency table");
      start[m] = uint64_t(starts[m]);
    }
    if (start[0] != 0 || start[n_models] != n_freqs) throw std::invalid_argument("rans: models must cover the table");
    const uint64_t total = uint64_t(1) << s;
    for (size_t m = 0; m < n_models; ++m) {
      uint64_t c = 0;
      for (uint64_t k = start[m]; k < start[m + 1]; ++k) {
        cum[k] = uint32_t(c);
        c += freqs[k];
        if (c > total) break;
      }
      if (c != total) throw std::invalid_argument("rans: a model's frequencies do not sum to 2^scale_bits");
    }
  }
  size_t size(size_t m) const { return size_t(start[m + 1] - start[m]); }
};

// Channel -> model of every symbol, in flat order.
struct Layout {
  int64_t outer = 1, channels = 1, inner = 0;
  const int32_t* channel_model = nullptr;  // channels entries

  int64_t count() const { return outer * channels * inner; }
};

inline void CheckLayout(const Layout& l, const Models& models) {
  if (l.outer < 0 || l.channels < 1 || l.inner < 0) throw std::invalid_argument("rans: a negative shape");
  int64_t n = 0;
  if (__builtin_mul_overflow(l.outer, l.channels, &n) || __builtin_mul_overflow(n, l.inner, &n))
    throw std::invalid_argument("rans: the shape overflows");
  for (int64_t c = 0; c < l.channels; ++c)
    if (l.channel_model[c] < 0 || size_t(l.channel_model[c]) + 1 >= models.start.size())
      throw std::invalid_argument("rans: a channel's model is not in the table");
}

// Encodes count() symbols (ranks within their channel's model); returns the 32-bit words in
// reading order. Throws when a symbol is outside its model or has frequency 0.
inline std::vector<uint32_t> Encode(const uint16_t* symbols, const Layout& l, const Models& models) {
  CheckLayout(l, models);
  std::vector<uint32_t> words;  // written backwards, reversed at the end
  uint64_t x = kLow;
  const int s = models.scale_bits;
  const int64_t n = l.count();
  const int64_t block = l.channels * l.inner;
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t ch = l.inner ? (i % block) / l.inner : 0;
    const int32_t m = l.channel_model[ch];
    const uint32_t sym = symbols[i];
    if (sym >= models.size(size_t(m))) throw std::invalid_argument("rans: a symbol outside its model");
    const uint64_t k = models.start[size_t(m)] + sym;
    const uint64_t f = models.freqs[k];
    if (f == 0) throw std::invalid_argument("rans: a symbol of frequency 0");
    const uint64_t x_max = ((kLow >> s) << 32) * f;
    if (x >= x_max) {
      words.push_back(uint32_t(x));
      x >>= 32;
    }
    x = ((x / f) << s) + (x % f) + models.cum[k];
  }
  words.push_back(uint32_t(x));
  words.push_back(uint32_t(x >> 32));
  std::reverse(words.begin(), words.end());
  return words;
}

// Decodes count() symbols from `n_words` words, calling emit(i, channel, rank) for each in flat
// order. Throws when the stream is too short, has words left over or does not end in the
// encoder's initial state (a corrupted or truncated stream).
template <typename Emit>
void Decode(const uint32_t* words, size_t n_words, const Layout& l, const Models& models, Emit&& emit) {
  CheckLayout(l, models);
  if (n_words < 2) throw std::invalid_argument("rans: a stream of fewer than 2 words");
  size_t pos = 0;
  uint64_t x = (uint64_t(words[0]) << 32) | words[1];
  pos = 2;
  if (x < kLow || x >= (kLow << 32)) throw std::invalid_argument("rans: the stream is corrupted (initial state)");
  const int s = models.scale_bits;
  const uint64_t mask = (uint64_t(1) << s) - 1;
  const int64_t n = l.count();
  // slot -> symbol tables when they pay for themselves (2^S entries a model, at most 2^16
  // symbols): the models used, if their tables are not larger than 4 entries a symbol
  std::vector<int64_t> lut_of(models.start.size() - 1, -1);
  std::vector<uint16_t> luts;
  {
    size_t used = 0;
    for (int64_t ch = 0; ch < l.channels; ++ch) {
      int64_t& k = lut_of[size_t(l.channel_model[ch])];
      if (k == -1) k = -2, ++used;
    }
    const bool fits = s <= 16 && used * (size_t(1) << s) <= size_t(4) * size_t(std::max<int64_t>(n, 0)) + 65536;
    for (size_t m = 0; m < lut_of.size(); ++m) {
      if (lut_of[m] != -2) continue;
      if (!fits || models.size(m) > 65536) {
        lut_of[m] = -1;
        continue;
      }
      lut_of[m] = int64_t(luts.size());
      luts.resize(luts.size() + (size_t(1) << s));
      uint16_t* t = luts.data() + lut_of[m];
      for (uint64_t k = models.start[m]; k < models.start[m + 1]; ++k)
        std::fill(t + models.cum[k], t + models.cum[k] + models.freqs[k], uint16_t(k - models.start[m]));
    }
  }
  for (int64_t o = 0, i = 0; o < l.outer; ++o) {
    for (int64_t ch = 0; ch < l.channels; ++ch) {
      const size_t m = size_t(l.channel_model[ch]);
      const uint64_t b = models.start[m];
      const uint32_t* cum = models.cum.data() + b;
      const uint32_t* freq = models.freqs + b;
      const size_t size = models.size(m);
      const uint16_t* lut = lut_of[m] >= 0 ? luts.data() + lut_of[m] : nullptr;
      for (int64_t j = 0; j < l.inner; ++j, ++i) {
        if (x < kLow) throw std::invalid_argument("rans: the stream is corrupted (state out of range)");
        const uint32_t slot = uint32_t(x & mask);
        const size_t sym = lut ? size_t(lut[slot])
                               : size_t(std::upper_bound(cum, cum + size, slot) - cum) - 1;  // cum[0] == 0 <= slot
        x = freq[sym] * (x >> s) + slot - cum[sym];
        if (x < kLow) {
          if (pos >= n_words) throw std::invalid_argument("rans: the stream ends early");
          x = (x << 32) | words[pos++];
        }
        emit(i, ch, uint32_t(sym));
      }
    }
  }
  (void)n;
  if (pos != n_words) throw std::invalid_argument("rans: the stream has words after its last symbol");
  if (x != kLow) throw std::invalid_argument("rans: the stream does not end in the initial state (corrupted)");
}

}  // namespace rans
}  // namespace redpp

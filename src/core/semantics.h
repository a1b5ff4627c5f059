// The definition of attention's masks, score transforms and dropout, shared by the float64
// oracle, the CPU backend and the CUDA kernels so that all of them compute the same function.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD inline
#endif

namespace flashattn::semantics {

// Window (left, right), -1 meaning unbounded, aligned bottom-right: query i of a sequence with
// sq queries and sk keys sits at key position i + sk - sq. Causal is window (-1, 0).
//
// `fold` > 0: the rows are the query rows of several heads one after another, `fold` rows each
// (grouped heads folded into rows, core/query_groups.h), so row i is query row i % fold of a
// sequence of `fold` queries. The backward never folds (first_query / last_query ignore it).
struct Window {
  int left = -1, right = -1;
  int seqlen_q = 0, seqlen_k = 0;
  int fold = 0;

  FA_HD int64_t diagonal(int64_t i) const { return fold > 0 ? folded_row(i) + seqlen_k - fold : unfolded_diagonal(i); }
  // The diagonal where rows are never folded (the backward): no remainder in masked loops.
  FA_HD int64_t unfolded_diagonal(int64_t i) const { return i + seqlen_k - seqlen_q; }
  // Query row of folded row i.
  FA_HD int64_t folded_row(int64_t i) const { return int64_t(int(i) % fold); }
  FA_HD bool visible(int64_t i, int64_t j) const {
    const int64_t c = diagonal(i);
    return j >= 0 && j < seqlen_k && (left < 0 || j >= c - left) && (right < 0 || j <= c + right);
  }
  // Visible keys of a row on diagonal c lie in [first_key_at(c), last_key_at(c)] (empty when
  // first > last); both grow with c.
  FA_HD int64_t first_key_at(int64_t c) const {
    const int64_t lo = left < 0 ? 0 : c - left;
    return lo < 0 ? 0 : lo;
  }
  FA_HD int64_t last_key_at(int64_t c) const {
    const int64_t hi = right < 0 ? seqlen_k - 1 : c + right;
    return hi > seqlen_k - 1 ? seqlen_k - 1 : hi;
  }
  FA_HD int64_t first_key(int64_t i) const { return first_key_at(diagonal(i)); }
  FA_HD int64_t last_key(int64_t i) const { return last_key_at(diagonal(i)); }
  // The diagonals of rows [i0, i0 + n), n >= 1, lie in [low, high]: the first and last row's,
  // or with folded rows all of a head's (a superset where the span does not wrap, which costs
  // only masks; it needs no remainder in the callers' loops).
  struct Diagonals {
    int64_t low, high;
  };
  FA_HD Diagonals diagonals(int64_t i0, int64_t n) const {
    return {fold > 0 ? int64_t(seqlen_k) - fold : diagonal(i0), fold > 0 ? int64_t(seqlen_k) - 1 : diagonal(i0 + n - 1)};
  }
  // Rows that see key j lie in [first_query(j), last_query(j)] (empty when first > last).
  FA_HD int64_t first_query(int64_t j) const {
    const int64_t lo = right < 0 ? 0 : j - right - (seqlen_k - seqlen_q);
    return lo < 0 ? 0 : lo;
  }
  FA_HD int64_t last_query(int64_t j) const {
    const int64_t hi = left < 0 ? seqlen_q - 1 : j + left - (seqlen_k - seqlen_q);
    return hi > seqlen_q - 1 ? seqlen_q - 1 : hi;
  }
};

// Softcap c > 0: s -> c * tanh(s / c). Applied to the scaled score, before ALiBi.
template <typename T>
FA_HD T softcap(T s, T cap) {
  using std::tanh;
  return cap > T(0) ? cap * tanh(s / cap) : s;
}
// d softcap(s) / ds, from the capped value t = softcap(s): 1 - (t / c)^2.
template <typename T>
FA_HD T softcap_grad(T capped, T cap) {
  if (!(cap > T(0))) return T(1);
  const T r = capped / cap;
  return T(1) - r * r;
}

// ALiBi: -slope * |i + sk - sq - j|, added after softcap. `Index`: int64_t, or int where a kernel
// keeps rows and keys in 32 bits (lengths are ints).
template <typename T, typename Index = int64_t>
FA_HD T alibi_bias_at(T slope, Index diagonal, Index j) {
  const Index dist = diagonal - j;
  return -slope * T(dist < 0 ? -dist : dist);
}
template <typename T>
FA_HD T alibi_bias(T slope, const Window& w, int64_t i, int64_t j) {
  return alibi_bias_at(slope, w.diagonal(i), j);
}

// Philox4x32 with 7 rounds (Salmon et al., SC'11): counter-based, so any (b, h, i, j) can be
// drawn in any order, on any device, with the same result.
struct Philox4 {
  uint32_t x[4];
};

FA_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(p >> 32);
  return uint32_t(p);
}

FA_HD Philox4 philox4x32_7(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 7; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Dropout: one Philox call gives 8 keep decisions of 16 bits each, for keys 8m..8m+7 of one
// (batch, query head, row). Element j keeps iff its 16-bit draw >= threshold, so the keep
// probability is 1 - threshold / 65536 (p rounded down to a multiple of 2^-16).
struct Dropout {
  uint32_t threshold = 0;  // 0: no dropout
  float inv_keep = 1.f;    // 1 / (1 - p)
  uint64_t seed = 0, offset = 0;

  static Dropout make(float p, uint64_t seed, uint64_t offset) {
    Dropout d;
    d.threshold = uint32_t(double(p) * 65536.0);
    d.inv_keep = float(1.0 / (1.0 - double(p)));
    d.seed = seed;
    d.offset = offset;
    return d;
  }
  FA_HD bool enabled() const { return threshold != 0; }

  // The 8 draws of keys 8m..8m+7, packed as four 32-bit words (two 16-bit draws each, low first).
  FA_HD Philox4 draws(int64_t batch_head, int64_t i, int64_t m) const {
    return philox4x32_7(uint32_t(m), uint32_t(i), uint32_t(batch_head), uint32_t(offset),
                        uint32_t(seed), uint32_t(seed >> 32) + uint32_t(offset >> 32));
  }
  FA_HD static uint32_t draw_of(const Philox4& r, int lane) {  // lane = j % 8
    return (r.x[lane >> 1] >> ((lane & 1) * 16)) & 0xFFFFu;
  }
  // batch_head = batch * heads_q + query head.
  FA_HD bool keep(int64_t batch_head, int64_t i, int64_t j) const {
    if (!enabled()) return true;
    return draw_of(draws(batch_head, i, j >> 3), int(j & 7)) >= threshold;
  }
};

}  // namespace flashattn::semantics

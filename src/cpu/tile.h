// What the CPU forward and backward share: tile sizes, per-thread scratch, loading a tile of
// rows as float32, and turning raw q.k products into masked, transformed scores.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/params.h"
#include "core/semantics.h"
#include "cpu/kernels.h"

namespace flashattn::cpu {

constexpr int kBlockQ = 64;  // query rows per tile
constexpr int kBlockK = 64;  // keys per tile

// Bump allocator over one thread's slice of the workspace; sizes in floats, 64-byte aligned.
class Scratch {
 public:
  explicit Scratch(float* base) : next_(base) {}
  float* take(size_t n) {
    float* p = next_;
    next_ += round_up(n);
    return p;
  }
  static size_t round_up(size_t n) { return (n + 15) / 16 * 16; }

 private:
  float* next_;
};

// Rows [row0, row0 + n) of head h of sequence b of `t`, as float32 into dst[n][ld].
inline void load_tile(const RowCodec& codec, const Operand& t, int b, int64_t start, int64_t row0, int n, int h,
                      int dim, float* dst, int ld) {
  const char* base = static_cast<const char*>(t.data);
  for (int r = 0; r < n; ++r)
    codec.load(base + element_offset(t, b, start, row0 + r, h) * codec.element_size, dst + int64_t(r) * ld, dim);
}

// The same rows transposed: dst[dim][ld], column r = row r. `row` is scratch of `dim` floats.
inline void load_tile_transposed(const RowCodec& codec, const Operand& t, int b, int64_t start, int64_t row0, int n,
                                 int h, int dim, float* dst, int ld, float* row) {
  const char* base = static_cast<const char*>(t.data);
  for (int r = 0; r < n; ++r) {
    codec.load(base + element_offset(t, b, start, row0 + r, h) * codec.element_size, row, dim);
    for (int x = 0; x < dim; ++x) dst[int64_t(x) * ld + r] = row[x];
  }
}

inline void store_tile(const RowCodec& codec, const float* src, int ld, const Operand& t, int b, int64_t start,
                       int64_t row0, int n, int h, int dim) {
  char* base = static_cast<char*>(t.data);
  for (int r = 0; r < n; ++r)
    codec.store(src + int64_t(r) * ld, base + element_offset(t, b, start, row0 + r, h) * codec.element_size, dim);
}

// The score rule of one (batch, head): scale, softcap, ALiBi, window, dropout.
struct ScoreRule {
  semantics::Window window;
  float scale = 1, softcap = 0, alibi_slope = 0;
  semantics::Dropout dropout;
  int64_t batch_head = 0;  // dropout's key: batch * heads_q + query head

  static ScoreRule make(const Params& p, int b, int h) {
    ScoreRule r;
    r.window = semantics::Window{p.window_left, p.window_right, p.seqlen_q_of(b), p.seqlen_k_of(b)};
    r.scale = p.scale;
    r.softcap = p.softcap;
    r.alibi_slope = p.alibi_slope(b, h);
    r.dropout = semantics::Dropout::make(p.dropout_p, p.dropout_seed, p.dropout_offset);
    r.batch_head = int64_t(b) * p.heads_q + h;
    return r;
  }

  // Every (i, j) of the tile visible?
  bool tile_visible(int64_t i0, int nq, int64_t j0, int nk) const {
    return window.first_key(i0 + nq - 1) <= j0 && window.last_key(i0) >= j0 + nk - 1;
  }

  // S[r][c] = q.k of row i0 + r, key j0 + c  ->  transformed score, -inf where masked.
  // cap_grad (optional) receives d softcap / d s for the backward pass.
  void transform(float* s, int ld, int64_t i0, int nq, int64_t j0, int nk, float* cap_grad) const;

  // P[r][c] *= keep(i0 + r, j0 + c) / (1 - p), or 0 when dropped; z receives the factor.
  void apply_dropout(float* prob, int ld, int64_t i0, int nq, int64_t j0, int nk, float* z) const;
};

// Query-tile range that can see keys [j0, j0 + nk), and key range seen by rows [i0, i0 + nq).
struct Span {
  int64_t begin = 0, end = 0;  // half-open
  bool empty() const { return begin >= end; }
};
inline Span keys_seen(const semantics::Window& w, int64_t i0, int nq) {
  return Span{w.first_key(i0), w.last_key(i0 + nq - 1) + 1};
}
inline Span queries_seeing(const semantics::Window& w, int64_t j0, int nk) {
  return Span{w.first_query(j0), w.last_query(j0 + nk - 1) + 1};
}

int cpu_threads(const Params& p);

}  // namespace flashattn::cpu

// What the CPU forward and backward share: tile sizes, per-thread scratch, access to tiles of
// rows as float32, and turning raw q.k products into masked, transformed scores.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/params.h"
#include "core/semantics.h"
#include "cpu/kernels.h"

namespace flashattn::cpu {

// Multiples of the kernels' row blocks (6 and 12) and column bands (16 and 32).
constexpr int kBlockQ = 96;  // query rows per work item: the stationary side, transposed once
constexpr int kBlockK = 96;  // keys per streamed tile
static_assert(kBlockQ % 16 == 0, "the softmax step reads whole 16-lane vectors of query rows");
// What every tile re-reads (the forward: a head's keys; the backward's key pass: a group's query
// rows) is packed once per thread while it takes at most this many floats (16 MiB), else per tile.
constexpr int64_t kMaxPackedFloats = int64_t(4) << 20;

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

// Rows [row0, row0 + n) of head h of sequence b, converted to float32 and packed into
// scratch[n][dim]; returns scratch. Packing also pays for float32: rows of one head lie a multiple
// of 4 KiB apart in common layouts, so read in place they all fall into the same L1 sets.
const float* pack_rows(const RowCodec& codec, const Operand& t, int b, int64_t start, int64_t row0, int n, int h,
                       int dim, float* scratch);

// The same rows transposed: dst[dim][ld], column r = row r.
void load_transposed(const RowCodec& codec, const Operand& t, int b, int64_t start, int64_t row0, int n, int h,
                     int dim, float* dst, int ld);

void store_rows(const RowCodec& codec, const float* src, int ld, const Operand& t, int b, int64_t start, int64_t row0,
                int n, int h, int dim);

// A score tile of nq queries x nk keys: element (r, c) at r * row + c * col. Query-major tiles
// (row = ld, col = 1) come from Q K^T, key-major tiles (row = 1, col = ld) from K Q^T.
struct TileShape {
  int nq, nk;
  int row, col;
  static TileShape query_major(int nq, int nk, int ld) { return {nq, nk, ld, 1}; }
  static TileShape key_major(int nq, int nk, int ld) { return {nq, nk, 1, ld}; }
  bool is_key_major() const { return row == 1 && col != 1; }
  // Calls f(r, c, index) with the contiguous dimension innermost.
  template <typename F>
  void for_each(F&& f) const {
    if (is_key_major()) {
      for (int c = 0; c < nk; ++c)
        for (int r = 0; r < nq; ++r) f(r, c, r + c * col);
    } else {
      for (int r = 0; r < nq; ++r)
        for (int c = 0; c < nk; ++c) f(r, c, r * row + c);
    }
  }
};

// The score rule of one (batch, head): scale, softcap, ALiBi, window, dropout.
struct ScoreRule {
  semantics::Window window;
  float scale = 1, softcap = 0, alibi_slope = 0;
  semantics::Dropout dropout;
  int64_t batch_head = 0;  // dropout's key: batch * heads_q + query head

  static ScoreRule make(const Params& p, int b, int h);

  // Every (i, j) of the tile visible?
  bool tile_visible(int64_t i0, int nq, int64_t j0, int nk) const {
    const semantics::Window::Diagonals d = window.diagonals(i0, nq);
    return window.first_key_at(d.high) <= j0 && window.last_key_at(d.low) >= j0 + nk - 1;
  }

  // Raw q.k of row i0 + r, key j0 + c  ->  transformed score, -inf where masked.
  // cap_grad (optional, same shape) receives d softcap / d s for the backward pass.
  void transform(float* s, const TileShape& shape, int64_t i0, int64_t j0, float* cap_grad) const;

  // P *= keep / (1 - p), or 0 when dropped; z (optional, same shape) receives the factor.
  void apply_dropout(float* prob, const TileShape& shape, int64_t i0, int64_t j0, float* z) const;
};

// Keys seen by rows [i0, i0 + nq), and rows that see keys [j0, j0 + nk): half-open spans.
struct Span {
  int64_t begin = 0, end = 0;
};
inline Span keys_seen(const semantics::Window& w, int64_t i0, int nq) {
  const semantics::Window::Diagonals d = w.diagonals(i0, nq);
  return Span{w.first_key_at(d.low), w.last_key_at(d.high) + 1};
}
inline Span queries_seeing(const semantics::Window& w, int64_t j0, int nk) {
  return Span{w.first_query(j0), w.last_query(j0 + nk - 1) + 1};
}

int cpu_threads(const Params& p);

}  // namespace flashattn::cpu

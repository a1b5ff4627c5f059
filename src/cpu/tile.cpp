#include "cpu/tile.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <omp.h>

namespace flashattn::cpu {

const float* pack_rows(const RowCodec& codec, const Operand& t, int b, int64_t start, int64_t row0, int n, int h,
                       int dim, float* scratch) {
  const char* base = static_cast<const char*>(t.data) + element_offset(t, b, start, row0, h) * codec.element_size;
  for (int r = 0; r < n; ++r) codec.load(base + r * t.row * codec.element_size, scratch + int64_t(r) * dim, dim);
  return scratch;
}

void load_transposed(const RowCodec& codec, const Operand& t, int b, int64_t start, int64_t row0, int n, int h,
                     int dim, float* dst, int ld) {
  const char* base = static_cast<const char*>(t.data);
  float row[256];  // head dims are at most 256 (validated)
  for (int r = 0; r < n; ++r) {
    codec.load(base + element_offset(t, b, start, row0 + r, h) * codec.element_size, row, dim);
    for (int x = 0; x < dim; ++x) dst[int64_t(x) * ld + r] = row[x];
  }
}

void store_rows(const RowCodec& codec, const float* src, int ld, const Operand& t, int b, int64_t start, int64_t row0,
                int n, int h, int dim) {
  char* base = static_cast<char*>(t.data);
  for (int r = 0; r < n; ++r)
    codec.store(src + int64_t(r) * ld, base + element_offset(t, b, start, row0 + r, h) * codec.element_size, dim);
}

ScoreRule ScoreRule::make(const Params& p, int b, int h) {
  ScoreRule r;
  r.window = semantics::Window{p.window_left, p.window_right, p.seqlen_q_of(b), p.seqlen_k_of(b), p.fold_rows};
  r.scale = p.scale;
  r.softcap = p.softcap;
  r.alibi_slope = p.alibi_slope(b, h);
  r.dropout = semantics::Dropout::make(p.dropout_p, p.dropout_seed, p.dropout_offset);
  r.batch_head = int64_t(b) * p.heads_q + h;
  return r;
}

FA_MULTIVERSION void ScoreRule::transform(float* s, const TileShape& shape, int64_t i0, int64_t j0,
                                          float* cap_grad) const {
  const float sc = scale;
  shape.for_each([&](int, int, int x) { s[x] *= sc; });
  if (softcap > 0) {
    const float cap = softcap, inv = 1.f / softcap;
    shape.for_each([&](int, int, int x) {
      const float t = std::tanh(s[x] * inv);
      s[x] = cap * t;
      if (cap_grad) cap_grad[x] = 1.f - t * t;
    });
  }
  if (alibi_slope != 0.f)
    shape.for_each([&](int r, int c, int x) { s[x] += semantics::alibi_bias<float>(alibi_slope, window, i0 + r, j0 + c); });
  if (!tile_visible(i0, shape.nq, j0, shape.nk)) {
    const float neg_inf = -std::numeric_limits<float>::infinity();
    shape.for_each([&](int r, int c, int x) {
      if (!window.visible(i0 + r, j0 + c)) s[x] = neg_inf;
    });
  }
}

void ScoreRule::apply_dropout(float* prob, const TileShape& shape, int64_t i0, int64_t j0, float* z) const {
  for (int r = 0; r < shape.nq; ++r) {
    const int64_t i = i0 + r;
    int c = 0;
    while (c < shape.nk) {  // one Philox draw covers the keys j with the same j / 8
      const int64_t j = j0 + c;
      const semantics::Philox4 draws = dropout.draws(batch_head, i, j >> 3);
      const int stop = int(std::min<int64_t>(shape.nk, c + (8 - (j & 7))));
      for (; c < stop; ++c) {
        const int x = r * shape.row + c * shape.col;
        const bool keep = semantics::Dropout::draw_of(draws, int((j0 + c) & 7)) >= dropout.threshold;
        const float f = keep ? dropout.inv_keep : 0.f;
        prob[x] *= f;
        if (z) z[x] = f;
      }
    }
  }
}

int cpu_threads(const Params& p) { return p.num_threads > 0 ? p.num_threads : omp_get_max_threads(); }

}  // namespace flashattn::cpu

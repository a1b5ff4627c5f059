#include "cpu/tile.h"

#include <cmath>
#include <limits>

#include <omp.h>

namespace flashattn::cpu {

void ScoreRule::transform(float* s, int ld, int64_t i0, int nq, int64_t j0, int nk, float* cap_grad) const {
  const bool all_visible = tile_visible(i0, nq, j0, nk);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < nq; ++r) {
    float* row = s + int64_t(r) * ld;
    float* grad = cap_grad ? cap_grad + int64_t(r) * ld : nullptr;
    for (int c = 0; c < nk; ++c) row[c] *= scale;
    if (softcap > 0) {
      const float inv = 1.f / softcap;
      for (int c = 0; c < nk; ++c) {
        const float t = std::tanh(row[c] * inv);
        row[c] = softcap * t;
        if (grad) grad[c] = 1.f - t * t;
      }
    }
    const int64_t i = i0 + r;
    if (alibi_slope != 0.f)
      for (int c = 0; c < nk; ++c) row[c] += semantics::alibi_bias<float>(alibi_slope, window, i, j0 + c);
    if (!all_visible)
      for (int c = 0; c < nk; ++c)
        if (!window.visible(i, j0 + c)) row[c] = neg_inf;
  }
}

void ScoreRule::apply_dropout(float* prob, int ld, int64_t i0, int nq, int64_t j0, int nk, float* z) const {
  for (int r = 0; r < nq; ++r) {
    const int64_t i = i0 + r;
    float* row = prob + int64_t(r) * ld;
    float* zrow = z ? z + int64_t(r) * ld : nullptr;
    int c = 0;
    while (c < nk) {  // one Philox draw covers the keys j with the same j / 8
      const int64_t j = j0 + c;
      const semantics::Philox4 draws = dropout.draws(batch_head, i, j >> 3);
      const int stop = int(std::min<int64_t>(nk, c + (8 - (j & 7))));
      for (; c < stop; ++c) {
        const float f = semantics::Dropout::draw_of(draws, int((j0 + c) & 7)) >= dropout.threshold ? dropout.inv_keep : 0.f;
        row[c] *= f;
        if (zrow) zrow[c] = f;
      }
    }
  }
}

int cpu_threads(const Params& p) { return p.num_threads > 0 ? p.num_threads : omp_get_max_threads(); }

}  // namespace flashattn::cpu

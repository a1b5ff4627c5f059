// CPU FlashAttention forward: each (batch, head, query tile) streams key/value tiles, keeping a
// running max m, running sum l and unnormalised output O per row (online softmax).
#include "cpu/passes.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/tile.h"

#include <omp.h>

namespace flashattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct ForwardScratch {
  float *q, *kt, *v, *s, *o, *m, *l, *row;

  static size_t floats(const Params& p) {
    const size_t d = p.head_dim, dv = p.head_dim_v;
    return Scratch::round_up(kBlockQ * d) + Scratch::round_up(d * kBlockK) + Scratch::round_up(kBlockK * dv) +
           Scratch::round_up(kBlockQ * kBlockK) + Scratch::round_up(kBlockQ * dv) + 2 * Scratch::round_up(kBlockQ) +
           Scratch::round_up(std::max(d, dv));
  }
  ForwardScratch(const Params& p, float* base) {
    Scratch a(base);
    q = a.take(kBlockQ * p.head_dim);
    kt = a.take(p.head_dim * kBlockK);
    v = a.take(kBlockK * p.head_dim_v);
    s = a.take(kBlockQ * kBlockK);
    o = a.take(kBlockQ * p.head_dim_v);
    m = a.take(kBlockQ);
    l = a.take(kBlockQ);
    row = a.take(std::max(p.head_dim, p.head_dim_v));
  }
};

// Online softmax over one tile of scores: updates m and l, rescales O, leaves P in s.
void online_softmax(float* s, int nq, int nk, float* m, float* l, float* o, int dv) {
  for (int r = 0; r < nq; ++r) {
    float* row = s + r * kBlockK;
    float m_new = m[r];
    for (int c = 0; c < nk; ++c) m_new = std::max(m_new, row[c]);
    if (m_new == kNegInf) {  // nothing visible yet in this row
      std::fill(row, row + nk, 0.f);
      continue;
    }
    const float correction = m[r] == kNegInf ? 0.f : std::exp(m[r] - m_new);
    for (int c = 0; c < nk; ++c) row[c] -= m_new;
    exp_inplace(row, nk);
    float sum = 0;
    for (int c = 0; c < nk; ++c) sum += row[c];
    l[r] = l[r] * correction + sum;
    m[r] = m_new;
    if (correction != 1.f)
      for (int x = 0; x < dv; ++x) o[r * dv + x] *= correction;
  }
}

void forward_tile(const Params& p, const RowCodec& codec, int b, int h, int64_t i0, ForwardScratch& w) {
  const int d = p.head_dim, dv = p.head_dim_v, hk = h / p.group_size();
  const ScoreRule rule = ScoreRule::make(p, b, h);
  const int nq = int(std::min<int64_t>(kBlockQ, rule.window.seqlen_q - i0));
  const int64_t qs = p.q_start(b), ks = p.k_start(b);

  load_tile(codec, p.q, b, qs, i0, nq, h, d, w.q, d);
  std::fill(w.m, w.m + nq, kNegInf);
  std::fill(w.l, w.l + nq, 0.f);
  std::fill(w.o, w.o + nq * dv, 0.f);

  const Span keys = keys_seen(rule.window, i0, nq);
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
    const int nk = int(std::min<int64_t>(kBlockK, keys.end - j0));
    load_tile_transposed(codec, p.k, b, ks, j0, nk, hk, d, w.kt, kBlockK, w.row);
    load_tile(codec, p.v, b, ks, j0, nk, hk, dv, w.v, dv);
    std::fill(w.s, w.s + nq * kBlockK, 0.f);
    gemm_nn(nq, nk, d, w.q, d, w.kt, kBlockK, w.s, kBlockK);  // S = Q K^T
    rule.transform(w.s, kBlockK, i0, nq, j0, nk, nullptr);
    online_softmax(w.s, nq, nk, w.m, w.l, w.o, dv);
    if (rule.dropout.enabled()) rule.apply_dropout(w.s, kBlockK, i0, nq, j0, nk, nullptr);
    gemm_nn(nq, dv, nk, w.s, kBlockK, w.v, dv, w.o, dv);  // O += P V
  }

  for (int r = 0; r < nq; ++r) {
    const bool empty = w.l[r] == 0.f;  // no visible key: out = 0, lse = -inf
    const float inv = empty ? 0.f : 1.f / w.l[r];
    for (int x = 0; x < dv; ++x) w.o[r * dv + x] *= inv;
    if (p.lse) p.lse[b * p.lse_batch + h * p.lse_head + qs + i0 + r] = empty ? kNegInf : w.m[r] + std::log(w.l[r]);
  }
  store_tile(codec, w.o, dv, p.out, b, qs, i0, nq, h, dv);
}

}  // namespace

size_t forward_workspace_bytes(const Params& p) {
  return size_t(cpu_threads(p)) * ForwardScratch::floats(p) * sizeof(float);
}

Status forward(const Params& p) {
  const RowCodec& codec = row_codec(p.dtype);
  const int threads = cpu_threads(p);
  const int64_t tiles_per_head = (p.seqlen_q + kBlockQ - 1) / kBlockQ;  // varlen: of the longest sequence
  const int64_t items = int64_t(p.batch) * p.heads_q * tiles_per_head;
  const size_t per_thread = ForwardScratch::floats(p);
#pragma omp parallel num_threads(threads)
  {
    ForwardScratch w(p, static_cast<float*>(p.workspace) + omp_get_thread_num() * per_thread);
    // Last query tiles first: under a causal mask they have the most keys.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t tile = tiles_per_head - 1 - item % tiles_per_head;
      const int h = int(item / tiles_per_head % p.heads_q);
      const int b = int(item / tiles_per_head / p.heads_q);
      if (tile * kBlockQ < p.seqlen_q_of(b)) forward_tile(p, codec, b, h, tile * kBlockQ, w);
    }
  }
  return Status::ok();
}

}  // namespace flashattn::cpu

// CPU FlashAttention backward. Scores are recomputed tile by tile from the saved lse, and dropout
// is redrawn, so no seqlen_q x seqlen_k buffer exists. Two passes keep every output element owned
// by one thread (deterministic, no atomics):
//   key pass:   per (batch, kv head, key tile): dV += P~^T dO, dK += dS^T Q over the group's heads;
//   query pass: per (batch, head, query tile): dQ += dS K.
// with P = exp(s - lse), dP = z * (dO V^T), D = rowsum(dO * O), dS = P * (dP - D) * softcap'.
#include <algorithm>
#include <cmath>
#include <limits>

#include <omp.h>

#include "cpu/passes.h"
#include "cpu/tile.h"

namespace flashattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Everything one (query tile, key tile) step needs; shared by both passes.
struct BackwardScratch {
  float *q, *dout, *delta, *lse;        // query side
  float *k, *kt, *vt;                    // key side
  float *s, *dp, *z, *cap_grad;          // the tile's P, dS, dropout factors, softcap'
  float *dropped;                        // P~ = z P when dropout is on
  const float* ptilde = nullptr;         // P~: `dropped`, or `s` without dropout
  float *acc_a, *acc_b;                  // dK, dV (key pass) or dQ (query pass)
  float* row;

  static size_t floats(const Params& p) {
    const size_t d = p.head_dim, dv = p.head_dim_v, bq = kBlockQ, bk = kBlockK;
    auto r = Scratch::round_up;
    return r(bq * d) + r(bq * dv) + 2 * r(bq) + r(bk * d) + r(d * bk) + r(dv * bk) + 5 * r(bq * bk) +
           r(std::max(bk, bq) * d) + r(bk * dv) + r(std::max(d, dv));
  }
  BackwardScratch(const Params& p, float* base) {
    const int d = p.head_dim, dv = p.head_dim_v;
    Scratch a(base);
    q = a.take(kBlockQ * d);
    dout = a.take(kBlockQ * dv);
    delta = a.take(kBlockQ);
    lse = a.take(kBlockQ);
    k = a.take(kBlockK * d);
    kt = a.take(d * kBlockK);
    vt = a.take(dv * kBlockK);
    s = a.take(kBlockQ * kBlockK);
    dp = a.take(kBlockQ * kBlockK);
    z = a.take(kBlockQ * kBlockK);
    cap_grad = a.take(kBlockQ * kBlockK);
    dropped = a.take(kBlockQ * kBlockK);
    acc_a = a.take(std::max(kBlockK, kBlockQ) * d);
    acc_b = a.take(kBlockK * dv);
    row = a.take(std::max(d, dv));
  }
};

struct Ctx {
  const Params& p;
  const RowCodec& codec;
};

// Query side of head h, rows [i0, i0 + nq): Q, dO, D = rowsum(dO * O), lse.
void load_query_side(const Ctx& c, int b, int h, int64_t i0, int nq, BackwardScratch& w) {
  const Params& p = c.p;
  const int d = p.head_dim, dv = p.head_dim_v;
  const int64_t qs = p.q_start(b);
  load_tile(c.codec, p.q, b, qs, i0, nq, h, d, w.q, d);
  load_tile(c.codec, p.dout, b, qs, i0, nq, h, dv, w.dout, dv);
  for (int r = 0; r < nq; ++r) {
    load_tile(c.codec, p.out, b, qs, i0 + r, 1, h, dv, w.row, dv);
    float dot = 0;
    for (int x = 0; x < dv; ++x) dot += w.dout[r * dv + x] * w.row[x];
    w.delta[r] = dot;
    w.lse[r] = p.lse[b * p.lse_batch + h * p.lse_head + qs + i0 + r];
  }
}

// Key side of kv head hk, keys [j0, j0 + nk): K^T and V^T (and K itself for the query pass).
void load_key_side(const Ctx& c, int b, int hk, int64_t j0, int nk, bool with_k, BackwardScratch& w) {
  const Params& p = c.p;
  const int64_t ks = p.k_start(b);
  load_tile_transposed(c.codec, p.k, b, ks, j0, nk, hk, p.head_dim, w.kt, kBlockK, w.row);
  load_tile_transposed(c.codec, p.v, b, ks, j0, nk, hk, p.head_dim_v, w.vt, kBlockK, w.row);
  if (with_k) load_tile(c.codec, p.k, b, ks, j0, nk, hk, p.head_dim, w.k, p.head_dim);
}

// From the loaded sides: w.s = P, w.ptilde = P~ (after dropout), w.dp = dS (without the scale).
void tile_gradients(const Ctx& c, const ScoreRule& rule, int64_t i0, int nq, int64_t j0, int nk, BackwardScratch& w) {
  const Params& p = c.p;
  const int d = p.head_dim, dv = p.head_dim_v;
  const bool capped = p.softcap > 0, dropout = rule.dropout.enabled();
  std::fill(w.s, w.s + nq * kBlockK, 0.f);
  gemm_nn(nq, nk, d, w.q, d, w.kt, kBlockK, w.s, kBlockK);  // S = Q K^T
  rule.transform(w.s, kBlockK, i0, nq, j0, nk, capped ? w.cap_grad : nullptr);
  for (int r = 0; r < nq; ++r) {  // P = exp(s - lse); rows without visible keys have P = 0
    float* row = w.s + r * kBlockK;
    const float lse = w.lse[r];
    if (lse == kNegInf) std::fill(row, row + nk, 0.f);
    else {
      for (int x = 0; x < nk; ++x) row[x] -= lse;
      exp_inplace(row, nk);
    }
  }
  std::fill(w.dp, w.dp + nq * kBlockK, 0.f);
  gemm_nn(nq, nk, dv, w.dout, dv, w.vt, kBlockK, w.dp, kBlockK);  // dP~ = dO V^T
  w.ptilde = w.s;
  if (dropout) {
    std::copy(w.s, w.s + nq * kBlockK, w.dropped);
    rule.apply_dropout(w.dropped, kBlockK, i0, nq, j0, nk, w.z);
    w.ptilde = w.dropped;
  }
  for (int r = 0; r < nq; ++r) {
    const float* prob = w.s + r * kBlockK;
    float* dp = w.dp + r * kBlockK;
    const float* z = w.z + r * kBlockK;
    const float* g = w.cap_grad + r * kBlockK;
    for (int x = 0; x < nk; ++x) {  // dS = P (z dP~ - D); dropped keys still get -P D
      float ds = prob[x] * ((dropout ? z[x] * dp[x] : dp[x]) - w.delta[r]);
      if (capped) ds *= g[x];
      dp[x] = ds;
    }
  }
}

void key_pass_tile(const Ctx& c, int b, int hk, int64_t j0, BackwardScratch& w) {
  const Params& p = c.p;
  const int d = p.head_dim, dv = p.head_dim_v;
  const int64_t ks = p.k_start(b);
  const int nk = int(std::min<int64_t>(kBlockK, p.seqlen_k_of(b) - j0));
  float* dk = w.acc_a;
  float* dvacc = w.acc_b;
  std::fill(dk, dk + nk * d, 0.f);
  std::fill(dvacc, dvacc + nk * dv, 0.f);
  load_key_side(c, b, hk, j0, nk, false, w);
  for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
    const ScoreRule rule = ScoreRule::make(p, b, h);
    const Span rows = queries_seeing(rule.window, j0, nk);
    for (int64_t i0 = rows.begin; i0 < rows.end; i0 += kBlockQ) {
      const int nq = int(std::min<int64_t>(kBlockQ, rows.end - i0));
      load_query_side(c, b, h, i0, nq, w);
      tile_gradients(c, rule, i0, nq, j0, nk, w);
      gemm_tn(nk, dv, nq, w.ptilde, kBlockK, w.dout, dv, dvacc, dv);  // dV += P~^T dO
      gemm_tn(nk, d, nq, w.dp, kBlockK, w.q, d, dk, d);          // dK += dS^T Q
    }
  }
  for (int x = 0; x < nk * d; ++x) dk[x] *= p.scale;
  store_tile(c.codec, dk, d, p.dk, b, ks, j0, nk, hk, d);
  store_tile(c.codec, dvacc, dv, p.dv, b, ks, j0, nk, hk, dv);
}

void query_pass_tile(const Ctx& c, int b, int h, int64_t i0, BackwardScratch& w) {
  const Params& p = c.p;
  const int d = p.head_dim;
  const int hk = h / p.group_size();
  const ScoreRule rule = ScoreRule::make(p, b, h);
  const int nq = int(std::min<int64_t>(kBlockQ, rule.window.seqlen_q - i0));
  float* dq = w.acc_a;
  std::fill(dq, dq + nq * d, 0.f);
  load_query_side(c, b, h, i0, nq, w);
  const Span keys = keys_seen(rule.window, i0, nq);
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
    const int nk = int(std::min<int64_t>(kBlockK, keys.end - j0));
    load_key_side(c, b, hk, j0, nk, true, w);
    tile_gradients(c, rule, i0, nq, j0, nk, w);
    gemm_nn(nq, d, nk, w.dp, kBlockK, w.k, d, dq, d);  // dQ += dS K
  }
  for (int x = 0; x < nq * d; ++x) dq[x] *= p.scale;
  store_tile(c.codec, dq, d, p.dq, b, p.q_start(b), i0, nq, h, d);
}

// Runs body(b, head, row0) over batch x heads x tiles of `tile` rows, longest sequences' last
// tiles first, on `threads` threads, each with its own scratch.
template <typename Body>
void parallel_tiles(const Params& p, int heads, int tile, bool keys, Body body) {
  const int64_t longest = keys ? p.seqlen_k : p.seqlen_q;
  const int64_t tiles = (longest + tile - 1) / tile;
  const int64_t items = int64_t(p.batch) * heads * tiles;
  const size_t per_thread = BackwardScratch::floats(p);
#pragma omp parallel num_threads(cpu_threads(p))
  {
    BackwardScratch w(p, static_cast<float*>(p.workspace) + omp_get_thread_num() * per_thread);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = keys ? item % tiles : tiles - 1 - item % tiles;
      const int h = int(item / tiles % heads);
      const int b = int(item / tiles / heads);
      const int64_t len = keys ? p.seqlen_k_of(b) : p.seqlen_q_of(b);
      if (t * tile < len) body(b, h, t * tile, w);
    }
  }
}

}  // namespace

size_t backward_workspace_bytes(const Params& p) {
  return size_t(cpu_threads(p)) * BackwardScratch::floats(p) * sizeof(float);
}

Status backward(const Params& p) {
  const Ctx c{p, row_codec(p.dtype)};
  parallel_tiles(p, p.heads_kv, kBlockK, true,
                 [&](int b, int hk, int64_t j0, BackwardScratch& w) { key_pass_tile(c, b, hk, j0, w); });
  parallel_tiles(p, p.heads_q, kBlockQ, false,
                 [&](int b, int h, int64_t i0, BackwardScratch& w) { query_pass_tile(c, b, h, i0, w); });
  return Status::ok();
}

}  // namespace flashattn::cpu

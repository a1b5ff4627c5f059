// CPU FlashAttention backward. Scores are recomputed tile by tile from the saved lse and dropout is
// redrawn, so no seqlen_q x seqlen_k buffer exists. Problems with many (batch, kv head) groups
// take a single pass per group (below), dQ accumulating in float32 (in the output itself, or for
// 16-bit gradients in a per-thread buffer of the group's rows); otherwise two passes keep every
// output element owned by one thread (deterministic, no atomics):
//   key pass:   per (batch, kv head, key tile): dV += P~^T dO and dK += dS^T Q over the group's heads;
//   query pass: per (batch, head, query tile): dQ += dS K.
// with P = exp(s - lse), dP = z * (dO V^T), D = rowsum(dO * O), dS = P * (dP - D) * softcap'.
// Each pass transposes its stationary side once per work item and packs the streamed rows per tile:
// the key pass works on query-major tiles (Q K^T), the query pass on key-major ones (K Q^T).
#include <algorithm>
#include <cmath>
#include <limits>

#include <omp.h>

#include "cpu/passes.h"
#include "cpu/tile.h"

namespace flashattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kTile = kBlockQ * kBlockK;  // floats of one score tile, either layout

bool use_single_pass(const Params& p);

// Floats of the float32 dQ of one group's query rows that a single pass over 16-bit gradients
// accumulates before converting (0 when dQ accumulates in a float32 output).
size_t dq_buffer_floats(const Params& p) {
  if (p.dtype == DType::f32 || !use_single_pass(p)) return 0;
  return size_t(p.group_size()) * size_t(p.seqlen_q) * size_t(p.head_dim);
}

// Floats of the query side of one (batch, kv head) group that a key pass reads for every key tile
// (Q and dO packed, D and lse per row, for each head of the group), kept whole per thread up to
// kMaxPackedFloats; 0 otherwise (the rows are then packed per tile).
size_t group_rows_floats(const Params& p) {
  const size_t whole = size_t(p.group_size()) * size_t(p.seqlen_q) * size_t(p.head_dim + p.head_dim_v + 2);
  return whole <= size_t(kMaxPackedFloats) ? whole : 0;
}

struct BackwardScratch {
  float *stationary_a, *stationary_b;  // K^T and V^T (key pass) or Q^T and dO^T (query pass)
  float *q, *dout, *o;                 // packed rows of the streamed side
  float* k_rows;                       // the key tile as rows (single-pass dQ)
  float *delta, *lse;                  // per query row of a tile
  const float *row_delta = nullptr, *row_lse = nullptr;  // D and lse of the current tile's rows
  float* group_rows;                   // group_rows_floats(): [group head][Q | dO | D | lse]
  int rows_b = -1, rows_hk = -1;       // the group group_rows holds
  float *s, *dp, *z, *cap_grad, *dropped;
  const float* ptilde = nullptr;       // P~: `dropped`, or `s` without dropout
  float *acc_a, *acc_b;                // dK, dV (key pass) or dQ (query pass)
  float* dq_buffer;                    // single pass, 16-bit gradients: [group head][query row][d]

  static size_t floats(const Params& p) {
    const size_t d = p.head_dim, dv = p.head_dim_v, rows = std::max(kBlockQ, kBlockK);
    auto r = Scratch::round_up;
    return r(d * rows) + r(dv * rows) + 2 * r(rows * d) + 2 * r(rows * dv) + 2 * r(kBlockQ) + 5 * r(kTile) +
           r(rows * d) + r(rows * dv) + r(dq_buffer_floats(p)) + r(group_rows_floats(p));
  }
  BackwardScratch(const Params& p, float* base) {
    const int d = p.head_dim, dv = p.head_dim_v, rows = std::max(kBlockQ, kBlockK);
    Scratch a(base);
    stationary_a = a.take(d * rows);
    stationary_b = a.take(dv * rows);
    q = a.take(rows * d);
    dout = a.take(rows * dv);
    o = a.take(rows * dv);
    k_rows = a.take(rows * d);
    delta = a.take(kBlockQ);
    lse = a.take(kBlockQ);
    s = a.take(kTile);
    dp = a.take(kTile);
    z = a.take(kTile);
    cap_grad = a.take(kTile);
    dropped = a.take(kTile);
    acc_a = a.take(rows * d);
    acc_b = a.take(rows * dv);
    dq_buffer = a.take(dq_buffer_floats(p));
    group_rows = a.take(group_rows_floats(p));
  }

  // Head g of the group in group_rows: Q rows, dO rows, D, lse (seqlen_q rows each).
  float* group_q(const Params& p, int g) const {
    return group_rows + size_t(g) * size_t(p.seqlen_q) * size_t(p.head_dim + p.head_dim_v + 2);
  }
  float* group_dout(const Params& p, int g) const { return group_q(p, g) + size_t(p.seqlen_q) * p.head_dim; }
  float* group_delta(const Params& p, int g) const { return group_dout(p, g) + size_t(p.seqlen_q) * p.head_dim_v; }
  float* group_lse(const Params& p, int g) const { return group_delta(p, g) + p.seqlen_q; }
};

struct Ctx {
  const Params& p;
  const RowCodec& codec;
};

// D = rowsum(dO * O) and lse of rows [i0, i0 + nq) of head h.
void load_row_stats(const Ctx& c, int b, int h, int64_t i0, int nq, const float* dout, BackwardScratch& w) {
  const Params& p = c.p;
  const int dv = p.head_dim_v;
  const int64_t qs = p.q_start(b);
  const float* o = pack_rows(c.codec, p.out, b, qs, i0, nq, h, dv, w.o);
  for (int r = 0; r < nq; ++r) {
    w.delta[r] = dot(dout + int64_t(r) * dv, o + int64_t(r) * dv, dv);
    w.lse[r] = p.lse[b * p.lse_batch + h * p.lse_head + qs + i0 + r];
  }
  w.row_delta = w.delta;
  w.row_lse = w.lse;
}

// Packs the query side of group (b, hk) into w.group_rows: Q and dO rows, D and lse.
void load_group_rows(const Ctx& c, int b, int hk, BackwardScratch& w) {
  const Params& p = c.p;
  const int d = p.head_dim, dv = p.head_dim_v, group = p.group_size();
  const int64_t qs = p.q_start(b), sq = p.seqlen_q_of(b);
  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    pack_rows(c.codec, p.q, b, qs, 0, int(sq), h, d, w.group_q(p, g));
    pack_rows(c.codec, p.dout, b, qs, 0, int(sq), h, dv, w.group_dout(p, g));
    for (int64_t i0 = 0; i0 < sq; i0 += kBlockQ) {
      const int nq = int(std::min<int64_t>(kBlockQ, sq - i0));
      load_row_stats(c, b, h, i0, nq, w.group_dout(p, g) + i0 * dv, w);
      std::copy(w.delta, w.delta + nq, w.group_delta(p, g) + i0);
      std::copy(w.lse, w.lse + nq, w.group_lse(p, g) + i0);
    }
  }
  w.rows_b = b;
  w.rows_hk = hk;
}

// From raw q.k products in w.s and raw dO.v products in w.dp (both in `shape`): w.s = P,
// w.ptilde = P~ (after dropout), w.dp = dS without the softmax scale.
FA_MULTIVERSION void tile_gradients(const Ctx& c, const ScoreRule& rule, const TileShape& shape, int64_t i0,
                                    int64_t j0, BackwardScratch& w) {
  const bool capped = c.p.softcap > 0, dropout = rule.dropout.enabled();
  rule.transform(w.s, shape, i0, j0, capped ? w.cap_grad : nullptr);
  // P = exp(s - lse); a row without visible keys (lse = -inf) has P = 0.
  float* s = w.s;
  const float* lse = w.row_lse;
  shape.for_each([&](int r, int, int x) { s[x] = lse[r] == kNegInf ? kNegInf : s[x] - lse[r]; });
  if (shape.is_key_major()) {
    for (int col = 0; col < shape.nk; ++col) exp_inplace(s + col * shape.col, shape.nq);
  } else {
    for (int row = 0; row < shape.nq; ++row) exp_inplace(s + row * shape.row, shape.nk);
  }
  w.ptilde = w.s;
  if (dropout) {
    std::copy(w.s, w.s + kTile, w.dropped);
    rule.apply_dropout(w.dropped, shape, i0, j0, w.z);
    w.ptilde = w.dropped;
  }
  float* dp = w.dp;
  const float *z = w.z, *g = w.cap_grad, *delta = w.row_delta;
  shape.for_each([&](int r, int, int x) {  // dS = P (z dP~ - D); dropped keys still get -P D
    float ds = s[x] * ((dropout ? z[x] * dp[x] : dp[x]) - delta[r]);
    if (capped) ds *= g[x];
    dp[x] = ds;
  });
}

// Where a single pass accumulates the float32 dQ of a group's query rows: the dq output itself, or
// a buffer of [group head][row][d].
struct DqRows {
  float* base = nullptr;
  int64_t head_stride = 0, row_stride = 0;

  float* row(int head_in_group, int64_t i) const { return base + head_in_group * head_stride + i * row_stride; }

  static DqRows of(const Params& p, int b, int hk, const BackwardScratch& w) {
    if (p.dtype != DType::f32) return {w.dq_buffer, int64_t(p.seqlen_q_of(b)) * p.head_dim, p.head_dim};
    float* first = static_cast<float*>(p.dq.data) + element_offset(p.dq, b, p.q_start(b), 0, hk * p.group_size());
    return {first, p.dq.head, p.dq.row};
  }
};

// dV and dK of keys [j0, j0 + nk) of kv head hk. With `dq` (single pass) it also adds dS K into
// the group's float32 dQ rows, unscaled.
void key_pass_tile(const Ctx& c, int b, int hk, int64_t j0, BackwardScratch& w, const DqRows* dq_rows) {
  const Params& p = c.p;
  const int d = p.head_dim, dv = p.head_dim_v;
  const int64_t ks = p.k_start(b), qs = p.q_start(b);
  const int nk = int(std::min<int64_t>(kBlockK, p.seqlen_k_of(b) - j0));
  float *kt = w.stationary_a, *vt = w.stationary_b, *dk = w.acc_a, *dvacc = w.acc_b;
  load_transposed(c.codec, p.k, b, ks, j0, nk, hk, d, kt, kBlockK);
  load_transposed(c.codec, p.v, b, ks, j0, nk, hk, dv, vt, kBlockK);
  const float* k_rows = dq_rows ? pack_rows(c.codec, p.k, b, ks, j0, nk, hk, d, w.k_rows) : nullptr;
  std::fill(dk, dk + nk * d, 0.f);
  std::fill(dvacc, dvacc + nk * dv, 0.f);
  const bool whole_group = group_rows_floats(p) > 0;
  if (whole_group && (w.rows_b != b || w.rows_hk != hk)) load_group_rows(c, b, hk, w);
  for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
    const ScoreRule rule = ScoreRule::make(p, b, h);
    const Span rows = queries_seeing(rule.window, j0, nk);
    for (int64_t i0 = rows.begin; i0 < rows.end; i0 += kBlockQ) {
      const int nq = int(std::min<int64_t>(kBlockQ, rows.end - i0));
      const TileShape shape = TileShape::query_major(nq, nk, kBlockK);
      const int g = h - hk * p.group_size();
      const float *q, *dout;
      if (whole_group) {
        q = w.group_q(p, g) + i0 * d;
        dout = w.group_dout(p, g) + i0 * dv;
        w.row_delta = w.group_delta(p, g) + i0;
        w.row_lse = w.group_lse(p, g) + i0;
      } else {
        q = pack_rows(c.codec, p.q, b, qs, i0, nq, h, d, w.q);
        dout = pack_rows(c.codec, p.dout, b, qs, i0, nq, h, dv, w.dout);
        load_row_stats(c, b, h, i0, nq, dout, w);
      }
      gemm_nn_set(nq, nk, d, q, d, kt, kBlockK, w.s, kBlockK);          // S = Q K^T
      gemm_nn_set(nq, nk, dv, dout, dv, vt, kBlockK, w.dp, kBlockK);  // dP~ = dO V^T
      tile_gradients(c, rule, shape, i0, j0, w);
      gemm_tn(nk, dv, nq, w.ptilde, kBlockK, dout, dv, dvacc, dv);  // dV += P~^T dO
      gemm_tn(nk, d, nq, w.dp, kBlockK, q, d, dk, d);                 // dK += dS^T Q
      if (dq_rows) {
        float* dq = dq_rows->row(h - hk * p.group_size(), i0);
        gemm_nn(nq, d, nk, w.dp, kBlockK, k_rows, d, dq, int(dq_rows->row_stride));  // dQ += dS K
      }
    }
  }
  for (int x = 0; x < nk * d; ++x) dk[x] *= p.scale;
  store_rows(c.codec, dk, d, p.dk, b, ks, j0, nk, hk, d);
  store_rows(c.codec, dvacc, dv, p.dv, b, ks, j0, nk, hk, dv);
}

void query_pass_tile(const Ctx& c, int b, int h, int64_t i0, BackwardScratch& w) {
  const Params& p = c.p;
  const int d = p.head_dim, dv = p.head_dim_v, hk = h / p.group_size();
  const int64_t ks = p.k_start(b), qs = p.q_start(b);
  const ScoreRule rule = ScoreRule::make(p, b, h);
  const int nq = int(std::min<int64_t>(kBlockQ, rule.window.seqlen_q - i0));
  float *qt = w.stationary_a, *dot = w.stationary_b, *dq = w.acc_a;
  load_transposed(c.codec, p.q, b, qs, i0, nq, h, d, qt, kBlockQ);
  load_transposed(c.codec, p.dout, b, qs, i0, nq, h, dv, dot, kBlockQ);
  load_row_stats(c, b, h, i0, nq, pack_rows(c.codec, p.dout, b, qs, i0, nq, h, dv, w.dout), w);
  std::fill(dq, dq + nq * d, 0.f);
  const Span keys = keys_seen(rule.window, i0, nq);
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
    const int nk = int(std::min<int64_t>(kBlockK, keys.end - j0));
    const TileShape shape = TileShape::key_major(nq, nk, kBlockQ);
    const float* k = pack_rows(c.codec, p.k, b, ks, j0, nk, hk, d, w.q);
    const float* v = pack_rows(c.codec, p.v, b, ks, j0, nk, hk, dv, w.o);
    gemm_nn_set(nk, nq, d, k, d, qt, kBlockQ, w.s, kBlockQ);     // S^T = K Q^T
    gemm_nn_set(nk, nq, dv, v, dv, dot, kBlockQ, w.dp, kBlockQ);  // dP~^T = V dO^T
    tile_gradients(c, rule, shape, i0, j0, w);
    gemm_tn(nq, d, nk, w.dp, kBlockQ, k, d, dq, d);          // dQ += dS K
  }
  for (int x = 0; x < nq * d; ++x) dq[x] *= p.scale;
  store_rows(c.codec, dq, d, p.dq, b, qs, i0, nq, h, d);
}

// Single pass over (batch, kv head): every key tile in order, dQ of the group's heads accumulated
// in float32; 5 tile products per tile pair instead of the two passes' 7.
void single_pass_group(const Ctx& c, int b, int hk, BackwardScratch& w) {
  const Params& p = c.p;
  const int d = p.head_dim, group = p.group_size();
  const int64_t qs = p.q_start(b), sq = p.seqlen_q_of(b), sk = p.seqlen_k_of(b);
  const DqRows dq = DqRows::of(p, b, hk, w);
  for (int g = 0; g < group; ++g)
    for (int64_t i = 0; i < sq; ++i) std::fill(dq.row(g, i), dq.row(g, i) + d, 0.f);
  for (int64_t j0 = 0; j0 < sk; j0 += kBlockK) key_pass_tile(c, b, hk, j0, w, &dq);
  for (int g = 0; g < group; ++g) {
    for (int64_t i = 0; i < sq; ++i)
      for (float *x = dq.row(g, i), *end = x + d; x < end; ++x) *x *= p.scale;
    if (p.dtype != DType::f32)  // the buffer's rows, converted, in pieces of at most kBlockQ rows
      for (int64_t i0 = 0; i0 < sq; i0 += kBlockQ)
        store_rows(c.codec, dq.row(g, i0), d, p.dq, b, qs, i0, int(std::min<int64_t>(kBlockQ, sq - i0)),
                   hk * group + g, d);
  }
}

// The single pass needs enough (batch, kv head) groups to occupy the threads and, for 16-bit
// gradients, a float32 dQ buffer of a group's rows of at most 32 MiB per thread. The choice depends
// on the shape only, never on the thread count, so results stay bit-identical however many
// threads run.
bool use_single_pass(const Params& p) {
  constexpr int64_t kMinGroups = 8, kMaxBufferFloats = int64_t(8) << 20;
  if (int64_t(p.batch) * p.heads_kv < kMinGroups) return false;
  if (p.dtype == DType::f32) return p.dq.row <= INT32_MAX;
  return int64_t(p.group_size()) * p.seqlen_q * p.head_dim <= kMaxBufferFloats;
}

// Runs body(item, scratch) for items [0, n) on the CPU's threads, each with its own scratch.
template <typename Body>
void parallel_items(const Params& p, int64_t n, Body body) {
  const size_t per_thread = BackwardScratch::floats(p);
  const int threads = int(std::min<int64_t>(cpu_threads(p), n));  // idle threads would only spin
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    BackwardScratch w(p, static_cast<float*>(p.workspace) + omp_get_thread_num() * per_thread);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n; ++item) body(item, w);
  }
}

// Runs body(b, head, row0, scratch) over batch x heads x tiles of `tile` rows; query tiles run
// last-first, since under a causal mask they see the most keys.
template <typename Body>
void parallel_tiles(const Params& p, int heads, int tile, bool keys, Body body) {
  const int64_t longest = keys ? p.seqlen_k : p.seqlen_q;
  const int64_t tiles = (longest + tile - 1) / tile;
  parallel_items(p, int64_t(p.batch) * heads * tiles, [&](int64_t item, BackwardScratch& w) {
    const int64_t t = keys ? item % tiles : tiles - 1 - item % tiles;
    const int h = int(item / tiles % heads);
    const int b = int(item / tiles / heads);
    const int64_t len = keys ? p.seqlen_k_of(b) : p.seqlen_q_of(b);
    if (t * tile < len) body(b, h, t * tile, w);
  });
}

}  // namespace

size_t backward_workspace_bytes(const Params& p) {
  return size_t(cpu_threads(p)) * BackwardScratch::floats(p) * sizeof(float);
}

Status backward(const Params& p) {
  const Ctx c{p, row_codec(p.dtype)};
  if (use_single_pass(p)) {
    parallel_items(p, int64_t(p.batch) * p.heads_kv, [&](int64_t g, BackwardScratch& w) {
      single_pass_group(c, int(g / p.heads_kv), int(g % p.heads_kv), w);
    });
    return Status::ok();
  }
  parallel_tiles(p, p.heads_kv, kBlockK, true,
                 [&](int b, int hk, int64_t j0, BackwardScratch& w) { key_pass_tile(c, b, hk, j0, w, nullptr); });
  parallel_tiles(p, p.heads_q, kBlockQ, false,
                 [&](int b, int h, int64_t i0, BackwardScratch& w) { query_pass_tile(c, b, h, i0, w); });
  return Status::ok();
}

}  // namespace flashattn::cpu

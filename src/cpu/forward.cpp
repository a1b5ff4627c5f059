// CPU FlashAttention forward. A work item is a tile of up to kBlockQ query rows of one (batch,
// head), or, for decoding-shaped calls, one slice of its keys. It keeps a running max m, running
// sum l and unnormalised output O per row (online softmax) while key/value tiles stream past.
// Scores are computed key-major, S^T = K Q^T, so Q is transposed once per item; K and V are packed
// (rows of one head lie a multiple of 4 KiB apart in common layouts and would alias in L1) once
// per (batch, kv head) a thread meets, into a per-thread copy of the head's keys when that is at
// most 16 MiB, else per tile. The softmax's per-row reductions run down columns, vectorised
// across rows.
#include <algorithm>
#include <cmath>
#include <limits>

#include <omp.h>

#include "cpu/passes.h"
#include "cpu/tile.h"

namespace flashattn::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Below this many query rows (decoding), scores are dot products of rows: a tile product with
// so few columns would leave the vector lanes empty.
constexpr int kFewRows = 16;

// Work decomposition, a function of the problem's shape only (never of the thread count), so
// results are bit-identical however many threads run.
struct ForwardPlan {
  int64_t q_tiles = 0;   // per (batch, head), of the longest sequence
  int64_t splits = 1;    // key slices per query tile
  int64_t items() const { return batch_heads * q_tiles * splits; }
  int64_t batch_heads = 0;

  static ForwardPlan make(const Params& p) {
    ForwardPlan plan;
    plan.batch_heads = int64_t(p.batch) * p.heads_q;
    plan.q_tiles = (p.seqlen_q + kBlockQ - 1) / kBlockQ;
    // Few query tiles and many keys (decoding): slice the keys so that about kTargetItems items
    // exist, each with at least kMinKeysPerSplit keys.
    constexpr int64_t kTargetItems = 32, kMinKeysPerSplit = 1024;
    const int64_t tiles = plan.batch_heads * plan.q_tiles;
    if (tiles > 0 && tiles < kTargetItems && !p.varlen())
      plan.splits = std::clamp<int64_t>(std::min(kTargetItems / tiles, p.seqlen_k / kMinKeysPerSplit), 1, kTargetItems);
    return plan;
  }
  // Keys [begin, end) of `keys` that slice `split` covers (whole tiles of kBlockK).
  Span slice(const Span& keys, int64_t split) const {
    if (splits == 1) return keys;
    const int64_t tiles = (keys.end - keys.begin + kBlockK - 1) / kBlockK;
    const int64_t per = (tiles + splits - 1) / splits;
    const int64_t b = std::min(keys.end, keys.begin + split * per * kBlockK);
    return Span{b, std::min(keys.end, b + per * kBlockK)};
  }
};

// Rows of K and V a thread keeps packed: a whole head's keys (up to kMaxPackedFloats), else one
// tile. A function of the shape only.
int64_t packed_key_rows(const Params& p) {
  const int64_t whole = int64_t(p.seqlen_k) * (p.head_dim + p.head_dim_v);
  return whole <= kMaxPackedFloats && p.seqlen_k > kBlockK ? p.seqlen_k : kBlockK;
}

// Per-thread scratch.
struct ForwardScratch {
  float *qt, *q, *k, *v, *s, *o, *m, *l, *corr;
  int packed_b = -1, packed_hk = -1;  // the head whose keys k and v hold whole, if any

  static size_t floats(const Params& p) {
    const size_t d = p.head_dim, dv = p.head_dim_v, keys = size_t(packed_key_rows(p));
    auto r = Scratch::round_up;
    return r(d * kBlockQ) + r(kFewRows * d) + r(keys * d) + r(keys * dv) + r(kBlockK * kBlockQ) + r(kBlockQ * dv) + 3 * r(kBlockQ);
  }
  ForwardScratch(const Params& p, float* base) {
    Scratch a(base);
    const int64_t keys = packed_key_rows(p);
    qt = a.take(p.head_dim * kBlockQ);
    q = a.take(kFewRows * p.head_dim);
    k = a.take(keys * p.head_dim);
    v = a.take(keys * p.head_dim_v);
    s = a.take(kBlockK * kBlockQ);
    o = a.take(kBlockQ * p.head_dim_v);
    m = a.take(kBlockQ);
    l = a.take(kBlockQ);
    corr = a.take(kBlockQ);
    // The softmax step reads whole vectors of query lanes past nq, which the few-rows path of
    // attend() leaves unwritten: keep them initialised.
    std::fill(s, s + kBlockK * kBlockQ, 0.f);
  }
};

// Partial results of one key slice, combined after all slices ran: m, l, then O [kBlockQ x dv].
size_t partial_floats(const Params& p) { return size_t(kBlockQ) * (2 + p.head_dim_v); }

// Online softmax over a key-major tile s[nk][kBlockQ]: updates m and l, rescales O, leaves P in s.
void online_softmax(float* s, int nq, int nk, ForwardScratch& w, int dv) {
  online_softmax_step(s, kBlockQ, nq, nk, w.m, w.l, w.corr);
  for (int r = 0; r < nq; ++r)
    if (w.corr[r] != 1.f)
      for (int x = 0; x < dv; ++x) w.o[r * dv + x] *= w.corr[r];
}

struct Ctx {
  const Params& p;
  const RowCodec& codec;
  ForwardPlan plan;
};

// Streams keys `keys` past query rows [i0, i0 + nq) of head h: leaves m, l and O in w.
void attend(const Ctx& c, const ScoreRule& rule, int b, int h, int64_t i0, int nq, Span keys, ForwardScratch& w) {
  const Params& p = c.p;
  const int d = p.head_dim, dv = p.head_dim_v, hk = h / p.group_size();
  const int64_t ks = p.k_start(b);
  const bool few = nq < kFewRows;
  const float* q = few ? pack_rows(c.codec, p.q, b, p.q_start(b), i0, nq, h, d, w.q) : nullptr;
  if (!few) load_transposed(c.codec, p.q, b, p.q_start(b), i0, nq, h, d, w.qt, kBlockQ);
  std::fill(w.m, w.m + kBlockQ, kNegInf);
  std::fill(w.l, w.l + kBlockQ, 0.f);
  std::fill(w.o, w.o + nq * dv, 0.f);
  const bool whole_head = packed_key_rows(p) > kBlockK;
  if (whole_head && (w.packed_b != b || w.packed_hk != hk)) {
    const int n = p.seqlen_k_of(b);
    pack_rows(c.codec, p.k, b, ks, 0, n, hk, d, w.k);
    pack_rows(c.codec, p.v, b, ks, 0, n, hk, dv, w.v);
    w.packed_b = b;
    w.packed_hk = hk;
  }
  for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
    const int nk = int(std::min<int64_t>(kBlockK, keys.end - j0));
    const TileShape shape = TileShape::key_major(nq, nk, kBlockQ);
    const float* k = whole_head ? w.k + j0 * d : pack_rows(c.codec, p.k, b, ks, j0, nk, hk, d, w.k);
    const float* v = whole_head ? w.v + j0 * dv : pack_rows(c.codec, p.v, b, ks, j0, nk, hk, dv, w.v);
    if (few) {
      for (int j = 0; j < nk; ++j)
        for (int r = 0; r < nq; ++r) w.s[j * kBlockQ + r] = dot(k + int64_t(j) * d, q + int64_t(r) * d, d);
    } else {
      gemm_nn_set(nk, nq, d, k, d, w.qt, kBlockQ, w.s, kBlockQ);  // S^T = K Q^T
    }
    rule.transform(w.s, shape, i0, j0, nullptr);
    online_softmax(w.s, nq, nk, w, dv);
    if (rule.dropout.enabled()) rule.apply_dropout(w.s, shape, i0, j0, nullptr);
    gemm_tn(nq, dv, nk, w.s, kBlockQ, v, dv, w.o, dv);  // O += P V
  }
}

// out = O / l and lse = m + log l; a row without visible keys gets out = 0, lse = -inf.
void write_rows(const Ctx& c, int b, int h, int64_t i0, int nq, const float* m, const float* l, float* o) {
  const Params& p = c.p;
  const int dv = p.head_dim_v;
  const int64_t qs = p.q_start(b);
  for (int r = 0; r < nq; ++r) {
    const bool empty = l[r] == 0.f;
    const float inv = empty ? 0.f : 1.f / l[r];
    for (int x = 0; x < dv; ++x) o[r * dv + x] *= inv;
    if (p.lse) p.lse[b * p.lse_batch + h * p.lse_head + qs + i0 + r] = empty ? kNegInf : m[r] + std::log(l[r]);
  }
  store_rows(c.codec, o, dv, p.out, b, qs, i0, nq, h, dv);
}

// Merges the slices of one query tile in slice order: m = max m_s, l = sum l_s e^(m_s - m), same for O.
void combine_slices(const Ctx& c, int b, int h, int64_t i0, int nq, const float* partials, ForwardScratch& w) {
  const int dv = c.p.head_dim_v;
  const size_t stride = partial_floats(c.p);
  std::fill(w.m, w.m + nq, kNegInf);
  for (int64_t s = 0; s < c.plan.splits; ++s)
    for (int r = 0; r < nq; ++r) w.m[r] = std::max(w.m[r], partials[s * stride + r]);
  std::fill(w.l, w.l + nq, 0.f);
  std::fill(w.o, w.o + nq * dv, 0.f);
  for (int64_t s = 0; s < c.plan.splits; ++s) {
    const float* part = partials + s * stride;
    for (int r = 0; r < nq; ++r) {
      if (part[kBlockQ + r] == 0.f) continue;  // slice saw no key of this row
      const float f = std::exp(part[r] - w.m[r]);
      w.l[r] += f * part[kBlockQ + r];
      for (int x = 0; x < dv; ++x) w.o[r * dv + x] += f * part[2 * kBlockQ + r * dv + x];
    }
  }
  write_rows(c, b, h, i0, nq, w.m, w.l, w.o);
}

}  // namespace

size_t forward_workspace_bytes(const Params& p) {
  const ForwardPlan plan = ForwardPlan::make(p);
  const size_t partials = plan.splits > 1 ? size_t(plan.items()) * partial_floats(p) : 0;
  return (size_t(cpu_threads(p)) * ForwardScratch::floats(p) + partials) * sizeof(float);
}

Status forward(const Params& p) {
  const Ctx c{p, row_codec(p.dtype), ForwardPlan::make(p)};
  const ForwardPlan& plan = c.plan;
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(cpu_threads(p), plan.items())));  // idle threads would only spin
  const size_t per_thread = ForwardScratch::floats(p);
  float* partials = static_cast<float*>(p.workspace) + threads * per_thread;
  const int64_t per_head = plan.q_tiles * plan.splits;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    ForwardScratch w(p, static_cast<float*>(p.workspace) + omp_get_thread_num() * per_thread);
    // Last query tiles first: under a causal mask they have the most keys.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < plan.items(); ++item) {
      const int64_t tile = plan.q_tiles - 1 - item % per_head / plan.splits, split = item % plan.splits;
      const int h = int(item / per_head % p.heads_q), b = int(item / per_head / p.heads_q);
      const ScoreRule rule = ScoreRule::make(p, b, h);
      const int64_t i0 = tile * kBlockQ;
      if (i0 >= rule.window.seqlen_q) continue;
      const int nq = int(std::min<int64_t>(kBlockQ, rule.window.seqlen_q - i0));
      const Span keys = plan.slice(keys_seen(rule.window, i0, nq), split);
      attend(c, rule, b, h, i0, nq, keys, w);
      if (plan.splits == 1) {
        write_rows(c, b, h, i0, nq, w.m, w.l, w.o);
      } else {
        float* part = partials + item * partial_floats(p);
        std::copy(w.m, w.m + kBlockQ, part);
        std::copy(w.l, w.l + kBlockQ, part + kBlockQ);
        std::copy(w.o, w.o + nq * p.head_dim_v, part + 2 * kBlockQ);
      }
    }
    if (plan.splits > 1) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < plan.batch_heads * plan.q_tiles; ++t) {
        const int64_t tile = t % plan.q_tiles;
        const int h = int(t / plan.q_tiles % p.heads_q), b = int(t / plan.q_tiles / p.heads_q);
        const int64_t i0 = tile * kBlockQ;
        const int nq = int(std::min<int64_t>(kBlockQ, p.seqlen_q - i0));
        // Items of this tile: same (b, h), tile index counted from the end.
        const int64_t first = (int64_t(b) * p.heads_q + h) * per_head + (plan.q_tiles - 1 - tile) * plan.splits;
        combine_slices(c, b, h, i0, nq, partials + first * partial_floats(p), w);
      }
    }
  }
  return Status::ok();
}

}  // namespace flashattn::cpu

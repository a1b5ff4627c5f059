// FlashAttention-2 forward on mma.sync. One thread block owns a tile of kM query rows of one
// (batch, head); each warp owns 16 of those rows, so a row's scores, max and sum never leave the
// quad of lanes that holds them. Key/value tiles stream through shared memory with cp.async:
// V[n] loads while S = Q K[n]^T runs, K[n-1] while the softmax and O += P V[n] run. Key blocks
// are visited from the last to the first, so only the first step meets the end of the keys.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/common/cp_async.cuh"
#include "cuda/common/ldmatrix.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/numeric.cuh"
#include "cuda/common/smem.cuh"
#include "cuda/common/warp.cuh"
#include "cuda/head_groups.h"
#include "cuda/sm80/attention_common.cuh"
#include "cuda/sm80/tile_shapes.h"

namespace flashattn::cuda {

// The configuration of the forward kernel of one kind (forward_shape).
template <typename T, int kD, bool kDropout, bool kGeneral>
struct ForwardConfig {
  static constexpr ForwardShape kShape = forward_shape(kD, kDropout, kGeneral);
  static constexpr int kM = kShape.block_m, kN = kShape.block_n, kWarps = kShape.warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowTiles = kM / (16 * kWarps);  // 16-row mma tiles per warp
  static_assert(kM == 16 * kRowTiles * kWarps, "warps split the query rows in 16-row tiles");
  static_assert(kN % 32 == 0, "dropout draws keys in groups of 4 x 8");
  using QTile = SmemTile<kM, kD>;
  using KVTile = SmemTile<kN, kD>;
  static constexpr int kSmemBytes = QTile::kBytes + 2 * KVTile::kBytes;
  static constexpr int kScoreTiles = kN / 8;  // n8 accumulator tiles of a 16-row score tile
  static constexpr int kOutTiles = kD / 8;    // n8 accumulator tiles of a 16-row output tile
  static constexpr int kCopyParts = kShape.copy_parts;
  // V's parts go in S's first k-steps, K's in every other of P V's first kD / 16 steps.
  static_assert(copy_parts_fit(kCopyParts, kD));
};

// Dynamic shared memory of the largest of a variant's forward kernels.
template <typename T, int kD>
constexpr int forward_max_smem() {
  return std::max({ForwardConfig<T, kD, false, false>::kSmemBytes, ForwardConfig<T, kD, false, true>::kSmemBytes,
                   ForwardConfig<T, kD, true, false>::kSmemBytes, ForwardConfig<T, kD, true, true>::kSmemBytes});
}

// Per-lane state of the online softmax for the lane's two rows (g and g + 8) of each row tile.
template <int kRowTiles>
struct RowState {
  float max[kRowTiles][2];  // of the stored scores (raw or log2-domain, see ScoreRule)
  float sum[kRowTiles][2];  // this lane's part of sum(P), before dropout
  __device__ RowState() {
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        max[r][half] = -INFINITY;
        sum[r][half] = 0.f;
      }
  }
};

namespace forward_detail {

constexpr float kNegInf = -INFINITY;

// The window diagonals of this lane's two rows, lane / 4 and lane / 4 + 8, of the 16-row tile
// that starts at sequence row row0 (a folded row's takes a remainder: derive it outside loops).
__device__ __forceinline__ void lane_diagonals(const semantics::Window& window, int row0, int (&diag)[2]) {
  const int row = row0 + int(threadIdx.x % 32) / 4;
  diag[0] = int(window.diagonal(row));
  diag[1] = int(window.diagonal(row + 8));
}

// General scores of a 16 x kN tile after S = Q K^T: raw q.k -> log2-domain transformed score,
// the rows lane / 4 and lane / 4 + 8 on diagonals diag[0] and diag[1].
template <int kTiles>
__device__ __forceinline__ void transform_scores_at(float (&s)[kTiles][4], const ScoreRule& rule, const int (&diag)[2],
                                                    int64_t j0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t j = j0 + nt * 8 + (lane % 4) * 2 + (e % 2);
      s[nt][e] = rule.transform_at<int64_t>(s[nt][e], diag[e / 2], j);
    }
}

// The same from sequence row row0 (diagonals derived once per call).
template <int kTiles>
__device__ __forceinline__ void transform_scores(float (&s)[kTiles][4], const ScoreRule& rule, int64_t row0,
                                                 int64_t j0) {
  int diag[2];
  lane_diagonals(rule.window, int(row0), diag);
  transform_scores_at(s, rule, diag, j0);
}

// Masks a 16 x kN score tile whose rows lane / 4 and lane / 4 + 8 lie on diagonals diag[0] and
// diag[1]: key j of a row on diagonal c stays iff first_key_at(c) <= j <= last_key_at(c). The
// bounds are derived here, in 32 bits, so that nothing of the mask stays live across the key loop.
template <int kTiles>
__device__ __forceinline__ void apply_mask_at(float (&s)[kTiles][4], const semantics::Window& window,
                                              const int (&diag)[2], int j0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int first = int(window.first_key_at(diag[half]));
    const int last = int(max(window.last_key_at(diag[half]), int64_t(-1)));
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = j0 + nt * 8 + (lane % 4) * 2 + e;
        if (j < first || j > last) s[nt][2 * half + e] = kNegInf;
      }
  }
}

// The same for the 16-row tile from sequence row row0 (diagonals derived per call).
template <int kTiles>
__device__ __forceinline__ void apply_mask(float (&s)[kTiles][4], const semantics::Window& window, int row0,
                                           int j0) {
  int diag[2];
  lane_diagonals(window, row0, diag);
  apply_mask_at(s, window, diag, j0);
}

// Lazy rescaling (kLazy: the sm80 forward's above d = 128, where a thread's output accumulators
// outnumber its scores at least twice; the sm90 forward's from d = 128, see its Consumer): the
// running row maximum moves only when a key block's maximum exceeds it by more than 2^8 after
// the scale. Probabilities then stay below 2^8, which fp32 sums and 16-bit P hold as precisely
// as values below 1; most key blocks leave the maximum, and so O, as they are (correction 1,
// rescale_output skipped); the sums and lse refer to the maximum kept, so the result is the
// same. In the sm80 forward below d = 128 the test costs about what it saves.
constexpr float kLazyGrowthLog2 = 8.f;

// Online softmax of a 16-row tile without touching O: new row maxima, the factor by which the
// output and sums of earlier key blocks shrink (`correction`), the running sums, and S -> P
// (before dropout). exp_scale > 0.
template <bool kLazy, int kTiles>
__device__ __forceinline__ void exponentiate_scores(float (&s)[kTiles][4], float (&row_max)[2], float (&row_sum)[2],
                                                    float exp_scale, float (&correction)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = row_max[half];
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * half], s[nt][2 * half + 1]));
    mx = quad_max(mx);
    // A row with nothing visible yet keeps max = -inf; subtracting 0 then keeps P = 0 (no NaN).
    // Lazy: from -inf any finite maximum grows (inf > 2^8); -inf to -inf is NaN, which does not.
    const bool grow = !kLazy || (mx - row_max[half]) * exp_scale > kLazyGrowthLog2;
    const float kept = grow ? mx : row_max[half];
    const float shift = kept == kNegInf ? 0.f : kept * exp_scale;
    correction[half] = grow ? fast_exp2(row_max[half] * exp_scale - shift) : 1.f;
    row_max[half] = kept;
    row_sum[half] *= correction[half];
#pragma unroll
    for (int nt = 0; nt < kTiles; ++nt)
#pragma unroll
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        s[nt][e] = fast_exp2(fmaf(s[nt][e], exp_scale, -shift));
        row_sum[half] += s[nt][e];
      }
  }
}

// O *= correction per row; lazy: skipped when no row of the warp moved its maximum (the call
// must be warp-uniform).
template <bool kLazy, int kOutTiles>
__device__ __forceinline__ void rescale_output(float (&o)[kOutTiles][4], const float (&correction)[2]) {
  if (kLazy && !__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f)) return;
#pragma unroll
  for (int dt = 0; dt < kOutTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] *= correction[e / 2];
}

// Whether a forward of head dim kD rescales lazily (see kLazyGrowthLog2).
template <int kD>
constexpr bool kLazyRescale = kD > 128;

// Online softmax step of a 16-row tile: new row maxima, rescale of O and of the running sums,
// S -> P (before dropout).
template <bool kLazy, int kTiles, int kOutTiles>
__device__ __forceinline__ void softmax_step(float (&s)[kTiles][4], float (&o)[kOutTiles][4], float (&row_max)[2],
                                             float (&row_sum)[2], float exp_scale) {
  float correction[2];
  exponentiate_scores<kLazy>(s, row_max, row_sum, exp_scale, correction);
  rescale_output<kLazy>(o, correction);
}

// Zeroes the dropped probabilities of a 16-row tile. One Philox call gives the draws of 8 keys
// of a row; each lane of a quad computes one of 4 consecutive n8 tiles and a quad transpose hands
// every lane the 32-bit word (its two keys) of each tile.
template <int kTiles>
__device__ __forceinline__ void apply_dropout(float (&s)[kTiles][4], const semantics::Dropout& drop,
                                              int64_t batch_head, int64_t row0, int64_t j0) {
  static_assert(kTiles % 4 == 0, "dropout groups 4 n8 tiles");
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = row0 + lane / 4 + half * 8;
#pragma unroll
    for (int group = 0; group < kTiles / 4; ++group) {
      const semantics::Philox4 r = drop.draws(batch_head, i, (j0 >> 3) + group * 4 + lane % 4);
      uint32_t words[4] = {r.x[0], r.x[1], r.x[2], r.x[3]};
      quad_transpose(words);  // words[q] = word (lane % 4) of tile group * 4 + q
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (((words[q] >> (16 * e)) & 0xFFFFu) < drop.threshold) s[group * 4 + q][2 * half + e] = 0.f;
    }
  }
}

// Epilogue of a 16-row tile: O / l (and / (1 - p) for dropout); lse = max + log(l); -inf and
// O = 0 for rows that saw nothing.
template <int kOutTiles>
__device__ __forceinline__ void normalize_rows(float (&o)[kOutTiles][4], const float (&row_max)[2],
                                               const float (&row_sum)[2], float exp_scale, float inv_keep,
                                               float (&lse)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = quad_sum(row_sum[half]);
    const bool empty = !(sum > 0.f);
    const float inv = empty ? 0.f : inv_keep / sum;
    lse[half] = empty ? -INFINITY : row_max[half] * exp_scale * kLn2 + logf(sum);
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt) {
      o[dt][2 * half] *= inv;
      o[dt][2 * half + 1] *= inv;
    }
  }
}

// fp32 partial O (row pitch 8 * kOutTiles) and lse of a 16-row tile whose first row is `row0`,
// for the combine kernel; `head_rows` is the partial row of query row 0.
template <int kOutTiles>
__device__ __forceinline__ void store_partials(const KernelParams& p, int64_t head_rows, int64_t row0, int seqlen_q,
                                               const float (&o)[kOutTiles][4], const float (&lse)[2]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = row0 + g + half * 8;
    if (i >= seqlen_q) continue;
    float* row = p.partial_out + (head_rows + i) * (8 * kOutTiles);
#pragma unroll
    for (int dt = 0; dt < kOutTiles; ++dt)
      *reinterpret_cast<float2*>(row + dt * 8 + 2 * t) = make_float2(o[dt][2 * half], o[dt][2 * half + 1]);
    if (t == 0) p.partial_lse[head_rows + i] = lse[half];
  }
}

// lse of a 16-row tile whose first row is `row0` (one lane per quad writes).
__device__ __forceinline__ void store_lse(const KernelParams& p, int b, int h, const Sequence& seq, int64_t row0,
                                          const float (&lse)[2]) {
  const int lane = threadIdx.x % 32;
  if (lane % 4 != 0 || !p.lse) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = row0 + lane / 4 + half * 8;
    if (i < seq.seqlen_q) p.lse[int64_t(b) * p.lse_batch + int64_t(h) * p.lse_head + seq.q_start + i] = lse[half];
  }
}

}  // namespace forward_detail

// Dropout and general scores (ScoreRule::is_general) are template parameters, so the common
// variant carries none of their code and none of their registers.
template <typename T, int kD, bool kDropout, bool kGeneral>
__global__ void __launch_bounds__(ForwardConfig<T, kD, kDropout, kGeneral>::kThreads)
    forward_kernel(const __grid_constant__ KernelParams p) {
  using C = ForwardConfig<T, kD, kDropout, kGeneral>;
  using Elem = typename T::storage;
  using QTile = typename C::QTile;
  using KVTile = typename C::KVTile;
  constexpr int kM = C::kM, kN = C::kN, kRowTiles = C::kRowTiles;
  extern __shared__ __align__(128) unsigned char smem[];

  // Query tiles of a head run last-first: under a causal mask the last ones see the most keys.
  const int m_blocks = (p.seqlen_q + kM - 1) / kM;
  int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  // In groups of heads (forward_launch.cuh) the tile index is y and the head x + z * group. Not
  // with dropout: computed heads would spill there (its draws keep them to the end).
  if (!kDropout && p.head_group > 1) {
    const int head = grouped_head(blockIdx.z, blockIdx.x, p.head_group);
    if (head >= p.batch * p.heads_q) return;  // the last group's spare blocks
    tile = blockIdx.y;
    h = head % p.heads_q;
    b = head / p.heads_q;
  }
  const int m_block = m_blocks - 1 - tile % m_blocks;
  const int split = tile / m_blocks;
  const Sequence seq = Sequence::of(p, b);
  const int m0 = m_block * kM;
  if (m0 >= seq.seqlen_q) return;
  const ScoreRule rule = ScoreRule::make(p, seq, b, h);

  const KeyBlocks blocks = KeyBlocks::of(rule, seq, m0, kM, kN, p.num_splits, split);
  const int n_begin = blocks.begin, n_end = blocks.end;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hk = h / p.group;
  const Elem* q_rows = operand_row<const Elem>(p.q, b, seq.q_start + m0, h);
  const Elem* k_rows = operand_row<const Elem>(p.k, b, seq.k_start, hk);
  const Elem* v_rows = operand_row<const Elem>(p.v, b, seq.k_start, hk);
  const uint32_t s_q = smem_address(smem);
  const uint32_t s_k = s_q + QTile::kBytes;
  const uint32_t s_v = s_k + KVTile::kBytes;
  auto load_keys = [&](uint32_t tile, const Elem* rows, int64_t stride, int n) {
    load_tile_async<Elem, KVTile, C::kThreads, ForwardTileCopy>(tile, rows + int64_t(n) * kN * stride, stride,
                                                                seq.seqlen_k - n * kN, p.head_dim);
  };
  // The same copy in part `part` of kParts (tile_shapes.h says why).
  constexpr int kParts = C::kCopyParts;
  auto load_keys_part = [&](uint32_t tile, const Elem* rows, int64_t stride, int n, int part) {
    load_tile_async<Elem, KVTile, C::kThreads, ForwardTileCopy, kParts>(
        tile, rows + int64_t(n) * kN * stride, stride, seq.seqlen_k - n * kN, p.head_dim, part);
  };
  constexpr bool kSpread = kParts > 1;

  float o[kRowTiles][C::kOutTiles][4] = {};
  RowState<kRowTiles> st;
  const int warp_row = warp * 16 * kRowTiles;  // first row of this warp inside the tile
  auto tile_row0 = [&](int r) { return int64_t(m0) + warp_row + r * 16; };  // query row of tile r
  if (n_begin < n_end) {
    load_tile_async<Elem, QTile, C::kThreads, ForwardTileCopy>(s_q, q_rows, p.q.row, seq.seqlen_q - m0, p.head_dim);
    load_keys(s_k, k_rows, p.k.row, n_end - 1);
    cp_async_commit();
  }
  const LaneCoord a_lane = a_operand_lane(lane);
  const LaneCoord k_lane = b_operand_nk_lane(lane);
  const LaneCoord v_lane = b_operand_kn_lane(lane);
  const uint32_t q_frag = s_q + QTile::offset(warp_row + a_lane.row, a_lane.col);
  const uint32_t k_frag = s_k + KVTile::offset(k_lane.row, k_lane.col);
  const uint32_t v_frag = s_v + KVTile::offset(v_lane.row, v_lane.col);
  const semantics::Dropout drop{p.dropout_threshold, p.dropout_inv_keep, p.dropout_seed, p.dropout_offset};
  const int64_t batch_head = int64_t(b) * p.heads_q + h;

  for (int n = n_end - 1; n >= n_begin; --n) {
    cp_async_wait<0>();
    __syncthreads();  // K[n] has landed; every warp is done with V[n + 1]
    if (!kSpread) {
      load_keys(s_v, v_rows, p.v.row, n);
      cp_async_commit();
    }

    // S = Q K^T; spread copies issue V[n] in its first k-steps
    float s[kRowTiles][C::kScoreTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if (kSpread && kk < kParts) {
        load_keys_part(s_v, v_rows, p.v.row, n, kk);
        if (kk == kParts - 1) cp_async_commit();
      }
      uint32_t a[kRowTiles][4];
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) ldmatrix_x4(a[r], q_frag + QTile::offset(r * 16, kk * 16));
#pragma unroll
      for (int nt = 0; nt < C::kScoreTiles / 2; ++nt) {
        uint32_t bk[4];
        ldmatrix_x4(bk, k_frag + KVTile::offset(nt * 16, kk * 16));
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r) {
          mma_16816<T>(s[r][2 * nt], a[r], {bk[0], bk[1]});
          mma_16816<T>(s[r][2 * nt + 1], a[r], {bk[2], bk[3]});
        }
      }
    }
    const int64_t j0 = int64_t(n) * kN;
    const bool masked = !rule.block_unmasked(m0, kM, j0, kN);
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      if (kGeneral) forward_detail::transform_scores(s[r], rule, tile_row0(r), j0);
      if (masked) forward_detail::apply_mask(s[r], rule.window, int(tile_row0(r)), int(j0));
    }

    cp_async_wait<0>();
    __syncthreads();  // V[n] has landed; every warp is done with K[n]
    if (!kSpread && n > n_begin) {
      load_keys(s_k, k_rows, p.k.row, n - 1);
      cp_async_commit();
    }

#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      forward_detail::softmax_step<forward_detail::kLazyRescale<kD>>(s[r], o[r], st.max[r], st.sum[r],
                                                                      kGeneral ? 1.f : rule.exp_scale);
      if (kDropout) forward_detail::apply_dropout(s[r], drop, batch_head, tile_row0(r), j0);
    }

    // O += P V, with P packed to 16 bits first so that the fp32 scores die before the mma.
    uint32_t pa[kRowTiles][kN / 16][4];
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) accumulators_to_a<T>(s[r][2 * kk], s[r][2 * kk + 1], pa[r][kk]);
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
#pragma unroll
      for (int dt = 0; dt < kD / 16; ++dt) {
        if (kSpread && kk == 0 && dt % 2 == 0 && dt / 2 < kParts && n > n_begin) {  // K[n - 1]
          load_keys_part(s_k, k_rows, p.k.row, n - 1, dt / 2);
          if (dt / 2 == kParts - 1) cp_async_commit();
        }
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, v_frag + KVTile::offset(kk * 16, dt * 16));
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r) {
          mma_16816<T>(o[r][2 * dt], pa[r][kk], {bv[0], bv[1]});
          mma_16816<T>(o[r][2 * dt + 1], pa[r][kk], {bv[2], bv[3]});
        }
      }
    }
  }

  float lse[kRowTiles][2];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r)
    forward_detail::normalize_rows(o[r], st.max[r], st.sum[r], rule.exp_scale, p.dropout_inv_keep, lse[r]);
  const int g = lane / 4, t = lane % 4;

  if (p.num_splits > 1) {  // fp32 partials straight from registers; the combine kernel finishes
    const int64_t head_rows = (int64_t(split) * p.heads_q + h) * p.rows_q + seq.packed_q;
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) forward_detail::store_partials(p, head_rows, tile_row0(r), seq.seqlen_q, o[r], lse[r]);
    return;
  }
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) forward_detail::store_lse(p, b, h, seq, tile_row0(r), lse[r]);
  // O through the warp's own rows of the Q tile, then 16-byte coalesced stores.
  constexpr int kWarpRows = 16 * kRowTiles;
  unsigned char* s_out = smem + QTile::offset(warp_row, 0);
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r)
#pragma unroll
    for (int dt = 0; dt < C::kOutTiles; ++dt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<uint32_t*>(s_out + QTile::offset(r * 16 + g + half * 8, dt * 8 + 2 * t)) =
            pack2<T>(o[r][dt][2 * half], o[r][dt][2 * half + 1]);
  __syncwarp();
  Elem* out_rows = operand_row<Elem>(p.out, b, seq.q_start + m0 + warp_row, h);
  constexpr int kChunks = kWarpRows * QTile::kChunksPerRow;
#pragma unroll
  for (int c = lane; c < kChunks; c += 32) {
    const int row = c / QTile::kChunksPerRow, col = (c % QTile::kChunksPerRow) * 8;
    if (m0 + warp_row + row < seq.seqlen_q && col < p.head_dim)
      *reinterpret_cast<uint4*>(out_rows + row * p.out.row + col) =
          *reinterpret_cast<const uint4*>(s_out + QTile::offset(row, col));
  }
}

}  // namespace flashattn::cuda

// FlashAttention-2 backward on mma.sync, parallel over key blocks. A thread block owns kN keys of
// one (batch, kv head) and keeps dK and dV for them in registers while it walks over the query
// blocks that see those keys, for every query head of the GQA group:
//   S^T = K Q^T, dP^T = V dO^T                       (rows = keys, so P^T is dV's A operand)
//   P = exp(S - lse), dS = P * (z * dP - delta) * softcap'
//   dV += (z P)^T dO, dK += dS^T Q                    (registers; P and dS through shared memory)
//   dQ += dS K                                        (fp32 atomics into dq_accum)
// A key group of d_split warps owns 16 or 32 keys: each warp computes S^T for 1 / d_split of the
// query rows; P and dS meet in shared memory, from which dK/dV take a layout of their own (32
// keys and a part of the head dim per warp, tile_shapes.h).
// Deterministic mode: the adds to each dQ tile take turns by key block, descending (one int per
// tile in global memory, dq_accum_layout.h), so every dq_accum address sees its adds in a fixed
// order.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/common/cp_async.cuh"
#include "cuda/common/ldmatrix.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/numeric.cuh"
#include "cuda/common/smem.cuh"
#include "cuda/common/turns.cuh"
#include "cuda/dq_accum_layout.h"
#include "cuda/sm80/attention_common.cuh"
#include "cuda/sm80/backward_order.h"
#include "cuda/sm80/dropout_draws.h"
#include "cuda/sm80/tile_shapes.h"

namespace flashattn::cuda {

// kStagesArg: Q and dO single or double-buffered (two stages need more shared memory than the
// A100 has per block at d = 128); kBlockM: query rows per step; kBlockN: 0 for the head dim's
// keys per block, or backward_narrow_block_n(kD). The launcher picks what the device allows.
template <typename T, int kD, int kStagesArg = 1, int kBlockM = 64, int kBlockN = 0>
struct BackwardConfig {
  static constexpr BackwardShape kShape = backward_shape(kD, kBlockM, kBlockN);
  static constexpr int kM = kShape.block_m, kN = kShape.block_n, kWarps = kShape.warps, kSplit = kShape.d_split;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kKeyGroups = kWarps / kSplit;   // groups of warps sharing keys
  static constexpr int kGroupKeys = kN / kKeyGroups;   // keys of a group
  static constexpr int kKeyTiles = kGroupKeys / 16;    // 16-row mma tiles of a warp's S^T
  static constexpr int kWarpQueries = kM / kSplit;     // query columns of a warp's S^T
  static_assert(kN == 16 * kKeyTiles * kKeyGroups, "key groups hold whole 16-row tiles");
  // dK and dV: kDkvKeyGroups groups of kDkvKeyTiles 16-row tiles times kDkvParts parts of
  // kDkvCols columns.
  static constexpr int kDkvKeyGroups = kShape.dkv_key_groups;
  static constexpr int kDkvKeyTiles = kN / 16 / kDkvKeyGroups;
  static constexpr int kDkvParts = kWarps / kDkvKeyGroups;
  static constexpr int kDkvCols = kD / kDkvParts;
  static_assert(kN == 16 * kDkvKeyTiles * kDkvKeyGroups && kWarps % kDkvKeyGroups == 0, "dK/dV warp layout");
  // dQ = dS K: the warps take kDqRowGroups groups of kDqRowTiles 16-row tiles times kDqParts
  // column parts of kDqCols each. Two row tiles per warp read each K fragment for two mma (a
  // fifth less shared-memory traffic than one) where the column parts stay whole 16-column steps.
  static constexpr int kDqRowTiles = kShape.dq_row_tiles;
  static constexpr int kDqRowGroups = kM / (16 * kDqRowTiles);
  static constexpr int kDqParts = kWarps / kDqRowGroups;
  static constexpr int kDqCols = kD / kDqParts;
  static_assert(kWarps % kDqRowGroups == 0, "dQ row groups must spread evenly over the warps");
  static_assert(kDkvCols % 16 == 0 && kDqCols % 16 == 0, "head dim must split into 16-column steps");
  static_assert(2 * kM <= kThreads, "one thread per lse2 and delta row of a step");
  using QTile = SmemTile<kM, kD>;
  using KTile = SmemTile<kN, kD>;
  using STile = SmemTile<kN, kM>;  // P^T or dS^T, [key][query]
  static constexpr int kRowBytes = kM * 4;  // lse2 or delta of a step
  static constexpr int kStageBytes = 2 * QTile::kBytes + 2 * kRowBytes;
  static constexpr int kStages = kStagesArg;
  static_assert(kStages == 1 || kStages == 2, "Q and dO are single or double-buffered");
  static constexpr int kSmemBytes = 2 * KTile::kBytes + 2 * STile::kBytes + kStages * kStageBytes;
  static constexpr int kQueryTiles = kWarpQueries / 8;  // n8 tiles of a warp's S^T
};

namespace backward_detail {

// The pass over query blocks of one key block: which heads, which query blocks.
struct Walk {
  int head_first, heads, m_begin, m_end;
  __device__ int steps() const { return heads * max(0, m_end - m_begin); }

  // The query blocks of kM rows that see keys [j_first, j_last], for heads [head_first, +heads).
  template <int kM>
  __device__ static Walk of(const semantics::Window& window, int head_first, int heads, int64_t j_first,
                            int64_t j_last) {
    const int64_t first_q = window.first_query(j_first), last_q = window.last_query(j_last);
    return {head_first, heads, int(first_q / kM), first_q <= last_q ? int(last_q / kM) + 1 : int(first_q / kM)};
  }
};

// One step of a walk: query block m_block of head `head`. next() advances without a division
// (the step loop runs it once per step, in every thread).
struct WalkStep {
  int head, m_block;
  __device__ WalkStep next(const Walk& walk) const {
    return m_block + 1 < walk.m_end ? WalkStep{head, m_block + 1} : WalkStep{head + 1, walk.m_begin};
  }
};

// Adds the half `half` (row g, or g + 8) of a warp's 16-row dQ tiles (n8 tiles side by side from
// column col0, a multiple of 16) to packed row `row` of head h in dq_accum. From sm_90 on,
// dq_accum is in row tiles (dq_accum_layout.h): a lane's columns of tiles 2u and 2u + 1 are four
// adjacent floats, added by one vector reduction without shuffles, and the warp's reduction covers
// whole 128-byte lines (+2 to +5% at d = 128 and 256 on the H200 over plain columns, whose lanes
// swapped pairs by shuffles; the fragment order's 32-byte runs per lane cost 8 to 17%). Before
// sm_90, scalar reductions in the layout the host names (KernelParams::dq_layout: row tiles where
// this code runs from PTX on a later device).
template <int kD, int kTiles>
__device__ __forceinline__ void accumulate_dq_row(float* accum, int64_t row, int h, int heads, int col0, bool valid,
                                                  const float (&dq)[kTiles][4], int half, DqLayout layout) {
  if (!valid) return;
  const int t = threadIdx.x % 4;
#if __CUDA_ARCH__ >= 900
  static_assert(kTiles % 2 == 0, "pairs of n8 tiles");
  float* at = accum + dq_accum_index(DqLayout::row_tiles, row, h, col0 + 2 * t, heads, kD);
#pragma unroll
  for (int u = 0; u < kTiles / 2; ++u) {  // 16-column blocks are 128 floats apart
    const float4 v = make_float4(dq[2 * u][2 * half], dq[2 * u][2 * half + 1], dq[2 * u + 1][2 * half],
                                 dq[2 * u + 1][2 * half + 1]);
    atomicAdd(reinterpret_cast<float4*>(at + 128 * u), v);
  }
#else
  if (layout == DqLayout::plain) {
    float* at = accum + (row * heads + h) * kD + col0 + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 2; ++e) atomicAdd(at + dt * 8 + e, dq[dt][2 * half + e]);
    return;
  }
#pragma unroll
  for (int dt = 0; dt < kTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 2; ++e)
      atomicAdd(accum + dq_accum_index(layout, row, h, col0 + dt * 8 + 2 * t + e, heads, kD), dq[dt][2 * half + e]);
#endif
}

// Keep bits of a lane's S^T elements under dropout, bit `element` for the element that
// dropout_draws.h numbers so (keys from key0, a multiple of 16; queries from query0): one Philox
// call per 8 elements instead of one per element, its keep bits transposed among a column's
// lanes. Every lane of the warp must call it.
template <int kKeyTiles, int kQueryTiles>
__device__ __forceinline__ DropoutKeepBits<kKeyTiles, kQueryTiles> dropout_keep_bits(const semantics::Dropout& drop,
                                                                                     int64_t batch_head, int64_t query0,
                                                                                     int64_t key0) {
  using Bits = DropoutKeepBits<kKeyTiles, kQueryTiles>;
  constexpr int kElements = 4 * kKeyTiles * kQueryTiles;
  static_assert(kElements % 8 == 0 && kElements <= 64, "rounds of 8 elements, one bit each");
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  Bits mine = 0;  // byte `round`: the keep bits of this lane's call in that round
#pragma unroll
  for (int round = 0; round < kElements / 8; ++round) {
    const DropoutElement e = dropout_element<kQueryTiles>(round * 8 + g);
    const semantics::Philox4 r =
        drop.draws(batch_head, query0 + e.query_tile * 8 + 2 * t + e.c, (key0 >> 3) + e.key_tile * 2 + e.half);
    mine |= Bits(dropout_keep_byte(r, drop.threshold)) << (8 * round);
  }
  Bits keep = 0;
#pragma unroll
  for (int rotation = 0; rotation < 8; ++rotation) {
    const int source = dropout_source(g, rotation);
    const Bits sent = rotation == 0 ? mine : __shfl_sync(0xffffffffu, mine, source * 4 + t);
    keep |= dropout_received_bits(sent, g, source);
  }
  return keep;
}

}  // namespace backward_detail

// Dropout and general scores (ScoreRule::is_general) are template parameters, so the common
// variant carries none of their code and none of their registers.
template <typename T, int kD, int kStages, int kBlockM, int kBlockN, bool kDropout, bool kGeneral>
__global__ void __launch_bounds__(BackwardConfig<T, kD, kStages, kBlockM, kBlockN>::kThreads, 1)
    backward_kernel(const __grid_constant__ KernelParams p) {
  using C = BackwardConfig<T, kD, kStages, kBlockM, kBlockN>;
  using Elem = typename T::storage;
  using QTile = typename C::QTile;
  using KTile = typename C::KTile;
  using STile = typename C::STile;
  constexpr int kM = C::kM, kN = C::kN;
  extern __shared__ __align__(128) unsigned char smem[];

  const BackwardBlock at = backward_block(blockIdx, gridDim, p);
  if (at.batch >= p.batch) return;  // a spare block of the last head group
  const int hk = at.kv_head, b = at.batch, n = at.key_block;
  const Sequence seq = Sequence::of(p, b);
  const int n_blocks = (seq.seqlen_k + kN - 1) / kN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int key_group = warp % C::kKeyGroups, part = warp / C::kKeyGroups;
  const int query0 = part * C::kWarpQueries;  // first query column of this warp's S^T
  const int dkv_key0 = (warp % C::kDkvKeyGroups) * C::kDkvKeyTiles * 16;  // first dK/dV key of this warp
  const int dkv_col0 = (warp / C::kDkvKeyGroups) * C::kDkvCols;           // first dK/dV column

  const uint32_t s_k = smem_address(smem);
  const uint32_t s_v = s_k + KTile::kBytes;
  const uint32_t s_stage0 = s_v + KTile::kBytes;
  const uint32_t s_ds = s_stage0 + C::kStages * C::kStageBytes;
  const uint32_t s_p = s_ds + STile::kBytes;
  auto stage_q = [&](int stage) { return s_stage0 + stage * C::kStageBytes; };
  auto stage_do = [&](int stage) { return stage_q(stage) + QTile::kBytes; };
  auto stage_lse = [&](int stage) { return stage_q(stage) + 2 * QTile::kBytes; };
  auto stage_delta = [&](int stage) { return stage_lse(stage) + C::kRowBytes; };
  const float* lse_smem0 = reinterpret_cast<const float*>(smem + (stage_lse(0) - s_k));

  const Elem* k_rows = operand_row<const Elem>(p.k, b, seq.k_start, hk);
  const Elem* v_rows = operand_row<const Elem>(p.v, b, seq.k_start, hk);
  const semantics::Dropout drop{p.dropout_threshold, p.dropout_inv_keep, p.dropout_seed, p.dropout_offset};

  if (n >= n_blocks) return;
  const int64_t j0 = int64_t(n) * kN;
  const int keys_valid = int(min(int64_t(kN), int64_t(seq.seqlen_k) - j0));
  // Query blocks that see keys [j0, j0 + keys_valid): the same for every head of the group.
  const ScoreRule rule0 = ScoreRule::make(p, seq, b, hk * p.group);
  const backward_detail::Walk walk =
      backward_detail::Walk::of<kM>(rule0.window, hk * p.group, p.group, j0, j0 + keys_valid - 1);
  // Deterministic mode: each dQ tile takes the adds of the key blocks that see it in descending
  // order. Key block n + 1 sees query blocks [after_begin, after_end): to those this block adds
  // once n + 1 has. The tile of a step is handed on at the next step's dS barrier (or after the
  // walk), so that the hand-over costs no barrier of its own.
  // Thread 0's state lives in shared memory: the step loop has no registers to spare for it.
  __shared__ int turn_state[4];  // after_begin, after_end, and the tile to hand on (head, query block)
  if (p.deterministic && threadIdx.x == 0) {
    int after_begin = 0, after_end = 0;
    if (j0 + kN < seq.seqlen_k) {
      const backward_detail::Walk after = backward_detail::Walk::of<kM>(
          rule0.window, 0, 0, j0 + kN, min(j0 + 2 * kN, int64_t(seq.seqlen_k)) - 1);
      after_begin = after.m_begin;
      after_end = after.m_end;
    }
    turn_state[0] = after_begin;
    turn_state[1] = after_end;
    turn_state[2] = -1;
  }
  auto turn_of = [&](int h, int m) {
    return p.dq_turns + backward_dq_turn(p.rows_q, p.batch, seq.packed_q, kM, b, h, m, 0);
  };

  // Loads of the query side of one step into a stage: Q, dO, lse2 and delta rows.
  auto load_step = [&](backward_detail::WalkStep pos, int stage) {
    const int h = pos.head, m0 = pos.m_block * kM;
    const int rows = seq.seqlen_q - m0;
    load_tile_async<Elem, QTile, C::kThreads, BackwardTileCopy>(
        stage_q(stage), operand_row<const Elem>(p.q, b, seq.q_start + m0, h), p.q.row, rows, p.head_dim);
    load_tile_async<Elem, QTile, C::kThreads, BackwardTileCopy>(
        stage_do(stage), operand_row<const Elem>(p.dout, b, seq.q_start + m0, h), p.dout.row, rows, p.head_dim);
    if (threadIdx.x < 2 * kM) {
      const int r = threadIdx.x % kM;
      const bool is_delta = threadIdx.x >= kM;
      const float* row = (is_delta ? p.delta : p.lse_log2) + int64_t(h) * p.rows_q + seq.packed_q + m0 + r;
      cp_async_4((is_delta ? stage_delta(stage) : stage_lse(stage)) + r * 4, row, r < rows);
    }
  };

  // K and V of this block; the first step's query side joins the same group.
  if (walk.steps() > 0) {
    load_tile_async<Elem, KTile, C::kThreads, BackwardTileCopy>(s_k, k_rows + j0 * p.k.row, p.k.row, keys_valid,
                                                                p.head_dim);
    load_tile_async<Elem, KTile, C::kThreads, BackwardTileCopy>(s_v, v_rows + j0 * p.v.row, p.v.row, keys_valid,
                                                                p.head_dim);
    load_step({walk.head_first, walk.m_begin}, 0);
    cp_async_commit();
  }

  float dk[C::kDkvKeyTiles][C::kDkvCols / 8][4] = {};
  float dv[C::kDkvKeyTiles][C::kDkvCols / 8][4] = {};
  const int group_key0 = key_group * C::kGroupKeys;  // first key of this warp's group
  const LaneCoord a_lane = a_operand_lane(lane);
  const LaneCoord nk_lane = b_operand_nk_lane(lane);
  const LaneCoord kn_lane = b_operand_kn_lane(lane);
  const LaneCoord km_lane = a_operand_km_lane(lane);

  backward_detail::WalkStep pos{walk.head_first, walk.m_begin};
  for (int step = 0; step < walk.steps(); ++step, pos = pos.next(walk)) {
    const int stage = C::kStages == 2 ? step % 2 : 0;
    const int h = pos.head, m0 = pos.m_block * kM;
    cp_async_wait<0>();
    __syncthreads();  // this step's loads landed; the previous step is done with the other stage
    if (C::kStages == 2 && step + 1 < walk.steps()) {
      load_step(pos.next(walk), 1 - stage);
      cp_async_commit();
    }
    const uint32_t s_q = stage_q(stage), s_do = stage_do(stage);
    const float* lse2 = lse_smem0 + stage * (C::kStageBytes / 4);
    const float* delta = lse2 + kM;

    // S^T = K Q^T and dP^T = V dO^T for this warp's keys and query columns.
    float st[C::kKeyTiles][C::kQueryTiles][4] = {};
    float dpt[C::kKeyTiles][C::kQueryTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ak[C::kKeyTiles][4], av[C::kKeyTiles][4];
#pragma unroll
      for (int kt = 0; kt < C::kKeyTiles; ++kt) {
        const uint32_t at = KTile::offset(group_key0 + kt * 16 + a_lane.row, kk * 16 + a_lane.col);
        ldmatrix_x4(ak[kt], s_k + at);
        ldmatrix_x4(av[kt], s_v + at);
      }
#pragma unroll
      for (int qt = 0; qt < C::kQueryTiles / 2; ++qt) {
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, s_q + QTile::offset(query0 + qt * 16 + nk_lane.row, kk * 16 + nk_lane.col));
        ldmatrix_x4(bo, s_do + QTile::offset(query0 + qt * 16 + nk_lane.row, kk * 16 + nk_lane.col));
#pragma unroll
        for (int kt = 0; kt < C::kKeyTiles; ++kt) {
          mma_16816<T>(st[kt][2 * qt], ak[kt], {bq[0], bq[1]});
          mma_16816<T>(st[kt][2 * qt + 1], ak[kt], {bq[2], bq[3]});
          mma_16816<T>(dpt[kt][2 * qt], av[kt], {bo[0], bo[1]});
          mma_16816<T>(dpt[kt][2 * qt + 1], av[kt], {bo[2], bo[3]});
        }
      }
    }

    // Element-wise: st <- z P (for dV), dpt <- dS (for dK, dQ).
    const ScoreRule rule = ScoreRule::make(p, seq, b, h);
    const bool masked = !rule.block_unmasked(m0, kM, j0, kN) || m0 + kM > seq.seqlen_q;
    const int64_t batch_head = int64_t(b) * p.heads_q + h;
    const float exp_scale = kGeneral ? 1.f : rule.exp_scale;
    // Dropout: bit ((kt * 2 + half) * kQueryTiles + qt) * 2 + c.
    DropoutKeepBits<C::kKeyTiles, C::kQueryTiles> keep_bits = 0;
    if constexpr (kDropout)
      keep_bits = backward_detail::dropout_keep_bits<C::kKeyTiles, C::kQueryTiles>(drop, batch_head, m0 + query0,
                                                                                    j0 + group_key0);
    // Two copies of the pass: blocks without a mask (most of them) carry none of its work.
    auto element_wise = [&](auto masked_tag) {
      constexpr bool kMasked = decltype(masked_tag)::value;
#pragma unroll
      for (int qt = 0; qt < C::kQueryTiles; ++qt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int q_local = query0 + qt * 8 + 2 * t + c;
          const int i = m0 + q_local;
          const float row_lse2 = lse2[q_local], row_delta = delta[q_local];
          // Visible keys of row i, in 32 bits (empty past the last query).
          int first_key = 0, last_key = -1;
          if (kMasked && i < seq.seqlen_q) {
            const int64_t c = rule.window.unfolded_diagonal(i);  // the backward never folds
            first_key = int(rule.window.first_key_at(c));
            last_key = int(max(rule.window.last_key_at(c), int64_t(-1)));
          }
#pragma unroll
          for (int key_half = 0; key_half < 2 * C::kKeyTiles; ++key_half) {
            const int kt = key_half / 2, half = key_half % 2;
            const int j = int(j0) + group_key0 + kt * 16 + g + half * 8;
            float& s = st[kt][qt][2 * half + c];
            float& dp = dpt[kt][qt][2 * half + c];
            float cap_grad = 1.f;
            if (kGeneral) {
              if (rule.softcap > 0.f) {
                const float th = tanhf(rule.scale * s / rule.softcap);
                cap_grad = 1.f - th * th;
              }
              s = rule.transform(s, i, j);
            }
            if (kMasked && (j < first_key || j > last_key)) s = -INFINITY;
            const float prob = fast_exp2(fmaf(s, exp_scale, -row_lse2));
            float z = 1.f;
            if (kDropout) z = keep_bits >> (((kt * 2 + half) * C::kQueryTiles + qt) * 2 + c) & 1u ? drop.inv_keep : 0.f;
            s = prob * z;
            dp = prob * (z * dp - row_delta) * cap_grad;
          }
        }
    };
    if (masked)
      element_wise(std::true_type{});
    else
      element_wise(std::false_type{});

    // dS^T and z P^T to shared memory, [key][query].
#pragma unroll
    for (int kt = 0; kt < C::kKeyTiles; ++kt)
#pragma unroll
      for (int qt = 0; qt < C::kQueryTiles; ++qt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint32_t at = STile::offset(group_key0 + kt * 16 + g + half * 8, query0 + qt * 8 + 2 * t);
          const uint32_t ds2 = pack2<T>(dpt[kt][qt][2 * half], dpt[kt][qt][2 * half + 1]);
          const uint32_t p2 = pack2<T>(st[kt][qt][2 * half], st[kt][qt][2 * half + 1]);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_ds + at), "r"(ds2));
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(s_p + at), "r"(p2));
        }
    if (p.deterministic && threadIdx.x == 0 && pos.m_block >= turn_state[0] && pos.m_block < turn_state[1])
      wait_for_turn(turn_of(h, pos.m_block), n + 1);
    __syncthreads();  // dS^T and P^T of every warp are in shared memory (and, deterministic, the turn)
    if (p.deterministic && threadIdx.x == 0) {
      if (turn_state[2] >= 0) release_turn(turn_of(turn_state[2], turn_state[3]), n);  // last step's
      turn_state[2] = h;
      turn_state[3] = pos.m_block;
    }

    // dV += (z P)^T dO and dK += dS^T Q over this step's queries (k = query).
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) {
      uint32_t ap[C::kDkvKeyTiles][4], ads[C::kDkvKeyTiles][4];
#pragma unroll
      for (int kt = 0; kt < C::kDkvKeyTiles; ++kt) {
        const uint32_t at = STile::offset(dkv_key0 + kt * 16 + a_lane.row, kk * 16 + a_lane.col);
        ldmatrix_x4(ap[kt], s_p + at);
        ldmatrix_x4(ads[kt], s_ds + at);
      }
#pragma unroll
      for (int dt = 0; dt < C::kDkvCols / 16; ++dt) {
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, s_do + QTile::offset(kk * 16 + kn_lane.row, dkv_col0 + dt * 16 + kn_lane.col));
        ldmatrix_x4_trans(bq, s_q + QTile::offset(kk * 16 + kn_lane.row, dkv_col0 + dt * 16 + kn_lane.col));
#pragma unroll
        for (int kt = 0; kt < C::kDkvKeyTiles; ++kt) {
          mma_16816<T>(dv[kt][2 * dt], ap[kt], {bo[0], bo[1]});
          mma_16816<T>(dv[kt][2 * dt + 1], ap[kt], {bo[2], bo[3]});
          mma_16816<T>(dk[kt][2 * dt], ads[kt], {bq[0], bq[1]});
          mma_16816<T>(dk[kt][2 * dt + 1], ads[kt], {bq[2], bq[3]});
        }
      }
    }

    if (C::kStages == 1 && step + 1 < walk.steps()) {
      __syncthreads();  // every warp is done with the stage; dQ below reads only dS and K
      load_step(pos.next(walk), 0);
      cp_async_commit();
    }

    // dQ (kM x kD) += dS K: warp w takes the kDqRowTiles 16-row tiles of group w % kDqRowGroups
    // and the kDqCols columns of part w / kDqRowGroups.
    {
      constexpr int kRowTiles = C::kDqRowTiles;
      const int row0 = (warp % C::kDqRowGroups) * kRowTiles * 16, dq_col0 = (warp / C::kDqRowGroups) * C::kDqCols;
      float dq[kRowTiles][C::kDqCols / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t a[kRowTiles][4];
#pragma unroll
        for (int rt = 0; rt < kRowTiles; ++rt)
          ldmatrix_x4_trans(a[rt], s_ds + STile::offset(kk * 16 + km_lane.row, row0 + rt * 16 + km_lane.col));
#pragma unroll
        for (int dt = 0; dt < C::kDqCols / 16; ++dt) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, s_k + KTile::offset(kk * 16 + kn_lane.row, dq_col0 + dt * 16 + kn_lane.col));
#pragma unroll
          for (int rt = 0; rt < kRowTiles; ++rt) {
            mma_16816<T>(dq[rt][2 * dt], a[rt], {bk[0], bk[1]});
            mma_16816<T>(dq[rt][2 * dt + 1], a[rt], {bk[2], bk[3]});
          }
        }
      }
      const int first_row = m0 + row0 + g;  // this lane's first query row
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = rt * 16 + half * 8;
          backward_detail::accumulate_dq_row<kD>(p.dq_accum, seq.packed_q + first_row + r, h, p.heads_q, dq_col0,
                                                 first_row + r < seq.seqlen_q, dq[rt], half, DqLayout(p.dq_layout));
        }
    }
  }
  if (p.deterministic && walk.steps() > 0) {  // the last step's tile, once every warp's adds are issued
    __syncthreads();
    if (threadIdx.x == 0) release_turn(turn_of(turn_state[2], turn_state[3]), n);
  }

  // dK = scale * sum dS^T Q and dV, for the valid keys and columns: 16-byte stores after a quad
  // transpose where the columns come in groups of four chunks, else one column pair at a time.
  Elem* dk_rows = operand_row<Elem>(p.dk, b, seq.k_start + j0, hk);
  Elem* dv_rows = operand_row<Elem>(p.dv, b, seq.k_start + j0, hk);
#pragma unroll
  for (int key_half = 0; key_half < 2 * C::kDkvKeyTiles; ++key_half) {
    const int kt = key_half / 2, half = key_half % 2;
    const int key = dkv_key0 + kt * 16 + g + half * 8;
    if constexpr (C::kDkvCols % 32 == 0) {
      const bool valid = key < keys_valid;
      const int64_t row = valid ? key : 0;
      const int cols = p.head_dim - dkv_col0;
      store_fragment_row<T>(dk[kt], half, p.scale, dk_rows + row * p.dk.row + dkv_col0, valid, cols);
      store_fragment_row<T>(dv[kt], half, 1.f, dv_rows + row * p.dv.row + dkv_col0, valid, cols);
    } else {
      if (key >= keys_valid) continue;
#pragma unroll
      for (int dt = 0; dt < C::kDkvCols / 8; ++dt) {
        const int col = dkv_col0 + dt * 8 + 2 * t;
        if (col >= p.head_dim) continue;
        *reinterpret_cast<uint32_t*>(dk_rows + key * p.dk.row + col) =
            pack2<T>(dk[kt][dt][2 * half] * p.scale, dk[kt][dt][2 * half + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_rows + key * p.dv.row + col) =
            pack2<T>(dv[kt][dt][2 * half], dv[kt][dt][2 * half + 1]);
      }
    }
  }
}

}  // namespace flashattn::cuda

// Backward attention on sm_90a: TMA, wgmma and warp specialisation.
//
// A block owns 128 keys of one (batch, kv head) and keeps dK and dV for them in registers while
// it walks over the query blocks (64 rows, 128 at d = 64; every query head of the GQA group) that
// see them. The producer warpgroup gives up its registers: one thread loads K and V once and Q
// and dO of each step into a ring of stages by TMA, one warp copies the step's lse and delta
// rows, and one thread per consumer adds that consumer's dQ tiles to the fp32 accumulator by TMA
// reduce-add. Each of the two consumer warpgroups owns 64 of the keys, with keys as the rows of
// its products:
//   S^T = K Q^T, dP^T = V dO^T                     wgmma SS, K-major operands
//   P^T = exp2(S^T - lse), dS^T = P^T (dP^T - delta) in the accumulator registers
//   dV += P^T dO, dK += dS^T Q                      wgmma RS: P^T and dS^T straight from registers
//   dQ += dS K                                      wgmma SS from dS^T in shared memory (M-major A)
// and stores its dQ tile in shared memory as swizzled 32-column boxes, which its producer thread
// adds to dq_accum (no atomics in the consumers). Warpgroup w computes dQ over all 128 keys for
// columns [w d/2, (w + 1) d/2) of a 64-row step, or rows [64 w, 64 w + 64) of a 128-row step, so
// the two consumers' tiles never overlap. The consumers take turns issuing their products
// (pingpong), so one's element-wise pass runs under the other's. Deterministic mode: the adds to
// each dQ tile take turns in descending key-block order (an int per tile and consumer in global
// memory), so every address sees its adds in a fixed order.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/common/numeric.cuh"
#include "cuda/common/turns.cuh"
#include "cuda/dq_accum_layout.h"
#include "cuda/kernel_params.h"
#include "cuda/sm80/attention_common.cuh"
#include "cuda/sm90/barrier.cuh"
#include "cuda/sm90/tile_shapes.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashattn::cuda::sm90 {

struct BackwardArgs {
  CUtensorMap q, k, v, dout;
  CUtensorMap dq_accum;  // fp32, [copies * rows_q][heads_q][kD], boxes of 32 columns x kM rows
  KernelParams p;
};

template <typename T, int D, bool kGeneral>
struct BackwardConfig {
  static constexpr int kD = D;
  static_assert(backward_supported(D) && !backward_wide(D), "the narrow sm90 backward serves head dims 64 and 128");
  static constexpr BackwardShape kShape = backward_shape(kD, kGeneral);
  static constexpr int kM = kShape.block_m, kN = kShape.block_n, kStages = kShape.stages;
  static constexpr int kThreads = 384;  // producer + two consumer warpgroups of 64 keys
  static_assert(kN == 128 && (kM == 64 || kM == 128), "two consumer warpgroups of 64 keys, 64 or 128 query rows");
  // A consumer's dQ over all keys: d/2 columns of the 64 rows, or all columns of its 64 of 128.
  static constexpr int kDqCols = backward_dq_cols(kD, kGeneral);
  static constexpr int kDqRounds = backward_dq_rounds(kD);  // dQ tiles a consumer hands over per step
  static constexpr bool kDoApart = backward_do_apart(kD);  // false: dO shares Q's barriers
  __device__ static int dq_row(int wg) { return kM == 128 ? 64 * wg : 0; }
  __device__ static int dq_col(int wg) { return kM == 128 ? 0 : wg * kDqCols; }
  static constexpr int kColumnBlocks = kD / 64;  // 64-column TMA boxes of a row
  using QTile = SwizzledTile<kM, kD>;   // Q and dO of a step
  using KTile = SwizzledTile<kN, kD>;   // K and V
  using DsTile = SwizzledTile<kN, kM>;  // dS^T, [key][query]
  using DqTile = SwizzledFloatTile<64, kDqCols>;  // a consumer's dQ: boxes of 32 columns of dq_accum
  static constexpr int kDqRingBoxes = backward_dq_ring_boxes(kD, kGeneral);
  static constexpr int kDqBoxesPerPart = backward_dq_boxes_per_part(kD, kGeneral);
  static constexpr int kDqRingParts = backward_dq_ring_parts(kD, kGeneral);
  static constexpr int kVOffset = KTile::kBytes;
  static constexpr int kQOffset = 2 * KTile::kBytes;
  static constexpr int kDoOffset = kQOffset + kStages * QTile::kBytes;
  static constexpr int kDsOffset = kDoOffset + kStages * QTile::kBytes;
  static constexpr int kDqOffset = kDsOffset + 2 * DsTile::kBytes;  // a dQ ring per consumer
  static_assert(kDqOffset % 1024 == 0, "swizzled TMA boxes start on the 1024-byte swizzle period");
  static constexpr int kRowsOffset = kDqOffset + 2 * kDqRingBoxes * DqTile::kBlockBytes;  // [stage][lse2, delta][kM] floats
  static constexpr int kBarrierOffset = kRowsOffset + kStages * 2 * kM * 4;
  static constexpr int kBarriers = backward_barriers(kStages, kDoApart, kDqRingParts);
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;
  static_assert(kSmemBytes == backward_smem_bytes(kD, kGeneral), "the host reads the same size");
  // Register budgets after reallocation: setmaxnreg moves registers inside the block's launch
  // allocation (168 per thread at 384 threads), so the budgets must fit in it. The producer's
  // walk and row copies fit in 40 without spills, the consumers' products and softmax in 232.
  static constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= 384 * 168, "over the block's registers");
};

// Named barriers 1 + 2 b + w: consumer w's dS^T of a step in buffer b is written (w arrives, the
// other consumer waits for it a step later).
constexpr int kDsWrittenBarrier = 1;
// Named barriers 5 + w: consumer w's turn to issue its next batch of wgmma (pingpong): each step
// has two, S^T and dP^T, then dV, dK and the previous step's dQ. Taking turns queues one
// consumer's batch behind the other's, so that each one's element-wise pass runs while the other's
// products keep the tensor cores busy, instead of both passes at once.
constexpr int kTurnBarrier = 5;

// C: the kernel's config (its stages and whether dO has barriers of its own).
template <typename C>
struct BackwardBarriers {
  static constexpr int kStages = C::kStages, kParts = C::kDqRingParts;
  static_assert(C::kBarriers == 1 + 2 * kStages + 2 + 2 * kParts + (C::kDoApart ? 2 * kStages : 0),
                "the layout below fills the config's barriers");
  uint32_t base;
  __device__ uint32_t kv_full() const { return base; }  // K and V, loaded once
  // Q, the rows (a warp) and, unless C::kDoApart, dO.
  __device__ uint32_t full(int s) const { return base + 8 * (1 + s); }
  __device__ uint32_t empty(int s) const { return base + 8 * (1 + kStages + s); }
  // Consumer wg's dQ tiles (written), and the parts of its dQ ring (read by TMA).
  __device__ uint32_t dq_full(int wg) const { return base + 8 * (1 + 2 * kStages + wg); }
  __device__ uint32_t dq_empty(int wg, int part) const { return base + 8 * (3 + 2 * kStages + wg * kParts + part); }
  // C::kDoApart: dO of stage s, so that S^T = K Q^T can start while dO lands.
  __device__ uint32_t do_full(int s) const {
    static_assert(C::kDoApart, "dO shares Q's barriers in this kernel");
    return base + 8 * (3 + 2 * kStages + 2 * kParts + s);
  }
  __device__ uint32_t do_empty(int s) const {
    static_assert(C::kDoApart, "dO shares Q's barriers in this kernel");
    return base + 8 * (3 + 3 * kStages + 2 * kParts + s);
  }
};

// The dQ tile a consumer hands over after `handed` others (round r of its step) sits in its ring
// (backward_dq_ring_boxes) from box kDqRounds - 1 - r on; its box x is ring box kDqRounds - 1 - r + x,
// in part (kDqRounds - 1 - r + x) / kPerPart of the ring.
template <typename C>
struct DqRingTile {
  static constexpr int kBoxes = C::DqTile::kBytes / C::DqTile::kBlockBytes, kRounds = C::kDqRounds;
  static constexpr int kPerPart = C::kDqBoxesPerPart;
  static_assert(kBoxes + kRounds - 1 == C::kDqRingBoxes, "the ring holds the rounds' tiles");
  static_assert(kPerPart == 1 || (kRounds == 1 && kPerPart == kBoxes), "boxes go back one by one, or whole tiles");
  int step, round;

  __device__ explicit DqRingTile(int handed) : step(handed / kRounds), round(handed % kRounds) {}
  __device__ int first_box() const { return kRounds - 1 - round; }
  __device__ uint32_t address(uint32_t smem, int wg) const {
    return smem + C::kDqOffset + (wg * C::kDqRingBoxes + first_box()) * C::DqTile::kBlockBytes;
  }
  // The parity of ring box first_box() + x's uses (and its part's) before this one.
  __device__ uint32_t parity(int x) const { return backward_dq_box_parity(kRounds, kBoxes, step, round, first_box() + x); }
};

// What a block does for key block n: which keys, and which (head, query block) steps see them.
// The steps walk each head of the GQA group over the query blocks that see the keys: from the
// last down by default, from the first up in deterministic mode. There the adds to a dQ tile take
// turns from the last key block that sees it down to the first, so under a causal or sliding
// mask key block n reaches the tile one step after key block n + 1 did: turns without waits.
struct KeyBlockWork {
  int64_t j0;
  int keys_valid;
  int head_first, heads, m_begin, m_end;  // query blocks [m_begin, m_end) of heads [head_first, +heads)
  int m_first, m_step;  // the walk: its first query block and +1 or -1

  template <int kM, int kN>
  __device__ static KeyBlockWork of(const KernelParams& p, const Sequence& seq, int hk, int n) {
    KeyBlockWork w;
    w.j0 = int64_t(n) * kN;
    w.keys_valid = int(min(int64_t(kN), int64_t(seq.seqlen_k) - w.j0));
    const semantics::Window window{p.window_left, p.window_right, seq.seqlen_q, seq.seqlen_k};
    const int64_t first_q = window.first_query(w.j0), last_q = window.last_query(w.j0 + w.keys_valid - 1);
    w.head_first = hk * p.group;
    w.heads = p.group;
    w.m_begin = int(first_q / kM);
    w.m_end = first_q <= last_q ? int(last_q / kM) + 1 : w.m_begin;
    w.m_first = p.deterministic ? w.m_begin : w.m_end - 1;
    w.m_step = p.deterministic ? 1 : -1;
    return w;
  }
  __device__ int blocks() const { return max(0, m_end - m_begin); }
  __device__ int steps() const { return heads * blocks(); }
  __device__ int head(int step) const { return head_first + step / max(1, blocks()); }
  __device__ int m_block(int step) const { return m_first + m_step * (step % max(1, blocks())); }
};

// The producer threads' walk over the steps of a KeyBlockWork, without divisions (they have few
// registers): the step's head and query block, and the query blocks left in the head after it.
struct StepCursor {
  int h, m, left;
  __device__ explicit StepCursor(const KeyBlockWork& w) : h(w.head_first), m(w.m_first), left(w.blocks() - 1) {}
  __device__ void advance(const KeyBlockWork& w) {
    if (left == 0) {
      ++h;
      m = w.m_first;
      left = w.blocks() - 1;
    } else {
      m += w.m_step;
      --left;
    }
  }
};

// Thread 0 of the producer: K and V of the key block, Q and dO of each step.
template <typename C>
__device__ void produce_tiles(const BackwardArgs& args, const Sequence& seq, int b, int hk, const KeyBlockWork& w,
                              uint32_t smem, const BackwardBarriers<C>& bars) {
  const KernelParams& p = args.p;
  if (w.steps() == 0) return;
  tma_prefetch_map(args.q);
  tma_prefetch_map(args.k);
  tma_prefetch_map(args.v);
  tma_prefetch_map(args.dout);
  const int batch = p.cu_seqlens_q != nullptr ? 0 : b;  // varlen maps are one batch of packed rows
  mbarrier_arrive_expect_tx(bars.kv_full(), 2 * C::KTile::kBytes);
  const int key_row = int(seq.k_start + w.j0);
#pragma unroll
  for (int cb = 0; cb < C::kColumnBlocks; ++cb) {
    tma_load_4d(smem + cb * C::KTile::kBlockBytes, args.k, bars.kv_full(), cb * 64, key_row, hk, batch);
    tma_load_4d(smem + C::kVOffset + cb * C::KTile::kBlockBytes, args.v, bars.kv_full(), cb * 64, key_row, hk, batch);
  }
  StepCursor at(w);
#pragma unroll 1
  for (int s = 0; s < w.steps(); ++s, at.advance(w)) {
    const RingSlot<C::kStages> slot = RingSlot<C::kStages>::of(s);
    const int h = at.h, row = int(seq.q_start) + at.m * C::kM;
    const uint32_t q_tile = smem + C::kQOffset + slot.stage * C::QTile::kBytes;
    const uint32_t do_tile = smem + C::kDoOffset + slot.stage * C::QTile::kBytes;
    mbarrier_wait(bars.empty(slot.stage), slot.parity ^ 1u);
    if constexpr (C::kDoApart) {
      mbarrier_arrive_expect_tx(bars.full(slot.stage), C::QTile::kBytes);
#pragma unroll
      for (int cb = 0; cb < C::kColumnBlocks; ++cb)
        tma_load_4d(q_tile + cb * C::QTile::kBlockBytes, args.q, bars.full(slot.stage), cb * 64, row, h, batch);
      mbarrier_wait(bars.do_empty(slot.stage), slot.parity ^ 1u);
      mbarrier_arrive_expect_tx(bars.do_full(slot.stage), C::QTile::kBytes);
#pragma unroll
      for (int cb = 0; cb < C::kColumnBlocks; ++cb)
        tma_load_4d(do_tile + cb * C::QTile::kBlockBytes, args.dout, bars.do_full(slot.stage), cb * 64, row, h, batch);
    } else {
      mbarrier_arrive_expect_tx(bars.full(slot.stage), 2 * C::QTile::kBytes);
#pragma unroll
      for (int cb = 0; cb < C::kColumnBlocks; ++cb) {
        tma_load_4d(q_tile + cb * C::QTile::kBlockBytes, args.q, bars.full(slot.stage), cb * 64, row, h, batch);
        tma_load_4d(do_tile + cb * C::QTile::kBlockBytes, args.dout, bars.full(slot.stage), cb * 64, row, h, batch);
      }
    }
  }
}

// Warp 1 of the producer: lse (log2 units) and delta of each step's query rows, +inf and 0 past
// the sequence so that those rows get P = dS = 0. Every lane arrives on the stage's barrier.
template <typename C>
__device__ void produce_rows(const KernelParams& p, const Sequence& seq, const KeyBlockWork& w, uint32_t smem,
                             const BackwardBarriers<C>& bars) {
  const int lane = threadIdx.x % 32;
  StepCursor at(w);
#pragma unroll 1
  for (int s = 0; s < w.steps(); ++s, at.advance(w)) {
    const RingSlot<C::kStages> slot = RingSlot<C::kStages>::of(s);
    const int h = at.h, m0 = at.m * C::kM;
    mbarrier_wait(bars.empty(slot.stage), slot.parity ^ 1u);
    float* rows = reinterpret_cast<float*>(__cvta_shared_to_generic(smem + C::kRowsOffset)) + slot.stage * 2 * C::kM;
    for (int r = lane; r < C::kM; r += 32) {
      const bool valid = m0 + r < seq.seqlen_q;
      const int64_t at = int64_t(h) * p.rows_q + seq.packed_q + m0 + r;
      rows[r] = valid ? p.lse_log2[at] : INFINITY;
      rows[C::kM + r] = valid ? p.delta[at] : 0.f;
    }
    mbarrier_arrive(bars.full(slot.stage));
  }
}

// Deterministic mode: the adds to a dQ tile happen in descending key-block order (common/turns.cuh);
// the last key block that sees the tile adds without waiting, key block n once its predecessor
// (n + 1, or n + 2 with two chains: backward_dq_chains) has added. Key blocks run in descending
// order too (the grid's first block is the last key block), so the block waited for was
// scheduled before the waiting one: no deadlock however full the GPU is.
__device__ __forceinline__ void pass_turn(int* turn, int adder) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the TMA adds, before the release
  release_turn(turn, adder);
}

// The grid of the backward: key blocks x kv heads x batch; kv heads x key blocks x batch
// (backward_interleaves_heads); or, in the default mode under a causal-like mask, a group's
// (batch, kv head) pairs x key blocks x groups (KernelParams::head_group): key block n of every
// pair of a group launches before any key block n + 1, the heaviest first.
template <int kN>
inline dim3 backward_grid(const KernelParams& p) {
  const unsigned n_blocks = unsigned(backward_key_blocks<kN>(p));
  if (p.head_group > 1)
    return dim3(unsigned(p.head_group), n_blocks,
                unsigned(head_group_count(int64_t(p.batch) * p.heads_kv, p.head_group)));
  return backward_interleaves_heads<kN>(p) ? dim3(unsigned(p.heads_kv), n_blocks, unsigned(p.batch))
                                           : dim3(n_blocks, unsigned(p.heads_kv), unsigned(p.batch));
}

// Lane 0 of warp 2 + wg of the producer: adds consumer wg's dQ tiles of each step to dq_accum by
// TMA reduce-add and hands each part of its ring back once TMA has read it. Rows past the sequence
// carry dS = 0, so their adds (into the next sequence's rows, or dropped past the tensor) add zeros.
// Deterministic mode waits for the step's turn and lets its adds complete before passing it on
// (after handing the ring back, so the consumer's next step does not wait for that). With two
// chains (up to d = 64) key block n adds to copy n % 2 of dq_accum, after key block n + 2.
template <typename C>
__device__ void reduce_dq_tiles(const BackwardArgs& args, const Sequence& seq, int b, int hk, int n,
                                const KeyBlockWork& w, uint32_t smem, const BackwardBarriers<C>& bars, int wg) {
  const KernelParams& p = args.p;
  if (w.steps() == 0) return;
  tma_prefetch_map(args.dq_accum);
  constexpr int kRoundCols = C::kDqCols / C::kDqRounds;  // dQ columns of one handed-over tile
  constexpr int kBoxes = DqRingTile<C>::kBoxes, kPerPart = DqRingTile<C>::kPerPart, kParts = kBoxes / kPerPart;
  static_assert(kParts <= 2, "bulk_wait_read below counts up to two groups");
  // Only head dims the host may give two chains compile them (registers: the wide kernel's
  // producer spills with them).
  constexpr bool kChains = backward_dq_chains(C::kD, false, INT64_MAX) > 1;
  const int chains = kChains ? p.dq_copies : 1, chain = n % chains;
  // The query blocks [after_begin, after_end) that key block n + chains sees: the key blocks of a
  // chain that see a tile are contiguous in it, so these are the tiles to which n does not add
  // first.
  int after_begin = 0, after_end = 0;
  if (p.deterministic && int64_t(n + chains) * C::kN < seq.seqlen_k) {
    const KeyBlockWork after = KeyBlockWork::of<C::kM, C::kN>(p, seq, hk, n + chains);
    after_begin = after.m_begin;
    after_end = after.m_end;
  }
  const int row0 = int(seq.packed_q + chain * p.rows_q);
  // This sequence's and consumer's first turn; a step's is that plus its head's and query tile's.
  int* const turns = p.dq_turns + chain * backward_dq_turns(p.rows_q, p.batch, p.heads_q) +
                     backward_dq_turn(p.rows_q, p.batch, seq.packed_q, C::kM, b, 0, 0, wg);
  StepCursor at(w);
#pragma unroll 1
  for (int s = 0; s < w.steps(); ++s, at.advance(w)) {
    const int h = at.h, m = at.m;
    int* turn = turns + backward_dq_turn(p.rows_q, p.batch, 0, C::kM, 0, h, m, 0);
#pragma unroll 1
    for (int r = 0; r < C::kDqRounds; ++r) {
      const int handed = s * C::kDqRounds + r;  // the block's tiles before this one
      const DqRingTile<C> tile(handed);
      mbarrier_wait(bars.dq_full(wg), uint32_t(handed) & 1u);
      if (r == 0 && m >= after_begin && m < after_end) wait_for_turn(turn, n + chains);
      const uint32_t boxes = tile.address(smem, wg);
#pragma unroll
      for (int x = 0; x < kBoxes; ++x) {  // a bulk group per part
        tma_reduce_add_3d(args.dq_accum, boxes + x * C::DqTile::kBlockBytes, C::dq_col(wg) + r * kRoundCols + 32 * x,
                          h, row0 + m * C::kM + C::dq_row(wg));
        if ((x + 1) % kPerPart == 0) bulk_commit();
      }
#pragma unroll
      for (int g = 0; g < kParts; ++g) {  // each part back to the consumer once TMA has read it
        if (kParts - 1 - g == 1)
          bulk_wait_read<1>();
        else
          bulk_wait_read<0>();
        mbarrier_arrive(bars.dq_empty(wg, (tile.first_box() + g * kPerPart) / kPerPart));
      }
      if (p.deterministic && r == C::kDqRounds - 1) {  // the tile's next adder waits for ours to land
        bulk_wait<0>();
        pass_turn(turn, n);
      }
    }
  }
  bulk_wait<0>();  // the block's shared memory lives until its adds are done
}

// Window::visible in 32-bit arithmetic, without branches (the consumers' masks).
__device__ __forceinline__ bool visible(const semantics::Window& w, int i, int j) {
  const int d = j - i - (w.seqlen_k - w.seqlen_q);  // key offset from the diagonal
  return (j < w.seqlen_k) & (w.left < 0 | d >= -w.left) & (w.right < 0 | d <= w.right);
}

// S^T -> P^T = exp2(S^T - lse) in place for a consumer's part of the kM x kN tile of step rows m0
// and keys j0: element [jt][e] is query query(jt, e) of the step and key key(jt, e). Masked entries
// (and rows past the sequence, whose lse is +inf) become 0.
template <bool kGeneral, int kM, int kN, int kTiles, typename QueryOf, typename KeyOf>
__device__ __forceinline__ void to_probabilities(float (&st)[kTiles][4], const float* lse2, const ScoreRule& rule,
                                                 int m0, int64_t j0, QueryOf query, KeyOf key) {
  if (kGeneral) {
#pragma unroll
    for (int jt = 0; jt < kTiles; ++jt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[jt][e] = rule.transform32(st[jt][e], m0 + query(jt, e), key(jt, e));
  }
  if (!rule.block_unmasked(m0, kM, j0, kN)) {
#pragma unroll
    for (int jt = 0; jt < kTiles; ++jt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!visible(rule.window, m0 + query(jt, e), key(jt, e))) st[jt][e] = -INFINITY;
  }
  const float exp_scale = kGeneral ? 1.f : rule.exp_scale;
#pragma unroll
  for (int jt = 0; jt < kTiles; ++jt)
#pragma unroll
    for (int e = 0; e < 4; ++e) st[jt][e] = fast_exp2(fmaf(st[jt][e], exp_scale, -lse2[query(jt, e)]));
}

// Softcap's derivative 1 - (capped / cap)^2 at a probability p = exp2(log2(e) (capped + bias) -
// lse2), with the capped score recovered from p instead of kept in registers from the forward
// transform (which would take kTiles x 4 more of them). p = 0 (masked, or below fp32) recovers
// -inf, clamped to a factor of 0: its dS is 0 anyway.
__device__ __forceinline__ float softcap_grad_at(float p, float lse2, float bias, float cap) {
  const float capped = fmaf(fast_log2(p) + lse2, kLn2, -bias);
  const float r = fminf(fmaxf(capped / cap, -1.f), 1.f);
  return 1.f - r * r;
}

// dP^T -> dS^T = P^T (dP^T - delta) (times softcap's derivative) in place.
template <bool kGeneral, int kTiles, typename QueryOf, typename KeyOf>
__device__ __forceinline__ void to_score_gradients(const float (&pt)[kTiles][4], float (&dpt)[kTiles][4],
                                                   const float* lse2, const float* delta, const ScoreRule& rule,
                                                   int m0, QueryOf query, KeyOf key) {
#pragma unroll
  for (int jt = 0; jt < kTiles; ++jt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float ds = pt[jt][e] * (dpt[jt][e] - delta[query(jt, e)]);
      dpt[jt][e] = ds;
      if (kGeneral && rule.softcap > 0.f) {
        const float bias = rule.alibi_bias32(m0 + query(jt, e), key(jt, e));
        dpt[jt][e] = ds * softcap_grad_at(pt[jt][e], lse2[query(jt, e)], bias, rule.softcap);
      }
    }
}

// The offsets store_dq_tile uses: groups j and j + 1 of row r + 8 half in box x sit at the first
// pair's offset of row r, with bit 4 flipped when j % 4 == 2, plus x boxes and 8 half rows (the
// swizzle XORs the 16-byte chunk index with the row % 8 that rows r and r + 8 share).
template <typename DqTile>
constexpr bool dq_store_offsets_follow() {
  for (int row = 0; row + 8 < 64; ++row)
    for (int q = 0; q < 4; ++q)
      for (int j = 0; j < DqTile::kBytes / DqTile::kBlockBytes * 4; j += 2)
        for (int half = 0; half < 2; ++half) {
          const uint32_t first = DqTile::offset(row, dq_fragment_position(2 * q));
          if (DqTile::offset(row + 8 * half, dq_fragment_position(8 * j + 2 * q)) !=
              (first ^ ((j % 4) / 2 * 16)) + (j / 4) * DqTile::kBlockBytes + half * 8 * 128)
            return false;
        }
  return true;
}

// A consumer's fp32 dQ accumulators (kCols columns, in fragment order: dq_fragment_position) into
// its dQ ring as the tile handed over after `handed` others, each 32-column box once its producer
// thread's TMA has read what that ring box held: boxes [kBoxBegin, kBoxEnd) of the tile, all by
// default. The caller announces the tile (announce_dq_tile) after a proxy fence, which it may
// share, once every box is stored.
template <typename C, int kCols, int kBoxBegin = 0, int kBoxEnd = kCols / 32>
__device__ __forceinline__ void store_dq_tile(const float (&dq)[kCols / 8][4], uint32_t smem,
                                              const BackwardBarriers<C>& bars, int wg, int handed) {
  using DqTile = typename C::DqTile;
  static_assert(kCols == DqTile::kBytes / DqTile::kBlockBytes * 32, "the tile's whole 32-column boxes");
  static_assert(dq_store_offsets_follow<DqTile>(), "the store's offsets below");
  const DqRingTile<C> ring_tile(handed);
  const uint32_t tile = ring_tile.address(smem, wg);
  const int lane = threadIdx.x % 32, row = 16 * ((threadIdx.x % 128) / 32) + lane / 4;
  // The thread's first 16 bytes; the others differ by constants and one bit (one register).
  const uint32_t first = DqTile::offset(row, dq_fragment_position(2 * (lane % 4)));
#pragma unroll
  for (int j = 4 * kBoxBegin; j < 4 * kBoxEnd; j += 2) {  // groups j and j + 1: 16 contiguous bytes in fragment order
    if (j % (4 * ring_tile.kPerPart) == 0) {
      const int part = (ring_tile.first_box() + j / 4) / ring_tile.kPerPart;
      mbarrier_wait(bars.dq_empty(wg, part), ring_tile.parity(j / 4) ^ 1u);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t at = (first ^ ((j % 4) / 2 * 16)) + (j / 4) * DqTile::kBlockBytes + half * 8 * 128;
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(tile + at), "f"(dq[j][2 * half]),
                   "f"(dq[j][2 * half + 1]), "f"(dq[j + 1][2 * half]), "f"(dq[j + 1][2 * half + 1]));
    }
  }
}
// Every thread, after a proxy fence that follows its stores: its part of the tile is written.
template <typename C>
__device__ __forceinline__ void announce_dq_tile(const BackwardBarriers<C>& bars, int wg) {
  mbarrier_arrive(bars.dq_full(wg));
}
// The tile's boxes [kBoxBegin, kBoxEnd) (the rest already stored), then its announcement.
template <typename C, int kCols, int kBoxBegin = 0, int kBoxEnd = kCols / 32>
__device__ __forceinline__ void hand_over_dq_tile(const float (&dq)[kCols / 8][4], uint32_t smem,
                                                  const BackwardBarriers<C>& bars, int wg, int handed) {
  store_dq_tile<C, kCols, kBoxBegin, kBoxEnd>(dq, smem, bars, wg, handed);
  fence_async_shared();  // the writes, before TMA reads them
  announce_dq_tile(bars, wg);
}

// dK = scale * dK and dV of a consumer's keys key(half) (those below keys_valid), for the rows
// half of its accumulators, in 16-byte stores of the head dim's columns.
template <typename T, int kCols, typename KeyOf>
__device__ __forceinline__ void store_key_gradients(const KernelParams& p, const Sequence& seq, int b, int hk,
                                                    const KeyBlockWork& w, const float (&dk)[kCols / 8][4],
                                                    const float (&dv)[kCols / 8][4], KeyOf key_of) {
  using Elem = typename T::storage;
  Elem* dk_rows = operand_row<Elem>(p.dk, b, seq.k_start + w.j0, hk);
  Elem* dv_rows = operand_row<Elem>(p.dv, b, seq.k_start + w.j0, hk);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = key_of(half);
    const bool valid = key < w.keys_valid;
    const int row = valid ? key : 0;
    store_fragment_row<T>(dk, half, p.scale, dk_rows + row * p.dk.row, valid, p.head_dim);
    store_fragment_row<T>(dv, half, 1.f, dv_rows + row * p.dv.row, valid, p.head_dim);
  }
}

// One block: the barriers, then the producer warpgroup (thread 0 loads tiles, warp 1 copies
// rows, lanes 0 of warps 2 and 3 add the consumers' dQ tiles) and the two consumers.
template <typename C, typename Consumer>
__device__ __forceinline__ void run_backward_block(const BackwardArgs& args) {
  const KernelParams& p = args.p;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  // A block per key block of the longest sequence, kv head and batch (backward_grid); in
  // deterministic mode key blocks run in descending order (wait_for_turn).
  int b = blockIdx.z, hk, n;
  if (p.head_group > 1) {
    const int pair = grouped_head(blockIdx.z, blockIdx.x, p.head_group);
    if (pair >= p.batch * p.heads_kv) return;  // the last group's spare blocks
    b = pair / p.heads_kv;
    hk = pair % p.heads_kv;
    n = int(blockIdx.y);
  } else {
    const bool interleaved = backward_interleaves_heads<C::kN>(p);
    hk = interleaved ? int(blockIdx.x) : int(blockIdx.y);
    n = interleaved         ? int(gridDim.y - 1 - blockIdx.y)
        : p.deterministic ? int(gridDim.x - 1 - blockIdx.x)
                          : int(blockIdx.x);
  }
  const Sequence seq = Sequence::of(p, b);
  if (n * C::kN >= seq.seqlen_k) return;
  const KeyBlockWork w = KeyBlockWork::of<C::kM, C::kN>(p, seq, hk, n);

  const BackwardBarriers<C> bars{smem + C::kBarrierOffset};
  if (threadIdx.x == 0) {
    mbarrier_init(bars.kv_full(), 1);
    for (int s = 0; s < C::kStages; ++s) {
      mbarrier_init(bars.full(s), 1 + 32);  // the TMA thread's expect-tx and the row warp's lanes
      mbarrier_init(bars.empty(s), 256);  // every consumer thread: it also reads the stage's rows
      if constexpr (C::kDoApart) {
        mbarrier_init(bars.do_full(s), 1);  // the TMA thread's expect-tx
        mbarrier_init(bars.do_empty(s), 256);
      }
    }
    for (int c = 0; c < 2; ++c) {
      mbarrier_init(bars.dq_full(c), 128);  // the consumer's threads
      for (int part = 0; part < C::kDqRingParts; ++part)
        mbarrier_init(bars.dq_empty(c, part), 1);  // its producer thread, once TMA has read the part
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  const int wg = int(threadIdx.x) / 128, warp = int(threadIdx.x) / 32;
  if (wg == 0) {
    registers_release<C::kProducerRegisters>();
    if (threadIdx.x == 0) produce_tiles<C>(args, seq, b, hk, w, smem, bars);
    if (warp == 1) produce_rows<C>(p, seq, w, smem, bars);
    if (warp >= 2 && threadIdx.x % 32 == 0) reduce_dq_tiles<C>(args, seq, b, hk, n, w, smem, bars, warp - 2);
  } else {
    registers_claim<C::kConsumerRegisters>();
    // The consumer index through a shuffle: the compiler then knows it uniform and keeps what
    // derives from it (barrier ids, wgmma descriptors) in uniform registers.
    Consumer consumer{p, seq, b, hk, smem, bars, __shfl_sync(0xffffffffu, wg - 1, 0)};
    consumer.run(w);
  }
}

// One consumer warpgroup: 64 keys, dK and dV in registers.
template <typename T, int kD, bool kGeneral>
struct BackwardConsumer {
  using C = BackwardConfig<T, kD, kGeneral>;
  static constexpr int kM = C::kM, kN = C::kN;

  const KernelParams& p;
  const Sequence& seq;
  int b, hk;
  uint32_t smem;
  BackwardBarriers<C> bars;
  int wg;  // consumer index: keys [64 wg, 64 wg + 64) of the block
  float dk[kD / 8][4], dv[kD / 8][4];

  __device__ uint32_t k_tile() const { return smem; }
  __device__ uint32_t v_tile() const { return smem + C::kVOffset; }
  __device__ uint32_t q_tile(int stage) const { return smem + C::kQOffset + stage * C::QTile::kBytes; }
  __device__ uint32_t do_tile(int stage) const { return smem + C::kDoOffset + stage * C::QTile::kBytes; }
  __device__ uint32_t ds_tile(int buffer) const { return smem + C::kDsOffset + buffer * C::DsTile::kBytes; }
  __device__ const float* rows(int stage) const {
    return reinterpret_cast<const float*>(__cvta_shared_to_generic(smem + C::kRowsOffset)) + stage * 2 * kM;
  }

  __device__ void run(const KeyBlockWork& w) {
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
    if (w.steps() > 0) {
      // Consumer 0 goes first (pass_turn with the barrier id as an immediate: through pass_turn
      // the id is computed at run time and the kernel spills 8 bytes).
      if (wg == 1) named_barrier_arrive(kTurnBarrier, 256);
      mbarrier_wait(bars.kv_full(), 0);
      for (int s = 0; s < w.steps(); ++s) step(w, s);
      if (wg == 0) take_turn();  // the last turn consumer 1 passed, so that no barrier is left half-done
      last_dq(w.steps() - 1);
    }
    store_dk_dv(w);
  }

  __device__ void step(const KeyBlockWork& w, int s) {
    const int h = w.head(s), m0 = w.m_block(s) * kM;
    const RingSlot<C::kStages> slot = RingSlot<C::kStages>::of(s);
    using QTile = typename C::QTile;
    using KTile = typename C::KTile;
    using DsTile = typename C::DsTile;
    mbarrier_wait(bars.full(slot.stage), slot.parity);

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's keys; P^T while dP^T is computed.
    float st[kM / 8][4], dpt[kM / 8][4];
    take_turn();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      WgmmaOp<T, kM>::template ss<0, 0>(flat<kM>(st), k_major_descriptor<KTile>(k_tile(), 64 * wg, kk),
                                        k_major_descriptor<QTile>(q_tile(slot.stage), 0, kk), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      WgmmaOp<T, kM>::template ss<0, 0>(flat<kM>(dpt), k_major_descriptor<KTile>(v_tile(), 64 * wg, kk),
                                        k_major_descriptor<QTile>(do_tile(slot.stage), 0, kk), kk > 0);
    wgmma_commit();
    pass_turn();
    wgmma_wait<1>();
    fence_registers(flat<kM>(st));
    const ScoreRule rule = ScoreRule::make(p, seq, b, h);
    const int lane = threadIdx.x % 32, key0 = int(w.j0) + 64 * wg + 16 * ((threadIdx.x % 128) / 32) + lane / 4;
    auto query = [&](int jt, int e) { return 8 * jt + 2 * (lane % 4) + e % 2; };  // local query of [jt][e]
    auto key = [&](int, int e) { return key0 + 8 * (e / 2); };                   // key of [jt][e]
    to_probabilities<kGeneral, kM, kN>(st, rows(slot.stage), rule, m0, w.j0, query, key);
    wgmma_wait<0>();
    fence_registers(flat<kM>(dpt));
    to_score_gradients<kGeneral>(st, dpt, rows(slot.stage), rows(slot.stage) + kM, rule, m0, query, key);

    // dV += P^T dO and dK += dS^T Q, the A operands straight from the accumulators.
    uint32_t pa[kM / 16][4], da[kM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) {
      accumulators_to_a<T>(st[2 * kk], st[2 * kk + 1], pa[kk]);
      accumulators_to_a<T>(dpt[2 * kk], dpt[2 * kk + 1], da[kk]);
    }
    take_turn();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk)
      WgmmaOp<T, kD>::template rs<1>(flat<kD>(dv), pa[kk], n_major_descriptor<QTile>(do_tile(slot.stage), kk), 1);
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk)
      WgmmaOp<T, kD>::template rs<1>(flat<kD>(dk), da[kk], n_major_descriptor<QTile>(q_tile(slot.stage), kk), 1);
    wgmma_commit();

    // dQ = dS K needs both consumers' dS^T (A read M-major, i.e. as the transpose of dS^T): dQ of
    // step s - 1 runs here, once the other consumer has written its part (a step ago, so the two
    // need not run in step), and dS^T of step s is written after it, when the other consumer's dQ
    // of step s - 2 (the buffer's last reader) is done: it finished that before it announced its
    // dS^T of step s - 1.
    // The dQ tile's stores and dS^T's share one proxy fence (each waits for the warp's stores).
    if (s > 0) {
      float dq[C::kDqCols / 8][4];
      issue_dq(dq, s - 1);
      pass_turn();
      finish_step(slot.stage);
      fence_registers(flat<C::kDqCols>(dq));
      store_dq_tile<C, C::kDqCols>(dq, smem, bars, wg, s - 1);
    } else {
      pass_turn();
      finish_step(slot.stage);
    }
    store_ds(da, ds_tile(s % 2));
    fence_async_shared();
    if (s > 0) announce_dq_tile(bars, wg);
    named_barrier_arrive(kDsWrittenBarrier + 2 * (s % 2) + wg, 256);
  }

  __device__ void take_turn() const { named_barrier_sync(kTurnBarrier + wg, 256); }
  __device__ void pass_turn() const { named_barrier_arrive(kTurnBarrier + 1 - wg, 256); }

  // This warpgroup's dQ of step s over all keys (columns [wg d/2, (wg + 1) d/2) of 64 rows, or
  // rows [64 wg, 64 wg + 64) of 128), once the other consumer's dS^T of step s is written.
  __device__ void issue_dq(float (&dq)[C::kDqCols / 8][4], int s) const {
    using DsTile = typename C::DsTile;
    using KTile = typename C::KTile;
    constexpr int kDqCols = C::kDqCols;
    named_barrier_sync(kDsWrittenBarrier + 2 * (s % 2) + (1 - wg), 256);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      WgmmaOp<T, kDqCols>::template ss<1, 1>(flat<kDqCols>(dq), n_major_descriptor<DsTile>(ds_tile(s % 2), kk, C::dq_row(wg)),
                                             n_major_descriptor<KTile>(k_tile(), kk, C::dq_col(wg)), kk > 0);
    wgmma_commit();
  }

  // Waits for dV and dK (done with the stage's Q and dO; and for dQ) and hands the stage back.
  __device__ void finish_step(int stage) {
    wgmma_wait<0>();
    fence_registers(flat<kD>(dv));
    fence_registers(flat<kD>(dk));
    mbarrier_arrive(bars.empty(stage));
  }

  // After the last step s: its dQ.
  __device__ void last_dq(int s) {
    float dq[C::kDqCols / 8][4];
    issue_dq(dq, s);
    wgmma_wait<0>();
    fence_registers(flat<C::kDqCols>(dq));
    hand_over_dq(dq, s);
  }

  // The dQ tile of step s, handed over through this warpgroup's dQ ring.
  __device__ void hand_over_dq(const float (&dq)[C::kDqCols / 8][4], int s) const {
    hand_over_dq_tile<C, C::kDqCols>(dq, smem, bars, wg, s);
  }

  // This thread's dS^T values (A-fragment words) into the [key][query] tile.
  __device__ void store_ds(const uint32_t (&da)[kM / 16][4], uint32_t tile) const {
    const int lane = threadIdx.x % 32;
    const int key = 64 * wg + 16 * ((threadIdx.x % 128) / 32) + lane / 4, col = 2 * (lane % 4);
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint32_t at = tile + C::DsTile::offset(key + 8 * (r % 2), 16 * kk + 8 * (r / 2) + col);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(da[kk][r]));
      }
  }

  // dK = scale * sum dS^T Q and dV of this warpgroup's valid keys and columns.
  __device__ void store_dk_dv(const KeyBlockWork& w) const {
    const int lane = threadIdx.x % 32;
    auto key = [&](int half) { return 64 * wg + 16 * ((threadIdx.x % 128) / 32) + lane / 4 + 8 * half; };
    store_key_gradients<T, kD>(p, seq, b, hk, w, dk, dv, key);
  }
};

// kGeneral: scores need ScoreRule::transform (softcap, ALiBi, non-positive scale).
template <typename T, int kD, bool kGeneral>
__global__ void __launch_bounds__(BackwardConfig<T, kD, kGeneral>::kThreads, 1)
    backward_kernel(const __grid_constant__ BackwardArgs args) {
  run_backward_block<BackwardConfig<T, kD, kGeneral>, BackwardConsumer<T, kD, kGeneral>>(args);
}

}  // namespace flashattn::cuda::sm90

// Backward attention on sm_90a for a wide head dim (d = 256), where dK and dV of 64 keys would
// take a whole warpgroup's registers. A block owns 80 keys; its two consumer warpgroups split the
// keys of the score products and the head dim of the others, which take the queries as their K
// dimension with the head dim as rows (dK^T, dV^T) or columns (dQ):
//   S = Q K^T, dP = dO V^T               consumer w: all 64 queries x keys [40 w, 40 w + 40)
//   P, dS                                written to shared memory, [query][key], both halves
//   dV^T += dO^T P, dK^T += Q^T dS      consumer w: dims [128 w, 128 w + 128) x all 80 keys
//   dQ += dS K                           consumer w: the same dims, in two 64-column rounds
// Against 64 keys with the keys as rows (S^T = K Q^T), a step does 25% more work for the same
// loads of Q and dO and the same dQ tile, and each score product reads Q once per consumer where
// S^T read all of K. Q and dO have one stage (K, V, Q and dO take 144 KB); the producer, the row
// warp and the dQ reduce-adds are those of the narrow kernel (backward_kernel.cuh). At the end each
// consumer stages its dims of dK and dV in the K and V tiles and writes whole rows. Deterministic
// mode (plain scores) has a kernel of its own that holds each step's last dQ box (kHoldDqBox).
#pragma once

#include "cuda/sm90/backward_kernel.cuh"

namespace flashattn::cuda::sm90 {

// kHoldDqBox (the deterministic kernel): each step's last dQ box waits in registers until the next
// step's S is issued (WideBackwardConsumer::hold_last_box).
template <typename T, int D, bool kGeneral, bool kHoldDqBox = false>
struct WideBackwardConfig {
  static constexpr int kD = D;
  static constexpr BackwardShape kShape = backward_shape(kD);
  static constexpr int kM = kShape.block_m, kN = kShape.block_n, kStages = kShape.stages;
  static_assert(kM == 64 && kN == 80 && kStages == 1, "80 keys, 64-row steps, one Q/dO stage");
  static constexpr int kThreads = 384;
  static constexpr int kKeys = kN / 2;      // S and dP columns of a consumer
  static constexpr int kCols = kD / 2;      // dK^T and dV^T rows, dQ columns of a consumer
  static constexpr int kDqCols = kCols;
  static constexpr int kDqRounds = backward_dq_rounds(kD);  // dQ tiles of kCols / 2 columns a consumer hands over per step
  static constexpr bool kDoApart = backward_do_apart(kD);
  static_assert(kDoApart, "the consumers wait for dO after issuing S");
  static constexpr int kColumnBlocks = kD / 64;
  using QTile = SwizzledTile<kM, kD>;                   // Q and dO
  using KTile = SwizzledTile<kN, kD>;                   // K and V
  using PTile = SwizzledTile<kM, (kN + 63) / 64 * 64>;  // P or dS, [query][key]
  using DqTile = SwizzledFloatTile<kM, kDqCols / kDqRounds>;  // a tile handed over: two 32-column boxes
  static constexpr int kDqRingBoxes = backward_dq_ring_boxes(kD);
  static constexpr int kDqBoxesPerPart = backward_dq_boxes_per_part(kD), kDqRingParts = backward_dq_ring_parts(kD);
  __device__ static int dq_row(int) { return 0; }
  __device__ static int dq_col(int wg) { return wg * kDqCols; }
  static constexpr int kVOffset = KTile::kBytes;
  static constexpr int kQOffset = 2 * KTile::kBytes;
  static constexpr int kDoOffset = kQOffset + kStages * QTile::kBytes;
  static constexpr int kPOffset = kDoOffset + kStages * QTile::kBytes;
  static constexpr int kDsOffset = kPOffset + PTile::kBytes;
  static constexpr int kDqOffset = kDsOffset + PTile::kBytes;
  static_assert(kDqOffset % 1024 == 0, "swizzled TMA boxes start on the 1024-byte swizzle period");
  static_assert(2 * PTile::kBytes == backward_score_tile_bytes(kD), "the host reads the same size");
  static constexpr int kRowsOffset = kDqOffset + 2 * kDqRingBoxes * DqTile::kBlockBytes;  // a dQ ring per consumer
  static constexpr int kBarrierOffset = kRowsOffset + kStages * 2 * kM * 4;
  static constexpr int kBarriers = backward_barriers(kStages, kDoApart, kDqRingParts);
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;
  static_assert(kSmemBytes == backward_smem_bytes(kD), "the host reads the same size");
  // 40 / 232 as in the narrow kernel: the dQ reduce thread spills in 24.
  static constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= 384 * 168, "over the block's registers");
};

// Named barriers between the two consumers (256 threads): the P and dS tiles are free (both are
// done reading the last step's), and they are written (both halves).
constexpr int kWideTilesFree = 1, kWideTilesWritten = 2;
// Named barriers 3 + w: consumer w's dK and dV are staged (its 128 threads).
constexpr int kWideStaged = 3;

template <typename T, int kD, bool kGeneral, bool kHoldDqBox>
struct WideBackwardConsumer {
  using C = WideBackwardConfig<T, kD, kGeneral, kHoldDqBox>;
  static constexpr int kM = C::kM, kN = C::kN, kKeys = C::kKeys, kCols = C::kCols;
  static constexpr int kRoundCols = kCols / C::kDqRounds;
  static constexpr int kRoundBoxes = kRoundCols / 32;  // 32-column dQ boxes of a round
  static_assert(C::kDqRounds == 2, "issue_gradients writes out two dQ rounds");
  static constexpr int kDimTiles = kCols / 64;  // m64 products of dK^T and dV^T

  const KernelParams& p;
  const Sequence& seq;
  int b, hk;
  uint32_t smem;
  BackwardBarriers<C> bars;
  int wg;  // consumer index: keys [40 wg, +40) of S and dP, dims [128 wg, +128) of dK, dV, dQ
  float dkt[kDimTiles][kN / 8][4], dvt[kDimTiles][kN / 8][4];
  float held[kRoundCols / 8][4];  // kHoldDqBox: the last box of the previous step's round 1

  __device__ uint32_t k_tile() const { return smem; }
  __device__ uint32_t v_tile() const { return smem + C::kVOffset; }
  __device__ uint32_t q_tile() const { return smem + C::kQOffset; }
  __device__ uint32_t do_tile() const { return smem + C::kDoOffset; }
  __device__ uint32_t p_tile() const { return smem + C::kPOffset; }
  __device__ uint32_t ds_tile() const { return smem + C::kDsOffset; }
  __device__ const float* rows() const { return reinterpret_cast<const float*>(__cvta_shared_to_generic(smem + C::kRowsOffset)); }

  // Row of accumulator element [jt][e] of this thread (a query of S and dP, a dim of a 64-dim tile
  // of dK^T and dV^T), and the key (column) of score element [jt][e], in the block.
  __device__ int row_of(int e) const { return 16 * ((threadIdx.x % 128) / 32) + (threadIdx.x % 32) / 4 + 8 * (e / 2); }
  __device__ int key_of(int jt, int e) const { return kKeys * wg + 8 * jt + 2 * (threadIdx.x % 4) + e % 2; }

  __device__ void run(const KeyBlockWork& w) {
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i)
#pragma unroll
      for (int jt = 0; jt < kN / 8; ++jt)
#pragma unroll
        for (int e = 0; e < 4; ++e) dkt[i][jt][e] = dvt[i][jt][e] = 0.f;
    if (w.steps() > 0) {
      mbarrier_wait(bars.kv_full(), 0);
      for (int s = 0; s < w.steps(); ++s) step(w, s);
      if constexpr (kHoldDqBox) hand_over_held_box(w.steps() - 1);
    }
    store_dk_dv(w);
  }

  __device__ void step(const KeyBlockWork& w, int s) {
    const int h = w.head(s), m0 = w.m_block(s) * kM;
    using QTile = typename C::QTile;
    using KTile = typename C::KTile;
    using PTile = typename C::PTile;
    mbarrier_wait(bars.full(0), uint32_t(s) & 1u);

    // S and dP for all queries and this consumer's keys.
    float sc[kKeys / 8][4], dp[kKeys / 8][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      WgmmaOp<T, kKeys>::template ss<0, 0>(flat<kKeys>(sc), k_major_descriptor<QTile>(q_tile(), 0, kk),
                                           k_major_descriptor<KTile>(k_tile(), kKeys * wg, kk), kk > 0);
    wgmma_commit();
    if constexpr (kHoldDqBox)
      if (s > 0) hand_over_held_box(s - 1);  // while S runs
    mbarrier_wait(bars.do_full(0), uint32_t(s) & 1u);  // dO may land after Q: S runs meanwhile
    wgmma_fence();  // after the wait's loop, before dP's products
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      WgmmaOp<T, kKeys>::template ss<0, 0>(flat<kKeys>(dp), k_major_descriptor<QTile>(do_tile(), 0, kk),
                                           k_major_descriptor<KTile>(v_tile(), kKeys * wg, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<1>();
    fence_registers(flat<kKeys>(sc));
    const ScoreRule rule = ScoreRule::make(p, seq, b, h);
    auto query = [this](int, int e) { return row_of(e); };
    // The block's first key through an opaque move: each step recomputes the keys of its mask
    // instead of keeping them (loop invariants) in registers across steps.
    int j0 = int(w.j0);
    asm volatile("mov.b32 %0, %0;\n" : "+r"(j0));
    auto key = [this, j0](int jt, int e) { return j0 + key_of(jt, e); };
    to_probabilities<kGeneral, kM, kN>(sc, rows(), rule, m0, w.j0, query, key);
    wgmma_wait<0>();
    fence_registers(flat<kKeys>(dp));
    to_score_gradients<kGeneral>(sc, dp, rows(), rows() + kM, rule, m0, query, key);

    // Both halves of P and dS into shared memory, once both consumers are done with the last.
    named_barrier_sync(kWideTilesFree, 256);
    store_tile(sc, p_tile());
    store_tile(dp, ds_tile());
    fence_async_shared();
    named_barrier_sync(kWideTilesWritten, 256);
    issue_gradients(s);
  }

  // The products that read P and dS, for this consumer's dims: dV^T += dO^T P, dK^T += Q^T dS,
  // and dQ = dS K in rounds of kRoundCols columns. Round 0 is queued behind dV^T and dK^T, so that
  // the tensor cores have it while this consumer waits for them. dO and Q are handed back as
  // their products complete (dK^T first measured the same on the H200).
  __device__ void issue_gradients(int s) {
    wgmma_fence();
    issue_key_gradients(dvt, do_tile(), p_tile());
    issue_key_gradients(dkt, q_tile(), ds_tile());
    float dq[kRoundCols / 8][4];
    issue_dq_round(dq, 0);
    wgmma_wait<2>();
    fence_gradients(dvt);
    mbarrier_arrive(bars.do_empty(0));
    wgmma_wait<1>();
    fence_gradients(dkt);
    mbarrier_arrive(bars.empty(0));  // every consumer thread (it also read the step's rows)
    wgmma_wait<0>();
    fence_registers(flat<kRoundCols>(dq));
    hand_over_dq(dq, 0, s);
    issue_dq_round(dq, 1);
    wgmma_wait<0>();
    fence_registers(flat<kRoundCols>(dq));
    if constexpr (kHoldDqBox)
      hold_last_box(dq, s);
    else
      hand_over_dq(dq, 1, s);
  }

  // Round 1's boxes but the last into the ring, the last kept in `held`: its ring box is the one
  // round 0 wrote first, which in deterministic mode TMA reads only after the tile's turn, so
  // storing it here would wait for the turn. It goes in with the tile's announcement under the
  // next step's S (hand_over_held_box).
  __device__ void hold_last_box(const float (&dq)[kRoundCols / 8][4], int s) {
    store_dq_tile<C, kRoundCols, 0, kRoundBoxes - 1>(dq, smem, bars, wg, s * C::kDqRounds + 1);
#pragma unroll
    for (int j = 4 * (kRoundBoxes - 1); j < kRoundCols / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)  // a copy ptxas does not count as wgmma's registers
        asm volatile("mov.b32 %0, %1;\n" : "=f"(held[j][e]) : "f"(dq[j][e]));
  }
  __device__ void hand_over_held_box(int s) {
    hand_over_dq_tile<C, kRoundCols, kRoundBoxes - 1, kRoundBoxes>(held, smem, bars, wg, s * C::kDqRounds + 1);
  }

  __device__ void issue_dq_round(float (&dq)[kRoundCols / 8][4], int r) const {
    using KTile = typename C::KTile;
    using PTile = typename C::PTile;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      WgmmaOp<T, kRoundCols>::template ss<0, 1>(flat<kRoundCols>(dq), k_major_descriptor<PTile>(ds_tile(), 0, kk),
                                                n_major_descriptor<KTile>(k_tile(), kk, kCols * wg + kRoundCols * r),
                                                kk > 0);
    wgmma_commit();
  }

  // acc^T += a^T b for this consumer's dims (dV^T from dO and P, dK^T from Q and dS), one commit group.
  __device__ void issue_key_gradients(float (&acc)[kDimTiles][kN / 8][4], uint32_t a, uint32_t b) const {
    using QTile = typename C::QTile;
    using PTile = typename C::PTile;
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i)
#pragma unroll
      for (int kk = 0; kk < kM / 16; ++kk)
        WgmmaOp<T, kN>::template ss<1, 1>(flat<kN>(acc[i]), n_major_descriptor<QTile>(a, kk, kCols * wg + 64 * i),
                                          n_major_descriptor<PTile>(b, kk), 1);
    wgmma_commit();
  }

  __device__ static void fence_gradients(float (&acc)[kDimTiles][kN / 8][4]) {
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) fence_registers(flat<kN>(acc[i]));
  }

  // This thread's score pairs (two neighbouring keys of a query), in T, into a [query][key] tile.
  __device__ void store_tile(const float (&acc)[kKeys / 8][4], uint32_t tile) const {
#pragma unroll
    for (int jt = 0; jt < kKeys / 8; ++jt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t at = tile + C::PTile::offset(row_of(2 * half), key_of(jt, 0));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack2<T>(acc[jt][2 * half], acc[jt][2 * half + 1])));
      }
  }

  // dQ round r of step s through this consumer's ring (the block's tile kDqRounds s + r).
  __device__ void hand_over_dq(const float (&dq)[kRoundCols / 8][4], int r, int s) {
    hand_over_dq_tile<C, kRoundCols>(dq, smem, bars, wg, s * C::kDqRounds + r);
  }

  // dK = scale * sum dS^T Q and dV of the valid keys and this consumer's dims, staged [key][dim]
  // in the K and V tiles so that rows go out in coalesced 16-byte stores. This consumer's dims of
  // both tiles are free once its last products are done: the other one reads K and V only for S
  // and dP, before the last step's barrier, and only its own dims of K for dQ.
  __device__ void store_dk_dv(const KeyBlockWork& w) const {
    stage_gradients(dkt, k_tile(), p.scale);
    stage_gradients(dvt, v_tile(), 1.f);
    named_barrier_sync(kWideStaged + wg, 128);
    copy_out(p.dk, k_tile(), w);
    copy_out(p.dv, v_tile(), w);
  }

  // The accumulators hold dims as rows, a thread two neighbouring keys of a dim; lanes l and l ^ 4
  // hold neighbouring dims, so one exchange gives each a pair of dims of one key (lane l the first
  // key, l ^ 4 the second): one 4-byte write, the 32 lanes of a warp on 32 banks (8 keys of
  // swizzled rows, 4 pairs of a 16-byte chunk).
  __device__ void stage_gradients(const float (&acc)[kDimTiles][kN / 8][4], uint32_t tile, float scale) const {
    const bool first = (threadIdx.x / 4) % 2 == 0;  // an even dim: this lane stages the first key
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i)
#pragma unroll
      for (int jt = 0; jt < kN / 8; ++jt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int dim = kCols * wg + 64 * i + (row_of(2 * half) & ~1);
          const int key = 8 * jt + 2 * (threadIdx.x % 4) + (first ? 0 : 1);
          const float* a2 = &acc[i][jt][2 * half];
          const float other = __shfl_xor_sync(0xffffffffu, first ? a2[1] : a2[0], 4);
          const uint32_t pair = first ? pack2<T>(a2[0] * scale, other * scale) : pack2<T>(other * scale, a2[1] * scale);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile + C::KTile::offset(key, dim)), "r"(pair));
        }
  }

  // This consumer's dims of the staged rows to `out`, 16 bytes a thread at a time.
  __device__ void copy_out(const Operand& out, uint32_t tile, const KeyBlockWork& w) const {
    using Elem = typename T::storage;
    constexpr int kChunksPerRow = kCols / 8;
    static_assert(kN * kChunksPerRow % 128 == 0, "whole rounds of the warpgroup");
    Elem* rows = operand_row<Elem>(out, b, seq.k_start + w.j0, hk) + kCols * wg;
    const unsigned char* staged = reinterpret_cast<const unsigned char*>(__cvta_shared_to_generic(tile));
#pragma unroll
    for (int c = threadIdx.x % 128; c < kN * kChunksPerRow; c += 128) {
      const int key = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      if (key >= w.keys_valid || kCols * wg + col >= p.head_dim) continue;
      *reinterpret_cast<uint4*>(rows + key * out.row + col) =
          *reinterpret_cast<const uint4*>(staged + C::KTile::offset(key, kCols * wg + col));
    }
  }
};

template <typename T, int kD, bool kGeneral, bool kHoldDqBox>
__global__ void __launch_bounds__(WideBackwardConfig<T, kD, kGeneral, kHoldDqBox>::kThreads, 1)
    wide_backward_kernel(const __grid_constant__ BackwardArgs args) {
  run_backward_block<WideBackwardConfig<T, kD, kGeneral, kHoldDqBox>, WideBackwardConsumer<T, kD, kGeneral, kHoldDqBox>>(
      args);
}

}  // namespace flashattn::cuda::sm90

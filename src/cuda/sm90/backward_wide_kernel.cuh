// Backward attention on sm_90a for a wide head dim (d = 256), where dK and dV of 64 keys no longer
// fit in one warpgroup's registers (256 a thread). A block owns 64 keys; its two consumer
// warpgroups share them and split the rest:
//   S^T = K Q^T, dP^T = V dO^T        consumer w: all 64 keys x queries [32 w, 32 w + 32)
//   P^T, dS^T                          written to shared memory, [key][query], both halves
//   dV += P^T dO, dK += dS^T Q         consumer w: columns [128 w, 128 w + 128), wgmma SS
//   dQ += dS K                         consumer w: the same columns, in two 64-column rounds
// Q and dO have one stage (K, V, Q and dO take 128 KB); the producer, the row warp and the dQ
// reduce-adds are those of the narrow kernel (backward_kernel.cuh), dQ in two rounds per step, each
// round's tile in a shared buffer of its own.
#pragma once

#include "cuda/sm90/backward_kernel.cuh"

namespace flashattn::cuda::sm90 {

template <typename T, int D, bool kGeneral>
struct WideBackwardConfig {
  static constexpr int kD = D;
  static constexpr BackwardShape kShape = backward_shape(kD);
  static constexpr int kM = kShape.block_m, kN = kShape.block_n, kStages = kShape.stages;
  static_assert(kM == 64 && kN == 64 && kStages == 1, "64 keys, 64-row steps, one Q/dO stage");
  static constexpr int kThreads = 384;
  static constexpr int kQueries = kM / 2;   // S^T columns of a consumer
  static constexpr int kCols = kD / 2;      // dK, dV and dQ columns of a consumer
  static constexpr int kDqCols = kCols;
  static constexpr int kDqRounds = 2;       // dQ tiles of kCols / 2 columns a consumer hands over per step
  static constexpr int kDqBuffers = backward_dq_buffers(kD);  // one per round
  static constexpr bool kDoApart = backward_do_apart(kD);
  static_assert(kDoApart, "the consumers wait for dO after issuing S^T");
  static constexpr int kColumnBlocks = kD / 64;
  using QTile = SwizzledTile<kM, kD>;   // Q and dO
  using KTile = SwizzledTile<kN, kD>;   // K and V
  using PTile = SwizzledTile<kN, kM>;   // P^T or dS^T, [key][query]
  using DqTile = SwizzledFloatTile<kM, kDqCols / kDqRounds>;
  __device__ static int dq_row(int) { return 0; }
  __device__ static int dq_col(int wg) { return wg * kDqCols; }
  static constexpr int kVOffset = KTile::kBytes;
  static constexpr int kQOffset = 2 * KTile::kBytes;
  static constexpr int kDoOffset = kQOffset + kStages * QTile::kBytes;
  static constexpr int kPOffset = kDoOffset + kStages * QTile::kBytes;
  static constexpr int kDsOffset = kPOffset + PTile::kBytes;
  static constexpr int kDqOffset = kDsOffset + PTile::kBytes;
  static_assert(kDqOffset % 1024 == 0, "swizzled TMA boxes start on the 1024-byte swizzle period");
  static constexpr int kRowsOffset = kDqOffset + 2 * kDqBuffers * DqTile::kBytes;
  static constexpr int kBarrierOffset = kRowsOffset + kStages * 2 * kM * 4;
  static constexpr int kBarriers = backward_barriers(kStages, kDqBuffers, kDoApart);
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;
  static_assert(kSmemBytes == backward_smem_bytes(kD), "the host reads the same size");
  // 40 / 232 as in the narrow kernel: the dQ reduce thread, with a buffer per round, spills in 24.
  static constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= 384 * 168, "over the block's registers");
};

// Named barriers between the two consumers (256 threads): the P^T and dS^T tiles are free (both
// are done reading the last step's), and they are written (both halves).
constexpr int kWideTilesFree = 1, kWideTilesWritten = 2;

template <typename T, int kD, bool kGeneral>
struct WideBackwardConsumer {
  using C = WideBackwardConfig<T, kD, kGeneral>;
  static constexpr int kM = C::kM, kN = C::kN, kQueries = C::kQueries, kCols = C::kCols;
  static constexpr int kRoundCols = kCols / C::kDqRounds;

  const KernelParams& p;
  const Sequence& seq;
  int b, hk;
  uint32_t smem;
  BackwardBarriers<C> bars;
  int wg;  // consumer index: queries [32 wg, +32) of S^T, columns [128 wg, +128) of dK, dV, dQ
  float dk[kCols / 8][4], dv[kCols / 8][4];

  __device__ uint32_t k_tile() const { return smem; }
  __device__ uint32_t v_tile() const { return smem + C::kVOffset; }
  __device__ uint32_t q_tile() const { return smem + C::kQOffset; }
  __device__ uint32_t do_tile() const { return smem + C::kDoOffset; }
  __device__ uint32_t p_tile() const { return smem + C::kPOffset; }
  __device__ uint32_t ds_tile() const { return smem + C::kDsOffset; }
  __device__ const float* rows() const { return reinterpret_cast<const float*>(__cvta_shared_to_generic(smem + C::kRowsOffset)); }

  // Row (key) and column (query) of accumulator element [jt][e] of this thread, in the block.
  __device__ int key_of(int e) const { return 16 * ((threadIdx.x % 128) / 32) + (threadIdx.x % 32) / 4 + 8 * (e / 2); }
  __device__ int query_of(int jt, int e) const { return kQueries * wg + 8 * jt + 2 * (threadIdx.x % 4) + e % 2; }

  __device__ void run(const KeyBlockWork& w) {
#pragma unroll
    for (int dt = 0; dt < kCols / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
    if (w.steps() > 0) {
      mbarrier_wait(bars.kv_full(), 0);
      for (int s = 0; s < w.steps(); ++s) step(w, s);
    }
    store_dk_dv(w);
  }

  __device__ void step(const KeyBlockWork& w, int s) {
    const int h = w.head(s), m0 = w.m_block(s) * kM;
    using QTile = typename C::QTile;
    using KTile = typename C::KTile;
    using PTile = typename C::PTile;
    mbarrier_wait(bars.full(0), uint32_t(s) & 1u);

    // S^T and dP^T for all keys and this consumer's queries.
    float st[kQueries / 8][4], dpt[kQueries / 8][4];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      WgmmaOp<T, kQueries>::template ss<0, 0>(flat<kQueries>(st), k_major_descriptor<KTile>(k_tile(), 0, kk),
                                              k_major_descriptor<QTile>(q_tile(), kQueries * wg, kk), kk > 0);
    wgmma_commit();
    mbarrier_wait(bars.do_full(0), uint32_t(s) & 1u);  // dO may land after Q: S^T runs meanwhile
    wgmma_fence();  // after the wait's loop, before dP^T's products
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      WgmmaOp<T, kQueries>::template ss<0, 0>(flat<kQueries>(dpt), k_major_descriptor<KTile>(v_tile(), 0, kk),
                                              k_major_descriptor<QTile>(do_tile(), kQueries * wg, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<1>();
    fence_registers(flat<kQueries>(st));
    const ScoreRule rule = ScoreRule::make(p, seq, b, h);
    auto query = [this](int jt, int e) { return query_of(jt, e); };
    auto key = [this, j0 = int(w.j0)](int e) { return j0 + key_of(e); };
    to_probabilities<kGeneral, kM, kN>(st, rows(), rule, m0, w.j0, query, key);
    wgmma_wait<0>();
    fence_registers(flat<kQueries>(dpt));
    to_score_gradients<kGeneral>(st, dpt, rows(), rows() + kM, rule, m0, query, key);

    // Both halves of P^T and dS^T into shared memory, once both consumers are done with the last.
    named_barrier_sync(kWideTilesFree, 256);
    store_tile(st, p_tile());
    store_tile(dpt, ds_tile());
    fence_async_shared();
    named_barrier_sync(kWideTilesWritten, 256);

    // dK += dS^T Q, then dV += P^T dO, for this consumer's columns: Q (with the rows) is handed
    // back first, which the next step's S^T needs first.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk)
      WgmmaOp<T, kCols>::template ss<0, 1>(flat<kCols>(dk), k_major_descriptor<PTile>(ds_tile(), 0, kk),
                                           n_major_descriptor<QTile>(q_tile(), kk, kCols * wg), 1);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk)
      WgmmaOp<T, kCols>::template ss<0, 1>(flat<kCols>(dv), k_major_descriptor<PTile>(p_tile(), 0, kk),
                                           n_major_descriptor<QTile>(do_tile(), kk, kCols * wg), 1);
    wgmma_commit();
    wgmma_wait<1>();
    fence_registers(flat<kCols>(dk));
    mbarrier_arrive(bars.empty(0));  // every consumer thread (it also read the step's rows)
    wgmma_wait<0>();
    fence_registers(flat<kCols>(dv));
    mbarrier_arrive(bars.do_empty(0));

    // dQ = dS K for this consumer's columns, a 64-column round at a time.
#pragma unroll 1
    for (int r = 0; r < C::kDqRounds; ++r) {
      float dq[kRoundCols / 8][4];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk)
        WgmmaOp<T, kRoundCols>::template ss<1, 1>(flat<kRoundCols>(dq), n_major_descriptor<PTile>(ds_tile(), kk),
                                                  n_major_descriptor<KTile>(k_tile(), kk, kCols * wg + kRoundCols * r),
                                                  kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_registers(flat<kRoundCols>(dq));
      hand_over_dq(dq, r, s);
    }
  }

  // This thread's accumulator pairs, in T, into a [key][query] tile.
  __device__ void store_tile(const float (&acc)[kQueries / 8][4], uint32_t tile) const {
#pragma unroll
    for (int jt = 0; jt < kQueries / 8; ++jt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint32_t at = tile + C::PTile::offset(key_of(2 * half), query_of(jt, 0));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(pack2<T>(acc[jt][2 * half], acc[jt][2 * half + 1])));
      }
  }

  // dQ round r of step s to this consumer's buffer r (handed over once a step).
  __device__ void hand_over_dq(const float (&dq)[kRoundCols / 8][4], int r, int s) {
    hand_over_dq_tile<typename C::DqTile, kRoundCols>(dq, dq_buffer<C>(smem, wg, r), bars, wg, s, r);
  }

  // dK = scale * sum dS^T Q and dV of the valid keys, this consumer's columns.
  __device__ void store_dk_dv(const KeyBlockWork& w) const {
    auto key = [this](int half) { return key_of(2 * half); };
    auto col = [this](int dt) { return int(kCols * wg + dt * 8 + 2 * (threadIdx.x % 4)); };
    store_key_gradients<T, kCols>(p, seq, b, hk, w, dk, dv, key, col);
  }
};

template <typename T, int kD, bool kGeneral>
__global__ void __launch_bounds__(WideBackwardConfig<T, kD, kGeneral>::kThreads, 1)
    wide_backward_kernel(const __grid_constant__ BackwardArgs args) {
  run_backward_block<WideBackwardConfig<T, kD, kGeneral>, WideBackwardConsumer<T, kD, kGeneral>>(args);
}

}  // namespace flashattn::cuda::sm90

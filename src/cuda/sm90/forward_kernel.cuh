// Forward attention on sm_90a: TMA, wgmma and warp specialisation (the FlashAttention-3 scheme).
//
// A block of a producer and two to four consumer warpgroups owns a tile of 128, 192 or 256
// query rows of one (batch, head) (forward_shape). The producer warpgroup gives up its registers and
// one thread streams Q once and K/V tiles through a ring of shared-memory stages by TMA, each
// stage guarded by a `full` mbarrier (bytes landed) and an `empty` one (consumers done). Each
// consumer warpgroup owns 64 query rows: S = Q K^T with both operands in shared memory, the
// online softmax in registers, O += P V with P straight from the score registers. Within a
// warpgroup, the softmax of block n runs while the tensor cores do P V of block n + 1 (from
// d = 128, where O is rescaled lazily, the wait for that P V stays after the softmax:
// wait_output_rescaled); across the warpgroups, named barriers make them take turns issuing
// GEMMs (pingpong), so one's softmax hides under the others' matrix work. At d = 64 and 128 the
// key steps after a tile's first two exponentiate against the row maxima kept so far and fall
// back to the exact softmax when a row outgrows them (speculative_step). Key blocks are visited
// last to first, so only the first ones meet the causal diagonal or the end of the keys.
//
// The grid is persistent (forward_persistent; at d = 256 all but the score-transform kernel): one
// block per multiprocessor takes tiles until none is left, the first by its index and the others
// from a counter (dynamic, so that the long and short tiles of a causal mask or a varlen batch
// even out). The producer fetches the next tile while the consumers finish the current one, hands
// them its coordinates and streams its K, V and Q behind the current ones; on 128-row tiles
// without a score transform the consumers issue the next tile's first S = Q K^T before the
// current tile's epilogue, so a tile's start and end (latency of the first loads, the epilogue)
// overlap its neighbours' work.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "cuda/common/mma.cuh"
#include "cuda/common/numeric.cuh"
#include "cuda/kernel_params.h"
#include "cuda/sm80/attention_common.cuh"
#include "cuda/sm80/forward_kernel.cuh"
#include "cuda/sm90/barrier.cuh"
#include "cuda/sm90/tile_shapes.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"

namespace flashattn::cuda::sm90 {

// The kernel's parameter: the common digest and the TMA maps of q, k and v.
struct ForwardArgs {
  CUtensorMap q, k, v;
  KernelParams p;
};

template <typename T, int kD, bool kTall, bool kGeneral>
struct ForwardConfig {
  static constexpr ForwardShape kShape = forward_shape(kD, kTall);
  static constexpr int kM = kShape.block_m, kN = kShape.block_n;
  static constexpr int kKStages = kShape.k_stages, kVStages = kShape.v_stages;
  static constexpr bool kPingpong = kShape.pingpong;
  static constexpr int kConsumers = kM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  using QTile = SwizzledTile<kM, kD>;
  using KVTile = SwizzledTile<kN, kD>;
  // Shared memory: Q, K stages, V stages, the O tile (forward_stages_output; otherwise O goes from
  // registers to global memory when persistent, through Q's tile when not), then the mbarriers
  // and the tile slots; 1024-byte aligned tiles.
  static constexpr bool kPersistent = forward_persistent(kD, kGeneral);
  static constexpr bool kStagedOutput = kPersistent && forward_stages_output(kD);  // O's tile of its own
  static constexpr int kKOffset = QTile::kBytes;
  static constexpr int kVOffset = kKOffset + kKStages * KVTile::kBytes;
  static constexpr int kOOffset = kVOffset + kVStages * KVTile::kBytes;
  static constexpr int kBarrierOffset = kOOffset + (kStagedOutput ? QTile::kBytes : 0);
  static constexpr int kBarriers = forward_barriers(kKStages, kVStages);
  static constexpr int kTileSlotOffset = kBarrierOffset + 8 * kBarriers;
  static constexpr int kSmemBytes = kTileSlotOffset + forward_tile_slot_bytes() + 1024;  // + slack to align the base
  static_assert(kSmemBytes == forward_smem_bytes(kD, kTall), "the host reads the same size");
  // Register budgets after reallocation (multiples of 8), within the block's launch allocation
  // (64 K registers shared by kThreads threads, in multiples of 8 per thread).
  static constexpr int kProducerRegisters = 24,
                       kConsumerRegisters = kConsumers == 2 ? 240 : kConsumers == 3 ? 160 : 112;
  static_assert(128 * kProducerRegisters + 128 * kConsumers * kConsumerRegisters <= kThreads * (65536 / kThreads / 8 * 8),
                "setmaxnreg moves registers inside the block's launch allocation");
  static_assert(kConsumers >= 2 && kConsumers <= 4, "two to four consumer warpgroups");
  // Named barriers: 1 + c is consumer c's turn to issue GEMMs, 1 + kConsumers + c its epilogue,
  // 1 + 2 kConsumers + c its vote on O's rescale.
  static constexpr int kTurnBarrier = 1, kEpilogueBarrier = 1 + kConsumers, kRescaleBarrier = 1 + 2 * kConsumers;
};

// The mbarriers of the ring, in the order they sit in shared memory.
template <int kKStages, int kVStages>
struct Barriers {
  uint32_t base;
  __device__ uint32_t q_full() const { return base; }
  __device__ uint32_t q_empty() const { return base + 8; }
  __device__ uint32_t k_full(int s) const { return base + 8 * (2 + s); }
  __device__ uint32_t k_empty(int s) const { return base + 8 * (2 + kKStages + s); }
  __device__ uint32_t v_full(int s) const { return base + 8 * (2 + 2 * kKStages + s); }
  __device__ uint32_t v_empty(int s) const { return base + 8 * (2 + 2 * kKStages + kVStages + s); }
  __device__ uint32_t tile_full(int slot) const { return base + 8 * (2 + 2 * kKStages + 2 * kVStages + slot); }
  __device__ uint32_t tile_empty(int slot) const {
    return base + 8 * (2 + 2 * kKStages + 2 * kVStages + kForwardTileSlots + slot);
  }
};

// Tile coordinates shared by the producer and the consumers.
struct ForwardTile {
  int b, h, m0, split;
  Sequence seq;
};

// The tiles of a call in the order of forward_tile_at (tile_shapes.h); varlen batches number
// max_seqlen_q's tiles for every sequence, and the ones past a sequence's end are skipped.
struct TileOrder {
  int m_blocks, splits, total;

  __device__ static TileOrder of(const KernelParams& p, int block_m) {
    const int m_blocks = (p.seqlen_q + block_m - 1) / block_m;
    return {m_blocks, p.num_splits, p.batch * p.heads_q * m_blocks * p.num_splits};
  }
  __device__ ForwardTile tile(const KernelParams& p, int index, int block_m) const {
    const ForwardTileCoordinates c =
        forward_tile_at(index, p.heads_q, p.batch * p.heads_q, m_blocks, splits, p.head_group);
    ForwardTile t;
    t.b = c.b;
    t.h = c.h;
    t.m0 = c.m_block * block_m;
    t.split = c.split;
    t.seq = Sequence::of(p, t.b);
    return t;
  }
};

// A tile's coordinates as the producer thread worked them out from its index: the divisions
// stay off the consumers' path from one tile to the next. With four consumers (112 registers) the
// ticket also numbers the tile's Q load, which the consumers would otherwise count themselves in
// a register that spills. (The sequence bounds, loads for varlen
// batches, and the key blocks the consumers work out themselves: held through the producer's
// tile wait, they would spill at its 24 registers.) index < 0: no tile left.
struct TileTicket {
  int b, h, m0, split, index;

  __device__ ForwardTile tile(const KernelParams& p) const {
    ForwardTile t;
    t.b = b;
    t.h = h;
    t.m0 = m0;
    t.split = split;
    t.seq = Sequence::of(p, b);
    return t;
  }
};
static_assert(sizeof(TileTicket) + 4 <= kForwardTicketBytes, "a ticket and its Q load's number fit a slot");

// The tile slots (tile_shapes.h): the producer writes a tile's ticket in slot j % kForwardTileSlots
// and arrives on the slot's full barrier; every consumer thread reads it there when it begins the
// tile and again for the tile's epilogue, then arrives on the slot's empty barrier. The word after
// the slots keeps the producer's tile total.
struct TileSlots {
  uint32_t base;
  __device__ void publish(int slot, const ForwardTile& t, int index) const {
    const uint32_t a = base + kForwardTicketBytes * slot;
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(t.b), "r"(t.h), "r"(t.m0), "r"(t.split)
                 : "memory");
    store(a + uint32_t(offsetof(TileTicket, index)), index);
  }
  __device__ void publish_q_load(int slot, uint32_t q_loads) const {
    store(base + kForwardTicketBytes * slot + uint32_t(sizeof(TileTicket)), int(q_loads));
  }
  __device__ uint32_t read_q_load(int slot) const {
    return uint32_t(load(base + kForwardTicketBytes * slot + uint32_t(sizeof(TileTicket))));
  }
  __device__ void publish_none(int slot) const {
    store(base + kForwardTicketBytes * slot + uint32_t(offsetof(TileTicket, index)), -1);
  }
  static __device__ void store(uint32_t address, int value) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(address), "r"(value) : "memory");
  }
  static __device__ int load(uint32_t address) {
    int value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(address) : "memory");
    return value;
  }
  __device__ TileTicket read(int slot) const {
    const uint32_t a = base + kForwardTicketBytes * slot;
    TileTicket t;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(t.b), "=r"(t.h), "=r"(t.m0), "=r"(t.split)
                 : "r"(a)
                 : "memory");
    t.index = load(a + uint32_t(offsetof(TileTicket, index)));
    return t;
  }
  __device__ void keep_total(int total) const { store(base + kForwardTileSlots * kForwardTicketBytes, total); }
  __device__ int kept_total() const { return load(base + kForwardTileSlots * kForwardTicketBytes); }
};

// A tile's key blocks under its score rule (the producer, which has none, makes one).
template <typename C>
__device__ KeyBlocks tile_key_blocks(const KernelParams& p, const ForwardTile& t, const ScoreRule& rule) {
  return KeyBlocks::of(rule, t.seq, t.m0, C::kM, C::kN, p.num_splits, t.split);
}
template <typename C>
__device__ KeyBlocks tile_key_blocks(const KernelParams& p, const ForwardTile& t) {
  return tile_key_blocks<C>(p, t, ScoreRule::make(p, t.seq, t.b, t.h));
}

// The producer thread: the K, V and Q loads of one tile. `ring` counts the key blocks streamed
// so far (the ring's position), `q_loads` the Q tiles loaded so far.
template <typename C>
__device__ void produce_tile(const ForwardArgs& args, const ForwardTile& t, KeyBlocks blocks, uint32_t smem,
                             const Barriers<C::kKStages, C::kVStages>& bars, int& ring, uint32_t& q_loads) {
  const KernelParams& p = args.p;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int batch = varlen ? 0 : t.b;  // varlen maps are one batch of packed rows
  const int hk = t.h / p.group;
#pragma unroll 1
  for (int n = blocks.end - 1; n >= blocks.begin; --n, ++ring) {
    const RingSlot<C::kKStages> k_slot = RingSlot<C::kKStages>::of(ring);
    const RingSlot<C::kVStages> v_slot = RingSlot<C::kVStages>::of(ring);
    const int row = int(t.seq.k_start) + n * C::kN;
    const uint32_t k_tile = smem + C::kKOffset + k_slot.stage * C::KVTile::kBytes;
    const uint32_t v_tile = smem + C::kVOffset + v_slot.stage * C::KVTile::kBytes;
    mbarrier_wait(bars.k_empty(k_slot.stage), k_slot.parity ^ 1u);
    mbarrier_arrive_expect_tx(bars.k_full(k_slot.stage), C::KVTile::kBytes);
#pragma unroll
    for (int cb = 0; cb < C::KVTile::kCols / 64; ++cb)
      tma_load_4d(k_tile + cb * C::KVTile::kBlockBytes, args.k, bars.k_full(k_slot.stage), cb * 64, row, hk, batch);
    if (n == blocks.end - 1) {
      // Q after the first K: the previous tile's consumers may still be reading Q's tile.
      mbarrier_wait(bars.q_empty(), (q_loads & 1u) ^ 1u);
      mbarrier_arrive_expect_tx(bars.q_full(), C::QTile::kBytes);
#pragma unroll
      for (int cb = 0; cb < C::QTile::kCols / 64; ++cb)
        tma_load_4d(smem + cb * C::QTile::kBlockBytes, args.q, bars.q_full(), cb * 64, int(t.seq.q_start) + t.m0,
                    t.h, batch);
      ++q_loads;
    }
    mbarrier_wait(bars.v_empty(v_slot.stage), v_slot.parity ^ 1u);
    mbarrier_arrive_expect_tx(bars.v_full(v_slot.stage), C::KVTile::kBytes);
#pragma unroll
    for (int cb = 0; cb < C::KVTile::kCols / 64; ++cb)
      tma_load_4d(v_tile + cb * C::KVTile::kBlockBytes, args.v, bars.v_full(v_slot.stage), cb * 64, row, hk, batch);
  }
}

// gridDim.x read where it is used: hoisted out of the producer's loop, it costs a spill at the
// producer's 24 registers.
__device__ __forceinline__ int grid_blocks() {
  int n;
  asm volatile("mov.u32 %0, %%nctaid.x;\n" : "=r"(n));
  return n;
}

// The producer thread: its block's tile, or (persistent) describe a tile to the consumers,
// stream it, fetch the next, until none is left. Tiles past a varlen sequence's end are skipped
// here: the consumers never see them.
template <typename C>
__device__ void produce(const ForwardArgs& args, uint32_t smem) {
  const KernelParams& p = args.p;
  tma_prefetch_map(args.q);
  tma_prefetch_map(args.k);
  tma_prefetch_map(args.v);
  int ring = 0;
  uint32_t q_loads = 0;
  const Barriers<C::kKStages, C::kVStages> bars{smem + C::kBarrierOffset};
  if constexpr (!C::kPersistent) {
    const ForwardTile t = TileOrder::of(p, C::kM).tile(p, int(blockIdx.x), C::kM);
    if (t.m0 < t.seq.seqlen_q) produce_tile<C>(args, t, tile_key_blocks<C>(p, t), smem, bars, ring, q_loads);
  } else {
    const TileSlots slots{smem + C::kTileSlotOffset};
    slots.keep_total(TileOrder::of(p, C::kM).total);  // in shared memory: a register would spill
    int index = int(blockIdx.x);
    for (int j = 0;;) {
      const int slot = j % kForwardTileSlots;
      const uint32_t free_parity = ((j / kForwardTileSlots) & 1) ^ 1u;
      if (index >= slots.kept_total()) {
        mbarrier_wait(bars.tile_empty(slot), free_parity);
        slots.publish_none(slot);
        mbarrier_arrive(bars.tile_full(slot));
        return;
      }
      const ForwardTile t = TileOrder::of(p, C::kM).tile(p, index, C::kM);
      if (t.m0 < t.seq.seqlen_q) {
        mbarrier_wait(bars.tile_empty(slot), free_parity);
        slots.publish(slot, t, index);
        if constexpr (C::kConsumers == 4) slots.publish_q_load(slot, q_loads);
        mbarrier_arrive(bars.tile_full(slot));
        ++j;
        produce_tile<C>(args, t, tile_key_blocks<C>(p, t), smem, bars, ring, q_loads);
      }
      index = atomicAdd(p.tile_counter, 1) + grid_blocks();
    }
  }
}

// One consumer warpgroup: 64 query rows of each tile through every key block of the tile.
template <typename T, int kD, bool kTall, bool kGeneral>
struct Consumer {
  using C = ForwardConfig<T, kD, kTall, kGeneral>;
  static constexpr int kN = C::kN;
  // Lazy rescaling (forward_detail::kLazyGrowthLog2) from d = 128, where the rescale it skips no
  // longer hides among the exponentials (wait_output_rescaled orders them apart); not in the
  // score-transform kernel, whose registers it would overflow at d = 256.
  static constexpr bool kLazy = kD >= 128 && !kGeneral;
  // From d = 128 the wait for P V is kept after the softmax (wait_output_rescaled); at d = 64 the
  // warpgroup's vote costs more than the overlap gains.
  static constexpr bool kOrdered = kD >= 128;
  // At d = 64 and 128 the key steps after a tile's first exponentiate speculatively against
  // the kept row maxima, without working out the block's (speculative_softmax).
  static constexpr bool kSpeculative = (kD == 64 || kD == 128) && !kGeneral;
  using Elem = typename T::storage;

  const KernelParams& p;
  uint32_t smem;
  Barriers<C::kKStages, C::kVStages> bars;
  int wg;  // consumer index
  // The tile in progress: its score rule, first query row, and the window diagonals of this
  // thread's two rows (set per tile: with folded rows a diagonal takes a remainder, kept out of
  // the key loop).
  ScoreRule rule;
  int m0 = 0;
  int diag[2] = {0, 0};
  float o[kD / 8][4] = {};
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  __device__ uint32_t k_tile(int stage) const { return smem + C::kKOffset + stage * C::KVTile::kBytes; }
  __device__ uint32_t v_tile(int stage) const { return smem + C::kVOffset + stage * C::KVTile::kBytes; }

  // Waits for this warpgroup's turn at the tensor cores / hands the turn to the next one (the
  // turn goes round the consumers in order). Above d = 128 they take turns on short sequences
  // only (up to 1k query rows; measured +1 to +4% there, and nothing to 3% slower beyond). The
  // condition is uniform, a kernel parameter: the turns' branches serialise no wgmma.
  __device__ bool pingpong() const { return C::kPingpong || p.seqlen_q <= 1024; }
  __device__ void take_turn() const {
    if (pingpong()) named_barrier_sync(C::kTurnBarrier + wg, 256);
  }
  __device__ void pass_turn() const {
    if (pingpong()) named_barrier_arrive(C::kTurnBarrier + (wg + 1) % C::kConsumers, 256);
  }
  // One arrival per warp frees a stage once all of this warpgroup's wgmma reading it are done.
  __device__ static void release(uint32_t bar) {
    if (threadIdx.x % 32 == 0) mbarrier_arrive(bar);
  }
  // Waits for this warpgroup's P V products (all but the kGroupsLeft youngest wgmma groups) and
  // orders O's registers after them.
  template <int kGroupsLeft = 0>
  __device__ void wait_output() {
    wgmma_wait<kGroupsLeft>();
    fence_registers(flat<kD>(o));
  }

  // This warp's index in its warpgroup, read through a shuffle from lane 0 so that the compiler
  // knows it uniform and keeps it in a uniform register. Where it would otherwise live through the
  // tile loop in a vector register, the d = 128 tall tiles' 160 registers spill it; elsewhere the
  // shuffle makes kernels spill (d = 64) or only changes their code, so they keep the plain index.
  static constexpr bool kUniformWarp = kTall && kD == 128;
  __device__ static int uniform_warp() { return __shfl_sync(0xffffffffu, (int(threadIdx.x) % 128) / 32, 0); }

  // Four consumers have 112 registers each. What a tile's start and epilogue derive from the
  // thread's index (rows, swizzled offsets) would live through the tile loop and spill, so they
  // read the index anew (a volatile read, which the compiler neither hoists nor keeps), and the
  // Q load's number comes with the tile's ticket instead of a count of their own.
  static constexpr bool kTightRegisters = C::kConsumers == 4;
  __device__ static uint32_t thread_index() {
    if constexpr (kTightRegisters) {
      uint32_t t;
      asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
      return t;
    } else {
      return threadIdx.x;
    }
  }

  // The tile's rule, first row and diagonals.
  __device__ void begin_tile(const ForwardTile& t) {
    rule = ScoreRule::make(p, t.seq, t.b, t.h);
    m0 = t.m0;
    const int tid = int(thread_index());
    const int warp = kUniformWarp ? uniform_warp() : tid % 128 / 32;
    const int lane_row = m0 + 64 * wg + 16 * warp + tid % 32 / 4;
    diag[0] = int(rule.window.diagonal(lane_row));
    diag[1] = int(rule.window.diagonal(lane_row + 8));
  }
  __device__ void reset_rows() {
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  __device__ void issue_scores(float (&s)[kN / 8][4], int stage) const {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      WgmmaOp<T, kN>::template ss<0, 0>(flat<kN>(s), k_major_descriptor<typename C::QTile>(smem, 64 * wg, kk),
                                     k_major_descriptor<typename C::KVTile>(k_tile(stage), 0, kk), kk > 0);
    wgmma_commit();
  }
  __device__ void issue_output(uint32_t (&pa)[kN / 16][4], int stage) {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      WgmmaOp<T, kD>::template rs<1>(flat<kD>(o), pa[kk], n_major_descriptor<typename C::KVTile>(v_tile(stage), kk), 1);
    wgmma_commit();
  }

  // Scores of key block n -> probabilities, returning the rescale factor of the older blocks.
  __device__ void softmax(float (&s)[kN / 8][4], int n, float (&correction)[2]) {
    const int64_t j0 = int64_t(n) * kN;
    if (kGeneral) forward_detail::transform_scores_at(s, rule, diag, j0);
    if (!rule.block_unmasked(m0 + 64 * wg, 64, j0, kN)) forward_detail::apply_mask_at(s, rule.window, diag, int(j0));
    forward_detail::exponentiate_scores<kLazy>(s, row_max, row_sum, kGeneral ? 1.f : rule.exp_scale, correction);
  }

  // Waits for this warpgroup's P V, then O *= correction (skipped when it is 1 in every row of
  // the warpgroup). The branch keeps the wait after the softmax before it: in one basic block with
  // the softmax, ptxas hoists the wait to the softmax's start (to interleave the rescale with the
  // exponentials), and the softmax no longer overlaps the P V. The vote is the warpgroup's, so
  // that its four warps run the same wait instruction (wgmma.wait_group is warpgroup-aligned),
  // read through a vote so that ptxas knows the branch uniform (else it serialises every wgmma).
  __device__ void wait_output_rescaled(const float (&correction)[2]) {
    const bool moved = correction[0] != 1.f || correction[1] != 1.f;
    if (__any_sync(0xffffffffu, named_barrier_any(C::kRescaleBarrier + wg, 128, moved))) {
      wait_output();
      forward_detail::rescale_output<false>(o, correction);
    } else {
      wait_output();
    }
  }

  // The block's probabilities against the kept row maxima, without their maximum (the 64 max
  // instructions and the quad shuffles are a quarter of the softmax): their partial row sums go
  // to `partial`. Returns whether a row may have outgrown its kept maximum, which then must be
  // worked out (speculative_fallback): a partial sum above 2^8 (every probability of the fast
  // path stays at most 2^8, as the lazy rescale allows), not finite (a score beyond 2^128 of the
  // kept maximum, or NaN), or a row with no maximum yet (its probabilities would lack their
  // shift).
  __device__ bool speculative_softmax(float (&s)[kN / 8][4], int n, float (&partial)[2]) {
    const int64_t j0 = int64_t(n) * kN;
    if (!rule.block_unmasked(m0 + 64 * wg, 64, j0, kN)) forward_detail::apply_mask_at(s, rule.window, diag, int(j0));
    bool risky = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float shift = row_max[half] * rule.exp_scale;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kN / 8; ++nt)
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[nt][e] = fast_exp2(fmaf(s[nt][e], rule.exp_scale, -shift));
          sum += s[nt][e];
        }
      partial[half] = sum;
      risky = risky || !(sum <= 256.f) || row_max[half] == -INFINITY;
    }
    return risky;
  }
  // A key step whose speculative probabilities failed for some row of the warpgroup: S of block
  // n (K in stage `k_stage`) again, its exact softmax and O's rescale, once P V is done.
  __device__ void speculative_fallback(float (&s)[kN / 8][4], int n, int k_stage, float (&correction)[2]) {
    wait_output();
    wgmma_fence();
    issue_scores(s, k_stage);
    wgmma_wait<0>();
    fence_registers(flat<kN>(s));
    softmax(s, n, correction);
    forward_detail::rescale_output<false>(o, correction);
  }

  static __device__ void to_operand(float (&s)[kN / 8][4], uint32_t (&pa)[kN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) accumulators_to_a<T>(s[2 * kk], s[2 * kk + 1], pa[kk]);
  }

  // S = Q K^T of the tile's first key block, issued (Q's load has phase `q_parity`, K is at ring
  // position `ring`).
  __device__ void issue_first(int ring, uint32_t q_parity, float (&s)[kN / 8][4]) {
    mbarrier_wait(bars.q_full(), q_parity);
    const RingSlot<C::kKStages> first = RingSlot<C::kKStages>::of(ring);
    mbarrier_wait(bars.k_full(first.stage), first.parity);
    take_turn();
    wgmma_fence();
    issue_scores(s, first.stage);
    pass_turn();
  }
  // ... and its softmax, once it is done (and every older wgmma group).
  __device__ void complete_first(KeyBlocks blocks, int ring, float (&s)[kN / 8][4], uint32_t (&pa)[kN / 16][4],
                                 float (&correction)[2]) {
    wgmma_wait<0>();
    fence_registers(flat<kN>(s));
    release(bars.k_empty(RingSlot<C::kKStages>::of(ring).stage));
    softmax(s, blocks.end - 1, correction);
    to_operand(s, pa);
  }
  // S of block n beside O += P V of block n + 1, for the blocks after the first; returns how many.
  __device__ int run_middle(KeyBlocks blocks, int ring, float (&s)[kN / 8][4], uint32_t (&pa)[kN / 16][4],
                            float (&correction)[2]) {
    int i = 0, n = blocks.end - 2;
    // The tile's second block is exact too when speculating: its first may have shown a row only
    // a few keys (a causal diagonal, a partial last block), whose maximum the next 128 keys would
    // often outgrow, and each failed speculation costs an S product. Peeled, so that the loop
    // holds one kind of step.
    if (kSpeculative && n >= blocks.begin) exact_step(n--, ring + i++, s, pa, correction);
    for (; n >= blocks.begin; --n, ++i) {
      if constexpr (kSpeculative)
        speculative_step(n, ring + i, s, pa, correction);
      else
        exact_step(n, ring + i, s, pa, correction);
    }
    return i;
  }
  // S of block n beside O += P V of the block before (V at ring position r, K at r + 1), then
  // block n's softmax; the two kinds differ in the softmax.
  __device__ void issue_step(int r, float (&s)[kN / 8][4], uint32_t (&pa)[kN / 16][4], int& k_stage, int& v_stage) {
    const RingSlot<C::kKStages> k_slot = RingSlot<C::kKStages>::of(r + 1);
    const RingSlot<C::kVStages> v_slot = RingSlot<C::kVStages>::of(r);
    mbarrier_wait(bars.k_full(k_slot.stage), k_slot.parity);
    take_turn();
    wgmma_fence();
    issue_scores(s, k_slot.stage);
    mbarrier_wait(bars.v_full(v_slot.stage), v_slot.parity);
    wgmma_fence();  // after the wait's loop, before P V's products
    issue_output(pa, v_slot.stage);
    pass_turn();
    wgmma_wait<1>();
    fence_registers(flat<kN>(s));
    k_stage = k_slot.stage;
    v_stage = v_slot.stage;
  }
  __device__ void exact_step(int n, int r, float (&s)[kN / 8][4], uint32_t (&pa)[kN / 16][4], float (&correction)[2]) {
    int k_stage, v_stage;
    issue_step(r, s, pa, k_stage, v_stage);
    release(bars.k_empty(k_stage));
    softmax(s, n, correction);
    if constexpr (kOrdered) {
      wait_output_rescaled(correction);
    } else {
      wait_output();
      forward_detail::rescale_output<kLazy>(o, correction);
    }
    release(bars.v_empty(v_stage));
    to_operand(s, pa);
  }
  // K is kept until the vote: a failed speculation computes S again.
  __device__ void speculative_step(int n, int r, float (&s)[kN / 8][4], uint32_t (&pa)[kN / 16][4],
                                   float (&correction)[2]) {
    int k_stage, v_stage;
    issue_step(r, s, pa, k_stage, v_stage);
    float partial[2];
    const bool risky = speculative_softmax(s, n, partial);
    if (__any_sync(0xffffffffu, named_barrier_any(C::kRescaleBarrier + wg, 128, risky))) {
      speculative_fallback(s, n, k_stage, correction);
    } else {
      wait_output();
      row_sum[0] += partial[0];
      row_sum[1] += partial[1];
    }
    release(bars.k_empty(k_stage));
    release(bars.v_empty(v_stage));
    to_operand(s, pa);
  }

  // The last O += P V of the tile (V at ring position `ring`), issued; returns V's stage.
  __device__ int issue_last(int ring, uint32_t (&pa)[kN / 16][4], bool pass) {
    const RingSlot<C::kVStages> last = RingSlot<C::kVStages>::of(ring);
    mbarrier_wait(bars.v_full(last.stage), last.parity);
    take_turn();
    wgmma_fence();
    issue_output(pa, last.stage);
    if (pass) pass_turn();
    return last.stage;
  }

  // The key blocks of the tile, one tile per block (not persistent): the ring and Q's load start
  // at their first position and phase.
  __device__ void run(KeyBlocks blocks) {
    const int ring = 0;
    if (wg == C::kConsumers - 1) pass_turn();  // consumer 0 goes first
    float s[kN / 8][4];
    uint32_t pa[kN / 16][4];
    float correction[2];
    issue_first(ring, 0u, s);
    complete_first(blocks, ring, s, pa, correction);
    const int i = run_middle(blocks, ring, s, pa, correction);
    // The last consumer passes no turn: consumer 0 takes none after this.
    const int v_stage = issue_last(ring + i, pa, wg != C::kConsumers - 1);
    wait_output();
    release(bars.v_empty(v_stage));
  }

  // Persistent: the tiles the producer publishes, until none is left. The turns go round the
  // consumers from tile to tile, and a tile's last O += P V waits until the next tile is known:
  // then it is issued with the next tile's first S = Q K^T behind it, and its epilogue runs while
  // the tensor cores compute that. Both products and the wait between them stay in one pass of
  // the loop, where ptxas can tell which group the wait retires (across the loop's back edge it
  // cannot, and it would serialise every wgmma).
  __device__ void run_tiles() {
    const TileSlots slots{smem + C::kTileSlotOffset};
    int ring = 0;
    uint32_t q_loads = 0;
    int current = -1;  // the slot of the tile whose last P V is due, with its V at ring position ring - 1
    float s[kN / 8][4];
    uint32_t pa[kN / 16][4];
    float correction[2];
    if (wg == C::kConsumers - 1) pass_turn();  // consumer 0 goes first
    for (int j = 0;; ++j) {
      const int slot = j % kForwardTileSlots;
      mbarrier_wait(bars.tile_full(slot), (j / kForwardTileSlots) & 1);
      const TileTicket ticket = slots.read(slot);
      if (ticket.index < 0) break;
      const ForwardTile t = ticket.tile(p);
      begin_tile(t);  // the current tile's epilogue needs none of the rule's state
      const KeyBlocks blocks = tile_key_blocks<C>(p, t, rule);
      // Without keys there is no product to overlap; the score-transform kernel and the tall
      // tiles finish the current tile first as well: the rule's extra terms, or at d = 64 the
      // next tile's S beside O, P and the epilogue, would spill; at d = 128 the tall tiles'
      // overlap compiles without spills but measured 1 to 4% slower from 2k keys.
      const bool overlap = !kGeneral && !kTall && blocks.begin < blocks.end;
      if (current >= 0 && !overlap) {
        finish_current(current, ring, pa);
        current = -1;
      }
      if (blocks.begin >= blocks.end) {
        finish_keyless(t);
        mbarrier_arrive(bars.tile_empty(slot));
        continue;
      }
      if (current >= 0) {
        const int v_stage = issue_last(ring - 1, pa, true);
        issue_first(ring, q_parity(slots, slot, q_loads), s);
        finish_tile<1>(current, v_stage);  // S stays in flight
      } else {
        issue_first(ring, q_parity(slots, slot, q_loads), s);
      }
      reset_rows();
      complete_first(blocks, ring, s, pa, correction);
      run_middle(blocks, ring, s, pa, correction);
      release(bars.q_empty());  // every S = Q K^T of the tile is done; O does not go through Q's tile
      current = slot;
      ring += blocks.end - blocks.begin;
      ++q_loads;
    }
    if (current >= 0) finish_current(current, ring, pa);
    if (wg == 0) take_turn();  // the last consumer's final pass
  }
  // The phase of the Q load of the tile in `slot`, the consumers' `q_loads`-th.
  __device__ static uint32_t q_parity(const TileSlots& slots, int slot, uint32_t q_loads) {
    return (kTightRegisters ? slots.read_q_load(slot) : q_loads) & 1u;
  }
  // The current tile's last O += P V (its V at ring position ring - 1), then its epilogue.
  __device__ void finish_current(int slot, int ring, uint32_t (&pa)[kN / 16][4]) {
    finish_tile<0>(slot, issue_last(ring - 1, pa, true));
  }
  // The epilogue of the tile in `slot` once its last O += P V (V in stage `v_stage`) is done
  // (kGroupsLeft: younger wgmma groups that may stay in flight); then the slot is free.
  template <int kGroupsLeft>
  __device__ void finish_tile(int slot, int v_stage) {
    wait_output<kGroupsLeft>();
    release(bars.v_empty(v_stage));
    finish(TileSlots{smem + C::kTileSlotOffset}.read(slot).tile(p));
    mbarrier_arrive(bars.tile_empty(slot));
  }

  // O / l and lse; then O through this warpgroup's rows of the O tile (or of Q's, then released)
  // to coalesced 16-byte stores, or persistent at d = 256 straight from registers (no room for an
  // O tile), or fp32 partials straight from registers when the keys are split.
  __device__ void finish(const ForwardTile& t) {
    const uint32_t tid = thread_index();
    const int lane = tid % 32, g = lane / 4, q = lane % 4;
    const int wg_row = 64 * wg, warp_row = wg_row + 16 * (kUniformWarp ? uniform_warp() : int(tid % 128 / 32));
    const int row0 = t.m0 + warp_row;  // sequence row of this warp's first query row
    float lse[2];
    // The rule's exp_scale (the same for every tile), from the parameters: the rule may already
    // be the next tile's.
    const float exp_scale = kGeneral ? 1.f : p.scale * kLog2e;
    forward_detail::normalize_rows(o, row_max, row_sum, exp_scale, p.dropout_inv_keep, lse);
    using QTile = typename C::QTile;
    constexpr int kChunksPerRow = kD / 8;
    if (p.num_splits > 1) {
      const int64_t head_rows = (int64_t(t.split) * p.heads_q + t.h) * p.rows_q + t.seq.packed_q;
      forward_detail::store_partials(p, head_rows, row0, t.seq.seqlen_q, o, lse);
    } else {
      forward_detail::store_lse(p, t.b, t.h, t.seq, row0, lse);
      if (C::kPersistent && !C::kStagedOutput) {
        store_output_unstaged(t, warp_row);
      } else {
        Elem* out_rows = operand_row<Elem>(p.out, t.b, t.seq.q_start + t.m0 + wg_row, t.h);
        const uint32_t staging = smem + (C::kPersistent ? C::kOOffset : 0);
        unsigned char* tile = reinterpret_cast<unsigned char*>(__cvta_shared_to_generic(staging));
        // The previous tile's stores have read the tile.
        named_barrier_sync(C::kEpilogueBarrier + wg, 128);
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            *reinterpret_cast<uint32_t*>(tile + QTile::offset(warp_row + g + 8 * half, dt * 8 + 2 * q)) =
                pack2<T>(o[dt][2 * half], o[dt][2 * half + 1]);
        named_barrier_sync(C::kEpilogueBarrier + wg, 128);
#pragma unroll 4
        for (int c = tid % 128; c < 64 * kChunksPerRow; c += 128) {
          const int row = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
          if (t.m0 + wg_row + row < t.seq.seqlen_q && col < p.head_dim)
            *reinterpret_cast<uint4*>(out_rows + row * p.out.row + col) =
                *reinterpret_cast<const uint4*>(tile + QTile::offset(wg_row + row, col));
        }
      }
    }
    if (!C::kPersistent) {
      // This warp is done with Q's tile; its writes there precede the next Q's TMA writes.
      __syncwarp();
      fence_async_shared();
      release(bars.q_empty());
    }
  }

  // O from the accumulators to global memory, without staging. Lane q of a quad holds columns
  // 2q and 2q + 1 of each 8-column chunk of its rows; for four chunks at a time a quad transpose
  // gives it all of chunk q, one 16-byte store (where the head dim has it: it may be less than kD).
  // Every lane takes part in the exchanges; rows past the sequence only skip their stores. This
  // is store_fragment_row's pattern, kept apart: through that helper the kernel's SASS changes and
  // measured 1% slower at 512 to 2k keys.
  __device__ void store_output_unstaged(const ForwardTile& t, int warp_row) const {
    static_assert(kD % 32 == 0, "whole groups of four chunks");
    const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = t.m0 + warp_row + g + 8 * half;
      const bool in_rows = row < t.seq.seqlen_q;
      Elem* out = operand_row<Elem>(p.out, t.b, t.seq.q_start + (in_rows ? row : 0), t.h) + 8 * q;
#pragma unroll
      for (int dt0 = 0; dt0 < kD / 8; dt0 += 4) {
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) w[j] = pack2<T>(o[dt0 + j][2 * half], o[dt0 + j][2 * half + 1]);
        quad_transpose(w);
        if (in_rows && (dt0 + q) * 8 < p.head_dim)
          *reinterpret_cast<uint4*>(out + dt0 * 8) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  }

  // A tile without keys: zeros and lse = -inf (or such partials when the keys are split), written
  // without staging (its Q's tile was never loaded) and without O's registers: they may hold the
  // previous tile's, and ptxas, which cannot tell that no wgmma is in flight here, would
  // serialise every wgmma of the kernel for a write to them. Its chunk loop stays apart from
  // finish's: one loop for both, given each chunk's value, made a d = 64 kernel spill 24 bytes.
  __device__ void finish_keyless(const ForwardTile& t) const {
    const int warp = kUniformWarp ? uniform_warp() : (int(threadIdx.x) % 128) / 32;
    const int wg_row = 64 * wg, row0 = t.m0 + wg_row + 16 * warp;
    const float lse[2] = {-INFINITY, -INFINITY};
    if (p.num_splits > 1) {
      const int64_t head_rows = (int64_t(t.split) * p.heads_q + t.h) * p.rows_q + t.seq.packed_q;
      const float zeros[kD / 8][4] = {};
      forward_detail::store_partials(p, head_rows, row0, t.seq.seqlen_q, zeros, lse);
      return;
    }
    forward_detail::store_lse(p, t.b, t.h, t.seq, row0, lse);
    constexpr int kChunksPerRow = kD / 8;
    Elem* out_rows = operand_row<Elem>(p.out, t.b, t.seq.q_start + t.m0 + wg_row, t.h);
    for (int c = threadIdx.x % 128; c < 64 * kChunksPerRow; c += 128) {
      const int row = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      if (t.m0 + wg_row + row < t.seq.seqlen_q && col < p.head_dim)
        *reinterpret_cast<uint4*>(out_rows + row * p.out.row + col) = make_uint4(0, 0, 0, 0);
    }
  }
};

// One consumer warpgroup: its block's tile, or (persistent) the tiles the producer publishes.
template <typename T, int kD, bool kTall, bool kGeneral>
__device__ void consume(const KernelParams& p, uint32_t smem, int wg) {
  using C = ForwardConfig<T, kD, kTall, kGeneral>;
  Consumer<T, kD, kTall, kGeneral> consumer{p, smem, Barriers<C::kKStages, C::kVStages>{smem + C::kBarrierOffset}, wg};
  if constexpr (C::kPersistent) {
    consumer.run_tiles();
  } else {
    const TileOrder order = TileOrder::of(p, C::kM);
    const ForwardTile t = order.tile(p, int(blockIdx.x), C::kM);
    if (t.m0 >= t.seq.seqlen_q) return;
    const KeyBlocks blocks = tile_key_blocks<C>(p, t);
    consumer.begin_tile(t);
    if (blocks.begin >= blocks.end) {
      consumer.finish_keyless(t);
    } else {
      consumer.run(blocks);
      consumer.finish(order.tile(p, int(blockIdx.x), C::kM));  // recomputed: t need not live through run()
    }
  }
}

// kGeneral: scores need ScoreRule::transform (softcap, ALiBi, non-positive scale).
template <typename T, int kD, bool kTall, bool kGeneral>
__global__ void __launch_bounds__(ForwardConfig<T, kD, kTall, kGeneral>::kThreads, 1)
    forward_kernel(const __grid_constant__ ForwardArgs args) {
  using C = ForwardConfig<T, kD, kTall, kGeneral>;
  const KernelParams& p = args.p;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t smem = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;

  if (threadIdx.x == 0) {
    const Barriers<C::kKStages, C::kVStages> bars{smem + C::kBarrierOffset};
    mbarrier_init(bars.q_full(), 1);
    mbarrier_init(bars.q_empty(), 4 * C::kConsumers);
    for (int s = 0; s < C::kKStages; ++s) {
      mbarrier_init(bars.k_full(s), 1);
      mbarrier_init(bars.k_empty(s), 4 * C::kConsumers);
    }
    for (int s = 0; s < C::kVStages; ++s) {
      mbarrier_init(bars.v_full(s), 1);
      mbarrier_init(bars.v_empty(s), 4 * C::kConsumers);
    }
    for (int slot = 0; slot < kForwardTileSlots; ++slot) {
      mbarrier_init(bars.tile_full(slot), 1);
      mbarrier_init(bars.tile_empty(slot), 128 * C::kConsumers);  // every consumer thread reads the slot
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  // Read through a shuffle from lane 0 so that the compiler knows it is the same in the whole warp
  // and keeps what derives from it (barrier ids, descriptors) in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (wg == 0) {
    registers_release<C::kProducerRegisters>();
    if (threadIdx.x == 0) produce<C>(args, smem);
  } else {
    registers_claim<C::kConsumerRegisters>();
    consume<T, kD, kTall, kGeneral>(p, smem, wg - 1);
  }
}

}  // namespace flashattn::cuda::sm90

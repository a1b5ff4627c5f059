// Warpgroup matrix multiply (wgmma, sm_90a): shared-memory descriptors for the 128-byte swizzled
// tiles that TMA writes, the issue/commit/wait protocol, and the compiler fences that keep
// register accesses out of an asynchronous wgmma's window.
#pragma once

#include <cstdint>

#include "cuda/sm90/swizzled_tile.h"
#include "cuda/sm90/wgmma_ops.cuh"

namespace flashattn::cuda::sm90 {

// Matrix descriptor of a 128-byte swizzled operand at shared address `addr` (bits 0-13: address
// / 16, 16-29: leading byte offset, 32-45: stride byte offset, 62-63: layout 1 = 128-byte swizzle).
// A plain launch's shared addresses are below 256 KB, so addr / 16 fits its 14 bits. A cluster
// launch's carry the block's rank from bit 24 on, which would spill into the leading offset: a
// kernel launched in clusters must pass the low 18 bits only.
__device__ __forceinline__ uint64_t swizzled_descriptor(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  const uint32_t low = (addr >> 4) | ((leading_bytes >> 4) << 16);
  const uint32_t high = (stride_bytes >> 4) | (1u << 30);
  return (uint64_t(high) << 32) | low;
}

// The descriptor `units` 16-byte steps past `base` in the same tile: only the address field moves,
// and it cannot carry into the next field (the address stays below 256 KB). Written so, a kernel
// forms each tile's descriptor once and adds a constant per k-step, where recomputing it from the
// address took five dependent instructions before every wgmma.
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t base, uint32_t units) {
  return (base & 0xFFFFFFFF00000000ull) | uint32_t(uint32_t(base) + units);
}

// K-major operand (rows x k, k contiguous): rows [row0, row0 + M or N) of k-step `kk` (16 columns),
// row0 a multiple of 8. 8-row groups are 1024 bytes apart; the leading offset is unused for
// swizzled K-major layouts.
template <typename Tile>
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t tile, int row0, int kk) {
  return advance_descriptor(swizzled_descriptor(tile, 16, 1024), k_major_units<Tile>(row0, kk));
}

// N-major operand B (k rows x N columns, N contiguous, e.g. V of P V): k-step `kk` is 16 rows,
// from column col0 on (a multiple of 8; inside a 64-column block the start moves along the
// 128-byte row, and the swizzle, a function of the address, still applies). 64-column blocks are
// a block apart (leading offset), 8-row groups 1024 bytes (stride offset).
template <typename Tile>
__device__ __forceinline__ uint64_t n_major_descriptor(uint32_t tile, int kk, int col0 = 0) {
  return advance_descriptor(swizzled_descriptor(tile, Tile::kBlockBytes, 1024), n_major_units<Tile>(kk, col0));
}

// Orders this warpgroup's earlier register accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most `Pending` committed groups of this warpgroup are still running.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

// Compiler fence on registers that an asynchronous wgmma reads or writes: nvcc may not move
// accesses of `r` across this point (it would otherwise see the wgmma as done at its issue).
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// The accumulator of an m64nN wgmma as the sm80 code sees a 16-row mma tile: thread t of the
// warpgroup holds rows 16 * (t / 32) + (t % 32) / 4 (+ 8) and, in element [j][e], column
// 8 j + 2 (t % 4) + e % 2 of row + 8 * (e / 2). Both views name the same registers.
template <int N>
__device__ __forceinline__ float (&flat(float (&tiles)[N / 8][4]))[N / 2] {
  return reinterpret_cast<float (&)[N / 2]>(tiles);
}

}  // namespace flashattn::cuda::sm90

// Tensor memory access (TMA, sm_90): bulk tensor copies between global memory, described by a
// CUtensorMap that lives in kernel parameter space, and shared memory.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashattn::cuda::sm90 {

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap& map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
}

// Copies the box at element coordinates (c0, c1, c2, c3) into shared `dst`; completion counts the
// box's bytes (out-of-bounds parts arrive as zeros) on mbarrier `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

}  // namespace flashattn::cuda::sm90

// Tensor memory access (TMA, sm_90): bulk tensor copies between global memory, described by a
// CUtensorMap that lives in kernel parameter space, and shared memory: loads that complete on an
// mbarrier, and reduce-adds into global memory that complete in per-thread bulk groups.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/sm90/float_tile.h"

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

// Adds the box in shared `src` to global memory at element coordinates (c0, c1, c2), element by
// element and atomically; parts of the box past an extent are dropped. Completes in this
// thread's current bulk group (bulk_commit, bulk_wait_read / bulk_wait).
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap& map, uint32_t src, int c0, int c1, int c2) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(&map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Closes this thread's current bulk group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's bulk groups still read their shared sources
// (the sources may then be overwritten).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Waits until at most kPending of this thread's bulk groups are incomplete (their writes done).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace flashattn::cuda::sm90

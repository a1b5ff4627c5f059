// Synchronisation of the warp-specialised sm_90 kernels: mbarriers with transaction counts (TMA
// completion), named barriers between warpgroups, register reallocation and proxy fences.
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm90 {

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes initialised barriers visible to the other threads and to the TMA unit.
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// Arrives and announces `bytes` that asynchronous copies will complete on this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed. A new barrier is in phase 0, so a wait
// on parity 1 returns at once.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Stage and phase parity of the i-th tile streamed through a ring of kStages mbarrier-guarded
// stages: the phase flips each time the ring wraps.
template <int kStages>
struct RingSlot {
  int stage;
  uint32_t parity;
  __device__ static RingSlot of(int i) { return {i % kStages, uint32_t(i / kStages) & 1u}; }
};

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads, waiting or only arriving.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Named barrier `id` over `threads` threads that also returns whether any of them passed true:
// the same value in every thread, so a branch on it keeps them together.
__device__ __forceinline__ bool named_barrier_any(int id, int threads, bool value) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred in, out;\n setp.ne.u32 in, %1, 0;\n bar.red.or.pred out, %2, %3, in;\n"
      " selp.u32 %0, 1, 0, out;\n}\n"
      : "=r"(any)
      : "r"(uint32_t(value)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// Register reallocation between warpgroups (every warp of the warpgroup must execute it).
template <int kRegisters>
__device__ __forceinline__ void registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Orders this thread's ordinary shared-memory writes before later reads by wgmma or TMA.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace flashattn::cuda::sm90

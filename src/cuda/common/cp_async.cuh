// Asynchronous global -> shared copies (sm_80): 16 bytes per thread, cached in L2 only.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// Copies 16 bytes from `src` to shared address `dst`; when !valid it writes 16 zero bytes
// instead and reads nothing: source size 0, so `src` may lie outside every allocation (a tile's
// rows past the end of a tensor keep their computed addresses, and no select is spent on them;
// tested on the GPU with addresses gigabytes away, memcheck clean). ptxas compiles this to the
// predicated LDGSTS that PTX's ignore-src form (source ignored, zeros copied) compiles to as well,
// up to the predicate's polarity.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// The same for a chunk known to be in bounds: no source size, so no register to select it.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// 4-byte form (cached in L1 and L2); zero-fills when !valid and reads nothing, like cp_async_16.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// Closes the group of copies issued by this thread since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `Pending` of this thread's groups are still in flight. Other threads'
// copies are visible only after a following barrier.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

}  // namespace flashattn::cuda

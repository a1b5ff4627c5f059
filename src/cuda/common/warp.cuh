// Reductions and exchanges inside the quad of 4 lanes that share the rows of an mma fragment.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x + __shfl_xor_sync(0xffffffffu, x, 1);
}

// Half of a 4 x 4 transpose across the quad: words {0, 1} and {2, 3} (kMask 2) or {0, 2} and
// {1, 3} (kMask 1) are the low and high pairs; the lane with the kMask bit swaps its low pair for
// its partner's high pair. Selects, not dynamic register indexing, pick what goes out.
template <int kMask>
__device__ __forceinline__ void quad_swap_pairs(uint32_t (&x)[4], int t) {
  constexpr int kLo0 = 0, kLo1 = kMask == 2 ? 1 : 2, kHi0 = kMask == 2 ? 2 : 1, kHi1 = 3;
  const bool upper = (t & kMask) != 0;
  const uint32_t r0 = __shfl_xor_sync(0xffffffffu, upper ? x[kLo0] : x[kHi0], kMask);
  const uint32_t r1 = __shfl_xor_sync(0xffffffffu, upper ? x[kLo1] : x[kHi1], kMask);
  x[kLo0] = upper ? r0 : x[kLo0];
  x[kLo1] = upper ? r1 : x[kLo1];
  x[kHi0] = upper ? x[kHi0] : r0;
  x[kHi1] = upper ? x[kHi1] : r1;
}

// 4x4 transpose across the quad: afterwards x[s] of lane t is what x[t] of lane s held
// (s, t = lane % 4 within the quad). Four xor shuffles: 2 x 2 blocks of pairs, then the pairs.
__device__ __forceinline__ void quad_transpose(uint32_t (&x)[4]) {
  const int t = threadIdx.x % 4;
  quad_swap_pairs<2>(x, t);
  quad_swap_pairs<1>(x, t);
}

}  // namespace flashattn::cuda

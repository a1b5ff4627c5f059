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

// Rotates x left by `amount` (0..3, may differ per lane) without dynamic register indexing.
__device__ __forceinline__ void rotate4(uint32_t (&x)[4], int amount) {
  if (amount & 1) {
    const uint32_t first = x[0];
    x[0] = x[1]; x[1] = x[2]; x[2] = x[3]; x[3] = first;
  }
  if (amount & 2) {
    uint32_t t0 = x[0], t1 = x[1];
    x[0] = x[2]; x[1] = x[3]; x[2] = t0; x[3] = t1;
  }
}

// 4x4 transpose across the quad: afterwards x[s] of lane t is what x[t] of lane s held
// (s, t = lane % 4 within the quad). Three shuffles and a few selects.
__device__ __forceinline__ void quad_transpose(uint32_t (&x)[4]) {
  const int t = threadIdx.x % 4;
  rotate4(x, t);  // x[k] = original x[(k + t) % 4]
  uint32_t got[4];
  got[0] = x[0];  // own word t
#pragma unroll
  for (int k = 1; k < 4; ++k) {
    // From lane s = (t - k) % 4 arrives its x[k] = its original word (k + s) % 4 = t.
    got[k] = __shfl_sync(0xffffffffu, x[k], (threadIdx.x & ~3u) | ((t - k) & 3));
  }
  // Word t of lane s sits in got[(t - s) % 4]: reverse, then rotate by -t.
  x[0] = got[0];
  x[1] = got[3];
  x[2] = got[2];
  x[3] = got[1];
  rotate4(x, (4 - t) & 3);  // x[s] = reversed[(s - t) % 4] = got[(t - s) % 4]
}

}  // namespace flashattn::cuda

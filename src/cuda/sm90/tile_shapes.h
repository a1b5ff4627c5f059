// Tile shapes of the sm_90 forward per compiled head dimension, read by the kernels and by the
// host (split decision, shared-memory size).
#pragma once

namespace flashattn::cuda::sm90 {

struct ForwardShape {
  int block_m, block_n, stages;  // query rows per block (64 per consumer warpgroup), keys per step
  bool pingpong;                 // consumer warpgroups take turns issuing their GEMMs
};

// Two consumer warpgroups of 64 query rows. Keys per step are bounded by registers (a consumer
// thread holds d/2 output and block_n/2 score accumulators, plus block_n/4 words of P) and by
// shared memory (Q plus two stages of K and V). Pingpong pays where the softmax is a large share
// of a step's time, i.e. for head dims up to 128.
constexpr ForwardShape forward_shape(int head_dim) {
  return head_dim <= 128   ? ForwardShape{128, 128, 2, true}
         : head_dim <= 192 ? ForwardShape{128, 96, 2, false}
                           : ForwardShape{128, 64, 2, false};
}

// Dynamic shared memory of the forward: Q, the K and V stages, the mbarriers, and 1 KiB of
// slack to align the tiles to the 1024-byte period of the swizzle.
constexpr int forward_smem_bytes(int head_dim) {
  const ForwardShape s = forward_shape(head_dim);
  const int barriers = 1 + 4 * s.stages;
  return 2 * head_dim * (s.block_m + 2 * s.stages * s.block_n) + 8 * barriers + 1024;
}

}  // namespace flashattn::cuda::sm90

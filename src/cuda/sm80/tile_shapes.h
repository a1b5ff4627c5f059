// Tile shapes of the sm80 kernels per compiled head dimension: plain constexpr functions, so the
// host side (split decision, workspace sizes) and the kernels read the same numbers.
#pragma once

namespace flashattn::cuda {

struct ForwardShape {
  int block_m, block_n, warps;  // query rows, keys per step, warps (block_m / warps rows each)
};

// Registers bound these: a warp holds (block_m / warps) x d fp32 outputs and as many rows of
// block_n fp32 scores. Two 16-row tiles per warp reuse every K and V fragment read from shared
// memory twice, which keeps ldmatrix traffic below the tensor cores' rate; d = 192 and 256 can
// only afford one (their outputs alone take 96 and 128 registers).
constexpr ForwardShape forward_shape(int head_dim) {
  return head_dim <= 64    ? ForwardShape{128, 64, 4}
         : head_dim <= 128 ? ForwardShape{128, 64, 4}
         : head_dim <= 192 ? ForwardShape{128, 64, 8}
                           : ForwardShape{64, 64, 4};
}

struct BackwardShape {
  int block_m, block_n, warps, d_split;  // query rows per step, keys per block, warps, warps per key group
};

// Eight warps; each key group of 16 keys keeps dK and dV for its keys in registers. Above d = 128
// two warps share a key group, each owning half of the head dim, so dK/dV fit in registers.
constexpr BackwardShape backward_shape(int head_dim) {
  return head_dim <= 128 ? BackwardShape{64, 128, 8, 1} : BackwardShape{64, 64, 8, 2};
}

}  // namespace flashattn::cuda

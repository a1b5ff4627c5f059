// Tile shapes of the sm80 kernels per compiled head dimension: plain constexpr functions, so the
// host side (split decision, workspace sizes) and the kernels read the same numbers.
#pragma once

namespace flashattn::cuda {

struct ForwardShape {
  int block_m, block_n, warps;  // query rows, keys per step, warps (block_m / warps rows each)
  // 1: a K or V tile is copied at once, before the product that hides it. n > 1: V's copy in n
  // parts over S = Q K^T's first k-steps and K's over P V's first quarter, so that a part's
  // address arithmetic does not wait for the previous part's cp.async to read its registers.
  // Measured on the H200: d = 128 in 4 parts +1 to +3%, in 2 parts another 0 to +2%; d = 64 and
  // 256 in 4 parts -2 to -12% (V alone or K alone lost too), d = 256 in 2 parts 0 to +1%; with
  // dropout d = 128 -3 to -5% in 4 parts, -0.3 to -2% in 2, d = 64 0 to +1% in 2 (its 40 bytes
  // of spills gone).
  int copy_parts;
};

// Registers bound these: a warp holds (block_m / warps) x d fp32 outputs and as many rows of
// block_n fp32 scores. Two 16-row tiles per warp reuse every K and V fragment read from shared
// memory twice, which keeps ldmatrix traffic below the tensor cores' rate; d = 192 and 256 can
// only afford one (their outputs alone take 96 and 128 registers).
//
// Each kernel kind has its shape: `dropout` (draws) and `general` (ScoreRule::is_general). Without
// either, up to d = 64, a step takes 128 keys (FlashAttention-2's shape there): half the row
// maxima, output rescales and block barriers per key, +8 to +12% on the H200 against 64 keys. The
// other kinds keep 64 keys: with 128 their draws or transforms spill (72 to 228 bytes).
constexpr ForwardShape forward_shape(int head_dim, bool dropout, bool general) {
  const bool plain = !dropout && !general;
  return head_dim <= 64    ? ForwardShape{128, plain ? 128 : 64, 4, dropout && head_dim == 64 ? 2 : 1}
         : head_dim <= 128 ? ForwardShape{128, 64, 4, !dropout && head_dim == 128 ? 2 : 1}
         : head_dim <= 192 ? ForwardShape{128, 64, 8, 1}
                           : ForwardShape{64, 64, 4, 1};
}

// Whether `parts` copy parts fit a forward's k-steps (see ForwardShape::copy_parts).
constexpr bool copy_parts_fit(int parts, int head_dim) { return parts == 1 || 2 * parts <= head_dim / 16; }

struct BackwardShape {
  int block_m, block_n, warps, d_split;  // query rows per step, keys per block, warps, warps per key group
  int dq_row_tiles;                      // 16-row tiles of dQ = dS K per warp
  int dkv_key_groups;                    // warps along the keys of dK and dV (the rest split columns)
};

// Eight warps in key groups of d_split warps. A group keeps dK and dV of its keys in registers,
// each warp of it computing S^T and dP^T for 1 / d_split of the query rows and dK/dV for
// 1 / d_split of the head dim; P and dS meet in shared memory. Up to d = 128 a group holds 32
// keys (two 16-row mma tiles, so every Q, dO fragment read from shared memory feeds twice as many
// mma), above it 16, so that dK/dV fit in registers. block_m is 64, or 128 up to d = 64 where the
// device has the shared memory (backward_wide_block_m): half the steps and block-wide barriers per
// key block. dQ takes two row tiles per warp (each K fragment read feeds two mma) where that
// measured faster: not at d = 128, 64 rows.
//
// dK and dV take their own warp layout (P^T and dS^T come from shared memory either way): four
// groups of 32 keys x d/2 columns up to d = 128, two of 32 keys x d/4 columns above (the layout of
// FlashAttention-2; per step a warp then reads 36 KB instead of 48 KB of dO, Q, P^T and dS^T at
// d = 256), where d/4 stays whole 16-column steps.
//
// block_n = 64 asks for 64 keys per block up to d = 128 as well (backward_narrow_block_n): the
// shape of the larger head dims, for devices with too little shared memory for 128 keys.
constexpr BackwardShape backward_shape(int head_dim, int block_m = 64, int block_n = 0) {
  const int two_tile_parts = 8 / (block_m / 32);  // dQ column parts with two row tiles per warp
  const int dq_row_tiles = (block_m == 128 || head_dim > 128) && head_dim % (16 * two_tile_parts) == 0 ? 2 : 1;
  if (head_dim <= 128 && block_n != 64) return BackwardShape{block_m, 128, 8, 2, dq_row_tiles, 4};
  return BackwardShape{block_m, 64, 8, 2, dq_row_tiles, head_dim > 128 && head_dim % 64 == 0 ? 2 : 4};
}

// The smaller key block of head dims 65 to 128 (0: none): 64 keys, single-buffered Q and dO,
// about 87 KB of shared memory at d = 128 instead of 139 KB, so that GPUs with about 100 KB per
// block (compute capability 8.6 and 8.9) run the backward. Smaller head dims fit with 128 keys;
// larger ones have 64 keys already and need more than 100 KB.
constexpr int backward_narrow_block_n(int head_dim) { return head_dim > 64 && head_dim <= 128 ? 64 : 0; }
// Whether a device with `smem` bytes per block takes that key block: where the single-buffered
// 128-key backward (`full_keys_smem` bytes) does not fit. Read by the launcher and the host.
constexpr bool backward_takes_narrow_keys(int head_dim, int smem, int full_keys_smem) {
  return backward_narrow_block_n(head_dim) != 0 && smem < full_keys_smem;
}

// The larger query block of head dims up to 64 (0: none); it needs about 214 KB of shared memory
// with double-buffered Q and dO (Hopper-class devices), so the launcher falls back to 64 rows.
constexpr int backward_wide_block_m(int head_dim) { return head_dim <= 64 ? 128 : 0; }

}  // namespace flashattn::cuda

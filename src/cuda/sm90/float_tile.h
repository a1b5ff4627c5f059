// The fp32 dQ tile of the sm90 backward in shared memory, and the order in which a warpgroup's
// accumulator fragments are stored into it. Plain C++: the host tests check the store order's
// shared-memory bank use against this layout.
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm90 {

// fp32 tile of Rows x Cols in 32-column blocks (128 bytes a row) with the 128-byte swizzle: the
// shared-memory image of Cols / 32 TMA boxes of 32 columns x Rows rows.
template <int Rows, int Cols>
struct SwizzledFloatTile {
  static_assert(Cols % 32 == 0 && Rows % 8 == 0, "whole 32-column blocks of whole 8-row swizzle periods");
  static constexpr int kBlockBytes = Rows * 128;  // one 32-column block: one TMA box
  static constexpr int kBytes = kBlockBytes * (Cols / 32);
  static constexpr uint32_t offset(int row, int col) {
    return uint32_t((col / 32) * kBlockBytes + row * 128 + ((((col % 32) / 4) ^ (row % 8)) * 16) + (col % 4) * 4);
  }
};

// A wgmma accumulator holds, per lane, rows lane / 4 and lane / 4 + 8 of its warp's 16 and
// columns 8 j + 2 q + {0, 1} (q = lane % 4) for every 8-column group j. The sm90 backward keeps
// dq_accum in the accumulator's order within each 32-column block: column 8 j + 2 q + e of the
// block sits at 8 q + 2 j + e, so a lane's 8 columns of a row are 32 contiguous bytes, two 16-byte
// stores without shuffles. A quarter-warp (2 rows x 4 lanes) then fills the 8 swizzled chunks of
// the two rows once: one wavefront. The map swaps j and q, so it is its own inverse.
constexpr int dq_fragment_position(int col) {
  return (col & ~31) | ((col % 8) / 2) * 8 | ((col % 32) / 8) * 2 | (col % 2);
}

}  // namespace flashattn::cuda::sm90

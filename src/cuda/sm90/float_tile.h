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
// columns 8 j + 2 (lane % 4) + {0, 1} for every 8-column group j. Stored as 8-byte pairs, pass j
// of every lane in a half-warp (4 rows x 4 lanes) would fill only 4 of the 8 swizzled 16-byte
// chunks of a row: two rows per chunk, a 2-way bank conflict. Lanes 2 and 3 of each quad
// therefore store group j ^ 2 in pass j (the same 32-column block), which puts the half-warp's
// 16 pairs on 8 distinct chunks: one wavefront per half-warp. Needs groups in fours (32 columns).
constexpr int dq_store_group(int pass, int lane) { return (lane & 2) ? pass ^ 2 : pass; }

}  // namespace flashattn::cuda::sm90

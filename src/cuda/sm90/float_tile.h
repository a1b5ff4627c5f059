// The fp32 dQ tile of the sm90 backward in shared memory, which its consumers fill in dq_accum's
// fragment order (dq_accum_layout.h). Plain C++: the host tests check the stores' shared-memory
// bank use against this layout.
#pragma once

#include <cstdint>

#include "cuda/dq_accum_layout.h"

namespace flashattn::cuda::sm90 {

// fp32 tile of Rows x Cols in 32-column blocks (128 bytes a row) with the 128-byte swizzle: the
// shared-memory image of Cols / 32 TMA boxes of 32 columns x Rows rows. Stored in fragment order,
// a quarter-warp's 16-byte stores (2 rows x 4 lanes) fill the 8 swizzled chunks of its two rows
// once: one wavefront.
template <int Rows, int Cols>
struct SwizzledFloatTile {
  static_assert(Cols % 32 == 0 && Rows % 8 == 0, "whole 32-column blocks of whole 8-row swizzle periods");
  static constexpr int kBlockBytes = Rows * 128;  // one 32-column block: one TMA box
  static constexpr int kBytes = kBlockBytes * (Cols / 32);
  static constexpr uint32_t offset(int row, int col) {
    return uint32_t((col / 32) * kBlockBytes + row * 128 + ((((col % 32) / 4) ^ (row % 8)) * 16) + (col % 4) * 4);
  }
};

}  // namespace flashattn::cuda::sm90

// The 128-byte swizzled tiles of 16-bit values that TMA writes and wgmma reads, and where a
// k-step of an operand starts in them, in the 16-byte units of a matrix descriptor's address.
// Plain C++: the host tests check the units against the tile's layout.
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm90 {

// A tile of Rows x Cols 16-bit values as TMA writes it with 128-byte swizzle and 64-element boxes:
// Cols / 64 column blocks one after the other, each Rows rows of 128 bytes, in which the 16-byte
// chunk c of row r sits at position c ^ (r % 8). The tile must start on a 1024-byte boundary.
template <int Rows, int Cols>
struct SwizzledTile {
  static_assert(Cols % 64 == 0, "128-byte swizzled tiles hold whole 64-column blocks");
  static_assert(Rows % 8 == 0, "the swizzle pattern repeats every 8 rows");
  static constexpr int kRows = Rows, kCols = Cols;
  static constexpr int kBlockBytes = Rows * 128;  // one 64-column block
  static constexpr int kBytes = kBlockBytes * (Cols / 64);

  static constexpr uint32_t offset(int row, int col) {
    return uint32_t((col / 64) * kBlockBytes + row * 128 + ((((col % 64) / 8) ^ (row % 8)) * 16) + (col % 8) * 2);
  }
};

// Start of k-step `kk` (16 columns) of the K-major rows [row0, ...) of a tile, row0 a multiple of
// 8: the step begins in chunk 2 kk % 8 of its 64-column block, which row0's swizzle leaves in place.
template <typename Tile>
constexpr uint32_t k_major_units(int row0, int kk) {
  return uint32_t((kk / 4) * (Tile::kBlockBytes / 16) + row0 * 8 + (kk % 4) * 2);
}
// Start of k-step `kk` (16 rows) of an N-major tile from column col0 on (a multiple of 8).
template <typename Tile>
constexpr uint32_t n_major_units(int kk, int col0) {
  return uint32_t((col0 / 64) * (Tile::kBlockBytes / 16) + (col0 % 64) / 8 + kk * 128);  // 16 rows of 128 bytes
}

}  // namespace flashattn::cuda::sm90

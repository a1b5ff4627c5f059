// Shared-memory tiles of 16-bit values with a bank-conflict-free layout.
//
// A tile is row-major with every row padded by 16 bytes. ldmatrix reads the same 16-byte chunk
// of 8 consecutive rows in one phase; with a row pitch of 2*Cols + 16 bytes (an odd number of
// 16-byte chunks modulo 128 bytes for every Cols that is a multiple of 16) those 8 chunks fall in
// 8 different groups of 4 banks, for plain and transposed loads and for the 16-byte cp.async
// writes alike. Unlike an XOR swizzle on 64-column atoms, this also covers head dims such as 96.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

template <int Rows, int Cols>
struct SmemTile {
  static_assert(Cols % 16 == 0, "tile columns must be a multiple of 16 (one mma k-step)");
  static constexpr int kRows = Rows;
  static constexpr int kCols = Cols;
  static constexpr int kPitch = Cols + 8;  // elements per row, 16 bytes of padding
  static constexpr int kElements = Rows * kPitch;
  static constexpr int kBytes = kElements * 2;
  static constexpr int kChunksPerRow = Cols / 8;  // 16-byte chunks holding data

  // Byte offset of element (row, col) from the start of the tile.
  __host__ __device__ static constexpr uint32_t offset(int row, int col) { return uint32_t(row * kPitch + col) * 2u; }
};

}  // namespace flashattn::cuda

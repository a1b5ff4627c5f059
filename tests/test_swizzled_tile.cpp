// Where the sm_90a kernels' wgmma descriptors start a k-step (cuda/sm90/swizzled_tile.h): the
// constant 16-byte units added to a tile's descriptor must name the byte that the tile's layout
// puts the step's first element at, for every k-step and every row or column start the kernels use.
#include <gtest/gtest.h>

#include "cuda/sm90/swizzled_tile.h"

namespace {

using flashattn::cuda::sm90::k_major_units;
using flashattn::cuda::sm90::n_major_units;
using flashattn::cuda::sm90::SwizzledTile;

// K-major: rows [row0, ...) of k-step kk start at element (row0, 16 kk), row0 a multiple of 8.
template <int Rows, int Cols>
void expect_k_major_units_match_layout() {
  using Tile = SwizzledTile<Rows, Cols>;
  for (int row0 = 0; row0 < Rows; row0 += 8)
    for (int kk = 0; kk < Cols / 16; ++kk)
      EXPECT_EQ(16 * k_major_units<Tile>(row0, kk), Tile::offset(row0, 16 * kk))
          << Rows << " x " << Cols << ", row0 " << row0 << ", kk " << kk;
}

// N-major: k-step kk (16 rows) from column col0 on starts at element (16 kk, col0), col0 a
// multiple of 8.
template <int Rows, int Cols>
void expect_n_major_units_match_layout() {
  using Tile = SwizzledTile<Rows, Cols>;
  for (int kk = 0; kk < Rows / 16; ++kk)
    for (int col0 = 0; col0 < Cols; col0 += 8)
      EXPECT_EQ(16 * n_major_units<Tile>(kk, col0), Tile::offset(16 * kk, col0))
          << Rows << " x " << Cols << ", kk " << kk << ", col0 " << col0;
}

TEST(Sm90Descriptors, KMajorStepsStartWhereTheLayoutPutsThem) {
  expect_k_major_units_match_layout<64, 64>();
  expect_k_major_units_match_layout<128, 128>();
  expect_k_major_units_match_layout<64, 256>();
  expect_k_major_units_match_layout<192, 64>();
}

TEST(Sm90Descriptors, NMajorStepsStartWhereTheLayoutPutsThem) {
  expect_n_major_units_match_layout<64, 64>();
  expect_n_major_units_match_layout<128, 128>();
  expect_n_major_units_match_layout<64, 256>();
  expect_n_major_units_match_layout<80, 256>();
}

// A start inside a swizzle period would need the row's XOR pattern, which the units leave out:
// the model sees the difference, so row0 must stay a multiple of 8.
TEST(Sm90Descriptors, RowStartsInsideASwizzlePeriodWouldMoveTheStep) {
  using Tile = SwizzledTile<64, 64>;
  EXPECT_NE(16 * k_major_units<Tile>(3, 1), Tile::offset(3, 16));
}

}  // namespace

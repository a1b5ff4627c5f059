// The layouts of the backward's dq_accum (cuda/dq_accum_layout.h), and the shared-memory bank use
// of the sm90 backward's dQ tile stores (cuda/sm90/float_tile.h): each 16-byte store of a warp
// writes the tile with one wavefront per quarter-warp (16-byte stores are served 8 lanes at a
// time), the stores together write every element of the tile exactly once, and each accumulator
// element lands where the finish kernel reads its column.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "cuda/dq_accum_layout.h"
#include "cuda/sm90/float_tile.h"

namespace {

using flashattn::cuda::dq_fragment_position;
using flashattn::cuda::dq_accum_copy_floats;
using flashattn::cuda::dq_accum_index;
using flashattn::cuda::dq_quad_position;
using flashattn::cuda::DqLayout;
using flashattn::cuda::sm90::SwizzledFloatTile;

// Wavefronts for one store of `bytes` per lane by lanes [first, first + count): per bank, the
// distinct 4-byte words it must serve; the most any bank serves.
int wavefronts(const std::vector<uint32_t>& byte_addresses, int first, int count, int bytes) {
  std::map<int, std::set<uint32_t>> words_of_bank;
  for (int lane = first; lane < first + count; ++lane)
    for (uint32_t word = byte_addresses[lane] / 4; word < (byte_addresses[lane] + bytes) / 4; ++word)
      words_of_bank[int(word % 32)].insert(word);
  size_t most = 0;
  for (const auto& [bank, words] : words_of_bank) most = std::max(most, words.size());
  return int(most);
}

// A warpgroup's Rows x Cols accumulator tile stored as store_dq_tile does: groups j and j + 1 of
// a row in one 16-byte store at the fragment position of column 8 j + 2 q. Returns the worst
// wavefront count of a quarter-warp; `writes` counts each byte address written and `column_at`
// maps it to the accumulator column stored there.
template <int Rows, int Cols>
int store_tile(std::map<uint32_t, int>& writes, std::map<uint32_t, int>& column_at) {
  using Tile = SwizzledFloatTile<Rows, Cols>;
  int worst = 0;
  for (int warp = 0; warp < Rows / 16; ++warp)
    for (int j = 0; j < Cols / 8; j += 2)
      for (int half = 0; half < 2; ++half) {
        std::vector<uint32_t> addresses(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int row = 16 * warp + lane / 4 + 8 * half, q = lane % 4;
          addresses[lane] = Tile::offset(row, dq_fragment_position(8 * j + 2 * q));
          const int columns[4] = {8 * j + 2 * q, 8 * j + 2 * q + 1, 8 * (j + 1) + 2 * q, 8 * (j + 1) + 2 * q + 1};
          for (int e = 0; e < 4; ++e) {
            ++writes[addresses[lane] + 4 * e];
            column_at[addresses[lane] + 4 * e] = columns[e];
          }
        }
        for (int quarter = 0; quarter < 4; ++quarter)
          worst = std::max(worst, wavefronts(addresses, 8 * quarter, 8, 16));
      }
  return worst;
}

template <int Rows, int Cols>
void expect_conflict_free_complete_and_in_fragment_order() {
  using Tile = SwizzledFloatTile<Rows, Cols>;
  std::map<uint32_t, int> writes, column_at;
  EXPECT_EQ((store_tile<Rows, Cols>(writes, column_at)), 1) << Rows << " x " << Cols;
  EXPECT_EQ(writes.size(), size_t(Rows * Cols)) << "every element of the tile written";
  for (const auto& [address, count] : writes) {
    EXPECT_EQ(count, 1) << "byte " << address << " written " << count << " times";
    EXPECT_LT(address, uint32_t(Tile::kBytes));
  }
  // The finish kernel reads column c of a row at fragment position dq_fragment_position(c).
  for (int row = 0; row < Rows; ++row)
    for (int c = 0; c < Cols; ++c)
      EXPECT_EQ(column_at[Tile::offset(row, dq_fragment_position(c))], c) << "row " << row << ", column " << c;
}

TEST(Sm90DqTileStores, OneWavefrontPerQuarterWarpEveryElementOnceInFragmentOrder) {
  expect_conflict_free_complete_and_in_fragment_order<64, 32>();  // d = 64 general: 32 columns a consumer
  expect_conflict_free_complete_and_in_fragment_order<64, 64>();  // d = 128, d = 64, each round of d = 256
}

// Each layout places every (row, head, column) of a copy at its own index inside the copy (rows
// not a multiple of 8: row tiles pad them), the fragment order is its own inverse within 32-column
// blocks, and the finish kernel finds 8 columns as four pairs from the first one's index on, at
// the stride between the first two.
TEST(DqAccumLayout, LayoutsArePermutationsOfACopy) {
  constexpr int kRows = 21, kHeads = 3, kD = 64;
  for (const DqLayout layout : {DqLayout::plain, DqLayout::fragments, DqLayout::row_tiles}) {
    const int64_t floats = dq_accum_copy_floats(layout, kRows, kHeads, kD);
    EXPECT_EQ(floats, (layout == DqLayout::row_tiles ? 24 : kRows) * kHeads * kD);
    std::set<int64_t> seen;
    for (int row = 0; row < kRows; ++row)
      for (int h = 0; h < kHeads; ++h)
        for (int col = 0; col < kD; ++col) {
          const int64_t at = dq_accum_index(layout, row, h, col, kHeads, kD);
          EXPECT_TRUE(at >= 0 && at < floats) << row << ", " << h << ", " << col;
          seen.insert(at);
          if (col % 8 == 0) {
            const int64_t stride = dq_accum_index(layout, row, h, col + 2, kHeads, kD) - at;
            for (int pair = 0; pair < 4; ++pair)
              for (int e = 0; e < 2; ++e)
                EXPECT_EQ(dq_accum_index(layout, row, h, col + 2 * pair + e, kHeads, kD), at + pair * stride + e)
                    << row << ", " << h << ", " << col << " + " << 2 * pair + e;
          }
        }
    EXPECT_EQ(seen.size(), size_t(kRows) * kHeads * kD);
  }
  for (int col = 0; col < 256; ++col) {
    EXPECT_EQ(dq_fragment_position(col) / 32, col / 32) << col;
    EXPECT_EQ(dq_fragment_position(dq_fragment_position(col)), col) << col;
  }
  EXPECT_EQ(dq_fragment_position(8 * 1 + 2 * 3 + 1), 8 * 3 + 2 * 1 + 1);  // group 1, lane 3: at lane 3's 32 bytes
  EXPECT_EQ(dq_quad_position(8 * 1 + 2 * 3 + 1), 4 * 3 + 2 * 1 + 1);      // group 1, lane 3: at lane 3's 16 bytes
}

// The sm80 backward adds a lane's columns of n8 tiles 2u and 2u + 1 of its row (columns
// col0 + 2 q + e and col0 + 8 + 2 q + e, col0 a multiple of 16) with one 16-byte reduction at the
// first one's index: the four must be adjacent, in that order, 16-byte aligned, the next 16
// columns 128 floats on, and the 32 lanes of a warp (8 rows from a multiple of 8) must cover 512
// contiguous bytes, whole 128-byte lines.
TEST(DqAccumLayout, RowTilesTakeAWarpsReductionInWholeLines) {
  constexpr int kHeads = 5, kD = 128;
  for (const int row0 : {0, 8, 40})
    for (int h = 0; h < kHeads; ++h)
      for (int col0 = 0; col0 < kD; col0 += 16) {
        std::set<int64_t> warp_floats;
        for (int g = 0; g < 8; ++g)
          for (int q = 0; q < 4; ++q) {
            auto at = [&](int col) { return dq_accum_index(DqLayout::row_tiles, row0 + g, h, col, kHeads, kD); };
            const int64_t first = at(col0 + 2 * q);
            EXPECT_EQ(first % 4, 0);
            EXPECT_EQ(at(col0 + 2 * q + 1), first + 1);
            EXPECT_EQ(at(col0 + 8 + 2 * q), first + 2);
            EXPECT_EQ(at(col0 + 8 + 2 * q + 1), first + 3);
            if (col0 + 16 < kD) {
              EXPECT_EQ(at(col0 + 16 + 2 * q), first + 128);
            }
            for (int64_t f = first; f < first + 4; ++f) warp_floats.insert(f);
          }
        EXPECT_EQ(warp_floats.size(), 128u);
        EXPECT_EQ(*warp_floats.begin() % 128, 0) << "starts a 512-byte run";
        EXPECT_EQ(*warp_floats.rbegin() - *warp_floats.begin(), 127) << "contiguous";
      }
}

// The model counts conflicts where there are some: 8-byte pairs in the accumulator's own column
// order take two wavefronts per half-warp (4 rows on 4 chunks); 16-byte stores of the 8 chunks
// of one row take one; of rows 0 and 8, which share a swizzle, two.
TEST(Sm90DqTileStores, ModelCountsConflicts) {
  using Tile = SwizzledFloatTile<64, 64>;
  std::vector<uint32_t> addresses(32);
  for (int lane = 0; lane < 32; ++lane) addresses[lane] = Tile::offset(lane / 4, 2 * (lane % 4));
  EXPECT_EQ(wavefronts(addresses, 0, 16, 8), 2);
  for (int lane = 0; lane < 32; ++lane) addresses[lane] = Tile::offset(0, 4 * (lane % 8));
  EXPECT_EQ(wavefronts(addresses, 0, 8, 16), 1);
  for (int lane = 0; lane < 32; ++lane) addresses[lane] = Tile::offset(8 * (lane % 2), 4 * (lane / 2 % 4));
  EXPECT_EQ(wavefronts(addresses, 0, 8, 16), 2);
}

}  // namespace

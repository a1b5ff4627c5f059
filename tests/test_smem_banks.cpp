// Shared-memory bank use of the sm90 backward's dQ tile stores (cuda/sm90/float_tile.h): each
// pass of a warp writes the tile with one wavefront per half-warp (8-byte stores are served a
// half-warp at a time), and the passes together write every element of the tile exactly once.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "cuda/sm90/float_tile.h"

namespace {

using flashattn::cuda::sm90::dq_store_group;
using flashattn::cuda::sm90::SwizzledFloatTile;

// Wavefronts for one 8-byte store of lanes [first, first + 16): per bank, the distinct 4-byte
// words it must serve; the most any bank serves.
int half_warp_wavefronts(const std::vector<uint32_t>& byte_addresses, int first) {
  std::map<int, std::set<uint32_t>> words_of_bank;
  for (int lane = first; lane < first + 16; ++lane)
    for (uint32_t word = byte_addresses[lane] / 4; word < byte_addresses[lane] / 4 + 2; ++word)
      words_of_bank[int(word % 32)].insert(word);
  size_t most = 0;
  for (const auto& [bank, words] : words_of_bank) most = std::max(most, words.size());
  return int(most);
}

// Stores a warpgroup's Rows x Cols accumulator tile as the kernels do, `group_of(pass, lane)`
// choosing the 8-column group a lane stores in each pass. Returns the worst wavefront count of a
// half-warp store; every element written is counted in `writes`.
template <int Rows, int Cols, typename GroupOf>
int store_tile(GroupOf group_of, std::map<uint32_t, int>& writes) {
  using Tile = SwizzledFloatTile<Rows, Cols>;
  int worst = 0;
  for (int warp = 0; warp < Rows / 16; ++warp)
    for (int pass = 0; pass < Cols / 8; ++pass)
      for (int half = 0; half < 2; ++half) {
        std::vector<uint32_t> addresses(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int row = 16 * warp + lane / 4 + 8 * half, col = 8 * group_of(pass, lane) + 2 * (lane % 4);
          addresses[lane] = Tile::offset(row, col);
          ++writes[addresses[lane]];
          ++writes[addresses[lane] + 4];
        }
        worst = std::max({worst, half_warp_wavefronts(addresses, 0), half_warp_wavefronts(addresses, 16)});
      }
  return worst;
}

template <int Rows, int Cols>
void expect_conflict_free_and_complete() {
  std::map<uint32_t, int> writes;
  EXPECT_EQ((store_tile<Rows, Cols>(dq_store_group, writes)), 1) << Rows << " x " << Cols;
  EXPECT_EQ(writes.size(), size_t(Rows * Cols)) << "every element of the tile written";
  for (const auto& [address, count] : writes) {
    EXPECT_EQ(count, 1) << "byte " << address << " written " << count << " times";
    EXPECT_LT(address, uint32_t(SwizzledFloatTile<Rows, Cols>::kBytes));
  }
}

TEST(Sm90DqTileStores, OneWavefrontPerHalfWarpAndEveryElementOnce) {
  expect_conflict_free_and_complete<64, 32>();  // d = 64: 32 columns a consumer
  expect_conflict_free_and_complete<64, 64>();  // d = 128, and each round of d = 256
}

// The model sees the conflict the store order removes: in the accumulator's own order, two rows
// of a half-warp meet on every 16-byte chunk.
TEST(Sm90DqTileStores, AccumulatorOrderWouldConflictTwoWays) {
  std::map<uint32_t, int> writes;
  EXPECT_EQ((store_tile<64, 64>([](int pass, int) { return pass; }, writes)), 2);
}

}  // namespace

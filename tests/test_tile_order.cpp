// The tile order of the persistent sm90 forward (cuda/sm90/tile_shapes.h): every tile exactly
// once, head-major, a head's query tiles last-first, splits innermost; its choice of tile shape;
// the shared memory of the sm90 kernels' shapes and the backward's dQ ring; and the deterministic
// backward's turn per dQ tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/dq_accum_layout.h"
#include "cuda/sm80/backward_order.h"
#include "cuda/sm90/tile_shapes.h"

namespace {

using flashattn::cuda::KernelParams;
using flashattn::cuda::sm90::backward_dq_box_parity;
using flashattn::cuda::sm90::backward_dq_boxes_per_part;
using flashattn::cuda::sm90::backward_dq_cols;
using flashattn::cuda::sm90::backward_dq_ring_boxes;
using flashattn::cuda::sm90::backward_dq_rounds;
using flashattn::cuda::sm90::backward_interleaves_heads;
using flashattn::cuda::sm90::backward_key_blocks;
using flashattn::cuda::backward_block;
using flashattn::cuda::backward_dq_turn;
using flashattn::cuda::backward_dq_turns;
using flashattn::cuda::backward_grid;
using flashattn::cuda::backward_pairs_innermost;
using flashattn::cuda::BackwardBlock;
using flashattn::cuda::BackwardGrid;
using flashattn::cuda::sm90::backward_shape;
using flashattn::cuda::sm90::backward_smem_bytes;
using flashattn::cuda::sm90::forward_shape;
using flashattn::cuda::sm90::forward_smem_bytes;
using flashattn::cuda::sm90::forward_tall;
using flashattn::cuda::sm90::forward_tall_possible;
using flashattn::cuda::sm90::forward_tile_at;

TEST(ForwardTileOrder, VisitsEveryTileOnceInHeadGroupsLongestFirst) {
  for (const auto& [batch, heads, m_blocks, splits, group] :
       {std::tuple{1, 1, 1, 1, 1}, std::tuple{3, 5, 7, 1, 1}, std::tuple{2, 3, 4, 3, 1}, std::tuple{4, 1, 9, 2, 1},
        std::tuple{3, 5, 7, 1, 4}, std::tuple{2, 3, 4, 3, 6}, std::tuple{4, 1, 9, 2, 3}, std::tuple{1, 7, 5, 1, 16}}) {
    const int all_heads = batch * heads;
    std::set<std::tuple<int, int, int, int>> seen;
    int previous_group = 0, previous_m = m_blocks - 1;
    for (int index = 0; index < all_heads * m_blocks * splits; ++index) {
      const auto c = forward_tile_at(index, heads, all_heads, m_blocks, splits, group);
      ASSERT_TRUE(c.b >= 0 && c.b < batch && c.h >= 0 && c.h < heads && c.m_block >= 0 && c.m_block < m_blocks &&
                  c.split >= 0 && c.split < splits)
          << "index " << index;
      EXPECT_TRUE(seen.insert({c.b, c.h, c.m_block, c.split}).second) << "index " << index << " repeats a tile";
      const int head_group = (c.b * heads + c.h) / group;
      EXPECT_GE(head_group, previous_group) << "index " << index << ": head groups out of order";
      if (head_group == previous_group) {
        EXPECT_LE(c.m_block, previous_m) << "index " << index << ": not longest first within the group";
      } else {
        EXPECT_EQ(c.m_block, m_blocks - 1) << "index " << index << ": a group not starting with its longest tiles";
      }
      previous_group = head_group;
      previous_m = c.m_block;
    }
    EXPECT_EQ(int(seen.size()), all_heads * m_blocks * splits);
  }
}

// The longest tiles of a group's heads come before any shorter tile of the group.
TEST(ForwardTileOrder, InterleavesTheHeadsOfAGroup) {
  const int heads = 6, m_blocks = 3, group = 4;  // groups of 4 and 2 heads
  std::vector<std::pair<int, int>> order;  // (head, m_block)
  for (int index = 0; index < heads * m_blocks; ++index) {
    const auto c = forward_tile_at(index, heads, heads, m_blocks, 1, group);
    order.push_back({c.h, c.m_block});
  }
  const std::vector<std::pair<int, int>> expected = {{0, 2}, {1, 2}, {2, 2}, {3, 2}, {0, 1}, {1, 1}, {2, 1}, {3, 1},
                                                     {0, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 2}, {5, 2}, {4, 1}, {5, 1},
                                                     {4, 0}, {5, 0}};
  EXPECT_EQ(order, expected);
}

// Causal-like masks only, with a group's working set within its share of L2 (32 MiB).
TEST(HeadGroups, ForwardGroupsHeadsUnderACausalMaskOnly) {
  using flashattn::cuda::forward_head_group;
  EXPECT_EQ(forward_head_group(16, 16, 1, 2048, 128, -1, -1), 1);   // no mask
  EXPECT_EQ(forward_head_group(16, 16, 1, 2048, 128, 256, 0), 1);   // sliding window
  EXPECT_EQ(forward_head_group(8, 16, 1, 2048, 128, -1, 0), 32);    // 1 MiB of K and V per head
  EXPECT_EQ(forward_head_group(8, 16, 4, 2048, 128, -1, 0), 128);   // GQA: a kv head serves 4
  EXPECT_EQ(forward_head_group(1, 16, 1, 65536, 128, -1, 0), 1);    // 32 MiB per head
  EXPECT_EQ(forward_head_group(2, 3, 1, 128, 64, -1, 0), 6);        // at most every head
  EXPECT_EQ(forward_head_group(1, 6, 1, 16384, 128, -1, 0), 4);     // the GPU test's groups
  EXPECT_EQ(forward_head_group(1, 3, 1, 16384, 256, -1, 0), 2);
  EXPECT_EQ(forward_head_group(1, 4, 1, 1 << 30, 256, -1, 0), 1);      // 1 TiB per head, counted in 64 bits
}

// A grid launch keeps its group only where the grid holds it: tiles in y, groups in z.
TEST(HeadGroups, GridLaunchesFallBackToHeadMajorPastTheGridsLimits) {
  using flashattn::cuda::head_group_in_grid;
  EXPECT_EQ(head_group_in_grid(4, 6, 128), 4);
  EXPECT_EQ(head_group_in_grid(4, 6, 65535), 4);
  EXPECT_EQ(head_group_in_grid(4, 6, 65536), 1);                 // a head's tiles past y
  EXPECT_EQ(head_group_in_grid(2, 2 * 65535, 16), 2);            // 65535 groups
  EXPECT_EQ(head_group_in_grid(2, 2 * 65535 + 1, 16), 1);        // one group more than z holds
}

TEST(HeadGroups, BackwardCountsKeysQueriesAndDqSums) {
  using flashattn::cuda::backward_head_group;
  EXPECT_EQ(backward_head_group(8, 16, 1, 2048, 2048, 128, -1, -1), 1);  // no mask
  EXPECT_EQ(backward_head_group(8, 16, 1, 2048, 2048, 128, 512, 0), 1);  // sliding window
  EXPECT_EQ(backward_head_group(8, 16, 1, 2048, 2048, 128, -1, 0), 10);  // 1 + 2 MiB per kv head
  EXPECT_EQ(backward_head_group(8, 4, 4, 2048, 2048, 128, -1, 0), 3);    // 1 + 8 MiB: its 4 query heads
  EXPECT_EQ(backward_head_group(1, 5, 1, 1, 16384, 128, -1, 0), 3);      // the GPU test's groups
  EXPECT_EQ(backward_head_group(1, 4, 1, 1, 8192, 256, -1, 0), 3);
  EXPECT_EQ(backward_head_group(1, 4, 1, 1 << 30, 1, 256, -1, 0), 1);    // 2 TiB of queries, in 64 bits
}

// Both backward launchers' group: backward_head_group's where the grid holds it, none in
// deterministic mode (its turns need each head's key blocks in descending order).
TEST(HeadGroups, BackwardLaunchesGroupOutsideDeterministicModeWhereTheGridHoldsIt) {
  using flashattn::cuda::backward_launch_head_group;
  KernelParams p;
  p.batch = 8;
  p.heads_kv = p.heads_q = 16;
  p.seqlen_q = p.seqlen_k = 2048;
  p.window_right = 0;  // causal
  EXPECT_EQ(backward_launch_head_group(p, 128, 16), 10);
  EXPECT_EQ(backward_launch_head_group(p, 128, 65536), 1);  // a head's key blocks past y
  p.deterministic = 1;
  EXPECT_EQ(backward_launch_head_group(p, 128, 16), 1);
}

// A grouped launch's block x of group z decodes to head z * group + x.
TEST(HeadGroups, GroupedBlocksDecodeToConsecutiveHeads) {
  using flashattn::cuda::grouped_head;
  EXPECT_EQ(grouped_head(0, 0, 4), 0);
  EXPECT_EQ(grouped_head(0, 3, 4), 3);
  EXPECT_EQ(grouped_head(2, 1, 4), 9);
}

// Tall tiles (four consumers and 256 rows at d = 64, three and 192 at d = 128) only up to
// d = 128, and only where they compute at most 4% more rows than 128-row tiles.
TEST(ForwardTileShape, TallTilesWhereTheyWasteNoRows) {
  EXPECT_EQ(forward_shape(64, true).block_m, 256);
  EXPECT_EQ(forward_shape(128, true).block_m, 192);
  EXPECT_EQ(forward_shape(64, true).block_n, 64);
  EXPECT_EQ(forward_shape(128, true).block_n, 64);
  for (int d : {64, 128}) {
    EXPECT_EQ(forward_shape(d, false).block_m, 128);
    for (int64_t n : {129, 150, 192, 2048, 4096, 16384}) EXPECT_TRUE(forward_tall(d, n)) << d << ", N = " << n;
    for (int64_t n : {1, 17, 64, 128}) EXPECT_FALSE(forward_tall(d, n)) << d << ", N = " << n;
  }
  // d = 64: 1000 and 1024 rows fill four 256-row tiles as they fill eight of 128 rows; 257 to
  // 384 rows would compute 512.
  for (int64_t n : {256, 1000, 1024, 16000}) EXPECT_TRUE(forward_tall(64, n)) << "N = " << n;
  for (int64_t n : {257, 300, 384, 600}) EXPECT_FALSE(forward_tall(64, n)) << "N = " << n;
  // d = 128: 1024 rows would take six 192-row tiles, 1152 rows.
  EXPECT_TRUE(forward_tall(128, 16000));
  for (int64_t n : {193, 256, 1000, 1024}) EXPECT_FALSE(forward_tall(128, n)) << "N = " << n;
  for (int64_t n : {150, 4096, 16384}) EXPECT_FALSE(forward_tall(256, n)) << "N = " << n;
}

// Every sm90 kernel fits the 232448 bytes of shared memory a Hopper block may have; the d = 64
// backward takes 128-row steps except with general scores, and its dQ tiles stay 64 rows x (all
// or half the) columns, within the 32-column boxes of the accumulator map.
TEST(TileShape, Sm90KernelsFitSharedMemory) {
  constexpr int kHopperSmem = 232448;
  for (int d : {64, 128, 256}) {
    for (bool tall : {false, true}) {
      if (!tall || forward_tall_possible(d)) {
        EXPECT_LE(forward_smem_bytes(d, tall), kHopperSmem) << "d = " << d;
      }
    }
    for (bool general : {false, true}) {
      EXPECT_LE(backward_smem_bytes(d, general), kHopperSmem) << "d = " << d << ", general " << general;
      EXPECT_EQ(backward_dq_cols(d, general) % 32, 0) << "d = " << d;
    }
  }
  EXPECT_EQ(backward_shape(64).block_m, 128);
  EXPECT_EQ(backward_shape(64, true).block_m, 64);
  EXPECT_EQ(backward_dq_cols(64), 64);
  EXPECT_EQ(backward_dq_cols(64, true), 32);
  EXPECT_EQ(backward_shape(128).block_m, 64);
  EXPECT_EQ(backward_dq_cols(128), 64);
}

// A consumer's dQ ring: round r of a step takes the tile's boxes from box rounds - 1 - r on. A
// box's barrier parity must count its uses so far (a wrong parity deadlocks or overwrites a box
// TMA still reads), and at d = 256 the second round's first box must be free and its second the
// first round's first, the box TMA reads first.
TEST(TileShape, Sm90BackwardDqRingCountsEachBoxsUses) {
  for (const auto& [rounds, boxes] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 2}, std::pair{3, 2}, std::pair{2, 1}}) {
    std::vector<int> uses(rounds + boxes - 1, 0);
    for (int step = 0; step < 7; ++step)
      for (int round = 0; round < rounds; ++round)
        for (int x = 0; x < boxes; ++x) {
          const int box = rounds - 1 - round + x;
          ASSERT_LT(box, int(uses.size()));
          EXPECT_EQ(backward_dq_box_parity(rounds, boxes, step, round, box), uint32_t(uses[box] & 1))
              << rounds << " rounds of " << boxes << " boxes, step " << step << ", round " << round << ", box " << x;
          ++uses[box];
        }
  }
  EXPECT_EQ(backward_dq_rounds(256), 2);
  EXPECT_EQ(backward_dq_ring_boxes(256), 3);
  EXPECT_EQ(backward_dq_boxes_per_part(256), 1);
  for (int d : {64, 128})
    for (bool general : {false, true}) {
      EXPECT_EQ(backward_dq_rounds(d), 1);
      EXPECT_EQ(backward_dq_ring_boxes(d, general), backward_dq_cols(d, general) / 32) << "d = " << d;
      EXPECT_EQ(backward_dq_boxes_per_part(d, general), backward_dq_ring_boxes(d, general)) << "one part: the tile";
    }
}

// Deterministic mode keeps one turn per (query tile, consumer), backward_dq_turn (the sm80
// backward uses consumer 0's): no two tiles of a call may share it, and it stays inside the
// backward_dq_turns ints the host allocates, for dense and varlen batches (empty sequences and
// lengths that are not multiples of the tile included).
TEST(BackwardDqTurns, EveryTileHasATurnOfItsOwn) {
  const std::vector<std::vector<int64_t>> batches = {{1}, {64}, {65, 1, 127}, {0, 300, 0, 64, 1000}, {129, 129}};
  for (const int block_m : {64, 128})
    for (const int heads : {1, 3})
      for (const auto& seqlens : batches) {
        int64_t rows_q = 0;
        for (const int64_t n : seqlens) rows_q += n;
        const int64_t batch = int64_t(seqlens.size());
        std::set<int64_t> seen;
        size_t tiles = 0;
        for (int h = 0; h < heads; ++h) {
          int64_t packed_q = 0;
          for (int64_t b = 0; b < batch; ++b) {
            for (int64_t m = 0; m < (seqlens[b] + block_m - 1) / block_m; ++m, ++tiles)
              for (int consumer = 0; consumer < 2; ++consumer) {
                const int64_t turn = backward_dq_turn(rows_q, batch, packed_q, block_m, int(b), h, int(m), consumer);
                EXPECT_TRUE(turn >= 0 && turn < backward_dq_turns(rows_q, batch, heads)) << turn;
                seen.insert(turn);
              }
            packed_q += seqlens[b];
          }
        }
        EXPECT_EQ(seen.size(), 2 * tiles) << "block_m " << block_m << ", heads " << heads;
      }
}

// The sm80 backward's grid runs every (key block, kv head, sequence) once, and in deterministic
// mode launches key block n + 1 of a pair before key block n, whose adds to a dQ tile wait for
// it (a block that waited for one launched after it could wait for a block that never becomes
// resident); without a mask the pairs come innermost, with one the key blocks. In groups of heads
// (default mode, causal-like masks) key block n of every pair of a group comes before any n + 1.
TEST(BackwardLaunchOrder, DeterministicBlocksWaitOnlyForBlocksLaunchedBefore) {
  struct Index {
    unsigned x, y, z;
  };
  struct Params {
    int deterministic, window_left, window_right, heads_kv, head_group;
  };
  for (const int key_blocks : {1, 2, 7})
    for (const int heads_kv : {1, 3, 8})
      for (const int batch : {1, 2, 4})
        for (Params p : {Params{0, -1, -1, 0, 1}, Params{0, -1, 0, 0, 1}, Params{0, -1, 0, 0, 2},
                         Params{0, -1, 0, 0, 5}, Params{1, -1, -1, 0, 1}, Params{1, -1, 0, 0, 1},
                         Params{1, 40, 3, 0, 1}}) {
          p.heads_kv = heads_kv;
          const bool pairs = backward_pairs_innermost(p.deterministic, p.window_left, p.window_right);
          EXPECT_EQ(pairs, p.deterministic && p.window_left < 0 && p.window_right < 0);
          const BackwardGrid g = backward_grid(key_blocks, heads_kv, batch, pairs, p.head_group);
          const int pair_count = heads_kv * batch, spare = p.head_group > 1 ? g.x * g.z - pair_count : 0;
          ASSERT_EQ(int64_t(g.x) * g.y * g.z, int64_t(key_blocks) * (pair_count + spare));
          ASSERT_LT(spare, p.head_group);
          // launched[(b * heads_kv + hk) * key_blocks + n]: the block's place in launch order.
          std::vector<int64_t> launched(size_t(key_blocks) * heads_kv * batch, -1);
          int64_t order = 0;
          for (unsigned z = 0; z < g.z; ++z)
            for (unsigned y = 0; y < g.y; ++y)
              for (unsigned x = 0; x < g.x; ++x, ++order) {
                const BackwardBlock at = backward_block(Index{x, y, z}, Index{g.x, g.y, g.z}, p);
                if (at.batch >= batch) continue;  // a spare block of the last head group: it exits
                ASSERT_TRUE(at.key_block >= 0 && at.key_block < key_blocks && at.kv_head >= 0 &&
                            at.kv_head < heads_kv && at.batch >= 0 && at.batch < batch);
                int64_t& slot = launched[(size_t(at.batch) * heads_kv + at.kv_head) * key_blocks + at.key_block];
                EXPECT_EQ(slot, -1) << "a block runs twice";
                slot = order;
              }
          const std::string what = "key blocks " + std::to_string(key_blocks) + ", kv heads " +
                                   std::to_string(heads_kv) + ", batch " + std::to_string(batch) +
                                   (p.deterministic ? ", deterministic" : "") + (pairs ? ", pairs innermost" : "") +
                                   ", head group " + std::to_string(p.head_group);
          for (size_t pair = 0; pair < size_t(heads_kv) * batch; ++pair)
            for (int n = 0; n + 1 < key_blocks; ++n) {
              const int64_t first = launched[pair * key_blocks + n], second = launched[pair * key_blocks + n + 1];
              if (p.deterministic) {
                EXPECT_LT(second, first) << what;  // key block n waits for n + 1
              } else {
                EXPECT_LT(first, second) << what;  // the heaviest causal key blocks first
              }
            }
          // Head groups: key block n of every pair of a group before any key block n + 1 of it.
          if (p.head_group > 1) {
            const size_t group = size_t(p.head_group);
            for (size_t pair = 0; pair < size_t(pair_count); ++pair) {
              const size_t first = pair / group * group, end = std::min(first + group, size_t(pair_count));
              for (size_t other = first; other < end; ++other)
                for (int n = 0; n + 1 < key_blocks; ++n)
                  EXPECT_LT(launched[pair * key_blocks + n], launched[other * key_blocks + n + 1]) << what;
            }
          }
          // Pairs innermost: each group of pairs launches every pair's last key block first.
          if (pairs) {
            const int group = flashattn::cuda::backward_pair_group(heads_kv * batch);
            ASSERT_EQ(heads_kv * batch % group, 0) << what;
            for (size_t pair = 0; pair < size_t(heads_kv) * batch; ++pair)
              EXPECT_LT(launched[pair * key_blocks + key_blocks - 1] % (int64_t(group) * key_blocks), group) << what;
          }
        }
  // More groups than a grid's z holds: the pairs go ungrouped, all in x.
  const BackwardGrid huge = backward_grid(3, 64, 65535, true);
  EXPECT_LE(huge.z, 65535u);
  EXPECT_EQ(uint64_t(huge.x) * huge.y * huge.z, uint64_t(3) * 64 * 65535);
}

// The sm90 deterministic backward interleaves kv heads without a mask up to 4096 keys, whatever
// its key blocks (the d = 256 kernel's 80-key blocks cover 4096 keys with 52 blocks, 4160 keys),
// under a mask up to 16 key blocks, and never in the default mode or with two chains of dQ adds.
TEST(BackwardLaunchOrder, Sm90DeterministicHeadsInterleaveByKeysNotBlocks) {
  KernelParams p;
  p.deterministic = 1;
  for (const int seqlen_k : {1, 80, 4000, 4096, 4097, 8192}) {
    p.seqlen_k = seqlen_k;
    EXPECT_EQ(backward_interleaves_heads<80>(p), seqlen_k <= 4096) << seqlen_k << " keys";
    EXPECT_EQ(backward_interleaves_heads<128>(p), seqlen_k <= 4096) << seqlen_k << " keys";
  }
  p.window_right = 0;  // causal
  for (const int blocks : {1, 16, 17}) {
    p.seqlen_k = 80 * blocks;
    EXPECT_EQ(backward_key_blocks<80>(p), blocks);
    EXPECT_EQ(backward_interleaves_heads<80>(p), blocks <= 16) << blocks << " key blocks";
  }
  p.seqlen_k = 80;
  p.dq_copies = 2;
  EXPECT_FALSE(backward_interleaves_heads<80>(p));
  p.dq_copies = 1;
  p.deterministic = 0;
  EXPECT_FALSE(backward_interleaves_heads<80>(p));
}

}  // namespace

// The sm80 backward's grid: which key block of which (kv head, sequence) each thread block runs,
// and so the order in which they launch (x fastest, then y, then z). Plain C++: the host tests
// check it, the launch and the kernel share it.
#pragma once

#include "core/semantics.h"  // FA_HD
#include "cuda/head_groups.h"

namespace flashattn::cuda {

struct BackwardGrid {
  unsigned x, y, z;
};
struct BackwardBlock {
  int key_block, kv_head, batch;
};

// The default grid is (key blocks, kv heads, batch): under a causal mask a pair's heaviest key
// blocks first. Deterministic mode runs key blocks in descending order, so that key block n + 1,
// whose adds to a dQ tile come before this block's, was launched before it (no block waits for
// one that may not be resident). Without a mask every key block of a pair walks the same query
// blocks in step, each a step behind the last: there the (kv head, sequence) pairs go innermost,
// so that blocks resident at once seldom belong to one pair (keeping key blocks innermost gave
// 0.70 of the default backward's speed at d = 64, N = 1k and 4k). Under a causal mask key blocks
// start their walks at their diagonals and hardly wait, and key blocks innermost keep a pair's
// lighter blocks first.
FA_HD constexpr bool backward_pairs_innermost(int deterministic, int window_left, int window_right) {
  return deterministic && window_left < 0 && window_right < 0;
}

// Pairs innermost: the pairs interleave in groups of kBackwardPairGroup where that divides their
// number (and the groups fit a grid's 65535 in z), else all of them. With every pair interleaved,
// d = 256 at N = 1k (128 pairs) kept 0.85 of the default backward's speed (the resident blocks read
// all pairs' Q and dO, presumably past L2); groups of 16 or 32 gave 0.96 and changed no other row
// by more than 1%.
inline constexpr int kBackwardPairGroup = 16;
FA_HD constexpr int backward_pair_group(int pairs) {
  const bool grouped =
      kBackwardPairGroup < pairs && pairs % kBackwardPairGroup == 0 && pairs / kBackwardPairGroup <= 65535;
  return grouped ? kBackwardPairGroup : pairs;
}

// Pairs innermost: (pairs of a group, key blocks, groups), for fewer than 2^31 pairs (the launch
// refuses more). Default mode in groups of heads (head_group > 1, head_groups.h, for causal-like
// masks): (the group's pairs, key blocks, groups), key block n of every pair of the group before
// any key block n + 1; the last group may have spare blocks, past the last pair. Else (key
// blocks, kv heads, batch).
constexpr BackwardGrid backward_grid(int key_blocks, int heads_kv, int batch, bool pairs_innermost,
                                     int head_group = 1) {
  if (!pairs_innermost && head_group > 1)
    return {unsigned(head_group), unsigned(key_blocks),
            unsigned(head_group_count(int64_t(heads_kv) * batch, head_group))};
  if (!pairs_innermost) return {unsigned(key_blocks), unsigned(heads_kv), unsigned(batch)};
  const int pairs = heads_kv * batch, group = backward_pair_group(pairs);
  return {unsigned(group), unsigned(key_blocks), unsigned(pairs / group)};
}

// The key block, kv head and sequence of a block: `block` and `grid` are blockIdx and gridDim in
// the kernel, anything with x, y, z on the host; `p` has deterministic, window_left, window_right,
// heads_kv and head_group. A pair is batch * heads_kv + kv head; a spare block of the last head
// group gets a batch past the last.
template <typename Index, typename Extent, typename Params>
FA_HD constexpr BackwardBlock backward_block(const Index& block, const Extent& grid, const Params& p) {
  if (!p.deterministic && p.head_group > 1) {
    const int pair = grouped_head(block.z, block.x, p.head_group);
    return {int(block.y), pair % p.heads_kv, pair / p.heads_kv};
  }
  if (!p.deterministic) return {int(block.x), int(block.y), int(block.z)};
  if (backward_pairs_innermost(p.deterministic, p.window_left, p.window_right)) {
    const int pair = int(block.z * grid.x + block.x);
    return {int(grid.y - 1 - block.y), pair % p.heads_kv, pair / p.heads_kv};
  }
  return {int(grid.x - 1 - block.x), int(block.y), int(block.z)};
}

}  // namespace flashattn::cuda

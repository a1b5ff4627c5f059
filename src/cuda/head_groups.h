// How many heads' tiles interleave in the launch order under causal-like masks, for the sm80 and
// sm90 kernels alike: plain constexpr functions, which the host tests check.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/semantics.h"  // FA_HD
#include "cuda/kernel_params.h"

namespace flashattn::cuda {

// Heads per group of the launch order (KernelParams::head_group). Under a causal-like mask (keys
// up to the diagonal) a head's query tiles, and its key blocks, range from one key block's work
// to all of them. Head-major, the multiprocessors' last tiles include long ones and they finish
// up to a long tile apart; longest first across the heads of a group, the last tiles are short. A
// group's working set stays within 32 MiB of the H100's and H200's 50 MB of L2 (longest first
// across all heads, the sm90 causal forward lost 13% to L2 misses; 64 MiB lost up to 7% at
// d <= 128, measured on the H200).
constexpr int64_t kHeadGroupBytes = int64_t(32) << 20;
constexpr int64_t kElementBytes = 2;  // fp16 and bf16, the CUDA kernels' element types
constexpr int head_group_of(int64_t head_bytes, int64_t heads, int window_left, int window_right) {
  if (window_left >= 0 || window_right < 0) return 1;
  return int(std::clamp<int64_t>(kHeadGroupBytes / std::max<int64_t>(1, head_bytes), 1, heads));
}
// Groups of `head_group` among `heads` heads (the last may hold fewer): a grid's z in groups.
constexpr int64_t head_group_count(int64_t heads, int head_group) { return (heads + head_group - 1) / head_group; }
// A grid launch's head group: `group` where the grid holds it (a head's tiles or key blocks in y,
// the groups in z, both within 65535), else 1 (head-major).
constexpr int head_group_in_grid(int group, int64_t heads, int64_t blocks_per_head) {
  return blocks_per_head <= 65535 && head_group_count(heads, group) <= 65535 ? group : 1;
}
// The head (or, in a backward, the (batch, kv head) pair) of a grouped launch's block x of group z:
// the launchers' grids are (group, tiles or key blocks, groups). Past the last for the last
// group's spare blocks.
FA_HD constexpr int grouped_head(unsigned z, unsigned x, int group) { return int(z) * group + int(x); }
// The forward's working set per query head: its K and V (a kv head serves `group` query heads).
constexpr int forward_head_group(int batch, int heads_q, int group, int seqlen_k, int head_dim, int window_left,
                                 int window_right) {
  return head_group_of(kElementBytes * 2 * seqlen_k * head_dim / group, int64_t(batch) * heads_q, window_left,
                       window_right);
}
// The backward's per kv head: K and V, and its query heads' Q, dO and fp32 dQ sums.
constexpr int backward_head_group(int batch, int heads_kv, int group, int seqlen_q, int seqlen_k, int head_dim,
                                  int window_left, int window_right) {
  const int64_t kv = kElementBytes * 2 * seqlen_k * head_dim;
  const int64_t queries = (2 * kElementBytes + 4) * seqlen_q * head_dim * group;
  return head_group_of(kv + queries, int64_t(batch) * heads_kv, window_left, window_right);
}
// A backward launch's head group, with `key_blocks` per kv head: 1 in deterministic mode (its turns
// need each head's key blocks in descending order), else backward_head_group's where the grid
// holds it.
inline int backward_launch_head_group(const KernelParams& p, int head_dim, int64_t key_blocks) {
  if (p.deterministic) return 1;
  return head_group_in_grid(backward_head_group(p.batch, p.heads_kv, p.group, p.seqlen_q, p.seqlen_k, head_dim,
                                                p.window_left, p.window_right),
                            int64_t(p.batch) * p.heads_kv, key_blocks);
}

}  // namespace flashattn::cuda

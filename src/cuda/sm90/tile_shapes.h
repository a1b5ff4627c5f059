// Tile shapes of the sm_90 forward per compiled head dimension, read by the kernels and by the
// host (split decision, shared-memory size).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/semantics.h"  // FA_HD
#include "cuda/head_groups.h"
#include "cuda/kernel_params.h"

namespace flashattn::cuda::sm90 {

struct ForwardShape {
  int block_m, block_n;     // query rows per block (64 per consumer warpgroup), keys per step
  int k_stages, v_stages;   // K and V tiles in flight (V is held a step longer: P V of block n
                            // is issued beside S of block n + 1)
  bool pingpong;            // consumer warpgroups take turns issuing their GEMMs
};

// Consumer warpgroups of 64 query rows. Keys per step are bounded by registers (a consumer
// thread holds d/2 output and block_n/2 score accumulators, plus block_n/4 words of P) and by
// shared memory (Q, the K and V stages and, when persistent, the O tile: at d = 128 a third V
// stage fills the 227 KB). Pingpong pays where the softmax is a large share of a step's time,
// i.e. for head dims up to 128, and above on short sequences (Consumer::pingpong).
//
// `tall`: more consumers a tile (d <= 128, forward_tall): each consumer's softmax gets the time
// of the others' GEMMs, and K and V are read once per tile of 192 or 256 query rows instead of
// 128, fewer bytes from L2 per FLOP, which counts where the GPU runs at its power cap; fewer tile
// boundaries a head, too. At d = 128 three consumers of 160 registers hold O, S and P of 64 keys
// (80 keys spill). At d = 64 four consumers of 112 registers hold those of 64 keys: against
// three of 96 keys it measured +9 to +26% at 1k to 4k keys non-causal, +2 to +4% causal and +0.4
// to +3% from 8k (the boundary, about 4000 clocks, comes once per 256 rows instead of 192 or 128).
// Measured at d = 128 against 128-row tiles: +5.4 to +7.9% from 2k keys non-causal, +7.5 to +8.8%
// causal from 8k (2k and 4k causal: -2 to +5% over two runs).
constexpr ForwardShape forward_shape(int head_dim, bool tall) {
  return tall && head_dim <= 64 ? ForwardShape{256, 64, 4, 4, true}
         : tall                 ? ForwardShape{192, 64, 2, 3, true}
         : head_dim <= 128      ? ForwardShape{128, 128, 2, 3, true}
         : head_dim <= 192      ? ForwardShape{128, 96, 2, 2, false}
                                : ForwardShape{128, 80, 2, 2, false};
}

// Whether a forward of `seqlen_q` query rows (the longest, for varlen) takes tall tiles: at
// d <= 128, when they compute at most 4% more rows than 128-row tiles (d = 128, N = 1k: 1152 rows
// against 1024, not taken; 2k: 2112 against 2048, taken; d = 64 takes 256-row tiles at every
// multiple of 256). Read by the host and by the launcher.
constexpr bool forward_tall_possible(int head_dim) { return head_dim <= 128; }
constexpr bool forward_tall(int head_dim, int64_t seqlen_q) {
  const int64_t m = forward_shape(head_dim, true).block_m;
  const int64_t tall_rows = (seqlen_q + m - 1) / m * m, rows = (seqlen_q + 127) / 128 * 128;
  return forward_tall_possible(head_dim) && tall_rows * 25 <= rows * 26;
}

// Tiles of a forward (query tiles x heads x batch x key splits), which the persistent kernel
// numbers in an int.
constexpr int64_t forward_tiles(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t splits, int block_m) {
  return batch * heads_q * ((seqlen_q + block_m - 1) / block_m) * splits;
}
// Tile `index` of the forward, in groups of `group` heads (the last group may hold fewer): a
// group's tiles run at about the same time and share its heads' K and V in L2. Within a group the
// query tiles go last-first across its heads (under a causal mask the longest first, so that the
// multiprocessors' last tiles are the shortest), key splits innermost. group = 1 is head-major.
struct ForwardTileCoordinates {
  int b, h, m_block, split;
};
constexpr ForwardTileCoordinates forward_tile_at(int index, int heads_q, int heads, int m_blocks, int splits,
                                                 int group) {
  const int head_tiles = m_blocks * splits;
  const int first = index / (group * head_tiles) * group;  // the group's first head
  const int width = heads - first < group ? heads - first : group;
  const int step = (index - first * head_tiles) / splits;  // (query tile, head) within the group
  const int head = first + step % width;
  return {head / heads_q, head % heads_q, m_blocks - 1 - step / width, index % splits};
}

constexpr int64_t kMaxForwardTiles = (int64_t(1) << 31) - (int64_t(1) << 20);  // room for the grid past the last

// The forward is persistent: one block per multiprocessor takes tiles from a counter. Up to
// d = 128 it stages O in a tile of its own, so that the next tile's Q can land while this tile's
// output is written; above, shared memory holds Q and two 80-key K/V stages and nothing more, so
// the consumers write O straight from their registers (forward_stages_output; measured on the
// H200 against one tile per block: +1.5 to +5.5% at 1k and 2k keys, -0.7 to +1.5% from 4k; with
// 4-byte stores instead of 16-byte ones, -0.5 to -6%). There the score-transform kernel (`general`)
// takes one tile per block: its transform's registers beside the tile loop's state would spill.
constexpr bool forward_persistent(int head_dim, bool general) { return head_dim <= 128 || !general; }
constexpr bool forward_stages_output(int head_dim) { return head_dim <= 128; }

// The persistent forward's tile slots: the producer describes each tile it starts in slot
// j % kForwardTileSlots (64 bytes, room to spare), which the consumers read when they begin the
// tile and again for its epilogue, then free. A 16-byte word after the slots keeps the tile
// total.
constexpr int kForwardTileSlots = 4, kForwardTicketBytes = 64;
constexpr int forward_tile_slot_bytes() { return kForwardTileSlots * kForwardTicketBytes + 16; }

// mbarriers of the forward: Q full and empty, K and V full and empty per stage, the tile slots'
// full and empty.
constexpr int forward_barriers(int k_stages, int v_stages) {
  return 2 + 2 * k_stages + 2 * v_stages + 2 * kForwardTileSlots;
}

// Dynamic shared memory of the forward: Q, the K and V stages, the O tile (forward_stages_output),
// the mbarriers, the tile slots, and 1 KiB of slack to align the tiles to the 1024-byte period of
// the swizzle.
constexpr int forward_smem_bytes(int head_dim, bool tall) {
  const ForwardShape s = forward_shape(head_dim, tall);
  const int output = forward_stages_output(head_dim) ? 2 * head_dim * s.block_m : 0;
  return 2 * head_dim * (s.block_m + (s.k_stages + s.v_stages) * s.block_n) + output +
         8 * forward_barriers(s.k_stages, s.v_stages) + forward_tile_slot_bytes() + 1024;
}

}  // namespace flashattn::cuda::sm90

namespace flashattn::cuda::sm90 {

// The sm_90 backward: a block keeps dK and dV of block_n keys in its two consumer warpgroups'
// registers and walks the query blocks of block_m rows that see them, Q and dO through a ring of
// `stages`. Up to d = 128 each consumer owns 64 of 128 keys (d/2 + d/2 fp32 per thread); at
// d = 64 a step takes 128 query rows (half the steps, each twice the work: S^T and dP^T are 64
// fp32 per thread, which fit beside dK and dV at d = 64, but not beside the score transform's
// temporaries too: `general` scores keep 64 rows); at d = 256 (backward_wide_kernel.cuh) the
// consumers share 80 keys and split the head dim (dK^T and dV^T: 128 dims x 80 keys, 80 + 80 fp32
// per thread), and Q and dO have one stage.
struct BackwardShape {
  int block_m, block_n, stages;
};

constexpr bool backward_supported(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }
constexpr bool backward_wide(int head_dim) { return head_dim > 128; }
constexpr BackwardShape backward_shape(int head_dim, bool general = false) {
  return backward_wide(head_dim)        ? BackwardShape{64, 80, 1}
         : head_dim <= 64 && !general  ? BackwardShape{128, 128, 2}
                                       : BackwardShape{64, 128, 2};
}

// Key blocks per (batch, kv head): the grid's extent over the longest sequence's keys.
template <int kN>
FA_HD int64_t backward_key_blocks(const KernelParams& p) {
  return (int64_t(p.seqlen_k) + kN - 1) / kN;
}

// Deterministic mode orders each dQ tile's adds by key block, descending, and launches blocks in
// that order. Where a head has few key blocks (at most 16), or without a mask up to 4096 keys,
// it launches every kv head's key block n + 1 before any head's key block n, so that a block
// rarely waits for its predecessor's turn (that one ran in an earlier wave); beyond, a head's key
// blocks stay together: interleaved there, the heads' Q, dO and dQ streams compete for L2
// (measured on the H200: -10 to -30% at 16k keys, -7 to -10% with causal masks at 4k).
template <int kN>
FA_HD bool backward_interleaves_heads(const KernelParams& p) {
  const int64_t n_blocks = backward_key_blocks<kN>(p);
  const bool unmasked = p.window_left < 0 && p.window_right < 0;
  return p.deterministic && p.dq_copies == 1 && (unmasked ? p.seqlen_k <= 4096 : n_blocks <= 16);
}

// Deterministic mode's chains of dQ adds. Each dQ tile's adds pass a turn from key block to key
// block (an add's completion, a release, an acquire); up to d = 64 a step is short beside that
// hand-over, and without a mask every key block of a head adds to every tile, so one chain
// throttles the blocks from 4096 keys on (det/default 0.88 to 0.90 at 4k and 8k on the H200). Two
// chains, even and odd key blocks in copies of dq_accum summed in order by the finish kernel, took
// those rows to 0.92 to 0.97; with a mask, or above d = 64, the second copy cost more than it gave.
constexpr int backward_dq_chains(int head_dim, bool masked, int64_t seqlen_k) {
  return head_dim <= 64 && !masked && seqlen_k >= 4096 ? 2 : 1;
}

// The fp32 dQ tile a consumer hands over per step has 64 rows: with 64-row steps a consumer's
// share is d/2 (narrow) or d/4 (wide) columns of all rows; with 128-row steps, every column of
// its 64 rows.
constexpr int backward_dq_cols(int head_dim, bool general = false) {
  const BackwardShape s = backward_shape(head_dim, general);
  return backward_wide(head_dim) ? head_dim / 4 : s.block_m == 128 ? head_dim : head_dim / 2;
}

// Whether dO has full and empty barriers of its own, apart from Q's: the wide kernel then issues
// S = Q K^T while dO lands, and hands dO and Q back apart (after dV and after dK), so that each
// one's next load starts as soon as it can. Measured on the H200 with the 64-key kernel: d = 256
// +2 to +10%, d = 128 -0.5 to -1.3%.
constexpr bool backward_do_apart(int head_dim) { return backward_wide(head_dim); }

// dQ tiles a consumer hands over per step: the wide kernel's dQ = dS K runs in two rounds of 64
// columns (registers), the narrow kernels' in one.
constexpr int backward_dq_rounds(int head_dim) { return backward_wide(head_dim) ? 2 : 1; }

// A consumer's dQ buffer: a ring of 32-column boxes (64 rows of fp32, 8 KB each), given back to the
// consumer in parts once TMA has read them. Round r of R takes the tile's boxes from box R - 1 - r
// on, so with two rounds of two boxes in three boxes, given back box by box, the second round's
// first box is free and its second waits only for TMA to read the first round's first box (in one
// buffer the whole second tile waited for TMA to read all of the first: measured on the H200, d =
// 256 +1 to +3%, deterministic +3.5 to +7%). With one round a step the tile goes back whole (box by
// box measured 0 to -1% there).
constexpr int backward_dq_ring_boxes(int head_dim, bool general = false) {
  return backward_dq_cols(head_dim, general) / 32 + backward_dq_rounds(head_dim) - 1;
}
// The parity of ring box `box`'s uses before round `round` of step `step` uses it: every step's
// rounds [lo, hi] use it, each once (boxes: a tile's boxes; rounds: tiles a step).
constexpr uint32_t backward_dq_box_parity(int rounds, int boxes, int step, int round, int box) {
  const int lo = std::max(0, rounds - 1 - box), hi = std::min(rounds - 1, rounds + boxes - 2 - box);
  return uint32_t(step * (hi - lo + 1) + round - lo) & 1u;
}
// A ring part is what the reduce thread gives back at once: a box where a step hands over several
// tiles, else the whole tile.
constexpr int backward_dq_boxes_per_part(int head_dim, bool general = false) {
  return backward_dq_rounds(head_dim) > 1 ? 1 : backward_dq_cols(head_dim, general) / 32;
}
constexpr int backward_dq_ring_parts(int head_dim, bool general = false) {
  return backward_dq_ring_boxes(head_dim, general) / backward_dq_boxes_per_part(head_dim, general);
}

// The backward's mbarriers: K/V; full and empty per Q/dO stage; dQ full per consumer and empty per
// consumer and ring part; with dO apart, dO full and empty per stage.
constexpr int backward_barriers(int stages, bool do_apart, int dq_ring_parts) {
  return 1 + 2 * stages + 2 + 2 * dq_ring_parts + (do_apart ? 2 * stages : 0);
}

// The two 16-bit score tiles of a step: dS^T of two steps, [key][query] (narrow), or P and dS,
// [query][key] with the keys padded to whole 64-column blocks (wide).
constexpr int backward_score_tile_bytes(int head_dim, bool general = false) {
  const BackwardShape s = backward_shape(head_dim, general);
  return 2 * 2 * (backward_wide(head_dim) ? s.block_m * ((s.block_n + 63) / 64 * 64) : s.block_n * s.block_m);
}

// K, V, the Q and dO stages, the score tiles, the dQ ring of each consumer, lse and delta rows per
// stage, the mbarriers, and 1 KiB of slack for the alignment of the tiles.
constexpr int backward_smem_bytes(int head_dim, bool general = false) {
  const BackwardShape s = backward_shape(head_dim, general);
  const int barriers = backward_barriers(s.stages, backward_do_apart(head_dim), backward_dq_ring_parts(head_dim, general));
  return 2 * head_dim * (2 * s.block_n + 2 * s.stages * s.block_m) + backward_score_tile_bytes(head_dim, general) +
         2 * backward_dq_ring_boxes(head_dim, general) * 64 * 32 * 4 + 2 * 4 * s.block_m * s.stages + 8 * barriers + 1024;
}

}  // namespace flashattn::cuda::sm90

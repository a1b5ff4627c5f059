// The column order of the backward's fp32 dq_accum rows. Plain C++: the host tests check it, the
// kernels and the finish kernel share it.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// An mma accumulator (mma.sync's n8 tiles, wgmma's 8-column groups alike) holds, per lane, rows
// lane / 4 and lane / 4 + 8 and columns 8 j + 2 q + {0, 1} (q = lane % 4) of every 8-column group
// j. The orders below put a lane's columns side by side, so that it stores or adds them 16 bytes
// at a time without shuffles:
// - fragments (the sm90 backward): column 8 j + 2 q + e of each 32-column block sits at
//   8 q + 2 j + e (the map swaps j and q: its own inverse); a lane's 8 columns of a block are 32
//   contiguous bytes, and its shared-memory tile stores are conflict-free (sm90/float_tile.h);
// - row tiles (the sm80 backward from sm_90 on): rows in groups of 8, [row / 8][head][col / 16]
//   [row % 8][16 columns], with column 8 j + 2 q + e of a 16-column block at 4 q + 2 j + e (its
//   quad position). A lane's 4 columns of a block are one 16-byte vector reduction, and a warp's
//   reduction for 8 rows x 16 columns writes 512 contiguous bytes, four whole 128-byte lines.
enum class DqLayout : int { plain = 0, fragments = 1, row_tiles = 2 };

constexpr int dq_fragment_position(int col) {
  return (col & ~31) | ((col % 8) / 2) * 8 | ((col % 32) / 8) * 2 | (col % 2);
}
constexpr int dq_quad_position(int col) { return (col & ~15) | ((col % 8) / 2) * 4 | ((col % 16) / 8) * 2 | (col % 2); }

// Rows of one dq_accum copy for rows_q packed rows: row tiles pad them to whole groups of 8.
constexpr int64_t dq_accum_rows(DqLayout layout, int64_t rows_q) {
  return layout == DqLayout::row_tiles ? (rows_q + 7) / 8 * 8 : rows_q;
}
// Floats of one dq_accum copy.
constexpr int64_t dq_accum_copy_floats(DqLayout layout, int64_t rows_q, int64_t heads, int d) {
  return dq_accum_rows(layout, rows_q) * heads * d;
}
// Where column col of packed row `row`, head h sits in a copy.
constexpr int64_t dq_accum_index(DqLayout layout, int64_t row, int h, int col, int heads, int d) {
  if (layout == DqLayout::row_tiles)
    return ((row / 8) * heads + h) * 8 * d + (col / 16) * 128 + (row % 8) * 16 + dq_quad_position(col % 16);
  return (row * heads + h) * d + (layout == DqLayout::fragments ? dq_fragment_position(col) : col);
}

// Deterministic mode orders the adds to each dQ tile by key block, descending, through one int per
// (query tile, consumer) in global memory (the sm80 backward uses consumer 0's): query tile m (of
// block_m rows) of sequence b and head h is (h * stride + packed_q(b) / block_m + b + m) with
// stride = rows_q / 64 + batch + 1 (enough for block_m >= 64), which no two tiles share. Each
// holds 1 + the key block that added to the tile last.
constexpr int64_t backward_dq_turn_stride(int64_t rows_q, int64_t batch) { return rows_q / 64 + batch + 1; }
constexpr int64_t backward_dq_turns(int64_t rows_q, int64_t batch, int64_t heads_q) {
  return 2 * heads_q * backward_dq_turn_stride(rows_q, batch);
}
// The turn of consumer `consumer`'s part of that tile (packed_q: sequence b's first packed row).
constexpr int64_t backward_dq_turn(int64_t rows_q, int64_t batch, int64_t packed_q, int block_m, int b, int h, int m,
                                   int consumer) {
  return 2 * (h * backward_dq_turn_stride(rows_q, batch) + packed_q / block_m + b + m) + consumer;
}

}  // namespace flashattn::cuda

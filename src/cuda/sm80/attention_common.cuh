// Pieces the sm80 forward and backward kernels share: where a sequence lives, the score rule
// (scale, softcap, ALiBi, window) in the log2 domain, and tile loads through cp.async.
#pragma once

#include <cstdint>

#include "core/semantics.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/ldmatrix.cuh"
#include "cuda/common/numeric.cuh"
#include "cuda/kernel_params.h"

namespace flashattn::cuda {

// Sequence b of the batch: its first rows in q/out and k/v, lengths, and its first packed row.
struct Sequence {
  int64_t q_start = 0, k_start = 0;  // row offsets inside the operands (varlen), else 0
  int64_t packed_q = 0;              // packed query row of i = 0 (workspace, lse of varlen)
  int seqlen_q = 0, seqlen_k = 0;

  __device__ static Sequence of(const KernelParams& p, int b) {
    Sequence s;
    if (p.cu_seqlens_q) {
      s.q_start = p.cu_seqlens_q[b];
      s.k_start = p.cu_seqlens_k[b];
      s.seqlen_q = int(p.cu_seqlens_q[b + 1] - s.q_start);
      s.seqlen_k = int(p.cu_seqlens_k[b + 1] - s.k_start);
      s.packed_q = s.q_start;
    } else {
      s.seqlen_q = p.seqlen_q;
      s.seqlen_k = p.seqlen_k;
      s.packed_q = int64_t(b) * p.seqlen_q;
    }
    return s;
  }
};

// Element (b, row, h, 0) of an operand, as a typed pointer.
template <typename T>
__device__ __forceinline__ T* operand_row(const Operand& o, int b, int64_t row, int h) {
  return static_cast<T*>(o.data) + (int64_t(b) * o.batch + row * o.row + int64_t(h) * o.head);
}

// The score of one (batch, query head) in the log2 domain. Plain scores (no softcap, no ALiBi)
// stay raw q.k and `exp_scale` = scale * log2(e) is folded into the exponent's FMA; otherwise
// transform() maps q.k to log2(e) * (softcap(scale * q.k) + alibi) and exp_scale is 1.
struct ScoreRule {
  semantics::Window window;
  float scale = 1.f, softcap = 0.f, alibi_slope = 0.f;
  float exp_scale = 1.f;
  bool general = false;

  __device__ static ScoreRule make(const KernelParams& p, const Sequence& s, int b, int h) {
    ScoreRule r;
    r.window = semantics::Window{p.window_left, p.window_right, s.seqlen_q, s.seqlen_k};
    r.scale = p.scale;
    r.softcap = p.softcap;
    r.alibi_slope = p.alibi_slopes ? p.alibi_slopes[int64_t(b) * p.alibi_batch + h] : 0.f;
    // A non-positive scale would turn the max of raw products into the min of scores.
    r.general = p.softcap > 0.f || p.alibi_slopes != nullptr || !(p.scale > 0.f);
    r.exp_scale = r.general ? 1.f : p.scale * kLog2e;
    return r;
  }

  // log2(e) * transformed score, from the raw product x (general scores only).
  __device__ __forceinline__ float transform(float x, int64_t i, int64_t j) const {
    const float s = semantics::softcap<float>(scale * x, softcap);
    return kLog2e * (s + semantics::alibi_bias<float>(alibi_slope, window, i, j));
  }

  // True when every (i, j) of the block [i0, i0 + rows) x [j0, j0 + cols) is visible, so the
  // block needs no per-element mask. Rows past the sequence end are never stored, so they may
  // count as visible; key columns past the end may not.
  __device__ __forceinline__ bool block_unmasked(int64_t i0, int rows, int64_t j0, int cols) const {
    return j0 + cols <= window.seqlen_k && window.first_key(i0 + rows - 1) <= j0 &&
           (window.right < 0 || window.diagonal(i0) + window.right >= j0 + cols - 1);
  }
};

// Copies rows [row0, row0 + Tile::kRows) of a head into a shared tile with cp.async; rows at or
// past `rows_valid` and columns at or past `cols_valid` become zeros.
template <typename T, typename Tile, int kThreads>
__device__ __forceinline__ void load_tile_async(uint32_t smem_tile, const T* first_row, int64_t row_stride,
                                                int rows_valid, int cols_valid, const void* any_valid) {
  constexpr int kChunks = Tile::kRows * Tile::kChunksPerRow;
  // Not unrolled: unrolled, the compiler keeps every chunk's address live across the caller's
  // loop, which costs dozens of registers the mma accumulators need.
#pragma unroll 1
  for (int it = 0; it < (kChunks + kThreads - 1) / kThreads; ++it) {
    const int c = int(threadIdx.x) + it * kThreads;
    if (kChunks % kThreads != 0 && c >= kChunks) break;
    const int row = c / Tile::kChunksPerRow, col = (c % Tile::kChunksPerRow) * 8;
    const bool valid = row < rows_valid && col < cols_valid;
    const void* src = valid ? static_cast<const void*>(first_row + row * row_stride + col) : any_valid;
    cp_async_16(smem_tile + Tile::offset(row, col), src, valid);
  }
}

}  // namespace flashattn::cuda

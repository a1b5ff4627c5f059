// Pieces the sm80 forward and backward kernels share: where a sequence lives, the score rule
// (scale, softcap, ALiBi, window) in the log2 domain, and tile loads through cp.async.
#pragma once

#include <cstdint>

#include "core/semantics.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/ldmatrix.cuh"
#include "cuda/common/numeric.cuh"
#include "cuda/common/warp.cuh"
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

// Row `half` (0: the lane's row g, 1: g + 8) of an m16 accumulator fragment times `scale`, in T, to
// `row` in 16-byte stores. Lane q of a quad holds columns 2q and 2q + 1 of each 8-column chunk; a
// quad transpose of four chunks hands it all of chunk q. Every lane takes part in the exchanges:
// an invalid row (`valid` false) or a chunk from column `cols` on only skips its store.
template <typename T, int kChunks>
__device__ __forceinline__ void store_fragment_row(const float (&acc)[kChunks][4], int half, float scale,
                                                   typename T::storage* row, bool valid, int cols) {
  static_assert(kChunks % 4 == 0, "whole groups of four chunks");
  const int q = threadIdx.x % 4;
  row += 8 * q;
#pragma unroll
  for (int c0 = 0; c0 < kChunks; c0 += 4) {
    uint32_t w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = pack2<T>(acc[c0 + j][2 * half] * scale, acc[c0 + j][2 * half + 1] * scale);
    quad_transpose(w);
    if (valid && (c0 + q) * 8 < cols)
      *reinterpret_cast<uint4*>(row + c0 * 8) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The score of one (batch, query head) in the log2 domain. Plain scores (no softcap, no ALiBi)
// stay raw q.k and `exp_scale` = scale * log2(e) is folded into the exponent's FMA; otherwise
// transform() maps q.k to log2(e) * (softcap(scale * q.k) + alibi) and exp_scale is 1.
struct ScoreRule {
  semantics::Window window;
  float scale = 1.f, softcap = 0.f, alibi_slope = 0.f;
  float exp_scale = 1.f;
  bool general = false;

  // True when scores need transform(): softcap, ALiBi, or a non-positive scale (which would turn
  // the max of raw products into the min of scores).
  __host__ __device__ static constexpr bool is_general(float scale, float softcap, bool alibi) {
    return softcap > 0.f || alibi || !(scale > 0.f);
  }
  __host__ __device__ static bool is_general(const KernelParams& p) {
    return is_general(p.scale, p.softcap, p.alibi_slopes != nullptr);
  }

  __device__ static ScoreRule make(const KernelParams& p, const Sequence& s, int b, int h) {
    ScoreRule r;
    r.window = semantics::Window{p.window_left, p.window_right, s.seqlen_q, s.seqlen_k, p.fold_rows};
    r.scale = p.scale;
    r.softcap = p.softcap;
    r.alibi_slope = p.alibi_slopes ? p.alibi_slopes[int64_t(b) * p.alibi_batch + h] : 0.f;
    r.general = is_general(p);
    r.exp_scale = r.general ? 1.f : p.scale * kLog2e;
    return r;
  }

  // log2(e) * transformed score of row i and key j, from the raw product x (general scores
  // only; rows are query rows, as in the backward, which never folds them).
  __device__ __forceinline__ float transform(float x, int64_t i, int64_t j) const {
    return transform_at<int64_t>(x, window.unfolded_diagonal(i), j);
  }
  // The same for a row on diagonal c.
  template <typename Index = int64_t>
  __device__ __forceinline__ float transform_at(float x, Index c, Index j) const {
    const float s = semantics::softcap<float>(scale * x, softcap);
    return kLog2e * (s + semantics::alibi_bias_at<float, Index>(alibi_slope, c, j));
  }

  // The bias and the transform in 32-bit indices (lengths are ints): kernels that keep their rows
  // and keys in ints spare the registers of 64-bit ones.
  __device__ __forceinline__ int diagonal32(int i) const { return i + (window.seqlen_k - window.seqlen_q); }
  __device__ __forceinline__ float alibi_bias32(int i, int j) const {
    return semantics::alibi_bias_at<float, int>(alibi_slope, diagonal32(i), j);
  }
  __device__ __forceinline__ float transform32(float x, int i, int j) const { return transform_at<int>(x, diagonal32(i), j); }

  // True when every (i, j) of the block [i0, i0 + rows) x [j0, j0 + cols) is visible, so the
  // block needs no per-element mask. Rows past the sequence end are never stored, so they may
  // count as visible; key columns past the end may not.
  __device__ __forceinline__ bool block_unmasked(int64_t i0, int rows, int64_t j0, int cols) const {
    return block_unmasked(window.diagonals(i0, rows), j0, cols);
  }
  // The same for rows whose diagonals lie in `d`.
  __device__ __forceinline__ bool block_unmasked(const semantics::Window::Diagonals& d, int64_t j0, int cols) const {
    return j0 + cols <= window.seqlen_k && window.first_key_at(d.high) <= j0 &&
           (window.right < 0 || d.low + window.right >= j0 + cols - 1);
  }
};

// Key blocks [begin, end) of block_n keys that query rows [m0, m0 + block_m) see, cut to share
// `split` of `splits` equal shares of the key blocks. Empty when begin >= end.
struct KeyBlocks {
  int begin = 0, end = 0;

  __device__ static KeyBlocks of(const ScoreRule& rule, const Sequence& seq, int m0, int block_m, int block_n,
                                 int splits, int split) {
    const semantics::Window::Diagonals d = rule.window.diagonals(m0, max(1, min(block_m, seq.seqlen_q - m0)));
    KeyBlocks r;
    r.begin = int(rule.window.first_key_at(d.low) / block_n);
    r.end = int((rule.window.last_key_at(d.high) + block_n) / block_n);  // last_key may be -1
    if (splits > 1) {
      const int per_split = ((seq.seqlen_k + block_n - 1) / block_n + splits - 1) / splits;
      r.begin = max(r.begin, split * per_split);
      r.end = min(r.end, (split + 1) * per_split);
    }
    return r;
  }
};

constexpr int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

// How kThreads threads share the 16-byte chunks of a tile: each row is split among
// kThreadsPerRow neighbouring threads (so a row's reads coalesce; at most kMaxThreadsPerRow), and
// a thread copies kColumnChunks chunks at fixed columns of rows kRowStep apart. Its source address
// then only moves by constant steps, which keeps the copy to a few registers and no branches; a
// thread's chunks of one row share an address and differ by constant offsets.
template <typename Tile, int kThreads, int kMaxThreadsPerRow = 32>
struct TileCopyPlan {
  static constexpr int kThreadsPerRow = gcd(gcd(Tile::kChunksPerRow, kThreads), kMaxThreadsPerRow);
  static constexpr int kColumnChunks = Tile::kChunksPerRow / kThreadsPerRow;
  static constexpr int kRowStep = kThreads / kThreadsPerRow;
  static constexpr int kPasses = Tile::kRows / kRowStep;
  static_assert(Tile::kRows % kRowStep == 0, "the threads must cover the tile's rows in whole passes");
};

// How a kernel copies its tiles: whole tiles of up to kUnboundedCols columns skip the per-chunk
// bounds, their rows split among at most kUnboundedThreadsPerRow threads; the other tiles take the
// bounded copy (a predicate per chunk; no source select since v24), rows split among up to a warp.
// Measured on the H200: bounds-free copies help the forward at d = 64 (+1 to +3%) and cost it 2 to
// 13% at d = 128 and 256 (with 8 or 32 threads per row: its d = 128 kernel reloads more spilled
// registers). The backward's style against the forward's: +3% at d = 128 at every N, causal or
// not, d = 256 even; its bounded copy with 8 threads per row as well (though whole tiles never
// take it) undid the gain, as did 32 threads per row in the bounds-free one.
template <int kUnboundedThreadsPerRowArg, int kUnboundedColsArg>
struct TileCopyStyle {
  static constexpr int kUnboundedThreadsPerRow = kUnboundedThreadsPerRowArg, kUnboundedCols = kUnboundedColsArg;
};
using ForwardTileCopy = TileCopyStyle<32, 64>;
using BackwardTileCopy = TileCopyStyle<8, 256>;

// This thread's chunks of a tile under `Plan`, passes [first_pass, first_pass + passes): with
// kBounded, rows at or past `rows_valid` and columns at or past `cols_valid` become zeros (source
// size 0, the address as computed: nothing is read); without, every chunk is copied.
template <bool kBounded, typename T, typename Tile, typename Plan>
__device__ __forceinline__ void copy_tile(uint32_t smem_tile, const T* first_row, int64_t row_stride, int rows_valid,
                                          int cols_valid, int first_pass, int passes) {
  const int row0 = int(threadIdx.x) / Plan::kThreadsPerRow + first_pass * Plan::kRowStep;
  const int col0 = (int(threadIdx.x) % Plan::kThreadsPerRow) * 8;
  const uint32_t dst = smem_tile + Tile::offset(row0, col0);
  const T* src = first_row + row0 * row_stride + col0;
#pragma unroll
  for (int pass = 0; pass < passes; ++pass) {
#pragma unroll
    for (int c = 0; c < Plan::kColumnChunks; ++c) {
      const int dcol = c * Plan::kThreadsPerRow * 8;
      if constexpr (kBounded) {
        const bool valid = row0 + pass * Plan::kRowStep < rows_valid && col0 + dcol < cols_valid;
        cp_async_16(dst + Tile::offset(pass * Plan::kRowStep, dcol), src + dcol, valid);
      } else {
        cp_async_16(dst + Tile::offset(pass * Plan::kRowStep, dcol), src + dcol);
      }
    }
    src += Plan::kRowStep * row_stride;
  }
}

// Copies rows [0, Tile::kRows) starting at `first_row` into a shared tile with cp.async; rows at
// or past `rows_valid` and columns at or past `cols_valid` become zeros. Part `part` of kParts copies
// that share of the plan's passes (so that a kernel can spread a tile's copies over its work).
template <typename T, typename Tile, int kThreads, typename Style, int kParts = 1>
__device__ __forceinline__ void load_tile_async(uint32_t smem_tile, const T* first_row, int64_t row_stride,
                                                int rows_valid, int cols_valid, int part = 0) {
  if constexpr (Tile::kCols <= Style::kUnboundedCols) {
    if (rows_valid >= Tile::kRows && cols_valid >= Tile::kCols) {
      using Plan = TileCopyPlan<Tile, kThreads, Style::kUnboundedThreadsPerRow>;
      static_assert(Plan::kPasses % kParts == 0, "whole passes per part");
      copy_tile<false, T, Tile, Plan>(smem_tile, first_row, row_stride, rows_valid, cols_valid,
                                      part * (Plan::kPasses / kParts), Plan::kPasses / kParts);
      return;
    }
  }
  using Plan = TileCopyPlan<Tile, kThreads>;
  static_assert(Plan::kPasses % kParts == 0, "whole passes per part");
  copy_tile<true, T, Tile, Plan>(smem_tile, first_row, row_stride, rows_valid, cols_valid,
                                 part * (Plan::kPasses / kParts), Plan::kPasses / kParts);
}

}  // namespace flashattn::cuda

// What the CUDA kernels read: a trivially copyable digest of a validated Params, passed by value.
#pragma once

#include <cstdint>

#include "core/params.h"

namespace flashattn::cuda {

struct KernelParams {
  Operand q, k, v, out;
  Operand dout, dq, dk, dv;  // backward
  float* lse = nullptr;      // Params::lse layout; may be null in a forward call
  int64_t lse_batch = 0, lse_head = 0;
  const int32_t* cu_seqlens_q = nullptr;  // device memory; null for a dense batch
  const int32_t* cu_seqlens_k = nullptr;

  int batch = 0, heads_q = 0, heads_kv = 0, group = 1;
  int seqlen_q = 0, seqlen_k = 0;  // varlen: the upper bounds
  int head_dim = 0;                // real head dim (<= the compiled one; the rest is zero padding)
  int64_t rows_q = 0;              // packed query rows: batch * seqlen_q, or total_q when varlen
  int64_t rows_k = 0;              // packed key rows: batch * seqlen_k, or total_k when varlen

  float scale = 1.f, softcap = 0.f;
  int window_left = -1, window_right = -1;
  int fold_rows = 0;  // Params::fold_rows
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch = 0;
  uint32_t dropout_threshold = 0;  // semantics::Dropout
  float dropout_inv_keep = 1.f;
  uint64_t dropout_seed = 0, dropout_offset = 0;

  // Forward split over keys: partial results of each split, combined by a second kernel.
  int num_splits = 1;
  float* partial_out = nullptr;  // [split][heads_q][rows_q][padded head dim]
  float* partial_lse = nullptr;  // [split][heads_q][rows_q]
  // The persistent sm90 forward: tiles handed out so far past the grid's first ones (zeroed
  // before each launch).
  int* tile_counter = nullptr;
  // The launch order under causal-like masks: heads whose query tiles (forward) or key blocks
  // (default backward) interleave (head_groups.h).
  int head_group = 1;

  // Backward workspace.
  float* delta = nullptr;     // [heads_q][rows_q]: rowsum(dO * O)
  float* lse_log2 = nullptr;  // [heads_q][rows_q]: lse * log2(e), +inf where lse = -inf (P = 0)
  float* dq_accum = nullptr;  // [copies] of rows_q x heads_q x padded head dim fp32, in dq_layout
  int dq_copies = 1;          // deterministic sm90 backward: one per chain
  int* dq_turns = nullptr;    // deterministic mode: 1 + the key block that added last, per dQ tile
  int deterministic = 0;      // fixed order of every dq_accum sum
  int dq_layout = 0;          // column order of dq_accum: a DqLayout (dq_accum_layout.h)
};

}  // namespace flashattn::cuda

// The one struct every backend reads. Built and fully validated by validate.cpp; backends never
// see the public descriptors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/flashattn.h"

namespace flashattn {

enum class DType : int { f32 = FLASHATTN_DTYPE_FLOAT32, f16 = FLASHATTN_DTYPE_FLOAT16, bf16 = FLASHATTN_DTYPE_BFLOAT16 };
enum class Pass : int { forward = FLASHATTN_PASS_FORWARD, backward = FLASHATTN_PASS_BACKWARD };
enum class Backend : int { automatic = FLASHATTN_BACKEND_AUTO, cpu = FLASHATTN_BACKEND_CPU, cuda = FLASHATTN_BACKEND_CUDA };

// A [batch, seq, head, dim] operand: element (b, s, h, x) of sequence b lives at
// data + b * batch + (row_start(b) + s) * row + h * head + x. Varlen operands have batch = 0.
struct Operand {
  void* data = nullptr;
  int64_t batch = 0, row = 0, head = 0;
};

struct Params {
  Pass pass = Pass::forward;
  DType dtype = DType::f32;  // of q, k, v, out and their gradients
  int batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  int seqlen_q = 0, seqlen_k = 0;  // varlen: the upper bounds max_seqlen_q / max_seqlen_k
  int64_t total_q = 0, total_k = 0;  // varlen: rows of q and of k/v

  bool variable_length = false;           // then cu_seqlens_* give the sequences
  const int32_t* cu_seqlens_q = nullptr;  // may be null in shape-only queries
  const int32_t* cu_seqlens_k = nullptr;

  Operand q, k, v, out;
  Operand dout, dq, dk, dv;  // backward only
  float* lse = nullptr;      // dense [batch, heads_q, seqlen_q], varlen [heads_q, total_q]
  int64_t lse_batch = 0, lse_head = 0;  // row stride is 1

  float scale = 0;
  float softcap = 0;
  int window_left = -1, window_right = -1;  // causal is folded in as right = 0
  int fold_rows = 0;  // > 0: grouped heads folded into rows, fold_rows a head (core/query_groups.h)
  bool alibi = false;
  const float* alibi_slopes = nullptr;    // may be null in shape-only queries
  int64_t alibi_batch = 0;  // 0 when the slopes are per head only
  float dropout_p = 0;
  uint64_t dropout_seed = 0, dropout_offset = 0;

  bool deterministic = false;
  int num_threads = 0;
  flashattn_device device = FLASHATTN_DEVICE_CPU;
  int device_index = 0;
  void* stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_size = 0;

  bool varlen() const { return variable_length; }
  int group_size() const { return heads_q / heads_kv; }
  bool has_dropout() const { return dropout_p > 0; }
  int64_t q_start(int b) const { return varlen() ? cu_seqlens_q[b] : 0; }
  int64_t k_start(int b) const { return varlen() ? cu_seqlens_k[b] : 0; }
  int seqlen_q_of(int b) const { return varlen() ? cu_seqlens_q[b + 1] - cu_seqlens_q[b] : seqlen_q; }
  int seqlen_k_of(int b) const { return varlen() ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqlen_k; }
  float alibi_slope(int b, int h) const { return alibi ? alibi_slopes[b * alibi_batch + h] : 0.f; }
};

// Offset in elements of (b, s, h, 0) of an operand whose sequence b starts at row `start`.
inline int64_t element_offset(const Operand& t, int b, int64_t start, int64_t s, int h) {
  return b * t.batch + (start + s) * t.row + h * t.head;
}

}  // namespace flashattn

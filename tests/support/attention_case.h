// One attention problem of a test: its description (Case), its host tensors with inputs drawn and
// outputs poisoned (CaseData), and the validated Params the oracle and the naive reference read.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/params.h"
#include "flashattn/flashattn.h"
#include "reference/oracle.h"
#include "support/tensors.h"

namespace flashattn::test {

enum class Alibi { none, per_head, per_batch_head };

struct Case {
  flashattn_dtype dtype = FLASHATTN_DTYPE_FLOAT32;
  Layout layout = Layout::bshd;
  int batch = 1, heads_q = 1, heads_kv = 1;
  int seqlen_q = 1, seqlen_k = 1;  // dense batches
  int head_dim = 32, head_dim_v = 0;  // 0: same as head_dim
  std::vector<int> seqlens_q, seqlens_k;  // non-empty: a variable-length batch of these sequences
  int row_pad = 0;  // gap elements after every row of every tensor

  float softmax_scale = 0;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0;
  Alibi alibi = Alibi::none;
  float dropout_p = 0;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  int num_threads = 0;
  flashattn_backend backend = FLASHATTN_BACKEND_CPU;

  uint64_t data_seed = 1;
  float input_stddev = 1.f;

  bool varlen() const { return !seqlens_q.empty(); }
  int value_dim() const { return head_dim_v ? head_dim_v : head_dim; }
  int batch_size() const { return varlen() ? int(seqlens_q.size()) : batch; }
  int max_seqlen_q() const;
  int max_seqlen_k() const;
  int64_t rows_q() const;  // total query rows over the batch
  int64_t rows_k() const;
  std::string describe() const;
};
// How test frameworks print a case (GoogleTest finds it by argument-dependent lookup).
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.describe(); }

// Host tensors of a case: q, k, v, dout drawn from N(0, stddev^2); out, lse and the gradients
// poisoned. Not movable: `options` points at the ALiBi and cu_seqlens descriptors it owns.
class CaseData {
 public:
  explicit CaseData(const Case& c);
  CaseData(const CaseData&) = delete;
  CaseData& operator=(const CaseData&) = delete;

  Case spec;
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  HostTensor alibi_slopes, cu_seqlens_q, cu_seqlens_k;
  flashattn_options options;

  void poison_forward_outputs();   // out, lse
  void poison_gradients();         // dq, dk, dv
  flashattn_status forward();      // out, lse from q, k, v
  flashattn_status backward();     // dq, dk, dv from dout and the forward's out, lse
  // Validated Params over these host tensors, as the API would build them.
  Params params(Pass pass) const;
};

}  // namespace flashattn::test

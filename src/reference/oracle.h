// Float64 attention straight from the definition in core/semantics.h: the ground truth for
// tests and `flashattn check`. Holds a seqlen_q x seqlen_k matrix per head; never on a hot path.
#pragma once

#include <cstdint>
#include <vector>

#include "core/params.h"

namespace flashattn::reference {

// Results in packed layouts: a query row r (= b * seqlen_q + i, or cu_seqlens_q[b] + i when
// varlen) holds out[(r * heads_q + h) * d_v + x]; lse[r * heads_q + h]; key rows likewise.
struct Result {
  int64_t rows_q = 0, rows_k = 0;
  std::vector<double> out, lse;  // forward
  std::vector<double> dq, dk, dv;  // backward
};

int64_t packed_row_q(const Params& p, int b, int64_t i);
int64_t packed_row_k(const Params& p, int b, int64_t j);

// One query row of one head: writes out_row[0..d_v) and returns the lse (-inf: no visible key).
double forward_row(const Params& p, int b, int h, int64_t i, double* out_row);

// Every row; reads p.q, p.k, p.v.
Result forward(const Params& p);
// Forward and the gradients of sum(out * dout); reads p.dout as well.
Result backward(const Params& p);

}  // namespace flashattn::reference

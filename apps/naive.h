// Standard attention, the FlashAttention paper's baseline, in float32: for each head it
// materialises the full seqlen_q x seqlen_k score matrix S = QK^T, turns it into P = softmax(S)
// in place and multiplies O = PV; the backward pass holds P and dS, two such matrices. Same
// semantics as the library (core/semantics.h); the rows of each step are spread over OpenMP
// threads and the inner loops are compiled for the CPU's vector units, as the library's are.
#pragma once

#include <cstddef>

#include "core/params.h"

namespace flashattn::cli {

struct NaiveFootprint {
  size_t matrix_bytes = 0;  // the seqlen_q x seqlen_k matrices
  size_t total_bytes = 0;   // everything allocated, float32 copies of the head's rows included
};

// threads = 0: all cores.
NaiveFootprint naive_forward_footprint(const Params& p, int threads);
NaiveFootprint naive_backward_footprint(const Params& p, int threads);

// Reads p.q, p.k, p.v and writes p.out (host memory, any dtype).
void naive_forward(const Params& p, int threads);
// Reads p.q, p.k, p.v, p.dout and writes p.dq, p.dk, p.dv.
void naive_backward(const Params& p, int threads);

}  // namespace flashattn::cli

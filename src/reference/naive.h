// Naive attention in the storage dtype: what an unfused framework implementation computes when it
// materialises every intermediate tensor. Arithmetic is float32 (matrix products accumulate in
// float32, as tensor-core and BLAS GEMMs do), and every tensor such an implementation stores is
// rounded to the dtype of q (float16 or bfloat16; float32 inputs are not rounded):
//   forward:  S = round(transformed, masked scores), P = round(softmax(S)), P~ = round(P * dropout),
//             O = round(P~ V); lse stays float32.
//   backward: dP~ = round(dO V^T), dP = round(z * dP~), D = rowsum(dO * O),
//             dS = round(P (dP - D) softcap'), dV = round(P~^T dO), dK = round(scale dS^T Q),
//             dQ = round(scale dS K) (dK, dV summed over the query heads of a group before rounding).
// D = rowsum(P dP) in exact arithmetic; like every backward that receives the output instead of
// the probabilities, this one takes it from the stored (rounded) O. That rounding dominates the
// error of dS wherever dP - D cancels (few visible keys, tiny head dims), for fused kernels too.
// Its error against the float64 oracle is the yardstick of the correctness criterion: a fused
// kernel passes when its own error is at most twice this one (plus a small absolute floor).
#pragma once

#include "core/params.h"
#include "reference/oracle.h"

namespace flashattn::reference {

// out and lse of every row, in the packed layout of Result; reads p.q, p.k, p.v.
Result naive_forward(const Params& p);
// The forward and dq, dk, dv of sum(out * dout); reads p.dout as well.
Result naive_backward(const Params& p);

}  // namespace flashattn::reference

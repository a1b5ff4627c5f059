// FlashAttention's correctness criterion, one definition for tests and `flashattn check`: a result
// passes when max |result - oracle| <= 2 * max |naive - oracle| + error_floor(dtype), where naive is
// the same-dtype unfused attention of reference/naive.h.
#pragma once

#include "core/params.h"

namespace flashattn::reference {

// The floor lets cases whose exact answer is 0 pass: there a float32 kernel that takes D from the
// stored O (as every backward must) lands within a few 1e-6, while the naive one may be exact.
inline double error_floor(DType dtype) { return dtype == DType::f32 ? 1e-5 : 1e-4; }

inline double error_bound(double naive_error, DType dtype) { return 2 * naive_error + error_floor(dtype); }

}  // namespace flashattn::reference

// Dense float32 building blocks of the CPU backend: tile products, a vectorisable exp, row
// conversion from the storage dtypes. Row-major, leading dimensions in elements.
#pragma once

#include <cstdint>

#include "core/params.h"

namespace flashattn::cpu {

// C[m x n] += A[m x k] * B[k x n]
void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc);
// C[m x n] += A[k x m]^T * B[k x n]
void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc);
// sum of a[i] * b[i]
float dot(const float* a, const float* b, int n);
// x[i] = exp(x[i]) for n elements; inputs below -87 give exactly 0 (so -inf does).
void exp_inplace(float* x, int n);

// The instruction set the kernels above run with: "avx512", "avx2" or "baseline".
const char* cpu_isa();

// Conversion of one contiguous row between a storage dtype and float32.
struct RowCodec {
  void (*load)(const void* src, float* dst, int n);
  void (*store)(const float* src, void* dst, int n);
  int element_size;
};
const RowCodec& row_codec(DType t);

}  // namespace flashattn::cpu

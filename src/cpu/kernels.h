// Dense float32 building blocks of the CPU backend: tile products, a vectorisable exp, row
// conversion from the storage dtypes. Row-major, leading dimensions in elements.
#pragma once

#include <cstdint>

#include "core/params.h"

// Code compiled once per x86-64 instruction set: the kernels below through explicit entry points
// (FA_X86_DISPATCH), element-wise tile passes elsewhere through GCC's target clones, picked for
// the running CPU at load time, so their loops vectorise to the CPU's width (FA_MULTIVERSION).
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define FA_X86_DISPATCH 1
#endif
#if defined(FA_X86_DISPATCH) && !defined(__clang__)
#define FA_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FA_MULTIVERSION
#endif

namespace flashattn::cpu {

// C[m x n] += A[m x k] * B[k x n]
void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc);
// C[m x n] = A[m x k] * B[k x n] (C's previous values are not read)
void gemm_nn_set(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc);
// C[m x n] += A[k x m]^T * B[k x n]
void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc);
// sum of a[i] * b[i]
float dot(const float* a, const float* b, int n);
// x[i] = exp(x[i]) for n elements; inputs below -87 give exactly 0 (so -inf does).
void exp_inplace(float* x, int n);

// One online-softmax step over a key-major tile s[key][ld] of nq query columns (nq rounded up to
// a multiple of 16 lanes is processed: s, m, l and corr must hold that many initialised floats).
// Per query r: m_new = max(m, max_c s), corr = exp(m - m_new), s = exp(s - m_new),
// l = l * corr + sum_c s, m = m_new. A query with no visible key so far (m_new = -inf) gets
// s = 0 and corr = 0 rather than NaN.
void online_softmax_step(float* s, int ld, int nq, int nk, float* m, float* l, float* corr);

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

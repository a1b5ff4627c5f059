#include "cpu/kernels.h"

#include <cstring>

#include "core/dtype.h"

// Compile the hot loops for a baseline and for x86-64-v3 (AVX2+FMA) / v4 (AVX-512), chosen at
// load time by the CPU, so one binary is both portable and fast.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define FA_MULTIVERSION __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define FA_MULTIVERSION
#endif
// Helpers are forced inline so each clone compiles them for its own target.
#define FA_INLINE [[gnu::always_inline]] inline

namespace flashattn::cpu {
namespace {

// Eight floats as one value (GCC/Clang vector extension): each multiversioned clone below maps
// it to that target's registers (one ymm on AVX2, two xmm on the baseline).
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t v8i __attribute__((vector_size(32), aligned(4)));

FA_INLINE v8 load8(const float* p) { return *reinterpret_cast<const v8*>(p); }
FA_INLINE void store8(float* p, v8 x) { *reinterpret_cast<v8*>(p) = x; }

// A tile of R rows x 16 columns of C accumulated in registers while p runs over k.
// a(r, p) reads A (plain: A[i + r][p]; transposed: A[p][i + r]).
template <int R, bool TransA>
FA_INLINE void micro_16(int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  v8 acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = load8(c + r * ldc);
    acc[r][1] = load8(c + r * ldc + 8);
  }
  for (int p = 0; p < k; ++p) {
    const v8 b0 = load8(b + int64_t(p) * ldb), b1 = load8(b + int64_t(p) * ldb + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const float ar = TransA ? a[int64_t(p) * lda + r] : a[int64_t(r) * lda + p];
      acc[r][0] += ar * b0;
      acc[r][1] += ar * b1;
    }
  }
  for (int r = 0; r < R; ++r) {
    store8(c + r * ldc, acc[r][0]);
    store8(c + r * ldc + 8, acc[r][1]);
  }
}

// Columns past the last multiple of 16, one at a time.
template <bool TransA>
inline void tail_columns(int m, int n0, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,
                         int ldc) {
  for (int i = 0; i < m; ++i)
    for (int j = n0; j < n; ++j) {
      float sum = c[int64_t(i) * ldc + j];
      for (int p = 0; p < k; ++p)
        sum += (TransA ? a[int64_t(p) * lda + i] : a[int64_t(i) * lda + p]) * b[int64_t(p) * ldb + j];
      c[int64_t(i) * ldc + j] = sum;
    }
}

template <int R, bool TransA>
FA_INLINE void row_block(int i, int n16, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  const float* arow = TransA ? a + i : a + int64_t(i) * lda;
  for (int j = 0; j < n16; j += 16) micro_16<R, TransA>(k, arow, lda, b + j, ldb, c + int64_t(i) * ldc + j, ldc);
}

// C[m x n] += op(A) B with 6-row register blocks, then the remaining rows.
template <bool TransA>
FA_INLINE void gemm(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  const int n16 = n - n % 16;
  int i = 0;
  for (; i + 6 <= m; i += 6) row_block<6, TransA>(i, n16, k, a, lda, b, ldb, c, ldc);
  switch (m - i) {
    case 5: row_block<5, TransA>(i, n16, k, a, lda, b, ldb, c, ldc); break;
    case 4: row_block<4, TransA>(i, n16, k, a, lda, b, ldb, c, ldc); break;
    case 3: row_block<3, TransA>(i, n16, k, a, lda, b, ldb, c, ldc); break;
    case 2: row_block<2, TransA>(i, n16, k, a, lda, b, ldb, c, ldc); break;
    case 1: row_block<1, TransA>(i, n16, k, a, lda, b, ldb, c, ldc); break;
    default: break;
  }
  if (n16 < n) tail_columns<TransA>(m, n16, n, k, a, lda, b, ldb, c, ldc);
}

}  // namespace

FA_MULTIVERSION
void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  gemm<false>(m, n, k, a, lda, b, ldb, c, ldc);
}

FA_MULTIVERSION
void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  gemm<true>(m, n, k, a, lda, b, ldb, c, ldc);
}

namespace {

// exp(x) = 2^n * e^r with n = round(x log2 e), r = x - n ln 2 (two-part ln 2), e^r by a degree-6
// polynomial: about 2 ulp. Inputs below -87 give exactly 0, so -inf does.
FA_INLINE v8 exp8(v8 v) {
  const v8 lo = v8{} - 87.0f, hi = v8{} + 88.0f;
  v8 x = v < lo ? lo : v;
  x = x > hi ? hi : x;
  const v8 t = x * 1.44269504088896341f;
  const v8i n = __builtin_convertvector(t + (t >= 0 ? v8{} + 0.5f : v8{} - 0.5f), v8i);
  const v8 fn = __builtin_convertvector(n, v8);
  const v8 r = (x - fn * 0.693359375f) + fn * 2.12194440e-4f;
  v8 p = v8{} + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const v8 e = (p * r * r + r) + 1.0f;
  const v8 scaled = reinterpret_cast<v8>(reinterpret_cast<v8i>(e) + (n << 23));
  return v < lo ? v8{} : scaled;
}

}  // namespace

FA_MULTIVERSION
void exp_inplace(float* x, int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8) store8(x + i, exp8(load8(x + i)));
  if (i < n) {
    float tail[8] = {};
    for (int j = i; j < n; ++j) tail[j - i] = x[j];
    const v8 e = exp8(load8(tail));
    for (int j = i; j < n; ++j) x[j] = e[j - i];
  }
}

namespace {

template <DType T>
void load_row(const void* src, float* dst, int n) {
  const auto* s = static_cast<const typename Storage<T>::type*>(src);
  for (int i = 0; i < n; ++i) dst[i] = Storage<T>::load(s[i]);
}
template <DType T>
void store_row(const float* src, void* dst, int n) {
  auto* d = static_cast<typename Storage<T>::type*>(dst);
  for (int i = 0; i < n; ++i) d[i] = Storage<T>::store(src[i]);
}
template <DType T>
constexpr RowCodec codec_of() {
  return RowCodec{&load_row<T>, &store_row<T>, int(sizeof(typename Storage<T>::type))};
}

}  // namespace

const RowCodec& row_codec(DType t) {
  static constexpr RowCodec f32 = codec_of<DType::f32>(), f16 = codec_of<DType::f16>(), bf16 = codec_of<DType::bf16>();
  return t == DType::f32 ? f32 : (t == DType::f16 ? f16 : bf16);
}

}  // namespace flashattn::cpu

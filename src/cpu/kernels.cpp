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

namespace flashattn::cpu {
namespace {

// 4 rows x 16 columns of C held in registers while k runs.
constexpr int kRows = 4, kCols = 16;

inline void block_nn(int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  float acc[kRows][kCols];
  for (int r = 0; r < kRows; ++r)
    for (int x = 0; x < kCols; ++x) acc[r][x] = c[r * ldc + x];
  for (int p = 0; p < k; ++p) {
    const float* brow = b + int64_t(p) * ldb;
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const float ar = a[r * lda + p];
#pragma GCC unroll 16
      for (int x = 0; x < kCols; ++x) acc[r][x] += ar * brow[x];
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int x = 0; x < kCols; ++x) c[r * ldc + x] = acc[r][x];
}

// Any remainder: one row of C at a time, vectorised along n.
inline void edge_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  for (int r = 0; r < m; ++r)
    for (int p = 0; p < k; ++p) {
      const float ar = a[int64_t(r) * lda + p];
      const float* brow = b + int64_t(p) * ldb;
      float* crow = c + int64_t(r) * ldc;
      for (int x = 0; x < n; ++x) crow[x] += ar * brow[x];
    }
}

}  // namespace

FA_MULTIVERSION
void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  const int m4 = m - m % kRows, n16 = n - n % kCols;
  for (int i = 0; i < m4; i += kRows)
    for (int j = 0; j < n16; j += kCols)
      block_nn(k, a + int64_t(i) * lda, lda, b + j, ldb, c + int64_t(i) * ldc + j, ldc);
  if (n16 < n) edge_nn(m4, n - n16, k, a, lda, b + n16, ldb, c + n16, ldc);
  if (m4 < m) edge_nn(m - m4, n, k, a + int64_t(m4) * lda, lda, b, ldb, c + int64_t(m4) * ldc, ldc);
}

FA_MULTIVERSION
void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  // C[i][:] += sum_p A[p][i] * B[p][:]; rows of C in blocks of 4 so each B row is read once per block.
  int i = 0;
  for (; i + kRows <= m; i += kRows)
    for (int j = 0; j < n; j += kCols) {
      const int w = n - j < kCols ? n - j : kCols;
      float acc[kRows][kCols] = {};
      for (int p = 0; p < k; ++p) {
        const float* brow = b + int64_t(p) * ldb + j;
        const float* arow = a + int64_t(p) * lda + i;
        if (w == kCols) {
#pragma GCC unroll 4
          for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 16
            for (int x = 0; x < kCols; ++x) acc[r][x] += arow[r] * brow[x];
        } else {
          for (int r = 0; r < kRows; ++r)
            for (int x = 0; x < w; ++x) acc[r][x] += arow[r] * brow[x];
        }
      }
      for (int r = 0; r < kRows; ++r)
        for (int x = 0; x < w; ++x) c[int64_t(i + r) * ldc + j + x] += acc[r][x];
    }
  for (; i < m; ++i)
    for (int p = 0; p < k; ++p) {
      const float ai = a[int64_t(p) * lda + i];
      const float* brow = b + int64_t(p) * ldb;
      float* crow = c + int64_t(i) * ldc;
      for (int x = 0; x < n; ++x) crow[x] += ai * brow[x];
    }
}

// exp(x) = 2^n * e^r with n = round(x log2 e), r = x - n ln 2 (two-part ln 2), e^r by a degree-6
// polynomial; about 2 ulp, and branch-free so the loop vectorises.
FA_MULTIVERSION
void exp_inplace(float* x, int n) {
  for (int i = 0; i < n; ++i) {
    const float v = x[i];
    const float c = v < -87.0f ? -87.0f : (v > 88.0f ? 88.0f : v);
    const float t = c * 1.44269504088896341f;
    const float fn = float(int(t + (t >= 0 ? 0.5f : -0.5f)));
    const float r = (c - fn * 0.693359375f) + fn * 2.12194440e-4f;
    float p = 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    const float e = (p * r * r + r) + 1.0f;
    int32_t bits;
    std::memcpy(&bits, &e, 4);
    bits += int32_t(fn) << 23;
    float out;
    std::memcpy(&out, &bits, 4);
    x[i] = v < -87.0f ? 0.0f : out;
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

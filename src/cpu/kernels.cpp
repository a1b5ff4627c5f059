#include "cpu/kernels.h"

#include <cstdlib>
#include <cstring>

#include "core/dtype.h"

// The hot loops are written once over GCC/Clang vector types of W floats and compiled three times:
// baseline (W = 8, as pairs of SSE registers), x86-64-v3 (AVX2 + FMA, W = 8) and x86-64-v4
// (AVX-512, W = 16). The CPU picks one set at first use; FLASHATTN_CPU_ISA=avx2|baseline forces a
// lower one (tests and benchmarks compare them).
#if defined(FA_X86_DISPATCH)
#define FA_TARGET(arch) __attribute__((target("arch=" arch)))
#else
#define FA_TARGET(arch)
#endif
// Helpers are forced inline so each target's entry point compiles them for its own ISA.
#define FA_INLINE [[gnu::always_inline]] inline

namespace flashattn::cpu {
namespace {

template <int W> struct Vec;
template <> struct Vec<8> {
  typedef float f __attribute__((vector_size(32), aligned(4)));
  typedef int32_t i __attribute__((vector_size(32), aligned(4)));
  typedef uint16_t h __attribute__((vector_size(16), aligned(2)));
};
template <> struct Vec<16> {
  typedef float f __attribute__((vector_size(64), aligned(4)));
  typedef int32_t i __attribute__((vector_size(64), aligned(4)));
  typedef uint16_t h __attribute__((vector_size(32), aligned(2)));
};

template <int W>
FA_INLINE typename Vec<W>::f load(const float* p) { return *reinterpret_cast<const typename Vec<W>::f*>(p); }
template <int W>
FA_INLINE void store(float* p, typename Vec<W>::f x) { *reinterpret_cast<typename Vec<W>::f*>(p) = x; }

// A tile of R rows x 2W columns of C accumulated in registers while p runs over k, starting
// from C (Accumulate) or from zero. A is read as A[i + r][p] (plain) or A[p][i + r] (transposed).
template <int W, int R, bool TransA, bool Accumulate>
FA_INLINE void micro(int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  using V = typename Vec<W>::f;
  V acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = Accumulate ? load<W>(c + r * ldc) : V{};
    acc[r][1] = Accumulate ? load<W>(c + r * ldc + W) : V{};
  }
  for (int p = 0; p < k; ++p) {
    const V b0 = load<W>(b + int64_t(p) * ldb), b1 = load<W>(b + int64_t(p) * ldb + W);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const float ar = TransA ? a[int64_t(p) * lda + r] : a[int64_t(r) * lda + p];
      acc[r][0] += ar * b0;
      acc[r][1] += ar * b1;
    }
  }
  for (int r = 0; r < R; ++r) {
    store<W>(c + r * ldc, acc[r][0]);
    store<W>(c + r * ldc + W, acc[r][1]);
  }
}

template <int W, int R, bool TransA, bool Accumulate>
FA_INLINE void row_block(int i, int j0, int j1, int k, const float* a, int lda, const float* b, int ldb, float* c,
                         int ldc) {
  const float* arow = TransA ? a + i : a + int64_t(i) * lda;
  for (int j = j0; j < j1; j += 2 * W)
    micro<W, R, TransA, Accumulate>(k, arow, lda, b + j, ldb, c + int64_t(i) * ldc + j, ldc);
}

// Rows per register block: 2R accumulators plus two B vectors and a broadcast must fit the
// register file (16 ymm on AVX2, 32 zmm on AVX-512).
template <int W>
constexpr int kBlockRows = W == 16 ? 12 : 6;

// The last m % kBlockRows rows, one instantiation per possible remainder.
template <int W, int R, bool TransA, bool Accumulate>
FA_INLINE void remainder_rows(int rows, int i, int j0, int j1, int k, const float* a, int lda, const float* b, int ldb,
                              float* c, int ldc) {
  if constexpr (R > 0) {
    if (rows == R) row_block<W, R, TransA, Accumulate>(i, j0, j1, k, a, lda, b, ldb, c, ldc);
    else remainder_rows<W, R - 1, TransA, Accumulate>(rows, i, j0, j1, k, a, lda, b, ldb, c, ldc);
  }
}

// Columns [j0, j1) (a multiple of 2W wide) of C += op(A) B: full row blocks, then the rest.
template <int W, bool TransA, bool Accumulate>
FA_INLINE void column_band(int m, int j0, int j1, int k, const float* a, int lda, const float* b, int ldb, float* c,
                           int ldc) {
  constexpr int R = kBlockRows<W>;
  int i = 0;
  for (; i + R <= m; i += R) row_block<W, R, TransA, Accumulate>(i, j0, j1, k, a, lda, b, ldb, c, ldc);
  remainder_rows<W, R - 1, TransA, Accumulate>(m - i, i, j0, j1, k, a, lda, b, ldb, c, ldc);
}

// C[m x n] (+)= op(A) B: bands of 2W columns, a 16-column band when W = 16 leaves one, then
// single columns.
template <int W, bool TransA, bool Accumulate = true>
FA_INLINE void gemm(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  int j = n - n % (2 * W);
  column_band<W, TransA, Accumulate>(m, 0, j, k, a, lda, b, ldb, c, ldc);
  if constexpr (W == 16) {
    if (n - j >= 16) {
      column_band<8, TransA, Accumulate>(m, j, j + 16, k, a, lda, b, ldb, c, ldc);
      j += 16;
    }
  }
  for (int i = 0; i < m; ++i)
    for (int x = j; x < n; ++x) {
      float sum = Accumulate ? c[int64_t(i) * ldc + x] : 0.f;
      for (int p = 0; p < k; ++p)
        sum += (TransA ? a[int64_t(p) * lda + i] : a[int64_t(i) * lda + p]) * b[int64_t(p) * ldb + x];
      c[int64_t(i) * ldc + x] = sum;
    }
}

template <int W>
FA_INLINE float dot_impl(const float* a, const float* b, int n) {
  using V = typename Vec<W>::f;
  V acc0 = {}, acc1 = {};  // two chains hide the add latency
  int i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    acc0 += load<W>(a + i) * load<W>(b + i);
    acc1 += load<W>(a + i + W) * load<W>(b + i + W);
  }
  acc0 += acc1;
  float sum = 0;
  for (int x = 0; x < W; ++x) sum += acc0[x];
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// exp(x) = 2^n * e^r with n = round(x log2 e), r = x - n ln 2 (two-part ln 2), e^r by a degree-6
// polynomial: about 2 ulp. Inputs below -87 give exactly 0, so -inf does.
template <int W>
FA_INLINE typename Vec<W>::f exp_vec(typename Vec<W>::f v) {
  using V = typename Vec<W>::f;
  using I = typename Vec<W>::i;
  const V lo = V{} - 87.0f, hi = V{} + 88.0f;
  V x = v < lo ? lo : v;
  x = x > hi ? hi : x;
  const V t = x * 1.44269504088896341f;
  const I n = __builtin_convertvector(t + (t >= 0 ? V{} + 0.5f : V{} - 0.5f), I);
  const V fn = __builtin_convertvector(n, V);
  const V r = (x - fn * 0.693359375f) + fn * 2.12194440e-4f;
  V p = V{} + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const V e = (p * r * r + r) + 1.0f;
  const V scaled = reinterpret_cast<V>(reinterpret_cast<I>(e) + (n << 23));
  return v < lo ? V{} : scaled;
}

template <int W>
FA_INLINE void exp_impl(float* x, int n) {
  int i = 0;
  for (; i + W <= n; i += W) store<W>(x + i, exp_vec<W>(load<W>(x + i)));
  if (i < n) {
    float rest[W] = {};
    for (int j = i; j < n; ++j) rest[j - i] = x[j];
    const typename Vec<W>::f e = exp_vec<W>(load<W>(rest));
    for (int j = i; j < n; ++j) x[j] = e[j - i];
  }
}

template <int W>
FA_INLINE void online_softmax_impl(float* s, int ld, int nq, int nk, float* m, float* l, float* corr) {
  using V = typename Vec<W>::f;
  const V neg_inf = V{} - __builtin_inff();
  for (int r = 0; r < nq; r += W) {
    const V m_old = load<W>(m + r);
    V m_new = m_old;
    for (int c = 0; c < nk; ++c) {
      const V x = load<W>(s + int64_t(c) * ld + r);
      m_new = x > m_new ? x : m_new;
    }
    const V shift = m_new == neg_inf ? V{} : m_new;
    V sum = {};
    for (int c = 0; c < nk; ++c) {
      const V e = exp_vec<W>(load<W>(s + int64_t(c) * ld + r) - shift);
      store<W>(s + int64_t(c) * ld + r, e);
      sum += e;
    }
    const V correction = exp_vec<W>(m_old - shift);
    store<W>(l + r, load<W>(l + r) * correction + sum);
    store<W>(m + r, m_new);
    store<W>(corr + r, correction);
  }
}

// bfloat16 is the upper half of a float32: widen and shift.
template <int W>
FA_INLINE void bf16_to_f32_impl(const void* src, float* dst, int n) {
  using V = typename Vec<W>::f;
  using I = typename Vec<W>::i;
  using H = typename Vec<W>::h;
  const auto* in = static_cast<const uint16_t*>(src);
  int i = 0;
  for (; i + W <= n; i += W) {
    const I wide = __builtin_convertvector(*reinterpret_cast<const H*>(in + i), I) << 16;
    store<W>(dst + i, reinterpret_cast<V>(wide));
  }
  for (; i < n; ++i) dst[i] = bf16_to_float(in[i]);
}

using GemmFn = void (*)(int, int, int, const float*, int, const float*, int, float*, int);
struct KernelSet {
  const char* isa;
  GemmFn nn, tn, nn_set;
  float (*dot)(const float*, const float*, int);
  void (*exp)(float*, int);
  void (*softmax)(float*, int, int, int, float*, float*, float*);
  void (*load_bf16)(const void*, float*, int);
};

// One entry point per (operation, target); each instantiates the templates for its own ISA.
#define FA_KERNEL_SET(NAME, TARGET, W)                                                                        \
  TARGET void NAME##_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,      \
                        int ldc) {                                                                            \
    gemm<W, false>(m, n, k, a, lda, b, ldb, c, ldc);                                                          \
  }                                                                                                           \
  TARGET void NAME##_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,      \
                        int ldc) {                                                                            \
    gemm<W, true>(m, n, k, a, lda, b, ldb, c, ldc);                                                           \
  }                                                                                                           \
  TARGET void NAME##_nn_set(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c,  \
                            int ldc) {                                                                        \
    gemm<W, false, false>(m, n, k, a, lda, b, ldb, c, ldc);                                                   \
  }                                                                                                           \
  TARGET float NAME##_dot(const float* a, const float* b, int n) { return dot_impl<W>(a, b, n); }             \
  TARGET void NAME##_exp(float* x, int n) { exp_impl<W>(x, n); }                                             \
  TARGET void NAME##_softmax(float* s, int ld, int nq, int nk, float* m, float* l, float* corr) {              \
    online_softmax_impl<W>(s, ld, nq, nk, m, l, corr);                                                        \
  }                                                                                                           \
  TARGET void NAME##_load_bf16(const void* src, float* dst, int n) { bf16_to_f32_impl<W>(src, dst, n); }      \
  constexpr KernelSet NAME##_set{#NAME,          &NAME##_nn,      &NAME##_tn,       &NAME##_nn_set,              \
                                 &NAME##_dot,    &NAME##_exp,     &NAME##_softmax,  &NAME##_load_bf16};

FA_KERNEL_SET(baseline, , 8)
#if defined(FA_X86_DISPATCH)
FA_KERNEL_SET(avx2, FA_TARGET("x86-64-v3"), 8)
FA_KERNEL_SET(avx512, FA_TARGET("x86-64-v4"), 16)
#endif

const KernelSet& pick_kernels() {
#if defined(FA_X86_DISPATCH)
  const char* forced = std::getenv("FLASHATTN_CPU_ISA");
  const auto allowed = [&](const char* isa) { return !forced || std::strcmp(forced, isa) == 0; };
  __builtin_cpu_init();
  if (allowed("avx512") && __builtin_cpu_supports("x86-64-v4")) return avx512_set;
  if ((allowed("avx2") || allowed("avx512")) && __builtin_cpu_supports("x86-64-v3")) return avx2_set;
#endif
  return baseline_set;
}

const KernelSet& kernels() {
  static const KernelSet& chosen = pick_kernels();
  return chosen;
}

}  // namespace

void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  kernels().nn(m, n, k, a, lda, b, ldb, c, ldc);
}
void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  kernels().tn(m, n, k, a, lda, b, ldb, c, ldc);
}
void gemm_nn_set(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc) {
  kernels().nn_set(m, n, k, a, lda, b, ldb, c, ldc);
}
float dot(const float* a, const float* b, int n) { return kernels().dot(a, b, n); }
void exp_inplace(float* x, int n) { kernels().exp(x, n); }
void online_softmax_step(float* s, int ld, int nq, int nk, float* m, float* l, float* corr) {
  kernels().softmax(s, ld, nq, nk, m, l, corr);
}
const char* cpu_isa() { return kernels().isa; }

namespace {

template <DType T>
void load_row(const void* src, float* dst, int n) {
  if constexpr (T == DType::f32) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
  } else if constexpr (T == DType::bf16) {
    kernels().load_bf16(src, dst, n);
  } else {
    const auto* s = static_cast<const typename Storage<T>::type*>(src);
    for (int i = 0; i < n; ++i) dst[i] = Storage<T>::load(s[i]);
  }
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

// The CUDA primitives of src/cuda/common, each against a host reference: mma fragments,
// ldmatrix (plain and transposed) on the padded shared-memory layout, cp.async with zero fill,
// quad reductions and transpose, exp2, fp32 -> 16-bit packing, and the dropout draws.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/semantics.h"
#include "cuda/common/cp_async.cuh"
#include "cuda/common/ldmatrix.cuh"
#include "cuda/common/mma.cuh"
#include "cuda/common/numeric.cuh"
#include "cuda/common/smem.cuh"
#include "cuda/common/warp.cuh"
#include "cuda/test_device.h"

namespace flashattn::cuda {
namespace {

using test::DeviceBuffer;

// ---- mma with fragments built from the documented layouts --------------------------------

// C[16][8] = A[16][16] B[16][8] (A row-major, B row-major [k][n]), fragments per the PTX layout.
template <typename T>
__global__ void mma_from_layout(const uint16_t* a, const uint16_t* b, float* c) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto pair = [](const uint16_t* p0, const uint16_t* p1) { return uint32_t(*p0) | (uint32_t(*p1) << 16); };
  const uint32_t af[4] = {pair(a + g * 16 + 2 * t, a + g * 16 + 2 * t + 1),
                          pair(a + (g + 8) * 16 + 2 * t, a + (g + 8) * 16 + 2 * t + 1),
                          pair(a + g * 16 + 2 * t + 8, a + g * 16 + 2 * t + 9),
                          pair(a + (g + 8) * 16 + 2 * t + 8, a + (g + 8) * 16 + 2 * t + 9)};
  const uint32_t bf[2] = {pair(b + (2 * t) * 8 + g, b + (2 * t + 1) * 8 + g),
                          pair(b + (2 * t + 8) * 8 + g, b + (2 * t + 9) * 8 + g)};
  float acc[4] = {0.5f, 0.5f, 0.5f, 0.5f};  // accumulates onto C
  mma_16816<T>(acc, af, bf);
  c[g * 8 + 2 * t] = acc[0];
  c[g * 8 + 2 * t + 1] = acc[1];
  c[(g + 8) * 8 + 2 * t] = acc[2];
  c[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// Random values exactly representable in dtype, as raw 16-bit and as float.
struct Matrix16 {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Matrix16 random_matrix(DType dt, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  Matrix16 m;
  for (int i = 0; i < n; ++i) {
    const uint16_t bits = dt == DType::bf16 ? float_to_bf16(u(rng)) : float_to_f16(u(rng));
    m.bits.push_back(bits);
    m.values.push_back(dt == DType::bf16 ? bf16_to_float(bits) : f16_to_float(bits));
  }
  return m;
}

template <typename T>
void check_mma(DType dt) {
  const Matrix16 a = random_matrix(dt, 16 * 16, 1), b = random_matrix(dt, 16 * 8, 2);
  DeviceBuffer<uint16_t> da(a.bits), db(b.bits);
  DeviceBuffer<float> dc(16 * 8);
  mma_from_layout<T><<<1, 32>>>(da.get(), db.get(), dc.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> c = dc.to_host();
  double worst = 0;
  int worst_at = 0;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double ref = 0.5;
      for (int k = 0; k < 16; ++k) ref += double(a.values[i * 16 + k]) * b.values[k * 8 + j];
      const double err = std::abs(ref - c[i * 8 + j]);
      if (err > worst) worst = err, worst_at = i * 8 + j;
    }
  EXPECT_LT(worst, 1e-4) << "worst at C[" << worst_at / 8 << "][" << worst_at % 8 << "] = " << c[worst_at];
}

class CudaPrimitives : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::gpu_present()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  }
};

TEST_F(CudaPrimitives, MmaFp16MatchesHostProduct) { check_mma<fp16>(DType::f16); }
TEST_F(CudaPrimitives, MmaBf16MatchesHostProduct) { check_mma<bf16>(DType::bf16); }

// ---- ldmatrix on the padded layout: the four operand shapes of the kernels ----------------

using Tile16 = SmemTile<16, 16>;

// Stores a 16x16 row-major matrix into a padded shared tile, then computes C = A B four ways:
//   out[0]: A from [m][k] (plain),  B from [n][k] (plain)    -> A * M^T, with M the stored matrix
//   out[1]: A from [m][k] (plain),  B from [k][n] (.trans)   -> A * M
//   out[2]: A from [k][m] (.trans), B from [n][k] (plain)    -> A^T * M^T
// where "A" is the same stored matrix (so these are M M^T, M M, M^T M^T) restricted to 16x16.
__global__ void ldmatrix_products(const uint16_t* m, float* out) {
  __shared__ __align__(16) unsigned char smem[Tile16::kBytes];
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  for (int i = lane; i < 256; i += 32)
    *reinterpret_cast<uint16_t*>(smem + Tile16::offset(i / 16, i % 16)) = m[i];
  __syncwarp();
  const uint32_t base = smem_address(smem);
  uint32_t a_plain[4], a_trans[4], b_nk[4], b_kn[4];
  const LaneCoord a = a_operand_lane(lane), nk = b_operand_nk_lane(lane), kn = b_operand_kn_lane(lane),
                  km = a_operand_km_lane(lane);
  ldmatrix_x4(a_plain, base + Tile16::offset(a.row, a.col));
  ldmatrix_x4_trans(a_trans, base + Tile16::offset(km.row, km.col));
  ldmatrix_x4(b_nk, base + Tile16::offset(nk.row, nk.col));
  ldmatrix_x4_trans(b_kn, base + Tile16::offset(kn.row, kn.col));
  const uint32_t* as[3] = {a_plain, a_plain, a_trans};
  const uint32_t* bs[3] = {b_nk, b_kn, b_nk};
  for (int v = 0; v < 3; ++v) {
    for (int half = 0; half < 2; ++half) {  // n 0..7 and 8..15
      float acc[4] = {};
      const uint32_t af[4] = {as[v][0], as[v][1], as[v][2], as[v][3]};
      const uint32_t bf[2] = {bs[v][2 * half], bs[v][2 * half + 1]};
      mma_16816<bf16>(acc, af, bf);
      float* o = out + v * 256;
      o[g * 16 + half * 8 + 2 * t] = acc[0];
      o[g * 16 + half * 8 + 2 * t + 1] = acc[1];
      o[(g + 8) * 16 + half * 8 + 2 * t] = acc[2];
      o[(g + 8) * 16 + half * 8 + 2 * t + 1] = acc[3];
    }
  }
}

TEST_F(CudaPrimitives, LdmatrixOperandsOnPaddedTile) {
  const Matrix16 m = random_matrix(DType::bf16, 256, 3);
  DeviceBuffer<uint16_t> dm(m.bits);
  DeviceBuffer<float> dout(3 * 256);
  ldmatrix_products<<<1, 32>>>(dm.get(), dout.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> out = dout.to_host();
  auto M = [&](int r, int c) { return double(m.values[r * 16 + c]); };
  const char* names[3] = {"M M^T (A plain, B [n][k])", "M M (A plain, B [k][n] trans)", "M^T M^T (A [k][m] trans)"};
  for (int v = 0; v < 3; ++v) {
    double worst = 0;
    int wi = 0, wj = 0;
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) {
        double ref = 0;
        for (int k = 0; k < 16; ++k) {
          const double a = v == 2 ? M(k, i) : M(i, k);
          const double b = v == 1 ? M(k, j) : M(j, k);
          ref += a * b;
        }
        const double err = std::abs(ref - out[v * 256 + i * 16 + j]);
        if (err > worst) worst = err, wi = i, wj = j;
      }
    EXPECT_LT(worst, 1e-3) << names[v] << ": worst at [" << wi << "][" << wj << "] = " << out[v * 256 + wi * 16 + wj];
  }
}

// ---- cp.async with zero fill ---------------------------------------------------------------

using CopyTile = SmemTile<8, 32>;

// Invalid chunks keep their computed address, moved `far` elements further: the zero fill must
// read nothing there (the kernels rely on it for rows past the end of a tensor).
__global__ void copy_with_zero_fill(const uint16_t* src, int64_t stride, int rows_valid, int cols_valid, int64_t far,
                                    uint16_t* dst) {
  __shared__ __align__(16) unsigned char smem[CopyTile::kBytes];
  const uint32_t base = smem_address(smem);
  for (int c = threadIdx.x; c < 8 * CopyTile::kChunksPerRow; c += blockDim.x) {
    const int row = c / CopyTile::kChunksPerRow, col = (c % CopyTile::kChunksPerRow) * 8;
    const bool valid = row < rows_valid && col < cols_valid;
    cp_async_16(base + CopyTile::offset(row, col), src + row * stride + col + (valid ? 0 : far), valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < 8 * 32; i += blockDim.x)
    dst[i] = *reinterpret_cast<const uint16_t*>(smem + CopyTile::offset(i / 32, i % 32));
}

TEST_F(CudaPrimitives, CpAsyncCopiesValidChunksAndZeroFillsTheRest) {
  const int64_t stride = 40;  // source rows longer than the tile
  const int rows_valid = 5, cols_valid = 24;
  // Only the valid rows are allocated: the invalid rows' addresses lie past the buffer's end.
  std::vector<uint16_t> src(rows_valid * stride);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint16_t(1000 + i);
  // 0: the addresses as computed; then 2^20 and 2^34 elements (2 MB, 32 GB) and 2^20 before.
  for (const int64_t far : {int64_t(0), int64_t(1) << 20, int64_t(1) << 34, -(int64_t(1) << 20)}) {
    DeviceBuffer<uint16_t> dsrc(src), ddst(8 * 32);
    copy_with_zero_fill<<<1, 32>>>(dsrc.get(), stride, rows_valid, cols_valid, far, ddst.get());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "far " << far;
    const std::vector<uint16_t> got = ddst.to_host();
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 32; ++c) {
        const uint16_t want = r < rows_valid && c < cols_valid ? src[r * stride + c] : 0;
        ASSERT_EQ(got[r * 32 + c], want) << "at row " << r << " col " << c << ", far " << far;
      }
  }
}

// ---- quad reductions, quad transpose, exp2, packing ---------------------------------------

__global__ void quad_ops(const float* x, float* max_out, float* sum_out, uint32_t* transposed) {
  const int lane = threadIdx.x;
  max_out[lane] = quad_max(x[lane]);
  sum_out[lane] = quad_sum(x[lane]);
  uint32_t w[4];
  for (int k = 0; k < 4; ++k) w[k] = uint32_t(lane * 16 + k);
  quad_transpose(w);
  for (int k = 0; k < 4; ++k) transposed[lane * 4 + k] = w[k];
}

TEST_F(CudaPrimitives, QuadReductionsAndTranspose) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = float((i * 37) % 23) - 11.f;
  DeviceBuffer<float> dx(x), dmax(32), dsum(32);
  DeviceBuffer<uint32_t> dt(128);
  quad_ops<<<1, 32>>>(dx.get(), dmax.get(), dsum.get(), dt.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto mx = dmax.to_host(), sm = dsum.to_host();
  const auto tr = dt.to_host();
  for (int lane = 0; lane < 32; ++lane) {
    const int q = lane & ~3;
    const float want_max = std::max(std::max(x[q], x[q + 1]), std::max(x[q + 2], x[q + 3]));
    const float want_sum = x[q] + x[q + 1] + x[q + 2] + x[q + 3];
    EXPECT_EQ(mx[lane], want_max) << "lane " << lane;
    EXPECT_EQ(sm[lane], want_sum) << "lane " << lane;
    for (int s = 0; s < 4; ++s)  // x[s] of lane t = original x[t] of lane s
      EXPECT_EQ(tr[lane * 4 + s], uint32_t((q + s) * 16 + lane % 4)) << "lane " << lane << " word " << s;
  }
}

__global__ void exp2_and_pack(const float* x, int n, float* e, uint32_t* h, uint32_t* b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  e[i] = fast_exp2(x[i]);
  h[i] = pack2<fp16>(x[i], -x[i]);
  b[i] = pack2<bf16>(x[i], -x[i]);
}

TEST_F(CudaPrimitives, Exp2AndRoundToNearestPacking) {
  std::vector<float> x = {-INFINITY, -126.f, -20.5f, -1.f, 0.f, 0.3f, 1.f, 7.77f, 60.f};
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-30.f, 30.f);
  for (int i = 0; i < 1000; ++i) x.push_back(u(rng));
  const int n = int(x.size());
  DeviceBuffer<float> dx(x), de(n);
  DeviceBuffer<uint32_t> dh(n), db(n);
  exp2_and_pack<<<(n + 127) / 128, 128>>>(dx.get(), n, de.get(), dh.get(), db.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto e = de.to_host();
  const auto h = dh.to_host(), b = db.to_host();
  for (int i = 0; i < n; ++i) {
    const double want = std::exp2(double(x[i]));
    if (want < 1e-37) {
      EXPECT_LT(e[i], 1e-37) << "exp2(" << x[i] << ")";  // flushed or exact zero, never NaN
    } else {
      EXPECT_NEAR(e[i] / want, 1.0, 2e-6) << "exp2(" << x[i] << ") = " << e[i];
    }
    EXPECT_EQ(h[i] & 0xFFFFu, float_to_f16(x[i])) << "fp16 low half of " << x[i];
    EXPECT_EQ(h[i] >> 16, float_to_f16(-x[i])) << "fp16 high half of " << -x[i];
    EXPECT_EQ(b[i] & 0xFFFFu, float_to_bf16(x[i])) << "bf16 low half of " << x[i];
    EXPECT_EQ(b[i] >> 16, float_to_bf16(-x[i])) << "bf16 high half of " << -x[i];
  }
}

// ---- dropout draws: the device computes the host's keep mask -------------------------------

__global__ void dropout_keep(semantics::Dropout drop, int64_t batch_head, int rows, int cols, uint8_t* keep) {
  const int i = blockIdx.x, j = threadIdx.x;
  if (i < rows && j < cols) keep[i * cols + j] = drop.keep(batch_head, i, j) ? 1 : 0;
}

TEST_F(CudaPrimitives, DropoutKeepMaskMatchesHost) {
  const semantics::Dropout drop = semantics::Dropout::make(0.3f, 0x123456789abcdefull, 77);
  const int rows = 19, cols = 200;
  DeviceBuffer<uint8_t> dkeep(rows * cols);
  dropout_keep<<<rows, 256>>>(drop, 5, rows, cols, dkeep.get());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto keep = dkeep.to_host();
  int kept = 0;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      ASSERT_EQ(keep[i * cols + j], drop.keep(5, i, j) ? 1 : 0) << "row " << i << " key " << j;
      kept += keep[i * cols + j];
    }
  EXPECT_NEAR(double(kept) / (rows * cols), 0.7, 0.03);
}

}  // namespace
}  // namespace flashattn::cuda

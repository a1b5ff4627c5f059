// The sm_90a primitives of src/cuda/sm90 against host references, on a compute capability 9.0
// device: TMA loads (swizzled placement, zero fill past every extent, mbarrier completion) and
// reduce-adds (fp32 swizzled boxes, dropped past the extent, bulk-group completion),
// register reallocation with hand-offs through a named barrier and an mbarrier, and wgmma in the
// forms the kernels use: SS with K-major operands (S = Q K^T), RS with an N-major B (O = P V) and
// SS with an M-major A and an N-major B (the backward's dQ = dS K), over several column blocks of
// the 128-byte swizzle. Skipped elsewhere.
#include <gtest/gtest.h>

#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "cuda/device.h"
#include "cuda/sm90/barrier.cuh"
#include "cuda/sm90/tensor_map.h"
#include "cuda/sm90/tma.cuh"
#include "cuda/sm90/wgmma.cuh"
#include "cuda/test_device.h"

namespace flashattn::cuda::sm90 {
namespace {

using test::DeviceBuffer;

__device__ uint32_t aligned_base(unsigned char* smem) {
  return (uint32_t(__cvta_generic_to_shared(smem)) + 1023u) & ~1023u;
}
__device__ unsigned char* generic(uint32_t shared_address) {
  return static_cast<unsigned char*>(__cvta_shared_to_generic(shared_address));
}

// Loads one 64 x kRows box at (c0, c1, c2, c3) by TMA and copies the raw shared bytes out.
template <int kRows>
__global__ void tma_box(const __grid_constant__ CUtensorMap map, int c0, int c1, int c2, int c3, uint16_t* out) {
  using Tile = SwizzledTile<kRows, 64>;
  extern __shared__ unsigned char smem[];
  const uint32_t tile = aligned_base(smem), bar = tile + Tile::kBytes;
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(bar, Tile::kBytes);
    tma_load_4d(tile, map, bar, c0, c1, c2, c3);
  }
  mbarrier_wait(bar, 0);
  for (int i = threadIdx.x; i < Tile::kBytes / 2; i += blockDim.x)
    out[i] = reinterpret_cast<const uint16_t*>(generic(tile))[i];
}

// Writes value(r, c) = r * 64 + c + 1 into a 64 x 64 SwizzledFloatTile, then adds its two 32-column boxes to the accumulator at column c0,
// head c1, row c2 by TMA reduce-add, as the backward hands over its dQ tiles.
__global__ void tma_reduce_tile(const __grid_constant__ CUtensorMap map, int c0, int c1, int c2) {
  using Tile = SwizzledFloatTile<64, 64>;
  extern __shared__ unsigned char smem[];
  const uint32_t tile = aligned_base(smem);
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
    const int r = i / 64, c = i % 64;
    *reinterpret_cast<float*>(generic(tile + Tile::offset(r, c))) = float(r * 64 + c + 1);
  }
  fence_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    tma_reduce_add_3d(map, tile, c0, c1, c2);
    tma_reduce_add_3d(map, tile + Tile::kBlockBytes, c0 + 32, c1, c2);
    bulk_commit();
    bulk_wait<0>();
  }
}

// C[64][N] = A[64][K] B[N][K]^T, both K-major in swizzled shared tiles (S = Q K^T).
template <int N, int K>
__global__ void wgmma_ss_product(const uint16_t* a, const uint16_t* b, float* c) {
  using ATile = SwizzledTile<64, K>;
  using BTile = SwizzledTile<N, K>;
  extern __shared__ unsigned char smem[];
  const uint32_t at = aligned_base(smem), bt = at + ATile::kBytes;
  for (int i = threadIdx.x; i < 64 * K; i += 128)
    *reinterpret_cast<uint16_t*>(generic(at + ATile::offset(i / K, i % K))) = a[i];
  for (int i = threadIdx.x; i < N * K; i += 128)
    *reinterpret_cast<uint16_t*>(generic(bt + BTile::offset(i / K, i % K))) = b[i];
  fence_async_shared();
  __syncthreads();
  float d[N / 8][4];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    WgmmaOp<bf16, N>::template ss<0, 0>(flat<N>(d), k_major_descriptor<ATile>(at, 0, kk),
                                     k_major_descriptor<BTile>(bt, 0, kk), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(flat<N>(d));
  const int t = threadIdx.x, row = 16 * (t / 32) + (t % 32) / 4;
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) c[(row + 8 * (e / 2)) * N + 8 * j + 2 * (t % 4) + e % 2] = d[j][e];
}

// C[64][N] = 1 + P[64][K] V[K][N]: P from registers in the A-fragment layout, V N-major in a
// swizzled tile (O += P V), accumulating onto ones.
template <int N, int K>
__global__ void wgmma_rs_product(const uint16_t* p, const uint16_t* v, float* c) {
  using VTile = SwizzledTile<K, N>;
  extern __shared__ unsigned char smem[];
  const uint32_t vt = aligned_base(smem);
  for (int i = threadIdx.x; i < K * N; i += 128)
    *reinterpret_cast<uint16_t*>(generic(vt + VTile::offset(i / N, i % N))) = v[i];
  fence_async_shared();
  __syncthreads();
  const int t = threadIdx.x, r0 = 16 * (t / 32) + (t % 32) / 4, q = t % 4;
  auto pair = [&](int row, int col) { return uint32_t(p[row * K + col]) | (uint32_t(p[row * K + col + 1]) << 16); };
  uint32_t a[K / 16][4];
  for (int kk = 0; kk < K / 16; ++kk) {
    a[kk][0] = pair(r0, 16 * kk + 2 * q);
    a[kk][1] = pair(r0 + 8, 16 * kk + 2 * q);
    a[kk][2] = pair(r0, 16 * kk + 8 + 2 * q);
    a[kk][3] = pair(r0 + 8, 16 * kk + 8 + 2 * q);
  }
  float d[N / 8][4];
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) d[j][e] = 1.f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    WgmmaOp<bf16, N>::template rs<1>(flat<N>(d), a[kk], n_major_descriptor<VTile>(vt, kk), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(flat<N>(d));
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) c[(r0 + 8 * (e / 2)) * N + 8 * j + 2 * q + e % 2] = d[j][e];
}

// C[64][N] = A B[:, c0 .. c0 + N - 1] with A M-major (stored transposed, At[K][64]) and B
// N-major, both in swizzled tiles: the backward's dQ = dS K, dS kept as dS^T [key][query] and
// one consumer's columns of K (a 64-column block, or half of one).
template <int K, int kBCols, int N>
__global__ void wgmma_ss_transposed_product(const uint16_t* at_values, const uint16_t* b, int c0, float* c) {
  using ATile = SwizzledTile<K, 64>;
  using BTile = SwizzledTile<K, kBCols>;
  extern __shared__ unsigned char smem[];
  const uint32_t at = aligned_base(smem), bt = at + ATile::kBytes;
  for (int i = threadIdx.x; i < K * 64; i += 128)
    *reinterpret_cast<uint16_t*>(generic(at + ATile::offset(i / 64, i % 64))) = at_values[i];
  for (int i = threadIdx.x; i < K * kBCols; i += 128)
    *reinterpret_cast<uint16_t*>(generic(bt + BTile::offset(i / kBCols, i % kBCols))) = b[i];
  fence_async_shared();
  __syncthreads();
  float d[N / 8][4];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    WgmmaOp<bf16, N>::template ss<1, 1>(flat<N>(d), n_major_descriptor<ATile>(at, kk),
                                        n_major_descriptor<BTile>(bt, kk, c0), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_registers(flat<N>(d));
  const int t = threadIdx.x, row = 16 * (t / 32) + (t % 32) / 4;
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) c[(row + 8 * (e / 2)) * N + 8 * j + 2 * (t % 4) + e % 2] = d[j][e];
}

// Warp specialisation: warpgroup 0 gives registers back, warpgroups 1 and 2 claim more; 1 hands
// a value to 2 through a named barrier (2 waits, 1 only arrives), and 2 hands it back through
// an mbarrier phase. Every thread of 1 and 2 reports what it saw.
__global__ void __launch_bounds__(384, 1) warpgroup_handoff(int* out) {
  __shared__ int value[2];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t bar_address = uint32_t(__cvta_generic_to_shared(&bar));
  if (threadIdx.x == 0) {
    mbarrier_init(bar_address, 128);
    mbarrier_init_fence();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  if (wg == 0) {
    registers_release<24>();
  } else if (wg == 1) {
    registers_claim<240>();
    if (t == 0) value[0] = 42;
    named_barrier_arrive(1, 256);  // value[0] is written
    mbarrier_wait(bar_address, 0);  // value[1] is written
    out[t] = value[1];
  } else {
    registers_claim<240>();
    named_barrier_sync(1, 256);
    out[128 + t] = value[0];
    if (t == 0) value[1] = 7;
    mbarrier_arrive(bar_address);  // all 128 threads: the phase completes
  }
}

struct Bf16Matrix {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};
Bf16Matrix random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Bf16Matrix m;
  for (size_t i = 0; i < n; ++i) {
    m.bits.push_back(float_to_bf16(u(rng)));
    m.values.push_back(bf16_to_float(m.bits.back()));
  }
  return m;
}

class Sm90Primitives : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::gpu_present()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    if (device_info(0).compute_capability != 90) GTEST_SKIP() << "sm_90a test: device is not compute capability 9.0";
  }
};

// A [2, 100, 3, 80] tensor with padded rows: a box reaching past the rows and the head dim
// arrives zero-filled, the rest in the swizzled positions of SwizzledTile.
TEST_F(Sm90Primitives, TmaLoadPlacesSwizzledBoxAndZeroFills) {
  const int batch = 2, rows = 100, heads = 3, dim = 80, row_pitch = 3 * 96;  // heads * 96 elements per row
  const Bf16Matrix x = random_bf16(size_t(batch) * rows * row_pitch, 5);
  DeviceBuffer<uint16_t> dx(x.bits);
  Operand o{dx.get(), int64_t(rows) * row_pitch, row_pitch, 96};
  CUtensorMap map;
  ASSERT_TRUE(make_tensor_map(&map, o, true, batch, rows, heads, dim, 64).is_ok());
  constexpr int kRows = 64;
  DeviceBuffer<uint16_t> out(kRows * 64);
  const int c0 = 64, c1 = 60, c2 = 2, c3 = 1;  // columns 64..127 (80.. missing), rows 60..123 (100.. missing)
  tma_box<kRows><<<1, 128, SwizzledTile<kRows, 64>::kBytes + 1024 + 64>>>(map, c0, c1, c2, c3, out.get());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = out.to_host();
  int wrong = 0;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < 64; ++c) {
      const int row = c1 + r, col = c0 + c;
      const uint16_t want = row < rows && col < dim ? x.bits[(size_t(c3) * rows + row) * row_pitch + c2 * 96 + col] : 0;
      const uint16_t have = got[SwizzledTile<kRows, 64>::offset(r, c) / 2];
      if (have != want && wrong++ < 5) ADD_FAILURE() << "box (" << r << ", " << c << "): " << have << " != " << want;
    }
  EXPECT_EQ(wrong, 0);
}

// A [100 rows][3 heads][96 columns] fp32 accumulator: two launches add a 64 x 64 tile at
// columns 32..95, head 1, rows 50..113; every element of the tile inside the extent gains twice
// its value, rows past 100 are dropped, and nothing else changes.
TEST_F(Sm90Primitives, TmaReduceAddAccumulatesSwizzledBoxesAndDropsPastTheRows) {
  const int rows = 100, heads = 3, dim = 96, c0 = 32, c1 = 1, c2 = 50;
  std::vector<float> start(size_t(rows) * heads * dim);
  for (size_t i = 0; i < start.size(); ++i) start[i] = float(i % 7) - 3.f;
  DeviceBuffer<float> acc(start);
  CUtensorMap map;
  ASSERT_TRUE(make_accumulator_map(&map, acc.get(), rows, heads, dim, 64).is_ok());
  for (int launch = 0; launch < 2; ++launch)
    tma_reduce_tile<<<1, 128, SwizzledFloatTile<64, 64>::kBytes + 1024>>>(map, c0, c1, c2);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = acc.to_host();
  int wrong = 0;
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int c = 0; c < dim; ++c) {
        const size_t at = (size_t(r) * heads + h) * dim + c;
        const bool in_tile = h == c1 && r >= c2 && r < c2 + 64 && c >= c0 && c < c0 + 64;
        const float want = start[at] + (in_tile ? 2.f * float((r - c2) * 64 + (c - c0) + 1) : 0.f);
        if (got[at] != want && wrong++ < 5)
          ADD_FAILURE() << "row " << r << ", head " << h << ", column " << c << ": " << got[at] << " != " << want;
      }
  EXPECT_EQ(wrong, 0);
}

TEST_F(Sm90Primitives, NamedBarrierAndMbarrierHandOffBetweenWarpgroups) {
  DeviceBuffer<int> out(256);
  warpgroup_handoff<<<1, 384>>>(out.get());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<int> got = out.to_host();
  for (int t = 0; t < 128; ++t) {
    EXPECT_EQ(got[t], 7) << "warpgroup 1, thread " << t;
    EXPECT_EQ(got[128 + t], 42) << "warpgroup 2, thread " << t;
  }
}

// Runs a product kernel on one warpgroup with `smem` bytes of dynamic shared memory; `c` receives
// the 64 x n fp32 product it writes through its last argument.
template <typename Kernel, typename... Args>
void run_product(Kernel kernel, int smem, int n, std::vector<float>* c, Args... args) {
  DeviceBuffer<float> out(64 * n);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kernel<<<1, 128, smem>>>(args..., out.get());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  *c = out.to_host();
}

// Largest |ref(i, j) - c[i][j]| over a 64 x n product.
template <typename Ref>
double worst_error(const std::vector<float>& c, int n, Ref ref) {
  double worst = 0;
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < n; ++j) worst = std::max(worst, std::abs(ref(i, j) - c[i * n + j]));
  return worst;
}

template <int N, int K>
void check_ss() {
  const Bf16Matrix a = random_bf16(64 * K, 1), b = random_bf16(N * K, 2);
  DeviceBuffer<uint16_t> da(a.bits), db(b.bits);
  std::vector<float> c;
  const int smem = SwizzledTile<64, K>::kBytes + SwizzledTile<N, K>::kBytes + 1024;
  ASSERT_NO_FATAL_FAILURE(run_product(wgmma_ss_product<N, K>, smem, N, &c, da.get(), db.get()));
  const double worst = worst_error(c, N, [&](int i, int j) {
    double ref = 0;
    for (int k = 0; k < K; ++k) ref += double(a.values[i * K + k]) * b.values[j * K + k];
    return ref;
  });
  EXPECT_LT(worst, 1e-3) << "N=" << N << " K=" << K;
}

template <int N, int K>
void check_rs() {
  const Bf16Matrix p = random_bf16(64 * K, 3), v = random_bf16(K * N, 4);
  DeviceBuffer<uint16_t> dp(p.bits), dv(v.bits);
  std::vector<float> c;
  ASSERT_NO_FATAL_FAILURE(run_product(wgmma_rs_product<N, K>, SwizzledTile<K, N>::kBytes + 1024, N, &c, dp.get(),
                                      dv.get()));
  const double worst = worst_error(c, N, [&](int i, int j) {
    double ref = 1;
    for (int k = 0; k < K; ++k) ref += double(p.values[i * K + k]) * v.values[k * N + j];
    return ref;
  });
  EXPECT_LT(worst, 1e-3) << "N=" << N << " K=" << K;
}

template <int K, int kBCols, int N>
void check_ss_transposed(int c0) {
  const Bf16Matrix at = random_bf16(K * 64, 5), b = random_bf16(K * kBCols, 6);
  DeviceBuffer<uint16_t> dat(at.bits), db(b.bits);
  std::vector<float> c;
  const int smem = SwizzledTile<K, 64>::kBytes + SwizzledTile<K, kBCols>::kBytes + 1024;
  ASSERT_NO_FATAL_FAILURE(
      run_product(wgmma_ss_transposed_product<K, kBCols, N>, smem, N, &c, dat.get(), db.get(), c0));
  const double worst = worst_error(c, N, [&](int i, int j) {
    double ref = 0;
    for (int k = 0; k < K; ++k) ref += double(at.values[k * 64 + i]) * b.values[k * kBCols + c0 + j];
    return ref;
  });
  EXPECT_LT(worst, 1e-3) << "K=" << K << " N=" << N << " B columns from " << c0;
}

TEST_F(Sm90Primitives, WgmmaSharedKMajorOperands) {
  check_ss<128, 128>();  // two 64-column blocks of K
  check_ss<64, 256>();
  check_ss<96, 64>();
}

TEST_F(Sm90Primitives, WgmmaRegisterAWithNMajorB) {
  check_rs<128, 128>();
  check_rs<256, 64>();  // four 64-column blocks of N
  check_rs<64, 96>();
}

TEST_F(Sm90Primitives, WgmmaSharedMMajorAWithNMajorB) {
  check_ss_transposed<128, 128, 64>(64);  // dQ of one warpgroup at d = 128: all keys, second column block
  check_ss_transposed<128, 64, 32>(32);   // at d = 64: all keys, second half of the column block
  check_ss_transposed<64, 64, 64>(0);
}

}  // namespace
}  // namespace flashattn::cuda::sm90

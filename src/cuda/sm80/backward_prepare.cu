// The small kernels around the backward's main kernel.
//   prepare: delta = rowsum(dO * O) and lse * log2(e) per (head, packed query row), dq_accum = 0;
//   finish:  dq = scale * (sum of the dq_accum copies, in a fixed order), converted to T.
#include <cmath>

#include "cuda/launch.h"
#include "cuda/sm80/attention_common.cuh"

namespace flashattn::cuda {
namespace {

constexpr int kThreads = 256;

// Packed query row -> (batch, row inside the sequence); false for varlen rows past the batch.
__device__ __forceinline__ bool locate_row(const KernelParams& p, int64_t row, int* b, int64_t* i) {
  if (p.cu_seqlens_q) {
    *b = 0;
    *i = row;  // varlen operands have batch stride 0 and rows counted from the tensor start
    return row < p.cu_seqlens_q[p.batch];
  }
  *b = int(row / p.seqlen_q);
  *i = row % p.seqlen_q;
  return true;
}

// One warp per (head, packed row).
template <typename T>
__global__ void __launch_bounds__(kThreads) prepare_kernel(const __grid_constant__ KernelParams p) {
  using Elem = typename T::storage;
  const int64_t item = (int64_t(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (item >= int64_t(p.heads_q) * p.rows_q) return;
  const int h = int(item / p.rows_q);
  const int64_t row = item % p.rows_q;
  int b;
  int64_t i;
  const bool used = locate_row(p, row, &b, &i);
  float dot = 0.f;
  if (used) {
    const Elem* dout = operand_row<const Elem>(p.dout, b, i, h);
    const Elem* out = operand_row<const Elem>(p.out, b, i, h);
    for (int col = lane * 8; col < p.head_dim; col += 32 * 8) {
      const uint4 a = *reinterpret_cast<const uint4*>(dout + col);
      const uint4 c = *reinterpret_cast<const uint4*>(out + col);
      const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, cw[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 x = unpack2<T>(aw[w]), y = unpack2<T>(cw[w]);
        dot += x.x * y.x + x.y * y.y;
      }
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if (lane == 0) {
    p.delta[item] = dot;
    const float lse = used ? p.lse[int64_t(b) * p.lse_batch + int64_t(h) * p.lse_head + i] : -INFINITY;
    p.lse_log2[item] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// One thread per 4 columns of dq.
template <typename T>
__global__ void __launch_bounds__(kThreads) finish_kernel(const __grid_constant__ KernelParams p, int padded_d) {
  using Elem = typename T::storage;
  const int chunks = padded_d / 4;
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;  // (packed row, head, chunk)
  if (item >= p.rows_q * p.heads_q * chunks) return;
  const int col = int(item % chunks) * 4;
  const int h = int(item / chunks % p.heads_q);
  const int64_t row = item / chunks / p.heads_q;
  int b;
  int64_t i;
  if (col >= p.head_dim || !locate_row(p, row, &b, &i)) return;
  const int64_t copy_stride = p.rows_q * p.heads_q * padded_d;
  const float* src = p.dq_accum + (row * p.heads_q + h) * padded_d + col;
  float4 sum = *reinterpret_cast<const float4*>(src);
  for (int c = 1; c < p.dq_copies; ++c) {
    const float4 v = *reinterpret_cast<const float4*>(src + c * copy_stride);
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  uint2 packed;
  packed.x = pack2<T>(sum.x * p.scale, sum.y * p.scale);
  packed.y = pack2<T>(sum.z * p.scale, sum.w * p.scale);
  *reinterpret_cast<uint2*>(operand_row<Elem>(p.dq, b, i, h) + col) = packed;
}

unsigned blocks_for(int64_t threads) { return unsigned((threads + kThreads - 1) / kThreads); }

}  // namespace

template <typename T>
Status launch_backward_prepare(const KernelParams& p, int padded_head_dim, cudaStream_t stream) {
  const size_t accum_bytes = size_t(p.dq_copies) * size_t(p.rows_q) * p.heads_q * padded_head_dim * sizeof(float);
  FA_TRY(device_status(cudaMemsetAsync(p.dq_accum, 0, accum_bytes, stream), "cudaMemsetAsync(dq_accum)"));
  const int64_t warps = int64_t(p.heads_q) * p.rows_q;
  if (warps == 0) return Status::ok();
  prepare_kernel<T><<<blocks_for(warps * 32), kThreads, 0, stream>>>(p);
  return device_status(cudaGetLastError(), "backward prepare_kernel launch");
}

template <typename T>
Status launch_backward_finish(const KernelParams& p, int padded_head_dim, cudaStream_t stream) {
  const int64_t threads = p.rows_q * p.heads_q * (padded_head_dim / 4);
  if (threads == 0) return Status::ok();
  finish_kernel<T><<<blocks_for(threads), kThreads, 0, stream>>>(p, padded_head_dim);
  return device_status(cudaGetLastError(), "backward finish_kernel launch");
}

template Status launch_backward_prepare<fp16>(const KernelParams&, int, cudaStream_t);
template Status launch_backward_prepare<bf16>(const KernelParams&, int, cudaStream_t);
template Status launch_backward_finish<fp16>(const KernelParams&, int, cudaStream_t);
template Status launch_backward_finish<bf16>(const KernelParams&, int, cudaStream_t);

}  // namespace flashattn::cuda

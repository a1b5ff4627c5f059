// The small kernels around the backward's main kernel.
//   prepare: delta = rowsum(dO * O) and lse * log2(e) per (head, packed query row), dq_accum = 0;
//   finish:  dq = scale * (sum of the dq_accum copies, in a fixed order), converted to T; the
//            sm90 backward's dq_accum is in fragment order within 32-column blocks.
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

// A group of lanes per (head, packed row), a lane per 8 columns: the group spans the padded head
// dim rounded up to a power of two (8, 16 or 32 lanes), so every load is 16 bytes and a warp
// carries several rows at small head dims. Each lane also zeroes its 8 columns of dq_accum in
// every copy, in the same pass as the reads (a separate memset costs as much again).
__host__ __device__ constexpr int prepare_group_lanes(int padded_d) {
  return padded_d <= 64 ? 8 : padded_d <= 128 ? 16 : 32;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) prepare_kernel(const __grid_constant__ KernelParams p, int padded_d) {
  using Elem = typename T::storage;
  const int lanes = prepare_group_lanes(padded_d);
  const int64_t thread = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t item = thread / lanes;  // (head, packed row)
  const int col = int(thread % lanes) * 8;
  if (item >= int64_t(p.heads_q) * p.rows_q) return;  // whole groups leave together
  const int h = int(item / p.rows_q);
  const int64_t row = item % p.rows_q;
  if (col < padded_d) {
    const int64_t copy_stride = p.rows_q * p.heads_q * padded_d;
    float4* accum = reinterpret_cast<float4*>(p.dq_accum + (row * p.heads_q + h) * padded_d + col);
    for (int c = 0; c < p.dq_copies; ++c, accum += copy_stride / 4) {
      accum[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      accum[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  int b;
  int64_t i;
  const bool used = locate_row(p, row, &b, &i);
  float dot = 0.f;
  if (used && col < p.head_dim) {
    const uint4 a = *reinterpret_cast<const uint4*>(operand_row<const Elem>(p.dout, b, i, h) + col);
    const uint4 c = *reinterpret_cast<const uint4*>(operand_row<const Elem>(p.out, b, i, h) + col);
    const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, cw[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 x = unpack2<T>(aw[w]), y = unpack2<T>(cw[w]);
      dot += x.x * y.x + x.y * y.y;
    }
  }
  // The group's lanes are aligned within the warp, so xor offsets below `lanes` stay inside it;
  // the mask names the group alone (the groups past the last item have returned).
  const int lane = int(threadIdx.x % 32);
  const unsigned group = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << (lane / lanes * lanes);
  for (int off = lanes / 2; off > 0; off /= 2) dot += __shfl_xor_sync(group, dot, off);
  if (col == 0) {
    p.delta[item] = dot;
    const float lse = used ? p.lse[int64_t(b) * p.lse_batch + int64_t(h) * p.lse_head + i] : -INFINITY;
    p.lse_log2[item] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// Columns [col, col + 8) of a dq_accum row: contiguous, or in the sm90 backward's fragment order,
// where column 8 c + 2 q + e of a 32-column block sits at 8 q + 2 c + e (sm90/float_tile.h).
__device__ __forceinline__ void load_dq_columns(const float* row, int col, bool fragment_order, float4& lo, float4& hi) {
  if (!fragment_order) {
    lo = reinterpret_cast<const float4*>(row + col)[0];
    hi = reinterpret_cast<const float4*>(row + col)[1];
    return;
  }
  const float* block = row + (col & ~31) + 2 * ((col % 32) / 8);
  const float2 a = *reinterpret_cast<const float2*>(block), b = *reinterpret_cast<const float2*>(block + 8);
  const float2 c = *reinterpret_cast<const float2*>(block + 16), d = *reinterpret_cast<const float2*>(block + 24);
  lo = make_float4(a.x, a.y, b.x, b.y);
  hi = make_float4(c.x, c.y, d.x, d.y);
}

// One thread per 8 columns of dq.
template <typename T>
__global__ void __launch_bounds__(kThreads) finish_kernel(const __grid_constant__ KernelParams p, int padded_d,
                                                          bool fragment_order) {
  using Elem = typename T::storage;
  const int chunks = padded_d / 8;
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;  // (packed row, head, chunk)
  if (item >= p.rows_q * p.heads_q * chunks) return;
  const int col = int(item % chunks) * 8;
  const int h = int(item / chunks % p.heads_q);
  const int64_t row = item / chunks / p.heads_q;
  int b;
  int64_t i;
  if (col >= p.head_dim || !locate_row(p, row, &b, &i)) return;
  const int64_t copy_stride = p.rows_q * p.heads_q * padded_d;
  const float* src = p.dq_accum + (row * p.heads_q + h) * padded_d;
  float4 lo, hi;
  load_dq_columns(src, col, fragment_order, lo, hi);
  for (int c = 1; c < p.dq_copies; ++c) {
    src += copy_stride;
    float4 a, e;
    load_dq_columns(src, col, fragment_order, a, e);
    lo = make_float4(lo.x + a.x, lo.y + a.y, lo.z + a.z, lo.w + a.w);
    hi = make_float4(hi.x + e.x, hi.y + e.y, hi.z + e.z, hi.w + e.w);
  }
  const uint4 packed = make_uint4(pack2<T>(lo.x * p.scale, lo.y * p.scale), pack2<T>(lo.z * p.scale, lo.w * p.scale),
                                  pack2<T>(hi.x * p.scale, hi.y * p.scale), pack2<T>(hi.z * p.scale, hi.w * p.scale));
  *reinterpret_cast<uint4*>(operand_row<Elem>(p.dq, b, i, h) + col) = packed;
}

unsigned blocks_for(int64_t threads) { return unsigned((threads + kThreads - 1) / kThreads); }

}  // namespace

template <typename T>
Status launch_backward_prepare(const KernelParams& p, int padded_head_dim, cudaStream_t stream) {
  const int64_t items = int64_t(p.heads_q) * p.rows_q;
  if (items == 0) return Status::ok();
  prepare_kernel<T><<<blocks_for(items * prepare_group_lanes(padded_head_dim)), kThreads, 0, stream>>>(p, padded_head_dim);
  return device_status(cudaGetLastError(), "backward prepare_kernel launch");
}

template <typename T>
Status launch_backward_finish(const KernelParams& p, int padded_head_dim, bool fragment_order, cudaStream_t stream) {
  const int64_t threads = p.rows_q * p.heads_q * (padded_head_dim / 8);
  if (threads == 0) return Status::ok();
  finish_kernel<T><<<blocks_for(threads), kThreads, 0, stream>>>(p, padded_head_dim, fragment_order);
  return device_status(cudaGetLastError(), "backward finish_kernel launch");
}

template Status launch_backward_prepare<fp16>(const KernelParams&, int, cudaStream_t);
template Status launch_backward_prepare<bf16>(const KernelParams&, int, cudaStream_t);
template Status launch_backward_finish<fp16>(const KernelParams&, int, bool, cudaStream_t);
template Status launch_backward_finish<bf16>(const KernelParams&, int, bool, cudaStream_t);

}  // namespace flashattn::cuda

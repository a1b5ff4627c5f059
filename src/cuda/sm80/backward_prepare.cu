// The small kernels around the backward's main kernel.
//   prepare: delta = rowsum(dO * O) and lse * log2(e) per (head, packed query row), dq_accum = 0
//            (and the deterministic turns, by a memset);
//   finish:  dq = scale * (sum of the dq_accum copies, in a fixed order), converted to T, from
//            dq_accum's column order (KernelParams::dq_layout).
#include <cmath>

#include "cuda/dq_accum_layout.h"
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

// Columns [col, col + 8) (col a multiple of 8) of packed row `row`, head h of a dq_accum copy in
// plain columns or fragment order: contiguous, or four pairs 8 floats apart.
__device__ __forceinline__ void load_dq_columns(const float* copy, DqLayout layout, int64_t row, int h, int col,
                                                int heads, int d, float4& lo, float4& hi) {
  const float* first = copy + dq_accum_index(layout, row, h, col, heads, d);
  if (layout == DqLayout::plain) {
    lo = reinterpret_cast<const float4*>(first)[0];
    hi = reinterpret_cast<const float4*>(first)[1];
    return;
  }
  const float2 a = *reinterpret_cast<const float2*>(first), b = *reinterpret_cast<const float2*>(first + 8);
  const float2 c = *reinterpret_cast<const float2*>(first + 16), e = *reinterpret_cast<const float2*>(first + 24);
  lo = make_float4(a.x, a.y, b.x, b.y);
  hi = make_float4(c.x, c.y, e.x, e.y);
}

// A group of lanes per (head, packed row), a lane per 8 columns: the group spans the padded head
// dim rounded up to a power of two (8, 16 or 32 lanes), so every load is 16 bytes and a warp
// carries several rows at small head dims. Each lane also zeroes 8 floats of dq_accum in every
// copy, in the same pass as the reads (a separate memset costs as much again): the copy is zeroed
// as plain rows whatever its layout, and groups past the last row (row tiles' padding) only zero.
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
  const DqLayout layout = DqLayout(p.dq_layout);
  const int64_t copy_floats = dq_accum_copy_floats(layout, p.rows_q, p.heads_q, padded_d);
  const int64_t rows = dq_accum_rows(layout, p.rows_q);  // with the padding
  if (item >= int64_t(p.heads_q) * rows) return;  // whole groups leave together
  const int h = int(item / rows);
  const int64_t row = item % rows;
  if (col < padded_d) {
    float4* accum = reinterpret_cast<float4*>(p.dq_accum + (row * p.heads_q + h) * padded_d + col);
    for (int c = 0; c < p.dq_copies; ++c, accum += copy_floats / 4) {
      accum[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      accum[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  if (row >= p.rows_q) return;
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
    p.delta[h * p.rows_q + row] = dot;
    const float lse = used ? p.lse[int64_t(b) * p.lse_batch + int64_t(h) * p.lse_head + i] : -INFINITY;
    p.lse_log2[h * p.rows_q + row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// Columns of dq per thread of the finish kernel: 16 in row tiles, whose 16 floats of a row's
// 16-column block a thread reads as four 16-byte loads; 8 otherwise.
__host__ __device__ constexpr int finish_span(DqLayout layout) { return layout == DqLayout::row_tiles ? 16 : 8; }

// dq = scale * the sum of the copies, in T: 8 columns at col from float4 lo, hi.
template <typename T>
__device__ __forceinline__ void store_dq(const KernelParams& p, int b, int64_t i, int h, int col, float4 lo,
                                         float4 hi) {
  using Elem = typename T::storage;
  const uint4 packed = make_uint4(pack2<T>(lo.x * p.scale, lo.y * p.scale), pack2<T>(lo.z * p.scale, lo.w * p.scale),
                                  pack2<T>(hi.x * p.scale, hi.y * p.scale), pack2<T>(hi.z * p.scale, hi.w * p.scale));
  *reinterpret_cast<uint4*>(operand_row<Elem>(p.dq, b, i, h) + col) = packed;
}

// One thread per finish_span columns of dq.
template <typename T>
__global__ void __launch_bounds__(kThreads) finish_kernel(const __grid_constant__ KernelParams p, int padded_d) {
  const DqLayout layout = DqLayout(p.dq_layout);
  const int span = finish_span(layout), chunks = padded_d / span;
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;  // (packed row, head, chunk)
  if (item >= p.rows_q * p.heads_q * chunks) return;
  const int col = int(item % chunks) * span;
  const int h = int(item / chunks % p.heads_q);
  const int64_t row = item / chunks / p.heads_q;
  int b;
  int64_t i;
  if (col >= p.head_dim || !locate_row(p, row, &b, &i)) return;
  const int64_t copy_floats = dq_accum_copy_floats(layout, p.rows_q, p.heads_q, padded_d);
  if (layout == DqLayout::row_tiles) {
    // Float 4 q + 2 j + e of the block is column 8 j + 2 q + e: v[q] holds columns 2 q, 2 q + 1
    // (x, y) and 8 + 2 q, 9 + 2 q (z, w).
    const float4* block =
        reinterpret_cast<const float4*>(p.dq_accum + dq_accum_index(layout, row, h, col, p.heads_q, padded_d));
    float4 v[4] = {block[0], block[1], block[2], block[3]};
    for (int c = 1; c < p.dq_copies; ++c) {
      block += copy_floats / 4;
      for (int q = 0; q < 4; ++q)
        v[q] = make_float4(v[q].x + block[q].x, v[q].y + block[q].y, v[q].z + block[q].z, v[q].w + block[q].w);
    }
    store_dq<T>(p, b, i, h, col, make_float4(v[0].x, v[0].y, v[1].x, v[1].y),
                make_float4(v[2].x, v[2].y, v[3].x, v[3].y));
    if (col + 8 < p.head_dim)
      store_dq<T>(p, b, i, h, col + 8, make_float4(v[0].z, v[0].w, v[1].z, v[1].w),
                  make_float4(v[2].z, v[2].w, v[3].z, v[3].w));
    return;
  }
  float4 lo, hi;
  load_dq_columns(p.dq_accum, layout, row, h, col, p.heads_q, padded_d, lo, hi);
  for (int c = 1; c < p.dq_copies; ++c) {
    float4 a, e;
    load_dq_columns(p.dq_accum + c * copy_floats, layout, row, h, col, p.heads_q, padded_d, a, e);
    lo = make_float4(lo.x + a.x, lo.y + a.y, lo.z + a.z, lo.w + a.w);
    hi = make_float4(hi.x + e.x, hi.y + e.y, hi.z + e.z, hi.w + e.w);
  }
  store_dq<T>(p, b, i, h, col, lo, hi);
}

unsigned blocks_for(int64_t threads) { return unsigned((threads + kThreads - 1) / kThreads); }

}  // namespace

template <typename T>
Status launch_backward_prepare(const KernelParams& p, int padded_head_dim, cudaStream_t stream) {
  if (p.deterministic) {  // every copy's turns start at "no key block has added yet"
    const size_t bytes = size_t(p.dq_copies) * size_t(backward_dq_turns(p.rows_q, p.batch, p.heads_q)) * sizeof(int);
    FA_TRY(device_status(cudaMemsetAsync(p.dq_turns, 0, bytes, stream), "cudaMemsetAsync(dq_turns)"));
  }
  // Items (head, packed row) include row tiles' padding rows, which only zero dq_accum.
  const int64_t items = dq_accum_rows(DqLayout(p.dq_layout), p.rows_q) * p.heads_q;
  if (items == 0) return Status::ok();
  prepare_kernel<T><<<blocks_for(items * prepare_group_lanes(padded_head_dim)), kThreads, 0, stream>>>(p, padded_head_dim);
  return device_status(cudaGetLastError(), "backward prepare_kernel launch");
}

template <typename T>
Status launch_backward_finish(const KernelParams& p, int padded_head_dim, cudaStream_t stream) {
  const int64_t threads = p.rows_q * p.heads_q * (padded_head_dim / finish_span(DqLayout(p.dq_layout)));
  if (threads == 0) return Status::ok();
  finish_kernel<T><<<blocks_for(threads), kThreads, 0, stream>>>(p, padded_head_dim);
  return device_status(cudaGetLastError(), "backward finish_kernel launch");
}

template Status launch_backward_prepare<fp16>(const KernelParams&, int, cudaStream_t);
template Status launch_backward_prepare<bf16>(const KernelParams&, int, cudaStream_t);
template Status launch_backward_finish<fp16>(const KernelParams&, int, cudaStream_t);
template Status launch_backward_finish<bf16>(const KernelParams&, int, cudaStream_t);

}  // namespace flashattn::cuda

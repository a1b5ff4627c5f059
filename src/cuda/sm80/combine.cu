// Combines the per-split partial outputs of a split-key forward. For a row with split results
// (O_s, lse_s): lse = log(sum_s exp(lse_s)), out = sum_s exp(lse_s - lse) O_s; a row whose splits
// all saw nothing (every lse_s = -inf) gets out = 0, lse = -inf.
#include <cmath>

#include "cuda/launch.h"
#include "cuda/sm80/attention_common.cuh"

namespace flashattn::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColumns = 4;  // output columns per thread

template <typename T>
__global__ void __launch_bounds__(kThreads) combine_kernel(const __grid_constant__ KernelParams p, int padded_d) {
  using Elem = typename T::storage;
  const int chunks = padded_d / kColumns;
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;  // (head, row, chunk)
  if (item >= int64_t(p.heads_q) * p.rows_q * chunks) return;
  const int chunk = int(item % chunks);
  const int64_t row = item / chunks % p.rows_q;  // packed query row
  const int h = int(item / chunks / p.rows_q);
  const int col = chunk * kColumns;
  if (col >= p.head_dim) return;
  // Packed row -> (batch, row inside the sequence); varlen rows past the last sequence are unused.
  int b = 0;
  int64_t i = row;
  if (p.cu_seqlens_q) {
    if (row >= p.cu_seqlens_q[p.batch]) return;
  } else {
    b = int(row / p.seqlen_q);
    i = row % p.seqlen_q;
  }

  const int64_t split_stride = int64_t(p.heads_q) * p.rows_q;
  const float* lse_s = p.partial_lse + int64_t(h) * p.rows_q + row;
  float max_lse = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) max_lse = fmaxf(max_lse, lse_s[s * split_stride]);
  float acc[kColumns] = {};
  float lse = -INFINITY;
  if (max_lse != -INFINITY) {
    float sum = 0.f;
    for (int s = 0; s < p.num_splits; ++s) sum += expf(lse_s[s * split_stride] - max_lse);
    lse = max_lse + logf(sum);
    for (int s = 0; s < p.num_splits; ++s) {
      const float w = expf(lse_s[s * split_stride] - lse);
      if (w == 0.f) continue;
      const float4 v =
          *reinterpret_cast<const float4*>(p.partial_out + ((s * split_stride) + int64_t(h) * p.rows_q + row) * padded_d + col);
      acc[0] += w * v.x;
      acc[1] += w * v.y;
      acc[2] += w * v.z;
      acc[3] += w * v.w;
    }
  }
  // i counts rows from the sequence start: the operand's own row offset is already in `row` for
  // varlen (batch stride 0), and b * batch stride plus i for dense.
  Elem* out = operand_row<Elem>(p.out, b, i, h) + col;
  uint2 packed;
  packed.x = pack2<T>(acc[0], acc[1]);
  packed.y = pack2<T>(acc[2], acc[3]);
  *reinterpret_cast<uint2*>(out) = packed;
  if (chunk == 0 && p.lse) p.lse[int64_t(b) * p.lse_batch + int64_t(h) * p.lse_head + i] = lse;
}

}  // namespace

template <typename T>
Status launch_combine(const KernelParams& p, int padded_head_dim, cudaStream_t stream) {
  const int64_t items = int64_t(p.heads_q) * p.rows_q * (padded_head_dim / kColumns);
  if (items == 0) return Status::ok();
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  combine_kernel<T><<<unsigned(blocks), kThreads, 0, stream>>>(p, padded_head_dim);
  return device_status(cudaGetLastError(), "combine_kernel launch");
}

template Status launch_combine<fp16>(const KernelParams&, int, cudaStream_t);
template Status launch_combine<bf16>(const KernelParams&, int, cudaStream_t);

}  // namespace flashattn::cuda

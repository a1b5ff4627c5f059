// Launches the sm_90 backward of one (dtype, head dim) variant: the sm80 prepare kernel (delta,
// lse in log2 units, dq_accum = 0), TMA maps and the main kernel, then the sm80 finish kernel
// (dq from dq_accum).
#pragma once

#include <type_traits>

#include "cuda/launch.h"
#include "cuda/sm90/backward_kernel.cuh"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {

template <typename T, int kD>
Status launch_backward_main(const KernelParams& p, cudaStream_t stream) {
  using C = BackwardConfig<T, kD>;
  BackwardArgs args;
  args.p = p;
  const bool varlen = p.cu_seqlens_q != nullptr, bf16_data = std::is_same_v<T, bf16>;
  const int64_t batch = varlen ? 1 : p.batch;
  const int64_t rows_q = varlen ? p.rows_q : p.seqlen_q, rows_k = varlen ? p.rows_k : p.seqlen_k;
  FA_TRY(make_tensor_map(&args.q, p.q, bf16_data, batch, rows_q, p.heads_q, p.head_dim, C::kM));
  FA_TRY(make_tensor_map(&args.dout, p.dout, bf16_data, batch, rows_q, p.heads_q, p.head_dim, C::kM));
  FA_TRY(make_tensor_map(&args.k, p.k, bf16_data, batch, rows_k, p.heads_kv, p.head_dim, C::kN));
  FA_TRY(make_tensor_map(&args.v, p.v, bf16_data, batch, rows_k, p.heads_kv, p.head_dim, C::kN));
  const auto kernel = ScoreRule::is_general(p) ? backward_kernel<T, kD, true> : backward_kernel<T, kD, false>;
  FA_TRY(device_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                       "cudaFuncSetAttribute(sm90 backward_kernel)"));
  const int n_blocks = (p.seqlen_k + C::kN - 1) / C::kN;
  const dim3 grid(unsigned(p.deterministic ? p.dq_copies : n_blocks), unsigned(p.heads_kv), unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(args);
  return device_status(cudaGetLastError(), "sm90 backward_kernel launch");
}

template <typename T, int kD>
Status launch_backward(const KernelParams& p, cudaStream_t stream) {
  FA_TRY(launch_backward_prepare<T>(p, kD, stream));
  if (p.seqlen_k > 0) FA_TRY((launch_backward_main<T, kD>(p, stream)));
  return launch_backward_finish<T>(p, kD, stream);
}

}  // namespace flashattn::cuda::sm90

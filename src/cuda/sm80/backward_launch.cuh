// Launches the backward of one (dtype, head dim) variant: prepare (delta, lse in log2 units,
// dq_accum = 0), the main kernel over key blocks, then dq from dq_accum.
#pragma once

#include "cuda/launch.h"
#include "cuda/sm80/backward_kernel.cuh"

namespace flashattn::cuda {

template <typename T, int kD, bool kDropout>
auto backward_kernel_for(const KernelParams& p) {
  return ScoreRule::is_general(p) ? backward_kernel<T, kD, kDropout, true> : backward_kernel<T, kD, kDropout, false>;
}

template <typename T, int kD>
Status launch_backward(const KernelParams& p, cudaStream_t stream) {
  using C = BackwardConfig<T, kD>;
  const auto kernel =
      p.dropout_threshold != 0 ? backward_kernel_for<T, kD, true>(p) : backward_kernel_for<T, kD, false>(p);
  FA_TRY(device_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                       "cudaFuncSetAttribute(backward_kernel)"));
  FA_TRY(launch_backward_prepare<T>(p, kD, stream));
  const int n_blocks = (p.seqlen_k + C::kN - 1) / C::kN;
  if (n_blocks > 0) {
    const int grid_x = p.dq_copies > 1 ? p.dq_copies : n_blocks;
    const dim3 grid(unsigned(grid_x), unsigned(p.heads_kv), unsigned(p.batch));
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
    FA_TRY(device_status(cudaGetLastError(), "backward_kernel launch"));
  }
  return launch_backward_finish<T>(p, kD, stream);
}

}  // namespace flashattn::cuda

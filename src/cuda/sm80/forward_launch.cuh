// Launches the forward of one (dtype, head dim) variant: the main kernel, then the combine
// kernel when the keys were split.
#pragma once

#include "cuda/launch.h"
#include "cuda/sm80/forward_kernel.cuh"

namespace flashattn::cuda {

template <typename T, int kD, bool kDropout>
auto forward_kernel_for(const KernelParams& p) {
  return ScoreRule::is_general(p) ? forward_kernel<T, kD, kDropout, true> : forward_kernel<T, kD, kDropout, false>;
}

template <typename T, int kD>
Status launch_forward(const KernelParams& p, cudaStream_t stream) {
  using C = ForwardConfig<T, kD>;
  const auto kernel = p.dropout_threshold != 0 ? forward_kernel_for<T, kD, true>(p) : forward_kernel_for<T, kD, false>(p);
  FA_TRY(device_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                       "cudaFuncSetAttribute(forward_kernel)"));
  const int m_blocks = (p.seqlen_q + C::kM - 1) / C::kM;
  const dim3 grid(unsigned(m_blocks * p.num_splits), unsigned(p.heads_q), unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  FA_TRY(device_status(cudaGetLastError(), "forward_kernel launch"));
  if (p.num_splits > 1) return launch_combine<T>(p, kD, stream);
  return Status::ok();
}

}  // namespace flashattn::cuda

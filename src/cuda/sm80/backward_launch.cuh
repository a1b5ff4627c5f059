// Launches the backward of one (dtype, head dim) variant: prepare (delta, lse in log2 units,
// dq_accum = 0), the main kernel over key blocks, then dq from dq_accum.
#pragma once

#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/sm80/backward_kernel.cuh"

namespace flashattn::cuda {

template <typename T, int kD, int kStages, bool kDropout>
auto backward_kernel_for(const KernelParams& p) {
  return ScoreRule::is_general(p) ? backward_kernel<T, kD, kStages, kDropout, true>
                                  : backward_kernel<T, kD, kStages, kDropout, false>;
}

template <typename T, int kD, int kStages>
Status launch_backward_main(const KernelParams& p, cudaStream_t stream) {
  using C = BackwardConfig<T, kD, kStages>;
  const auto kernel = p.dropout_threshold != 0 ? backward_kernel_for<T, kD, kStages, true>(p)
                                               : backward_kernel_for<T, kD, kStages, false>(p);
  FA_TRY(device_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                       "cudaFuncSetAttribute(backward_kernel)"));
  const int n_blocks = (p.seqlen_k + C::kN - 1) / C::kN;
  const int grid_x = p.deterministic ? p.dq_copies : n_blocks;  // one block per copy, even a single copy
  const dim3 grid(unsigned(grid_x), unsigned(p.heads_kv), unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  return device_status(cudaGetLastError(), "backward_kernel launch");
}

template <typename T, int kD>
Status launch_backward(const KernelParams& p, cudaStream_t stream) {
  FA_TRY(launch_backward_prepare<T>(p, kD, stream));
  if (p.seqlen_k > 0) {
    // Double-buffered Q and dO where the device has the shared memory for them.
    int device = 0;
    FA_TRY(device_status(cudaGetDevice(&device), "cudaGetDevice"));
    const bool two_stages = device_info(device).max_smem_per_block >= BackwardConfig<T, kD, 2>::kSmemBytes;
    FA_TRY((two_stages ? launch_backward_main<T, kD, 2>(p, stream) : launch_backward_main<T, kD, 1>(p, stream)));
  }
  return launch_backward_finish<T>(p, kD, stream);
}

}  // namespace flashattn::cuda

// Host-side entry points of the sm80 kernels, one pair per compiled (dtype, head dim) variant,
// and the small kernels that are not per head dim.
#pragma once

#include <cuda_runtime.h>

#include "core/status.h"
#include "cuda/common/numeric.cuh"
#include "cuda/kernel_params.h"

namespace flashattn::cuda {

// Turns a CUDA error into a status naming what failed.
inline Status device_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return make_status(FLASHATTN_ERROR_DEVICE, what, ": ", cudaGetErrorString(err));
}

template <typename T, int kD>
Status launch_forward(const KernelParams& p, cudaStream_t stream);
template <typename T, int kD>
Status launch_backward(const KernelParams& p, cudaStream_t stream);

// Sums the split partials of a forward into out and lse (forward_kernel with num_splits > 1).
template <typename T>
Status launch_combine(const KernelParams& p, int padded_head_dim, cudaStream_t stream);

// Backward before the main kernel: delta = rowsum(dO * O), dq_accum = 0 and, deterministic, the
// turns of its adds = 0.
template <typename T>
Status launch_backward_prepare(const KernelParams& p, int padded_head_dim, cudaStream_t stream);
// Backward after the main kernel: dq = scale * sum of the dq_accum copies, in T, read in the
// column order that p.dq_layout names.
template <typename T>
Status launch_backward_finish(const KernelParams& p, int padded_head_dim, cudaStream_t stream);

namespace sm90 {
// The sm_90a kernels (TMA, wgmma, warp specialisation); no dropout. The backward serves head
// dims 64 and 128 (backward_supported).
template <typename T, int kD>
Status launch_forward(const KernelParams& p, cudaStream_t stream);
template <typename T, int kD>
Status launch_backward(const KernelParams& p, cudaStream_t stream);
}  // namespace sm90

}  // namespace flashattn::cuda

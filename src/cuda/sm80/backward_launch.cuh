// Launches the backward of one (dtype, head dim) variant: prepare (delta, lse in log2 units,
// dq_accum = 0), the main kernel over key blocks, then dq from dq_accum.
#pragma once

#include "cuda/device.h"
#include "cuda/head_groups.h"
#include "cuda/launch.h"
#include "cuda/sm80/backward_kernel.cuh"

namespace flashattn::cuda {

template <typename T, int kD, int kStages, int kBlockM, int kBlockN, bool kDropout>
auto backward_kernel_for(const KernelParams& p) {
  return ScoreRule::is_general(p) ? backward_kernel<T, kD, kStages, kBlockM, kBlockN, kDropout, true>
                                  : backward_kernel<T, kD, kStages, kBlockM, kBlockN, kDropout, false>;
}

template <typename T, int kD, int kStages, int kBlockM, int kBlockN = 0>
Status launch_backward_main(const KernelParams& p, cudaStream_t stream) {
  using C = BackwardConfig<T, kD, kStages, kBlockM, kBlockN>;
  const auto kernel = p.dropout_threshold != 0 ? backward_kernel_for<T, kD, kStages, kBlockM, kBlockN, true>(p)
                                               : backward_kernel_for<T, kD, kStages, kBlockM, kBlockN, false>(p);
  FA_TRY(device_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                       "cudaFuncSetAttribute(backward_kernel)"));
  const int n_blocks = (p.seqlen_k + C::kN - 1) / C::kN;
  // The grid's order: backward_order.h.
  const bool pairs_innermost = backward_pairs_innermost(p.deterministic, p.window_left, p.window_right);
  if (pairs_innermost && int64_t(p.heads_kv) * p.batch > INT32_MAX)
    return make_status(FLASHATTN_ERROR_UNSUPPORTED, "deterministic backward: batch = ", p.batch, " x heads_kv = ",
                       p.heads_kv, " exceeds 2^31 - 1 (kv head, sequence) pairs");
  // Pairs innermost put the key blocks in y (backward_pair_group keeps z within 65535; batch and
  // heads are within it by supports()).
  if (pairs_innermost && n_blocks > 65535)
    return make_status(FLASHATTN_ERROR_UNSUPPORTED, "deterministic backward: seqlen_k = ", p.seqlen_k, " gives ",
                       n_blocks, " blocks of ", C::kN, " keys, past a grid's 65535");
  KernelParams q = p;
  q.head_group = backward_launch_head_group(p, kD, n_blocks);
  const BackwardGrid g = backward_grid(n_blocks, p.heads_kv, p.batch, pairs_innermost, q.head_group);
  const dim3 grid(g.x, g.y, g.z);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(q);
  return device_status(cudaGetLastError(), "backward_kernel launch");
}

// The largest configuration the device's shared memory holds: 128 query rows per step (head
// dims up to 64; with dropout a lane's keep bits then take 64 bits), else 64 rows with
// Q and dO double-buffered, else single-buffered, else (head dims 65 to 128) 64 keys per block
// instead of 128 (backward_takes_narrow_keys, which choose_backward() reads for its block_n too).
template <typename T, int kD>
Status launch_backward_main_fitting(const KernelParams& p, cudaStream_t stream) {
  int device = 0;
  FA_TRY(device_status(cudaGetDevice(&device), "cudaGetDevice"));
  const int smem = device_info(device).max_smem_per_block;
  constexpr int kWide = backward_wide_block_m(kD);
  if constexpr (kWide != 0)
    if (smem >= BackwardConfig<T, kD, 2, kWide>::kSmemBytes) return launch_backward_main<T, kD, 2, kWide>(p, stream);
  if (smem >= BackwardConfig<T, kD, 2>::kSmemBytes) return launch_backward_main<T, kD, 2, 64>(p, stream);
  constexpr int kNarrow = backward_narrow_block_n(kD);
  if constexpr (kNarrow != 0)
    if (backward_takes_narrow_keys(kD, smem, BackwardConfig<T, kD, 1>::kSmemBytes))
      return launch_backward_main<T, kD, 1, 64, kNarrow>(p, stream);
  return launch_backward_main<T, kD, 1, 64>(p, stream);
}

template <typename T, int kD>
Status launch_backward(const KernelParams& p, cudaStream_t stream) {
  FA_TRY(launch_backward_prepare<T>(p, kD, stream));
  if (p.seqlen_k > 0) FA_TRY((launch_backward_main_fitting<T, kD>(p, stream)));
  return launch_backward_finish<T>(p, kD, stream);
}

}  // namespace flashattn::cuda

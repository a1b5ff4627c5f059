// Launches the forward of one (dtype, head dim) variant: the main kernel, then the combine
// kernel when the keys were split.
#pragma once

#include "cuda/head_groups.h"
#include "cuda/launch.h"
#include "cuda/sm80/forward_kernel.cuh"

namespace flashattn::cuda {

template <typename T, int kD, bool kDropout, bool kGeneral>
Status launch_forward_kernel(const KernelParams& p, cudaStream_t stream) {
  using C = ForwardConfig<T, kD, kDropout, kGeneral>;
  const auto kernel = forward_kernel<T, kD, kDropout, kGeneral>;
  FA_TRY(device_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                       "cudaFuncSetAttribute(forward_kernel)"));
  const int m_blocks = (p.seqlen_q + C::kM - 1) / C::kM;
  // (query tiles x splits, heads, batch), or in groups of heads (head_groups.h; not with dropout,
  // forward_kernel): (the group's heads, query tiles x splits, groups), so that a group's longest
  // tiles launch first.
  KernelParams q = p;
  if (!kDropout)
    q.head_group = head_group_in_grid(
        forward_head_group(p.batch, p.heads_q, p.group, p.seqlen_k, kD, p.window_left, p.window_right),
        int64_t(p.batch) * p.heads_q, int64_t(m_blocks) * p.num_splits);
  const unsigned tiles = unsigned(m_blocks * p.num_splits), group = unsigned(q.head_group);
  const dim3 grid = group > 1 ? dim3(group, tiles, unsigned(head_group_count(int64_t(p.batch) * p.heads_q, group)))
                              : dim3(tiles, unsigned(p.heads_q), unsigned(p.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(q);
  FA_TRY(device_status(cudaGetLastError(), "forward_kernel launch"));
  if (p.num_splits > 1) return launch_combine<T>(p, kD, stream);
  return Status::ok();
}

template <typename T, int kD>
Status launch_forward(const KernelParams& p, cudaStream_t stream) {
  const bool general = ScoreRule::is_general(p);
  if (p.dropout_threshold != 0)
    return general ? launch_forward_kernel<T, kD, true, true>(p, stream)
                   : launch_forward_kernel<T, kD, true, false>(p, stream);
  return general ? launch_forward_kernel<T, kD, false, true>(p, stream)
                 : launch_forward_kernel<T, kD, false, false>(p, stream);
}

}  // namespace flashattn::cuda

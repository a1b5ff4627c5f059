// Launches the sm_90 backward of one (dtype, head dim) variant: the sm80 prepare kernel (delta,
// lse in log2 units, dq_accum = 0), TMA maps and the main kernel, then the sm80 finish kernel
// (dq from dq_accum).
#pragma once

#include <type_traits>

#include "cuda/launch.h"
#include "cuda/sm90/backward_kernel.cuh"
#include "cuda/sm90/backward_wide_kernel.cuh"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {

// The narrow kernel up to d = 128, the wide one above (tile_shapes.h); kHoldDqBox: the wide
// kernel's deterministic form (WideBackwardConfig).
template <typename T, int kD, bool kGeneral, bool kHoldDqBox>
constexpr auto backward_kernel_for() {
  if constexpr (backward_wide(kD))
    return wide_backward_kernel<T, kD, kGeneral, kHoldDqBox>;
  else
    return backward_kernel<T, kD, kGeneral>;
}

template <typename T, int kD, bool kGeneral, bool kHoldDqBox = false>
Status launch_backward_main(const KernelParams& p, cudaStream_t stream) {
  using C = std::conditional_t<backward_wide(kD), WideBackwardConfig<T, kD, kGeneral, kHoldDqBox>,
                               BackwardConfig<T, kD, kGeneral>>;
  BackwardArgs args;
  args.p = p;
  args.p.head_group = backward_launch_head_group(p, kD, backward_key_blocks<C::kN>(p));
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  FA_TRY(make_operand_map(&args.q, p.q, p, Side::queries, kBf16, C::kM));
  FA_TRY(make_operand_map(&args.dout, p.dout, p, Side::queries, kBf16, C::kM));
  FA_TRY(make_operand_map(&args.k, p.k, p, Side::keys, kBf16, C::kN));
  FA_TRY(make_operand_map(&args.v, p.v, p, Side::keys, kBf16, C::kN));
  FA_TRY(make_accumulator_map(&args.dq_accum, p.dq_accum, int64_t(p.dq_copies) * p.rows_q, p.heads_q, kD, 64));
  const auto kernel = backward_kernel_for<T, kD, kGeneral, kHoldDqBox>();
  FA_TRY(device_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                       "cudaFuncSetAttribute(sm90 backward_kernel)"));
  kernel<<<backward_grid<C::kN>(args.p), C::kThreads, C::kSmemBytes, stream>>>(args);
  return device_status(cudaGetLastError(), "sm90 backward_kernel launch");
}

// The main kernel for p: the score transform's where scores need it; at d = 256 in deterministic
// mode, the form that holds each step's last dQ box (its plain scores only: one more kernel).
template <typename T, int kD>
Status launch_backward_main_for(const KernelParams& p, cudaStream_t stream) {
  if (ScoreRule::is_general(p)) return launch_backward_main<T, kD, true>(p, stream);
  if constexpr (backward_wide(kD))
    if (p.deterministic) return launch_backward_main<T, kD, false, true>(p, stream);
  return launch_backward_main<T, kD, false>(p, stream);
}

template <typename T, int kD>
Status launch_backward(const KernelParams& p, cudaStream_t stream) {
  FA_TRY(launch_backward_prepare<T>(p, kD, stream));
  if (p.seqlen_k > 0) FA_TRY((launch_backward_main_for<T, kD>(p, stream)));
  return launch_backward_finish<T>(p, kD, stream);
}

}  // namespace flashattn::cuda::sm90

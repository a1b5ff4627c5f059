// Launches the sm_90 forward of one (dtype, head dim) variant: TMA maps of q, k, v, the main
// kernel of the call's tile shape, then the sm80 combine kernel when the keys were split.
#pragma once

#include <algorithm>
#include <type_traits>

#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/sm90/forward_kernel.cuh"
#include "cuda/sm90/tensor_map.h"

namespace flashattn::cuda::sm90 {

// One block per tile, or (persistent) one per multiprocessor, or per tile if fewer, with the tile
// counter zeroed.
template <typename C>
Status launch_forward_kernel(void (*kernel)(ForwardArgs), const ForwardArgs& args, cudaStream_t stream) {
  const KernelParams& p = args.p;
  FA_TRY(device_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes),
                       "cudaFuncSetAttribute(sm90 forward_kernel)"));
  const int64_t tiles = forward_tiles(p.batch, p.heads_q, p.seqlen_q, p.num_splits, C::kM);
  if (tiles == 0) return Status::ok();
  int blocks = int(tiles);
  if constexpr (C::kPersistent) {
    int device = 0;
    FA_TRY(device_status(cudaGetDevice(&device), "cudaGetDevice"));
    blocks = int(std::min<int64_t>(tiles, std::max(1, device_info(device).multiprocessors)));
    FA_TRY(device_status(cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream), "cudaMemsetAsync(tile_counter)"));
  }
  kernel<<<blocks, C::kThreads, C::kSmemBytes, stream>>>(args);
  return device_status(cudaGetLastError(), "sm90 forward_kernel launch");
}

template <typename T, int kD, bool kTall>
Status launch_forward_shape(const KernelParams& p, cudaStream_t stream) {
  using C = ForwardConfig<T, kD, kTall, false>;
  ForwardArgs args;
  args.p = p;
  args.p.head_group =
      forward_head_group(p.batch, p.heads_q, p.group, p.seqlen_k, kD, p.window_left, p.window_right);
  constexpr bool kBf16 = std::is_same_v<T, bf16>;
  FA_TRY(make_operand_map(&args.q, p.q, p, Side::queries, kBf16, C::kM));
  FA_TRY(make_operand_map(&args.k, p.k, p, Side::keys, kBf16, C::kN));
  FA_TRY(make_operand_map(&args.v, p.v, p, Side::keys, kBf16, C::kN));
  if (ScoreRule::is_general(p)) {
    using General = ForwardConfig<T, kD, kTall, true>;
    FA_TRY(launch_forward_kernel<General>(forward_kernel<T, kD, kTall, true>, args, stream));
  } else {
    FA_TRY(launch_forward_kernel<C>(forward_kernel<T, kD, kTall, false>, args, stream));
  }
  if (p.num_splits > 1) return launch_combine<T>(p, kD, stream);
  return Status::ok();
}

// The tile shape follows forward_tall, as the host's tile count and split decision do.
template <typename T, int kD>
Status launch_forward(const KernelParams& p, cudaStream_t stream) {
  if constexpr (forward_tall_possible(kD))
    if (forward_tall(kD, p.seqlen_q)) return launch_forward_shape<T, kD, true>(p, stream);
  return launch_forward_shape<T, kD, false>(p, stream);
}

}  // namespace flashattn::cuda::sm90

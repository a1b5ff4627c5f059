// Which CUDA kernels serve a call, for reports and tests (the backend itself dispatches in
// cuda_backend.cu with the same decision).
#pragma once

#include "core/params.h"

namespace flashattn::cuda {

// "sm90" when the sm_90a forward (TMA, wgmma) runs `p`'s forward pass, else "sm80" (mma.sync).
const char* forward_kernels(const Params& p);
// The same for the backward pass (the sm_90a backward serves head dims up to 128).
const char* backward_kernels(const Params& p);
// Whether a compiled head dim serves `head_dim` (FLASHATTN_HEAD_DIMS; the others are rejected).
bool head_dim_compiled(int head_dim);

}  // namespace flashattn::cuda

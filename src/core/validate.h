// Turns the public descriptors into a validated Params and picks the backend. Nothing is
// launched or written before this succeeded.
#pragma once

#include "core/backend.h"
#include "core/params.h"
#include "core/status.h"

namespace flashattn {

// The public arguments of one call; backward-only members are null in a forward call.
struct CallArgs {
  Pass pass = Pass::forward;
  const flashattn_tensor *q = nullptr, *k = nullptr, *v = nullptr;
  const flashattn_tensor *out = nullptr, *lse = nullptr;
  const flashattn_tensor *dout = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const flashattn_options* options = nullptr;
  bool shapes_only = false;  // supports() / workspace queries: data pointers may be null
};

Status build_params(const CallArgs& args, Params* params);
// The backend that runs `params` (options->backend, or AUTO's choice), or why none does.
Status select_backend(const Params& params, flashattn_backend requested, const BackendOps** chosen);

}  // namespace flashattn

// The C entry points: validate, pick a backend, provide workspace, run; record the message of a
// failure for flashattn_last_error().
#include <cstdlib>
#include <new>
#include <string>

#include "core/backend.h"
#include "core/query_groups.h"
#include "core/validate.h"
#include "flashattn/flashattn.h"

namespace flashattn {
namespace {

thread_local std::string last_error;

flashattn_status finish(const Status& s) {
  last_error = s.message;
  return s.code;
}

struct Plan {
  Params params;
  const BackendOps* ops = nullptr;
};

Status plan(const CallArgs& args, Plan* plan) {
  FA_TRY(build_params(args, &plan->params));
  FA_TRY(select_backend(plan->params, args.options->backend, &plan->ops));
  // Grouped heads with few query rows run with each group's heads as rows (core/query_groups.h).
  if (query_groups_foldable(plan->params)) {
    const Params folded = fold_query_groups(plan->params);
    if (plan->ops->supports(folded).is_ok()) plan->params = folded;
  }
  return Status::ok();
}

// Runs a validated plan, with the caller's workspace or one allocated for this call.
Status execute(Plan& plan) {
  Params& p = plan.params;
  const size_t need = plan.ops->workspace_bytes(p);
  if (p.workspace && p.workspace_size < need)
    return make_status(FLASHATTN_ERROR_WORKSPACE_TOO_SMALL, "options.workspace_size=", p.workspace_size,
                       " is smaller than the ", need, " bytes this call needs");
  void* owned = nullptr;
  if (!p.workspace && need > 0) {
    owned = plan.ops->allocate(need, p);
    if (!owned)
      return make_status(FLASHATTN_ERROR_OUT_OF_MEMORY, "could not allocate ", need, " bytes of workspace on ",
                         plan.ops->name);
    p.workspace = owned;
    p.workspace_size = need;
  }
  Status s = plan.ops->run(p);
  if (owned) plan.ops->release(owned, p);
  return s;
}

template <typename F>
flashattn_status guarded(F&& f) {
  try {
    return finish(f());
  } catch (const std::bad_alloc&) {
    return finish(make_status(FLASHATTN_ERROR_OUT_OF_MEMORY, "out of host memory"));
  } catch (const std::exception& e) {
    return finish(make_status(FLASHATTN_ERROR_INTERNAL, "internal error: ", e.what()));
  }
}

CallArgs forward_args(const flashattn_tensor* q, const flashattn_tensor* k, const flashattn_tensor* v,
                      const flashattn_tensor* out, const flashattn_tensor* lse, const flashattn_options* o,
                      bool shapes_only) {
  CallArgs a;
  a.pass = Pass::forward;
  a.q = q; a.k = k; a.v = v; a.out = out; a.lse = lse; a.options = o;
  a.shapes_only = shapes_only;
  return a;
}

CallArgs backward_args(const flashattn_tensor* dout, const flashattn_tensor* q, const flashattn_tensor* k,
                       const flashattn_tensor* v, const flashattn_tensor* out, const flashattn_tensor* lse,
                       const flashattn_tensor* dq, const flashattn_tensor* dk, const flashattn_tensor* dv,
                       const flashattn_options* o, bool shapes_only) {
  CallArgs a = forward_args(q, k, v, out, lse, o, shapes_only);
  a.pass = Pass::backward;
  a.dout = dout; a.dq = dq; a.dk = dk; a.dv = dv;
  return a;
}

Status workspace_query(const CallArgs& args, size_t* bytes) {
  if (!bytes) return invalid("bytes is NULL");
  Plan pl;
  FA_TRY(plan(args, &pl));
  *bytes = pl.ops->workspace_bytes(pl.params);
  return Status::ok();
}

}  // namespace
}  // namespace flashattn

using namespace flashattn;

extern "C" {

void flashattn_options_init(flashattn_options* options) {
  if (options) *options = flashattn_options FLASHATTN_OPTIONS_INIT;
}

int flashattn_version(void) { return FLASHATTN_VERSION; }

const char* flashattn_version_string(void) {
#define FA_STR2(x) #x
#define FA_STR(x) FA_STR2(x)
  return FA_STR(FLASHATTN_VERSION_MAJOR) "." FA_STR(FLASHATTN_VERSION_MINOR) "." FA_STR(FLASHATTN_VERSION_PATCH);
}

const char* flashattn_status_string(flashattn_status status) {
  switch (status) {
    case FLASHATTN_SUCCESS: return "success";
    case FLASHATTN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FLASHATTN_ERROR_UNSUPPORTED: return "unsupported";
    case FLASHATTN_ERROR_BACKEND_UNAVAILABLE: return "backend unavailable";
    case FLASHATTN_ERROR_WORKSPACE_TOO_SMALL: return "workspace too small";
    case FLASHATTN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FLASHATTN_ERROR_DEVICE: return "device error";
    case FLASHATTN_ERROR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

const char* flashattn_last_error(void) { return last_error.c_str(); }

int flashattn_backend_available(flashattn_backend backend) {
  switch (backend) {
    case FLASHATTN_BACKEND_AUTO:
    case FLASHATTN_BACKEND_CPU: return cpu_backend().available();
    case FLASHATTN_BACKEND_CUDA:
#if defined(FLASHATTN_WITH_CUDA)
      return cuda_backend().available();
#else
      return 0;
#endif
  }
  return 0;
}

const char* flashattn_backend_name(flashattn_backend backend) {
  switch (backend) {
    case FLASHATTN_BACKEND_AUTO: return "auto";
    case FLASHATTN_BACKEND_CPU: return "cpu";
    case FLASHATTN_BACKEND_CUDA: return "cuda";
  }
  return "unknown";
}

flashattn_status flashattn_forward(const flashattn_tensor* q, const flashattn_tensor* k, const flashattn_tensor* v,
                                   flashattn_tensor* out, flashattn_tensor* lse, const flashattn_options* options) {
  return guarded([&] {
    Plan pl;
    FA_TRY(plan(forward_args(q, k, v, out, lse, options, false), &pl));
    return execute(pl);
  });
}

flashattn_status flashattn_backward(const flashattn_tensor* dout, const flashattn_tensor* q,
                                    const flashattn_tensor* k, const flashattn_tensor* v,
                                    const flashattn_tensor* out, const flashattn_tensor* lse, flashattn_tensor* dq,
                                    flashattn_tensor* dk, flashattn_tensor* dv, const flashattn_options* options) {
  return guarded([&] {
    Plan pl;
    FA_TRY(plan(backward_args(dout, q, k, v, out, lse, dq, dk, dv, options, false), &pl));
    return execute(pl);
  });
}

flashattn_status flashattn_forward_workspace_size(const flashattn_tensor* q, const flashattn_tensor* k,
                                                  const flashattn_tensor* v, const flashattn_tensor* out,
                                                  const flashattn_tensor* lse, const flashattn_options* options,
                                                  size_t* bytes) {
  return guarded([&] { return workspace_query(forward_args(q, k, v, out, lse, options, true), bytes); });
}

flashattn_status flashattn_backward_workspace_size(const flashattn_tensor* dout, const flashattn_tensor* q,
                                                   const flashattn_tensor* k, const flashattn_tensor* v,
                                                   const flashattn_tensor* out, const flashattn_tensor* lse,
                                                   const flashattn_tensor* dq, const flashattn_tensor* dk,
                                                   const flashattn_tensor* dv, const flashattn_options* options,
                                                   size_t* bytes) {
  return guarded(
      [&] { return workspace_query(backward_args(dout, q, k, v, out, lse, dq, dk, dv, options, true), bytes); });
}

flashattn_status flashattn_supports(flashattn_pass pass, const flashattn_tensor* q, const flashattn_tensor* k,
                                    const flashattn_tensor* v, const flashattn_options* options) {
  return guarded([&] {
    if (pass != FLASHATTN_PASS_FORWARD && pass != FLASHATTN_PASS_BACKWARD)
      return invalid("pass=", int(pass), " is not a known pass");
    CallArgs a = forward_args(q, k, v, nullptr, nullptr, options, true);
    a.pass = Pass(pass);
    Plan pl;
    return plan(a, &pl);
  });
}

flashattn_status flashattn_select_backend(flashattn_pass pass, const flashattn_tensor* q, const flashattn_tensor* k,
                                          const flashattn_tensor* v, const flashattn_options* options,
                                          flashattn_backend* chosen) {
  return guarded([&] {
    if (!chosen) return invalid("chosen is NULL");
    if (pass != FLASHATTN_PASS_FORWARD && pass != FLASHATTN_PASS_BACKWARD)
      return invalid("pass=", int(pass), " is not a known pass");
    CallArgs a = forward_args(q, k, v, nullptr, nullptr, options, true);
    a.pass = Pass(pass);
    Plan pl;
    FA_TRY(plan(a, &pl));
    *chosen = flashattn_backend(pl.ops->id);
    return Status::ok();
  });
}

}  // extern "C"

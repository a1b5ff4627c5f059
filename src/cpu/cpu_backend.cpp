// The CPU backend: runs everywhere, every feature, float32/float16/bfloat16 inputs with float32
// accumulation. All extra memory is the workspace: O(tile) per thread, plus in the forward a packed
// copy of one head's keys of at most 16 MiB per thread.
#include <cstdlib>

#include "core/backend.h"
#include "cpu/passes.h"

namespace flashattn::cpu {
namespace {

bool available() { return true; }

Status supports(const Params& p) {
  if (p.device != FLASHATTN_DEVICE_CPU) return unsupported("the cpu backend needs tensors in host memory");
  return Status::ok();
}

size_t workspace_bytes(const Params& p) {
  return p.pass == Pass::forward ? forward_workspace_bytes(p) : backward_workspace_bytes(p);
}

Status run(const Params& p) { return p.pass == Pass::forward ? forward(p) : backward(p); }

void* allocate(size_t bytes, const Params&) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
void release(void* ptr, const Params&) { std::free(ptr); }

}  // namespace
}  // namespace flashattn::cpu

namespace flashattn {

const BackendOps& cpu_backend() {
  static const BackendOps ops{Backend::cpu,         "cpu",           &cpu::available, &cpu::supports,
                              &cpu::workspace_bytes, &cpu::run,      &cpu::allocate,  &cpu::release};
  return ops;
}

}  // namespace flashattn

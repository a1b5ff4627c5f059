// What a backend offers the dispatcher. The same three functions answer "supported?", size the
// workspace and run, so the answers cannot disagree.
#pragma once

#include <cstddef>

#include "core/params.h"
#include "core/status.h"

namespace flashattn {

struct BackendOps {
  Backend id;
  const char* name;
  bool (*available)();                       // compiled in and a device present
  Status (*supports)(const Params&);         // UNSUPPORTED + message, or ok
  size_t (*workspace_bytes)(const Params&);  // extra memory the run needs, all of it
  Status (*run)(const Params&);              // params.workspace holds workspace_bytes()
  void* (*allocate)(size_t bytes, const Params&);  // workspace when the caller gave none
  void (*release)(void* ptr, const Params&);
};

const BackendOps& cpu_backend();
#if defined(FLASHATTN_WITH_CUDA)
const BackendOps& cuda_backend();
#endif

}  // namespace flashattn

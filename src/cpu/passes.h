#pragma once

#include <cstddef>

#include "core/params.h"
#include "core/status.h"

namespace flashattn::cpu {

size_t forward_workspace_bytes(const Params& p);
Status forward(const Params& p);  // p.workspace holds forward_workspace_bytes(p)

size_t backward_workspace_bytes(const Params& p);
Status backward(const Params& p);

}  // namespace flashattn::cpu

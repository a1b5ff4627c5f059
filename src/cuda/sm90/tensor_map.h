// Host side of TMA: tensor maps of [batch, rows, heads, dim] operands.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/params.h"
#include "core/status.h"

namespace flashattn::cuda::sm90 {

// Describes operand `o` of 16-bit elements, extent batch x rows x heads x dim, as a 4-D map read
// in boxes of 64 dim-columns x `box_rows` rows with 128-byte swizzle. Elements past an extent
// read as zeros.
Status make_tensor_map(CUtensorMap* map, const Operand& o, bool bf16, int64_t batch, int64_t rows, int64_t heads,
                       int64_t dim, int box_rows);

}  // namespace flashattn::cuda::sm90

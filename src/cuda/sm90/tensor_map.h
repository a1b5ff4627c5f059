// Host side of TMA: tensor maps of [batch, rows, heads, dim] operands and of fp32 accumulators.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "core/params.h"
#include "core/status.h"
#include "cuda/kernel_params.h"

namespace flashattn::cuda::sm90 {

// Describes operand `o` of 16-bit elements, extent batch x rows x heads x dim, as a 4-D map read
// in boxes of 64 dim-columns x `box_rows` rows with 128-byte swizzle. Elements past an extent
// read as zeros.
Status make_tensor_map(CUtensorMap* map, const Operand& o, bool bf16, int64_t batch, int64_t rows, int64_t heads,
                       int64_t dim, int box_rows);

// Which extents an operand of a call has: the queries' (q, out, dout) or the keys' (k, v).
enum class Side { queries, keys };

// make_tensor_map() for operand `o` of call `p`: its side's rows and heads, and for varlen calls
// one batch of the packed rows.
Status make_operand_map(CUtensorMap* map, const Operand& o, const KernelParams& p, Side side, bool bf16, int box_rows);

// Describes an fp32 accumulator of extent rows x heads x dim (dim contiguous, e.g. dq_accum with
// its copies as further rows) as a 3-D map written in boxes of 32 columns (128 bytes, 128-byte
// swizzle) x `box_rows` rows of one head. Parts of a box past an extent are dropped.
Status make_accumulator_map(CUtensorMap* map, float* data, int64_t rows, int64_t heads, int64_t dim, int box_rows);

}  // namespace flashattn::cuda::sm90

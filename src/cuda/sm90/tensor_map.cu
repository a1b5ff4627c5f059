#include "cuda/sm90/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <mutex>

namespace flashattn::cuda::sm90 {
namespace {

// cuTensorMapEncodeTiled through the runtime, so the library needs no link to libcuda.
PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &address, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(address);
    cudaGetLastError();
  });
  return fn;
}

}  // namespace

Status make_tensor_map(CUtensorMap* map, const Operand& o, bool bf16, int64_t batch, int64_t rows, int64_t heads,
                       int64_t dim, int box_rows) {
  const auto encode = encode_function();
  if (!encode) return make_status(FLASHATTN_ERROR_DEVICE, "cuTensorMapEncodeTiled is not available from the driver");
  // A stride is only ever multiplied by a zero index when its extent is 1; TMA still wants it a
  // positive multiple of 16 bytes, so such strides get one that is.
  const cuuint64_t row_bytes = cuuint64_t((dim * 2 + 15) / 16 * 16);
  auto stride = [&](int64_t elements, int64_t extent) {
    return extent > 1 ? cuuint64_t(elements * 2) : row_bytes;
  };
  // Extents must be positive; an empty one (no keys) is never read, so 1 stands in for it.
  const cuuint64_t dims[4] = {cuuint64_t(std::max<int64_t>(dim, 1)), cuuint64_t(std::max<int64_t>(rows, 1)),
                              cuuint64_t(std::max<int64_t>(heads, 1)), cuuint64_t(std::max<int64_t>(batch, 1))};
  const cuuint64_t strides[3] = {stride(o.row, rows), stride(o.head, heads), stride(o.batch, batch)};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, o.data,
                            dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return make_status(FLASHATTN_ERROR_DEVICE, "cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for a ", batch,
                       " x ", rows, " x ", heads, " x ", dim, " operand with strides ", o.batch, ", ", o.row, ", ",
                       o.head);
  return Status::ok();
}

Status make_operand_map(CUtensorMap* map, const Operand& o, const KernelParams& p, Side side, bool bf16, int box_rows) {
  const bool varlen = p.cu_seqlens_q != nullptr, keys = side == Side::keys;
  const int64_t rows = varlen ? (keys ? p.rows_k : p.rows_q) : (keys ? p.seqlen_k : p.seqlen_q);
  return make_tensor_map(map, o, bf16, varlen ? 1 : p.batch, rows, keys ? p.heads_kv : p.heads_q, p.head_dim,
                         box_rows);
}

Status make_accumulator_map(CUtensorMap* map, float* data, int64_t rows, int64_t heads, int64_t dim, int box_rows) {
  const auto encode = encode_function();
  if (!encode) return make_status(FLASHATTN_ERROR_DEVICE, "cuTensorMapEncodeTiled is not available from the driver");
  const cuuint64_t dims[3] = {cuuint64_t(std::max<int64_t>(dim, 1)), cuuint64_t(std::max<int64_t>(heads, 1)),
                              cuuint64_t(std::max<int64_t>(rows, 1))};
  const cuuint64_t strides[2] = {cuuint64_t(dim * 4), cuuint64_t(heads * dim * 4)};
  const cuuint32_t box[3] = {32, 1, cuuint32_t(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, data, dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return make_status(FLASHATTN_ERROR_DEVICE, "cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for a ", rows,
                       " x ", heads, " x ", dim, " fp32 accumulator");
  return Status::ok();
}

}  // namespace flashattn::cuda::sm90

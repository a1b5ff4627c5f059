#include "core/dtype.h"

namespace flashattn {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
  }
  return "unknown";
}

}  // namespace flashattn

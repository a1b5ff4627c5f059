// Tensor-core matrix multiply-accumulate, m16n8k16 with 16-bit inputs and fp32 accumulators.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4, t = lane % 4:
//   A 16x16 row-major: a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B 16x8 ("col"):    b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
//   C 16x8 fp32:       c[0..1] = (g, 2t..2t+1), c[2..3] = (g+8, 2t..2t+1)
// Each 32-bit register holds two 16-bit values, the lower column (or k) in the low half.
#pragma once

#include <cstdint>

#include "cuda/common/numeric.cuh"

namespace flashattn::cuda {

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<fp16>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_16816<bf16>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two adjacent 16x8 accumulator tiles (columns 0..7 and 8..15 of a 16x16 block) as the A
// fragment of the next product: the C layout of a lane is exactly its A layout, so no shuffles.
template <typename T>
__device__ __forceinline__ void accumulators_to_a(const float (&lo)[4], const float (&hi)[4], uint32_t (&a)[4]) {
  a[0] = pack2<T>(lo[0], lo[1]);
  a[1] = pack2<T>(lo[2], lo[3]);
  a[2] = pack2<T>(hi[0], hi[1]);
  a[3] = pack2<T>(hi[2], hi[3]);
}

}  // namespace flashattn::cuda

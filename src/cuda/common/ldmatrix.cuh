// ldmatrix: a warp loads four 8x8 matrices of 16-bit values from shared memory into fragments.
// Lanes 8i..8i+7 give the row addresses (16 bytes each) of matrix i; register i of a lane then
// holds (row lane/4, columns 2(lane%4), +1) of matrix i, or of its transpose with `.trans`.
//
// The *_address helpers give each lane's row address for the three operand shapes the kernels
// use, on a row-major shared tile (see smem.cuh); (row0, col0) is the top-left of the 16x16 block.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// Element (row, col) a lane points at for each ldmatrix_x4 use.
struct LaneCoord {
  int row, col;
};

// A operand 16x16 from a row-major [m][k] tile (non-trans): r = a[0..3].
__device__ __forceinline__ LaneCoord a_operand_lane(int lane) { return {lane % 16, (lane / 16) * 8}; }

// B operands of two adjacent n8 tiles from an [n][k] tile (non-trans): r[0..1] = b of n 0..7,
// r[2..3] = b of n 8..15.
__device__ __forceinline__ LaneCoord b_operand_nk_lane(int lane) {
  return {lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8};
}

// B operands of two adjacent n8 tiles from a [k][n] tile (.trans): r[0..1] = b of n 0..7,
// r[2..3] = b of n 8..15. (row = k, col = n)
__device__ __forceinline__ LaneCoord b_operand_kn_lane(int lane) {
  return {lane % 8 + ((lane / 8) % 2) * 8, (lane / 16) * 8};
}

// A operand 16x16 from a [k][m] tile (.trans), i.e. the transpose of what is stored. (row = k, col = m)
__device__ __forceinline__ LaneCoord a_operand_km_lane(int lane) {
  return {lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8};
}

}  // namespace flashattn::cuda

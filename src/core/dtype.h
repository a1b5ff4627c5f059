// Host-side conversions between float and the 16-bit storage types (IEEE binary16, bfloat16),
// round-to-nearest-even, without depending on compiler extensions.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/params.h"

namespace flashattn {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (mant << 13));
  if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  // subnormal: mant * 2^-24
  const float mag = float(mant) * (1.0f / 16777216.0f);
  return sign ? -mag : mag;
}
inline uint16_t float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return uint16_t(sign | 0x7E00u);        // NaN
  if (abs >= 0x477FF000u) return uint16_t(sign | 0x7C00u);       // rounds to inf
  if (abs < 0x38800000u) {                                        // subnormal or zero in f16
    const float mag = bits_float(abs) * 16777216.0f;             // exact scaling by 2^24
    uint32_t m = uint32_t(mag);
    const float rest = mag - float(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return uint16_t(sign | m);
  }
  const uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

template <DType T> struct Storage;
template <> struct Storage<DType::f32> {
  using type = float;
  static float load(float x) { return x; }
  static float store(float x) { return x; }
};
template <> struct Storage<DType::f16> {
  using type = uint16_t;
  static float load(uint16_t x) { return f16_to_float(x); }
  static uint16_t store(float x) { return float_to_f16(x); }
};
template <> struct Storage<DType::bf16> {
  using type = uint16_t;
  static float load(uint16_t x) { return bf16_to_float(x); }
  static uint16_t store(float x) { return float_to_bf16(x); }
};

inline size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
const char* dtype_name(DType t);

// Reads/writes one element of any floating dtype through a type-erased pointer (tests, oracle).
inline float load_element(const void* base, DType t, int64_t index) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[index];
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
  return 0.f;
}
inline void store_element(void* base, DType t, int64_t index, float value) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[index] = value; break;
    case DType::f16: static_cast<uint16_t*>(base)[index] = float_to_f16(value); break;
    case DType::bf16: static_cast<uint16_t*>(base)[index] = float_to_bf16(value); break;
  }
}

}  // namespace flashattn

// float <-> float16 / bfloat16 conversions of core/dtype.h: every 16-bit pattern decoded, and
// encoding against an independent round-to-nearest-even written with double arithmetic, on the
// hard cases (midpoints between representable values, subnormals, overflow, NaN) and a wide
// sample of all float bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"

using namespace flashattn;

namespace {

struct Format {
  const char* name;
  int fraction_bits;  // stored mantissa bits
  int min_exponent;   // exponent of the smallest normal
  int bias;
  int exponent_bits;
  double max_finite;
  float (*decode)(uint16_t);
  uint16_t (*encode)(float);
};

const Format kHalf{"float16", 10, -14, 15, 5, 65504.0, &f16_to_float, &float_to_f16};
const Format kBfloat{"bfloat16", 7, -126, 127, 8, double(std::numeric_limits<float>::max()), &bf16_to_float,
                     &float_to_bf16};

// The value of a bit pattern from the IEEE formula.
double decode_reference(const Format& f, uint16_t bits) {
  const int sign = bits >> 15;
  const int exp = (bits >> f.fraction_bits) & ((1 << f.exponent_bits) - 1);
  const int frac = bits & ((1 << f.fraction_bits) - 1);
  double mag;
  if (exp == (1 << f.exponent_bits) - 1) mag = frac ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else if (exp == 0) mag = std::ldexp(double(frac), f.min_exponent - f.fraction_bits);
  else mag = std::ldexp(1.0 + std::ldexp(double(frac), -f.fraction_bits), exp - f.bias);
  return sign ? -mag : mag;
}

// The nearest representable value, ties to even; beyond the largest finite value, infinity.
double round_reference(const Format& f, double x) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const int e = std::max(std::ilogb(x), f.min_exponent);
  const double quantum = std::ldexp(1.0, e - f.fraction_bits);
  const double r = std::nearbyint(x / quantum) * quantum;  // default rounding mode: ties to even
  return std::abs(r) > f.max_finite ? std::copysign(INFINITY, x) : r;
}

// Same value (and sign of zero), or both NaN.
bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

void expect_encodes(const Format& f, float x) {
  const double expected = round_reference(f, x);
  const uint16_t bits = f.encode(x);
  ASSERT_TRUE(same(f.decode(bits), expected))
      << f.name << ": encode(" << x << ", bits 0x" << std::hex << float_bits(x) << ") = 0x" << bits << std::dec
      << " = " << f.decode(bits) << ", expected " << expected;
}

void check_decoding(const Format& f) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const double expected = decode_reference(f, uint16_t(h));
    ASSERT_TRUE(same(f.decode(uint16_t(h)), expected)) << f.name << " 0x" << std::hex << h;
    if (!std::isnan(expected)) {
      ASSERT_EQ(f.encode(f.decode(uint16_t(h))), h) << f.name << " round trip 0x" << std::hex << h;
    }
  }
}

// Midpoints between neighbours and the floats right next to them decide ties and carries.
void check_midpoints(const Format& f) {
  for (uint32_t h = 0; h < 0x7FFF; ++h) {
    const double lo = decode_reference(f, uint16_t(h)), hi = decode_reference(f, uint16_t(h + 1));
    if (std::isnan(lo) || std::isinf(lo)) continue;
    const double upper = std::isinf(hi) ? lo + (lo - decode_reference(f, uint16_t(h - 1))) : hi;
    const float mid = float((lo + upper) / 2);  // exact: fewer mantissa bits than float
    for (float x : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)}) {
      expect_encodes(f, x);
      expect_encodes(f, -x);
    }
  }
}

void check_sampled_floats(const Format& f) {
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 509) expect_encodes(f, bits_float(uint32_t(u)));
}

}  // namespace

TEST(Float16, DecodesEveryBitPatternAndRoundTrips) { check_decoding(kHalf); }
TEST(Float16, RoundsMidpointsToEven) { check_midpoints(kHalf); }
TEST(Float16, EncodesSampledFloats) { check_sampled_floats(kHalf); }
TEST(Float16, KnownValues) {
  EXPECT_EQ(float_to_f16(1.f), 0x3C00);
  EXPECT_EQ(float_to_f16(-2.f), 0xC000);
  EXPECT_EQ(float_to_f16(65504.f), 0x7BFF);
  EXPECT_EQ(float_to_f16(65519.f), 0x7BFF);   // below the midpoint to 65536
  EXPECT_EQ(float_to_f16(65520.f), 0x7C00);   // the midpoint rounds to even: infinity
  EXPECT_EQ(float_to_f16(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_f16(-INFINITY), 0xFC00);
  EXPECT_EQ(float_to_f16(std::ldexp(1.f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(std::ldexp(1.f, -25)), 0x0000);  // half of it ties to even zero
  EXPECT_EQ(float_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_f16(std::ldexp(1.f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_f16(-0.f), 0x8000);
  EXPECT_EQ(float_to_f16(1.f + std::ldexp(1.f, -11)), 0x3C00);  // tie: down to even
  EXPECT_EQ(float_to_f16(1.f + 3 * std::ldexp(1.f, -11)), 0x3C02);  // tie: up to even
  const uint16_t nan = float_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(f16_to_float(nan)));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(bits_float(0x7F800001u)))));  // signalling NaN stays NaN
}

TEST(Bfloat16, DecodesEveryBitPatternAndRoundTrips) { check_decoding(kBfloat); }
TEST(Bfloat16, RoundsMidpointsToEven) { check_midpoints(kBfloat); }
TEST(Bfloat16, EncodesSampledFloats) { check_sampled_floats(kBfloat); }
TEST(Bfloat16, KnownValues) {
  EXPECT_EQ(float_to_bf16(1.f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-2.f), 0xC000);
  EXPECT_EQ(float_to_bf16(bits_float(0x3F808000u)), 0x3F80);  // tie: down to even
  EXPECT_EQ(float_to_bf16(bits_float(0x3F818000u)), 0x3F82);  // tie: up to even
  EXPECT_EQ(float_to_bf16(bits_float(0x3F808001u)), 0x3F81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the largest bfloat16
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(float_to_bf16(bits_float(0x00000001u)), 0x0000);  // float subnormals keep bfloat16's exponent
  EXPECT_EQ(float_to_bf16(bits_float(0x00018000u)), 0x0002);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_float(0x7F800001u)))));  // not turned into inf
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_float(0xFFFFFFFFu)))));
}

TEST(StorageElements, LoadAndStoreRoundTheValue) {
  uint16_t h[1];
  store_element(h, DType::f16, 0, 0.1f);
  EXPECT_EQ(load_element(h, DType::f16, 0), f16_to_float(float_to_f16(0.1f)));
  store_element(h, DType::bf16, 0, 0.1f);
  EXPECT_EQ(load_element(h, DType::bf16, 0), bf16_to_float(float_to_bf16(0.1f)));
  float f[1];
  store_element(f, DType::f32, 0, 0.1f);
  EXPECT_EQ(load_element(f, DType::f32, 0), 0.1f);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
}

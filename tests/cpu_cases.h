// The sweep the CPU backend runs: every feature case and a random mix, in each dtype.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/sweep.h"

namespace flashattn::test {

// The CPU backend serves every head dim up to 256; these cover tiny, odd and the largest.
inline const std::vector<int>& cpu_head_dims() {
  static const std::vector<int> dims{32, 1, 8, 40, 64, 100, 128, 256};
  return dims;
}

inline std::vector<NamedCase> cpu_sweep(flashattn_dtype dtype) {
  std::vector<NamedCase> cases = feature_sweep(dtype, cpu_head_dims());
  for (NamedCase& c : random_sweep(dtype, cpu_head_dims(), 24, 7 + uint64_t(dtype))) cases.push_back(std::move(c));
  for (NamedCase& c : cases) c.spec.backend = FLASHATTN_BACKEND_CPU;
  return cases;
}

inline std::string case_name(const ::testing::TestParamInfo<NamedCase>& info) { return info.param.name; }

}  // namespace flashattn::test

#define FLASHATTN_INSTANTIATE_CPU_SWEEP(Suite)                                                                   \
  INSTANTIATE_TEST_SUITE_P(Float32, Suite, ::testing::ValuesIn(::flashattn::test::cpu_sweep(FLASHATTN_DTYPE_FLOAT32)), \
                           ::flashattn::test::case_name);                                                        \
  INSTANTIATE_TEST_SUITE_P(Float16, Suite, ::testing::ValuesIn(::flashattn::test::cpu_sweep(FLASHATTN_DTYPE_FLOAT16)), \
                           ::flashattn::test::case_name);                                                        \
  INSTANTIATE_TEST_SUITE_P(Bfloat16, Suite,                                                                     \
                           ::testing::ValuesIn(::flashattn::test::cpu_sweep(FLASHATTN_DTYPE_BFLOAT16)),         \
                           ::flashattn::test::case_name)

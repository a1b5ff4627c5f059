// The problems every backend is checked on against the oracle: odd shapes (lengths 1, 17, 1000,
// not multiples of any tile, more and fewer queries than keys) crossed with every feature, and a
// seeded random mix of them. A backend's tests filter the list to what it supports.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "support/attention_case.h"

namespace flashattn::test {

struct NamedCase {
  std::string name;  // a valid test name: letters, digits and underscores
  Case spec;
};
inline void PrintTo(const NamedCase& c, std::ostream* os) { *os << c.name << ": " << c.spec.describe(); }

// One case per feature and shape, in `dtype`, with head dims from `head_dims` (the first is the
// default; cases about head dims use all of them).
std::vector<NamedCase> feature_sweep(flashattn_dtype dtype, const std::vector<int>& head_dims);
// `count` cases mixing shapes and features at random, reproducible from `seed`.
std::vector<NamedCase> random_sweep(flashattn_dtype dtype, const std::vector<int>& head_dims, int count,
                                    uint64_t seed);

}  // namespace flashattn::test

// The CPU forward against the float64 oracle with the 2x-naive criterion over the sweep, with
// poisoned outputs; fully masked rows, the dropout keep mask, and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/semantics.h"
#include "cpu_cases.h"
#include "reference/naive.h"
#include "support/compare.h"

using namespace flashattn;
using namespace flashattn::test;

class CpuForward : public ::testing::TestWithParam<NamedCase> {};

TEST_P(CpuForward, MatchesOracleAndWritesEveryOutput) {
  const Case& c = GetParam().spec;
  CaseData data(c);
  ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << flashattn_last_error() << "\n" << c.describe();
  const Params p = data.params(Pass::forward);
  Check check = check_written(data, Pass::forward);
  check += check_forward(data, p, reference::forward(p), reference::naive_forward(p));
  EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
}

FLASHATTN_INSTANTIATE_CPU_SWEEP(CpuForward);

namespace {

Case masked_rows_case(flashattn_dtype dtype) {
  Case c;
  c.dtype = dtype;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.seqlen_q = 150;
  c.seqlen_k = 40;
  c.head_dim = 24;
  c.causal = true;  // rows 0..109 sit before the first key
  c.alibi = Alibi::per_head;
  c.softcap = 5.f;
  c.dropout_p = 0.2f;
  return c;
}

}  // namespace

TEST(CpuForwardMaskedRows, GiveZeroOutputAndMinusInfinityLse) {
  for (flashattn_dtype dtype : {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16}) {
    const Case c = masked_rows_case(dtype);
    CaseData data(c);
    ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 4; ++h)
        for (int i = 0; i < 150; ++i) {
          const float lse = data.lse.at({b, h, i});
          ASSERT_FALSE(std::isnan(lse)) << c.describe() << " b=" << b << " h=" << h << " i=" << i;
          if (i >= 110) {
            ASSERT_TRUE(std::isfinite(lse)) << c.describe() << " b=" << b << " h=" << h << " i=" << i;
            continue;
          }
          ASSERT_EQ(lse, -std::numeric_limits<float>::infinity()) << c.describe() << " b=" << b << " h=" << h << " i=" << i;
          for (int x = 0; x < 24; ++x)
            ASSERT_EQ(data.out.at({b, i, h, x}), 0.f) << c.describe() << " b=" << b << " h=" << h << " i=" << i << " x=" << x;
        }
  }
}

// With v[j] = e_j, out[i][j] is P~_ij itself: zero exactly where the shared Philox decision drops.
TEST(CpuForwardDropout, DrawsTheSameKeepMaskAsTheSemantics) {
  Case c;
  c.batch = 2;
  c.heads_q = 3;
  c.heads_kv = 1;
  c.seqlen_q = 70;
  c.seqlen_k = 130;
  c.head_dim = 16;
  c.head_dim_v = 130;
  c.dropout_p = 0.4f;
  c.dropout_seed = 0xDEADBEEFCAFEull;
  c.dropout_offset = 12345;
  CaseData data(c);
  data.v.fill(0.f);
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 130; ++j) data.v.set({b, j, 0, j}, 1.f);
  ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
  const auto drop = semantics::Dropout::make(c.dropout_p, c.dropout_seed, c.dropout_offset);
  int64_t kept = 0;
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 3; ++h)
      for (int i = 0; i < 70; ++i)
        for (int j = 0; j < 130; ++j) {
          const bool keep = drop.keep(b * 3 + h, i, j);
          kept += keep;
          ASSERT_EQ(data.out.at({b, i, h, j}) != 0.f, keep) << "b=" << b << " h=" << h << " i=" << i << " j=" << j;
        }
  EXPECT_NEAR(double(kept) / (2 * 3 * 70 * 130), 0.6, 0.01);
}

TEST(CpuForwardDeterminism, RepeatedRunsAndThreadCountsAreBitIdentical) {
  for (flashattn_dtype dtype : {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_BFLOAT16}) {
    Case c = masked_rows_case(dtype);
    c.seqlen_k = 300;
    c.num_threads = 2;
    CaseData two(c);
    ASSERT_EQ(two.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    const auto out = two.out.bytes(), lse = two.lse.bytes();
    two.poison_forward_outputs();
    ASSERT_EQ(two.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_EQ(two.out.bytes(), out) << "second run differs: " << c.describe();
    EXPECT_EQ(two.lse.bytes(), lse) << "second run differs: " << c.describe();
    c.num_threads = 1;
    CaseData one(c);
    ASSERT_EQ(one.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_EQ(one.out.bytes(), out) << "1 thread differs from 2: " << c.describe();
    EXPECT_EQ(one.lse.bytes(), lse) << "1 thread differs from 2: " << c.describe();
  }
}

TEST(CpuForwardLse, IsOptionalAndDoesNotChangeTheOutput) {
  Case c;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 1;
  c.seqlen_q = 100;
  c.seqlen_k = 150;
  c.head_dim = 40;
  c.causal = true;
  CaseData with_lse(c), without(c);
  ASSERT_EQ(with_lse.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
  ASSERT_EQ(flashattn_forward(without.q.desc(), without.k.desc(), without.v.desc(), without.out.desc(), nullptr,
                              &without.options),
            FLASHATTN_SUCCESS)
      << flashattn_last_error();
  EXPECT_TRUE(with_lse.out.bytes() == without.out.bytes());
}

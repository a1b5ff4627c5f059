// The CPU backward against the float64 oracle with the 2x-naive criterion over the sweep, with
// poisoned gradients; fully masked rows and unseen keys, and determinism.
#include <gtest/gtest.h>

#include <cmath>

#include "core/semantics.h"
#include "cpu_cases.h"
#include "reference/naive.h"
#include "support/compare.h"

using namespace flashattn;
using namespace flashattn::test;

class CpuBackward : public ::testing::TestWithParam<NamedCase> {};

// Forward and backward of `data`'s case, then every gradient written and within the criterion.
static void expect_backward_matches_oracle(CaseData& data) {
  const Case& c = data.spec;
  ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << flashattn_last_error() << "\n" << c.describe();
  ASSERT_EQ(data.backward(), FLASHATTN_SUCCESS) << flashattn_last_error() << "\n" << c.describe();
  const Params p = data.params(Pass::backward);
  Check check = check_written(data, Pass::backward);
  check += check_backward(data, p, reference::backward(p), reference::naive_backward(p));
  EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
}

TEST_P(CpuBackward, MatchesOracleAndWritesEveryGradient) {
  CaseData data(GetParam().spec);
  expect_backward_matches_oracle(data);
}

FLASHATTN_INSTANTIATE_CPU_SWEEP(CpuBackward);

namespace {

// Every feature on, and keys that no query sees.
Case masked_case(flashattn_dtype dtype) {
  Case c;
  c.dtype = dtype;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.seqlen_q = 100;
  c.seqlen_k = 130;
  c.head_dim = 24;
  c.window_left = 3;
  c.window_right = -1;  // row i sees keys i + 27 .. 129: keys 0..26 are seen by nobody
  c.softcap = 5.f;
  c.alibi = Alibi::per_head;
  c.dropout_p = 0.2f;
  return c;
}

}  // namespace

TEST(CpuBackwardMaskedRows, GradientsAreFiniteAndZeroWhereNothingIsSeen) {
  for (flashattn_dtype dtype : {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16}) {
    // Fully masked query rows: causal with more queries than keys.
    Case rows = masked_case(dtype);
    rows.window_left = -1;
    rows.causal = true;
    rows.seqlen_k = 30;  // rows 0..69 see nothing
    CaseData r(rows);
    ASSERT_EQ(r.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(r.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    for (const std::vector<double>& grad : {r.dq.values(), r.dk.values(), r.dv.values()})
      for (double g : grad) ASSERT_TRUE(std::isfinite(g)) << rows.describe();
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 4; ++h)
        for (int i = 0; i < 70; ++i)
          for (int x = 0; x < 24; ++x)
            ASSERT_EQ(r.dq.at({b, i, h, x}), 0.f) << rows.describe() << " b=" << b << " i=" << i << " h=" << h;

    // Keys no query sees.
    const Case keys = masked_case(dtype);
    CaseData k(keys);
    ASSERT_EQ(k.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(k.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    for (int b = 0; b < 2; ++b)
      for (int hk = 0; hk < 2; ++hk)
        for (int j = 0; j < 27; ++j)
          for (int x = 0; x < 24; ++x) {
            ASSERT_EQ(k.dk.at({b, j, hk, x}), 0.f) << keys.describe() << " b=" << b << " j=" << j << " hk=" << hk;
            ASSERT_EQ(k.dv.at({b, j, hk, x}), 0.f) << keys.describe() << " b=" << b << " j=" << j << " hk=" << hk;
          }
  }
}

TEST(CpuBackwardDeterminism, RepeatedRunsAndThreadCountsAreBitIdentical) {
  for (flashattn_dtype dtype : {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_FLOAT16}) {
    Case c = masked_case(dtype);
    c.num_threads = 2;
    CaseData two(c);
    ASSERT_EQ(two.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(two.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    const auto dq = two.dq.bytes(), dk = two.dk.bytes(), dv = two.dv.bytes();
    two.poison_gradients();
    ASSERT_EQ(two.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_TRUE(two.dq.bytes() == dq && two.dk.bytes() == dk && two.dv.bytes() == dv)
        << "second run differs: " << c.describe();
    c.num_threads = 1;
    CaseData one(c);
    ASSERT_EQ(one.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(one.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    EXPECT_TRUE(one.dq.bytes() == dq && one.dk.bytes() == dk && one.dv.bytes() == dv)
        << "1 thread differs from 2: " << c.describe();
  }
}

// With dO zero except row r (all ones there), dV[j] = P~_rj: zero exactly where the backward's
// redrawn keep decision drops (b, h, r, j), so the redraw must match the shared Philox mask.
TEST(CpuBackwardDropout, RedrawsTheSameKeepMask) {
  Case c;
  c.batch = 2;
  c.heads_q = c.heads_kv = 3;
  c.seqlen_q = 4;
  c.seqlen_k = 200;
  c.head_dim = 8;
  c.dropout_p = 0.5f;
  c.dropout_seed = 0xFEEDull << 32 | 77;
  c.dropout_offset = 9;
  const auto drop = semantics::Dropout::make(c.dropout_p, c.dropout_seed, c.dropout_offset);
  for (int r : {0, 3}) {
    CaseData data(c);
    data.dout.fill(0.f);
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 3; ++h)
        for (int x = 0; x < 8; ++x) data.dout.set({b, r, h, x}, 1.f);
    ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(data.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 3; ++h)
        for (int j = 0; j < 200; ++j)
          ASSERT_EQ(data.dv.at({b, j, h, 0}) != 0.f, drop.keep(b * 3 + h, r, j))
              << "b=" << b << " h=" << h << " row=" << r << " j=" << j;
  }
}

// Problems with at least 8 (batch, kv head) groups take the single-pass backward (dQ accumulated
// in float32: the output itself, or a per-thread buffer for 16-bit gradients); the others the
// two-pass one. Against the oracle in every dtype, in dense and varlen form with every feature,
// and bit-identical for 1 and 2 threads.
TEST(CpuBackwardSinglePass, ManyGroupsMatchOracle) {
  Case dense;
  dense.batch = 2;
  dense.heads_q = 8;
  dense.heads_kv = 4;  // 8 groups
  dense.seqlen_q = 150;
  dense.seqlen_k = 211;
  dense.head_dim = 40;
  dense.causal = true;
  dense.softcap = 4.f;
  dense.alibi = Alibi::per_batch_head;
  dense.dropout_p = 0.15f;
  dense.dropout_seed = 9;
  Case varlen = dense;
  varlen.seqlens_q = {0, 17, 130, 1, 64, 3, 200, 9};  // 8 sequences x 4 kv heads: 32 groups
  varlen.seqlens_k = {5, 0, 97, 64, 64, 300, 1, 9};
  varlen.layout = Layout::bhsd;
  for (const flashattn_dtype dtype : {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_BFLOAT16, FLASHATTN_DTYPE_FLOAT16}) {
    for (Case c : {dense, varlen}) {
      c.dtype = dtype;
      CaseData data(c);
      expect_backward_matches_oracle(data);

      Case one_thread = c;
      one_thread.num_threads = 1;
      CaseData serial(one_thread);
      ASSERT_EQ(serial.forward(), FLASHATTN_SUCCESS);
      ASSERT_EQ(serial.backward(), FLASHATTN_SUCCESS);
      EXPECT_EQ(serial.dq.bytes(), data.dq.bytes()) << "dq differs between 1 and default threads";
      EXPECT_EQ(serial.dk.bytes(), data.dk.bytes());
    }
  }
}

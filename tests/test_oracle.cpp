// The float64 oracle against closed forms on tiny inputs, and its gradients against float64
// central finite differences of sum(out * dout) for every feature; the naive same-dtype
// reference against the oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/semantics.h"
#include "reference/naive.h"
#include "reference/oracle.h"
#include "support/attention_case.h"
#include "support/compare.h"

using namespace flashattn;
using namespace flashattn::test;

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

reference::Result oracle_forward(const CaseData& d) { return reference::forward(d.params(Pass::forward)); }

// Packed index of element x of (query row, head) in an out-like result.
size_t out_index(const Case& c, int64_t row, int h, int x) { return size_t((row * c.heads_q + h) * c.value_dim() + x); }
size_t lse_index(const Case& c, int64_t row, int h) { return size_t(row * c.heads_q + h); }

Case tiny_case(int sq, int sk, int d) {
  Case c;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.head_dim = d;
  return c;
}

}  // namespace

TEST(OracleClosedForm, SingleKeyGivesItsValue) {
  Case c = tiny_case(5, 1, 8);
  c.batch = 2;
  c.heads_q = 2;
  c.heads_kv = 2;
  CaseData data(c);
  const auto r = oracle_forward(data);
  const double scale = double(float(1 / std::sqrt(8.0)));  // the softmax scale is a float32
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 5; ++i)
      for (int h = 0; h < 2; ++h) {
        double dot = 0;
        for (int x = 0; x < 8; ++x) {
          EXPECT_DOUBLE_EQ(r.out[out_index(c, b * 5 + i, h, x)], data.v.at({b, 0, h, x}));
          dot += double(data.q.at({b, i, h, x})) * data.k.at({b, 0, h, x});
        }
        EXPECT_NEAR(r.lse[lse_index(c, b * 5 + i, h)], scale * dot, 1e-12);
      }
}

TEST(OracleClosedForm, UniformScoresAverageTheVisibleValues) {
  Case c = tiny_case(6, 9, 4);
  c.window_left = 2;
  c.window_right = 1;
  CaseData data(c);
  data.q.fill(0.f);
  const auto r = oracle_forward(data);
  const semantics::Window w{2, 1, 6, 9};
  for (int i = 0; i < 6; ++i) {
    const int64_t first = w.first_key(i), last = w.last_key(i);
    ASSERT_LE(first, last);
    EXPECT_NEAR(r.lse[lse_index(c, i, 0)], std::log(double(last - first + 1)), 1e-12) << "i=" << i;
    for (int x = 0; x < 4; ++x) {
      double mean = 0;
      for (int64_t j = first; j <= last; ++j) mean += data.v.at({0, j, 0, x});
      mean /= double(last - first + 1);
      EXPECT_NEAR(r.out[out_index(c, i, 0, x)], mean, 1e-12) << "i=" << i << " x=" << x;
    }
  }
}

TEST(OracleClosedForm, LseAndWeightsOfKnownScores) {
  Case c = tiny_case(1, 2, 1);
  c.softmax_scale = 1.f;
  CaseData data(c);
  data.q.set({0, 0, 0, 0}, 2.f);
  data.k.set({0, 0, 0, 0}, 0.5f);  // score 1
  data.k.set({0, 1, 0, 0}, 1.f);   // score 2
  data.v.set({0, 0, 0, 0}, 3.f);
  data.v.set({0, 1, 0, 0}, -1.f);
  const auto r = oracle_forward(data);
  const double e1 = std::exp(1.0), e2 = std::exp(2.0);
  EXPECT_NEAR(r.lse[0], std::log(e1 + e2), 1e-14);
  EXPECT_NEAR(r.out[0], (3 * e1 - e2) / (e1 + e2), 1e-14);
}

TEST(OracleClosedForm, SoftcapBoundsTheScores) {
  Case c = tiny_case(1, 2, 1);
  c.softmax_scale = 1.f;
  c.softcap = 2.f;
  CaseData data(c);
  data.q.set({0, 0, 0, 0}, 3.f);
  data.k.set({0, 0, 0, 0}, 1.f);
  data.k.set({0, 1, 0, 0}, 2.f);
  const auto r = oracle_forward(data);
  const double s0 = 2 * std::tanh(1.5), s1 = 2 * std::tanh(3.0);
  EXPECT_NEAR(r.lse[0], std::log(std::exp(s0) + std::exp(s1)), 1e-14);
}

TEST(OracleClosedForm, AlibiWeightsDecayWithDistance) {
  Case c = tiny_case(2, 5, 3);
  c.alibi = Alibi::per_head;  // one head: slope 2^-8
  c.softmax_scale = 1.f;
  CaseData data(c);
  data.q.fill(0.f);
  const auto r = oracle_forward(data);
  const double slope = std::exp2(-8.0);
  for (int i = 0; i < 2; ++i) {
    const int diag = i + 3;
    double sum = 0, weighted[3] = {0, 0, 0};
    for (int j = 0; j < 5; ++j) {
      const double w = std::exp(-slope * std::abs(diag - j));
      sum += w;
      for (int x = 0; x < 3; ++x) weighted[x] += w * data.v.at({0, j, 0, x});
    }
    EXPECT_NEAR(r.lse[lse_index(c, i, 0)], std::log(sum), 1e-13);
    for (int x = 0; x < 3; ++x) EXPECT_NEAR(r.out[out_index(c, i, 0, x)], weighted[x] / sum, 1e-13);
  }
}

TEST(OracleClosedForm, DropoutScalesTheKeptWeights) {
  Case c = tiny_case(3, 40, 2);
  c.batch = 2;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.dropout_p = 0.25f;
  c.dropout_seed = 99;
  c.dropout_offset = 5;
  CaseData data(c);
  data.q.fill(0.f);  // uniform probabilities 1/40
  const auto r = oracle_forward(data);
  const auto drop = semantics::Dropout::make(0.25f, 99, 5);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 3; ++i)
        for (int x = 0; x < 2; ++x) {
          double expected = 0;
          for (int j = 0; j < 40; ++j)
            if (drop.keep(b * 2 + h, i, j)) expected += data.v.at({b, j, 0, x}) / 40.0 / 0.75;
          EXPECT_NEAR(r.out[out_index(c, b * 3 + i, h, x)], expected, 1e-13) << "b=" << b << " h=" << h << " i=" << i;
        }
}

TEST(OracleClosedForm, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  Case c = tiny_case(5, 2, 3);
  c.causal = true;  // rows 0..2 sit before key 0
  CaseData data(c);
  const auto r = reference::backward(data.params(Pass::backward));
  for (int i = 0; i < 5; ++i) {
    const bool masked = i < 3;
    EXPECT_EQ(r.lse[lse_index(c, i, 0)] == kNegInf, masked) << "i=" << i;
    for (int x = 0; x < 3; ++x) {
      EXPECT_FALSE(std::isnan(r.out[out_index(c, i, 0, x)]));
      if (!masked) continue;
      EXPECT_EQ(r.out[out_index(c, i, 0, x)], 0.0) << "i=" << i;
      EXPECT_EQ(r.dq[size_t(i * 3 + x)], 0.0) << "i=" << i;
    }
  }
}

TEST(OracleClosedForm, EmptySequencesOfAVariableLengthBatch) {
  Case c;
  c.head_dim = 4;
  c.seqlens_q = {2, 0, 3};
  c.seqlens_k = {3, 2, 0};
  CaseData data(c);
  const auto r = reference::backward(data.params(Pass::backward));
  for (int row = 2; row < 5; ++row) {  // sequence 2 has no key
    EXPECT_EQ(r.lse[lse_index(c, row, 0)], kNegInf);
    for (int x = 0; x < 4; ++x) EXPECT_EQ(r.out[out_index(c, row, 0, x)], 0.0);
  }
  for (int row = 3; row < 5; ++row)  // sequence 1's keys have no query
    for (int x = 0; x < 4; ++x) EXPECT_EQ(r.dk[size_t(row * 4 + x)], 0.0);
  EXPECT_TRUE(std::isfinite(r.lse[0]));
}

TEST(OracleClosedForm, GroupedQueryAttentionEqualsRepeatedKeysAndValues) {
  Case gqa = tiny_case(4, 6, 3);
  gqa.heads_q = 4;
  gqa.heads_kv = 2;
  gqa.causal = true;
  Case mha = gqa;
  mha.heads_kv = 4;
  CaseData g(gqa), m(mha);
  for (int h = 0; h < 4; ++h)
    for (int s = 0; s < 6; ++s)
      for (int x = 0; x < 3; ++x) {
        m.k.set({0, s, h, x}, g.k.at({0, s, h / 2, x}));
        m.v.set({0, s, h, x}, g.v.at({0, s, h / 2, x}));
        if (s < 4) m.q.set({0, s, h, x}, g.q.at({0, s, h, x}));
        if (s < 4) m.dout.set({0, s, h, x}, g.dout.at({0, s, h, x}));
      }
  const auto rg = reference::backward(g.params(Pass::backward));
  const auto rm = reference::backward(m.params(Pass::backward));
  EXPECT_EQ(rg.out, rm.out);
  EXPECT_EQ(rg.dq, rm.dq);
  for (int s = 0; s < 6; ++s)
    for (int hk = 0; hk < 2; ++hk)
      for (int x = 0; x < 3; ++x) {
        const double sum = rm.dk[size_t((s * 4 + 2 * hk) * 3 + x)] + rm.dk[size_t((s * 4 + 2 * hk + 1) * 3 + x)];
        EXPECT_NEAR(rg.dk[size_t((s * 2 + hk) * 3 + x)], sum, 1e-14);
      }
}

// Gradients against central differences, Richardson-extrapolated: D(h) = (f(x+h) - f(x-h)) / 2h,
// (4 D(h/2) - D(h)) / 3 has error O(h^4). Inputs are multiples of 2^-10, so x +- h is exact in
// float32 and f is evaluated in float64 on exactly the perturbed inputs.
class OracleGradient : public ::testing::TestWithParam<Case> {
 protected:
  static void quantize(HostTensor& t) {
    t.for_each([&](const std::vector<int64_t>& idx, int64_t) { t.set(idx, std::round(t.at(idx) * 1024.f) / 1024.f); });
  }
  static double objective(const CaseData& d, const Params& p) {
    const auto r = reference::forward(p);
    const std::vector<double> dout = packed_values(d.dout);
    double f = 0;
    for (size_t n = 0; n < dout.size(); ++n) f += r.out[n] * dout[n];
    return f;
  }
  static std::vector<double> numeric_gradient(CaseData& d, HostTensor& t, const Params& p) {
    std::vector<double> grad;
    const double h = std::ldexp(1.0, -7);
    t.for_each([&](const std::vector<int64_t>& idx, int64_t) {
      const float x = t.at(idx);
      auto central = [&](double step) {
        t.set(idx, float(x + step));
        const double up = objective(d, p);
        t.set(idx, float(x - step));
        const double down = objective(d, p);
        t.set(idx, x);
        return (up - down) / (2 * step);
      };
      grad.push_back((4 * central(h / 2) - central(h)) / 3);
    });
    return grad;
  }
};

TEST_P(OracleGradient, MatchesFiniteDifferences) {
  const Case c = GetParam();
  CaseData d(c);
  for (HostTensor* t : {&d.q, &d.k, &d.v, &d.dout}) quantize(*t);
  const Params p = d.params(Pass::backward);
  const auto r = reference::backward(p);
  Check check = within_tolerance("dq", r.dq, numeric_gradient(d, d.q, p), 1e-8, 1e-6,
                                 PackedLayout::queries(p, p.head_dim));
  check += within_tolerance("dk", r.dk, numeric_gradient(d, d.k, p), 1e-8, 1e-6, PackedLayout::keys(p, p.head_dim));
  check += within_tolerance("dv", r.dv, numeric_gradient(d, d.v, p), 1e-8, 1e-6, PackedLayout::keys(p, p.head_dim_v));
  EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
}

namespace {

std::vector<Case> gradient_cases() {
  Case base;
  base.batch = 2;
  base.heads_q = 2;
  base.heads_kv = 2;
  base.seqlen_q = 3;
  base.seqlen_k = 4;
  base.head_dim = 3;
  base.head_dim_v = 2;
  base.softmax_scale = 0.9f;
  std::vector<Case> cases;
  cases.push_back(base);
  Case causal = base;
  causal.seqlen_q = 5;  // two fully masked rows
  causal.causal = true;
  cases.push_back(causal);
  Case window = base;
  window.window_left = 1;
  window.window_right = 1;
  cases.push_back(window);
  Case softcap = base;
  softcap.softcap = 1.5f;
  softcap.softmax_scale = 2.f;
  cases.push_back(softcap);
  Case alibi = base;
  alibi.alibi = Alibi::per_batch_head;
  cases.push_back(alibi);
  Case gqa = base;
  gqa.heads_q = 4;
  gqa.heads_kv = 1;
  cases.push_back(gqa);
  Case dropout = base;
  dropout.dropout_p = 0.3f;
  dropout.dropout_seed = 7;
  cases.push_back(dropout);
  Case varlen = base;
  varlen.seqlens_q = {2, 0, 3};
  varlen.seqlens_k = {3, 2, 1};
  varlen.causal = true;
  cases.push_back(varlen);
  Case everything = gqa;
  everything.window_left = 2;
  everything.window_right = 0;
  everything.softcap = 2.f;
  everything.alibi = Alibi::per_head;
  everything.dropout_p = 0.2f;
  everything.dropout_seed = 3;
  cases.push_back(everything);
  return cases;
}

const char* const kGradientNames[] = {"plain", "causal", "window", "softcap", "alibi", "gqa", "dropout", "varlen",
                                      "everything"};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Features, OracleGradient, ::testing::ValuesIn(gradient_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return kGradientNames[info.index]; });

// The naive reference: float32 close to the oracle; 16-bit types off by their rounding, but not
// by more, and with the same fully masked rows.
TEST(NaiveReference, Float32IsCloseToTheOracle) {
  Case c;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.seqlen_q = 70;
  c.seqlen_k = 50;
  c.head_dim = 16;
  c.causal = true;
  c.softcap = 5.f;
  c.alibi = Alibi::per_head;
  c.dropout_p = 0.1f;
  CaseData d(c);
  const Params p = d.params(Pass::backward);
  const auto oracle = reference::backward(p), naive = reference::naive_backward(p);
  Check check = within_tolerance("out", naive.out, oracle.out, 1e-5, 1e-5, PackedLayout::queries(p, p.head_dim_v));
  check += within_tolerance("lse", naive.lse, oracle.lse, 1e-5, 1e-5, PackedLayout::queries(p, 1));
  check += within_tolerance("dq", naive.dq, oracle.dq, 1e-5, 1e-5, PackedLayout::queries(p, p.head_dim));
  check += within_tolerance("dk", naive.dk, oracle.dk, 1e-5, 1e-5, PackedLayout::keys(p, p.head_dim));
  check += within_tolerance("dv", naive.dv, oracle.dv, 1e-5, 1e-5, PackedLayout::keys(p, p.head_dim_v));
  EXPECT_TRUE(check.ok) << check.message;
}

TEST(NaiveReference, SixteenBitTypesCarryTheirRoundingError) {
  for (flashattn_dtype dtype : {FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16}) {
    Case c;
    c.dtype = dtype;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.seqlen_q = 40;
    c.seqlen_k = 60;
    c.head_dim = 32;
    CaseData d(c);
    const Params p = d.params(Pass::backward);
    const auto oracle = reference::backward(p), naive = reference::naive_backward(p);
    const double unit = dtype == FLASHATTN_DTYPE_FLOAT16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    double worst = 0;
    for (size_t n = 0; n < oracle.out.size(); ++n) worst = std::max(worst, std::abs(naive.out[n] - oracle.out[n]));
    EXPECT_GT(worst, 0.1 * unit) << "the naive result should carry rounding error";
    EXPECT_LT(worst, 16 * unit) << "the naive result is off by more than rounding";
  }
}

TEST(NaiveReference, FullyMaskedRowsMatchTheOracle) {
  Case c = tiny_case(70, 3, 8);
  c.dtype = FLASHATTN_DTYPE_FLOAT16;
  c.causal = true;
  CaseData d(c);
  const Params p = d.params(Pass::backward);
  const auto naive = reference::naive_backward(p);
  for (int i = 0; i < 67; ++i) {
    EXPECT_EQ(naive.lse[size_t(i)], kNegInf) << "i=" << i;
    for (int x = 0; x < 8; ++x) {
      EXPECT_EQ(naive.out[size_t(i * 8 + x)], 0.0) << "i=" << i;
      EXPECT_EQ(naive.dq[size_t(i * 8 + x)], 0.0) << "i=" << i;
    }
  }
}

// The shared definitions of core/semantics.h: the window predicate and its range helpers against
// brute force, softcap and ALiBi against their formulas, and the Philox dropout decision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <tuple>

#include "core/semantics.h"

using flashattn::semantics::Dropout;
using flashattn::semantics::Philox4;
using flashattn::semantics::Window;

namespace {

// Visibility straight from DESIGN.md: i + sk - sq - left <= j <= i + sk - sq + right, -1 unbounded.
bool visible_by_definition(int sq, int sk, int left, int right, int64_t i, int64_t j) {
  if (j < 0 || j >= sk) return false;
  const int64_t diag = i + sk - sq;
  return (left == -1 || j >= diag - left) && (right == -1 || j <= diag + right);
}

struct Sizes {
  int sq, sk, left, right;
};

std::vector<Sizes> all_small_windows() {
  std::vector<Sizes> out;
  for (int sq = 0; sq <= 9; ++sq)
    for (int sk = 0; sk <= 9; ++sk)
      for (int left : {-1, 0, 1, 2, 5, 20})
        for (int right : {-1, 0, 1, 3, 20}) out.push_back({sq, sk, left, right});
  return out;
}

std::string label(const Sizes& s) {
  return "sq=" + std::to_string(s.sq) + " sk=" + std::to_string(s.sk) + " window=(" + std::to_string(s.left) + "," +
         std::to_string(s.right) + ")";
}

}  // namespace

TEST(Window, VisibleMatchesDefinition) {
  for (const Sizes& s : all_small_windows()) {
    const Window w{s.left, s.right, s.sq, s.sk};
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t j = -2; j < s.sk + 2; ++j)
        ASSERT_EQ(w.visible(i, j), visible_by_definition(s.sq, s.sk, s.left, s.right, i, j))
            << label(s) << " i=" << i << " j=" << j;
  }
}

TEST(Window, CausalIsWindowMinusOneZeroAlignedBottomRight) {
  const Window causal{-1, 0, 3, 5};  // queries 0..2 sit at key positions 2..4
  EXPECT_TRUE(causal.visible(0, 2));
  EXPECT_FALSE(causal.visible(0, 3));
  EXPECT_TRUE(causal.visible(2, 4));
  const Window more_queries{-1, 0, 5, 3};  // queries 0 and 1 see no key
  EXPECT_FALSE(more_queries.visible(0, 0));
  EXPECT_FALSE(more_queries.visible(1, 0));
  EXPECT_TRUE(more_queries.visible(2, 0));
}

TEST(Window, KeyRangeOfEachRowMatchesBruteForce) {
  for (const Sizes& s : all_small_windows()) {
    const Window w{s.left, s.right, s.sq, s.sk};
    for (int64_t i = 0; i < s.sq; ++i) {
      std::set<int64_t> seen;
      for (int64_t j = 0; j < s.sk; ++j)
        if (visible_by_definition(s.sq, s.sk, s.left, s.right, i, j)) seen.insert(j);
      if (seen.empty()) {
        EXPECT_GT(w.first_key(i), w.last_key(i)) << label(s) << " i=" << i << " sees nothing";
      } else {
        EXPECT_EQ(w.first_key(i), *seen.begin()) << label(s) << " i=" << i;
        EXPECT_EQ(w.last_key(i), *seen.rbegin()) << label(s) << " i=" << i;
        EXPECT_EQ(int64_t(seen.size()), *seen.rbegin() - *seen.begin() + 1) << label(s) << " i=" << i << " not contiguous";
      }
    }
  }
}

TEST(Window, QueryRangeOfEachKeyMatchesBruteForce) {
  for (const Sizes& s : all_small_windows()) {
    const Window w{s.left, s.right, s.sq, s.sk};
    for (int64_t j = 0; j < s.sk; ++j) {
      std::set<int64_t> seeing;
      for (int64_t i = 0; i < s.sq; ++i)
        if (visible_by_definition(s.sq, s.sk, s.left, s.right, i, j)) seeing.insert(i);
      if (seeing.empty()) {
        EXPECT_GT(w.first_query(j), w.last_query(j)) << label(s) << " j=" << j << " seen by nothing";
      } else {
        EXPECT_EQ(w.first_query(j), *seeing.begin()) << label(s) << " j=" << j;
        EXPECT_EQ(w.last_query(j), *seeing.rbegin()) << label(s) << " j=" << j;
      }
    }
  }
}

TEST(Window, KeyRangesMoveForwardWithTheRow) {
  // Tiled kernels take [first_key(first row), last_key(last row)] as a tile's keys.
  for (const Sizes& s : all_small_windows()) {
    const Window w{s.left, s.right, s.sq, s.sk};
    for (int64_t i = 1; i < s.sq; ++i) {
      EXPECT_LE(w.first_key(i - 1), w.first_key(i)) << label(s) << " i=" << i;
      EXPECT_LE(w.last_key(i - 1), w.last_key(i)) << label(s) << " i=" << i;
    }
  }
}

TEST(Softcap, FormulaAndGradient) {
  EXPECT_EQ(flashattn::semantics::softcap<double>(3.0, 0.0), 3.0);
  EXPECT_DOUBLE_EQ(flashattn::semantics::softcap<double>(3.0, 2.0), 2.0 * std::tanh(1.5));
  EXPECT_DOUBLE_EQ(flashattn::semantics::softcap<double>(-50.0, 5.0), 5.0 * std::tanh(-10.0));
  for (double s : {-7.0, -0.3, 0.0, 0.4, 2.5, 9.0}) {
    const double cap = 3.0, h = 1e-6;
    const double numeric = (flashattn::semantics::softcap(s + h, cap) - flashattn::semantics::softcap(s - h, cap)) / (2 * h);
    const double analytic = flashattn::semantics::softcap_grad(flashattn::semantics::softcap(s, cap), cap);
    EXPECT_NEAR(analytic, numeric, 1e-8) << "s=" << s;
  }
  EXPECT_EQ(flashattn::semantics::softcap_grad<double>(1.7, 0.0), 1.0);
}

TEST(Alibi, MinusSlopeTimesDistanceToTheDiagonal) {
  const Window w{-1, -1, 3, 6};  // row i sits at key i + 3
  EXPECT_DOUBLE_EQ(flashattn::semantics::alibi_bias<double>(0.5, w, 0, 3), 0.0);
  EXPECT_DOUBLE_EQ(flashattn::semantics::alibi_bias<double>(0.5, w, 0, 0), -1.5);
  EXPECT_DOUBLE_EQ(flashattn::semantics::alibi_bias<double>(0.5, w, 1, 5), -0.5);  // keys after the diagonal too
  EXPECT_DOUBLE_EQ(flashattn::semantics::alibi_bias<double>(0.25, w, 2, 1), -1.0);
}

// Known-answer vectors of Philox4x32 with 7 rounds, from the Random123 distribution (kat_vectors).
TEST(Philox, KnownAnswers) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
  };
  for (const Kat& k : kats) {
    const Philox4 r = flashattn::semantics::philox4x32_7(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(r.x[w], k.out[w]) << "word " << w << " of the vector with ctr0=" << k.ctr[0];
  }
}

TEST(Dropout, DisabledKeepsEverything) {
  const Dropout none = Dropout::make(0.f, 1, 2);
  EXPECT_FALSE(none.enabled());
  EXPECT_TRUE(none.keep(3, 4, 5));
  EXPECT_EQ(none.inv_keep, 1.f);
}

TEST(Dropout, KeepRateIsOneMinusP) {
  for (float p : {0.05f, 0.1f, 0.5f, 0.9f}) {
    const Dropout d = Dropout::make(p, 0x1234567890ABCDEFull, 77);
    EXPECT_FLOAT_EQ(d.inv_keep, float(1.0 / (1.0 - p)));
    const int64_t n = 1 << 20;
    int64_t kept = 0;
    for (int64_t e = 0; e < n; ++e) kept += d.keep(e % 7, (e / 7) % 301, e / 2107);
    const double rate = double(kept) / n;
    // 2^20 Bernoulli draws: the standard deviation of the rate is below 5e-4.
    EXPECT_NEAR(rate, 1.0 - p, 3e-3) << "p=" << p;
  }
}

TEST(Dropout, DecisionIsAPureFunctionOfBatchHeadRowColumn) {
  const Dropout d = Dropout::make(0.3f, 42, 9);
  // The same element drawn in a different order, or twice, gives the same decision.
  std::vector<bool> forward_order, backward_order;
  for (int64_t j = 0; j < 200; ++j) forward_order.push_back(d.keep(5, 17, j));
  for (int64_t j = 199; j >= 0; --j) backward_order.push_back(d.keep(5, 17, j));
  for (int64_t j = 0; j < 200; ++j) EXPECT_EQ(forward_order[j], backward_order[199 - j]) << "j=" << j;
  // Every coordinate and the seed and offset matter.
  auto pattern = [](const Dropout& dd, int64_t bh, int64_t i) {
    std::vector<bool> v;
    for (int64_t j = 0; j < 256; ++j) v.push_back(dd.keep(bh, i, j));
    return v;
  };
  const auto base = pattern(d, 5, 17);
  EXPECT_NE(base, pattern(d, 6, 17));
  EXPECT_NE(base, pattern(d, 5, 18));
  EXPECT_NE(base, pattern(Dropout::make(0.3f, 43, 9), 5, 17));
  EXPECT_NE(base, pattern(Dropout::make(0.3f, 42, 10), 5, 17));
  EXPECT_NE(base, pattern(Dropout::make(0.3f, 42 + (uint64_t(1) << 32), 9), 5, 17));
}

TEST(Dropout, EightKeysPerDrawInSixteenBitLanes) {
  const Dropout d = Dropout::make(0.5f, 7, 3);
  EXPECT_EQ(d.threshold, 32768u);
  for (int64_t j = 0; j < 64; ++j) {
    const Philox4 r = d.draws(2, 11, j / 8);
    EXPECT_EQ(d.keep(2, 11, j), Dropout::draw_of(r, int(j % 8)) >= d.threshold) << "j=" << j;
  }
}

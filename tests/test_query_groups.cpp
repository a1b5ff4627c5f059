// core/query_groups.h: which calls fold the heads of a group into rows, that the folded call
// addresses every q, out and lse element of the original one at the same place, and that "the
// one row sees every key" is exactly what the window definition says. The sweeps
// (decode_gqa_* cases) check the folded calls against the oracle on every backend.
#include <gtest/gtest.h>

#include "core/query_groups.h"
#include "core/semantics.h"

namespace {

using flashattn::Params;
using flashattn::Pass;

// A dense bshd decode call: B = 3, H = 8 query heads over 2 K/V heads, one query, 100 keys.
Params decode_params() {
  Params p;
  p.pass = Pass::forward;
  p.batch = 3;
  p.heads_q = 8;
  p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 64;
  p.seqlen_q = 1;
  p.seqlen_k = 100;
  p.q = {nullptr, 1 * 8 * 64, 8 * 64, 64};  // batch, row, head strides of [B, 1, H, d]
  p.out = p.q;
  static float lse[3 * 8];
  p.lse = lse;
  p.lse_batch = 8;
  p.lse_head = 1;
  return p;
}

TEST(QueryGroups, FoldsADecodeWithGroupedHeads) {
  EXPECT_TRUE(flashattn::query_groups_foldable(decode_params()));
  Params causal = decode_params();
  causal.window_right = 0;
  EXPECT_TRUE(flashattn::query_groups_foldable(causal));
  Params wide = decode_params();
  wide.window_left = 99;  // seqlen_k - 1: still every key
  EXPECT_TRUE(flashattn::query_groups_foldable(wide));
  Params no_lse = decode_params();
  no_lse.lse = nullptr;
  no_lse.lse_head = 7;
  EXPECT_TRUE(flashattn::query_groups_foldable(no_lse));
  Params softcap = decode_params();
  softcap.softcap = 30.f;
  EXPECT_TRUE(flashattn::query_groups_foldable(softcap));
}

TEST(QueryGroups, LeavesEveryOtherCallAlone) {
  auto changed = [](auto edit) {
    Params p = decode_params();
    edit(p);
    EXPECT_FALSE(flashattn::query_groups_foldable(p));
    const Params f = flashattn::fold_query_groups(p);
    return f.seqlen_q != p.seqlen_q || f.heads_q != p.heads_q || f.q.row != p.q.row;
  };
  EXPECT_FALSE(changed([](Params& p) { p.pass = Pass::backward; }));
  EXPECT_FALSE(changed([](Params& p) { p.variable_length = true; }));
  EXPECT_FALSE(changed([](Params& p) { p.seqlen_q = 2; }));
  EXPECT_FALSE(changed([](Params& p) { p.seqlen_k = 0; }));
  EXPECT_FALSE(changed([](Params& p) { p.heads_kv = 8; }));           // no groups
  EXPECT_FALSE(changed([](Params& p) { p.window_left = 98; }));       // the first key is hidden
  EXPECT_FALSE(changed([](Params& p) { p.alibi = true; }));           // slope per query head
  EXPECT_FALSE(changed([](Params& p) { p.dropout_p = 0.1f; }));       // mask per (head, row)
  EXPECT_FALSE(changed([](Params& p) { p.lse_head = 2; }));           // lse rows not one head apart
}

TEST(QueryGroups, FoldedCallAddressesTheSameElements) {
  for (const bool bhsd : {false, true}) {
    Params p = decode_params();
    if (bhsd) p.q = p.out = {nullptr, 8 * 1 * 64, 64, 1 * 64};  // [B, H, 1, d]
    const Params f = flashattn::fold_query_groups(p);
    ASSERT_EQ(f.seqlen_q, 4);
    ASSERT_EQ(f.heads_q, 2);
    EXPECT_EQ(f.group_size(), 1);
    EXPECT_EQ(f.window_left, -1);
    EXPECT_EQ(f.window_right, -1);
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads_q; ++h) {
        const int hk = h / 4, row = h % 4;
        EXPECT_EQ(flashattn::element_offset(f.q, b, 0, row, hk), flashattn::element_offset(p.q, b, 0, 0, h));
        EXPECT_EQ(flashattn::element_offset(f.out, b, 0, row, hk), flashattn::element_offset(p.out, b, 0, 0, h));
        EXPECT_EQ(b * f.lse_batch + hk * f.lse_head + row, b * p.lse_batch + h * p.lse_head + 0);
      }
  }
}

// Foldable windows are exactly those under which the single query row sees every key.
TEST(QueryGroups, WindowConditionMatchesTheDefinition) {
  for (int sk = 1; sk <= 12; ++sk)
    for (int left = -1; left <= 14; ++left)
      for (int right = -1; right <= 3; ++right) {
        const flashattn::semantics::Window w{left, right, 1, sk};
        bool every_key = true;
        for (int j = 0; j < sk; ++j) every_key = every_key && w.visible(0, j);
        Params p = decode_params();
        p.seqlen_k = sk;
        p.window_left = left;
        p.window_right = right;
        EXPECT_EQ(flashattn::query_groups_foldable(p), every_key) << "sk=" << sk << " window=(" << left << ","
                                                                   << right << ")";
      }
}

}  // namespace

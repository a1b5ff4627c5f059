// core/query_groups.h: which calls fold the heads of a group into rows, that the folded call
// addresses every q, out and lse element of the original one at the same place, and that "every
// row sees every key" is exactly what the window definition says. The sweeps (decode_gqa_* and
// prefill_gqa_bhsd_folded cases) check the folded calls against the oracle on every backend.
#include <gtest/gtest.h>

#include "core/query_groups.h"
#include "core/semantics.h"

namespace {

using flashattn::Params;
using flashattn::Pass;

// A dense forward with grouped heads: q and out [B, S, H, d] (bshd) or [B, H, S, d] (bhsd), lse
// [B, H, S] (only whether lse is requested matters to the fold, not its memory).
Params grouped_call(int batch, int heads_q, int heads_kv, int seqlen_q, int seqlen_k, int head_dim, bool bhsd) {
  static float lse;
  Params p;
  p.pass = Pass::forward;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = p.head_dim_v = head_dim;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  const int64_t d = head_dim, rows = seqlen_q, heads = heads_q;
  p.q = bhsd ? flashattn::Operand{nullptr, heads * rows * d, d, rows * d}   // batch, row, head strides
             : flashattn::Operand{nullptr, rows * heads * d, heads * d, d};
  p.out = p.q;
  p.lse = &lse;
  p.lse_batch = heads * rows;
  p.lse_head = rows;
  return p;
}

// A bshd decode call: B = 3, H = 8 query heads over 2 K/V heads, one query, 100 keys.
Params decode_params() { return grouped_call(3, 8, 2, 1, 100, 64, false); }

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

// A bhsd call with a few query rows: B = 2, H = 6 query heads over 3 K/V heads, 5 queries, 40
// keys, rows of a head one after another (head stride = 5 rows).
Params short_prefill_params() { return grouped_call(2, 6, 3, 5, 40, 32, true); }

TEST(QueryGroups, FoldsShortBhsdCallsWhoseRowsSeeEveryKey) {
  EXPECT_TRUE(flashattn::query_groups_foldable(short_prefill_params()));
  Params windowed = short_prefill_params();
  windowed.window_left = 39;  // seqlen_k - 1: the last row still sees the first key
  windowed.window_right = 4;  // seqlen_q - 1: the first row still sees the last key
  EXPECT_TRUE(flashattn::query_groups_foldable(windowed));
  auto not_foldable = [](auto edit) {
    Params p = short_prefill_params();
    edit(p);
    EXPECT_FALSE(flashattn::query_groups_foldable(p));
    EXPECT_EQ(flashattn::fold_query_groups(p).seqlen_q, p.seqlen_q);
  };
  not_foldable([](Params& p) { p.window_right = 0; });  // causal: row 0 sees keys 0..35 only
  not_foldable([](Params& p) { p.window_right = 3; });
  not_foldable([](Params& p) { p.window_left = 38; });
  not_foldable([](Params& p) { p.q = grouped_call(2, 6, 3, 5, 40, 32, false).q; });  // bshd: rows of a head apart
  not_foldable([](Params& p) { p.out.head += 32; });                       // padded heads of out
  not_foldable([](Params& p) { p.lse_head = 8; });                         // padded lse rows
  not_foldable([](Params& p) {                                             // past kFoldMaxSeqlenQ
    p.seqlen_q = flashattn::kFoldMaxSeqlenQ + 1;
    p.q.head = p.out.head = int64_t(p.seqlen_q) * 32;
    p.lse_head = p.seqlen_q;
  });
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
    const Params p = grouped_call(3, 8, 2, 1, 100, 64, bhsd);
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

TEST(QueryGroups, FoldedShortPrefillAddressesTheSameElements) {
  const Params p = short_prefill_params();
  const Params f = flashattn::fold_query_groups(p);
  ASSERT_EQ(f.seqlen_q, 10);
  ASSERT_EQ(f.heads_q, 3);
  EXPECT_EQ(f.group_size(), 1);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; ++h)
      for (int i = 0; i < p.seqlen_q; ++i) {
        const int hk = h / 2, row = (h % 2) * p.seqlen_q + i;
        EXPECT_EQ(flashattn::element_offset(f.q, b, 0, row, hk), flashattn::element_offset(p.q, b, 0, i, h));
        EXPECT_EQ(flashattn::element_offset(f.out, b, 0, row, hk), flashattn::element_offset(p.out, b, 0, i, h));
        EXPECT_EQ(b * f.lse_batch + hk * f.lse_head + row, b * p.lse_batch + h * p.lse_head + i);
      }
}

// Foldable windows are exactly those under which every query row sees every key.
TEST(QueryGroups, WindowConditionMatchesTheDefinition) {
  for (int sq : {1, 2, 5})
    for (int sk = 1; sk <= 12; ++sk)
      for (int left = -1; left <= 14; ++left)
        for (int right = -1; right <= 6; ++right) {
          const flashattn::semantics::Window w{left, right, sq, sk};
          bool every_key = true;
          for (int i = 0; i < sq; ++i)
            for (int j = 0; j < sk; ++j) every_key = every_key && w.visible(i, j);
          Params p = grouped_call(2, 6, 3, sq, sk, 32, true);
          p.window_left = left;
          p.window_right = right;
          EXPECT_EQ(flashattn::query_groups_foldable(p), every_key)
              << "sq=" << sq << " sk=" << sk << " window=(" << left << "," << right << ")";
        }
}

}  // namespace

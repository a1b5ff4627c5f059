// core/query_groups.h: which calls fold the heads of a group into rows, that the folded call
// addresses every q, out and lse element of the original one at the same place, and that a
// folded window (semantics::Window::fold) shows each row the keys of its query row. The sweeps
// (decode_gqa_* and prefill_gqa_* cases) check the folded calls against the oracle on every
// backend.
#include <gtest/gtest.h>

#include <utility>

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
  Params narrow = decode_params();
  narrow.window_left = 10;  // the query sees keys 89..99
  EXPECT_TRUE(flashattn::query_groups_foldable(narrow));
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

TEST(QueryGroups, FoldsShortBhsdCallsUnderAnyWindow) {
  EXPECT_TRUE(flashattn::query_groups_foldable(short_prefill_params()));
  for (const auto& [left, right] : {std::pair{-1, 0}, std::pair{3, 0}, std::pair{38, 3}, std::pair{0, 0}}) {
    Params windowed = short_prefill_params();
    windowed.window_left = left;
    windowed.window_right = right;
    EXPECT_TRUE(flashattn::query_groups_foldable(windowed)) << left << "," << right;
  }
  auto not_foldable = [](auto edit) {
    Params p = short_prefill_params();
    edit(p);
    EXPECT_FALSE(flashattn::query_groups_foldable(p));
    EXPECT_EQ(flashattn::fold_query_groups(p).seqlen_q, p.seqlen_q);
  };
  not_foldable([](Params& p) { p.fold_rows = 5; });  // folded already
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
  EXPECT_FALSE(changed([](Params& p) { p.alibi = true; }));           // slope per query head
  EXPECT_FALSE(changed([](Params& p) { p.dropout_p = 0.1f; }));       // mask per (head, row)
  EXPECT_FALSE(changed([](Params& p) { p.lse_head = 2; }));           // lse rows not one head apart
}

TEST(QueryGroups, FoldedCallAddressesTheSameElements) {
  for (const bool bhsd : {false, true}) {
    Params p = grouped_call(3, 8, 2, 1, 100, 64, bhsd);
    p.window_left = 7;
    const Params f = flashattn::fold_query_groups(p);
    ASSERT_EQ(f.seqlen_q, 4);
    ASSERT_EQ(f.heads_q, 2);
    EXPECT_EQ(f.group_size(), 1);
    EXPECT_EQ(f.window_left, 7);
    EXPECT_EQ(f.window_right, -1);
    EXPECT_EQ(f.fold_rows, 1);
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
  EXPECT_EQ(f.fold_rows, 5);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; ++h)
      for (int i = 0; i < p.seqlen_q; ++i) {
        const int hk = h / 2, row = (h % 2) * p.seqlen_q + i;
        EXPECT_EQ(flashattn::element_offset(f.q, b, 0, row, hk), flashattn::element_offset(p.q, b, 0, i, h));
        EXPECT_EQ(flashattn::element_offset(f.out, b, 0, row, hk), flashattn::element_offset(p.out, b, 0, i, h));
        EXPECT_EQ(b * f.lse_batch + hk * f.lse_head + row, b * p.lse_batch + h * p.lse_head + i);
      }
}

// A folded window shows row r the keys of query row r % fold, and its diagonal spans hold
// every row of the span.
TEST(QueryGroups, FoldedWindowFollowsTheQueryRow) {
  for (int sq : {1, 2, 5})
    for (int group : {2, 3})
      for (int sk = 1; sk <= 12; ++sk)
        for (int left = -1; left <= 14; ++left)
          for (int right = -1; right <= 6; ++right) {
            const flashattn::semantics::Window w{left, right, sq, sk};
            const flashattn::semantics::Window folded{left, right, group * sq, sk, sq};
            for (int r = 0; r < group * sq; ++r) {
              ASSERT_EQ(folded.diagonal(r), w.diagonal(r % sq));
              for (int j = -1; j <= sk; ++j) ASSERT_EQ(folded.visible(r, j), w.visible(r % sq, j));
            }
            for (int i0 = 0; i0 < group * sq; ++i0)
              for (int n = 1; i0 + n <= group * sq; ++n) {
                const auto span = folded.diagonals(i0, n);
                for (int r = i0; r < i0 + n; ++r) {
                  ASSERT_LE(span.low, folded.diagonal(r));
                  ASSERT_GE(span.high, folded.diagonal(r));
                }
              }
          }
}

}  // namespace

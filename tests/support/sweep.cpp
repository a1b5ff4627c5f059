#include "support/sweep.h"

#include <random>

namespace flashattn::test {
namespace {

// A dense case of B sequences of sq queries and sk keys with heads_q / heads_kv heads.
Case dense(flashattn_dtype dtype, int d, int batch, int heads_q, int heads_kv, int sq, int sk) {
  Case c;
  c.dtype = dtype;
  c.head_dim = d;
  c.batch = batch;
  c.heads_q = heads_q;
  c.heads_kv = heads_kv;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  return c;
}

Case varlen(flashattn_dtype dtype, int d, int heads_q, int heads_kv, std::vector<int> lengths_q,
            std::vector<int> lengths_k) {
  Case c = dense(dtype, d, int(lengths_q.size()), heads_q, heads_kv, 0, 0);
  c.seqlens_q = std::move(lengths_q);
  c.seqlens_k = std::move(lengths_k);
  return c;
}

Case with_window(Case c, int left, int right) {
  c.window_left = left;
  c.window_right = right;
  return c;
}

Case with_dropout(Case c, float p, uint64_t seed, uint64_t offset = 0) {
  c.dropout_p = p;
  c.dropout_seed = seed;
  c.dropout_offset = offset;
  return c;
}

Case causal(Case c) {
  c.causal = true;
  return c;
}

}  // namespace

std::vector<NamedCase> feature_sweep(flashattn_dtype t, const std::vector<int>& head_dims) {
  const int d = head_dims.front();
  std::vector<NamedCase> s;
  // Shapes.
  s.push_back({"seqlen_1", dense(t, d, 2, 2, 2, 1, 1)});
  s.push_back({"square_17", dense(t, d, 3, 3, 3, 17, 17)});
  s.push_back({"decode_1_by_1000_mqa", causal(dense(t, d, 1, 4, 1, 1, 1000))});
  s.push_back({"long_1000_causal", causal(dense(t, d, 1, 1, 1, 1000, 1000))});
  s.push_back({"long_1000_window", with_window(dense(t, d, 1, 2, 1, 1000, 1000), 200, 50)});
  s.push_back({"queries_17_keys_1000", dense(t, d, 1, 2, 1, 17, 1000)});
  s.push_back({"queries_1000_keys_17_causal", causal(dense(t, d, 1, 2, 1, 1000, 17))});
  s.push_back({"more_queries_than_keys", dense(t, d, 2, 2, 2, 129, 65)});
  s.push_back({"fewer_queries_than_keys", dense(t, d, 2, 2, 2, 63, 200)});
  s.push_back({"no_queries", dense(t, d, 2, 2, 1, 0, 10)});
  s.push_back({"no_keys", dense(t, d, 2, 2, 1, 10, 0)});
  // Decoding: few query rows over thousands of keys, where kernels split the keys.
  Case decode = with_dropout(causal(dense(t, d, 1, 2, 1, 3, 4500)), 0.1f, 31);
  decode.softcap = 5.f;
  decode.alibi = Alibi::per_head;
  s.push_back({"decode_long_keys_every_feature", decode});
  s.push_back({"decode_long_keys_window", with_window(dense(t, d, 2, 1, 1, 1, 5000), 700, 0)});
  // Decoding with grouped heads: folded into rows of one head (core/query_groups.h), windows
  // included.
  Case folded = causal(dense(t, d, 3, 8, 2, 1, 300));
  folded.softcap = 20.f;
  s.push_back({"decode_gqa_folded", folded});
  s.push_back({"decode_gqa_folded_wide_window", with_window(dense(t, d, 2, 6, 1, 1, 77), 76, 3)});
  s.push_back({"decode_gqa_narrow_window", with_window(dense(t, d, 2, 6, 3, 1, 77), 20, 0)});
  // Short prefills with grouped heads in bhsd: folded as well, each row under its query row's
  // mask (17 rows a head: the folded rows of a query tile wrap past a head's last row).
  Case short_prefill = dense(t, d, 2, 8, 2, 5, 300);
  short_prefill.layout = Layout::bhsd;
  short_prefill.softcap = 20.f;
  s.push_back({"prefill_gqa_bhsd_folded", short_prefill});
  Case causal_prefill = causal(dense(t, d, 2, 8, 2, 17, 200));
  causal_prefill.layout = Layout::bhsd;
  s.push_back({"prefill_gqa_bhsd_causal_folded", causal_prefill});
  Case window_prefill = with_window(dense(t, d, 1, 6, 1, 33, 90), 20, 3);
  window_prefill.layout = Layout::bhsd;
  s.push_back({"prefill_gqa_bhsd_window_folded", window_prefill});
  // Masks.
  s.push_back({"causal_more_queries", causal(dense(t, d, 2, 2, 2, 130, 77))});  // rows 0..52 see nothing
  s.push_back({"causal_fewer_queries", causal(dense(t, d, 2, 2, 2, 77, 130))});
  s.push_back({"window_left", with_window(dense(t, d, 1, 2, 2, 100, 150), 10, -1)});
  s.push_back({"window_right", with_window(dense(t, d, 1, 2, 2, 150, 100), -1, 5)});
  s.push_back({"window_both", with_window(dense(t, d, 2, 2, 1, 140, 140), 20, 7)});
  s.push_back({"window_diagonal_only", with_window(dense(t, d, 1, 2, 2, 65, 65), 0, 0)});
  s.push_back({"window_masked_rows", with_window(dense(t, d, 1, 2, 2, 100, 40), 5, 2)});
  s.push_back({"causal_window", causal(with_window(dense(t, d, 1, 2, 1, 120, 200), 33, 0))});
  // Score transforms.
  Case capped = dense(t, d, 1, 2, 2, 90, 110);
  capped.softcap = 3.f;
  capped.input_stddev = 2.f;  // scores large enough to saturate
  s.push_back({"softcap", capped});
  Case capped_causal = causal(dense(t, d, 2, 2, 1, 100, 100));
  capped_causal.softcap = 30.f;
  s.push_back({"softcap_causal", capped_causal});
  Case alibi_heads = causal(dense(t, d, 1, 4, 4, 100, 100));
  alibi_heads.alibi = Alibi::per_head;
  s.push_back({"alibi_per_head", alibi_heads});
  Case alibi_batch = dense(t, d, 2, 3, 1, 70, 150);
  alibi_batch.alibi = Alibi::per_batch_head;
  s.push_back({"alibi_per_batch_and_head", alibi_batch});
  // More than 128 query rows: the sm_90a forward's tall tiles with the score transform.
  Case transformed_tall = causal(dense(t, d, 2, 3, 1, 180, 170));
  transformed_tall.softcap = 5.f;
  transformed_tall.alibi = Alibi::per_batch_head;
  s.push_back({"softcap_alibi_tall_rows", transformed_tall});
  Case scaled = dense(t, d, 1, 2, 2, 50, 70);
  scaled.softmax_scale = 0.3f;
  s.push_back({"explicit_scale", scaled});
  // Head groups.
  s.push_back({"gqa_4_to_1", dense(t, d, 1, 8, 2, 80, 80)});
  s.push_back({"mqa_causal", causal(dense(t, d, 1, 6, 1, 70, 130))});
  // Variable length.
  s.push_back({"varlen_with_empty_sequences", causal(varlen(t, d, 4, 2, {0, 17, 65, 3, 100}, {5, 0, 130, 3, 64}))});
  Case varlen_bhsd = with_window(varlen(t, d, 2, 2, {1, 64, 129}, {200, 64, 1}), 16, 16);
  varlen_bhsd.layout = Layout::bhsd;
  s.push_back({"varlen_window_bhsd", varlen_bhsd});
  // More tiles than a GPU has multiprocessors (a grid that hands out tiles in several rounds).
  // 144 tiles of 256 rows at d = 64 and 192 at d = 128 (sm90::forward_tall), 288 of 128 rows
  // above.
  s.push_back({"many_tiles_causal_gqa", causal(dense(t, d, 4, 36, 6, 160, 160))});
  // More query tiles than multiprocessors, two of each head's three without a visible key (rows
  // 0..259 see none), so a persistent block meets tiles without keys between tiles with keys.
  s.push_back({"many_tiles_keyless_rows", causal(dense(t, d, 2, 40, 8, 300, 40))});
  std::vector<int> lengths_q, lengths_k;
  for (int i = 0; i < 16; ++i) {
    lengths_q.push_back((i * 97) % 241);  // 0, 97, 194, 50, 147, ...: empty and partial 128-row tiles
    lengths_k.push_back((i * 61 + 40) % 170);
  }
  s.push_back({"varlen_many_tiles_causal", causal(varlen(t, d, 6, 2, lengths_q, lengths_k))});
  // Dropout.
  s.push_back({"dropout", with_dropout(dense(t, d, 1, 2, 2, 100, 100), 0.1f, 1234)});
  s.push_back({"dropout_causal_gqa", with_dropout(causal(dense(t, d, 2, 4, 2, 90, 140)), 0.3f, 77, 7)});
  s.push_back({"dropout_high", with_dropout(dense(t, d, 1, 1, 1, 64, 129), 0.9f, 5)});
  // Layouts.
  Case bhsd = dense(t, d, 2, 3, 3, 70, 90);
  bhsd.layout = Layout::bhsd;
  s.push_back({"bhsd", bhsd});
  Case bhsd_padded = causal(dense(t, d, 2, 4, 2, 66, 66));
  bhsd_padded.layout = Layout::bhsd;
  bhsd_padded.row_pad = 5;
  s.push_back({"bhsd_padded_gqa_causal", bhsd_padded});
  Case bshd_padded = dense(t, d, 2, 2, 1, 40, 75);
  bshd_padded.row_pad = 3;
  s.push_back({"bshd_padded", bshd_padded});
  // Head dims.
  for (int dim : head_dims) s.push_back({"head_dim_" + std::to_string(dim), causal(dense(t, dim, 1, 2, 1, 65, 95))});
  // The score transforms at every head dim, without dropout: kernels that keep softcap's
  // derivative or ALiBi's bias in registers differ with the head dim.
  for (int dim : head_dims) {
    Case transformed = with_window(dense(t, dim, 1, 4, 2, 150, 170), 90, 20);
    transformed.softcap = 10.f;
    transformed.alibi = Alibi::per_head;
    s.push_back({"softcap_alibi_head_dim_" + std::to_string(dim), transformed});
  }
  Case narrow_values = dense(t, 48, 1, 2, 2, 70, 60);
  narrow_values.head_dim_v = 24;
  s.push_back({"value_dim_smaller", narrow_values});
  Case wide_values = causal(dense(t, 16, 1, 2, 1, 60, 70));
  wide_values.head_dim_v = 80;
  s.push_back({"value_dim_larger", wide_values});
  // All at once.
  Case all = with_dropout(with_window(dense(t, d, 2, 6, 2, 150, 133), 40, 10), 0.15f, 2024, 3);
  all.softcap = 4.f;
  all.alibi = Alibi::per_batch_head;
  all.layout = Layout::bhsd;
  all.row_pad = 2;
  s.push_back({"everything", all});
  Case all_varlen = with_dropout(with_window(varlen(t, d, 4, 1, {30, 0, 77}, {64, 9, 50}), 8, 3), 0.2f, 11);
  all_varlen.softcap = 2.f;
  all_varlen.alibi = Alibi::per_batch_head;
  all_varlen.row_pad = 1;
  s.push_back({"everything_varlen", all_varlen});
  return s;
}

std::vector<NamedCase> random_sweep(flashattn_dtype t, const std::vector<int>& head_dims, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](const auto& options) { return options[std::uniform_int_distribution<size_t>(0, options.size() - 1)(rng)]; };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  const std::vector<int> lengths{1, 2, 16, 17, 63, 64, 65, 100, 127, 129, 200};
  const std::vector<int> varlen_lengths{0, 1, 7, 64, 65, 130};
  const std::vector<int> window_sides{-1, 0, 1, 7, 33, 100};
  std::vector<NamedCase> s;
  for (int n = 0; n < count; ++n) {
    const int heads_kv = pick(std::vector<int>{1, 2, 3}), group = pick(std::vector<int>{1, 2, 4});
    Case c = dense(t, pick(head_dims), pick(std::vector<int>{1, 2, 3}), heads_kv * group, heads_kv, pick(lengths),
                   pick(lengths));
    if (chance(0.25)) {
      for (int b = 0; b < c.batch; ++b) {
        c.seqlens_q.push_back(pick(varlen_lengths));
        c.seqlens_k.push_back(pick(varlen_lengths));
      }
    }
    c.causal = chance(0.3);
    if (chance(0.3)) {
      c.window_left = pick(window_sides);
      c.window_right = c.causal ? pick(std::vector<int>{-1, 0}) : pick(window_sides);
    }
    if (chance(0.25)) c.softcap = pick(std::vector<float>{1.f, 5.f, 30.f});
    if (chance(0.25)) c.alibi = chance(0.5) ? Alibi::per_head : Alibi::per_batch_head;
    if (chance(0.25)) c = with_dropout(c, pick(std::vector<float>{0.05f, 0.2f, 0.5f}), rng(), rng() % 1000);
    if (chance(0.3)) c.layout = Layout::bhsd;
    if (chance(0.3)) c.row_pad = 1 + int(rng() % 4);
    c.data_seed = 100 + n;
    s.push_back({"random_" + std::to_string(n), c});
  }
  return s;
}

}  // namespace flashattn::test

#include "core/query_groups.h"

namespace flashattn {

namespace {

// Rows i of heads g = 0..G-1 lie at one stride: row g * seqlen_q + i at (g * seqlen_q + i) * row
// in q, out and lse (whose rows have stride 1).
bool group_rows_adjacent(const Params& p) {
  const bool lse = !p.lse || p.lse_head == p.seqlen_q;
  if (p.seqlen_q == 1) return lse;  // the head stride serves as the row stride
  return lse && p.q.head == int64_t(p.seqlen_q) * p.q.row && p.out.head == int64_t(p.seqlen_q) * p.out.row;
}

}  // namespace

bool query_groups_foldable(const Params& p) {
  if (p.pass != Pass::forward || p.varlen() || p.seqlen_q < 1 || p.seqlen_q > kFoldMaxSeqlenQ ||
      p.seqlen_k <= 0 || p.heads_kv <= 0 || p.group_size() <= 1 || p.alibi || p.has_dropout() || p.fold_rows > 0)
    return false;
  return group_rows_adjacent(p);
}

Params fold_query_groups(const Params& p) {
  if (!query_groups_foldable(p)) return p;
  const int group = p.group_size();
  Params f = p;
  // Query head h = hk * G + g, row i becomes row g * seqlen_q + i of head hk: same element.
  if (p.seqlen_q == 1) {
    f.q.row = p.q.head;
    f.out.row = p.out.head;
  }
  f.q.head = p.q.head * group;
  f.out.head = p.out.head * group;
  f.seqlen_q = group * p.seqlen_q;
  f.heads_q = p.heads_kv;
  f.lse_head = int64_t(group) * p.seqlen_q;  // lse of (b, h, i) at b * lse_batch + h * seqlen_q + i
  f.fold_rows = p.seqlen_q;                  // the window's diagonal follows row % seqlen_q
  return f;
}

}  // namespace flashattn

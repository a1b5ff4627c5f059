#include "core/query_groups.h"

namespace flashattn {

bool query_groups_foldable(const Params& p) {
  const bool sees_every_key = p.window_left < 0 || int64_t(p.window_left) >= int64_t(p.seqlen_k) - 1;
  return p.pass == Pass::forward && !p.varlen() && p.seqlen_q == 1 && p.seqlen_k > 0 && p.heads_kv > 0 &&
         p.group_size() > 1 && sees_every_key && !p.alibi && !p.has_dropout() && (!p.lse || p.lse_head == 1);
}

Params fold_query_groups(const Params& p) {
  if (!query_groups_foldable(p)) return p;
  const int group = p.group_size();
  Params f = p;
  // Query head h = hk * G + g becomes row g of head hk: same element, new strides.
  f.q.row = p.q.head;
  f.q.head = p.q.head * group;
  f.out.row = p.out.head;
  f.out.head = p.out.head * group;
  f.seqlen_q = group;
  f.heads_q = p.heads_kv;
  f.lse_head = group;  // lse of (b, hk, g) at b * lse_batch + hk * G + g, that of (b, h)
  f.window_left = f.window_right = -1;  // the one row saw every key, so every folded row does
  return f;
}

}  // namespace flashattn

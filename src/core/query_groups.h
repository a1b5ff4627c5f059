// Grouped heads with few query rows (decoding, speculative decoding, short prefills): G query
// heads per K/V head with seqlen_q rows each are the same problem as G * seqlen_q rows of one head
// per K/V head, as long as no row sees a different set of keys. Folding the group into the rows
// lets every backend read K and V once per K/V head instead of G times (decoding is bound by those
// reads) and fills its query tiles G times better.
#pragma once

#include "core/params.h"

namespace flashattn {

// Up to this many query rows per head a call is folded: below a query tile (64 to 128 rows on
// every backend) the tiles are underfilled; above, folding would change only the tile order.
constexpr int kFoldMaxSeqlenQ = 64;

// True when fold_query_groups() rewrites `p`: a dense forward with 1 <= seqlen_q <=
// kFoldMaxSeqlenQ, G > 1, keys, the rows of a group's heads one after another in memory (any
// layout at seqlen_q = 1; head stride = seqlen_q x row stride, as in bhsd, otherwise; lse rows
// the same), and nothing tied to the query head: no ALiBi, no dropout. Masks stay: the window
// of a folded row is the one of its query row (semantics::Window::fold).
bool query_groups_foldable(const Params& p);

// `p` with the query heads of each group as rows: row g * seqlen_q + i of K/V head hk is row i
// of query head hk * G + g; q and out keep their row stride (at seqlen_q = 1 the head stride
// becomes it), heads_q = heads_kv, seqlen_q = G * seqlen_q, fold_rows = seqlen_q (the mask of
// row r is the one of query row r % fold_rows). Every (b, h, i) element keeps its address, so
// the results are the ones of the unfolded call. Returns `p` unchanged where not foldable.
Params fold_query_groups(const Params& p);

}  // namespace flashattn

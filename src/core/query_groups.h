// Decoding with grouped heads: one query row per head and G query heads per K/V head is the same
// problem as G query rows of one head per K/V head. Folding the group into the rows lets every
// backend read K and V once per K/V head instead of G times (decoding is bound by those reads)
// and fills its query tiles G times better.
#pragma once

#include "core/params.h"

namespace flashattn {

// True when fold_query_groups() rewrites `p`: a dense forward with seqlen_q = 1, G > 1, keys,
// every key visible from the one row (causal, no window or a window wider than the keys), and
// nothing tied to the query head or row index: no ALiBi, no dropout, lse rows one head apart.
bool query_groups_foldable(const Params& p);

// `p` with the query heads of each group as rows: q and out take the head stride as row stride,
// heads_q = heads_kv, seqlen_q = G, no mask. Every (b, h) element keeps its address, so the
// results are the ones of the unfolded call. Returns `p` unchanged where not foldable.
Params fold_query_groups(const Params& p);

}  // namespace flashattn

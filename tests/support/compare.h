// Comparing a backend's results with the float64 oracle. The criterion is FlashAttention's: the
// largest error of the result is at most twice the largest error of a naive implementation in
// the same dtype (reference/naive.h), plus a small absolute floor so that 0-vs-0 cases pass.
// Failures name the worst element by (batch, row, head, column) and give its three values.
#pragma once

#include <string>
#include <vector>

#include "core/params.h"
#include "reference/oracle.h"
#include "support/attention_case.h"
#include "support/tensors.h"

namespace flashattn::test {

// Where a packed index of reference::Result lies: rows of queries or keys, `heads` heads and
// `cols` columns per row (1 for lse).
struct PackedLayout {
  const Params* params = nullptr;
  bool query_rows = true;
  int heads = 1, cols = 1;

  static PackedLayout queries(const Params& p, int cols) { return {&p, true, p.heads_q, cols}; }
  static PackedLayout keys(const Params& p, int cols) { return {&p, false, p.heads_kv, cols}; }
  std::string label(size_t index) const;  // e.g. "(b=1, i=16, h=3, x=7)"
};

// The logical elements of an out/dq/dk/dv tensor in packed order (dense and varlen alike).
std::vector<double> packed_values(const HostTensor& t);
// lse [batch, heads, seq] or [heads, total] reordered to the packed [row, head] order.
std::vector<double> packed_lse(const HostTensor& lse);

struct Check {
  bool ok = true;
  std::string message;  // one line per failed comparison
  double worst_ratio = 0;  // largest error / allowed error over the comparisons (<= 1 passes)
  Check& operator+=(const Check& other);
};

// The absolute floor of the criterion: 1e-5 for float32, 1e-4 for the 16-bit types. Exact zeros
// of the oracle that come from cancelling O(1..10) terms (dS of a row with one visible key) are
// a few float32 ulps of those terms in any implementation whose two sums differ in order.
double error_floor(flashattn_dtype dtype);

// max|got - oracle| <= 2 max|naive - oracle| + floor; infinities must match exactly (a fully
// masked row's lse is -inf in all three) and `got` may hold no NaN.
Check within_twice_naive(const std::string& name, const std::vector<double>& got, const std::vector<double>& oracle,
                         const std::vector<double>& naive, double floor, const PackedLayout& where);
// |got - expected| <= atol + rtol |expected| everywhere (closed forms, finite differences).
Check within_tolerance(const std::string& name, const std::vector<double>& got, const std::vector<double>& expected,
                       double atol, double rtol, const PackedLayout& where);

// out and lse of `data` against the oracle's and the naive reference's forward.
Check check_forward(const CaseData& data, const Params& p, const reference::Result& oracle,
                    const reference::Result& naive);
// dq, dk, dv likewise (the results of reference::backward and reference::naive_backward).
Check check_backward(const CaseData& data, const Params& p, const reference::Result& oracle,
                     const reference::Result& naive);
// Every element of the pass's outputs was written and no gap between them was.
Check check_written(const CaseData& data, Pass pass);

}  // namespace flashattn::test

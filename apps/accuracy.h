// Errors against the float64 oracle: on sampled query rows (any size), on the gradients of one
// head group (when the oracle can afford it), or on every element (check's small problems).
#pragma once

#include "reference/criterion.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/params.h"
#include "reference/oracle.h"

namespace flashattn::cli {

// The largest |got - want| over the compared elements, and where it is.
struct ErrorStat {
  double max_error = 0;
  int64_t compared = 0;
  std::string worst;  // "dq[b=0, i=17, h=3, x=5]: got 0.1234 want 0.1230"

  template <typename Where>
  void add(double got, double want, const Where& where);
  void merge(const ErrorStat& other);
};

// FlashAttention's correctness criterion (reference/criterion.h).
using reference::error_floor;
inline double error_bound(const ErrorStat& naive, double floor) { return 2 * naive.max_error + floor; }

struct RowSample {
  int b, h;
  int64_t i;
};

// The oracle's out (and lse) for a few query rows: the last row of the first head, the first
// row, and random ones.
struct OracleRows {
  std::vector<RowSample> rows;
  std::vector<double> out, lse;  // out: rows x head_dim_v
};
OracleRows oracle_rows(const Params& p, int count, uint64_t seed, int threads);

// p.out (and p.lse) on the sampled rows against the oracle's.
ErrorStat sampled_out_error(const Params& p, const OracleRows& oracle);
ErrorStat sampled_lse_error(const Params& p, const OracleRows& oracle);

// Gradients of the first key/value head and its query heads in the first sequence: the part
// of the backward that a float64 oracle can recompute without the rest.
double gradient_slice_cost(const Params& p);  // multiply-adds the oracle spends on it
reference::Result oracle_gradient_slice(const Params& p);
struct GradientErrors {
  ErrorStat dq, dk, dv;
  ErrorStat combined() const;
};
GradientErrors gradient_slice_errors(const Params& p, const reference::Result& slice);

// Every element of out and lse (reference::forward or backward of the whole problem).
// Elements of packed results (reference::Result) against the oracle's.
ErrorStat packed_error(const std::vector<double>& got, const std::vector<double>& want, const char* name);
ErrorStat full_out_error(const Params& p, const reference::Result& ref);
ErrorStat full_lse_error(const Params& p, const reference::Result& ref);
GradientErrors full_gradient_errors(const Params& p, const reference::Result& ref);

std::string worst_element(const std::string& where, double got, double want);

template <typename Where>
void ErrorStat::add(double got, double want, const Where& where) {
  ++compared;
  double e = got == want ? 0.0 : std::abs(got - want);  // got == want also covers -inf == -inf
  if (std::isnan(e)) e = std::numeric_limits<double>::infinity();
  if (e > max_error || worst.empty()) {
    max_error = e;
    worst = worst_element(where(), got, want);
  }
}

}  // namespace flashattn::cli

#include "support/compare.h"

#include "reference/criterion.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace flashattn::test {
namespace {

struct Worst {
  double error = 0;
  size_t index = 0;
};

// The batch entry and in-sequence position of packed row `row`.
void locate_row(const Params& p, bool query, int64_t row, int* b, int64_t* i) {
  if (!p.varlen()) {
    const int64_t len = query ? p.seqlen_q : p.seqlen_k;
    *b = len ? int(row / len) : 0;
    *i = len ? row % len : row;
    return;
  }
  const int32_t* cu = query ? p.cu_seqlens_q : p.cu_seqlens_k;
  int batch = 0;
  while (batch + 1 < p.batch && cu[batch + 1] <= row) ++batch;
  *b = batch;
  *i = row - cu[batch];
}

std::string values_at(const std::vector<double>& got, const std::vector<double>& oracle,
                      const std::vector<double>* naive, size_t index) {
  std::ostringstream s;
  s.precision(9);
  s << "got=" << got[index] << " oracle=" << oracle[index];
  if (naive) s << " naive=" << (*naive)[index];
  return s.str();
}

Check failure(const std::string& text) { return Check{false, text + "\n", 0}; }

// Non-finite values: NaN in `got` is always wrong; infinities must agree with the oracle.
Check check_non_finite(const std::string& name, const std::vector<double>& got, const std::vector<double>& oracle,
                       const PackedLayout& where) {
  for (size_t n = 0; n < got.size(); ++n) {
    const bool bad = std::isnan(got[n]) || ((std::isinf(got[n]) || std::isinf(oracle[n])) && got[n] != oracle[n]);
    if (bad) return failure(name + ": non-finite mismatch at " + where.label(n) + ": " + values_at(got, oracle, nullptr, n));
  }
  return Check{};
}

Worst max_error(const std::vector<double>& got, const std::vector<double>& oracle) {
  Worst w;
  for (size_t n = 0; n < got.size(); ++n) {
    if (std::isinf(oracle[n])) continue;
    const double e = std::abs(got[n] - oracle[n]);
    if (e > w.error || std::isnan(e)) w = Worst{e, n};
  }
  return w;
}

Check sizes_agree(const std::string& name, size_t got, size_t expected) {
  if (got == expected) return Check{};
  return failure(name + ": " + std::to_string(got) + " values, expected " + std::to_string(expected));
}

}  // namespace

std::string PackedLayout::label(size_t index) const {
  const int64_t x = int64_t(index % cols), h = int64_t(index / cols % heads), row = int64_t(index / cols / heads);
  int b = 0;
  int64_t i = row;
  if (params) locate_row(*params, query_rows, row, &b, &i);
  std::ostringstream s;
  s << "(b=" << b << ", " << (query_rows ? "i=" : "j=") << i << ", h=" << h;
  if (cols > 1) s << ", x=" << x;
  s << ")";
  return s.str();
}

std::vector<double> packed_values(const HostTensor& t) { return t.values(); }

std::vector<double> packed_lse(const HostTensor& lse) {
  const bool varlen = lse.rank() == 2;
  const int64_t batch = varlen ? 1 : lse.size(0);
  const int64_t heads = lse.size(varlen ? 0 : 1), seq = lse.size(varlen ? 1 : 2);
  std::vector<double> out(size_t(batch * heads * seq));
  lse.for_each([&](const std::vector<int64_t>& idx, int64_t) {
    const int64_t b = varlen ? 0 : idx[0], h = idx[varlen ? 0 : 1], i = idx[varlen ? 1 : 2];
    out[size_t((b * seq + i) * heads + h)] = lse.at(idx);
  });
  return out;
}

Check& Check::operator+=(const Check& other) {
  ok = ok && other.ok;
  message += other.message;
  worst_ratio = std::max(worst_ratio, other.worst_ratio);
  return *this;
}

double error_floor(flashattn_dtype dtype) { return reference::error_floor(DType(dtype)); }

Check within_twice_naive(const std::string& name, const std::vector<double>& got, const std::vector<double>& oracle,
                         const std::vector<double>& naive, double floor, const PackedLayout& where) {
  Check c = sizes_agree(name, got.size(), oracle.size());
  c += sizes_agree(name + " (naive)", naive.size(), oracle.size());
  if (!c.ok) return c;
  c += check_non_finite(name, got, oracle, where);
  c += check_non_finite(name + " (naive)", naive, oracle, where);
  if (!c.ok) return c;
  const Worst ours = max_error(got, oracle), theirs = max_error(naive, oracle);
  const double bound = 2 * theirs.error + floor;
  c.worst_ratio = ours.error / bound;
  if (ours.error <= bound) return c;
  std::ostringstream s;
  s.precision(3);
  s << name << ": max error " << ours.error << " > bound " << bound << " = 2 x naive's " << theirs.error << " + "
    << floor << "; worst at " << where.label(ours.index) << ": " << values_at(got, oracle, &naive, ours.index)
    << "; naive's worst at " << where.label(theirs.index);
  return failure(s.str());
}

Check within_tolerance(const std::string& name, const std::vector<double>& got, const std::vector<double>& expected,
                       double atol, double rtol, const PackedLayout& where) {
  Check c = sizes_agree(name, got.size(), expected.size());
  if (!c.ok) return c;
  c += check_non_finite(name, got, expected, where);
  if (!c.ok) return c;
  size_t worst = 0;
  for (size_t n = 0; n < got.size(); ++n) {
    if (std::isinf(expected[n])) continue;
    const double ratio = std::abs(got[n] - expected[n]) / (atol + rtol * std::abs(expected[n]));
    if (ratio > c.worst_ratio) {
      c.worst_ratio = ratio;
      worst = n;
    }
  }
  if (c.worst_ratio <= 1) return c;
  std::ostringstream s;
  s.precision(9);
  s << name << ": |got - expected| exceeds " << atol << " + " << rtol << " |expected| by a factor "
    << c.worst_ratio << " at " << where.label(worst) << ": got=" << got[worst] << " expected=" << expected[worst];
  return failure(s.str());
}

Check check_forward(const CaseData& data, const Params& p, const reference::Result& oracle,
                    const reference::Result& naive) {
  const double floor = error_floor(data.spec.dtype);
  Check c = within_twice_naive("out", packed_values(data.out), oracle.out, naive.out, floor,
                               PackedLayout::queries(p, p.head_dim_v));
  c += within_twice_naive("lse", packed_lse(data.lse), oracle.lse, naive.lse, error_floor(FLASHATTN_DTYPE_FLOAT32),
                          PackedLayout::queries(p, 1));
  return c;
}

Check check_backward(const CaseData& data, const Params& p, const reference::Result& oracle,
                     const reference::Result& naive) {
  const double floor = error_floor(data.spec.dtype);
  Check c = within_twice_naive("dq", packed_values(data.dq), oracle.dq, naive.dq, floor,
                               PackedLayout::queries(p, p.head_dim));
  c += within_twice_naive("dk", packed_values(data.dk), oracle.dk, naive.dk, floor, PackedLayout::keys(p, p.head_dim));
  c += within_twice_naive("dv", packed_values(data.dv), oracle.dv, naive.dv, floor,
                          PackedLayout::keys(p, p.head_dim_v));
  return c;
}

Check check_written(const CaseData& data, Pass pass) {
  Check c;
  auto expect_written = [&](const char* name, const HostTensor& t) {
    const std::string unwritten = t.unwritten_elements(), gaps = t.written_gaps();
    if (!unwritten.empty()) c += failure(std::string(name) + ": unwritten elements " + unwritten);
    if (!gaps.empty()) c += failure(std::string(name) + ": written outside the view at " + gaps);
  };
  if (pass == Pass::forward) {
    expect_written("out", data.out);
    expect_written("lse", data.lse);
  } else {
    expect_written("dq", data.dq);
    expect_written("dk", data.dk);
    expect_written("dv", data.dv);
  }
  return c;
}

}  // namespace flashattn::test

#include "accuracy.h"

#include <random>
#include <sstream>

#include <omp.h>

#include "core/dtype.h"

namespace flashattn::cli {
namespace {

std::string coordinates(const char* name, int b, int64_t i, int h, int x) {
  std::ostringstream s;
  s << name << "[b=" << b << ", row=" << i << ", head=" << h << ", x=" << x << "]";
  return s.str();
}

enum class Side { query, key };

// Tensor `t` (rows of queries or keys) against `ref`, packed as the oracle packs it for `rp`.
ErrorStat compare(const Params& rp, const Operand& t, const std::vector<double>& ref, Side side, int dim,
                  const char* name) {
  ErrorStat e;
  const int heads = side == Side::query ? rp.heads_q : rp.heads_kv;
  for (int b = 0; b < rp.batch; ++b) {
    const int64_t rows = side == Side::query ? rp.seqlen_q_of(b) : rp.seqlen_k_of(b);
    const int64_t start = side == Side::query ? rp.q_start(b) : rp.k_start(b);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t packed = side == Side::query ? reference::packed_row_q(rp, b, i) : reference::packed_row_k(rp, b, i);
      for (int h = 0; h < heads; ++h) {
        const int64_t base = element_offset(t, b, start, i, h);
        for (int x = 0; x < dim; ++x)
          e.add(load_element(t.data, rp.dtype, base + x), ref[(packed * heads + h) * dim + x],
                [&] { return coordinates(name, b, i, h, x); });
      }
    }
  }
  return e;
}

double lse_of(const Params& p, int b, int h, int64_t i) {
  return p.lse[b * p.lse_batch + h * p.lse_head + p.q_start(b) + i];
}

// The first sequence, its first key/value head and the query heads that read it.
Params gradient_slice_params(const Params& p) {
  Params s = p;
  s.batch = 1;
  s.heads_q = p.group_size();
  s.heads_kv = 1;
  return s;
}

}  // namespace

std::string worst_element(const std::string& where, double got, double want) {
  std::ostringstream s;
  s.precision(9);
  s << where << ": got " << got << " want " << want;
  return s.str();
}

void ErrorStat::merge(const ErrorStat& other) {
  compared += other.compared;
  if (other.max_error > max_error || worst.empty()) {
    max_error = other.max_error;
    worst = other.worst;
  }
}


ErrorStat packed_error(const std::vector<double>& got, const std::vector<double>& want, const char* name) {
  ErrorStat e;
  for (size_t n = 0; n < want.size(); ++n)
    e.add(got[n], want[n], [&] { return std::string(name) + "[packed " + std::to_string(n) + "]"; });
  return e;
}

OracleRows oracle_rows(const Params& p, int count, uint64_t seed, int threads) {
  OracleRows o;
  std::vector<int> sequences;  // those with at least one query row
  for (int b = 0; b < p.batch; ++b)
    if (p.seqlen_q_of(b) > 0) sequences.push_back(b);
  if (sequences.empty()) return o;
  const int first = sequences.front();
  o.rows.push_back({first, 0, p.seqlen_q_of(first) - 1});  // under a causal mask: sees every key
  o.rows.push_back({first, 0, 0});
  std::mt19937_64 rng(seed);
  while (int(o.rows.size()) < count) {
    const int b = sequences[rng() % sequences.size()];
    o.rows.push_back({b, int(rng() % uint64_t(p.heads_q)), int64_t(rng() % uint64_t(p.seqlen_q_of(b)))});
  }
  const int64_t n = int64_t(o.rows.size()), dv = p.head_dim_v;
  o.out.resize(n * dv);
  o.lse.resize(n);
#pragma omp parallel for num_threads(threads > 0 ? threads : omp_get_max_threads()) schedule(dynamic, 1)
  for (int64_t r = 0; r < n; ++r) {
    const RowSample& s = o.rows[r];
    o.lse[r] = reference::forward_row(p, s.b, s.h, s.i, &o.out[r * dv]);
  }
  return o;
}

ErrorStat sampled_out_error(const Params& p, const OracleRows& oracle) {
  ErrorStat e;
  const int dv = p.head_dim_v;
  for (size_t r = 0; r < oracle.rows.size(); ++r) {
    const RowSample& s = oracle.rows[r];
    const int64_t base = element_offset(p.out, s.b, p.q_start(s.b), s.i, s.h);
    for (int x = 0; x < dv; ++x)
      e.add(load_element(p.out.data, p.dtype, base + x), oracle.out[r * dv + x],
            [&] { return coordinates("out", s.b, s.i, s.h, x); });
  }
  return e;
}

ErrorStat sampled_lse_error(const Params& p, const OracleRows& oracle) {
  ErrorStat e;
  for (size_t r = 0; r < oracle.rows.size(); ++r) {
    const RowSample& s = oracle.rows[r];
    e.add(lse_of(p, s.b, s.h, s.i), oracle.lse[r], [&] { return coordinates("lse", s.b, s.i, s.h, 0); });
  }
  return e;
}

double gradient_slice_cost(const Params& p) {
  const Params s = gradient_slice_params(p);
  // reference::backward: a forward (d + d_v per pair), then recomputed scores, dP, dV, dQ and dK.
  return double(s.seqlen_q_of(0)) * s.seqlen_k_of(0) * s.heads_q * (4.0 * s.head_dim + 3.0 * s.head_dim_v);
}

reference::Result oracle_gradient_slice(const Params& p) { return reference::backward(gradient_slice_params(p)); }

ErrorStat GradientErrors::combined() const {
  ErrorStat e = dq;
  e.merge(dk);
  e.merge(dv);
  return e;
}

GradientErrors gradient_slice_errors(const Params& p, const reference::Result& slice) {
  return full_gradient_errors(gradient_slice_params(p), slice);
}

ErrorStat full_out_error(const Params& p, const reference::Result& ref) {
  return compare(p, p.out, ref.out, Side::query, p.head_dim_v, "out");
}

ErrorStat full_lse_error(const Params& p, const reference::Result& ref) {
  ErrorStat e;
  for (int b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen_q_of(b); ++i)
      for (int h = 0; h < p.heads_q; ++h)
        e.add(lse_of(p, b, h, i), ref.lse[reference::packed_row_q(p, b, i) * p.heads_q + h],
              [&] { return coordinates("lse", b, i, h, 0); });
  return e;
}

GradientErrors full_gradient_errors(const Params& p, const reference::Result& ref) {
  return GradientErrors{compare(p, p.dq, ref.dq, Side::query, p.head_dim, "dq"),
                        compare(p, p.dk, ref.dk, Side::key, p.head_dim, "dk"),
                        compare(p, p.dv, ref.dv, Side::key, p.head_dim_v, "dv")};
}

}  // namespace flashattn::cli

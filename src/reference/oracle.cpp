#include "reference/oracle.h"

#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/semantics.h"

namespace flashattn::reference {
namespace {

using semantics::Dropout;
using semantics::Window;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double load(const Operand& t, DType dt, int b, int64_t start, int64_t s, int h, int x) {
  return load_element(t.data, dt, element_offset(t, b, start, s, h) + x);
}

Window window_of(const Params& p, int b) {
  return Window{p.window_left, p.window_right, p.seqlen_q_of(b), p.seqlen_k_of(b)};
}

Dropout dropout_of(const Params& p) { return Dropout::make(p.dropout_p, p.dropout_seed, p.dropout_offset); }

// Transformed score of (i, j) (scale, softcap, ALiBi) or -inf when masked.
double score(const Params& p, int b, int h, int64_t i, int64_t j, const Window& w, double* capped) {
  if (!w.visible(i, j)) return kNegInf;
  const int hk = h / p.group_size();
  double dot = 0;
  for (int x = 0; x < p.head_dim; ++x)
    dot += load(p.q, p.dtype, b, p.q_start(b), i, h, x) * load(p.k, p.dtype, b, p.k_start(b), j, hk, x);
  double s = semantics::softcap<double>(double(p.scale) * dot, double(p.softcap));
  *capped = s;
  return s + semantics::alibi_bias<double>(double(p.alibi_slope(b, h)), w, i, j);
}

// Probabilities of row i (before dropout) into prob[0..sk); returns the lse.
double row_probabilities(const Params& p, int b, int h, int64_t i, std::vector<double>& prob,
                         std::vector<double>* capped) {
  const Window w = window_of(p, b);
  const int64_t sk = w.seqlen_k;
  prob.assign(sk, 0.0);
  if (capped) capped->assign(sk, 0.0);
  double m = kNegInf;
  for (int64_t j = 0; j < sk; ++j) {
    double c = 0;
    prob[j] = score(p, b, h, i, j, w, &c);
    if (capped) (*capped)[j] = c;
    m = std::max(m, prob[j]);
  }
  if (m == kNegInf) {
    prob.assign(sk, 0.0);
    return kNegInf;
  }
  double sum = 0;
  for (int64_t j = 0; j < sk; ++j) sum += (prob[j] = std::exp(prob[j] - m));
  for (int64_t j = 0; j < sk; ++j) prob[j] /= sum;
  return m + std::log(sum);
}

// keep / (1 - p) for each key of row i: the factor dropout multiplies a probability by.
void dropout_factors(const Params& p, int b, int h, int64_t i, int64_t sk, std::vector<double>& z) {
  const Dropout drop = dropout_of(p);
  z.assign(sk, 1.0);
  if (!drop.enabled()) return;
  const int64_t bh = int64_t(b) * p.heads_q + h;
  const double inv_keep = 1.0 / (1.0 - double(p.dropout_p));
  for (int64_t j = 0; j < sk; ++j) z[j] = drop.keep(bh, i, j) ? inv_keep : 0.0;
}

}  // namespace

int64_t packed_row_q(const Params& p, int b, int64_t i) { return p.varlen() ? p.cu_seqlens_q[b] + i : int64_t(b) * p.seqlen_q + i; }
int64_t packed_row_k(const Params& p, int b, int64_t j) { return p.varlen() ? p.cu_seqlens_k[b] + j : int64_t(b) * p.seqlen_k + j; }

double forward_row(const Params& p, int b, int h, int64_t i, double* out_row) {
  std::vector<double> prob, z;
  const double lse = row_probabilities(p, b, h, i, prob, nullptr);
  const int64_t sk = int64_t(prob.size());
  dropout_factors(p, b, h, i, sk, z);
  const int hk = h / p.group_size();
  for (int x = 0; x < p.head_dim_v; ++x) out_row[x] = 0;
  for (int64_t j = 0; j < sk; ++j) {
    const double w = prob[j] * z[j];
    if (w == 0) continue;
    for (int x = 0; x < p.head_dim_v; ++x) out_row[x] += w * load(p.v, p.dtype, b, p.k_start(b), j, hk, x);
  }
  return lse;
}

static int64_t rows_of(const Params& p, bool query) {
  if (!p.varlen()) return int64_t(p.batch) * (query ? p.seqlen_q : p.seqlen_k);
  return query ? p.cu_seqlens_q[p.batch] : p.cu_seqlens_k[p.batch];
}

Result forward(const Params& p) {
  Result r;
  r.rows_q = rows_of(p, true);
  r.rows_k = rows_of(p, false);
  r.out.assign(r.rows_q * p.heads_q * p.head_dim_v, 0.0);
  r.lse.assign(r.rows_q * p.heads_q, kNegInf);
  for (int b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.seqlen_q_of(b); ++i)
      for (int h = 0; h < p.heads_q; ++h) {
        const int64_t row = packed_row_q(p, b, i) * p.heads_q + h;
        r.lse[row] = forward_row(p, b, h, i, &r.out[row * p.head_dim_v]);
      }
  return r;
}

Result backward(const Params& p) {
  Result r = forward(p);
  const int d = p.head_dim, dv_dim = p.head_dim_v;
  r.dq.assign(r.rows_q * p.heads_q * d, 0.0);
  r.dk.assign(r.rows_k * p.heads_kv * d, 0.0);
  r.dv.assign(r.rows_k * p.heads_kv * dv_dim, 0.0);
  std::vector<double> prob, capped, z, dp;
  for (int b = 0; b < p.batch; ++b) {
    const int64_t sq = p.seqlen_q_of(b), sk = p.seqlen_k_of(b);
    for (int h = 0; h < p.heads_q; ++h) {
      const int hk = h / p.group_size();
      for (int64_t i = 0; i < sq; ++i) {
        row_probabilities(p, b, h, i, prob, &capped);
        dropout_factors(p, b, h, i, sk, z);
        auto dout = [&](int x) { return load(p.dout, p.dtype, b, p.q_start(b), i, h, x); };
        // dP_ij = z_ij * dO_i . V_j ; D_i = sum_j P_ij dP_ij ; dS_ij = P_ij (dP_ij - D_i) softcap'(s_ij)
        dp.assign(sk, 0.0);
        double D = 0;
        for (int64_t j = 0; j < sk; ++j) {
          if (prob[j] == 0) continue;
          double dot = 0;
          for (int x = 0; x < dv_dim; ++x) dot += dout(x) * load(p.v, p.dtype, b, p.k_start(b), j, hk, x);
          dp[j] = z[j] * dot;
          D += prob[j] * dp[j];
        }
        const int64_t qrow = packed_row_q(p, b, i);
        for (int64_t j = 0; j < sk; ++j) {
          if (prob[j] == 0) continue;
          const int64_t krow = packed_row_k(p, b, j);
          const double pz = prob[j] * z[j];
          for (int x = 0; x < dv_dim; ++x) r.dv[(krow * p.heads_kv + hk) * dv_dim + x] += pz * dout(x);
          const double ds = prob[j] * (dp[j] - D) *
                            semantics::softcap_grad<double>(capped[j], double(p.softcap)) * double(p.scale);
          for (int x = 0; x < d; ++x) {
            r.dq[(qrow * p.heads_q + h) * d + x] += ds * load(p.k, p.dtype, b, p.k_start(b), j, hk, x);
            r.dk[(krow * p.heads_kv + hk) * d + x] += ds * load(p.q, p.dtype, b, p.q_start(b), i, h, x);
          }
        }
      }
    }
  }
  return r;
}

}  // namespace flashattn::reference

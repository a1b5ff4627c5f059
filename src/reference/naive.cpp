#include "reference/naive.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/semantics.h"

namespace flashattn::reference {
namespace {

using semantics::Dropout;
using semantics::Window;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// x as the storage dtype holds it.
float round_to(DType t, float x) {
  switch (t) {
    case DType::f32: return x;
    case DType::f16: return f16_to_float(float_to_f16(x));
    case DType::bf16: return bf16_to_float(float_to_bf16(x));
  }
  return x;
}

// Row-major float32 matrix.
struct Matrix {
  int rows = 0, cols = 0;
  std::vector<float> data;
  Matrix(int r, int c) : rows(r), cols(c), data(size_t(r) * c, 0.f) {}
  float* operator[](int r) { return data.data() + size_t(r) * cols; }
  const float* operator[](int r) const { return data.data() + size_t(r) * cols; }
};

// Rows [0, n) of head h of sequence b of an operand, as float32.
Matrix load_rows(const Params& p, const Operand& t, int b, int64_t start, int n, int h, int dim) {
  Matrix m(n, dim);
  for (int r = 0; r < n; ++r)
    for (int x = 0; x < dim; ++x) m[r][x] = load_element(t.data, p.dtype, element_offset(t, b, start, r, h) + x);
  return m;
}

float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int x = 0; x < n; ++x) s += a[x] * b[x];
  return s;
}

// The materialised forward of one (batch, query head).
struct HeadForward {
  Matrix prob;    // P = round(softmax(S))
  Matrix ptilde;  // round(P * dropout factor); equals P without dropout
  Matrix factor;  // keep / (1 - p), or 0
  Matrix cap_grad;  // d softcap / d s
  Matrix out;
  std::vector<float> lse;
};

HeadForward head_forward(const Params& p, int b, int h, const Matrix& q, const Matrix& k, const Matrix& v) {
  const int sq = q.rows, sk = k.rows, dv = p.head_dim_v;
  const Window w{p.window_left, p.window_right, sq, sk};
  const Dropout drop = Dropout::make(p.dropout_p, p.dropout_seed, p.dropout_offset);
  const float slope = p.alibi_slope(b, h);
  const int64_t batch_head = int64_t(b) * p.heads_q + h;
  HeadForward f{Matrix(sq, sk), Matrix(sq, sk), Matrix(sq, sk), Matrix(sq, sk), Matrix(sq, dv),
                std::vector<float>(sq, kNegInf)};
  std::vector<float> s(sk);
  for (int i = 0; i < sq; ++i) {
    float m = kNegInf;
    for (int j = 0; j < sk; ++j) {
      const float capped = semantics::softcap<float>(p.scale * dot(q[i], k[j], p.head_dim), p.softcap);
      f.cap_grad[i][j] = semantics::softcap_grad<float>(capped, p.softcap);
      const float biased = capped + semantics::alibi_bias<float>(slope, w, i, j);
      s[j] = w.visible(i, j) ? round_to(p.dtype, biased) : kNegInf;
      m = std::max(m, s[j]);
    }
    if (m == kNegInf) continue;  // no visible key: P = 0, out = 0, lse = -inf
    float sum = 0.f;
    for (int j = 0; j < sk; ++j) sum += (s[j] = std::exp(s[j] - m));
    f.lse[i] = m + std::log(sum);
    for (int j = 0; j < sk; ++j) {
      f.prob[i][j] = round_to(p.dtype, s[j] / sum);
      f.factor[i][j] = drop.keep(batch_head, i, j) ? drop.inv_keep : 0.f;
      f.ptilde[i][j] = drop.enabled() ? round_to(p.dtype, f.prob[i][j] * f.factor[i][j]) : f.prob[i][j];
    }
    for (int x = 0; x < dv; ++x) {
      float acc = 0.f;
      for (int j = 0; j < sk; ++j) acc += f.ptilde[i][j] * v[j][x];
      f.out[i][x] = round_to(p.dtype, acc);
    }
  }
  return f;
}

int64_t rows_of(const Params& p, bool query) {
  if (!p.varlen()) return int64_t(p.batch) * (query ? p.seqlen_q : p.seqlen_k);
  return query ? p.cu_seqlens_q[p.batch] : p.cu_seqlens_k[p.batch];
}

Result empty_result(const Params& p, bool backward) {
  Result r;
  r.rows_q = rows_of(p, true);
  r.rows_k = rows_of(p, false);
  r.out.assign(r.rows_q * p.heads_q * p.head_dim_v, 0.0);
  r.lse.assign(r.rows_q * p.heads_q, -std::numeric_limits<double>::infinity());
  if (backward) {
    r.dq.assign(r.rows_q * p.heads_q * p.head_dim, 0.0);
    r.dk.assign(r.rows_k * p.heads_kv * p.head_dim, 0.0);
    r.dv.assign(r.rows_k * p.heads_kv * p.head_dim_v, 0.0);
  }
  return r;
}

// Copies a head's rows into the packed layout of Result.
void scatter_rows(const Matrix& m, int64_t first_row, int heads, int h, std::vector<double>& dst) {
  for (int r = 0; r < m.rows; ++r)
    for (int x = 0; x < m.cols; ++x) dst[((first_row + r) * heads + h) * m.cols + x] = m[r][x];
}

void store_forward(const Params& p, int b, int h, const HeadForward& f, Result& r) {
  const int64_t first = packed_row_q(p, b, 0);
  scatter_rows(f.out, first, p.heads_q, h, r.out);
  for (int i = 0; i < f.out.rows; ++i) r.lse[(first + i) * p.heads_q + h] = f.lse[i];
}

// Gradients of one query head; adds its unrounded dK, dV contributions to dk_acc, dv_acc.
void head_backward(const Params& p, const HeadForward& f, const Matrix& q, const Matrix& k, const Matrix& v,
                   const Matrix& dout, Matrix& dq, Matrix& dk_acc, Matrix& dv_acc) {
  const int sq = q.rows, sk = k.rows, d = p.head_dim, dv = p.head_dim_v;
  const bool dropout = p.has_dropout();
  Matrix ds(sq, sk);
  for (int i = 0; i < sq; ++i) {
    const float rowsum = dot(dout[i], f.out[i], dv);  // = sum_j P_ij dP_ij
    for (int j = 0; j < sk; ++j) {
      const float dp_tilde = round_to(p.dtype, dot(dout[i], v[j], dv));
      const float dp = dropout ? round_to(p.dtype, f.factor[i][j] * dp_tilde) : dp_tilde;
      ds[i][j] = round_to(p.dtype, f.prob[i][j] * (dp - rowsum) * f.cap_grad[i][j]);
    }
  }
  for (int i = 0; i < sq; ++i)
    for (int x = 0; x < d; ++x) {
      float acc = 0.f;
      for (int j = 0; j < sk; ++j) acc += ds[i][j] * k[j][x];
      dq[i][x] = round_to(p.dtype, p.scale * acc);
    }
  for (int j = 0; j < sk; ++j) {
    for (int x = 0; x < d; ++x) {
      float acc = 0.f;
      for (int i = 0; i < sq; ++i) acc += ds[i][j] * q[i][x];
      dk_acc[j][x] += p.scale * acc;
    }
    for (int x = 0; x < dv; ++x) {
      float acc = 0.f;
      for (int i = 0; i < sq; ++i) acc += f.ptilde[i][j] * dout[i][x];
      dv_acc[j][x] += acc;
    }
  }
}

void round_all(DType t, Matrix& m) {
  for (float& x : m.data) x = round_to(t, x);
}

Result run(const Params& p, bool backward) {
  Result r = empty_result(p, backward);
  const int d = p.head_dim, dv = p.head_dim_v;
  for (int b = 0; b < p.batch; ++b) {
    const int sq = p.seqlen_q_of(b), sk = p.seqlen_k_of(b);
    const int64_t qs = p.q_start(b), ks = p.k_start(b);
    for (int hk = 0; hk < p.heads_kv; ++hk) {
      const Matrix k = load_rows(p, p.k, b, ks, sk, hk, d);
      const Matrix v = load_rows(p, p.v, b, ks, sk, hk, dv);
      Matrix dk_acc(sk, d), dv_acc(sk, dv);
      for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
        const Matrix q = load_rows(p, p.q, b, qs, sq, h, d);
        const HeadForward f = head_forward(p, b, h, q, k, v);
        store_forward(p, b, h, f, r);
        if (!backward) continue;
        const Matrix dout = load_rows(p, p.dout, b, qs, sq, h, dv);
        Matrix dq(sq, d);
        head_backward(p, f, q, k, v, dout, dq, dk_acc, dv_acc);
        scatter_rows(dq, packed_row_q(p, b, 0), p.heads_q, h, r.dq);
      }
      if (!backward) continue;
      round_all(p.dtype, dk_acc);
      round_all(p.dtype, dv_acc);
      scatter_rows(dk_acc, packed_row_k(p, b, 0), p.heads_kv, hk, r.dk);
      scatter_rows(dv_acc, packed_row_k(p, b, 0), p.heads_kv, hk, r.dv);
    }
  }
  return r;
}

}  // namespace

Result naive_forward(const Params& p) { return run(p, false); }
Result naive_backward(const Params& p) { return run(p, true); }

}  // namespace flashattn::reference

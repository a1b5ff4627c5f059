#include "naive.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <omp.h>

#include "core/dtype.h"
#include "core/semantics.h"
#include "cpu/kernels.h"

namespace flashattn::cli {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kRowBlock = 64;  // rows (or keys) of one matrix product handed to a thread

int thread_count(int threads) { return threads > 0 ? threads : omp_get_max_threads(); }

// The masks, biases and dropout of one (sequence, query head).
struct HeadRule {
  semantics::Window window;
  semantics::Dropout dropout;
  float scale, softcap, slope;
  int64_t batch_head;

  HeadRule(const Params& p, int b, int h)
      : window{p.window_left, p.window_right, p.seqlen_q_of(b), p.seqlen_k_of(b)},
        dropout(semantics::Dropout::make(p.dropout_p, p.dropout_seed, p.dropout_offset)),
        scale(p.scale),
        softcap(p.softcap),
        slope(p.alibi_slope(b, h)),
        batch_head(int64_t(b) * p.heads_q + h) {}

  float keep_factor(int64_t i, int64_t j) const { return dropout.keep(batch_head, i, j) ? dropout.inv_keep : 0.f; }
  // Raw q.k products -> softcapped, scaled scores, in place.
  void cap(float* row, int n) const {
    for (int j = 0; j < n; ++j) row[j] = semantics::softcap(scale * row[j], softcap);
  }
  // Row i of P = softmax(capped + ALiBi) over the visible keys (zeros when none is).
  void softmax(int64_t i, const float* capped, float* prob, int n) const {
    float m = kNegInf;
    for (int j = 0; j < n; ++j) {
      prob[j] = window.visible(i, j) ? capped[j] + semantics::alibi_bias(slope, window, i, j) : kNegInf;
      m = std::max(m, prob[j]);
    }
    if (m == kNegInf) {
      std::fill(prob, prob + n, 0.f);
      return;
    }
    for (int j = 0; j < n; ++j) prob[j] -= m;
    cpu::exp_inplace(prob, n);
    float sum = 0;
    for (int j = 0; j < n; ++j) sum += prob[j];
    const float inv = 1.f / sum;
    for (int j = 0; j < n; ++j) prob[j] *= inv;
  }
  void drop(int64_t i, float* prob, int n) const {
    if (dropout.enabled())
      for (int j = 0; j < n; ++j) prob[j] *= keep_factor(i, j);
  }
};

// Rows [0, n) of head h of sequence b of `t` as float32: dst[r][x], or dst[x][r] when transposed.
void pack(const Params& p, const Operand& t, int b, int64_t start, int n, int h, int dim, float* dst, bool transposed,
          int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int r = 0; r < n; ++r) {
    const int64_t base = element_offset(t, b, start, r, h);
    for (int x = 0; x < dim; ++x)
      dst[transposed ? int64_t(x) * n + r : int64_t(r) * dim + x] = load_element(t.data, p.dtype, base + x);
  }
}

void unpack(const float* src, const Params& p, const Operand& t, int b, int64_t start, int n, int h, int dim,
            int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int r = 0; r < n; ++r) {
    const int64_t base = element_offset(t, b, start, r, h);
    for (int x = 0; x < dim; ++x) store_element(t.data, p.dtype, base + x, src[int64_t(r) * dim + x]);
  }
}

// C[m x n] = A[m x k] B[k x n], blocks of rows of C spread over the threads.
void matmul(int m, int n, int k, const float* a, const float* b, float* c, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int i0 = 0; i0 < m; i0 += kRowBlock) {
    const int rows = std::min(kRowBlock, m - i0);
    std::fill(c + int64_t(i0) * n, c + int64_t(i0 + rows) * n, 0.f);
    cpu::gemm_nn(rows, n, k, a + int64_t(i0) * k, k, b, n, c + int64_t(i0) * n, n);
  }
}

// C[m x n] += A[k x m]^T B[k x n], blocks of rows of C spread over the threads.
void matmul_at_accumulate(int m, int n, int k, const float* a, const float* b, float* c, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int j0 = 0; j0 < m; j0 += kRowBlock)
    cpu::gemm_tn(std::min(kRowBlock, m - j0), n, k, a + j0, m, b, n, c + int64_t(j0) * n, n);
}

size_t floats(size_t n) { return n * sizeof(float); }

}  // namespace

NaiveFootprint naive_forward_footprint(const Params& p, int) {
  const size_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim, dv = p.head_dim_v;
  NaiveFootprint f;
  f.matrix_bytes = floats(sq * sk);
  f.total_bytes = f.matrix_bytes + floats(sq * d + d * sk + sk * dv + sq * dv);
  return f;
}

NaiveFootprint naive_backward_footprint(const Params& p, int threads) {
  const size_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim, dv = p.head_dim_v;
  NaiveFootprint f;
  f.matrix_bytes = floats(2 * sq * sk);
  f.total_bytes = f.matrix_bytes + floats(2 * sq * d + 2 * sk * d + d * sk + dv * sk + sq * dv + sk * dv +
                                          size_t(thread_count(threads)) * kRowBlock * sk);
  return f;
}

void naive_forward(const Params& p, int threads) {
  const int nt = thread_count(threads);
  const int d = p.head_dim, dv = p.head_dim_v;
  std::vector<float> s(size_t(p.seqlen_q) * p.seqlen_k), q(size_t(p.seqlen_q) * d), kt(size_t(d) * p.seqlen_k),
      v(size_t(p.seqlen_k) * dv), out(size_t(p.seqlen_q) * dv);
  for (int b = 0; b < p.batch; ++b) {
    const int sq = p.seqlen_q_of(b), sk = p.seqlen_k_of(b);
    for (int h = 0; h < p.heads_q; ++h) {
      const int hk = h / p.group_size();
      if (h % p.group_size() == 0) {
        pack(p, p.k, b, p.k_start(b), sk, hk, d, kt.data(), true, nt);
        pack(p, p.v, b, p.k_start(b), sk, hk, dv, v.data(), false, nt);
      }
      pack(p, p.q, b, p.q_start(b), sq, h, d, q.data(), false, nt);
      const HeadRule rule(p, b, h);
      matmul(sq, sk, d, q.data(), kt.data(), s.data(), nt);  // S = QK^T, masked entries too
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int i = 0; i < sq; ++i) {  // P = dropout(softmax(S)), in place
        float* row = &s[size_t(i) * sk];
        rule.cap(row, sk);
        rule.softmax(i, row, row, sk);
        rule.drop(i, row, sk);
      }
      matmul(sq, dv, sk, s.data(), v.data(), out.data(), nt);  // O = PV
      unpack(out.data(), p, p.out, b, p.q_start(b), sq, h, dv, nt);
    }
  }
}

void naive_backward(const Params& p, int threads) {
  const int nt = thread_count(threads);
  const int d = p.head_dim, dv = p.head_dim_v;
  const size_t max_q = p.seqlen_q, max_k = p.seqlen_k;
  std::vector<float> scores(max_q * max_k), prob(max_q * max_k);  // the two N x N matrices
  std::vector<float> q(max_q * d), dout(max_q * dv), dq(max_q * d), k(max_k * d), kt(d * max_k), vt(dv * max_k),
      dk(max_k * d), dvacc(max_k * dv), dp_blocks(size_t(nt) * kRowBlock * max_k);
  for (int b = 0; b < p.batch; ++b) {
    const int sq = p.seqlen_q_of(b), sk = p.seqlen_k_of(b);
    for (int hk = 0; hk < p.heads_kv; ++hk) {
      pack(p, p.k, b, p.k_start(b), sk, hk, d, k.data(), false, nt);
      pack(p, p.k, b, p.k_start(b), sk, hk, d, kt.data(), true, nt);
      pack(p, p.v, b, p.k_start(b), sk, hk, dv, vt.data(), true, nt);
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dvacc.begin(), dvacc.end(), 0.f);
      for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
        pack(p, p.q, b, p.q_start(b), sq, h, d, q.data(), false, nt);
        pack(p, p.dout, b, p.q_start(b), sq, h, dv, dout.data(), false, nt);
        const HeadRule rule(p, b, h);
        // Recompute S (kept softcapped, for the softcap gradient) and P.
        matmul(sq, sk, d, q.data(), kt.data(), scores.data(), nt);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int i = 0; i < sq; ++i) {
          rule.cap(&scores[size_t(i) * sk], sk);
          rule.softmax(i, &scores[size_t(i) * sk], &prob[size_t(i) * sk], sk);
        }
        // Per block of rows: dP = z (dO V^T); dS = P (dP - rowsum(P dP)) softcap' scale, written
        // over the scores; then P becomes the dropped P~ = z P.
        std::vector<float>& ds = scores;
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int i0 = 0; i0 < sq; i0 += kRowBlock) {
          const int rows = std::min(kRowBlock, sq - i0);
          float* dp = &dp_blocks[size_t(omp_get_thread_num()) * kRowBlock * sk];
          std::fill(dp, dp + size_t(rows) * sk, 0.f);
          cpu::gemm_nn(rows, sk, dv, &dout[size_t(i0) * dv], dv, vt.data(), sk, dp, sk);
          for (int i = i0; i < i0 + rows; ++i) {
            float* dpi = dp + size_t(i - i0) * sk;
            float* pi = &prob[size_t(i) * sk];
            float* si = &ds[size_t(i) * sk];
            rule.drop(i, dpi, sk);
            float delta = 0;
            for (int j = 0; j < sk; ++j) delta += pi[j] * dpi[j];
            for (int j = 0; j < sk; ++j)
              si[j] = pi[j] * (dpi[j] - delta) * semantics::softcap_grad(si[j], rule.softcap) * rule.scale;
            rule.drop(i, pi, sk);
          }
        }
        matmul_at_accumulate(sk, dv, sq, prob.data(), dout.data(), dvacc.data(), nt);  // dV += P~^T dO
        matmul_at_accumulate(sk, d, sq, ds.data(), q.data(), dk.data(), nt);           // dK += dS^T Q
        matmul(sq, d, sk, ds.data(), k.data(), dq.data(), nt);                         // dQ = dS K
        unpack(dq.data(), p, p.dq, b, p.q_start(b), sq, h, d, nt);
      }
      unpack(dk.data(), p, p.dk, b, p.k_start(b), sk, hk, d, nt);
      unpack(dvacc.data(), p, p.dv, b, p.k_start(b), sk, hk, dv, nt);
    }
  }
}

}  // namespace flashattn::cli

// CPU benchmark: our forward and backward beside OpenBLAS sgemm (the machine's matrix ceiling)
// and naive attention built on sgemm (what NumPy or an unfused framework does), in one run.
//   cpu_bench [--threads N] [--repeats N (best of, default 3)] [--quick]
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace {

double best_seconds(const std::function<void()>& f, int repeats) {
  f();  // warm-up
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double sgemm_gflops(int n, int repeats) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  const double s = best_seconds(
      [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); },
      repeats);
  return 2.0 * n * n * double(n) / s / 1e9;
}

// Naive attention of one head at a time: S = scale Q K^T (N x N, held), softmax, O = P V.
void naive_attention(const float* q, const float* k, const float* v, float* out, int n, int heads, int d,
                     std::vector<float>& scores) {
  const float scale = 1.f / std::sqrt(float(d));
  const int ld = heads * d;
  for (int h = 0; h < heads; ++h) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, d, scale, q + h * d, ld, k + h * d, ld, 0.f,
                scores.data(), n);
#pragma omp parallel for
    for (int i = 0; i < n; ++i) {
      float* row = scores.data() + size_t(i) * n;
      const float m = *std::max_element(row, row + n);
      float sum = 0;
      for (int j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - m));
      const float inv = 1.f / sum;
      for (int j = 0; j < n; ++j) row[j] *= inv;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.f, scores.data(), n, v + h * d, ld, 0.f,
                out + h * d, ld);
  }
}

struct Problem {
  int heads, seqlen_q, seqlen_k, dim;
  bool causal;
  flashattn_dtype dtype;
  const char* label() const { return dtype == FLASHATTN_DTYPE_BFLOAT16 ? "bfloat16" : "float32"; }
};

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

struct Timing {
  double fwd = 0, bwd = 0;
};

Timing time_flashattn(const Problem& pb, int threads, int repeats, bool backward) {
  const size_t nq = size_t(pb.seqlen_q) * pb.heads * pb.dim, nk = size_t(pb.seqlen_k) * pb.heads * pb.dim;
  const size_t elem = pb.dtype == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2;
  std::vector<char> q(nq * elem), k(nk * elem), v(nk * elem), out(nq * elem), dout(nq * elem), dq(nq * elem),
      dk(nk * elem), dv(nk * elem);
  std::vector<float> lse(size_t(pb.heads) * pb.seqlen_q);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (auto* buf : {&q, &k, &v, &dout}) {
    for (size_t i = 0; i < buf->size() / elem; ++i) {
      const float x = normal(rng);
      if (elem == 4) std::memcpy(buf->data() + 4 * i, &x, 4);
      else { const uint16_t h = to_bf16(x); std::memcpy(buf->data() + 2 * i, &h, 2); }
    }
  }
  using flashattn::Tensor;
  auto view = [&](std::vector<char>& b, int s) { return Tensor::bshd(b.data(), pb.dtype, 1, s, pb.heads, pb.dim); };
  Tensor tq = view(q, pb.seqlen_q), tk = view(k, pb.seqlen_k), tv = view(v, pb.seqlen_k), to = view(out, pb.seqlen_q),
         tdo = view(dout, pb.seqlen_q), tdq = view(dq, pb.seqlen_q), tdk = view(dk, pb.seqlen_k),
         tdv = view(dv, pb.seqlen_k);
  Tensor tl(lse.data(), {1, pb.heads, pb.seqlen_q});
  const flashattn::Options opt = flashattn::Options().causal(pb.causal).threads(threads).backend(FLASHATTN_BACKEND_CPU);
  Timing t;
  t.fwd = best_seconds([&] { flashattn::forward(tq, tk, tv, to, &tl, opt); }, repeats);
  if (backward) t.bwd = best_seconds([&] { flashattn::backward(tdo, tq, tk, tv, to, tl, tdq, tdk, tdv, opt); }, repeats);
  return t;
}

double attention_flops(const Problem& pb) {  // the FlashAttention papers' convention
  const double full = 4.0 * pb.heads * pb.seqlen_q * double(pb.seqlen_k) * pb.dim;
  return pb.causal ? full / 2 : full;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeats = 3;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--quick")) quick = true, repeats = 1;
    else { std::fprintf(stderr, "usage: cpu_bench [--threads N] [--repeats N] [--quick]\n"); return 2; }
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  // The machine's clock varies run to run: sgemm is measured before and after the attention rows
  // (which are measured in between), and the ratios use the better of the two.
  const int gemm_n = quick ? 1024 : 2048;
  const double sgemm_before = sgemm_gflops(gemm_n, repeats);
  std::printf("flashattn %s on the CPU, %d threads; OpenBLAS core: %s\n", flashattn_version_string(), threads,
              openblas_get_corename());
  std::printf("OpenBLAS sgemm %d^3 before the attention rows: %.1f GFLOP/s\n\n", gemm_n, sgemm_before);
  struct Row {
    Problem pb;
    double fwd, bwd;
    std::string naive;
  };
  std::vector<Row> rows;
  const int n = quick ? 1024 : 4096;
  const Problem problems[] = {
      {8, n, n, 64, false, FLASHATTN_DTYPE_FLOAT32},   {8, n, n, 128, false, FLASHATTN_DTYPE_FLOAT32},
      {8, n, n, 128, true, FLASHATTN_DTYPE_FLOAT32},   {8, n, n, 64, true, FLASHATTN_DTYPE_FLOAT32},
      {8, n, n, 128, false, FLASHATTN_DTYPE_BFLOAT16}, {8, 1, 16 * n, 128, false, FLASHATTN_DTYPE_FLOAT32},
  };
  for (const Problem& pb : problems) {
    const bool decode = pb.seqlen_q == 1;
    const Timing t = time_flashattn(pb, threads, repeats, !decode);
    std::string naive = "-";
    if (!decode && pb.dtype == FLASHATTN_DTYPE_FLOAT32 && !pb.causal) {
      const size_t sz = size_t(pb.seqlen_q) * pb.heads * pb.dim;
      std::vector<float> q(sz, 0.1f), k(sz, 0.2f), v(sz, 0.3f), out(sz), scores(size_t(pb.seqlen_q) * pb.seqlen_k);
      const double s = best_seconds([&] { naive_attention(q.data(), k.data(), v.data(), out.data(), pb.seqlen_q, pb.heads, pb.dim, scores); }, repeats);
      naive = std::to_string(int(attention_flops(pb) / s / 1e9 + 0.5));
    }
    rows.push_back({pb, attention_flops(pb) / t.fwd / 1e9, decode ? 0 : 2.5 * attention_flops(pb) / t.bwd / 1e9, naive});
  }
  const double sgemm_after = sgemm_gflops(gemm_n, repeats);
  const double sgemm = std::max(sgemm_before, sgemm_after);
  std::printf("OpenBLAS sgemm %d^3 after: %.1f GFLOP/s; ratios below use %.1f\n\n", gemm_n, sgemm_after, sgemm);
  std::printf("%-9s %5s %6s %6s %4s %-6s | %9s %9s %9s | %6s %6s\n", "dtype", "heads", "Nq", "Nk", "d", "causal",
              "fwd GF/s", "bwd GF/s", "naive", "fwd/sg", "bwd/sg");
  for (const Row& r : rows) {
    const Problem& pb = r.pb;
    const bool decode = pb.seqlen_q == 1;
    char bwd[32] = "-", bwd_ratio[32] = "-";
    if (!decode) {
      std::snprintf(bwd, sizeof bwd, "%.1f", r.bwd);
      std::snprintf(bwd_ratio, sizeof bwd_ratio, "%.2f", r.bwd / sgemm);
    }
    std::printf("%-9s %5d %6d %6d %4d %-6s | %9.1f %9s %9s | %6.2f %6s\n", pb.label(), pb.heads, pb.seqlen_q,
                pb.seqlen_k, pb.dim, pb.causal ? "yes" : "no", r.fwd, bwd, r.naive.c_str(), r.fwd / sgemm, bwd_ratio);
    if (decode)
      std::printf("%40s(decode: %.1f GB/s of K and V read)\n", "",
                  2.0 * pb.seqlen_k * pb.heads * pb.dim * 4 * r.fwd / attention_flops(pb));
  }
  return 0;
}

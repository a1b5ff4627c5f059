// `flashattn check`: random problems through the chosen backend, forward and backward, every
// element compared with the float64 oracle.
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "accuracy.h"
#include "commands.h"
#include "errors.h"
#include "problem.h"
#include "reference/naive.h"

namespace flashattn::cli {
namespace {

// Random shapes are shrunk until batch * heads * seqlen_q * seqlen_k * head_dim is at most
// this, so that the float64 oracle stays quick.
constexpr double kCaseBudget = 2e7;

class CaseRandom {
 public:
  explicit CaseRandom(uint64_t seed) : engine_(seed) {}
  int between(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(engine_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  template <typename T>
  T pick(std::initializer_list<T> options) { return options.begin()[between(0, int(options.size()) - 1)]; }
  uint64_t bits() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

int random_seqlen(CaseRandom& r) { return r.pick({1, 17, 63, 64, 65, 128, 129, r.between(2, 300)}); }

// Splits `batch` sequences of at most `max_len` rows, some of them empty.
std::vector<int32_t> random_lengths(CaseRandom& r, int batch, int max_len) {
  std::vector<int32_t> lengths(batch);
  for (int32_t& n : lengths) n = r.chance(0.15) ? 0 : r.between(1, max_len);
  return lengths;
}

double case_cost(const ProblemSpec& s) {
  return double(s.batch) * s.heads_q * s.seqlen_q * s.seqlen_k * s.head_dim;
}

ProblemSpec random_case(CaseRandom& r, const ProblemFlags& pins, flashattn_backend backend) {
  ProblemSpec s;
  s.seed = r.bits();
  s.batch = r.between(1, 3);
  const int group = r.pick({1, 2, 3, 4});
  s.heads_kv = r.between(1, 3);
  s.heads_q = s.heads_kv * group;
  s.seqlen_q = random_seqlen(r);
  s.seqlen_k = r.chance(0.3) ? s.seqlen_q : random_seqlen(r);
  s.head_dim = r.pick({8, 16, 24, 32, 40, 64, 80, 96, 128, 160, 192, 256});
  s.dtype = backend == FLASHATTN_BACKEND_CUDA
                ? r.pick({FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
                : r.pick({FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16});
  switch (r.between(0, 3)) {
    case 0: break;
    case 1: s.causal = true; break;
    case 2: s.window = {r.between(-1, 40), r.between(-1, 40)}; break;
    case 3: s.causal = true; s.window = {r.between(0, 40), 0}; break;
  }
  if (r.chance(0.25)) s.softcap = r.pick({2.5f, 10.f, 30.f});
  s.alibi = r.chance(0.25);
  if (r.chance(0.25)) s.dropout = r.pick({0.1f, 0.3f});

  s = with_flags(s, pins);
  // with_flags ties the key/value heads to a pinned --heads; keep GQA in play instead: a random
  // divisor of pinned query heads, or a random multiple of pinned key/value heads.
  if (pins.heads && !pins.kv_heads) {
    std::vector<int> divisors;
    for (int kv = 1; kv <= s.heads_q; ++kv)
      if (s.heads_q % kv == 0) divisors.push_back(kv);
    s.heads_kv = divisors[r.between(0, int(divisors.size()) - 1)];
  }
  if (pins.kv_heads && !pins.heads) s.heads_q = s.heads_kv * group;
  while (case_cost(s) > kCaseBudget) {
    int* longer = nullptr;
    if (!pins.seqlen_q && s.seqlen_q > 1) longer = &s.seqlen_q;
    if (!pins.seqlen_k && s.seqlen_k > 1 && (!longer || s.seqlen_k > *longer)) longer = &s.seqlen_k;
    if (!longer) break;
    *longer /= 2;
  }
  if (!pins.seqlen_q && !pins.seqlen_k && r.chance(0.25)) {
    s.varlen_q = random_lengths(r, s.batch, s.seqlen_q);
    s.varlen_k = random_lengths(r, s.batch, s.seqlen_k);
  }
  return s;
}

struct Outcome {
  enum Verdict { pass, fail, skip } verdict;
  std::string summary;               // the errors, or why the case was skipped
  std::vector<std::string> details;  // on failure: each failing tensor's worst element
};

std::string short_number(double x) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1e", x);
  return buffer;
}

// One tensor's error, the bound it must stay under, and whether it does.
struct Judged {
  const char* name;
  ErrorStat ours;
  double bound;
  bool ok() const { return ours.max_error <= bound; }
};

Outcome run_case(const ProblemSpec& spec, flashattn_backend backend, int threads) {
  try {
    Problem problem(spec, backend, threads, true);
    problem.forward();
    problem.backward();
    problem.fetch_outputs();
    problem.fetch_gradients();
    const Params p = problem.host_params(Pass::backward);
    const reference::Result oracle = reference::backward(p), naive = reference::naive_backward(p);
    const GradientErrors g = full_gradient_errors(p, oracle);
    const double floor = error_floor(p.dtype), lse_floor = error_floor(DType::f32);
    auto judge = [&](const char* name, const ErrorStat& ours, const std::vector<double>& naive_values,
                     const std::vector<double>& oracle_values, double floor_of) {
      return Judged{name, ours, error_bound(packed_error(naive_values, oracle_values, name), floor_of)};
    };
    const Judged judged[] = {
        judge("out", full_out_error(p, oracle), naive.out, oracle.out, floor),
        judge("lse", full_lse_error(p, oracle), naive.lse, oracle.lse, lse_floor),
        judge("dq", g.dq, naive.dq, oracle.dq, floor),
        judge("dk", g.dk, naive.dk, oracle.dk, floor),
        judge("dv", g.dv, naive.dv, oracle.dv, floor),
    };
    Outcome o{Outcome::pass, "", {}};
    for (const Judged& j : judged) {
      o.summary += std::string(o.summary.empty() ? "" : " ") + j.name + " " + short_number(j.ours.max_error) + "/" +
                   short_number(j.bound);
      if (!j.ok()) {
        o.verdict = Outcome::fail;
        o.details.push_back(std::string(j.name) + ": error " + short_number(j.ours.max_error) + " > bound " +
                            short_number(j.bound) + ", worst at " + j.ours.worst);
      }
    }
    return o;
  } catch (const CliError& e) {
    if (e.status == FLASHATTN_ERROR_UNSUPPORTED) return Outcome{Outcome::skip, e.what(), {}};
    return Outcome{Outcome::fail, e.what(), {}};
  }
}

}  // namespace

int check_command(const CliArgs& args) {
  const flashattn_backend backend = resolve_backend(args.backend);
  CaseRandom random(args.seed);
  int passed = 0, failed = 0, skipped = 0;
  std::printf("check on backend %s: each tensor's largest error against the float64 oracle / its bound,\n"
              "2 x the error of a naive implementation in the same dtype + %.0e (%.0e for float32)\n",
              flashattn_backend_name(backend), error_floor(DType::f16), error_floor(DType::f32));
  for (int c = 1; c <= args.cases; ++c) {
    const ProblemSpec spec = random_case(random, args.problem, backend);
    const Outcome o = run_case(spec, backend, args.threads);
    static const char* const kVerdicts[] = {"PASS", "FAIL", "SKIP"};
    std::printf("[%3d/%d] %s  %s | %s\n", c, args.cases, kVerdicts[o.verdict], spec.describe().c_str(),
                o.summary.c_str());
    for (const std::string& d : o.details) std::printf("          %s\n", d.c_str());
    std::fflush(stdout);
    (o.verdict == Outcome::pass ? passed : o.verdict == Outcome::fail ? failed : skipped) += 1;
  }
  const bool ok = failed == 0 && passed > 0;
  std::printf("check on backend %s: %d passed, %d failed, %d skipped (unsupported) of %d cases: %s\n",
              flashattn_backend_name(backend), passed, failed, skipped, args.cases, ok ? "PASS" : "FAIL");
  if (passed == 0 && failed == 0) std::printf("no case ran: every drawn case was unsupported by this backend\n");
  return ok ? 0 : kExitFailure;
}

}  // namespace flashattn::cli

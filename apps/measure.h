// Timing and checking one pass of the library, or of the naive baseline, on a Problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "accuracy.h"
#include "naive.h"
#include "problem.h"

namespace flashattn::cli {

struct MeasureSettings {
  int threads = 0;  // 0: all cores
  int repeat = 0;   // see measure() in device.h
  uint64_t seed = 0;
};

struct PassResult {
  Pass pass = Pass::forward;
  double ms = 0;  // median of `runs` timed runs
  int runs = 0;
  double flops = 0;
  size_t extra_bytes = 0;
  std::optional<double> max_error;  // empty: not checked
  std::string checked;              // what max_error covers, or why nothing was checked

  double gflops() const { return ms > 0 ? flops / (ms * 1e6) : 0; }
  const char* pass_name() const { return pass == Pass::forward ? "fwd" : "bwd"; }
};

// The library's forward; `oracle` receives the oracle's sampled rows, for the naive check.
PassResult measure_forward(Problem& problem, const MeasureSettings& settings, OracleRows* oracle);
// The library's backward (after measure_forward); `slice` receives the oracle's gradients of
// one head group when they were affordable.
PassResult measure_backward(Problem& problem, const MeasureSettings& settings,
                            std::optional<reference::Result>* slice);

// Naive attention is skipped when its seqlen_q x seqlen_k matrices would exceed this.
constexpr size_t kNaiveMatrixLimit = size_t(2) << 30;

struct NaiveResult {
  NaiveFootprint footprint;        // what it allocates, or would have
  std::optional<PassResult> pass;  // empty: skipped
};
NaiveResult measure_naive_forward(const Problem& problem, const MeasureSettings& settings, const OracleRows& oracle);
NaiveResult measure_naive_backward(const Problem& problem, const MeasureSettings& settings,
                                   const std::optional<reference::Result>& slice);

}  // namespace flashattn::cli

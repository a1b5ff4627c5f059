#include "measure.h"

#include <sstream>

namespace flashattn::cli {
namespace {

constexpr int kSampledRows = 16;
// The float64 oracle's backward checks one head group only while it costs at most this many
// multiply-adds (a few seconds); beyond, `flashattn check` covers the gradients on small shapes.
constexpr double kGradientCheckBudget = 2e9;

std::string sampled_rows_note(const OracleRows& oracle) {
  return "out, " + std::to_string(oracle.rows.size()) + " sampled rows";
}

constexpr const char* kSliceNote = "dq, dk, dv of kv head 0 and its query heads, sequence 0";

std::string skipped_gradient_note(double cost) {
  std::ostringstream s;
  s.precision(2);
  s << "not checked: the float64 oracle would need " << cost << " multiply-adds (limit " << kGradientCheckBudget
    << "); flashattn check tests gradients";
  return s.str();
}

}  // namespace

PassResult measure_forward(Problem& problem, const MeasureSettings& settings, OracleRows* oracle) {
  PassResult r;
  r.pass = Pass::forward;
  r.flops = forward_flops(problem.spec());
  r.extra_bytes = problem.forward_workspace_bytes();
  const Timing t = measure([&] { problem.forward(); }, problem.on_cuda(), settings.repeat);
  r.ms = t.ms;
  r.runs = t.runs;
  problem.fetch_outputs();
  const Params p = problem.host_params(Pass::forward);
  *oracle = oracle_rows(p, kSampledRows, settings.seed, settings.threads);
  r.max_error = sampled_out_error(p, *oracle).max_error;
  r.checked = sampled_rows_note(*oracle);
  return r;
}

PassResult measure_backward(Problem& problem, const MeasureSettings& settings,
                            std::optional<reference::Result>* slice) {
  PassResult r;
  r.pass = Pass::backward;
  r.flops = backward_flops(problem.spec());
  r.extra_bytes = problem.backward_workspace_bytes();
  const Timing t = measure([&] { problem.backward(); }, problem.on_cuda(), settings.repeat);
  r.ms = t.ms;
  r.runs = t.runs;
  problem.fetch_gradients();
  const Params p = problem.host_params(Pass::backward);
  const double cost = gradient_slice_cost(p);
  if (cost > kGradientCheckBudget) {
    r.checked = skipped_gradient_note(cost);
    slice->reset();
    return r;
  }
  *slice = oracle_gradient_slice(p);
  r.max_error = gradient_slice_errors(p, **slice).combined().max_error;
  r.checked = kSliceNote;
  return r;
}

NaiveResult measure_naive_forward(const Problem& problem, const MeasureSettings& settings, const OracleRows& oracle) {
  Problem::HostOutputs outputs;
  const Params p = problem.host_params_into(Pass::forward, outputs);
  NaiveResult n;
  n.footprint = naive_forward_footprint(p, settings.threads);
  if (n.footprint.matrix_bytes > kNaiveMatrixLimit) return n;
  PassResult r;
  r.pass = Pass::forward;
  r.flops = forward_flops(problem.spec());
  r.extra_bytes = n.footprint.total_bytes;
  const Timing t = measure([&] { naive_forward(p, settings.threads); }, false, settings.repeat);
  r.ms = t.ms;
  r.runs = t.runs;
  r.max_error = sampled_out_error(p, oracle).max_error;
  r.checked = sampled_rows_note(oracle);
  n.pass = r;
  return n;
}

NaiveResult measure_naive_backward(const Problem& problem, const MeasureSettings& settings,
                                   const std::optional<reference::Result>& slice) {
  Problem::HostOutputs outputs;
  const Params p = problem.host_params_into(Pass::backward, outputs);
  NaiveResult n;
  n.footprint = naive_backward_footprint(p, settings.threads);
  if (n.footprint.matrix_bytes > kNaiveMatrixLimit) return n;
  PassResult r;
  r.pass = Pass::backward;
  r.flops = backward_flops(problem.spec());
  r.extra_bytes = n.footprint.total_bytes;
  const Timing t = measure([&] { naive_backward(p, settings.threads); }, false, settings.repeat);
  r.ms = t.ms;
  r.runs = t.runs;
  if (slice) {
    r.max_error = gradient_slice_errors(p, *slice).combined().max_error;
    r.checked = kSliceNote;
  } else {
    r.checked = "not checked (as for flashattn)";
  }
  n.pass = r;
  return n;
}

}  // namespace flashattn::cli

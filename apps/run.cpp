// `flashattn run`: one problem on the library and on the naive baseline, side by side.
#include <iostream>
#include <vector>

#include <omp.h>

#include "commands.h"
#include "measure.h"
#include "report.h"

namespace flashattn::cli {

flashattn_dtype default_dtype(flashattn_backend backend) {
  return backend == FLASHATTN_BACKEND_CUDA ? FLASHATTN_DTYPE_BFLOAT16 : FLASHATTN_DTYPE_FLOAT32;
}

int cpu_threads(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

int run_command(const CliArgs& args) {
  const flashattn_backend backend = resolve_backend(args.backend);
  ProblemSpec defaults;  // B=1, H=8, N=4096, d=64
  defaults.causal = true;
  defaults.dtype = default_dtype(backend);
  defaults.seed = args.seed;
  const ProblemSpec spec = with_flags(defaults, args.problem);
  Problem problem(spec, backend, args.threads, args.backward);
  const MeasureSettings settings{args.threads, args.repeat, args.seed};

  std::vector<RunRow> rows;
  OracleRows oracle;
  RunRow forward{measure_forward(problem, settings, &oracle), {}};
  forward.naive = measure_naive_forward(problem, settings, oracle);
  rows.push_back(forward);
  if (args.backward) {
    std::optional<reference::Result> slice;
    RunRow backward{measure_backward(problem, settings, &slice), {}};
    backward.naive = measure_naive_backward(problem, settings, slice);
    rows.push_back(backward);
  }

  const std::string backend_name = flashattn_backend_name(backend);
  if (args.json) {
    for (const RunRow& row : rows) std::cout << json_line(backend_name, spec, row.flash, &row.naive) << "\n";
  } else {
    print_run(std::cout, backend_name, cpu_threads(args.threads), spec, rows);
  }
  return 0;
}

}  // namespace flashattn::cli

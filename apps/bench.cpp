// `flashattn bench`: the library over a sweep of sequence lengths, head dims and masks.
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "measure.h"
#include "report.h"

namespace flashattn::cli {
namespace {

constexpr int kGpuTokens = 16384;      // GPU sweep: batch * seqlen
constexpr int kGpuModelWidth = 2048;  // GPU sweep: heads * head_dim

// The sweep's problems, each value given on the command line pinned, duplicates dropped.
std::vector<ProblemSpec> sweep(const CliArgs& args, flashattn_backend backend) {
  const bool gpu = backend == FLASHATTN_BACKEND_CUDA;
  const std::vector<int> seqlens = gpu ? std::vector<int>{512, 1024, 2048, 4096, 8192, 16384}
                                       : std::vector<int>{512, 1024, 2048, 4096};
  std::vector<ProblemSpec> specs;
  std::set<std::string> seen;
  for (int head_dim : {64, 128})
    for (bool causal : {false, true})
      for (int n : seqlens) {
        ProblemSpec s;
        s.seqlen_q = s.seqlen_k = n;
        s.head_dim = head_dim;
        s.causal = causal;
        s.batch = gpu ? kGpuTokens / n : 1;
        s.heads_q = s.heads_kv = gpu ? kGpuModelWidth / head_dim : 8;
        s.dtype = default_dtype(backend);
        s.seed = args.seed;
        s = with_flags(s, args.problem);
        if (seen.insert(s.describe()).second) specs.push_back(s);
      }
  return specs;
}

}  // namespace

int bench_command(const CliArgs& args) {
  const flashattn_backend backend = resolve_backend(args.backend);
  const std::string backend_name = flashattn_backend_name(backend);
  const MeasureSettings settings{args.threads, args.repeat, args.seed};
  if (!args.json) print_bench_header(std::cout);
  for (const ProblemSpec& spec : sweep(args, backend)) {
    Problem problem(spec, backend, args.threads, args.backward);
    OracleRows oracle;
    std::vector<PassResult> results{measure_forward(problem, settings, &oracle)};
    if (args.backward) {
      std::optional<reference::Result> slice;
      results.push_back(measure_backward(problem, settings, &slice));
    }
    for (const PassResult& r : results) {
      if (args.json) std::cout << json_line(backend_name, spec, r, nullptr) << "\n";
      else print_bench_row(std::cout, backend_name, spec, r);
    }
    std::cout.flush();
  }
  return 0;
}

}  // namespace flashattn::cli

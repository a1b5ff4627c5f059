// What the CLI prints: run's side-by-side table, bench's table, and one JSON object per line.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "measure.h"
#include "problem.h"

namespace flashattn::cli {

std::string format_bytes(double bytes);  // "1.25 MiB"

struct RunRow {
  PassResult flash;
  NaiveResult naive;
};

// run: one line per pass and implementation, then what the comparison shows.
void print_run(std::ostream& os, const std::string& backend, int threads, const ProblemSpec& spec,
               const std::vector<RunRow>& rows);

// bench (and run --json): one JSON object; `naive` adds the baseline's fields.
std::string json_line(const std::string& backend, const ProblemSpec& spec, const PassResult& r,
                      const NaiveResult* naive);

void print_bench_header(std::ostream& os);
void print_bench_row(std::ostream& os, const std::string& backend, const ProblemSpec& spec, const PassResult& r);

}  // namespace flashattn::cli

#include "report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "cpu/kernels.h"
#include "device.h"
#include "flashattn/flashattn.h"

namespace flashattn::cli {
namespace {

std::string printf_string(const char* format, auto... values) {
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, format, values...);
  return buffer;
}

std::string error_text(const PassResult& r) {
  return r.max_error ? printf_string("%.2e  (%s)", *r.max_error, r.checked.c_str()) : "-  (" + r.checked + ")";
}

std::string run_line(const char* pass, const char* method, const PassResult& r) {
  return printf_string("%-4s  %-9s  %10.2f  %9.1f  %12s   ", pass, method, r.ms, r.gflops(),
                       format_bytes(double(r.extra_bytes)).c_str()) +
         error_text(r);
}

std::string skipped_naive_line(const char* pass, const NaiveResult& n) {
  return printf_string("%-4s  %-9s  skipped: its %s matrices would need %s (limit %s)", pass, "naive",
                       pass[0] == 'f' ? "Nq x Nk" : "two Nq x Nk",
                       format_bytes(double(n.footprint.matrix_bytes)).c_str(),
                       format_bytes(double(kNaiveMatrixLimit)).c_str());
}

// "fwd: flashattn runs 6.15x as fast as naive with 1/431 of its extra memory (...); max errors ..."
std::string comparison(const RunRow& row, const ProblemSpec& spec) {
  const PassResult& f = row.flash;
  const NaiveFootprint& naive = row.naive.footprint;
  const double memory_ratio = double(naive.total_bytes) / double(std::max<size_t>(f.extra_bytes, 1));
  std::string text = std::string(f.pass_name()) + ": flashattn ";
  if (row.naive.pass) text += printf_string("runs %.2fx as fast as naive, ", row.naive.pass->ms / f.ms);
  text += printf_string("needs 1/%.0f of naive's extra memory (%s vs %s, of which %s %s %d x %d)", memory_ratio,
                        format_bytes(double(f.extra_bytes)).c_str(), format_bytes(double(naive.total_bytes)).c_str(),
                        format_bytes(double(naive.matrix_bytes)).c_str(),
                        f.pass == Pass::forward ? "is the score matrix" : "are the two matrices", spec.seqlen_q,
                        spec.seqlen_k);
  if (row.naive.pass && f.max_error && row.naive.pass->max_error)
    text += printf_string("; max errors %.1e vs %.1e", *f.max_error, *row.naive.pass->max_error);
  return text;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string json_number(double x) { return std::isfinite(x) ? printf_string("%.6g", x) : "null"; }
std::string json_optional(const std::optional<double>& x) { return x ? json_number(*x) : "null"; }

std::string window_text(const ProblemSpec& s) {
  const int right = s.causal ? 0 : s.window.right;
  return printf_string("%d,%d", s.window.left, right);
}

}  // namespace

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? printf_string("%.0f B", bytes) : printf_string("%.2f %s", bytes, units[u]);
}

void print_run(std::ostream& os, const std::string& backend, int threads, const ProblemSpec& spec,
               const std::vector<RunRow>& rows) {
  os << "flashattn " << flashattn_version_string() << " run: " << spec.describe() << "\n";
  os << "backend " << backend << " (" << threads << " CPU threads"
     << (backend == "cuda" ? " for the naive baseline; " + cuda_kernels(spec.dtype, spec.head_dim, spec.dropout)
                           : std::string(", ") + cpu::cpu_isa() + " kernels")
     << "); naive = float32 attention that stores the"
     << " Nq x Nk matrix of each head, on the CPU\n\n";
  os << printf_string("%-4s  %-9s  %10s  %9s  %12s   %s\n", "pass", "method", "time (ms)", "GFLOP/s", "extra memory",
                      "max |error| vs float64 oracle");
  for (const RunRow& row : rows) {
    const char* pass = row.flash.pass_name();
    os << run_line(pass, "flashattn", row.flash) << "\n";
    os << (row.naive.pass ? run_line(pass, "naive", *row.naive.pass) : skipped_naive_line(pass, row.naive)) << "\n";
  }
  os << "\n";
  for (const RunRow& row : rows) os << comparison(row, spec) << "\n";
}

std::string json_line(const std::string& backend, const ProblemSpec& s, const PassResult& r,
                      const NaiveResult* naive) {
  std::ostringstream j;
  j << "{\"backend\":" << json_string(backend) << ",\"pass\":" << json_string(r.pass_name())
    << ",\"dtype\":" << json_string(dtype_name(s.dtype)) << ",\"batch\":" << s.batch << ",\"heads_q\":" << s.heads_q
    << ",\"heads_kv\":" << s.heads_kv << ",\"seqlen_q\":" << s.seqlen_q << ",\"seqlen_k\":" << s.seqlen_k
    << ",\"head_dim\":" << s.head_dim << ",\"causal\":" << (s.causal ? "true" : "false") << ",\"window\":["
    << window_text(s) << "],\"softcap\":" << json_number(s.softcap) << ",\"alibi\":" << (s.alibi ? "true" : "false")
    << ",\"dropout\":" << json_number(s.dropout) << ",\"ms\":" << json_number(r.ms) << ",\"runs\":" << r.runs
    << ",\"tflops\":" << json_number(r.gflops() / 1e3) << ",\"peak_extra_bytes\":" << r.extra_bytes
    << ",\"max_error\":" << json_optional(r.max_error) << ",\"checked\":" << json_string(r.checked);
  if (naive) {
    j << ",\"naive_matrix_bytes\":" << naive->footprint.matrix_bytes;
    if (naive->pass) {
      const PassResult& n = *naive->pass;
      j << ",\"naive_ms\":" << json_number(n.ms) << ",\"naive_tflops\":" << json_number(n.gflops() / 1e3)
        << ",\"naive_extra_bytes\":" << n.extra_bytes << ",\"naive_max_error\":" << json_optional(n.max_error);
    } else {
      j << ",\"naive_ms\":null,\"naive_tflops\":null,\"naive_extra_bytes\":null,\"naive_max_error\":null";
    }
  }
  j << "}";
  return j.str();
}

void print_bench_header(std::ostream& os) {
  os << printf_string("%-7s %-4s %-8s %4s %4s %4s %6s %6s %4s %-6s %-8s %10s %9s %12s %10s\n", "backend", "pass",
                      "dtype", "B", "Hq", "Hkv", "Nq", "Nk", "d", "causal", "window", "ms", "TFLOP/s", "extra",
                      "max_error");
}

void print_bench_row(std::ostream& os, const std::string& backend, const ProblemSpec& s, const PassResult& r) {
  const std::string error = r.max_error ? printf_string("%.2e", *r.max_error) : "-";
  os << printf_string("%-7s %-4s %-8s %4d %4d %4d %6d %6d %4d %-6s %-8s %10.3f %9.4g %12s %10s\n", backend.c_str(),
                      r.pass_name(), dtype_name(s.dtype), s.batch, s.heads_q, s.heads_kv, s.seqlen_q, s.seqlen_k,
                      s.head_dim, s.causal ? "yes" : "no", window_text(s).c_str(), r.ms, r.gflops() / 1e3,
                      format_bytes(double(r.extra_bytes)).c_str(), error.c_str());
}

}  // namespace flashattn::cli

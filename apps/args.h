// The command line: `flashattn <run|check|bench> [flags]`, parsed into values, with the rule of
// which flags each subcommand accepts. Problem flags are optional: `run` fills the gaps with
// its default problem, `check` randomises them, `bench` sweeps them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn::cli {

enum class Command { run, check, bench };

struct Window {
  int left = -1, right = -1;
};

// The attention problem as given on the command line; unset members were not given.
struct ProblemFlags {
  std::optional<int> batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim;
  std::optional<flashattn_dtype> dtype;
  std::optional<bool> causal;
  std::optional<Window> window;
  std::optional<float> softcap, dropout;
  bool alibi = false;
};

struct CliArgs {
  Command command = Command::run;
  ProblemFlags problem;
  flashattn_backend backend = FLASHATTN_BACKEND_AUTO;
  bool backward = false;
  bool json = false;
  int threads = 0;  // 0: all cores
  int repeat = 0;   // timed runs after the warm-up; 0: as many as fit in about a second (at most 10)
  int cases = 40;   // check: random cases
  uint64_t seed = 0;
  bool help = false;
};

// Throws CliError (exit 2) naming the flag and value on any mistake.
CliArgs parse_args(int argc, char** argv);
const char* usage_text();

const char* dtype_name(flashattn_dtype dtype);

}  // namespace flashattn::cli

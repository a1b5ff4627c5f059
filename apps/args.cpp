#include "args.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <vector>

#include "errors.h"

namespace flashattn::cli {
namespace {

constexpr unsigned kRun = 1, kCheck = 2, kBench = 4, kAll = kRun | kCheck | kBench;

unsigned bit_of(Command c) { return c == Command::run ? kRun : c == Command::check ? kCheck : kBench; }
const char* name_of(Command c) { return c == Command::run ? "run" : c == Command::check ? "check" : "bench"; }

template <typename Int>
Int parse_integer(std::string_view flag, std::string_view text, Int min_value) {
  Int value{};
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (err != std::errc() || end != text.data() + text.size())
    fail_usage(flag, "=", text, " is not an integer");
  if (value < min_value) fail_usage(flag, "=", text, " must be >= ", min_value);
  return value;
}

float parse_float(std::string_view flag, std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(value))
    fail_usage(flag, "=", text, " is not a finite number");
  return float(value);
}

Window parse_window(std::string_view flag, std::string_view text) {
  const size_t comma = text.find(',');
  if (comma == std::string_view::npos)
    fail_usage(flag, "=", text, " must be LEFT,RIGHT (e.g. 128,0; -1 means unbounded)");
  return Window{parse_integer<int>(flag, text.substr(0, comma), INT32_MIN),
                parse_integer<int>(flag, text.substr(comma + 1), INT32_MIN)};
}

flashattn_dtype parse_dtype(std::string_view flag, std::string_view text) {
  if (text == "float32" || text == "fp32") return FLASHATTN_DTYPE_FLOAT32;
  if (text == "float16" || text == "fp16") return FLASHATTN_DTYPE_FLOAT16;
  if (text == "bfloat16" || text == "bf16") return FLASHATTN_DTYPE_BFLOAT16;
  fail_usage(flag, "=", text, " is not one of float32, float16, bfloat16");
}

flashattn_backend parse_backend(std::string_view flag, std::string_view text) {
  if (text == "auto") return FLASHATTN_BACKEND_AUTO;
  if (text == "cpu") return FLASHATTN_BACKEND_CPU;
  if (text == "cuda") return FLASHATTN_BACKEND_CUDA;
  fail_usage(flag, "=", text, " is not one of auto, cpu, cuda");
}

struct Flag {
  std::string_view name;
  bool takes_value;
  unsigned commands;  // which subcommands accept it
  const char* why_not = "";  // said when a subcommand outside `commands` gets it
  std::function<void(CliArgs&, std::string_view flag, std::string_view value)> apply;
};

const std::vector<Flag>& flags() {
  using V = std::string_view;
  static const std::vector<Flag> table = {
      {"--batch", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.batch = parse_integer<int>(f, v, 1); }},
      {"--heads", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.heads = parse_integer<int>(f, v, 1); }},
      {"--kv-heads", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.kv_heads = parse_integer<int>(f, v, 1); }},
      {"--seqlen", true, kAll, "",
       [](CliArgs& a, V f, V v) { a.problem.seqlen_q = a.problem.seqlen_k = parse_integer<int>(f, v, 1); }},
      {"--seqlen-q", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.seqlen_q = parse_integer<int>(f, v, 1); }},
      {"--seqlen-k", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.seqlen_k = parse_integer<int>(f, v, 1); }},
      {"--head-dim", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.head_dim = parse_integer<int>(f, v, 1); }},
      {"--dtype", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.dtype = parse_dtype(f, v); }},
      {"--causal", false, kAll, "", [](CliArgs& a, V, V) { a.problem.causal = true; }},
      {"--no-causal", false, kAll, "", [](CliArgs& a, V, V) { a.problem.causal = false; }},
      {"--window", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.window = parse_window(f, v); }},
      {"--softcap", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.softcap = parse_float(f, v); }},
      {"--alibi", false, kAll, "", [](CliArgs& a, V, V) { a.problem.alibi = true; }},
      {"--dropout", true, kAll, "", [](CliArgs& a, V f, V v) { a.problem.dropout = parse_float(f, v); }},
      {"--backward", false, kRun | kBench, "check always tests both passes",
       [](CliArgs& a, V, V) { a.backward = true; }},
      {"--backend", true, kAll, "", [](CliArgs& a, V f, V v) { a.backend = parse_backend(f, v); }},
      {"--json", false, kRun | kBench, "check prints one line per case",
       [](CliArgs& a, V, V) { a.json = true; }},
      {"--threads", true, kAll, "", [](CliArgs& a, V f, V v) { a.threads = parse_integer<int>(f, v, 0); }},
      {"--repeat", true, kRun | kBench, "check does not time anything",
       [](CliArgs& a, V f, V v) { a.repeat = parse_integer<int>(f, v, 1); }},
      {"--seed", true, kAll, "", [](CliArgs& a, V f, V v) { a.seed = parse_integer<uint64_t>(f, v, 0); }},
      {"--cases", true, kCheck, "only check draws random cases",
       [](CliArgs& a, V f, V v) { a.cases = parse_integer<int>(f, v, 1); }},
  };
  return table;
}

Command parse_command(std::string_view word) {
  if (word == "run") return Command::run;
  if (word == "check") return Command::check;
  if (word == "bench") return Command::bench;
  fail_usage("unknown command '", word, "'; expected run, check or bench (see flashattn --help)");
}

}  // namespace

CliArgs parse_args(int argc, char** argv) {
  CliArgs args;
  if (argc < 2) fail_usage("missing command; expected run, check or bench (see flashattn --help)");
  const std::string_view first = argv[1];
  if (first == "--help" || first == "-h") {
    args.help = true;
    return args;
  }
  args.command = parse_command(first);
  for (int i = 2; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word == "--help" || word == "-h") {
      args.help = true;
      continue;
    }
    std::string_view value;
    const size_t eq = word.find('=');
    const bool inline_value = word.starts_with("--") && eq != std::string_view::npos;
    if (inline_value) {
      value = word.substr(eq + 1);
      word = word.substr(0, eq);
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags())
      if (f.name == word) flag = &f;
    if (!flag) fail_usage("unknown flag '", word, "' (see flashattn --help)");
    if (!(flag->commands & bit_of(args.command)))
      fail_usage(word, " does not apply to '", name_of(args.command), "': ", flag->why_not);
    if (flag->takes_value && !inline_value) {
      if (i + 1 >= argc) fail_usage(word, " needs a value");
      value = argv[++i];
    } else if (!flag->takes_value && inline_value) {
      fail_usage(word, " takes no value, got '", value, "'");
    }
    flag->apply(args, word, value);
  }
  return args;
}

const char* dtype_name(flashattn_dtype dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FLOAT32: return "float32";
    case FLASHATTN_DTYPE_FLOAT16: return "float16";
    case FLASHATTN_DTYPE_BFLOAT16: return "bfloat16";
    case FLASHATTN_DTYPE_INT32: return "int32";
  }
  return "unknown";
}

const char* usage_text() {
  return R"(flashattn: exact, IO-aware attention (FlashAttention) from the command line.

usage: flashattn run   [problem flags] [--backward] [--backend B] [--json] [--threads N] [--repeat N] [--seed N]
       flashattn check [problem flags] [--backend B] [--cases N] [--threads N] [--seed N]
       flashattn bench [problem flags] [--backward] [--backend B] [--json] [--threads N] [--repeat N] [--seed N]

run    Runs one problem on the chosen backend and prints its time, GFLOP/s, extra memory and the
       largest error against a float64 oracle on sampled rows, beside a naive float32 attention that
       materialises the seqlen_q x seqlen_k matrix of each head (skipped when that matrix would
       exceed 2 GiB). Default problem: B=1, H=8, N=4096, d=64, causal; float32 on the CPU,
       bfloat16 on a GPU.
check  Randomised correctness sweep against the float64 oracle, forward and backward: odd sequence
       lengths, masks, softcap, ALiBi, dropout, GQA, variable length, every dtype. One line per
       case, then PASS or FAIL; the exit status is 1 if any case failed. Problem flags pin a value
       for every case; the rest are drawn at random.
bench  A sweep printed as a table (--json: one JSON object per line). On the CPU: B=1, H=8,
       N in {512, 1024, 2048, 4096}; on a GPU: B*N = 16384 tokens, H = 2048/d,
       N in {512, ..., 16384}; d in {64, 128}, causal off and on. Problem flags pin a value.

problem flags
  --batch N            batch size                        --heads N       query heads
  --kv-heads N         key/value heads (GQA/MQA; must divide --heads; default --heads)
  --seqlen N           sequence length of queries and keys (--seqlen-q N, --seqlen-k N set one)
  --head-dim N         head dimension                    --dtype T       float32, float16, bfloat16
  --causal, --no-causal  causal mask (bottom-right aligned); run's default problem is causal
  --window L,R         local attention: query i sees keys i-L..i+R (-1: unbounded); implies --no-causal
                       unless --causal is given
  --softcap X          scores become X*tanh(s/X)         --alibi         ALiBi biases, standard slopes
  --dropout P          dropout probability in [0, 1)

other flags
  --backward           also run and time the backward pass (FLOPs counted as 2.5x the forward)
  --backend B          auto (default: cuda when present, else cpu), cpu, cuda
  --json               one JSON object per line instead of a table
  --threads N          CPU threads (0: all cores; the naive baseline uses the same number)
  --repeat N           timed runs after one warm-up run (default: as many as fit in ~1 s, at most 10)
  --cases N            check: number of random cases (default 40)
  --seed N             seed of the random inputs, dropout and check's cases (default 0)
  --help               this text

FLOPs follow the FlashAttention papers: forward 4*B*H*Nq*Nk*d, halved when causal (with Nq = Nk);
other masks count their visible query-key pairs exactly. Extra memory is everything the call
allocates besides its inputs and outputs.
Exit status: 0 success, 1 the library refused the problem or a check failed, 2 bad command line.
)";
}

}  // namespace flashattn::cli

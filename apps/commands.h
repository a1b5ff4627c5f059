// The three subcommands; each returns the process's exit status or throws CliError.
#pragma once

#include "args.h"

namespace flashattn::cli {

int run_command(const CliArgs& args);
int check_command(const CliArgs& args);
int bench_command(const CliArgs& args);

// The default problem's dtype: float32 on the CPU, bfloat16 on a GPU.
flashattn_dtype default_dtype(flashattn_backend backend);
// CPU threads in use: --threads, or all cores.
int cpu_threads(int requested);

}  // namespace flashattn::cli

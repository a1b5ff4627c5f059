// flashattn: the command-line front door. See usage_text() in args.cpp.
#include <cstdio>
#include <exception>

#include "args.h"
#include "commands.h"
#include "errors.h"

int main(int argc, char** argv) {
  using namespace flashattn::cli;
  try {
    const CliArgs args = parse_args(argc, argv);
    if (args.help) {
      std::fputs(usage_text(), stdout);
      return 0;
    }
    switch (args.command) {
      case Command::run: return run_command(args);
      case Command::check: return check_command(args);
      case Command::bench: return bench_command(args);
    }
  } catch (const CliError& e) {
    std::fprintf(stderr, "flashattn: error: %s\n", e.what());
    return e.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashattn: error: %s\n", e.what());
    return kExitFailure;
  }
  return kExitFailure;
}

// How the CLI fails: a message and an exit status (1: the library or the machine refused,
// 2: the command line is wrong), thrown from wherever the failure is found and printed by main.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn::cli {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct CliError : std::runtime_error {
  int exit_code;
  flashattn_status status;  // the library's, when the library refused
  CliError(int code, const std::string& message, flashattn_status library_status = FLASHATTN_SUCCESS)
      : std::runtime_error(message), exit_code(code), status(library_status) {}
};

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

template <typename... Parts>
[[noreturn]] void fail_usage(const Parts&... parts) {
  throw CliError(kExitUsage, concat(parts...));
}

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw CliError(kExitFailure, concat(parts...));
}

// Turns a failed library call into a CliError carrying the library's own message.
inline void require_ok(flashattn_status status, const char* call) {
  if (status != FLASHATTN_SUCCESS)
    throw CliError(kExitFailure,
                   concat(call, " failed (", flashattn_status_string(status), "): ", flashattn_last_error()), status);
}

}  // namespace flashattn::cli

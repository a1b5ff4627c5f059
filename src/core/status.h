// Failure carried from validation and backends to the API layer: a status and a message that
// names the argument and the offending value.
#pragma once

#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include "flashattn/flashattn.h"

namespace flashattn {

struct Status {
  flashattn_status code = FLASHATTN_SUCCESS;
  std::string message;

  static Status ok() { return {}; }
  bool is_ok() const { return code == FLASHATTN_SUCCESS; }
};

// Message pieces are appended without iostreams: the library runs inside other programs (Python
// extensions among them) whose C++ runtime may differ from ours, and error paths must not depend
// on its stream and locale state.
inline void append_part(std::string& s, std::string_view v) { s += v; }
inline void append_part(std::string& s, const char* v) { s += v ? v : "(null)"; }
inline void append_part(std::string& s, const void* v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", v);
  s += buf;
}
template <typename T>
  requires std::is_arithmetic_v<T>
void append_part(std::string& s, T v) {
  char buf[48];
  if constexpr (std::is_floating_point_v<T>) {
    std::snprintf(buf, sizeof buf, "%g", double(v));
    s += buf;
  } else if constexpr (std::is_same_v<T, bool>) {
    s += v ? "true" : "false";
  } else {
    s.append(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  }
}

template <typename... Parts>
Status make_status(flashattn_status code, const Parts&... parts) {
  Status st{code, {}};
  (append_part(st.message, parts), ...);
  return st;
}
template <typename... Parts>
Status invalid(const Parts&... parts) { return make_status(FLASHATTN_ERROR_INVALID_ARGUMENT, parts...); }
template <typename... Parts>
Status unsupported(const Parts&... parts) { return make_status(FLASHATTN_ERROR_UNSUPPORTED, parts...); }

#define FA_TRY(expr)                           \
  do {                                         \
    ::flashattn::Status fa_status_ = (expr);   \
    if (!fa_status_.is_ok()) return fa_status_; \
  } while (0)

}  // namespace flashattn

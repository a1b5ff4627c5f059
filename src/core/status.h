// Failure carried from validation and backends to the API layer: a status and a message that
// names the argument and the offending value.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "flashattn/flashattn.h"

namespace flashattn {

struct Status {
  flashattn_status code = FLASHATTN_SUCCESS;
  std::string message;

  static Status ok() { return {}; }
  bool is_ok() const { return code == FLASHATTN_SUCCESS; }
  explicit operator bool() const { return is_ok(); }
};

template <typename... Parts>
Status make_status(flashattn_status code, const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return Status{code, s.str()};
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

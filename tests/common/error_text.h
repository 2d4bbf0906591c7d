// The message of the pagedmha::Error a call throws, "" when it throws none: the tests
// look for the expected fragments in it (so a call that throws nothing fails them).
#pragma once

#include <functional>
#include <string>

#include "pagedmha/error.h"

namespace testutil {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const pagedmha::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace testutil

// The one exception type the library throws.
#pragma once

#include <stdexcept>
#include <string>

namespace pagedmha {

/// Thrown for invalid arguments and failed device calls. The message names the
/// operation, the argument, what was expected and what was given, e.g.
/// "batch_decode: page_table: expected dtype int32, got fp16".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// Throws Error("<op>: <arg>: expected <expected>, got <given>").
[[noreturn]] void throw_invalid_argument(const std::string& op, const std::string& arg,
                                         const std::string& expected, const std::string& given);

}  // namespace pagedmha

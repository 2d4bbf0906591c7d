#include "pagedmha/error.h"

namespace pagedmha {

void throw_invalid_argument(const std::string& op, const std::string& arg, const std::string& expected,
                            const std::string& given) {
  throw Error(op + ": " + arg + ": expected " + expected + ", got " + given);
}

}  // namespace pagedmha

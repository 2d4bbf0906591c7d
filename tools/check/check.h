// `pagedmha check`: every op on the chosen device against straightforward references.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace pagedmha::tools {

struct CheckOptions {
  std::string device = "auto";  // auto | cpu | cuda
  uint64_t seed = 7;
};

void add_check_options(CLI::App& app, CheckOptions& options);

struct CheckSummary {
  int cases = 0;
  int failures = 0;
};
/// Runs every case, prints a table to stdout.
CheckSummary run_checks(const CheckOptions& options);
/// Returns 0 when every case passed, 3 otherwise.
int check_main(const CheckOptions& options);

}  // namespace pagedmha::tools

// `pagedmha bench`: kernel micro-benchmarks of the standard shapes (docs/performance.md) through
// the ops, written as JSON in the results schema.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace pagedmha::tools {

struct BenchOptions {
  std::string device = "auto";
  std::string ops = "decode,prefill";
  std::string models = "llama3-8b,gpt-oss";
  int iters = -1;        // timed iterations per repeat (CUDA default 50, CPU 2)
  int repeats = 5;       // median of repeats
  int scale = -1;        // divide ctx / S by this (CUDA default 1, CPU 16)
  std::string out_dir;   // default <build folder>/bench/results (else ./bench-results)
};

void add_bench_options(CLI::App& app, BenchOptions& options);
int bench_main(const BenchOptions& options);

}  // namespace pagedmha::tools

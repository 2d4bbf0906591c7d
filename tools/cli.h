// The command line of the pagedmha tool (CLI11): replay, plot, bench, check.
#pragma once

namespace pagedmha::tools {

/// Parses argv, runs the subcommand; returns the process exit code (0 ok, 1 error,
/// 2 usage, 3 a failed check).
int run_cli(int argc, char** argv);

}  // namespace pagedmha::tools

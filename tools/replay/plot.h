// `pagedmha plot`: draws a replay --json report with scripts/plot_replay.py.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace pagedmha::tools {

/// Checks that `report` holds every field plot_replay.py reads, with the right types and
/// one entry per step in every column; throws Error("plot: report: expected ..., got ...")
/// naming the first bad field. `source` names the file in the message.
void check_replay_report(const nlohmann::json& report, const std::string& source);

/// Reads and checks `report`, then runs plot_replay.py (default: the source tree's) with
/// an argv array, never a shell. A Python traceback is reduced to its last line. Returns
/// 0 when the script succeeded, else 1.
int plot_main(const std::string& report, const std::string& image, const std::string& script);

}  // namespace pagedmha::tools

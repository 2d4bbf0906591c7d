// Paths as reports record them (replay --json, bench JSON): relative to the repository
// root, never an absolute path of the machine that ran, so a committed report reads the
// same on every checkout. Header-only: the bench programs include it too.
#pragma once

#include <filesystem>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

namespace pagedmha::tools {

/// `path` (relative paths are taken from the current folder) relative to `repo_root` when
/// it lies inside the repository or in a folder beside it ("../shared/traces/x.csv", unless
/// the repository sits at the top of the file system); anywhere else its last component
/// only ("/tmp/out/r.json" -> "r.json"). Empty stays empty.
inline std::string repo_relative(const std::string& path, const std::string& repo_root) {
  namespace fs = std::filesystem;
  if (path.empty() || repo_root.empty()) return path;
  std::error_code ec;
  const fs::path abs = fs::weakly_canonical(fs::absolute(path, ec), ec);
  const fs::path root = fs::weakly_canonical(fs::path(repo_root), ec);
  if (ec) return fs::path(path).filename().string();
  const fs::path rel = abs.lexically_relative(root);
  auto it = rel.begin();
  const bool up = it != rel.end() && *it == "..";
  const bool beside = up && std::next(it) != rel.end() && *std::next(it) != ".." &&
                      root.parent_path() != root.root_path();
  if (!rel.empty() && (!up || beside)) return rel == "." ? std::string(".") : rel.string();
  return abs.filename().string();
}

/// One command-line word with its path made repo_relative: a word holding '/' is a path,
/// and so is the value of "--flag=value".
inline std::string repo_relative_word(const std::string& word, const std::string& repo_root) {
  const std::size_t eq = word.find('=');
  if (word.rfind("--", 0) == 0 && eq != std::string::npos) {
    return word.substr(0, eq + 1) + repo_relative_word(word.substr(eq + 1), repo_root);
  }
  return word.find('/') == std::string::npos ? word : repo_relative(word, repo_root);
}

}  // namespace pagedmha::tools

// Report file prefixes from a device's name (tools/replay/device_info.h device_file_tag),
// against names worked out by hand, and scripts/gpu.sh's own tag pipeline run on an
// nvidia-smi CSV line: the two name an H100's or an H200's reports alike.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "replay/device_info.h"

namespace pt = pagedmha::tools;

namespace {

TEST(DeviceFileTag, ModelWordLowerCase) {
  EXPECT_EQ(pt::device_file_tag("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(pt::device_file_tag("NVIDIA H200"), "h200");
  EXPECT_EQ(pt::device_file_tag("cpu"), "cpu");
  EXPECT_EQ(pt::device_file_tag("cuda:0"), "cuda-0");  // no colon in a file name
}

// scripts/gpu.sh's gpu_tag line, run by bash on `csv` as nvidia-smi writes gpu.txt.
std::string gpu_sh_tag(const std::string& csv) {
  std::ifstream script(std::string(PAGEDMHA_SOURCE_DIR) + "/scripts/gpu.sh");
  std::stringstream text;
  text << script.rdbuf();
  std::smatch m;
  const std::string body = text.str();
  if (!std::regex_search(body, m, std::regex("\\ngpu_tag=\\$\\((.*)\\)\\n"))) return "<no gpu_tag line>";
  const auto dir = std::filesystem::temp_directory_path() / "pagedmha_gpu_tag_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "gpu.txt") << csv << "\n";
  const std::string cmd = "out='" + dir.string() + "' bash -c '" + std::regex_replace(m[1].str(), std::regex("'"), "'\\''") + "'";
  std::string got;
  if (FILE* f = popen(cmd.c_str(), "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, f)) got += buf;
    pclose(f);
  }
  while (!got.empty() && (got.back() == '\n' || got.back() == ' ')) got.pop_back();
  return got;
}

TEST(DeviceFileTag, GpuScriptAgrees) {
  for (const char* name : {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}) {
    const std::string csv = std::string(name) + ", 580.159.04, 81559 MiB";
    EXPECT_EQ(gpu_sh_tag(csv), pt::device_file_tag(name)) << csv;
  }
}

}  // namespace

// Trace readers on the real files (tests/../shared/traces; skipped when absent) and on
// malformed inputs; the built-in workload.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "pagedmha/error.h"
#include "replay/trace.h"

namespace pt = pagedmha::tools;

namespace {

// The traces sit in ../shared/traces beside the checkout; PAGEDMHA_TRACES_DIR overrides.
std::string trace_path(const char* name) {
  const char* env = std::getenv("PAGEDMHA_TRACES_DIR");
  return std::string(env && *env ? env : PAGEDMHA_TRACES_DIR) + "/" + name;
}

#define REQUIRE_TRACE(path) \
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "trace not present: " << path

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const pagedmha::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(AzureTrace, ConversationTotalsMatchSources) {
  const std::string p = trace_path("AzureLLMInferenceTrace_conv.csv");
  REQUIRE_TRACE(p);
  const auto reqs = pt::load_trace(p, pt::TraceFormat::automatic);
  const pt::TraceStats s = pt::trace_stats(reqs);
  EXPECT_EQ(s.requests, 19366);
  EXPECT_EQ(s.prompt_tokens, 22361870);
  EXPECT_EQ(s.output_tokens, 4088665);
  EXPECT_NEAR(s.span_s, 3501.7, 0.1);
  // First row: 2023-11-16 18:15:46.6805900,374,44; second 18:15:50.9951690,396,109.
  EXPECT_EQ(reqs[0].prompt_len, 374);
  EXPECT_EQ(reqs[0].output_len, 44);
  EXPECT_EQ(reqs[0].arrival_s, 0.0);
  EXPECT_NEAR(reqs[1].arrival_s, 4.314579, 1e-6);
  EXPECT_TRUE(reqs[0].hash_ids.empty());
}

TEST(AzureTrace, CodeTotalsAndFirstN) {
  const std::string p = trace_path("AzureLLMInferenceTrace_code.csv");
  REQUIRE_TRACE(p);
  const pt::TraceStats s = pt::trace_stats(pt::load_trace(p, pt::TraceFormat::azure));
  EXPECT_EQ(s.requests, 8819);
  EXPECT_EQ(s.prompt_tokens, 18059974);
  EXPECT_EQ(s.output_tokens, 245896);
  EXPECT_EQ(pt::load_trace(p, pt::TraceFormat::azure, 25).size(), 25u);
}

TEST(MooncakeTrace, TotalsAndPrefixChains) {
  const std::string p = trace_path("conversation_trace.jsonl");
  REQUIRE_TRACE(p);
  const auto reqs = pt::load_trace(p, pt::TraceFormat::automatic);
  const pt::TraceStats s = pt::trace_stats(reqs);
  EXPECT_EQ(s.requests, 12031);
  EXPECT_EQ(s.prompt_tokens, 144793823);
  EXPECT_EQ(s.output_tokens, 4122048);
  EXPECT_EQ(reqs[0].prompt_len, 6758);
  EXPECT_EQ(reqs[0].output_len, 500);
  ASSERT_EQ(reqs[0].hash_ids.size(), 14u);
  EXPECT_EQ(reqs[1].hash_ids[0], 0);  // the shared system-prompt block
  EXPECT_EQ(reqs[1].hash_ids[1], 14);
  int64_t blocks = 0;
  for (const auto& r : reqs) blocks += static_cast<int64_t>(r.hash_ids.size());
  EXPECT_EQ(blocks, 288500);
  EXPECT_EQ(pt::load_trace(p, pt::TraceFormat::mooncake, 10).size(), 10u);
}

TEST(AzureTrace, CrlfAndMissingFinalNewline) {
  const std::string text =
      "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.5,10,3\r\n2023-11-16 18:15:47.75,20,4";
  const auto reqs = pt::parse_azure_csv(text, "t.csv");
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].prompt_len, 20);
  EXPECT_EQ(reqs[1].output_len, 4);
  EXPECT_DOUBLE_EQ(reqs[1].arrival_s, 1.25);
}

TEST(AzureTrace, MalformedRowsNameTheLine) {
  const std::string hdr = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  const std::string ok = "2023-11-16 18:15:46.5,10,3\n";
  EXPECT_NE(error_of([&] { pt::parse_azure_csv("TIME,a,b\n" + ok, "t.csv"); }).find("t.csv:1:"), std::string::npos);
  EXPECT_NE(error_of([&] { pt::parse_azure_csv(hdr + ok + "2023-11-16 18:15:46.5,x,3\n", "t.csv"); })
                .find("t.csv:3: ContextTokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pt::parse_azure_csv(hdr + ok + ok + "2023-11-16 18:15:46.5,10\n", "t.csv"); })
                .find("t.csv:4:"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pt::parse_azure_csv(hdr + "2023-13-16 18:15:46.5,10,3\n", "t.csv"); }).find("t.csv:2: TIMESTAMP"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pt::parse_azure_csv(hdr + "2023-11-16 18:15:46.5,10,0\n", "t.csv"); }).find("t.csv:2: output"),
            std::string::npos);
}

TEST(MooncakeTrace, MalformedLinesNameTheLine) {
  const std::string ok = R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]})"
                         "\n";
  EXPECT_EQ(pt::parse_mooncake_jsonl(ok + ok, "m.jsonl").size(), 2u);
  EXPECT_NE(error_of([&] { pt::parse_mooncake_jsonl(ok + "{not json\n", "m.jsonl"); }).find("m.jsonl:2:"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              pt::parse_mooncake_jsonl(
                  ok + ok + R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]})", "m.jsonl");
            }).find("m.jsonl:3: hash_ids"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              pt::parse_mooncake_jsonl(R"({"timestamp": 0, "output_length": 5, "hash_ids": []})", "m.jsonl");
            }).find("m.jsonl:1: input_length"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              pt::parse_mooncake_jsonl(R"({"timestamp": 0, "input_length": 1.5, "output_length": 5, "hash_ids": [0]})",
                                       "m.jsonl");
            }).find("expected an integer"),
            std::string::npos);
}

TEST(DefaultWorkload, SeededAndShapedLikeAzureConversation) {
  const auto a = pt::default_workload(4000, 5), b = pt::default_workload(4000, 5);
  ASSERT_EQ(a.size(), 4000u);
  std::vector<int> prompts, outputs;
  double mean = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt_len, b[i].prompt_len);
    EXPECT_EQ(a[i].hash_ids, b[i].hash_ids);
    EXPECT_EQ(a[i].hash_ids.size(), size_t((a[i].prompt_len + 511) / 512));
    prompts.push_back(a[i].prompt_len);
    outputs.push_back(a[i].output_len);
    mean += a[i].prompt_len / 4000.0;
  }
  std::nth_element(prompts.begin(), prompts.begin() + 2000, prompts.end());
  std::nth_element(outputs.begin(), outputs.begin() + 2000, outputs.end());
  EXPECT_NEAR(prompts[2000], 1020, 60);
  EXPECT_NEAR(mean, 1155, 60);
  EXPECT_NEAR(outputs[2000], 129, 12);
  EXPECT_NE(pt::default_workload(10, 6)[3].prompt_len, a[3].prompt_len);
}

// A relative --trace that is missing names both the path given and where it was looked for.
TEST(Trace, MissingFileNamesTheResolvedPath) {
  const std::string m = error_of([] { pt::load_trace("no-such-dir/trace.csv", pt::TraceFormat::automatic); });
  EXPECT_NE(m.find("--trace"), std::string::npos) << m;
  EXPECT_NE(m.find("no-such-dir/trace.csv"), std::string::npos) << m;
  EXPECT_NE(m.find((std::filesystem::current_path() / "no-such-dir/trace.csv").string()), std::string::npos) << m;
}

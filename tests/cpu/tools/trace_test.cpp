// Trace readers on the real files (tests/../shared/traces; skipped when absent) and on
// malformed inputs; the built-in workload.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <unistd.h>

#include "common/error_text.h"
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

std::filesystem::path scratch(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("pagedmha_trace_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d / name;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::filesystem::path p = scratch(name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// Every byte printable ASCII: no control bytes or raw binary reach a terminal.
bool printable(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7F; });
}

using testutil::error_of;

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
  EXPECT_NE(error_of([&] { pt::parse_azure_csv(hdr + "2023-11-16 18:15:46.5,10,0\n", "t.csv"); })
                .find("t.csv:2: GeneratedTokens: expected 1..2^30 tokens, got 0"),
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

// Error text quotes at most ~80 bytes of a row, escaped, and names the line and its byte
// offset; a 2 MB row without a comma (or binary garbage) must not be echoed whole.
TEST(TraceErrors, OffendingRowsAreQuotedBoundedEscapedWithLineAndOffset) {
  const std::string hdr = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  const std::string ok = "2023-11-16 18:15:46.5,10,3\n";
  const std::string huge(2'000'000, 'x');
  const std::string binary = std::string("2023-11-16 18:15:46.5,1") + '\0' + "\x1B[31m\xFF,2";
  const std::string json_ok = R"({"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [0]})" "\n";
  const std::string cases[][3] = {
      {"azure", hdr + ok + huge + "\n", "expected 3 comma-separated fields"},
      {"azure", hdr + ok + binary + "\n", "ContextTokens: expected an integer, got '1\\x00\\x1B[31m\\xFF'"},
      {"mooncake", json_ok + "{\"timestamp\": 0, \"inp" + huge + "\n", "parse error"},
      {"mooncake", json_ok + "{\"timestamp\": 0, \"input_length\": \"" + huge + "\"}\n", "input_length: expected a number"},
      {"mooncake", json_ok + "\x01\xFF\x1B[2J" + huge + "\n", "parse error"},
  };
  for (const auto& c : cases) {
    const std::string m = error_of([&] {
      if (c[0] == "azure") pt::parse_azure_csv(c[1], "t.trace");
      else pt::parse_mooncake_jsonl(c[1], "t.trace");
    });
    const bool azure = c[0] == "azure";
    const std::string line = azure ? "t.trace:3: " : "t.trace:2: ";
    const size_t begins = azure ? hdr.size() + ok.size() : json_ok.size();
    const std::string offset = "(line begins at byte " + std::to_string(begins) + ")";
    EXPECT_EQ(m.rfind(line, 0), 0u) << m;
    EXPECT_NE(m.find(c[2]), std::string::npos) << m;
    EXPECT_NE(m.find(offset), std::string::npos) << m;
    EXPECT_LT(m.size(), 450u) << m.substr(0, 1000);
    EXPECT_TRUE(printable(m)) << m.substr(0, 1000);
  }
}

// A leading UTF-8 BOM, LF / CRLF / CR-only endings and trailing blank lines give the same
// requests in both formats, also when the format is picked automatically.
TEST(TraceText, BomLineEndingsAndBlankLinesReadAlikeInBothFormats) {
  const std::vector<std::string> azure = {"TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.5,10,3",
                                          "2023-11-16 18:15:47.75,700,4"};
  const std::vector<std::string> mooncake = {
      R"({"timestamp": 500, "input_length": 10, "output_length": 3, "hash_ids": [7]})",
      R"({"timestamp": 1750, "input_length": 700, "output_length": 4, "hash_ids": [7, 8]})"};
  int n = 0;
  for (const auto* lines : {&azure, &mooncake})
    for (const std::string bom : {"", "\xEF\xBB\xBF"})
      for (const std::string eol : {"\n", "\r\n", "\r"})
        for (const std::string& tail : std::vector<std::string>{"", eol, eol + eol + " \t" + eol}) {
          std::string text = bom;
          for (size_t i = 0; i < lines->size(); ++i) text += (*lines)[i] + (i + 1 < lines->size() ? eol : "");
          text += tail;
          const std::string path = write_file("t" + std::to_string(n++), text);
          std::vector<pt::Request> reqs;
          const std::string m = error_of([&] { reqs = pt::load_trace(path, pt::TraceFormat::automatic); });
          ASSERT_EQ(m, "") << testing::PrintToString(text);
          ASSERT_EQ(reqs.size(), 2u) << testing::PrintToString(text);
          EXPECT_EQ(reqs[0].prompt_len, 10);
          EXPECT_EQ(reqs[0].output_len, 3);
          EXPECT_EQ(reqs[1].prompt_len, 700);
          EXPECT_EQ(reqs[1].output_len, 4);
          EXPECT_DOUBLE_EQ(reqs[1].arrival_s, 1.25);
          EXPECT_EQ(reqs[1].hash_ids.size(), lines == &mooncake ? 2u : 0u);  // the format auto picked
        }
}

// An explicit --format that the file contradicts names the flag and what the file looks
// like (it used to be "<file>:1: expected the header ..." for a Mooncake file read as Azure).
TEST(TraceText, FormatContradictedByTheFileNamesTheFlag) {
  const std::string hdr = "TIMESTAMP,ContextTokens,GeneratedTokens";
  const std::string mooncake =
      write_file("fmt_m.jsonl", "\xEF\xBB\xBF\n" R"({"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [0]})" "\n");
  const std::string azure = write_file("fmt_a.csv", hdr + "\r\n2023-11-16 18:15:46.5,10,3\r\n");
  EXPECT_EQ(error_of([&] { pt::load_trace(mooncake, pt::TraceFormat::azure); }),
            "replay: --format: expected mooncake or auto for --trace " + mooncake +
                " (it looks like a Mooncake JSONL trace: its first line starts with '{'), got azure (an Azure CSV "
                "trace starts with the header " + hdr + ")");
  EXPECT_EQ(error_of([&] { pt::load_trace(azure, pt::TraceFormat::mooncake); }),
            "replay: --format: expected azure or auto for --trace " + azure +
                " (it looks like an Azure CSV trace: its first line is the header " + hdr +
                "), got mooncake (a Mooncake JSONL trace has one JSON object per line)");
  // The matching format reads them; a file that is neither keeps the reader's own error.
  EXPECT_EQ(pt::load_trace(mooncake, pt::TraceFormat::mooncake).size(), 1u);
  EXPECT_EQ(pt::load_trace(azure, pt::TraceFormat::azure).size(), 1u);
  const std::string other = write_file("fmt_o.txt", "hello\n");
  EXPECT_EQ(error_of([&] { pt::load_trace(other, pt::TraceFormat::azure); }).find(other + ":1: expected the header "), 0u);
  EXPECT_EQ(error_of([&] { pt::load_trace(other, pt::TraceFormat::mooncake); }).find(other + ":1: expected a JSON object"), 0u);
}

// No requests at all is the same error for either format: not the Azure header message.
TEST(TraceText, EmptyAndBlankFilesHaveNoRequestsInEitherFormat) {
  const std::string empty = write_file("empty", ""), blank = write_file("blank", "\n \t\r\n\n");
  const std::string bom_blank = write_file("bom_blank", "\xEF\xBB\xBF\n\n");
  for (auto f : {pt::TraceFormat::automatic, pt::TraceFormat::azure, pt::TraceFormat::mooncake}) {
    const std::string e = error_of([&] { pt::load_trace(empty, f); });
    EXPECT_NE(e.find("replay: --trace: expected a trace with at least one request, got an empty file"),
              std::string::npos)
        << e;
    for (const std::string& p : {blank, bom_blank}) {
      const std::string b = error_of([&] { pt::load_trace(p, f); });
      EXPECT_NE(b.find("replay: --trace: expected a trace with at least one request, got only blank lines"),
                std::string::npos) << b;
    }
  }
}

TEST(Trace, DirectoryIsReportedAsADirectory) {
  const std::string dir = scratch("a_dir").string();
  std::filesystem::create_directories(dir);
  const std::string m = error_of([&] { pt::load_trace(dir, pt::TraceFormat::automatic); });
  EXPECT_NE(m.find("--trace: expected a readable file, got a directory: " + dir), std::string::npos) << m;
}

// JSON integers beyond int64 are out of range, reported as written (never wrapped to -1).
TEST(MooncakeTrace, IntegersBeyondInt64AreOutOfRangeNotWrapped) {
  const std::string big = "18446744073709551615";
  const std::pair<std::string, std::string> cases[] = {
      {R"({"timestamp": 0, "input_length": )" + big + R"(, "output_length": 5, "hash_ids": [0]})",
       "m.jsonl:1: input_length: expected 1..2^30 tokens, got " + big},
      {R"({"timestamp": 0, "input_length": 5, "output_length": )" + big + R"(, "hash_ids": [0]})",
       "m.jsonl:1: output_length: expected 1..2^30 tokens, got " + big},
      {R"({"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [)" + big + "]}",
       "m.jsonl:1: hash_ids: expected integers in [-2^63, 2^63), got " + big},
  };
  for (const auto& [line, want] : cases) {
    const std::string m = error_of([&] { pt::parse_mooncake_jsonl(line, "m.jsonl"); });
    EXPECT_NE(m.find(want), std::string::npos) << m;
    EXPECT_EQ(m.find("-1"), std::string::npos) << m;
  }
  // The largest int64 id is still an id.
  const std::string max_id = R"({"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [9223372036854775807]})";
  EXPECT_EQ(pt::parse_mooncake_jsonl(max_id, "m.jsonl")[0].hash_ids[0], INT64_MAX);
}

// prompt + output must keep the KV length in int32: 2^30 + 2^30 is rejected naming both
// fields (it overflowed `prompt + output + spec` in the replay); so is an int64 overflow.
TEST(TraceLengths, SumsBeyondTheKvLimitAreRejectedNamingTheFields) {
  const std::string hdr = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  EXPECT_NE(error_of([&] { pt::parse_azure_csv(hdr + "2023-11-16 18:15:46.5,1073741824,1073741824\n", "t.csv"); })
                .find("t.csv:2: ContextTokens + GeneratedTokens: expected at most 2^30 tokens in all, got 2147483648"),
            std::string::npos);
  EXPECT_NE(error_of([&] { pt::parse_azure_csv(hdr + "2023-11-16 18:15:46.5,99999999999999999999,3\n", "t.csv"); })
                .find("t.csv:2: ContextTokens: expected 1..2^30 tokens, got '99999999999999999999'"),
            std::string::npos);
  const std::string big = R"({"timestamp": 0, "input_length": 1073741824, "output_length": 1073741824, "hash_ids": []})";
  EXPECT_NE(error_of([&] { pt::parse_mooncake_jsonl(big, "m.jsonl"); }).find("m.jsonl:1: input_length + output_length: expected at most 2^30 tokens in all, got 2147483648"),
            std::string::npos);
  EXPECT_EQ(pt::parse_azure_csv(hdr + "2023-11-16 18:15:46.5,1073741823,1\n", "t.csv")[0].prompt_len, 1073741823);
}

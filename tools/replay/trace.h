// Request traces: the Azure LLM inference CSV, the Mooncake JSONL (with prefix-block
// hashes) and a seeded built-in workload shaped like the Azure conversation trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagedmha::tools {

/// Tokens per Mooncake prefix block (one hash id per block of the prompt).
inline constexpr int kHashBlockTokens = 512;

struct Request {
  double arrival_s = 0.0;  // seconds after the first request
  int prompt_len = 0;      // prompt tokens (>= 1)
  int output_len = 0;      // generated tokens (>= 1)
  /// One id per kHashBlockTokens-token prompt block; equal leading ids = shared prefix.
  /// Empty when the trace has no prefix information.
  std::vector<int64_t> hash_ids;
};

enum class TraceFormat { azure, mooncake, automatic };

/// "azure", "mooncake" or "auto". Throws Error for anything else.
TraceFormat parse_trace_format(const std::string& name);

/// Parses an Azure trace (header "TIMESTAMP,ContextTokens,GeneratedTokens", LF or CRLF,
/// last line with or without a line ending). `max_requests` < 0: all rows.
/// Throws Error("<source>:<line>: ...") for a malformed row.
std::vector<Request> parse_azure_csv(const std::string& text, const std::string& source,
                                     int64_t max_requests = -1);
/// Parses a Mooncake JSONL trace (timestamp in ms, input_length, output_length,
/// hash_ids). Throws Error("<source>:<line>: ...") for a malformed line.
std::vector<Request> parse_mooncake_jsonl(const std::string& text, const std::string& source,
                                          int64_t max_requests = -1);
/// Reads a trace file; `automatic` picks the format from the first non-blank byte
/// ('{' = Mooncake) and otherwise expects the Azure header.
std::vector<Request> load_trace(const std::string& path, TraceFormat format,
                                int64_t max_requests = -1);

/// The built-in workload: `num_requests` requests, seeded, lengths drawn from log-normal
/// fits of the Azure conversation trace (prompt p50 ~1020, mean ~1155, clipped to
/// [2, 14050]; output p50 ~129, clipped to [7, 1000]), Poisson arrivals at 5.5 req/s.
/// Prompts carry hash ids: every prompt of >= 512 tokens starts with the shared
/// system-prompt block 0, and about a third continue an earlier request's prompt (a
/// multi-turn conversation), so the prefix cache has something to find.
std::vector<Request> default_workload(int num_requests, uint64_t seed);

struct TraceStats {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double span_s = 0.0;
};
TraceStats trace_stats(const std::vector<Request>& requests);

}  // namespace pagedmha::tools

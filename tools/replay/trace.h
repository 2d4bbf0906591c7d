// Request traces: the Azure LLM inference CSV, the Mooncake JSONL (with prefix-block
// hashes) and a seeded built-in workload shaped like the Azure conversation trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagedmha::tools {

/// Tokens per Mooncake prefix block (one hash id per block of the prompt).
inline constexpr int kHashBlockTokens = 512;
/// Most prompt + output tokens of one request: keeps every KV length (plus draft
/// tokens and a chunk) inside int32.
inline constexpr int64_t kMaxRequestTokens = int64_t{1} << 30;

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

/// Both formats: a leading UTF-8 BOM is skipped; LF, CRLF or a lone CR ends a line (the
/// last line may lack one); blank lines (spaces / tabs only) are skipped anywhere.
/// Requests come in file order (the scheduler queues them by arrival time).
/// `max_requests` < 0: all rows, else the first N rows. A malformed row throws
/// Error("<source>:<line>: <field>: expected ..., got '<at most 80 bytes, escaped>'
/// (line begins at byte <offset>)").
///
/// Azure: header "TIMESTAMP,ContextTokens,GeneratedTokens", then rows.
std::vector<Request> parse_azure_csv(const std::string& text, const std::string& source,
                                     int64_t max_requests = -1);
/// Mooncake JSONL: one object per line (timestamp in ms, input_length, output_length,
/// hash_ids).
std::vector<Request> parse_mooncake_jsonl(const std::string& text, const std::string& source,
                                          int64_t max_requests = -1);
/// Reads a trace file; `automatic` picks the format from the first byte after the BOM and
/// blank lines ('{' = Mooncake, else Azure). A directory, an unreadable file, an empty
/// file or one of only blank lines throws Error naming --trace.
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

#include "replay/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pagedmha/error.h"
#include "replay/error_text.h"

namespace pagedmha::tools {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";
constexpr std::string_view kAzureHeader = "TIMESTAMP,ContextTokens,GeneratedTokens";

struct Line {
  std::string_view text;  // without its ending
  int64_t no = 0;         // 1-based
  size_t offset = 0;      // byte offset of its first byte in the file
};

[[noreturn]] void fail_at(const std::string& source, const Line& line, const std::string& what) {
  throw Error(source + ":" + std::to_string(line.no) + ": " + what + " (line begins at byte " +
              std::to_string(line.offset) + ")");
}

bool blank(std::string_view s) { return s.find_first_not_of(" \t") == std::string_view::npos; }

// Calls f(line) for every non-blank line until it returns false. Skips a leading BOM; LF,
// CRLF or a lone CR ends a line; a final line without an ending counts.
template <class F>
void for_each_line(std::string_view text, F&& f) {
  Line line;
  size_t pos = text.substr(0, kBom.size()) == kBom ? kBom.size() : 0;
  while (pos < text.size()) {
    size_t end = text.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) end = text.size();
    line.text = text.substr(pos, end - pos);
    line.offset = pos;
    ++line.no;
    if (!blank(line.text) && !f(line)) return;
    pos = end + (text.substr(end, 2) == "\r\n" ? 2 : 1);
  }
}

bool parse_int(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// All digits (an optional '-') but too large for int64: a range error, not a format error.
bool out_of_range_int(std::string_view s) {
  if (!s.empty() && s[0] == '-') s.remove_prefix(1);
  return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

// "YYYY-MM-DD HH:MM:SS[.fffffff]" -> seconds since the epoch; false when malformed.
bool parse_timestamp(std::string_view s, double& seconds) {
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':')
    return false;
  int64_t y, mo, d, h, mi, se;
  if (!parse_int(s.substr(0, 4), y) || !parse_int(s.substr(5, 2), mo) ||
      !parse_int(s.substr(8, 2), d) || !parse_int(s.substr(11, 2), h) ||
      !parse_int(s.substr(14, 2), mi) || !parse_int(s.substr(17, 2), se))
    return false;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60) return false;
  double frac = 0.0;
  if (s.size() > 19) {
    if (s[19] != '.' || s.size() == 20) return false;
    int64_t digits;
    std::string_view f = s.substr(20);
    if (!parse_int(f, digits) || digits < 0) return false;
    frac = static_cast<double>(digits) / std::pow(10.0, static_cast<double>(f.size()));
  }
  seconds = static_cast<double>(days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se) + frac;
  return true;
}

// Each length 1..2^30 and both together at most kMaxRequestTokens (the KV length must
// stay inside int32); `names` are the format's field names.
void check_lengths(const std::string& source, const Line& line, const char* const names[2],
                   const int64_t values[2]) {
  for (int i = 0; i < 2; ++i)
    if (values[i] < 1 || values[i] > kMaxRequestTokens)
      fail_at(source, line, std::string(names[i]) + ": expected 1..2^30 tokens, got " + std::to_string(values[i]));
  if (values[0] + values[1] > kMaxRequestTokens)
    fail_at(source, line, std::string(names[0]) + " + " + names[1] + ": expected at most 2^30 tokens in all, got " +
                              std::to_string(values[0] + values[1]));
}

void rebase_arrivals(std::vector<Request>& requests) {
  if (requests.empty()) return;
  double t0 = requests.front().arrival_s;
  for (const Request& r : requests) t0 = std::min(t0, r.arrival_s);
  for (Request& r : requests) r.arrival_s -= t0;
}

}  // namespace

TraceFormat parse_trace_format(const std::string& name) {
  if (name == "azure") return TraceFormat::azure;
  if (name == "mooncake") return TraceFormat::mooncake;
  if (name == "auto") return TraceFormat::automatic;
  throw_invalid_argument("replay", "--format", "azure, mooncake or auto", quote_bytes(name));
}

std::vector<Request> parse_azure_csv(const std::string& text, const std::string& source,
                                     int64_t max_requests) {
  static const char* const kNames[2] = {"ContextTokens", "GeneratedTokens"};
  std::vector<Request> out;
  bool header = false;
  for_each_line(text, [&](const Line& l) {
    const std::string_view line = l.text;
    if (!header) {
      if (line != kAzureHeader)
        fail_at(source, l, "expected the header " + std::string(kAzureHeader) + ", got " + quote_bytes(line));
      header = true;
      return true;
    }
    if (max_requests >= 0 && static_cast<int64_t>(out.size()) >= max_requests) return false;
    size_t c1 = line.find(','), c2 = c1 == std::string_view::npos ? c1 : line.find(',', c1 + 1);
    if (c2 == std::string_view::npos || line.find(',', c2 + 1) != std::string_view::npos)
      fail_at(source, l, "expected 3 comma-separated fields, got " + quote_bytes(line));
    Request r;
    const std::string_view fields[2] = {line.substr(c1 + 1, c2 - c1 - 1), line.substr(c2 + 1)};
    int64_t lengths[2];
    if (!parse_timestamp(line.substr(0, c1), r.arrival_s))
      fail_at(source, l, "TIMESTAMP: expected YYYY-MM-DD HH:MM:SS.fffffff, got " + quote_bytes(line.substr(0, c1)));
    for (int i = 0; i < 2; ++i) {
      if (parse_int(fields[i], lengths[i])) continue;
      fail_at(source, l, std::string(kNames[i]) + (out_of_range_int(fields[i]) ? ": expected 1..2^30 tokens, got "
                                                                              : ": expected an integer, got ") +
                             quote_bytes(fields[i]));
    }
    check_lengths(source, l, kNames, lengths);
    r.prompt_len = static_cast<int>(lengths[0]);
    r.output_len = static_cast<int>(lengths[1]);
    out.push_back(std::move(r));
    return true;
  });
  if (!header) {
    const Line first{{}, 1, 0};
    fail_at(source, first, "expected the header " + std::string(kAzureHeader) + ", got " +
                               (text.empty() ? "an empty file" : "only blank lines"));
  }
  rebase_arrivals(out);
  return out;
}

namespace {

// nlohmann's parse error without its "[json.exception...] parse error at line 1, column N: "
// prefix and the unbounded "last read: '...'" token.
std::string json_reason(const nlohmann::json::parse_error& e) {
  std::string_view w = e.what();
  if (size_t p = w.find("syntax error"); p != std::string_view::npos) w.remove_prefix(p);
  std::string reason(w.substr(0, w.find("; last read: '")));
  if (size_t q = w.rfind("'; expected "); q != std::string_view::npos && w.find("; last read: '") < q)
    reason += std::string(w.substr(q + 1));
  return escape_bytes(reason, 160);
}

}  // namespace

std::vector<Request> parse_mooncake_jsonl(const std::string& text, const std::string& source,
                                          int64_t max_requests) {
  static const char* const kNames[2] = {"input_length", "output_length"};
  std::vector<Request> out;
  for_each_line(text, [&](const Line& l) {
    if (max_requests >= 0 && static_cast<int64_t>(out.size()) >= max_requests) return false;
    const std::string_view line = l.text;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      // Quote the line around the error (e.byte: 1-based position in the line).
      const size_t at = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, line.size());
      const size_t from = at > kQuoteBytes / 2 ? at - kQuoteBytes / 2 : 0;
      fail_at(source, l, "expected a JSON object, got a parse error at byte " + std::to_string(at) +
                             " of the line (" + json_reason(e) + ") near " +
                             quote_bytes(line.substr(from, kQuoteBytes)) +
                             (line.size() > from + kQuoteBytes ? "..." : ""));
    } catch (const nlohmann::json::exception& e) {  // e.g. a number beyond double (1e400)
      fail_at(source, l, "expected a JSON object, got " + escape_bytes(e.what(), 160));
    }
    if (!j.is_object()) fail_at(source, l, "expected a JSON object, got " + quote_bytes(line));
    // A value as the trace wrote it (bounded and escaped).
    const auto shown = [](const nlohmann::json& v) { return quote_bytes(v.dump()); };
    auto number = [&](const char* key) -> const nlohmann::json& {
      auto it = j.find(key);
      if (it == j.end() || !it->is_number())
        fail_at(source, l, std::string(key) + ": expected a number, got " +
                               (it == j.end() ? std::string("nothing") : shown(*it)));
      return *it;
    };
    // Integers beyond int64 (JSON allows them) are out of range, never wrapped.
    auto integer = [&](const char* key, const nlohmann::json& v, const std::string& range) -> int64_t {
      if (!v.is_number_integer()) fail_at(source, l, std::string(key) + ": expected an integer, got " + shown(v));
      if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
        fail_at(source, l, std::string(key) + ": expected " + range + ", got " + v.dump());
      return v.get<int64_t>();
    };
    Request r;
    const nlohmann::json& ts = number("timestamp");
    r.arrival_s = ts.get<double>() / 1000.0;
    if (!std::isfinite(r.arrival_s))
      fail_at(source, l, "timestamp: expected a finite number of ms, got " + std::to_string(ts.get<double>()));
    int64_t lengths[2];
    for (int i = 0; i < 2; ++i) lengths[i] = integer(kNames[i], number(kNames[i]), "1..2^30 tokens");
    check_lengths(source, l, kNames, lengths);
    r.prompt_len = static_cast<int>(lengths[0]);
    r.output_len = static_cast<int>(lengths[1]);
    auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array())
      fail_at(source, l, "hash_ids: expected an array of integers, got " +
                             (ids == j.end() ? std::string("nothing") : shown(*ids)));
    const int64_t blocks = (lengths[0] + kHashBlockTokens - 1) / kHashBlockTokens;
    if (static_cast<int64_t>(ids->size()) != blocks)
      fail_at(source, l, "hash_ids: expected ceil(input_length / 512) = " + std::to_string(blocks) + " ids, got " +
                             std::to_string(ids->size()));
    r.hash_ids.reserve(ids->size());
    for (const auto& id : *ids) r.hash_ids.push_back(integer("hash_ids", id, "integers in [-2^63, 2^63)"));
    out.push_back(std::move(r));
    return true;
  });
  rebase_arrivals(out);
  return out;
}

std::vector<Request> load_trace(const std::string& path, TraceFormat format, int64_t max_requests) {
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(path, ec).string();
  const std::string shown = path + (ec || abs == path ? "" : " (" + abs + ")");
  // An ifstream opens a directory and reads it as empty.
  if (std::filesystem::is_directory(path, ec))
    throw_invalid_argument("replay", "--trace", "a readable file", "a directory: " + shown);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_invalid_argument("replay", "--trace", "a readable file", shown);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw_invalid_argument("replay", "--trace", "a readable file", shown + " (read error)");
  const std::string text = ss.str();
  // The first byte after the BOM and blank lines names the format; none: no requests.
  const size_t bom = std::string_view(text).substr(0, kBom.size()) == kBom ? kBom.size() : 0;
  const size_t first = text.find_first_not_of(" \t\r\n", bom);
  if (first == std::string::npos)
    throw_invalid_argument("replay", "--trace", "a trace with at least one request",
                           (text.size() == bom ? "an empty file: " : "only blank lines: ") + shown);
  const bool json = text[first] == '{';
  if (format == TraceFormat::automatic) format = json ? TraceFormat::mooncake : TraceFormat::azure;
  // A --format the file's first line contradicts is the flag's mistake, not line 1's.
  if (format == TraceFormat::azure && json)
    throw_invalid_argument("replay", "--format",
                           "mooncake or auto for --trace " + shown +
                               " (it looks like a Mooncake JSONL trace: its first line starts with '{')",
                           "azure (an Azure CSV trace starts with the header " + std::string(kAzureHeader) + ")");
  if (format == TraceFormat::mooncake && std::string_view(text).substr(first, kAzureHeader.size()) == kAzureHeader)
    throw_invalid_argument("replay", "--format",
                           "azure or auto for --trace " + shown + " (it looks like an Azure CSV trace: its first line "
                               "is the header " + std::string(kAzureHeader) + ")",
                           "mooncake (a Mooncake JSONL trace has one JSON object per line)");
  return format == TraceFormat::mooncake ? parse_mooncake_jsonl(text, path, max_requests)
                                         : parse_azure_csv(text, path, max_requests);
}

std::vector<Request> default_workload(int num_requests, uint64_t seed) {
  if (num_requests < 1)
    throw_invalid_argument("replay", "--requests", ">= 1", std::to_string(num_requests));
  std::mt19937_64 rng(seed);
  // Log-normal fits: median = exp(mu); mean = exp(mu + sigma^2 / 2).
  std::lognormal_distribution<double> prompt_dist(std::log(1020.0), 0.50);
  std::lognormal_distribution<double> output_dist(std::log(129.0), 0.99);
  std::exponential_distribution<double> gap(5.5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<Request> out;
  out.reserve(num_requests);
  int64_t next_id = 1;  // 0 is the shared system-prompt block
  double t = 0.0;
  for (int i = 0; i < num_requests; ++i) {
    Request r;
    r.arrival_s = i == 0 ? 0.0 : (t += gap(rng));
    r.prompt_len = static_cast<int>(std::clamp(std::lround(prompt_dist(rng)), 2L, 14050L));
    r.output_len = static_cast<int>(std::clamp(std::lround(output_dist(rng)), 7L, 1000L));
    const int blocks = (r.prompt_len + kHashBlockTokens - 1) / kHashBlockTokens;
    int shared = 0;
    if (i > 0 && unit(rng) < 1.0 / 3.0) {
      // Continue one of the last 8 conversations: share its full blocks.
      const Request& prev = out[i - 1 - static_cast<int>(unit(rng) * std::min(i, 8))];
      shared = std::min<int>(prev.prompt_len / kHashBlockTokens, blocks);
      r.hash_ids.assign(prev.hash_ids.begin(), prev.hash_ids.begin() + shared);
    }
    for (int b = shared; b < blocks; ++b) {
      const bool full = (b + 1) * kHashBlockTokens <= r.prompt_len;
      r.hash_ids.push_back(b == 0 && full ? 0 : next_id++);
    }
    out.push_back(std::move(r));
  }
  return out;
}

TraceStats trace_stats(const std::vector<Request>& requests) {
  TraceStats s;
  s.requests = static_cast<int64_t>(requests.size());
  double lo = 0, hi = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    s.prompt_tokens += requests[i].prompt_len;
    s.output_tokens += requests[i].output_len;
    lo = i == 0 ? requests[i].arrival_s : std::min(lo, requests[i].arrival_s);
    hi = i == 0 ? requests[i].arrival_s : std::max(hi, requests[i].arrival_s);
  }
  s.span_s = hi - lo;
  return s;
}

}  // namespace pagedmha::tools

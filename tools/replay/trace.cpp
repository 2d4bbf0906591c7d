#include "replay/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pagedmha/error.h"

namespace pagedmha::tools {
namespace {

[[noreturn]] void fail_at(const std::string& source, int64_t line, const std::string& what) {
  throw Error(source + ":" + std::to_string(line) + ": " + what);
}

// Splits `text` into lines (LF or CRLF; a final line without an ending counts).
template <class F>
void for_each_line(std::string_view text, F&& f) {
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++line_no;
    if (!f(line, line_no)) return;
    pos = end + 1;
  }
}

bool parse_int(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
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

void check_lengths(const std::string& source, int64_t line, int64_t prompt, int64_t output) {
  if (prompt < 1 || prompt > (int64_t{1} << 30))
    fail_at(source, line, "prompt length: expected 1..2^30 tokens, got " + std::to_string(prompt));
  if (output < 1 || output > (int64_t{1} << 30))
    fail_at(source, line, "output length: expected 1..2^30 tokens, got " + std::to_string(output));
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
  throw_invalid_argument("replay", "--format", "azure, mooncake or auto", name);
}

std::vector<Request> parse_azure_csv(const std::string& text, const std::string& source,
                                     int64_t max_requests) {
  std::vector<Request> out;
  for_each_line(text, [&](std::string_view line, int64_t no) {
    if (no == 1) {
      if (line != "TIMESTAMP,ContextTokens,GeneratedTokens")
        fail_at(source, no,
                "expected the header TIMESTAMP,ContextTokens,GeneratedTokens, got '" +
                    std::string(line.substr(0, 80)) + "'");
      return true;
    }
    if (max_requests >= 0 && static_cast<int64_t>(out.size()) >= max_requests) return false;
    if (line.empty()) fail_at(source, no, "expected a row of 3 fields, got an empty line");
    size_t c1 = line.find(','), c2 = c1 == std::string_view::npos ? c1 : line.find(',', c1 + 1);
    if (c2 == std::string_view::npos || line.find(',', c2 + 1) != std::string_view::npos)
      fail_at(source, no, "expected 3 comma-separated fields, got '" + std::string(line) + "'");
    Request r;
    int64_t prompt, output;
    if (!parse_timestamp(line.substr(0, c1), r.arrival_s))
      fail_at(source, no, "TIMESTAMP: expected YYYY-MM-DD HH:MM:SS.fffffff, got '" +
                              std::string(line.substr(0, c1)) + "'");
    if (!parse_int(line.substr(c1 + 1, c2 - c1 - 1), prompt))
      fail_at(source, no, "ContextTokens: expected an integer, got '" +
                              std::string(line.substr(c1 + 1, c2 - c1 - 1)) + "'");
    if (!parse_int(line.substr(c2 + 1), output))
      fail_at(source, no, "GeneratedTokens: expected an integer, got '" +
                              std::string(line.substr(c2 + 1)) + "'");
    check_lengths(source, no, prompt, output);
    r.prompt_len = static_cast<int>(prompt);
    r.output_len = static_cast<int>(output);
    out.push_back(std::move(r));
    return true;
  });
  if (text.empty()) fail_at(source, 1, "expected the header TIMESTAMP,ContextTokens,GeneratedTokens, got an empty file");
  rebase_arrivals(out);
  return out;
}

std::vector<Request> parse_mooncake_jsonl(const std::string& text, const std::string& source,
                                          int64_t max_requests) {
  std::vector<Request> out;
  for_each_line(text, [&](std::string_view line, int64_t no) {
    if (max_requests >= 0 && static_cast<int64_t>(out.size()) >= max_requests) return false;
    if (line.find_first_not_of(" \t") == std::string_view::npos) return true;  // blank line
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail_at(source, no, std::string("expected a JSON object, got a parse error: ") + e.what());
    }
    if (!j.is_object()) fail_at(source, no, "expected a JSON object");
    auto number = [&](const char* key) -> const nlohmann::json& {
      auto it = j.find(key);
      if (it == j.end() || !it->is_number())
        fail_at(source, no, std::string(key) + ": expected a number, got " +
                                (it == j.end() ? std::string("nothing") : it->dump()));
      return *it;
    };
    auto integer = [&](const char* key) -> int64_t {
      const nlohmann::json& v = number(key);
      if (!v.is_number_integer())
        fail_at(source, no, std::string(key) + ": expected an integer, got " + v.dump());
      return v.get<int64_t>();
    };
    Request r;
    r.arrival_s = number("timestamp").get<double>() / 1000.0;
    const int64_t prompt = integer("input_length"), output = integer("output_length");
    check_lengths(source, no, prompt, output);
    r.prompt_len = static_cast<int>(prompt);
    r.output_len = static_cast<int>(output);
    auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array())
      fail_at(source, no, "hash_ids: expected an array of integers");
    const int64_t blocks = (prompt + kHashBlockTokens - 1) / kHashBlockTokens;
    if (static_cast<int64_t>(ids->size()) != blocks)
      fail_at(source, no, "hash_ids: expected ceil(input_length / 512) = " +
                              std::to_string(blocks) + " ids, got " + std::to_string(ids->size()));
    r.hash_ids.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_number_integer())
        fail_at(source, no, "hash_ids: expected integers, got " + id.dump());
      r.hash_ids.push_back(id.get<int64_t>());
    }
    out.push_back(std::move(r));
    return true;
  });
  rebase_arrivals(out);
  return out;
}

std::vector<Request> load_trace(const std::string& path, TraceFormat format, int64_t max_requests) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    const std::string abs = std::filesystem::absolute(path, ec).string();
    throw_invalid_argument("replay", "--trace", "a readable file", path + (ec || abs == path ? "" : " (" + abs + ")"));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  if (format == TraceFormat::automatic) {
    size_t first = text.find_first_not_of(" \t\r\n");
    format = (first != std::string::npos && text[first] == '{') ? TraceFormat::mooncake
                                                                 : TraceFormat::azure;
  }
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

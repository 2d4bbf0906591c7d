// Error text that quotes user input: bounded and printable, so a 1 GB line or binary
// garbage cannot flood or corrupt a terminal.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace pagedmha::tools {

/// Bytes of an offending input that error text quotes.
inline constexpr std::size_t kQuoteBytes = 80;

/// At most `max_bytes` of `s`, every byte outside printable ASCII (with `quoting` also `\`
/// and `'`) as \xNN; a longer `s` ends in "... (N bytes)". Without `quoting` a message that
/// already holds escapes can pass through again unchanged.
inline std::string escape_bytes(std::string_view s, std::size_t max_bytes = kQuoteBytes, bool quoting = false) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && !(quoting && (c == '\\' || c == '\''))) {
      out += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02X", c);
      out += b;
    }
  }
  if (s.size() > max_bytes) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

/// escape_bytes(s) in single quotes (a quote inside is escaped).
inline std::string quote_bytes(std::string_view s, std::size_t max_bytes = kQuoteBytes) {
  std::string out(1, '\'');
  out += escape_bytes(s.substr(0, max_bytes), max_bytes, true);
  out += '\'';
  if (s.size() > max_bytes) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

}  // namespace pagedmha::tools

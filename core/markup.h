#pragma once

// Escaping text for markup: the five characters XML and HTML give meaning to, as entities
// both read (JUnit reports, the golden HTML report).

#include <string>
#include <string_view>

namespace kvlab {

inline std::string escape_markup(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace kvlab

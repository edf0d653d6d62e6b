// Splitting a line into fields, shared by the text formats kvlab parses (problem lines,
// cache scripts).
#pragma once

#include <string_view>
#include <vector>

namespace kvlab {

// The fields of `s` between separators, empty ones included: "a..b" on '.' is
// {"a", "", "b"}, "" is {""}. Views into `s`.
inline std::vector<std::string_view> split_fields(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

}  // namespace kvlab

#include "kvlab/suggest.h"

#include <algorithm>
#include <cctype>

namespace kvlab {
namespace {

// Levenshtein distance, case-insensitive (a typo in case is still that typo).
std::size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                        std::tolower(static_cast<unsigned char>(b[j - 1]));
      const std::size_t next = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      diagonal = row[j];
      row[j] = next;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string did_you_mean(std::string_view name, const std::vector<std::string>& known) {
  if (name.size() > 256) return "";  // no quadratic work on a pasted blob
  const std::size_t limit = std::max<std::size_t>(2, name.size() / 3);
  const std::string* best = nullptr;
  std::size_t best_distance = limit + 1;
  for (const std::string& k : known) {
    const std::size_t d = distance(name, k);
    if (d < best_distance) {
      best = &k;
      best_distance = d;
    }
  }
  return best != nullptr && best_distance > 0 ? " (did you mean '" + *best + "'?)" : "";
}

}  // namespace kvlab

#include "kvlab/suggest.h"

#include <algorithm>
#include <cctype>

namespace kvlab {
namespace {

bool same_letter(char a, char b) {
  return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
}

// Optimal string alignment distance, case-insensitive: insertions, deletions,
// substitutions and swaps of two neighbours each cost 1 ("plian" is one edit from
// "plain", "Rope" none from "rope").
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = same_letter(a[i - 1], b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && same_letter(a[i - 1], b[j - 2]) && same_letter(a[i - 2], b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string closest_name(std::string_view name, const std::vector<std::string>& known) {
  // Names are short identifiers; a long argument is no typo of one and would only cost.
  if (name.size() > 256) return "";
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, name.size() / 3) + 1;
  for (const std::string& k : known) {
    const std::size_t d = edit_distance(name, k);
    if (d < best_distance) best = k, best_distance = d;
  }
  return best;
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& known) {
  const std::string nearest = closest_name(name, known);
  return nearest.empty() || nearest == name ? "" : " (did you mean '" + nearest + "'?)";
}

}  // namespace kvlab

#include "golden/inputs.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kvlab/error.h"

namespace kvlab::golden {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of
// two neighbours each cost 1 ("plian" is one edit from "plain").
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

void require_regular_file(const std::filesystem::path& path, std::string_view noun) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    fail(ErrorKind::io, cat("cannot open ", noun, " '", path.string(), "': ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode))
    fail(ErrorKind::io, cat(noun, " '", path.string(), "' is not a regular file (it is ", kind_of(st.st_mode), ")"));
}

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

std::string known_names_hint(std::string_view what, std::string_view name, const std::vector<std::string>& known) {
  std::string list;
  for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
  const std::string nearest = closest_name(name, known);
  return cat("(", nearest.empty() ? std::string() : cat("did you mean '", nearest, "'? "), what, "s: ",
             list.empty() ? std::string("none") : list, ")");
}

std::string unknown_name_message(std::string_view what, std::string_view name, const std::vector<std::string>& known) {
  return cat("unknown ", what, " '", name, "' ", known_names_hint(what, name, known));
}

}  // namespace kvlab::golden

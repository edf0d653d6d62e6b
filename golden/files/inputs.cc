#include "golden/files/inputs.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kvlab/error.h"
#include "kvlab/suggest.h"

namespace kvlab::golden {

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

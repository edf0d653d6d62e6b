// "Did you mean" for names a user types (subcommands, ops, backends, models, scenarios):
// the closest known name by edit distance, offered only when it is close enough that the
// typo is the likely story.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

// The known name nearest `name` (case-insensitive edit distance, a swap of neighbours
// counting one), or "" when even the nearest needs more edits than a typo would: more
// than max(2, |name| / 3). The first of equally near names wins.
std::string closest_name(std::string_view name, const std::vector<std::string>& known);

// " (did you mean 'rope'?)" for that name, else "".
std::string did_you_mean(std::string_view name, const std::vector<std::string>& known);

}  // namespace kvlab

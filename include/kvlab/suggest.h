// "Did you mean" for names a user types (subcommands, ops, backends, models, scenarios):
// the closest known name by edit distance, offered only when it is close enough that the
// typo is the likely story.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

// " (did you mean 'rope'?)" for the closest of `known` within max(2, |name|/3) edits,
// else "".
std::string did_you_mean(std::string_view name, const std::vector<std::string>& known);

}  // namespace kvlab

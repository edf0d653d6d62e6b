// What a user names on the command line, checked before it is used: a path that must be
// a regular file (a FIFO would block the first read forever, a directory or a device
// reads as nonsense), and a name that must be one of a known list (with the nearest
// known name offered when it looks like a typo).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/stream_file.h"
#include "kvlab/suggest.h"

namespace kvlab::golden {

// A path that must be a regular file, checked by stat() alone: core/stream_file.h.
using ::kvlab::require_regular_file;

// The nearest known name: kvlab::closest_name (kvlab/suggest.h).
using ::kvlab::closest_name;

// "(did you mean '<closest>'? <what>s: a, b, c)"; without the question when nothing is
// close.
std::string known_names_hint(std::string_view what, std::string_view name, const std::vector<std::string>& known);
// "unknown <what> '<name>' " + the hint.
std::string unknown_name_message(std::string_view what, std::string_view name, const std::vector<std::string>& known);

}  // namespace kvlab::golden

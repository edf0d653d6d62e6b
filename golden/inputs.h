// What a user names on the command line, checked before it is used: a path that must be
// a regular file (a FIFO would block the first read forever, a directory or a device
// reads as nonsense), and a name that must be one of a known list (with the nearest
// known name offered when it looks like a typo).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab::golden {

// Throws Error(io) naming `noun`, the path and what it is instead (a FIFO, a directory,
// a device, a socket, nothing) unless the path, links followed, is a regular file. Only
// stat() is called: nothing is opened, so a FIFO cannot block.
void require_regular_file(const std::filesystem::path& path, std::string_view noun);

// The known name nearest `name` (edit distance with adjacent transpositions), or "" when
// even the nearest needs more edits than a typo would: more than max(2, |name| / 3).
std::string closest_name(std::string_view name, const std::vector<std::string>& known);

// "(did you mean '<closest>'? <what>s: a, b, c)"; without the question when nothing is
// close.
std::string known_names_hint(std::string_view what, std::string_view name, const std::vector<std::string>& known);
// "unknown <what> '<name>' " + the hint.
std::string unknown_name_message(std::string_view what, std::string_view name, const std::vector<std::string>& known);

}  // namespace kvlab::golden

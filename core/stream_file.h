// Reading text inputs that may be FIFOs (a shell's `--cases <(generate)`): a FIFO opened
// the usual way waits for a writer forever, so it is opened non-blocking and given a
// bounded wait for its first bytes. Devices, sockets and directories are refused.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace kvlab {

// Throws Error(io) naming `noun`, the path and what it is instead (a FIFO, a directory,
// a device, a socket, nothing) unless the path, links followed, is a regular file. Only
// stat() is called: nothing is opened, so a FIFO cannot block.
void require_regular_file(const std::filesystem::path& path, std::string_view noun);

// The kind of input a reader accepts at `path`: a regular file, or a FIFO to stream.
// Error{io} naming `noun` and the path for anything else (a directory, a device).
enum class InputKind { regular, fifo };
InputKind input_kind(const std::filesystem::path& path, const std::string& noun);

// The bytes of FIFO `path`, at most max_bytes + 1 of them (the caller's cap then names the
// overflow). Error{io} when no writer sends anything within `wait_seconds`.
std::string read_fifo(const std::filesystem::path& path, const std::string& noun, std::uint64_t max_bytes,
                      double wait_seconds);

// How long a FIFO may stay silent before kvlab gives up on it.
inline constexpr double kFifoWaitSeconds = 10;

}  // namespace kvlab

// `kvlab cache inspect|convert|continue`: cache state files in kvlab's format
// (cache/state_file.h) and mlx-lm's prompt-cache format (cache/mlx_prompt_cache.h).
#pragma once

#include <iosfwd>
#include <string>

#include <CLI/CLI.hpp>

namespace kvlab::tools {

class CacheCommands {
 public:
  void add_to(CLI::App& app);
  bool parsed() const;
  // Runs whichever cache subcommand was parsed; errors are thrown as kvlab::Error.
  int run(std::ostream& out);

 private:
  CLI::App* cache_cmd_ = nullptr;
  CLI::App* inspect_cmd_ = nullptr;
  CLI::App* convert_cmd_ = nullptr;
  CLI::App* continue_cmd_ = nullptr;
  std::string inspect_in_;
  std::string convert_in_, convert_out_, convert_to_;
  std::string continue_in_, continue_steps_, continue_out_, continue_to_ = "kvlab";
};

}  // namespace kvlab::tools

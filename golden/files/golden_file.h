// Golden files (golden/README.md "Golden files"): per sequence the prompt, the generated
// tokens, the logits of every step and per layer the attention output of every step, in
// standard safetensors with string metadata. Any engine can write one; kvlab reads them
// strictly: a missing or misshapen tensor, an unknown name, a status that is neither
// "ok" nor "error: ..." is Error{corrupt} naming it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/tensor.h"

namespace kvlab::golden {

struct SequenceRecord {
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> tokens;     // S generated tokens
  Tensor logits;                        // (S, vocab) f32
  std::vector<Tensor> attention;        // per layer (S, width) f32; empty: not recorded
  std::string status = "ok";            // "ok" | "error: <type>: <message>"
  std::optional<std::int64_t> reused;   // prefix scenarios: tokens taken from the prompt cache

  std::int64_t steps() const { return static_cast<std::int64_t>(tokens.size()); }
};

struct Golden {
  std::map<std::string, std::string> meta;  // README keys, without the per-sequence ones
  std::vector<SequenceRecord> sequences;

  std::string get(const std::string& key) const;  // "" when absent
  std::int64_t vocab() const;                       // from the first sequence with logits; 0 if none
};

// Writes atomically (temporary + rename). Throws invalid_argument for an inconsistent
// record (shapes that disagree with the token count) before touching the file.
void write_golden(const std::filesystem::path& path, const Golden& golden);
Golden read_golden(const std::filesystem::path& path);

}  // namespace kvlab::golden

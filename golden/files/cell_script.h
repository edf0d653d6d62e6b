// The command language of the cell cache (cache/cell_kv_cache.h;
// docs/semantics.md §Cell cache): llama.cpp's sequence verbs and batches, as one line. A model-level script:
// each command is a call of the model or a sequence verb; the llama.cpp replay
// (adapters/llama, `kvlab_golden_llama cells`) runs it through kvlab's oracle and through
// llama.cpp and compares every output.
//
// Grammar: commands joined by '.'; S, T are sequence ids in [0, 8); N, D are decimal
// integers without leading zeros; a range A-B reads [A, B), an empty A is 0 and an empty
// B is +inf (`-` alone: every position).
//   pS:N        one call: N >= 1 new prompt tokens of sequence S at its next positions
//               (the k-th p command's tokens are golden prompt_tokens(seed, k, N, vocab),
//               golden/README.md "Prompt tokens"); the last token's outputs are recorded
//   dS_T_…      one call: one token per listed sequence (distinct, ascending), each its
//               own greedy token of its last recorded output, at its next position;
//               every output recorded
//   rmS:A-B     llama_memory_seq_rm(S, A, B)
//   cpS_T:A-B   llama_memory_seq_cp(S, T, A, B); T must hold nothing in [A, B)
//   keepS       llama_memory_seq_keep(S)
//   addS:A-B:D  llama_memory_seq_add(S, A, B, D), D a nonzero signed integer (the K-shift)
//   divS:A-B:D  llama_memory_seq_div(S, A, B, D), D >= 2
// A sequence's next position is its largest held position + 1 (0 when it holds nothing),
// llama.cpp's rule for a batch's positions. A d of a sequence with no recorded output is
// an error naming it. Canonical spelling only (one script, one line): no leading zeros,
// no `+` sign, ascending d lists.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab::cell_script {

enum class Verb : std::uint8_t { prompt, decode, rm, cp, keep, add, div };

struct Command {
  Verb verb = Verb::decode;
  std::vector<int> seqs;          // prompt/rm/keep/add/div: {S}; cp: {S, T}; decode: the list
  std::int32_t p0 = -1, p1 = -1;  // the range; -1 = open end
  std::int32_t n = 0;             // prompt: token count; add: delta; div: divisor
};

constexpr int kMaxSequences = 8;

// Parses a script; kvlab::Error{invalid_argument} naming the command and what is wrong.
std::vector<Command> parse(std::string_view script);
std::string to_string(const std::vector<Command>& script);

}  // namespace kvlab::cell_script

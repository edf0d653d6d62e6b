#include "golden/files/golden_file.h"

#include <charconv>
#include <set>

#include "core/safetensors_file.h"
#include "golden/files/inputs.h"
#include "kvlab/error.h"

namespace kvlab::golden {
namespace {

constexpr std::uint64_t kMaxGoldenBytes = 1ull << 30;
constexpr std::size_t kMaxSequences = 4096;
constexpr std::size_t kMaxLayers = 1024;
constexpr const char* kNoun = "golden file";

safetensors::FileErrors errors_for(const std::filesystem::path& path) {
  return {ErrorKind::corrupt, cat("golden file '", path.string(), "' is corrupt: "), "data region", ')', "gap",
          "trailing bytes", "has unknown dtype ", ""};
}

std::string seq_key(std::size_t i, const std::string& field) { return cat("seq.", i, ".", field); }

Tensor ints_tensor(const std::vector<std::int32_t>& v) {
  Tensor t(DType::i32, Shape{static_cast<std::int64_t>(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) t.storage<std::int32_t>().data()[i] = v[i];
  return t;
}

void check_record(const SequenceRecord& s, std::size_t i) {
  const std::int64_t steps = s.steps();
  const Shape& ls = s.logits.shape();
  KVLAB_REQUIRE(s.logits.dtype() == DType::f32 && ls.size() == 2 && ls[0] == steps, invalid_argument, "sequence ", i,
                ": logits ", shape_str(ls), " do not match ", steps, " generated tokens (want (S, vocab) f32)");
  for (std::size_t l = 0; l < s.attention.size(); ++l) {
    const Shape& as = s.attention[l].shape();
    KVLAB_REQUIRE(s.attention[l].dtype() == DType::f32 && as.size() == 2 && as[0] == steps, invalid_argument,
                  "sequence ", i, ": attention of layer ", l, " ", shape_str(as), " does not match ", steps, " steps");
  }
  KVLAB_REQUIRE(s.status == "ok" || s.status.rfind("error: ", 0) == 0, invalid_argument, "sequence ", i, ": status '",
                s.status, "' is neither ok nor error: ...");
}

std::optional<std::size_t> parse_count(const std::string& text) {
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

}  // namespace

std::string Golden::get(const std::string& key) const {
  const auto it = meta.find(key);
  return it == meta.end() ? std::string() : it->second;
}

std::int64_t Golden::vocab() const {
  for (const SequenceRecord& s : sequences)
    if (s.logits.rank() == 2) return s.logits.dim(1);
  return 0;
}

void write_golden(const std::filesystem::path& path, const Golden& golden) {
  // The reader's caps, checked before anything is written: a golden kvlab writes is one
  // kvlab reads back.
  KVLAB_REQUIRE(golden.sequences.size() <= kMaxSequences, invalid_argument, "a golden holds at most ", kMaxSequences,
                " sequences, not ", golden.sequences.size());
  for (std::size_t i = 0; i < golden.sequences.size(); ++i)
    KVLAB_REQUIRE(golden.sequences[i].attention.size() <= kMaxLayers, invalid_argument, "sequence ", i, " records ",
                  golden.sequences[i].attention.size(), " attention layers, over the ", kMaxLayers, " a golden holds");
  safetensors::TensorFile file;
  file.metadata = golden.meta;
  file.metadata["kvlab.golden"] = "1";
  file.metadata["sequences"] = std::to_string(golden.sequences.size());
  for (std::size_t i = 0; i < golden.sequences.size(); ++i) {
    const SequenceRecord& s = golden.sequences[i];
    check_record(s, i);
    file.tensors.emplace(seq_key(i, "prompt"), ints_tensor(s.prompt));
    file.tensors.emplace(seq_key(i, "tokens"), ints_tensor(s.tokens));
    file.tensors.emplace(seq_key(i, "logits"), s.logits);
    for (std::size_t l = 0; l < s.attention.size(); ++l) file.tensors.emplace(seq_key(i, cat("attn.", l)), s.attention[l]);
    file.metadata[seq_key(i, "status")] = s.status;
    if (s.reused) file.metadata[seq_key(i, "reused")] = std::to_string(*s.reused);
  }
  safetensors::write_tensor_file(path, kNoun, file, kMaxGoldenBytes);
}

Golden read_golden(const std::filesystem::path& path) {
  require_regular_file(path, kNoun);
  const safetensors::FileErrors errors = errors_for(path);
  safetensors::TensorFile file = safetensors::read_tensor_file(path, kNoun, errors, kMaxGoldenBytes);
  Golden g;
  if (file.metadata["kvlab.golden"] != "1")
    errors.raise(cat("metadata kvlab.golden is '", file.metadata["kvlab.golden"], "', this reader accepts '1'"));
  const auto count = parse_count(file.metadata["sequences"]);
  if (!count || *count > kMaxSequences)
    errors.raise(cat("metadata sequences is '", file.metadata["sequences"], "', not a count <= ", kMaxSequences));
  g.sequences.resize(*count);
  for (auto& [key, value] : file.metadata) {
    if (key.rfind("seq.", 0) != 0) {
      g.meta.emplace(key, value);
      continue;
    }
    const auto dot = key.find('.', 4);
    const auto index = dot == std::string::npos ? std::nullopt : parse_count(key.substr(4, dot - 4));
    if (!index || *index >= *count) errors.raise(cat("metadata key '", key, "' names no sequence of ", *count));
    const std::string field = key.substr(dot + 1);
    if (field == "status") {
      g.sequences[*index].status = value;
    } else if (field == "reused") {
      const auto r = parse_count(value);
      if (!r) errors.raise(cat("metadata ", key, " = '", value, "' is not a count"));
      g.sequences[*index].reused = static_cast<std::int64_t>(*r);
    } else if (field != "request") {  // seq.<i>.request: free text for readers
      errors.raise(cat("unknown metadata key '", key, "'"));
    }
  }
  std::vector<std::set<std::string>> present(*count);
  for (auto& [key, tensor] : file.tensors) {
    const auto dot = key.rfind("seq.", 0) == 0 ? key.find('.', 4) : std::string::npos;
    const auto index = dot == std::string::npos ? std::nullopt : parse_count(key.substr(4, dot - 4));
    if (!index || *index >= *count) errors.raise(cat("tensor '", key, "' names no sequence of ", *count));
    SequenceRecord& s = g.sequences[*index];
    const std::string field = key.substr(dot + 1);
    present[*index].insert(field);
    const auto want_ints = [&, &key = key, &tensor = tensor](std::vector<std::int32_t>& out) {
      if (tensor.dtype() != DType::i32 || tensor.rank() != 1)
        errors.raise(cat("tensor '", key, "' is ", dtype_name(tensor.dtype()), " ", shape_str(tensor.shape()),
                         ", not I32 (n)"));
      const auto v = tensor.to_ints();
      out.assign(v.begin(), v.end());
    };
    if (field == "prompt") {
      want_ints(s.prompt);
    } else if (field == "tokens") {
      want_ints(s.tokens);
    } else if (field == "logits") {
      s.logits = std::move(tensor);
    } else if (field.rfind("attn.", 0) == 0) {
      const auto layer = parse_count(field.substr(5));
      if (!layer || *layer >= kMaxLayers) errors.raise(cat("tensor '", key, "' names no layer below ", kMaxLayers));
      if (s.attention.size() <= *layer) s.attention.resize(*layer + 1);
      s.attention[*layer] = std::move(tensor);
    } else {
      errors.raise(cat("unknown tensor '", key, "'"));
    }
  }
  for (std::size_t i = 0; i < *count; ++i) {
    for (const char* need : {"prompt", "tokens", "logits"})
      if (!present[i].count(need)) errors.raise(cat("sequence ", i, " has no tensor seq.", i, ".", need));
    SequenceRecord& s = g.sequences[i];
    for (std::size_t l = 0; l < s.attention.size(); ++l)
      if (s.attention[l].rank() == 0) errors.raise(cat("sequence ", i, " records attention of layer ", l + 1, " but not of layer ", l));
    try {
      check_record(s, i);
    } catch (const Error& e) {
      errors.raise(e.message());
    }
    const std::int64_t vocab = s.logits.dim(1);
    if (vocab != g.sequences[0].logits.dim(1))
      errors.raise(cat("sequence ", i, " has ", vocab, " logits per step, sequence 0 has ", g.sequences[0].logits.dim(1)));
    for (std::int64_t t = 0; t < s.steps(); ++t)
      if (s.tokens[static_cast<std::size_t>(t)] < 0 || s.tokens[static_cast<std::size_t>(t)] >= vocab)
        errors.raise(cat("sequence ", i, " step ", t, ": token ", s.tokens[static_cast<std::size_t>(t)],
                         " is outside the vocabulary of ", vocab));
  }
  return g;
}

}  // namespace kvlab::golden

#include "tools/kvlab/cache_commands.h"

#include <filesystem>
#include <map>
#include <ostream>

#include "cache/catalogue.h"
#include "cache/mlx_prompt_cache.h"
#include "cache/registry.h"
#include "cache/shape_backend.h"
#include "core/safetensors_file.h"
#include "harness/backends.h"
#include "kvlab/error.h"

namespace kvlab::tools {
namespace {

std::string join_shape(const Shape& s) {
  std::string out = "(";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// What the kvlab caches make of the states: every layer restored through the registry
// (from_state), so a file that converts is also one kvlab can continue from. On a
// ShapeBackend (states loaded deferred) this reads no K/V: only bookkeeping is restored.
std::vector<std::unique_ptr<Cache>> restore_all(Backend& backend, const LoadedStates& states,
                                                const std::string& path) {
  std::vector<std::unique_ptr<Cache>> caches;
  for (std::size_t i = 0; i < states.layers.size(); ++i) {
    if (states.unsupported.count(i) != 0) {
      caches.push_back(nullptr);
      continue;
    }
    try {
      caches.push_back(cache_from_state(backend, states.layers[i]));
    } catch (const Error& e) {
      fail(e.kind(), cat("'", path, "' layer ", i, " (", states.layers[i].class_name, "): ", e.what()));
    }
  }
  return caches;
}

StateFileFormat parse_format(const std::string& name, StateFileFormat input) {
  if (name.empty()) return input == StateFileFormat::kvlab ? StateFileFormat::mlx_lm : StateFileFormat::kvlab;
  KVLAB_REQUIRE(name == "kvlab" || name == "mlx-lm", invalid_argument, "--to '", name, "' is not kvlab or mlx-lm");
  return name == "kvlab" ? StateFileFormat::kvlab : StateFileFormat::mlx_lm;
}

// mlx-lm's load_prompt_cache opens exactly the path it is given with mx.load, which
// decides the format by the extension: a file without ".safetensors" is not read as one.
void require_writable_as(const std::string& path, StateFileFormat format) {
  if (format != StateFileFormat::mlx_lm) return;
  const std::string ext = std::filesystem::path(path).extension().string();
  KVLAB_REQUIRE(ext == ".safetensors", invalid_argument, "'", path,
                "': an mlx-lm prompt cache must end in .safetensors (mlx-lm's load_prompt_cache reads the format from"
                " the extension)");
}

void save_states(const std::string& path, StateFileFormat format, const LoadedStates& states) {
  if (format == StateFileFormat::kvlab)
    save_cache_states(path, states.layers, states.user_metadata);
  else
    save_mlx_prompt_cache(path, states.layers, states.user_metadata);
}

int inspect(const std::string& path, std::ostream& out) {
  StateFileFormat format{};
  const LoadedStates states = load_any_cache_states(path, &format, TensorLoad::deferred, /*keep_unsupported=*/true);
  ShapeBackend backend;
  const auto caches = restore_all(backend, states, path);
  out << path << ": " << state_file_format_name(format) << " format"
      << (format == StateFileFormat::mlx_lm ? cat(" (", kMlxPromptCacheVersion, ")") : "") << ", "
      << states.layers.size() << " layer(s)";
  if (!states.unsupported.empty())
    out << ", " << states.unsupported.size() << " of them of a class kvlab does not model";
  out << "\n";
  for (const auto& [key, value] : states.user_metadata) out << "  metadata " << key << " = " << value << "\n";
  for (std::size_t i = 0; i < states.layers.size(); ++i) {
    const CacheState& s = states.layers[i];
    out << "  layer " << i << ": " << s.class_name;
    if (caches[i]) {
      out << ", offsets";
      for (const std::int32_t o : caches[i]->offsets()) out << " " << o;
      out << ", " << caches[i]->kv_length() << " rows attended\n";
    } else {
      out << ", unsupported: " << states.unsupported.at(i) << "\n";
    }
    for (const auto& [key, value] : s.meta) out << "    meta " << key << " = " << value << "\n";
    for (const auto& [name, t] : s.tensors)
      out << "    tensor " << name << ": " << dtype_name(t.dtype()) << " " << join_shape(t.shape()) << "\n";
    if (s.meta.count("bits"))
      out << "    quantization: " << s.meta.at("mode") << ", " << s.meta.at("bits") << " bits, group size "
          << s.meta.at("group_size") << ", rounding " << s.meta.at("rounding") << "\n";
  }
  return 0;
}

int convert(const std::string& in, const std::string& out_path, const std::string& to, std::ostream& out) {
  StateFileFormat format{};
  const LoadedStates states = load_any_cache_states(in, &format, TensorLoad::deferred);
  const StateFileFormat target = parse_format(to, format);
  require_writable_as(out_path, target);
  ShapeBackend backend;
  (void)restore_all(backend, states, in);  // refuse what kvlab could not continue from
  save_states(out_path, target, states);
  out << "wrote " << out_path << " (" << state_file_format_name(target) << ", " << states.layers.size()
      << " layer(s), from " << state_file_format_name(format) << ")\n";
  return 0;
}

// The steps file: a safetensors file of "<layer>.<step>.keys" / "<layer>.<step>.values"
// float blocks (B, H, S, D), applied to layer <layer> in step order.
std::map<std::size_t, std::map<std::size_t, std::pair<Tensor, Tensor>>> read_steps(const std::string& path,
                                                                                  std::size_t layers) {
  const safetensors::FileErrors errors{ErrorKind::corrupt, cat("steps file '", path, "' is corrupt: "), "data region",
                                       ')', "gap", "trailing bytes", "has unknown dtype ", ""};
  const auto file = std::make_shared<const safetensors::InputFile>(path, "steps file", errors);
  const safetensors::Header h = safetensors::read_header(*file, errors);
  std::vector<safetensors::Entry> entries;
  for (const auto& [key, entry] : h.json.items())
    if (key != safetensors::kMetadataKey) entries.push_back(safetensors::parse_entry(key, entry, h.data_size, errors));
  std::vector<const safetensors::Entry*> ranges;
  for (const auto& e : entries) ranges.push_back(&e);
  safetensors::require_tiling(std::move(ranges), h.data_size, errors);

  std::map<std::size_t, std::map<std::size_t, std::pair<Tensor, Tensor>>> steps;
  for (const auto& e : entries) {
    // "<layer>.<step>.<side>"
    const std::size_t a = e.key.find('.');
    const std::size_t b = a == std::string::npos ? a : e.key.find('.', a + 1);
    std::size_t layer = 0, step = 0;
    std::string side;
    if (b != std::string::npos) {
      const auto l = safetensors::parse_index(e.key.substr(0, a));
      const auto st = safetensors::parse_index(e.key.substr(a + 1, b - a - 1));
      if (l && st) {
        layer = *l;
        step = *st;
        side = e.key.substr(b + 1);
      }
    }
    if (side != "keys" && side != "values") errors.raise(cat("tensor \"", e.key, "\" is not <layer>.<step>.keys|values"));
    if (layer >= layers) errors.raise(cat("tensor \"", e.key, "\" names layer ", layer, " of ", layers));
    Tensor t = safetensors::read_entry(file, h.data_start, e, safetensors::kDeferAboveBytes);  // read when applied
    auto& slot = steps[layer][step];
    (side == "keys" ? slot.first : slot.second) = std::move(t);
  }
  for (const auto& [layer, by_step] : steps) {
    std::size_t expected = 0;
    for (const auto& [step, kv] : by_step) {
      if (step != expected) errors.raise(cat("layer ", layer, " has no step ", expected));
      if (kv.first.rank() != 4 || kv.second.rank() != 4)
        errors.raise(cat("layer ", layer, " step ", step, " lacks keys or values (B, H, S, D)"));
      ++expected;
    }
  }
  return steps;
}

int continue_from(const std::string& in, const std::string& steps_path, const std::string& out_path,
                  const std::string& to, std::ostream& out) {
  const StateFileFormat target = to == "mlx-lm" ? StateFileFormat::mlx_lm : StateFileFormat::kvlab;
  require_writable_as(out_path, target);
  StateFileFormat format{};
  LoadedStates states = load_any_cache_states(in, &format, TensorLoad::deferred);
  ShapeBackend shapes;
  const std::size_t layers = restore_all(shapes, states, in).size();
  const auto steps = read_steps(steps_path, layers);
  // Only the layers the steps update are read (and computed on the oracle); the others
  // are copied from the input file as they are.
  auto backend = harness::make_backend("reference");
  std::map<std::size_t, std::unique_ptr<Cache>> caches;
  for (const auto& [layer, by_step] : steps) caches.emplace(layer, cache_from_state(*backend, states.layers[layer]));
  std::size_t applied = 0;
  for (const auto& [layer, by_step] : steps) {
    Cache& cache = *caches.at(layer);
    for (const auto& [step, kv] : by_step) {
      const DTensor k = backend->upload(kv.first), v = backend->upload(kv.second);
      try {
        // llama4 trims a chunked cache's front before every attention; the Python side
        // (prompt_cache.py) puts a "front" step before each update of a chunked case.
        (void)cache.maybe_trim_front();
        if (cache.is_quantized())
          (void)cache.update_quantized(k, v);
        else
          (void)cache.update(k, v);
      } catch (const Error& e) {
        fail(e.kind(), cat("steps file '", steps_path, "' layer ", layer, " step ", step, ": ", e.what()));
      }
      ++applied;
    }
  }
  for (const auto& [layer, cache] : caches) states.layers[layer] = cache->state();
  save_states(out_path, target, states);
  out << "applied " << applied << " update(s); wrote " << out_path << " (" << state_file_format_name(target) << ")\n";
  return 0;
}

}  // namespace

void CacheCommands::add_to(CLI::App& app) {
  cache_cmd_ = app.add_subcommand("cache", "Cache state files: kvlab's format and mlx-lm's prompt-cache format");
  cache_cmd_->require_subcommand(1);
  inspect_cmd_ = cache_cmd_->add_subcommand("inspect", "Print what a cache state file holds (format detected)");
  inspect_cmd_->add_option("FILE", inspect_in_, "kvlab or mlx-lm cache file")->required();
  convert_cmd_ = cache_cmd_->add_subcommand("convert", "Convert between kvlab's and mlx-lm's cache file formats");
  convert_cmd_->add_option("IN", convert_in_, "kvlab or mlx-lm cache file")->required();
  convert_cmd_->add_option("OUT", convert_out_, "File to write (atomically)")->required();
  convert_cmd_->add_option("--to", convert_to_, "mlx-lm | kvlab (default: the other format)")
      ->check(CLI::IsMember({"mlx-lm", "kvlab"}));
  continue_cmd_ = cache_cmd_->add_subcommand(
      "continue", "Restore kvlab caches from a cache file, apply the updates of a steps file, write the result");
  continue_cmd_->add_option("IN", continue_in_, "kvlab or mlx-lm cache file")->required();
  continue_cmd_->add_option("--steps", continue_steps_,
                            "safetensors file of <layer>.<step>.keys|values blocks (B, H, S, D)")
      ->required();
  continue_cmd_->add_option("-o,--out", continue_out_, "File to write the resulting states to")->required();
  continue_cmd_->add_option("--to", continue_to_, "kvlab | mlx-lm (default kvlab)")
      ->check(CLI::IsMember({"mlx-lm", "kvlab"}));
}

bool CacheCommands::parsed() const { return cache_cmd_ != nullptr && cache_cmd_->parsed(); }

int CacheCommands::run(std::ostream& out) {
  if (*inspect_cmd_) return inspect(inspect_in_, out);
  if (*convert_cmd_) return convert(convert_in_, convert_out_, convert_to_, out);
  if (*continue_cmd_) return continue_from(continue_in_, continue_steps_, continue_out_, continue_to_, out);
  return 0;
}

}  // namespace kvlab::tools

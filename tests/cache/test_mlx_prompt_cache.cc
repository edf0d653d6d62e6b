// mlx-lm prompt-cache files (cache/mlx_prompt_cache.h): kvlab states → mlx-lm file →
// kvlab states is the identity for every class mlx-lm 0.32.2 has, built by kvlab's own
// caches; malformed files and unrepresentable states are errors naming the bad value.
// (The real mlx-lm reading and writing these files: conformance.prompt_cache_mlx.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include <nlohmann/json.hpp>

#include "cache/batch_cache.h"
#include "cache/catalogue.h"
#include "cache/mlx_prompt_cache.h"
#include "cache/registry.h"
#include "cache/shape_backend.h"
#include "reference/reference_backend.h"
#include "tests/cache/cache_test_util.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_mlx_prompt_cache {
namespace {

using testing::expect_same_state;

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("kvlab_mlx_prompt_cache_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// One cache built by kvlab: its kind and setup, then a prefill of `prefill` tokens,
// `decodes` single-token updates, and ChunkedKVCache's front trim where asked.
struct Built {
  const char* name;
  CacheKind kind;
  std::function<void(CacheSetup&)> setup;
  std::int64_t prefill, decodes;
  bool trim_front = false;
  std::int64_t trim = 0;  // trim(n) last
};

const std::vector<Built>& built_caches() {
  static const std::vector<Built> table = {
      {"kv", CacheKind::kv, [](CacheSetup&) {}, 5, 2},
      {"kv_empty", CacheKind::kv, [](CacheSetup&) {}, 0, 0},
      {"rotating_keep0_wrapped", CacheKind::rotating, [](CacheSetup& s) { s.max_size = 8, s.keep = 0; }, 6, 5},
      {"rotating_keep2_concat", CacheKind::rotating, [](CacheSetup& s) { s.max_size = 8, s.keep = 2; }, 10, 3},
      {"quantized", CacheKind::quantized, [](CacheSetup& s) { s.spec = QuantSpec{QuantMode::affine, 4, 32}, s.rounding = Rounding::mlx; }, 5, 1},
      {"quantized_empty", CacheKind::quantized, [](CacheSetup& s) { s.spec = QuantSpec{QuantMode::affine, 8, 64}, s.rounding = Rounding::mlx; }, 0, 0},
      {"chunked_trimmed_front", CacheKind::chunked, [](CacheSetup& s) { s.chunk = 4; }, 6, 2, true},
      {"chunked_trimmed_to_nothing", CacheKind::chunked, [](CacheSetup& s) { s.chunk = 4; }, 6, 0, true, 4},
      {"batch_kv", CacheKind::batch_kv, [](CacheSetup& s) { s.left_padding = {2, 0}; }, 5, 2},
      {"batch_rotating_wrapped", CacheKind::batch_rotating,
       [](CacheSetup& s) { s.max_size = 8, s.left_padding = {1, 0}; }, 6, 5},
  };
  return table;
}

std::vector<float> ids(float first, std::int64_t n) {
  std::vector<float> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(first + static_cast<float>(i));
  return v;
}

void feed(Backend& be, Cache& cache, std::int64_t batch, float first, std::int64_t n) {
  const DTensor block = testing::token_block(be, std::vector<std::vector<float>>(static_cast<std::size_t>(batch), ids(first, n)), 2, 64);
  if (cache.is_quantized())
    (void)cache.update_quantized(block, block);
  else
    (void)cache.update(block, block);
}

CacheState build(Backend& be, const Built& b) {
  CacheSetup setup;
  b.setup(setup);
  auto cache = make_cache(be, b.kind, setup);
  const auto batch = static_cast<std::int64_t>(cache_kind_info(b.kind).batch ? setup.left_padding.size() : 1);
  if (b.prefill > 0) feed(be, *cache, batch, 1, b.prefill);
  if (b.trim_front) cache->maybe_trim_front();
  for (std::int64_t i = 0; i < b.decodes; ++i) feed(be, *cache, batch, 100 + static_cast<float>(i), 1);
  if (b.trim > 0) (void)cache->trim(b.trim);
  return cache->state();
}

// mlx-lm's file records no rounding; a quantized state reads back with the pinned MLX's.
TEST(MlxPromptCache, QuantizedRoundingComesBackAsThePinnedMlx) {
  ReferenceBackend be;
  CacheSetup setup;
  setup.spec = QuantSpec{QuantMode::affine, 4, 32};
  setup.rounding = Rounding::mlx_gpu;
  const fs::path path = scratch("rounding.safetensors");
  save_mlx_prompt_cache(path, {make_cache(be, CacheKind::quantized, setup)->state()}, {});
  EXPECT_EQ(load_mlx_prompt_cache(path).layers.at(0).meta.at("rounding"), "mlx");
  fs::remove_all(path.parent_path());
}

TEST(MlxPromptCache, EveryClassRoundTripsThroughAnMlxFile) {
  ReferenceBackend be;
  std::vector<CacheState> states;
  for (const Built& b : built_caches()) {
    SCOPED_TRACE(b.name);
    states.push_back(build(be, b));
    const fs::path path = scratch(std::string(b.name) + ".safetensors");
    save_mlx_prompt_cache(path, {states.back()}, {{"model", b.name}});
    EXPECT_EQ(detect_state_file_format(path), StateFileFormat::mlx_lm);
    const LoadedStates loaded = load_mlx_prompt_cache(path);
    ASSERT_EQ(loaded.layers.size(), 1u);
    EXPECT_EQ(loaded.user_metadata, (std::map<std::string, std::string>{{"model", b.name}}));
    expect_same_state(states.back(), loaded.layers[0]);
    (void)cache_from_state(be, loaded.layers[0]);  // and kvlab continues from it
  }
  // All of them as the layers of one model, through both formats.
  const fs::path mlx = scratch("all.safetensors"), kv = scratch("all.kvlab");
  save_mlx_prompt_cache(mlx, states, {});
  const LoadedStates via_mlx = load_any_cache_states(mlx);
  save_cache_states(kv, via_mlx.layers, via_mlx.user_metadata);
  StateFileFormat format{};
  const LoadedStates back = load_any_cache_states(kv, &format);
  EXPECT_EQ(format, StateFileFormat::kvlab);
  ASSERT_EQ(back.layers.size(), states.size());
  for (std::size_t i = 0; i < states.size(); ++i) expect_same_state(states[i], back.layers[i]);
  fs::remove_all(mlx.parent_path());
}

// ---- malformed files ------------------------------------------------------------------

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  fs::remove(p);
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A valid one-layer KVCache file (offset 7), opened up as header JSON and data bytes.
struct File {
  json header;
  std::string data;

  static File valid(std::size_t built = 0) {
    ReferenceBackend be;
    const fs::path p = scratch("valid.safetensors");
    save_mlx_prompt_cache(p, {build(be, built_caches()[built])}, {{"model", "m"}});
    const std::string bytes = read_bytes(p);
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
  }
  std::string bytes() const {
    std::string text = header.dump();
    const std::uint64_t n = text.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + text + data;
  }
  void put_i32(const std::string& key, std::int32_t v) {
    std::memcpy(data.data() + header[key]["data_offsets"][0].get<std::size_t>(), &v, 4);
  }
  std::int32_t get_i32(const std::string& key) const {
    std::int32_t v = 0;
    std::memcpy(&v, data.data() + header[key]["data_offsets"][0].get<std::size_t>(), 4);
    return v;
  }
  // Rows of the first tensor of layer 0's keys (field 0: a block or a triple's codes).
  std::int32_t key_rows() const {
    for (const auto& [key, e] : header.items())
      if (key == "0.0" || key == "0.0.0") return e["shape"][2].get<std::int32_t>();
    ADD_FAILURE() << "no keys in layer 0";
    return 0;
  }
};

struct Malformed {
  const char* what;
  std::function<std::string(File&)> damage;  // the damaged file's bytes
  std::vector<std::string> named;            // what the message must name
};

const std::vector<Malformed>& malformed_files() {
  static const std::vector<Malformed> table = {
      {"class whose fields are missing", [](File& f) { f.header["__metadata__"]["1.0"] = "RotatingKVCache"; return f.bytes(); },
       {"RotatingKVCache", "\"0.3\""}},
      {"offset stored as a float", [](File& f) { f.header["0.2"]["dtype"] = "F32"; return f.bytes(); },
       {"\"0.2\"", "offset", "f32"}},
      {"offset beyond the stored rows", [](File& f) { f.put_i32("0.2", 999); return f.bytes(); },
       {"offset is 999", "7 rows"}},
      {"negative offset", [](File& f) { f.put_i32("0.2", -3); return f.bytes(); }, {"offset is -3"}},
      {"truncated", [](File& f) { return f.bytes().substr(0, f.bytes().size() - 7); }, {"\"0.1\"", "outside the data region"}},
      {"truncated header", [](File& f) { return f.bytes().substr(0, 40); }, {"header length"}},
      {"unknown metadata key", [](File& f) { f.header["__metadata__"]["3.0"] = "x"; return f.bytes(); }, {"\"3.0\""}},
      {"no scalars placeholder", [](File& f) { f.header["__metadata__"].erase("2.0"); return f.bytes(); }, {"\"2.0\""}},
      {"unknown scalar type", [](File& f) { f.header["__metadata__"]["2.1.1"] = "complex"; return f.bytes(); }, {"complex"}},
      {"scalar naming no tensor", [](File& f) { f.header["__metadata__"]["2.1.0"] = "0.9"; return f.bytes(); }, {"\"0.9\""}},
      {"tensor of a layer that does not exist", [](File& f) { f.header["4.0"] = f.header["0.2"]; f.header.erase("0.2"); return f.bytes(); },
       {"\"4.0\"", "layer 4"}},
      {"tensor of the layer just past the last", [](File& f) { f.header["1.2"] = f.header["0.2"]; f.header.erase("0.2"); return f.bytes(); },
       {"\"1.2\"", "layer 1 but the file has 1 class names"}},
      {"field the class does not have",
       [](File& f) { f.header["0.5"] = {{"dtype", "I32"}, {"shape", json::array()}, {"data_offsets", {f.data.size(), f.data.size() + 4}}};
                     f.data += std::string(4, '\0'); return f.bytes(); },
       {"\"0.5\"", "not a field of KVCache"}},
      {"bool where an int belongs",
       [](File& f) { f.header["0.2"]["dtype"] = "BOOL"; f.header["0.2"]["shape"] = {4}; return f.bytes(); }, {"\"0.2\""}},
      {"unknown dtype", [](File& f) { f.header["0.2"]["dtype"] = "I64"; return f.bytes(); }, {"I64"}},
      // Consistency only kvlab's from_state sees, on other classes' files.
      {"batch offset disagreeing with _idx - left_padding",
       [](File& f) { f = File::valid(8); f.put_i32("0.2", 40); return f.bytes(); }, {"BatchKVCache", "'offset'[0] = 40"}},
      {"quantized bits not fitting the codes",
       [](File& f) { f = File::valid(4); f.put_i32("0.4", 8); return f.bytes(); }, {"QuantizedKVCache", "not a valid cache"}},
  };
  return table;
}

// Read eagerly or deferred (every tensor left in the file), a malformed file is the same
// error: the deferred path checks everything the eager one does, from shapes and scalars.
TEST(MlxPromptCache, MalformedFilesAreCorruptNamingTheBadValue) {
  const fs::path path = scratch("bad.safetensors");
  for (const Malformed& m : malformed_files()) {
    SCOPED_TRACE(m.what);
    File f = File::valid();
    write_bytes(path, m.damage(f));
    for (const TensorLoad load : {TensorLoad::eager, TensorLoad::deferred_all})
      testing::expect_error([&] { load_mlx_prompt_cache(path, load); }, ErrorKind::corrupt, m.named);
  }
  fs::remove_all(path.parent_path());
}

// Every range check of the reader at its limit (issue 47: a check moved by one passed
// tests that tried values far outside): the scalar at the limit and one step inside is
// read, one step outside is corrupt naming the value. `limit` is read from the valid file;
// `upper` says which side is outside.
struct Limit {
  const char* what;
  std::size_t built;  // built_caches() index
  const char* field;  // the int32 scalar moved
  std::function<std::int32_t(const File&)> limit;
  bool upper;
  std::function<std::vector<std::string>(std::int32_t)> named;  // for the value outside
};

const std::vector<Limit>& limits() {
  static const std::vector<Limit> table = {
      {"KVCache offset at most the stored rows", 0, "0.2", [](const File& f) { return f.key_rows(); }, true,
       [](std::int32_t v) { return std::vector<std::string>{cat("offset is ", v), "rows"}; }},
      {"KVCache offset at least zero", 0, "0.2", [](const File&) { return 0; }, false,
       [](std::int32_t v) { return std::vector<std::string>{cat("offset is ", v)}; }},
      {"QuantizedKVCache offset at most the rows of its codes", 4, "0.2", [](const File& f) { return f.key_rows(); }, true,
       [](std::int32_t v) { return std::vector<std::string>{cat("offset is ", v), "keys.wq"}; }},
      {"ChunkedKVCache start_position at most offset", 6, "0.4", [](const File& f) { return f.get_i32("0.2"); }, true,
       [](std::int32_t v) { return std::vector<std::string>{cat("start_position ", v, " is past offset")}; }},
      {"ChunkedKVCache live rows (offset - start_position) at most the stored rows", 6, "0.4",
       [](const File& f) { return f.get_i32("0.2") - f.key_rows(); }, false,
       [](std::int32_t) { return std::vector<std::string>{"offset - start_position is", "rows"}; }},
  };
  return table;
}

TEST(MlxPromptCache, RangeChecksHoldAtTheirLimits) {
  const fs::path path = scratch("limit.safetensors");
  for (const Limit& l : limits()) {
    const File valid = File::valid(l.built);
    const std::int32_t limit = l.limit(valid), inside = l.upper ? limit - 1 : limit + 1,
                       outside = l.upper ? limit + 1 : limit - 1;
    ASSERT_GE(inside, 0) << l.what << ": the valid file leaves no value inside the limit";
    for (const std::int32_t v : {inside, limit, outside}) {
      SCOPED_TRACE(cat(l.what, ": ", l.field, " = ", v, " (limit ", limit, ")"));
      File f = valid;
      f.put_i32(l.field, v);
      write_bytes(path, f.bytes());
      for (const TensorLoad load : {TensorLoad::eager, TensorLoad::deferred_all}) {
        if (v == outside)
          testing::expect_error([&] { load_mlx_prompt_cache(path, load); }, ErrorKind::corrupt, l.named(v));
        else
          EXPECT_NO_THROW(load_mlx_prompt_cache(path, load));
      }
    }
  }
  fs::remove_all(path.parent_path());
}

// A class kvlab does not model (an SSM model's MambaCache) is unsupported, not corrupt;
// described on request with the layers kvlab does read.
TEST(MlxPromptCache, AClassKvlabDoesNotModelIsUnsupportedAndCanBeDescribed) {
  const fs::path path = scratch("mamba.safetensors");
  File f = File::valid();
  f.header["__metadata__"]["1.0"] = "MambaCache";
  write_bytes(path, f.bytes());
  for (const TensorLoad load : {TensorLoad::eager, TensorLoad::deferred_all})
    testing::expect_error([&] { load_mlx_prompt_cache(path, load); }, ErrorKind::unsupported,
                          {"MambaCache", "KVCache, RotatingKVCache"});
  const LoadedStates described = load_mlx_prompt_cache(path, TensorLoad::deferred, /*keep_unsupported=*/true);
  ASSERT_EQ(described.layers.size(), 1u);
  EXPECT_EQ(described.layers[0].class_name, "MambaCache");
  EXPECT_EQ(described.layers[0].tensors.size(), 3u);  // its raw fields "0", "1", "2"
  ASSERT_EQ(described.unsupported.count(0), 1u);
  EXPECT_NE(described.unsupported.at(0).find("MambaCache"), std::string::npos);
  fs::remove_all(path.parent_path());
}

// ---- deferred loading (files larger than memory) ----------------------------------------

CacheState materialized(const CacheState& s) {
  CacheState out = s;
  for (auto& [name, t] : out.tensors) t = t.materialize();
  return out;
}

std::size_t deferred_count(const LoadedStates& states) {
  std::size_t n = 0;
  for (const CacheState& s : states.layers)
    for (const auto& [name, t] : s.tensors) n += t.is_deferred() ? 1 : 0;
  return n;
}

// Every class, from either format: a deferred load holds the same states as an eager
// one, restores on a ShapeBackend to the same offsets and length as on the oracle, and
// writes (tensors copied from the file) byte for byte the file an eager load writes.
TEST(MlxPromptCache, DeferredLoadingDescribesChecksAndConvertsLikeEagerLoading) {
  ReferenceBackend be;
  std::vector<CacheState> states;
  for (const Built& b : built_caches()) states.push_back(build(be, b));
  const fs::path mlx = scratch("deferred.safetensors"), kv = scratch("deferred.kvlab");
  save_mlx_prompt_cache(mlx, states, {{"model", "m"}});
  save_cache_states(kv, states, {{"model", "m"}});
  for (const fs::path& in : {mlx, kv}) {
    SCOPED_TRACE(in.string());
    const LoadedStates eager = load_any_cache_states(in);
    const LoadedStates deferred = load_any_cache_states(in, nullptr, TensorLoad::deferred_all);
    EXPECT_EQ(deferred_count(eager), 0u);
    EXPECT_GT(deferred_count(deferred), states.size());
    ASSERT_EQ(deferred.layers.size(), eager.layers.size());
    ShapeBackend shapes;
    for (std::size_t i = 0; i < eager.layers.size(); ++i) {
      SCOPED_TRACE(built_caches()[i].name);
      expect_same_state(eager.layers[i], materialized(deferred.layers[i]));
      const auto real = cache_from_state(be, eager.layers[i]);
      const auto shape_only = cache_from_state(shapes, deferred.layers[i]);
      EXPECT_EQ(real->offsets(), shape_only->offsets());
      EXPECT_EQ(real->kv_length(), shape_only->kv_length());
    }
    for (const StateFileFormat to : {StateFileFormat::kvlab, StateFileFormat::mlx_lm}) {
      const fs::path a = scratch("from_eager"), b = scratch("from_deferred");
      const auto save = [&](const fs::path& p, const LoadedStates& st) {
        if (to == StateFileFormat::kvlab)
          save_cache_states(p, st.layers, st.user_metadata);
        else
          save_mlx_prompt_cache(p, st.layers, st.user_metadata);
      };
      save(a, eager);
      save(b, deferred);
      EXPECT_EQ(read_bytes(a), read_bytes(b)) << state_file_format_name(to);
    }
  }
  fs::remove_all(mlx.parent_path());
}

TEST(MlxPromptCache, AKvlabFileIsNotAnMlxFile) {
  ReferenceBackend be;
  const fs::path path = scratch("kvlab.safetensors");
  save_cache_states(path, {build(be, built_caches()[0])}, {});
  EXPECT_EQ(detect_state_file_format(path), StateFileFormat::kvlab);
  EXPECT_KVLAB_ERROR(load_mlx_prompt_cache(path), corrupt, "kvlab cache state file");
  write_bytes(path, std::string("\x02\0\0\0\0\0\0\0{}", 10));
  EXPECT_KVLAB_ERROR(detect_state_file_format(path), corrupt, "neither");
  fs::remove_all(path.parent_path());
}

// ---- states mlx-lm cannot hold ----------------------------------------------------------

TEST(MlxPromptCache, UnrepresentableStatesAreRefusedBeforeWriting) {
  ReferenceBackend be;
  const fs::path path = scratch("refused.safetensors");
  CacheSetup setup;
  const auto refused = [&](const CacheState& s, const std::map<std::string, std::string>& user,
                           std::vector<std::string> named) {
    testing::expect_error([&] { save_mlx_prompt_cache(path, {s}, user); }, ErrorKind::invalid_argument, named);
    EXPECT_FALSE(fs::exists(path));
  };
  refused(make_cache(be, CacheKind::turboquant, setup)->state(), {}, {"TurboQuantKVCache", "mlx-lm 0.32.2"});
  setup.spec = QuantSpec{QuantMode::mxfp4, 4, 32};
  refused(make_cache(be, CacheKind::quantized, setup)->state(), {}, {"mxfp4"});
  setup.left_padding = {1, 0};
  auto batch = make_cache(be, CacheKind::batch_kv, setup);
  prepare_right(batch_verbs(*batch, "prepare"), {0, 2}, 4);
  refused(batch->state(), {}, {"right padding"});
  const CacheState plain = build(be, built_caches()[0]);
  refused(plain, {{"a.b", "x"}}, {"'a.b'"});
  refused(plain, {{"12", "x"}}, {"'12'"});
  CacheState extra = plain;
  extra.meta["colour"] = "blue";
  refused(extra, {}, {"colour"});
  CacheState lying = plain;
  lying.meta["offset"] = "9";
  refused(lying, {}, {"not a valid cache state", "'9'"});
  fs::remove_all(path.parent_path());
}

}  // namespace
}  // namespace test_mlx_prompt_cache
}  // namespace kvlab

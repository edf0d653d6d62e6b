// The cache state file (cache/state_file.h): round trips, the safetensors layout checked
// by an independent parser, strict loading of corrupt files, and atomic saving.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "cache/state_file.h"
#include "core/safetensors.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_state_file {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  // Unlink first: ext4 flushes a file truncated and rewritten in place on close
  // (auto_da_alloc), which made the corruption loops I/O bound.
  fs::remove(p);
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xffu);
  return s;
}

std::uint64_t header_length(const std::string& bytes) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < 8; ++i) n |= std::uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  return n;
}

std::string raw(const Tensor& t) {
  if (t.nbytes() == 0) return {};
  return {reinterpret_cast<const char*>(t.data()), t.nbytes()};
}

// A tensor of the given dtype whose bytes are a deterministic pattern (NaN bit patterns
// included for float dtypes, since the bytes are copied, never converted).
Tensor patterned(DType dtype, Shape shape, unsigned seed) {
  Tensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  auto* p = reinterpret_cast<unsigned char*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng());
  return t;
}

std::vector<CacheState> sample_layers() {
  std::vector<CacheState> layers(4);
  layers[0] = {"KVCache",
               {{"keys", patterned(DType::f32, {1, 2, 3, 4}, 1)}, {"values", patterned(DType::f32, {1, 2, 3, 5}, 2)}},
               {{"offset", "3"}}};
  layers[1] = {"AllDtypes",
               {{"f16", patterned(DType::f16, {2, 3}, 3)},
                {"bf16", patterned(DType::bf16, {3, 1, 2}, 4)},
                {"u32", patterned(DType::u32, {5}, 5)},
                {"i32", patterned(DType::i32, {2, 2}, 6)},
                {"u8", patterned(DType::u8, {7}, 7)},
                {"scalar", patterned(DType::f32, {}, 8)},
                {"empty", Tensor(DType::f16, {1, 2, 0, 4})},
                {"nested.name.with.dots", patterned(DType::u8, {3}, 9)}},
               {{"a.b", "dotted meta key"}, {"", "empty key"}, {"n", ""}}};
  layers[2] = {"NoTensors", {}, {{"chunk_size", "4"}, {"start_position", "295"}}};
  layers[3] = {"KVCache", {}, {{"offset", "0"}}};
  return layers;
}

const std::map<std::string, std::string> kUser = {
    {"model", "llama"}, {"a.b.c", "dots stay flat"}, {"0", "numeric key"},
    {"", "empty key"},  {"ключ.π", "値 ✓"},           {"empty", ""}};

void expect_same(const std::vector<CacheState>& want, const std::vector<CacheState>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    EXPECT_EQ(want[i].class_name, got[i].class_name);
    EXPECT_EQ(want[i].meta, got[i].meta);
    ASSERT_EQ(want[i].tensors.size(), got[i].tensors.size());
    for (const auto& [name, t] : want[i].tensors) {
      ASSERT_EQ(got[i].tensors.count(name), 1u) << name;
      const Tensor& g = got[i].tensors.at(name);
      EXPECT_EQ(g.dtype(), t.dtype()) << name;
      EXPECT_EQ(g.shape(), t.shape()) << name;
      EXPECT_EQ(raw(g), raw(t)) << name;  // bit-exact, NaN payloads included
    }
  }
}

class StateFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kvlab_state_" + std::string(info->name()) + "_" + std::to_string(::getpid()) + "_" +
            std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path dir_;
};

TEST_F(StateFileTest, RoundTripsLayersDtypesEmptyTensorsAndMetadataExactly) {
  const fs::path file = dir_ / "cache.safetensors";
  const auto layers = sample_layers();
  save_cache_states(file, layers, kUser);
  const LoadedStates loaded = load_cache_states(file);
  expect_same(layers, loaded.layers);
  EXPECT_EQ(loaded.user_metadata, kUser);  // dotted, numeric, empty and unicode keys stay flat
  EXPECT_EQ(listing(), std::vector<std::string>{"cache.safetensors"});  // no temporary left
}

TEST_F(StateFileTest, EmptyListAndEmptyMetadataRoundTrip) {
  const fs::path file = dir_ / "empty.safetensors";
  save_cache_states(file, {}, {});
  const LoadedStates loaded = load_cache_states(file);
  EXPECT_TRUE(loaded.layers.empty());
  EXPECT_TRUE(loaded.user_metadata.empty());
}

// The writers' header limit is the readers' (core/safetensors.h kMaxHeaderBytes): every
// writer pads its header with pad_header before it touches the file system, which
// accepts exactly the limit and refuses a byte more. Before, no writer had a limit: a
// long user metadata value made a file that every kvlab reader then refused. (An
// end-to-end save of a header that size is slow under ASan and would check nothing more.)
TEST(SafetensorsHeader, PaddingAcceptsExactlyTheReadersLimit) {
  for (const std::size_t size : {safetensors::kMaxHeaderBytes - 8, safetensors::kMaxHeaderBytes - 7,
                                 safetensors::kMaxHeaderBytes}) {
    std::string text(size, '{');
    safetensors::pad_header(text);
    EXPECT_EQ(text.size() % 8, 0u);
    EXPECT_LE(text.size(), safetensors::kMaxHeaderBytes);
  }
  std::string over(safetensors::kMaxHeaderBytes + 1, '{');
  EXPECT_KVLAB_ERROR(safetensors::pad_header(over), invalid_argument, "every kvlab reader accepts");
}

TEST_F(StateFileTest, SaveOverwritesAnExistingFile) {
  const fs::path file = dir_ / "c.safetensors";
  save_cache_states(file, sample_layers(), kUser);
  const std::vector<CacheState> one = {{"KVCache", {{"keys", patterned(DType::u8, {2}, 11)}}, {}}};
  save_cache_states(file, one, {{"k", "v"}});
  const LoadedStates loaded = load_cache_states(file);
  expect_same(one, loaded.layers);
  EXPECT_EQ(loaded.user_metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  EXPECT_EQ(listing(), std::vector<std::string>{"c.safetensors"});
}

// Parses the file with nothing but nlohmann and the safetensors rules, so a reader in
// another language (safetensors, mx.load) would see the same thing.
TEST_F(StateFileTest, FileIsStandardSafetensors) {
  const fs::path file = dir_ / "cache.safetensors";
  const auto layers = sample_layers();
  save_cache_states(file, layers, kUser);
  const std::string bytes = read_bytes(file);
  ASSERT_GE(bytes.size(), 8u);
  const std::uint64_t n = header_length(bytes);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ(n % 8, 0u) << "header padded so the data region is 8-byte aligned";
  EXPECT_EQ(bytes[8], '{');
  const json header = json::parse(bytes.substr(8, n));
  const std::string data = bytes.substr(8 + n);

  const json& meta = header.at("__metadata__");
  EXPECT_EQ(meta.at("kvlab.format"), kStateFileFormat);
  EXPECT_EQ(meta.at("kvlab.layers"), "4");
  EXPECT_EQ(meta.at("L.0.class"), "KVCache");
  EXPECT_EQ(meta.at("L.0.meta.offset"), "3");
  EXPECT_EQ(meta.at("L.1.meta.a.b"), "dotted meta key");
  EXPECT_EQ(meta.at("L.2.meta.start_position"), "295");
  EXPECT_EQ(meta.at("user.a.b.c"), "dots stay flat");
  EXPECT_EQ(meta.at("user.ключ.π"), "値 ✓");
  for (const auto& [k, v] : meta.items()) EXPECT_TRUE(v.is_string()) << k;

  // Tensors are packed back to back in layer order, then name order.
  std::uint64_t cursor = 0;
  std::size_t tensors = 0;
  const std::map<DType, std::string> names = {{DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"},
                                              {DType::u32, "U32"}, {DType::i32, "I32"}, {DType::u8, "U8"}};
  for (std::size_t i = 0; i < layers.size(); ++i) {
    for (const auto& [name, t] : layers[i].tensors) {
      const std::string key = "L." + std::to_string(i) + "." + name;
      ASSERT_TRUE(header.contains(key)) << key;
      const json& e = header.at(key);
      EXPECT_EQ(e.at("dtype"), names.at(t.dtype())) << key;
      EXPECT_EQ(e.at("shape").get<std::vector<std::int64_t>>(), t.shape()) << key;
      const auto off = e.at("data_offsets").get<std::vector<std::uint64_t>>();
      ASSERT_EQ(off.size(), 2u);
      EXPECT_EQ(off[0], cursor) << key;
      EXPECT_EQ(off[1] - off[0], t.nbytes()) << key;
      EXPECT_EQ(data.substr(off[0], off[1] - off[0]), raw(t)) << key << ": little-endian raw bytes";
      cursor = off[1];
      ++tensors;
    }
  }
  EXPECT_EQ(cursor, data.size()) << "no gaps or trailing bytes";
  EXPECT_EQ(header.size(), tensors + 1) << "only tensors and __metadata__ at the top level";
}

// ---- strict loading ---------------------------------------------------------------

struct Parts {
  json header;
  std::string data;
};

class CorruptFileTest : public StateFileTest {
 protected:
  void SetUp() override {
    StateFileTest::SetUp();
    file_ = dir_ / "base.safetensors";
    const std::vector<CacheState> layers = {
        {"KVCache",
         {{"keys", patterned(DType::f32, {1, 1, 2, 2}, 21)}, {"values", patterned(DType::f32, {1, 1, 2, 2}, 22)}},
         {{"offset", "2"}}},
        {"ChunkedKVCache", {}, {{"chunk_size", "4"}}}};
    save_cache_states(file_, layers, {{"note", "x"}});
    base_ = read_bytes(file_);
    const std::uint64_t n = header_length(base_);
    header_text_ = base_.substr(8, n);
    parts_ = {json::parse(header_text_), base_.substr(8 + n)};
  }
  static std::string assemble(const std::string& header_text, const std::string& data) {
    return le64(header_text.size()) + header_text + data;
  }
  static std::string assemble(const Parts& p) { return assemble(p.header.dump(), p.data); }

  // Loads `bytes` from a file and returns the Error, failing the test if none is thrown.
  Error load_error(const std::string& bytes) {
    const fs::path p = dir_ / "case.safetensors";
    write_bytes(p, bytes);
    try {
      load_cache_states(p);
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "loading did not throw";
    return Error(ErrorKind::internal, "no error");
  }

  fs::path file_;
  std::string base_, header_text_;
  Parts parts_;
};

TEST_F(CorruptFileTest, BaselineLoads) { EXPECT_EQ(load_cache_states(file_).layers.size(), 2u); }

// Every proper prefix of a valid file is a clean, named error (a crash during a write
// that bypassed the atomic rename, a truncated copy, a partial download).
TEST_F(CorruptFileTest, EveryPrefixIsACleanError) {
  for (std::size_t len = 0; len < base_.size(); ++len) {
    SCOPED_TRACE("prefix of " + std::to_string(len) + " bytes");
    const Error e = load_error(base_.substr(0, len));
    EXPECT_EQ(e.kind(), ErrorKind::corrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("case.safetensors"), std::string::npos) << e.what();
  }
}

struct CorruptionCase {
  const char* name;
  std::function<std::string(const Parts& base, const std::string& header_text)> make;
  const char* expect;  // substring of the message
};

TEST_F(CorruptFileTest, CorruptionTableGivesNamedErrors) {
  const auto with = [](std::function<void(Parts&)> edit) {
    return [edit](const Parts& base, const std::string&) {
      Parts p = base;
      edit(p);
      return assemble(p);
    };
  };
  const auto text = [](std::function<std::string(std::string)> edit) {
    return [edit](const Parts& base, const std::string& header_text) { return assemble(edit(header_text), base.data); };
  };
  const std::vector<CorruptionCase> cases = {
      {"huge header length", [](const Parts& b, const std::string& h) { return le64(~0ull) + h + b.data; }, "exceeds"},
      {"header length one past the end",
       [](const Parts& b, const std::string& h) { return le64(h.size() + b.data.size() + 1) + h + b.data; }, "exceeds"},
      {"zero header length", [](const Parts& b, const std::string& h) { return le64(0) + h + b.data; },
       "start with '{'"},
      {"header is an array", text([](std::string) { return std::string("[1, 2]"); }), "start with '{'"},
      {"bad JSON", text([](std::string h) { return h.replace(h.find_last_of('}'), 1, " "); }), "not valid JSON"},
      {"unterminated string", text([](std::string h) { return h.replace(h.find("\"dtype\""), 7, "\"dtype "); }),
       "not valid JSON"},
      {"duplicate key", text([](std::string h) { return "{\"__metadata__\":{}," + h.substr(1); }), "duplicate"},
      {"deep nesting", text([](std::string h) { return "{\"x\":[[[[[[[[1]]]]]]]]," + h.substr(1); }), "deeper"},
      {"unknown dtype", with([](Parts& p) { p.header["L.0.keys"]["dtype"] = "F64"; }), "unknown dtype \"F64\""},
      {"lowercase dtype", with([](Parts& p) { p.header["L.0.keys"]["dtype"] = "f32"; }), "unknown dtype"},
      {"negative dim", with([](Parts& p) { p.header["L.0.keys"]["shape"][2] = -2; }), "not a non-negative integer"},
      {"float dim", with([](Parts& p) { p.header["L.0.keys"]["shape"][2] = 2.0; }), "not a non-negative integer"},
      {"shape not a list", with([](Parts& p) { p.header["L.0.keys"]["shape"] = "1,1,2,2"; }), "not a list"},
      {"shape overflows", with([](Parts& p) { p.header["L.0.keys"]["shape"] = {1ull << 40, 1ull << 40, 0}; }),
       "overflows"},
      {"offsets past the data",
       with([](Parts& p) { p.header["L.0.values"]["data_offsets"] = {16, 16 + 1000}; }), "outside the data region"},
      {"offsets reversed", with([](Parts& p) { p.header["L.0.values"]["data_offsets"] = {32, 16}; }),
       "outside the data region"},
      {"offsets not a pair", with([](Parts& p) { p.header["L.0.values"]["data_offsets"] = {16}; }), "not a pair"},
      {"size disagrees with shape", with([](Parts& p) { p.header["L.0.keys"]["shape"] = {1, 1, 1, 2}; }),
       "needs 8"},
      {"overlapping tensors", with([](Parts& p) { p.header["L.0.values"]["data_offsets"] = {0, 16}; }), "overlaps"},
      {"gap in the data",
       with([](Parts& p) {
         p.data.insert(16, 4, '\0');
         p.header["L.0.values"]["data_offsets"] = {20, 36};
       }),
       "gap [16, 20)"},
      {"trailing garbage", with([](Parts& p) { p.data += "junk"; }), "4 trailing bytes"},
      {"extra entry field", with([](Parts& p) { p.header["L.0.keys"]["extra"] = 1; }), "exactly dtype"},
      {"tensor of a missing layer", with([](Parts& p) { p.header["L.2.keys"] = p.header["L.0.keys"]; }),
       "names layer 2"},
      {"non-canonical layer index",
       with([](Parts& p) {
         p.header["L.01.keys"] = p.header["L.0.keys"];
         p.header.erase("L.0.keys");
       }),
       "L.<layer>.<tensor>"},
      {"no __metadata__", with([](Parts& p) { p.header.erase("__metadata__"); }), "no __metadata__"},
      {"__metadata__ not an object", with([](Parts& p) { p.header["__metadata__"] = "x"; }), "not an object"},
      {"no format", with([](Parts& p) { p.header["__metadata__"].erase("kvlab.format"); }), "no kvlab.format"},
      {"wrong format version",
       with([](Parts& p) { p.header["__metadata__"]["kvlab.format"] = "kvlab.cache_states/2"; }), "cache_states/2"},
      {"no layer count", with([](Parts& p) { p.header["__metadata__"].erase("kvlab.layers"); }), "no kvlab.layers"},
      {"lying layer count",
       with([](Parts& p) { p.header["__metadata__"]["kvlab.layers"] = "999999999"; }), "not a layer count"},
      {"missing class", with([](Parts& p) { p.header["__metadata__"].erase("L.1.class"); }), "layer 1 has no class"},
      {"extra layer metadata",
       with([](Parts& p) { p.header["__metadata__"]["L.2.class"] = "KVCache"; }), "names layer 2"},
      {"non-string metadata", with([](Parts& p) { p.header["__metadata__"]["user.n"] = 5; }), "not a string"},
      {"unknown metadata key", with([](Parts& p) { p.header["__metadata__"]["other"] = "x"; }), "unknown metadata"},
      {"unknown layer field", with([](Parts& p) { p.header["__metadata__"]["L.0.klass"] = "x"; }),
       "unknown metadata"},
  };
  ASSERT_GE(cases.size(), 12u);
  for (const CorruptionCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Error e = load_error(c.make(parts_, header_text_));
    EXPECT_EQ(e.kind(), ErrorKind::corrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
  }
}

// Every range check at its limit: the value at the limit loads (the baseline file holds
// the values just inside), one past it is a named error. The corruption table above tries
// values far outside, which an off-by-one check would still refuse.
TEST_F(CorruptFileTest, RangeChecksHoldAtTheirLimits) {
  const auto with = [&](std::function<void(Parts&)> edit) {
    Parts p = parts_;
    edit(p);
    return assemble(p);
  };
  const std::size_t data = parts_.data.size();
  // A tensor may end at the last data byte, not one past it.
  const auto says = [](const Error& e, const char* what) { return std::string(e.what()).find(what) != std::string::npos; };
  const Error past = load_error(with([&](Parts& p) { p.header["L.0.values"]["data_offsets"] = {16, data + 1}; }));
  EXPECT_TRUE(says(past, "outside the data region")) << past.what();
  // The header length may reach the end of the file, not one byte past it.
  const Error header = load_error(le64(header_text_.size() + data + 1) + header_text_ + parts_.data);
  EXPECT_TRUE(says(header, "exceeds the")) << header.what();
  // JSON nests 3 deep (object, entry, shape); a fourth level is refused by name, a third
  // level elsewhere only for what it is.
  const auto nested = [&](const std::string& value) {
    return load_error(assemble("{\"x\":" + value + "," + header_text_.substr(1), parts_.data));
  };
  EXPECT_TRUE(says(nested("[[[1]]]"), "deeper than 3")) << nested("[[[1]]]").what();
  EXPECT_FALSE(says(nested("[[1]]"), "deeper")) << nested("[[1]]").what();
  // The layer count is exact: one more or one fewer than the layers present is refused.
  for (const char* count : {"1", "3"}) {
    SCOPED_TRACE(count);
    const Error e = load_error(with([&](Parts& p) { p.header["__metadata__"]["kvlab.layers"] = count; }));
    EXPECT_EQ(e.kind(), ErrorKind::corrupt) << e.what();
  }
}

// Flipping any single header bit either still loads (e.g. a changed metadata letter)
// or throws a kvlab::Error; under ASan/UBSan this is the "never a crash" property.
TEST_F(CorruptFileTest, FlippedHeaderBytesNeverCrash) {
  int errors = 0, loads = 0;
  for (std::size_t i = 0; i < 8 + header_text_.size(); ++i) {
    for (unsigned mask : {0x01u, 0x20u, 0x80u}) {
      std::string bytes = base_;
      bytes[i] = static_cast<char>(static_cast<unsigned char>(bytes[i]) ^ mask);
      write_bytes(dir_ / "flip.safetensors", bytes);
      try {
        load_cache_states(dir_ / "flip.safetensors");
        ++loads;
      } catch (const Error& e) {
        EXPECT_TRUE(e.kind() == ErrorKind::corrupt) << "byte " << i << ": " << e.what();
        ++errors;
      }
    }
  }
  EXPECT_GT(errors, loads) << "most flips must be detected";
}

TEST_F(CorruptFileTest, MissingFileAndDirectoryAreIoErrors) {
  for (const fs::path& p : {dir_ / "absent.safetensors", dir_}) {
    try {
      load_cache_states(p);
      ADD_FAILURE() << p << " loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::io) << e.what();
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
    }
  }
}

// ---- atomic saving ----------------------------------------------------------------

TEST_F(StateFileTest, MissingParentDirectoryIsANamedIoError) {
  const fs::path file = dir_ / "no" / "such" / "dir" / "c.safetensors";
  try {
    save_cache_states(file, sample_layers(), kUser);
    FAIL() << "saving into a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
  EXPECT_TRUE(listing().empty());
}

TEST_F(StateFileTest, UnrepresentableStateLeavesTheOldFileAlone) {
  const fs::path file = dir_ / "c.safetensors";
  save_cache_states(file, sample_layers(), kUser);
  const std::string before = read_bytes(file);
  std::vector<CacheState> bad = sample_layers();
  bad[2].class_name.clear();
  EXPECT_THROW(save_cache_states(file, bad, kUser), Error);
  EXPECT_THROW(save_cache_states(file, sample_layers(), {{"bad", std::string("\xff\xfe")}}), Error);
  EXPECT_EQ(read_bytes(file), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"c.safetensors"});
}

TEST_F(StateFileTest, RenameFailureRemovesTheTemporary) {
  const fs::path target = dir_ / "is_a_directory";
  fs::create_directories(target / "child");
  try {
    save_cache_states(target, sample_layers(), kUser);
    FAIL() << "renaming over a non-empty directory succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    EXPECT_NE(std::string(e.what()).find(target.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"is_a_directory"});
  EXPECT_TRUE(fs::exists(target / "child"));
}

TEST_F(StateFileTest, ReadOnlyDirectoryLeavesTheOldFileByteIdentical) {
  const fs::path file = dir_ / "c.safetensors";
  save_cache_states(file, sample_layers(), kUser);
  const std::string before = read_bytes(file);
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
  if (std::ofstream(dir_ / "probe")) {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::replace);
    GTEST_SKIP() << "running with permission override (root): a read-only directory is still writable";
  }
  EXPECT_THROW(save_cache_states(file, {{"KVCache", {}, {}}}, {}), Error);
  fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::replace);
  EXPECT_EQ(read_bytes(file), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"c.safetensors"});
}

// A write that fails half way (disk full, quota) must leave the old file intact and no
// temporary behind. RLIMIT_FSIZE makes write() fail with EFBIG even for root.
TEST_F(StateFileTest, FailedWriteMidFileLeavesTheOldFileByteIdentical) {
  const fs::path file = dir_ / "c.safetensors";
  save_cache_states(file, sample_layers(), kUser);
  const std::string before = read_bytes(file);
  std::vector<CacheState> big = {{"KVCache", {{"keys", patterned(DType::f32, {1, 1, 4096, 64}, 31)}}, {}}};

  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
  rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  std::string message;
  try {
    save_cache_states(file, big, {});
  } catch (const Error& e) {
    threw = e.kind() == ErrorKind::io;
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_TRUE(threw) << message;
  EXPECT_NE(message.find(file.string()), std::string::npos) << message;
  EXPECT_EQ(read_bytes(file), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"c.safetensors"});
  expect_same(sample_layers(), load_cache_states(file).layers);
}

}  // namespace
}  // namespace test_state_file
}  // namespace kvlab

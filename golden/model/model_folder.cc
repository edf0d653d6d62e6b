#include "golden/model/model_folder.h"

#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/safetensors_file.h"
#include "golden/files/inputs.h"
#include "golden/model/model.h"
#include "kvlab/error.h"

namespace kvlab::golden {
namespace {

namespace fs = std::filesystem;

// Small text files only (a config, a hash, a stamp): bounded so a wrong path cannot make
// us read a large file into memory.
std::string read_small_text(const fs::path& path, std::string_view noun) {
  constexpr std::uintmax_t kMaxBytes = 1u << 20;
  require_regular_file(path, noun);
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  KVLAB_REQUIRE(!ec && size <= kMaxBytes, io, noun, " '", path.string(), "' is larger than ", kMaxBytes, " bytes");
  std::ifstream in(path, std::ios::binary);
  KVLAB_REQUIRE(in, io, "cannot open ", noun, " '", path.string(), "'");
  std::string text(std::istreambuf_iterator<char>(in), {});
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  return text;
}

nlohmann::json read_config(const fs::path& path) {
  try {
    return nlohmann::json::parse(read_small_text(path, "model config"));
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::corrupt, cat("model config '", path.string(), "' is not valid JSON: ", e.what()));
  }
}

std::string stamp_text(const std::string& sha256) { return sha256 + "  model.safetensors"; }

void write_stamp(const fs::path& dir, const std::string& sha256) {
  const std::string text = stamp_text(sha256) + "\n";
  safetensors::TempFile tmp(dir / kGeneratedStamp, "model stamp");
  tmp.write(text.data(), text.size());
  tmp.commit();
}

}  // namespace

ModelFolder ensure_model_folder(const fs::path& golden_dir, const std::string& id, const fs::path& models_dir) {
  const fs::path source = golden_dir / "models" / id;
  const nlohmann::json config = read_config(source / "config.json");
  const std::string want = read_small_text(source / "model.sha256", "model hash file");
  ModelFolder out{models_dir / id, "", false};
  const fs::path weights = out.dir / "model.safetensors", stamp = out.dir / kGeneratedStamp;
  std::error_code ec;
  const bool has_weights = fs::exists(weights, ec) || fs::is_symlink(weights, ec);
  if (has_weights) require_regular_file(weights, "model weights file");
  const std::string have = has_weights ? sha256_file(weights) : std::string();
  const bool config_same = fs::exists(out.dir / "config.json", ec) && read_config(out.dir / "config.json") == config;
  const bool stamped = fs::exists(stamp, ec) && read_small_text(stamp, "model stamp") == stamp_text(have);
  if (has_weights && have == want && config_same) {
    if (!stamped) write_stamp(out.dir, have);
    out.sha256 = have;
    return out;
  }
  if (has_weights && !stamped) {
    const std::string what = have == want ? cat("its config.json differs from ", (source / "config.json").string())
                                          : cat("its sha256 is ", have, ", not the ", want, " of ",
                                                (source / "model.sha256").string());
    fail(ErrorKind::invalid_argument,
         cat("model '", id, "': '", weights.string(), "' was not written by kvlab (no ", kGeneratedStamp,
             " beside it names its hash) and ", what,
             "; kvlab does not overwrite it. To record goldens of these weights, pass their folder: "
             "`kvlab golden record --model-dir ", out.dir.string(), " --scenarios FILE ...`; to let kvlab generate '",
             id, "' here, move the folder away or choose another --models folder"));
  }
  fs::create_directories(out.dir, ec);
  KVLAB_REQUIRE(!ec, io, "cannot create the model folder '", out.dir.string(), "': ", ec.message());
  out.sha256 = write_tiny_model(config, id, out.dir);
  out.generated = true;
  write_stamp(out.dir, out.sha256);  // ours whatever its hash: a later run may regenerate it
  KVLAB_REQUIRE(out.sha256 == want, internal, "model '", id, "': generated weights hash ", out.sha256, " but ",
                (source / "model.sha256").string(), " says ", want,
                " (the generator changed: regenerate every golden with `kvlab golden update --accept` and the hash)");
  return out;
}

}  // namespace kvlab::golden

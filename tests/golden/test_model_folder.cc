// The generated model folders (golden/model/model_folder.h): generated and stamped on demand,
// reused when intact, regenerated only when kvlab's stamp names the weights there, and a
// user's own weights never overwritten — refused naming the path and both hashes.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "golden/model/model.h"
#include "golden/model/model_folder.h"
#include "tests/golden/scratch_dir.h"
#include "kvlab/error.h"

namespace kvlab::golden::test_model_folder {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const fs::path kGoldenDir = KVLAB_GOLDEN_SOURCE_DIR;

fs::path fresh(const std::string& name) {
  const fs::path dir = test::process_scratch_dir("kvlab_golden_model_") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string contents(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string checked_in_hash() {
  std::string h = contents(kGoldenDir / "models" / "llama_dense" / "model.sha256");
  return h.substr(0, 64);
}

std::string refusal(const fs::path& models) {
  try {
    ensure_model_folder(kGoldenDir, "llama_dense", models);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ModelFolder, GeneratesStampsAndThenReuses) {
  const fs::path models = fresh("generates");
  const ModelFolder first = ensure_model_folder(kGoldenDir, "llama_dense", models);
  EXPECT_TRUE(first.generated);
  EXPECT_EQ(first.sha256, checked_in_hash());
  EXPECT_EQ(contents(first.dir / kGeneratedStamp), first.sha256 + "  model.safetensors\n");
  const ModelFolder second = ensure_model_folder(kGoldenDir, "llama_dense", models);
  EXPECT_FALSE(second.generated);
  EXPECT_EQ(second.sha256, first.sha256);
}

TEST(ModelFolder, NeverOverwritesWeightsKvlabDidNotWrite) {
  const fs::path models = fresh("foreign");
  const fs::path weights = models / "llama_dense" / "model.safetensors";
  put(weights, "a user's own weights");
  const std::string e = refusal(models);
  EXPECT_THAT(e, HasSubstr(weights.string()));
  EXPECT_THAT(e, HasSubstr(sha256_hex("a user's own weights")));
  EXPECT_THAT(e, HasSubstr(checked_in_hash()));
  EXPECT_THAT(e, HasSubstr("--model-dir"));
  EXPECT_EQ(contents(weights), "a user's own weights");
  // A stamp that names other bytes (kvlab wrote the folder, the user replaced the
  // weights) does not make them kvlab's.
  put(models / "llama_dense" / kGeneratedStamp, checked_in_hash() + "  model.safetensors\n");
  EXPECT_THAT(refusal(models), HasSubstr("was not written by kvlab"));
  EXPECT_EQ(contents(weights), "a user's own weights");
}

TEST(ModelFolder, RegeneratesStaleWeightsItsStampNames) {
  const fs::path models = fresh("stale");
  put(models / "llama_dense" / "model.safetensors", "stale kvlab weights");
  put(models / "llama_dense" / kGeneratedStamp, sha256_hex("stale kvlab weights") + "  model.safetensors\n");
  const ModelFolder f = ensure_model_folder(kGoldenDir, "llama_dense", models);
  EXPECT_TRUE(f.generated);
  EXPECT_EQ(sha256_file(f.dir / "model.safetensors"), checked_in_hash());
}

TEST(ModelFolder, AdoptsUnstampedWeightsThatAreKvlabsBytes) {
  // Folders generated before the stamp existed hold the checked-in bytes: used as they are.
  const fs::path models = fresh("adopts");
  ensure_model_folder(kGoldenDir, "llama_dense", models);
  fs::remove(models / "llama_dense" / kGeneratedStamp);
  const ModelFolder f = ensure_model_folder(kGoldenDir, "llama_dense", models);
  EXPECT_FALSE(f.generated);
  EXPECT_TRUE(fs::exists(f.dir / kGeneratedStamp));
}

TEST(ModelFolder, SpecialFilesAreRefused) {
  const fs::path models = fresh("fifo");
  fs::create_directories(models / "llama_dense");
  ASSERT_EQ(::mkfifo((models / "llama_dense" / "model.safetensors").c_str(), 0600), 0);
  EXPECT_THAT(refusal(models), HasSubstr("is not a regular file (it is a FIFO)"));
  const fs::path dirs = fresh("dir");
  fs::create_directories(dirs / "llama_dense" / "model.safetensors");
  EXPECT_THAT(refusal(dirs), HasSubstr("is not a regular file (it is a directory)"));
}

}  // namespace kvlab::golden::test_model_folder

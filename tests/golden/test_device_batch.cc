// The device_batch golden's independent cross-check: two cache implementations of one
// layout must agree bit for bit on the reference backend.
//
// Why bit for bit, derived rather than observed: DeviceBatchKVCache (cache/) stores the
// same (B, H, capacity, D) buffers as BatchKVCache, at the same columns (one shared
// cursor, rows right-aligned behind their left padding); its mask is BatchKVCache's
// (batch_causal_mask over the same padding); its positions are the same integers
// (−left_padding[b] + columns written), only held in backend memory and copied there by
// kv_snapshot instead of uploaded from the host. The reference backend then runs the
// same kernels on the same bytes in the same order, so every logit and attention output
// is the same float — a tolerance would only hide an offset that is off in a way that
// moves logits by less than it.
//
// The cross-check can fail: a wrapper whose snapshot aliases the live offsets (read after
// the append) must be caught on gemma4_small, whose KV-shared layers read the snapshot
// after their producer's append.

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>

#include "golden/files/diff.h"
#include "golden/runner/runner.h"
#include "harness/backends.h"
#include "tests/golden/scratch_dir.h"

namespace kvlab::golden {
namespace {

namespace fs = std::filesystem;

const fs::path kGolden = KVLAB_GOLDEN_SOURCE_DIR;

struct Loaded {
  std::unique_ptr<Model> model;
  std::string sha256;
};

Loaded load_model(const std::string& id) {
  std::ifstream in(kGolden / "models" / id / "config.json");
  const fs::path dir = test::process_scratch_dir("kvlab_golden_device_") / id;
  fs::create_directories(dir);
  Loaded out;
  out.sha256 = write_tiny_model(nlohmann::json::parse(in), id, dir);
  out.model = Model::load(dir);
  return out;
}

Scenario device_scenario(const std::string& id) {
  for (Scenario& s : read_scenarios(kGolden / "scenarios" / id))
    if (s.name == "device_batch") return s;
  ADD_FAILURE() << "golden/scenarios/" << id << " has no device_batch scenario";
  return {};
}

bool same_floats(const Tensor& a, const Tensor& b) {
  const auto x = a.to_f32(), y = b.to_f32();
  return a.shape() == b.shape() && x.size() == y.size() &&
         std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Every sequence's tokens, logits and attention records identical to the last bit.
void expect_bit_identical(const Golden& a, const Golden& b, const std::string& what) {
  ASSERT_EQ(a.sequences.size(), b.sequences.size()) << what;
  for (std::size_t i = 0; i < a.sequences.size(); ++i) {
    const SequenceRecord &x = a.sequences[i], &y = b.sequences[i];
    EXPECT_EQ(x.status, "ok") << what << " seq " << i;
    EXPECT_EQ(y.status, "ok") << what << " seq " << i;
    EXPECT_EQ(x.prompt, y.prompt) << what << " seq " << i;
    EXPECT_EQ(x.tokens, y.tokens) << what << " seq " << i;
    EXPECT_TRUE(same_floats(x.logits, y.logits)) << what << " seq " << i << ": logits differ";
    ASSERT_EQ(x.attention.size(), y.attention.size()) << what << " seq " << i;
    for (std::size_t l = 0; l < x.attention.size(); ++l)
      EXPECT_TRUE(same_floats(x.attention[l], y.attention[l])) << what << " seq " << i << " layer " << l;
  }
}

// Per layer, the class each run ended with: the device run must have put
// DeviceBatchKVCache exactly where the host run has BatchKVCache, or the equality above
// would compare the host cache with itself.
void expect_device_classes(const Golden& device, const Golden& host, const std::string& id) {
  std::string want = host.get("cache_classes");
  for (std::size_t at = 0; (at = want.find("BatchKVCache", at)) != std::string::npos; at += 18)
    if (at == 0 || want[at - 1] == ',') want.replace(at, 12, "DeviceBatchKVCache");
  ASSERT_NE(want, host.get("cache_classes")) << id << ": the host run has no BatchKVCache layer";
  EXPECT_EQ(device.get("cache_classes"), want) << id;
}

RunContext reference_context(Backend& backend, const std::string& id, const Loaded& m) {
  RunContext ctx;
  ctx.backend = &backend;
  ctx.model_id = id;
  ctx.model_sha256 = m.sha256;
  return ctx;
}

class DeviceBatchGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceBatchGolden, EqualsTheHostBatchKVCacheRunBitForBit) {
  const std::string id = GetParam();
  const Scenario device = device_scenario(id);
  ASSERT_EQ(device.batch_cache, BatchCache::device) << device.line;
  ASSERT_GE(device.prompts.size(), 2u) << device.line;
  Scenario host = device;
  host.batch_cache = BatchCache::host;
  const Loaded m = load_model(id);
  auto backend = harness::make_backend("reference");
  const RunContext ctx = reference_context(*backend, id, m);
  const Golden on_device = run_scenario(*m.model, device, ctx);
  const Golden on_host = run_scenario(*m.model, host, ctx);
  expect_device_classes(on_device, on_host, id);
  for (const SequenceRecord& s : on_host.sequences) EXPECT_EQ(s.steps(), device.steps) << id;
  expect_bit_identical(on_device, on_host, id + ": DeviceBatchKVCache vs BatchKVCache");
  // The checked-in golden is the host cache's output too, so `golden check` on any
  // backend judges DeviceBatchKVCache against what BatchKVCache computes.
  const Golden checked_in = read_golden(kGolden / "data" / (id + ".device_batch.kvlab.safetensors"));
  expect_bit_identical(checked_in, on_host, id + ": checked-in golden vs BatchKVCache");
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceBatchGolden, ::testing::Values("llama_dense", "llama_hybrid", "gemma4_small"));

// Forwards to a real DeviceBatchKVCache, but the snapshot it hands out aliases the live
// offsets: after each append the snapshot reads the advanced offsets (mlx-lm#1097 /
// #1384, vlm#966: the hazard DeviceBatchKVCache's kv_snapshot copy exists to prevent).
class AliasedSnapshot final : public Cache {
 public:
  explicit AliasedSnapshot(std::unique_ptr<Cache> inner) : Cache(inner->backend()), inner_(std::move(inner)) {}
  std::string_view class_name() const override { return inner_->class_name(); }
  FetchedKV update(const DTensor& k, const DTensor& v) override {
    FetchedKV out = inner_->update(k, v);
    if (handed_out_) {
      const std::vector<std::int32_t> live = inner_->offsets();
      backend().upload(handed_out_, live.data());
    }
    return out;
  }
  std::int64_t kv_length() const override { return inner_->kv_length(); }
  std::vector<std::int32_t> offsets() const override { return inner_->offsets(); }
  DTensor snapshot_positions(std::int64_t batch) const override {
    handed_out_ = inner_->snapshot_positions(batch);  // shares the buffer with the caller's copy
    return handed_out_;
  }
  CacheMask make_mask(std::int64_t n, int window) const override { return inner_->make_mask(n, window); }
  bool is_trimmable() const override { return inner_->is_trimmable(); }
  std::int64_t trim(std::int64_t n) override { return inner_->trim(n); }
  bool empty() const override { return inner_->empty(); }
  std::size_t nbytes() const override { return inner_->nbytes(); }
  CacheState state() const override { return inner_->state(); }
  std::vector<SequenceContent> content(ContentForm form) const override { return inner_->content(form); }
  std::vector<BackingBuffer> buffers() const override { return inner_->buffers(); }

 private:
  std::unique_ptr<Cache> inner_;
  mutable DTensor handed_out_;
};

// The device run with every DeviceBatchKVCache behind AliasedSnapshot; `wrapped` counts them.
Golden run_aliased(const Model& model, const Scenario& s, RunContext ctx, int& wrapped) {
  ctx.wrap_cache = [&wrapped](std::unique_ptr<Cache> c, int) -> std::unique_ptr<Cache> {
    if (c->class_name() != "DeviceBatchKVCache") return c;
    ++wrapped;
    return std::make_unique<AliasedSnapshot>(std::move(c));
  };
  return run_scenario(model, s, ctx);
}

// gemma4_small's KV-shared layers rope their queries at the producer's snapshot after the
// producer appended (attend_shared): aliased, they land L positions too far from the keys
// from the first call on, so the cross-check fails at row 0's step 0 (the prefill).
TEST(DeviceBatchGoldenCanFail, AnAliasedSnapshotIsCaughtWhereKvSharedLayersReadIt) {
  const std::string id = "gemma4_small";
  const Scenario device = device_scenario(id);
  Scenario host = device;
  host.batch_cache = BatchCache::host;
  const Loaded m = load_model(id);
  auto backend = harness::make_backend("reference");
  const RunContext ctx = reference_context(*backend, id, m);
  const Golden on_host = run_scenario(*m.model, host, ctx);
  int wrapped = 0;
  const Golden mutant = run_aliased(*m.model, device, ctx, wrapped);
  ASSERT_GT(wrapped, 0) << "the mutant never reached a DeviceBatchKVCache";
  const auto report = diff_goldens({&on_host, "BatchKVCache"}, {&mutant, "aliased snapshot"}, device.tolerance);
  EXPECT_FALSE(diff_passed(report)) << diff_text(report);
  EXPECT_EQ(report["first_divergence"]["sequence"], 0) << diff_text(report);
  EXPECT_EQ(report["first_divergence"]["step"], 0) << diff_text(report);
}

// Where nothing reads the snapshot after the append (llama: RoPE runs before the update in
// every layer), the same alias is harmless and the run stays bit-identical: the golden
// sees the hazard exactly where an engine would.
TEST(DeviceBatchGoldenCanFail, TheAliasIsHarmlessWhereNoLayerReadsTheSnapshotLate) {
  const std::string id = "llama_dense";
  const Scenario device = device_scenario(id);
  Scenario host = device;
  host.batch_cache = BatchCache::host;
  const Loaded m = load_model(id);
  auto backend = harness::make_backend("reference");
  const RunContext ctx = reference_context(*backend, id, m);
  int wrapped = 0;
  const Golden mutant = run_aliased(*m.model, device, ctx, wrapped);
  ASSERT_GT(wrapped, 0);
  expect_bit_identical(mutant, run_scenario(*m.model, host, ctx), id + ": aliased snapshot vs BatchKVCache");
}

}  // namespace
}  // namespace kvlab::golden

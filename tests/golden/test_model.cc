// The tiny golden models: SHA-256, deterministic weight files (checked-in hashes),
// strict loading, greedy decoding that does not collapse, and batch rows that equal the
// rows run alone. The comparison with mlx-lm itself is tests/golden/model_vs_mlx.py.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "golden/model/model_internal.h"
#include "tests/golden/model_test_util.h"
#include "tests/golden/scratch_dir.h"
#include "reference/reference_backend.h"

namespace kvlab::golden {
namespace {

namespace fs = std::filesystem;
using test::argmax;
using test::logits_row;

const std::vector<std::string> kModels = {"llama_dense", "llama_hybrid", "gemma4_small"};

fs::path source_dir() { return fs::path(KVLAB_GOLDEN_SOURCE_DIR); }

nlohmann::json config_of(const std::string& id) {
  std::ifstream in(source_dir() / "models" / id / "config.json");
  return nlohmann::json::parse(in);
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path scratch(const std::string& name) {
  const fs::path dir = test::process_scratch_dir("kvlab_golden_model_") / name;
  fs::remove_all(dir);
  return dir;
}

// Runs f, expecting a kvlab::Error whose message contains every needle.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no kvlab::Error thrown";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Sha256, KnownVectors) {
  // FIPS 180-2 appendix B and the empty string.
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a', fed in uneven pieces so the block buffering is exercised.
  Sha256 h;
  const std::string chunk(997, 'a');
  std::size_t left = 1000000;
  while (left > 0) {
    const std::size_t n = std::min(left, chunk.size());
    h.update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(h.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // 55, 56 and 64 bytes: the lengths where the padding spills into a second block.
  EXPECT_EQ(sha256_hex(std::string(55, 'a')), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(TinyModel, WritesTheSameBytesTwiceAndTheCheckedInHash) {
  for (const auto& id : kModels) {
    SCOPED_TRACE(id);
    const fs::path a = scratch(id + "_a"), b = scratch(id + "_b");
    const std::string ha = write_tiny_model(config_of(id), id, a);
    const std::string hb = write_tiny_model(config_of(id), id, b);
    EXPECT_EQ(ha, hb);
    EXPECT_EQ(read_text(a / "model.safetensors"), read_text(b / "model.safetensors"));
    EXPECT_EQ(sha256_file(a / "model.safetensors"), ha);
    EXPECT_EQ(nlohmann::json::parse(read_text(a / "config.json")), config_of(id));
    std::string want = read_text(source_dir() / "models" / id / "model.sha256");
    while (!want.empty() && std::isspace(static_cast<unsigned char>(want.back()))) want.pop_back();
    EXPECT_EQ(ha, want) << "golden/models/" << id << "/model.sha256 is stale (or the generator changed)";
  }
}

TEST(TinyModel, LoadRejectsTruncatedWeights) {
  const fs::path dir = scratch("truncated");
  write_tiny_model(config_of("llama_dense"), "llama_dense", dir);
  const fs::path file = dir / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  expect_error([&] { Model::load(dir); }, {"model.safetensors"});
}

TEST(TinyModel, LoadRejectsAMissingOrExtraTensor) {
  const fs::path dir = scratch("missing");
  write_tiny_model(config_of("gemma4_small"), "gemma4_small", dir);
  auto weights = detail::read_f32_safetensors(dir / "model.safetensors", "weights");
  weights.erase("model.layers.3.self_attn.k_norm.weight");
  detail::write_f32_safetensors(dir / "model.safetensors", weights, "weights");
  expect_error([&] { Model::load(dir); }, {"model.layers.3.self_attn.k_norm.weight", "missing"});

  // A KV-shared layer has no k_proj in mlx-lm; one in the file is refused, not ignored.
  weights = detail::read_f32_safetensors(dir / "model.safetensors", "weights");
  weights.emplace("model.layers.3.self_attn.k_norm.weight", Tensor(DType::f32, {32}));
  weights.emplace("model.layers.4.self_attn.k_proj.weight", Tensor(DType::f32, {32, 64}));
  expect_error([&] { Model::create(config_of("gemma4_small"), weights); },
               {"model.layers.4.self_attn.k_proj.weight", "not a parameter"});
}

TEST(TinyModel, LoadRejectsAWrongShape) {
  const fs::path dir = scratch("shape");
  write_tiny_model(config_of("llama_hybrid"), "llama_hybrid", dir);
  auto weights = detail::read_f32_safetensors(dir / "model.safetensors", "weights");
  weights["model.layers.2.mlp.up_proj.weight"] = Tensor(DType::f32, {64, 128});
  detail::write_f32_safetensors(dir / "model.safetensors", weights, "weights");
  expect_error([&] { Model::load(dir); }, {"model.layers.2.mlp.up_proj.weight", "(64, 128)", "(128, 64)"});
}

TEST(TinyModel, RejectsUnsupportedConfigKeys) {
  const fs::path dir = scratch("config");
  write_tiny_model(config_of("gemma4_small"), "gemma4_small", dir);
  const auto gemma_weights = detail::read_f32_safetensors(dir / "model.safetensors", "weights");
  for (const char* key : {"attention_k_eq_v", "enable_moe_block"}) {
    auto config = config_of("gemma4_small");
    config[key] = true;
    expect_error([&] { Model::create(config, gemma_weights); }, {key});
  }
  auto config = config_of("gemma4_small");
  config["rope_parameters"]["full_attention"]["rope_type"] = "yarn";
  expect_error([&] { Model::create(config, gemma_weights); }, {"rope_parameters", "yarn"});

  config = config_of("llama_dense");
  config["attention_bias"] = true;
  expect_error([&] { Model::create(config, {}); }, {"attention_bias"});
  config = config_of("llama_dense");
  config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error([&] { Model::create(config, {}); }, {"rope_scaling", "llama3"});
  config = config_of("llama_dense");
  config["model_type"] = "qwen3";
  expect_error([&] { Model::create(config, {}); }, {"model_type", "qwen3"});
  // Through load(), the message also names the directory.
  config = config_of("gemma4_small");
  config["attention_k_eq_v"] = true;
  std::ofstream(dir / "config.json") << config.dump();
  expect_error([&] { Model::load(dir); }, {"attention_k_eq_v", dir.string()});
}

TEST(TinyModel, WeightLooksUpByMlxName) {
  const fs::path dir = scratch("weight");
  write_tiny_model(config_of("llama_dense"), "llama_dense", dir);
  auto model = Model::load(dir);
  EXPECT_EQ(model->weight("model.norm.weight").shape(), (Shape{64}));
  expect_error([&] { model->weight("model.nope"); }, {"model.nope"});
}

// Greedy decoding of a 13-token prompt for 24 steps must move around (a collapsed model
// would pin nothing beyond one token) and its top-1 must not be a near-tie, or a 1e-6
// change of the arithmetic would flip tokens and goldens would diverge for no reason.
TEST(TinyModel, GreedyDecodingDoesNotCollapse) {
  ReferenceBackend backend;
  for (const auto& id : kModels) {
    SCOPED_TRACE(id);
    const fs::path dir = scratch("greedy_" + id);
    write_tiny_model(config_of(id), id, dir);
    const auto model = Model::load(dir);
    const auto prompt = prompt_tokens(1, 0, 13, model->vocab_size());
    const test::Trace t = test::run_greedy(*model, backend, prompt, 24);
    const std::set<std::int32_t> distinct(t.tokens.begin(), t.tokens.end());
    int clear = 0;
    float smallest = INFINITY;
    for (std::size_t s = 1; s < t.records.size(); ++s) {
      const float m = test::margin(logits_row(t.records[s].logits, 0));
      clear += m > 1e-3f ? 1 : 0;
      smallest = std::min(smallest, m);
    }
    std::cout << id << ": " << distinct.size() << " distinct tokens of 24, " << clear
              << "/24 top-1 margins > 1e-3, smallest " << smallest << "\n";
    EXPECT_GE(distinct.size(), 8u);
    EXPECT_GE(clear, 22);
    for (const auto& r : t.records) {
      ASSERT_EQ(r.attention.size(), model->layers().size());
      for (std::size_t l = 0; l < r.attention.size(); ++l)
        EXPECT_EQ(r.attention[l].shape(), (Shape{1, model->layers()[l].n_heads * model->layers()[l].head_dim}));
    }
  }
}

// Two left-padded rows through BatchKVCache / BatchRotatingKVCache give each row's own
// logits: the padding is the caches' concern and attention is per row.
TEST(TinyModel, BatchRowsEqualRowsAlone) {
  ReferenceBackend backend;
  for (const auto& id : kModels) {
    SCOPED_TRACE(id);
    const fs::path dir = scratch("batch_" + id);
    write_tiny_model(config_of(id), id, dir);
    const auto model = Model::load(dir);
    const std::int64_t V = model->vocab_size();
    // Row 1's prompt is 4 tokens shorter: 4 columns of left padding, and 12 > window 8
    // tokens in row 0's prefill, so the rotating caches wrap during the batch prefill.
    const std::vector<std::vector<std::int32_t>> prompts = {prompt_tokens(1, 0, 13, V),
                                                            prompt_tokens(1, 1, 9, V)};
    const int steps = 6;
    std::vector<test::Trace> alone;
    for (const auto& p : prompts) alone.push_back(test::run_greedy(*model, backend, p, steps));

    const std::vector<std::int32_t> pad = {0, 4};
    auto caches = make_caches(*model, backend, pad);
    const auto ptrs = cache_pointers(caches);
    std::vector<std::int32_t> head(prompts[0].begin(), prompts[0].end() - 1);
    std::vector<std::int32_t> row1(4, 0);  // padding tokens: any id, they are masked
    row1.insert(row1.end(), prompts[1].begin(), prompts[1].end() - 1);
    head.insert(head.end(), row1.begin(), row1.end());
    // No row of zero tokens: a mutation survivor let L = 0 through with B·L = 0 tokens.
    expect_error([&] { (void)model->forward({}, 2, 0, ptrs); }, {"forward got 0 tokens for B 2, L 0"});
    std::vector<ForwardRecord> records = {model->forward(head, 2, 12, ptrs)};
    std::vector<std::int32_t> next = {prompts[0].back(), prompts[1].back()};
    for (int s = 0; s < steps; ++s) {
      records.push_back(model->forward(next, 2, 1, ptrs));
      for (std::int64_t b = 0; b < 2; ++b) next[static_cast<std::size_t>(b)] = argmax(logits_row(records.back().logits, b));
    }
    double worst = 0;
    for (std::size_t c = 0; c < records.size(); ++c)
      for (std::int64_t b = 0; b < 2; ++b) {
        const auto batch = logits_row(records[c].logits, b);
        const auto single = logits_row(alone[static_cast<std::size_t>(b)].records[c].logits, 0);
        for (std::size_t i = 0; i < batch.size(); ++i)
          worst = std::max(worst, std::abs(static_cast<double>(batch[i]) - static_cast<double>(single[i])));
      }
    std::cout << id << ": batch vs alone max |dlogit| " << worst << "\n";
    EXPECT_LE(worst, 1e-5);
  }
}

}  // namespace
}  // namespace kvlab::golden

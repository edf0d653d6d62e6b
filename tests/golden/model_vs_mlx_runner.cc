// The kvlab half of golden.model_vs_mlx_lm: writes each tiny model (config + weights)
// into WORK/<id>, loads it back, runs the fixed request on the reference backend with
// mlx-lm's call pattern (prompt[:-1], prompt[-1], then 8 greedy tokens) and writes
// WORK/<id>/kvlab.json: prompt, generated tokens, and per call the last position's
// logits and per-layer o_proj inputs. model_vs_mlx.py replays the same calls in mlx-lm.
//
// usage: golden_model_vs_mlx_runner <golden/models dir> <work dir> [id...]
#include <fstream>
#include <iostream>

#include "tests/golden/model_test_util.h"
#include "reference/reference_backend.h"

namespace {

using namespace kvlab;
using namespace kvlab::golden;

nlohmann::json floats(const Tensor& t) {
  const auto* p = reinterpret_cast<const float*>(t.data());
  return std::vector<float>(p, p + t.numel());
}

void run(const std::filesystem::path& models, const std::filesystem::path& work, const std::string& id) {
  std::ifstream in(models / id / "config.json");
  if (!in) throw Error(ErrorKind::io, "cannot open " + (models / id / "config.json").string());
  const nlohmann::json config = nlohmann::json::parse(in);
  const std::filesystem::path dir = work / id;
  const std::string sha = write_tiny_model(config, id, dir);
  const auto model = Model::load(dir);
  ReferenceBackend backend;
  const auto prompt = prompt_tokens(1, 0, 13, model->vocab_size());
  const test::Trace t = test::run_greedy(*model, backend, prompt, 9);

  nlohmann::json out = {{"model", id}, {"model_sha256", sha}, {"prompt", prompt}, {"tokens", t.tokens}};
  for (const ForwardRecord& r : t.records) {
    out["logits"].push_back(floats(r.logits));
    nlohmann::json layers = nlohmann::json::array();
    for (const Tensor& a : r.attention) layers.push_back(floats(a));
    out["attention"].push_back(layers);
  }
  std::ofstream(dir / "kvlab.json") << out.dump() << "\n";
  std::cout << id << ": " << t.records.size() << " calls, tokens " << nlohmann::json(t.tokens).dump() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: " << argv[0] << " <golden/models dir> <work dir> [id...]\n";
    return 2;
  }
  std::vector<std::string> ids(argv + 3, argv + argc);
  if (ids.empty()) ids = {"llama_dense", "llama_hybrid", "gemma4_small"};
  try {
    for (const auto& id : ids) run(argv[1], argv[2], id);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

#include "golden/runner/runner.h"

#include <algorithm>
#include <limits>
#include <span>

#include "cache/batch_cache.h"
#include "cache/device_batch_kv_cache.h"
#include "cache/kv_cache.h"
#include "cache/prefix_cache.h"
#include "cache/quantized_kv_cache.h"
#include "cache/registry.h"
#include "cache/rotating_kv_cache.h"
#include "harness/report.h"
#include "kvlab/error.h"

#ifndef KVLAB_VERSION
#define KVLAB_VERSION "unknown"
#endif

namespace kvlab::golden {
namespace {

using Caches = std::vector<std::unique_ptr<Cache>>;  // one per layer; null for KV-shared layers

// mlx-lm's documented max_kv_size: "old entries (except the first 4 tokens) will be
// overwritten" (generate_step, make_prompt_cache).
constexpr std::int64_t kWindowKeep = 4;

std::unique_ptr<Cache> wrap(const RunContext& ctx, std::unique_ptr<Cache> cache, int layer) {
  return ctx.wrap_cache ? ctx.wrap_cache(std::move(cache), layer) : std::move(cache);
}

// mlx-lm's make_cache (golden/model/model.h make_caches), then kvlab's window policy and the
// context's wrapper.
Caches single_caches(const Model& model, const Scenario& s, const RunContext& ctx) {
  Caches out = make_caches(model, *ctx.backend);
  for (std::size_t l = 0; l < out.size(); ++l) {
    if (!out[l]) continue;
    if (s.max_kv_size && model.layers()[l].kind == LayerKind::full)
      out[l] = std::make_unique<RotatingKVCache>(*ctx.backend, *s.max_kv_size, kWindowKeep);
    out[l] = wrap(ctx, std::move(out[l]), static_cast<int>(l));
  }
  return out;
}

// make_caches' batch classes; with batch_cache=device the full layers' BatchKVCache
// becomes DeviceBatchKVCache (same layout, offsets in backend memory), so every step
// ropes at a device-side snapshot and appends through kv_append_advance.
Caches batch_caches(const Model& model, const std::vector<std::int32_t>& left_padding, const Scenario& s,
                    const RunContext& ctx) {
  Caches out = make_caches(model, *ctx.backend, left_padding);
  for (std::size_t l = 0; l < out.size(); ++l) {
    if (!out[l]) continue;
    if (s.batch_cache == BatchCache::device && model.layers()[l].kind == LayerKind::full)
      out[l] = std::make_unique<DeviceBatchKVCache>(*ctx.backend, left_padding);
    out[l] = wrap(ctx, std::move(out[l]), static_cast<int>(l));
  }
  return out;
}

ForwardRecord call(const Model& model, const Caches& caches, std::span<const std::int32_t> tokens, std::int64_t B) {
  return model.forward(tokens, B, static_cast<std::int64_t>(tokens.size()) / B, cache_pointers(caches));
}

void maybe_quantize(Caches& caches, const Scenario& s) {
  if (!s.kv_bits) return;
  maybe_quantize_kv_caches(caches, QuantSpec{QuantMode::affine, *s.kv_bits, s.kv_group_size}, Rounding::mlx_cpu,
                           s.quantized_kv_start);
}

std::string describe(const Caches& caches) {
  std::string out;
  for (std::size_t l = 0; l < caches.size(); ++l)
    out += cat(l ? "," : "", caches[l] ? std::string(caches[l]->class_name()) : std::string("shared"));
  return out;
}

// Accumulates one sequence's steps.
class Recorder {
 public:
  explicit Recorder(std::vector<std::int32_t> prompt) { rec_.prompt = std::move(prompt); }

  // Appends row `row` of a call's record as the next step; returns the greedy token (the
  // first index of the largest logit, as mx.argmax picks it).
  std::int32_t add(const ForwardRecord& r, std::int64_t row) {
    const std::int64_t vocab = r.logits.dim(1);
    const float* l = r.logits.storage<float>().data() + row * vocab;
    logits_.insert(logits_.end(), l, l + vocab);
    vocab_ = vocab;
    if (attn_.empty()) attn_.resize(r.attention.size());
    widths_.resize(r.attention.size());
    for (std::size_t layer = 0; layer < r.attention.size(); ++layer) {
      const std::int64_t w = r.attention[layer].dim(1);
      const float* a = r.attention[layer].storage<float>().data() + row * w;
      attn_[layer].insert(attn_[layer].end(), a, a + w);
      widths_[layer] = w;
    }
    const auto best = std::max_element(l, l + vocab, [](float x, float y) { return x < y; });
    const auto token = static_cast<std::int32_t>(best - l);
    rec_.tokens.push_back(token);
    return token;
  }
  std::int64_t steps() const { return rec_.steps(); }
  std::int32_t last() const { return rec_.tokens.back(); }
  const std::vector<std::int32_t>& tokens() const { return rec_.tokens; }
  SequenceRecord& record() { return rec_; }

  SequenceRecord finish(std::int64_t fallback_vocab) {
    const std::int64_t S = rec_.steps();
    const std::int64_t vocab = S > 0 ? vocab_ : fallback_vocab;
    rec_.logits = Tensor::from_values(DType::f32, Shape{S, vocab}, logits_);
    for (std::size_t l = 0; l < attn_.size(); ++l)
      rec_.attention.push_back(Tensor::from_values(DType::f32, Shape{S, widths_[l]}, attn_[l]));
    return std::move(rec_);
  }

 private:
  SequenceRecord rec_;
  std::vector<float> logits_;
  std::vector<std::vector<float>> attn_;
  std::vector<std::int64_t> widths_;
  std::int64_t vocab_ = 0;
};

void save_and_reload(Caches& caches, const RunContext& ctx, const std::string& tag) {
  std::vector<const Cache*> owned;
  for (const auto& c : caches)
    if (c) owned.push_back(c.get());
  std::filesystem::create_directories(ctx.scratch);
  const auto path = ctx.scratch / cat(tag, ".kvcache.safetensors");
  save_caches(path, owned);
  LoadedCaches loaded = load_caches(path, *ctx.backend);
  std::size_t next = 0;
  for (std::size_t l = 0; l < caches.size(); ++l)
    if (caches[l]) caches[l] = wrap(ctx, std::move(loaded.layers.at(next++)), static_cast<int>(l));
  std::filesystem::remove(path);
}

// The next input of sequence `seq` after `step`: its own greedy token, or the teacher's.
std::int32_t next_input(const RunContext& ctx, std::size_t seq, std::int64_t step, std::int32_t greedy) {
  if (ctx.teacher == nullptr) return greedy;
  KVLAB_REQUIRE(seq < ctx.teacher->sequences.size(), invalid_argument, "teacher forcing: the teacher has no sequence ",
                seq);
  const auto& tokens = ctx.teacher->sequences[seq].tokens;
  KVLAB_REQUIRE(step < static_cast<std::int64_t>(tokens.size()), invalid_argument, "teacher forcing: the teacher's sequence ",
                seq, " has ", tokens.size(), " tokens, step ", step, " needs more");
  return tokens[static_cast<std::size_t>(step)];
}

// generate_step's call pattern for one request: `todo` (the part of the prompt the caches
// do not hold yet) as one call over all but its last token and one over the last, then
// a call per generated token; the kv-quantization policy after every call.
void generate_single(const Model& model, Caches& caches, std::span<const std::int32_t> todo, Recorder& out,
                     std::size_t seq, const Scenario& s, const RunContext& ctx) {
  KVLAB_REQUIRE(!todo.empty(), invalid_argument, "a request needs at least one token to process");
  if (todo.size() > 1) {
    call(model, caches, todo.first(todo.size() - 1), 1);
    maybe_quantize(caches, s);
  }
  ForwardRecord r = call(model, caches, todo.last(1), 1);
  maybe_quantize(caches, s);
  for (int step = 0; step < s.steps; ++step) {
    const std::int32_t token = next_input(ctx, seq, step, out.add(r, 0));
    if (step + 1 == s.steps) break;
    if (s.save_at && *s.save_at == step) save_and_reload(caches, ctx, cat(ctx.model_id, ".", s.name));
    r = call(model, caches, std::span<const std::int32_t>(&token, 1), 1);
    maybe_quantize(caches, s);
  }
}

// Runs `body`; a kvlab::Error ends the sequence with its message as the status.
template <class Body>
void guarded(Recorder& rec, Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    rec.record().status = cat("error: kvlab::Error: ", e.what());
  }
}

std::vector<SequenceRecord> run_single(const Model& model, const Scenario& s, const RunContext& ctx,
                                       std::string& classes) {
  const auto prompt = prompt_tokens(s.seed, 0, s.prompts[0], model.vocab_size());
  Caches caches = single_caches(model, s, ctx);
  Recorder first(prompt);
  guarded(first, [&] { generate_single(model, caches, prompt, first, 0, s, ctx); });
  std::vector<SequenceRecord> out;
  classes = describe(caches);
  if (!s.prefix) {
    out.push_back(first.finish(model.vocab_size()));
    return out;
  }
  // Prefix reuse as mlx-lm's server does it: the first request's caches hold its prompt
  // and every generated token but the last (never fed back); the second request takes
  // the longest reusable entry from a PrefixCache (trimmed copies only when every layer
  // is trimmable) and processes the rest.
  std::vector<std::int32_t> second = prompt;
  second.resize(static_cast<std::size_t>(s.prefix->shared));
  const auto fresh = prompt_tokens(s.seed, 1, s.prefix->fresh, model.vocab_size());
  second.insert(second.end(), fresh.begin(), fresh.end());
  Recorder next(second);
  guarded(next, [&] {
    LayerCaches owned;  // the owning layers only: KV-shared layers hold nothing to store
    for (auto& c : caches)
      if (c) owned.push_back(std::move(c));
    std::vector<std::int32_t> stored = prompt;
    stored.insert(stored.end(), first.tokens().begin(), first.tokens().end() - (first.steps() > 0 ? 1 : 0));
    PrefixCache prompt_cache;
    const CacheFormat format = CacheFormat::of(owned);
    prompt_cache.insert(ctx.model_id, format, stored, owned);
    PrefixFetch hit = prompt_cache.fetch(ctx.model_id, format, second);
    Caches reused = single_caches(model, s, ctx);
    if (hit.kind != MatchKind::miss) {
      std::size_t k = 0;
      for (std::size_t l = 0; l < reused.size(); ++l)
        if (reused[l]) reused[l] = wrap(ctx, std::move(hit.caches.at(k++)), static_cast<int>(l));
    }
    next.record().reused = static_cast<std::int64_t>(hit.reused);
    generate_single(model, reused, hit.remaining, next, 1, s, ctx);
    classes = describe(reused);
  });
  out.push_back(first.finish(model.vocab_size()));
  out.push_back(next.finish(model.vocab_size()));
  return out;
}

// The batch verbs through Cache::batch(): a wrapped cache (a zoo mutant) answers with
// its own, so the runner never needs the class.
void filter_caches(Caches& caches, const std::vector<std::int32_t>& keep) {
  for (auto& c : caches)
    if (c) batch_verbs(*c, "filter").filter(keep);
}

void extend_caches(Caches& caches, const Caches& other) {
  for (std::size_t l = 0; l < caches.size(); ++l)
    if (caches[l]) batch_verbs(*caches[l], "extend").extend(*other[l]);
}

// Left-padded prompts in one prefill call; each row's step 0 is the call's last column.
ForwardRecord prefill(const Model& model, Caches& caches, const std::vector<std::vector<std::int32_t>>& prompts,
                      const Scenario& s, const RunContext& ctx) {
  std::size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  std::vector<std::int32_t> padding, tokens;
  for (const auto& p : prompts) {
    padding.push_back(static_cast<std::int32_t>(longest - p.size()));
    tokens.insert(tokens.end(), longest - p.size(), 0);
    tokens.insert(tokens.end(), p.begin(), p.end());
  }
  caches = batch_caches(model, padding, s, ctx);
  return call(model, caches, tokens, static_cast<std::int64_t>(prompts.size()));
}

std::vector<SequenceRecord> run_batch(const Model& model, const Scenario& s, const RunContext& ctx,
                                      std::string& classes) {
  const std::int64_t vocab = model.vocab_size();
  std::vector<Recorder> requests;
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < s.prompts.size(); ++i) {
    prompts.push_back(prompt_tokens(s.seed, static_cast<int>(i), s.prompts[i], vocab));
    requests.emplace_back(prompts.back());
  }
  if (s.join) requests.emplace_back(prompt_tokens(s.seed, static_cast<int>(s.prompts.size()), s.join->prompt, vocab));
  const auto quota = [&](std::size_t r) {
    return s.finish && static_cast<int>(r) == s.finish->request ? s.finish->after : s.steps;
  };
  std::vector<int> rows(s.prompts.size());  // request of each batch row
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int>(i);
  Caches caches;
  std::string failure;
  try {
    ForwardRecord r = prefill(model, caches, prompts, s, ctx);
    for (int step = 0;; ++step) {
      std::vector<std::int32_t> keep, next;
      std::vector<int> kept_rows;
      for (std::size_t b = 0; b < rows.size(); ++b) {
        Recorder& req = requests[static_cast<std::size_t>(rows[b])];
        const auto request = static_cast<std::size_t>(rows[b]);
        const std::int32_t greedy = req.add(r, static_cast<std::int64_t>(b));
        const std::int32_t token = next_input(ctx, request, req.steps() - 1, greedy);
        if (req.steps() < quota(static_cast<std::size_t>(rows[b]))) {
          keep.push_back(static_cast<std::int32_t>(b));
          kept_rows.push_back(rows[b]);
          next.push_back(token);
        }
      }
      // When every row is done nothing runs again: no filter to an empty batch (which a
      // DeviceBatchKVCache, having no filter, could not take).
      if (!keep.empty() && keep.size() != rows.size()) filter_caches(caches, keep);
      rows = kept_rows;
      if (s.join && step == s.join->after_step) {
        const std::size_t joiner = s.prompts.size();
        Caches own;
        const ForwardRecord first = prefill(model, own, {requests[joiner].record().prompt}, s, ctx);
        const std::int32_t token = next_input(ctx, joiner, 0, requests[joiner].add(first, 0));
        if (requests[joiner].steps() < quota(joiner)) {
          if (rows.empty()) caches = std::move(own);
          else extend_caches(caches, own);
          rows.push_back(static_cast<int>(joiner));
          next.push_back(token);
        }
      }
      classes = describe(caches);
      if (rows.empty()) break;
      r = call(model, caches, next, static_cast<std::int64_t>(rows.size()));
    }
  } catch (const Error& e) {
    failure = cat("error: kvlab::Error: ", e.what());
  }
  std::vector<SequenceRecord> out;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const bool unfinished = requests[i].steps() < quota(i);
    if (!failure.empty() && unfinished) requests[i].record().status = failure;
    out.push_back(requests[i].finish(vocab));
  }
  return out;
}


}  // namespace

// A teacher must fit the scenario before anything runs: one sequence per request with the
// same prompt and a token for every input it will be asked for.
void check_teacher(const Golden& teacher, const Model& model, const Scenario& s) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::size_t i = 0; i < s.prompts.size(); ++i)
    prompts.push_back(prompt_tokens(s.seed, static_cast<int>(i), s.prompts[i], model.vocab_size()));
  if (s.join) prompts.push_back(prompt_tokens(s.seed, static_cast<int>(s.prompts.size()), s.join->prompt, model.vocab_size()));
  if (s.prefix) {
    std::vector<std::int32_t> second(prompts[0].begin(), prompts[0].begin() + s.prefix->shared);
    const auto fresh = prompt_tokens(s.seed, 1, s.prefix->fresh, model.vocab_size());
    second.insert(second.end(), fresh.begin(), fresh.end());
    prompts.push_back(second);
  }
  KVLAB_REQUIRE(teacher.sequences.size() == prompts.size(), invalid_argument, "teacher forcing: scenario '", s.name,
                "' runs ", prompts.size(), " sequence(s), the teacher has ", teacher.sequences.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const SequenceRecord& t = teacher.sequences[i];
    KVLAB_REQUIRE(t.prompt == prompts[i], invalid_argument, "teacher forcing: the teacher's sequence ", i,
                  " has another prompt than scenario '", s.name, "' gives it");
    const int quota = s.finish && static_cast<int>(i) == s.finish->request ? s.finish->after : s.steps;
    KVLAB_REQUIRE(t.steps() >= quota - 1, invalid_argument, "teacher forcing: the teacher's sequence ", i, " has ",
                  t.steps(), " tokens, the scenario feeds ", quota - 1);
  }
}

Golden run_scenario(const Model& model, const Scenario& s, const RunContext& ctx) {
  KVLAB_REQUIRE(ctx.backend != nullptr, invalid_argument, "run_scenario needs a backend");
  if (ctx.teacher != nullptr) check_teacher(*ctx.teacher, model, s);
  Golden g;
  std::string classes;
  g.sequences = s.is_batch() ? run_batch(model, s, ctx, classes) : run_single(model, s, ctx, classes);
  g.meta = {{"model", ctx.model_id},
            {"model_sha256", ctx.model_sha256},
            {"scenario", s.name},
            {"scenario_line", s.line},
            {"engine", "kvlab"},
            {"engine_version", KVLAB_VERSION},
            {"backend", ctx.backend_name},
            {"kvlab_commit", harness::commit_id()},
            {"layers", std::to_string(model.layers().size())},
            {"cache_classes", classes}};
  if (ctx.teacher != nullptr) g.meta["teacher_forced"] = "1";
  return g;
}

}  // namespace kvlab::golden

#include "golden/runner/cell_run.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "harness/rng.h"
#include "kvlab/error.h"

namespace kvlab::cells {

using cell_script::Command;
using cell_script::Verb;

namespace {

int greedy(const std::vector<float>& logits) {
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::int32_t next_pos(const CellEngine& e, int seq) { return e.pos_max(seq) + 1; }

}  // namespace

OracleEngine::OracleEngine(const golden::Model& model, Positions positions)
    : model_(model),
      cache_(static_cast<int>(model.layers().size()), model.layers().at(0).n_kv_heads, model.layers().at(0).head_dim,
             positions) {}

std::vector<golden::CellOutput> OracleEngine::decode(const std::vector<golden::CellToken>& batch) {
  return model_.forward_cells(batch, cache_);
}

Run run_script(CellEngine& e, const std::vector<Command>& script, std::uint64_t seed,
               const std::vector<std::int32_t>* teacher) {
  Run r;
  std::map<int, std::int32_t> pending;  // the token a d of the sequence feeds next
  int prompts = 0;
  std::size_t taught = 0;
  // first: the call's first position of the sequence (its queries from there to pos all
  // shape the output, so any of them seeing a key that left the window flags it).
  auto record = [&](int ci, int seq, std::int32_t first, std::int32_t pos, golden::CellOutput out) {
    pending[seq] = greedy(out.logits);
    bool left = false;
    for (std::int32_t q = first; q <= pos; ++q) left = left || e.sees_a_key_that_left(seq, q);
    r.outputs.push_back(
        {ci, seq, pos, std::move(out), e.holds_a_split_cell(seq), e.holds_a_divided_cell(seq), left, e.pos_min(seq)});
  };
  for (std::size_t i = 0; i < script.size(); ++i) {
    const Command& c = script[i];
    const int ci = static_cast<int>(i);
    try {
      switch (c.verb) {
        case Verb::prompt: {
          const int s = c.seqs[0];
          const auto tokens = golden::prompt_tokens(seed, prompts++, c.n, e.vocab());
          const std::int32_t p = next_pos(e, s);
          std::vector<golden::CellToken> batch;
          for (std::int32_t j = 0; j < c.n; ++j)
            batch.push_back({tokens[static_cast<std::size_t>(j)], p + j, s, j + 1 == c.n});
          auto outs = e.decode(batch);
          record(ci, s, p, p + c.n - 1, std::move(outs.at(0)));
          break;
        }
        case Verb::decode: {
          std::vector<golden::CellToken> batch;
          for (const int s : c.seqs) {
            KVLAB_REQUIRE(pending.count(s) != 0, invalid_argument, "cell script command ", ci, ": d of sequence ", s,
                          " before any output of it (give it a p first)");
            std::int32_t token = pending[s];
            if (teacher != nullptr) {
              KVLAB_REQUIRE(taught < teacher->size(), invalid_argument, "cell script: the teacher fed ",
                            teacher->size(), " tokens, command ", ci, " needs more");
              token = (*teacher)[taught++];
            }
            r.fed.push_back(token);
            batch.push_back({token, next_pos(e, s), s, true});
          }
          auto outs = e.decode(batch);
          for (std::size_t k = 0; k < batch.size(); ++k)
            record(ci, batch[k].seq, batch[k].pos, batch[k].pos, std::move(outs.at(k)));
          break;
        }
        case Verb::rm: e.seq_rm(c.seqs[0], c.p0, c.p1); break;
        case Verb::cp: e.seq_cp(c.seqs[0], c.seqs[1], c.p0, c.p1); break;
        case Verb::keep: e.seq_keep(c.seqs[0]); break;
        case Verb::add: e.seq_add(c.seqs[0], c.p0, c.p1, c.n); break;
        case Verb::div: e.seq_div(c.seqs[0], c.p0, c.p1, c.n); break;
      }
      e.after_command();
    } catch (const Error& err) {
      r.error = err.what();
      r.error_command = ci;
      break;
    }
  }
  return r;
}

std::string random_script(std::uint64_t seed, int sequences, int length) {
  KVLAB_REQUIRE(sequences >= 1 && sequences <= cell_script::kMaxSequences && length >= 1, invalid_argument,
                "random cell script of ", sequences, " sequences and ", length, " commands");
  std::uint64_t state = harness::splitmix64(seed ^ 0x63656c6cULL);
  auto draw = [&](std::int64_t lo, std::int64_t hi) {  // uniform in [lo, hi]
    state = harness::splitmix64(state);
    return lo + static_cast<std::int64_t>(state % static_cast<std::uint64_t>(hi - lo + 1));
  };
  CellKVCache sim(1, 1, 1);  // positions only
  std::vector<Command> out;
  std::vector<bool> has_output(static_cast<std::size_t>(sequences), false);
  auto apply = [&](const Command& c) {
    out.push_back(c);
    const int s = c.seqs.empty() ? 0 : c.seqs[0];
    switch (c.verb) {
      case Verb::prompt:
        for (std::int32_t j = 0; j < c.n; ++j) sim.add_cell(s, sim.pos_max(s) + 1);
        has_output[static_cast<std::size_t>(s)] = true;
        break;
      case Verb::decode:
        for (const int q : c.seqs) sim.add_cell(q, sim.pos_max(q) + 1);
        break;
      case Verb::rm: sim.seq_rm(s, c.p0, c.p1); break;
      case Verb::cp: sim.seq_cp(s, c.seqs[1], c.p0, c.p1); break;
      case Verb::keep: sim.seq_keep(s); break;
      case Verb::add: sim.seq_add(s, c.p0, c.p1, c.n); break;
      case Verb::div: sim.seq_div(s, c.p0, c.p1, c.n); break;
    }
  };
  auto prompt = [&](int s, std::int32_t n) { apply({Verb::prompt, {s}, -1, -1, n}); };
  auto decode_after = [&](int s) {  // the verb's effect reaches an output of s
    if (has_output[static_cast<std::size_t>(s)]) apply({Verb::decode, {s}, -1, -1, 0});
    else prompt(s, static_cast<std::int32_t>(draw(1, 3)));
  };
  auto range_of = [&](int s, Command& c) {
    const std::int32_t top = std::max(sim.pos_max(s), 0);
    c.p0 = static_cast<std::int32_t>(draw(0, top));
    c.p1 = draw(0, 2) == 0 ? -1 : static_cast<std::int32_t>(draw(c.p0 + 1, top + 1));
    if (c.p0 == 0 && draw(0, 1) == 0) c.p0 = -1;
  };
  prompt(0, static_cast<std::int32_t>(draw(3, 10)));
  for (int i = 1; i < length; ++i) {
    const std::int64_t pick = draw(0, 99);
    const int s = static_cast<int>(draw(0, sequences - 1));
    if (pick < 30) {  // a decode round of every sequence with an output, or a subset
      Command c{Verb::decode, {}, -1, -1, 0};
      for (int q = 0; q < sequences; ++q)
        if (has_output[static_cast<std::size_t>(q)] && (q == s || draw(0, 2) != 0)) c.seqs.push_back(q);
      if (c.seqs.empty()) prompt(s, static_cast<std::int32_t>(draw(1, 6)));
      else apply(c);
    } else if (pick < 45 || sim.entries(s) == 0) {
      prompt(s, static_cast<std::int32_t>(draw(1, 6)));
    } else if (pick < 55) {
      Command c{Verb::rm, {s}, -1, -1, 0};
      range_of(s, c);
      apply(c);
      decode_after(s);
    } else if (pick < 70 && sequences > 1) {
      int t = static_cast<int>(draw(0, sequences - 2));
      if (t >= s) ++t;
      Command c{Verb::cp, {s, t}, -1, -1, 0};
      range_of(s, c);
      apply({Verb::rm, {t}, -1, -1, 0});  // llama.cpp's server empties the target first
      apply(c);
      decode_after(t);
      decode_after(s);
    } else if (pick < 88) {
      Command c{Verb::add, {s}, -1, -1, 0};
      range_of(s, c);
      c.n = static_cast<std::int32_t>(draw(-6, 5));
      if (c.n >= 0) ++c.n;
      apply(c);
      decode_after(s);
    } else if (pick < 95) {
      Command c{Verb::div, {s}, -1, -1, static_cast<std::int32_t>(draw(2, 3))};
      range_of(s, c);
      apply(c);
      decode_after(s);
    } else {
      apply({Verb::keep, {s}, -1, -1, 0});
      decode_after(s);
    }
  }
  return cell_script::to_string(out);
}

Verdict compare(const Run& a, const Run& b, const golden::Tolerance& tol) {
  Verdict v;
  // The oracle's flags: what the finding's sequence reads that the register's entries name.
  auto flags = [](bool split, bool divided, bool left) {
    return cat(split ? "; oracle: a cell of this sequence has holders moved apart (shared-cell positions)" : "",
               divided ? "; oracle: a key of this sequence was moved by seq_div" : "",
               left ? "; oracle: a sliding-window key this call's queries see had gone out of the sequence's window" : "");
  };
  const std::size_t n = std::min(a.outputs.size(), b.outputs.size());
  for (std::size_t i = 0; i < n; ++i) {
    const Output& x = a.outputs[i];
    const Output& y = b.outputs[i];
    ++v.compared;
    double dl = 0;
    if (x.out.logits.size() != y.out.logits.size()) dl = INFINITY;
    for (std::size_t j = 0; j < x.out.logits.size() && j < y.out.logits.size(); ++j)
      dl = std::max(dl, std::fabs(static_cast<double>(x.out.logits[j]) - y.out.logits[j]));
    if (!(dl <= 1e30)) dl = INFINITY;  // NaN counts as the largest difference
    v.max_dlogit = std::max(v.max_dlogit, dl);
    auto sorted = x.out.logits;
    std::partial_sort(sorted.begin(), sorted.begin() + std::min<std::ptrdiff_t>(2, std::ssize(sorted)), sorted.end(),
                      std::greater<>());
    const bool clear_top = sorted.size() < 2 || sorted[0] - sorted[1] > 2 * tol.max_dlogit;
    const bool top_differs = clear_top && greedy(x.out.logits) != greedy(y.out.logits);
    if (v.agree && (dl > tol.max_dlogit || top_differs || x.pos != y.pos || x.seq != y.seq)) {
      v.agree = false;
      int layer = -1;
      for (std::size_t l = 0; l < x.out.attention.size() && l < y.out.attention.size() && layer < 0; ++l) {
        double num = 0, den = 0;
        for (std::size_t k = 0; k < x.out.attention[l].size() && k < y.out.attention[l].size(); ++k) {
          const double d = static_cast<double>(x.out.attention[l][k]) - y.out.attention[l][k];
          num += d * d;
          den += static_cast<double>(x.out.attention[l][k]) * x.out.attention[l][k];
        }
        if (!(std::sqrt(num) <= tol.attn_rel * std::sqrt(den))) layer = static_cast<int>(l);
      }
      v.finding = cat("output ", i, " (command ", x.command, ", sequence ", x.seq, ", position ", x.pos,
                      y.pos != x.pos ? cat(" vs ", y.pos) : std::string(), "): max |dlogit| ", dl, " > ",
                      tol.max_dlogit, top_differs ? cat("; top token ", greedy(x.out.logits), " vs ", greedy(y.out.logits)) : "",
                      layer >= 0 ? cat("; first layer over attn_rel: ", layer) : "", flags(x.split, x.divided, x.left),
                      y.pos_min > x.pos_min ? cat("; the engine reports positions [", x.pos_min, ", ", y.pos_min,
                                                  ") of the sequence gone (its seq_pos_min)")
                      : y.pos < x.pos ? cat("; the engine reports positions [", y.pos, ", ", x.pos,
                                            ") of the sequence gone (its seq_pos_max)")
                      : y.pos > x.pos ? cat("; the engine holds positions up to ", y.pos - 1, ", the oracle up to ",
                                            x.pos - 1)
                                      : std::string());
    }
  }
  if (!a.error.empty()) {  // the script itself is invalid: nothing after it compares
    v.agree = false;
    v.finding = cat("INVALID script: the oracle refused command ", a.error_command, ": ", a.error);
  } else if (v.agree && !b.error.empty()) {
    v.agree = false;
    bool split = false, divided = false, left = false;
    for (const Output& o : a.outputs)
      if (o.command == b.error_command) {
        split = split || o.split;
        divided = divided || o.divided;
        left = left || o.left;
      }
    v.finding = cat("error at command ", b.error_command, ": ", b.error, flags(split, divided, left));
  } else if (v.agree && a.outputs.size() != b.outputs.size()) {
    v.agree = false;
    v.finding = cat(a.outputs.size(), " outputs against ", b.outputs.size());
  }
  return v;
}

}  // namespace kvlab::cells

// One command language for caches: a single-sequence property case written as a `cache`
// problem line (harness/ops/cache_info.cc, grammar in cache/cache_script.h), so a
// shrunk counterexample replays with `kvlab repro '<line>' --backend <b>` on any backend,
// not only inside the property binary. The line replays the same kind, shape and command
// sequence; its inputs are the harness's seeded random fill, not the property's hash
// content (the harness compares every backend with the reference, so no oracle of known
// data is needed). What the grammar cannot say is listed in notes, never silently lost.
//
// The properties also run over a backend chosen by name: KVLAB_PROP_BACKEND
// (reference | simd[:target] | vulkan[:device], harness/backends.h), default reference.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/backend.h"
#include "property_tests/prop_model.h"

namespace kvlab::prop {

// What a case's commands add to its line, in order.
struct ReproScript {
  std::vector<std::string> tokens;  // script words ("p8", "d", "u3", "t2", "s")
  std::vector<std::string> notes;   // commands or options the line cannot express
  void note(const std::string& n) {
    for (const std::string& have : notes)
      if (have == n) return;
    notes.push_back(n);
  }
};

struct ReproLine {
  std::string line;   // canonical `cache …` line (harness::parse_problem accepted it); empty: none
  std::string notes;  // "; "-joined, empty when the line says everything
  // `repro: kvlab repro '<line>' --backend <b>  # notes`, or why there is no line.
  std::string text(const std::string& backend) const;
};
ReproLine repro_line(const Config& cfg, const ReproScript& script);

// A case whose commands are drawn as it runs (the batch properties, and L3 as a single
// kind's prefix script) as a `cache kind=… B=… script=…` line: the
// rows it started with, its head layout and quantization, and the largest left and right
// padding it used (the line's lpad/rpad rule spreads them over the rows; the property's
// own per-row paddings are random, a difference named in the notes).
struct BatchCase {
  Kind kind = Kind::batch_kv;
  std::int64_t batch = 1, heads = 1, dim = 32;
  std::optional<QuantSpec> spec;  // batch_quantized
  Rounding rounding = Rounding::mlx_cpu;
  std::int64_t max_size = 16;     // batch_rotating
  std::int64_t lpad = 0, rpad = 0;
};
ReproLine batch_repro_line(const BatchCase& c, const ReproScript& script);

// Logs `text()` of the line (RC_LOG) when the scope it guards ends by an exception, i.e.
// when the case fails: a batch case draws its commands as it runs, so its line is only
// known at the step that fails.
class ReproOnFailure {
 public:
  ReproOnFailure(const BatchCase& c, const ReproScript& s);
  ~ReproOnFailure();
  ReproOnFailure(const ReproOnFailure&) = delete;
  ReproOnFailure& operator=(const ReproOnFailure&) = delete;

 private:
  const BatchCase& case_;
  const ReproScript& script_;
  int exceptions_;
};

// The backend of the property runs: KVLAB_PROP_BACKEND, default "reference".
const std::string& prop_backend_name();
std::unique_ptr<Backend> make_prop_backend();

// The repro text of the last failing stateful case (like last_failure_size(): the final
// counterexample is the last failing case run); empty when it had none.
std::string& last_failure_repro();

}  // namespace kvlab::prop

#include "property_tests/repro_line.h"

#include <rapidcheck.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <cstdlib>
#include <sstream>

#include "harness/backends.h"
#include "cache/cache_script.h"
#include "harness/problem.h"
#include "kvlab/error.h"

namespace kvlab::prop {

namespace cs = kvlab::cache_script;

std::string ReproLine::text(const std::string& backend) const {
  if (line.empty()) return "repro: none (" + notes + ")";
  std::string out = "repro: kvlab repro '" + line + "' --backend " + backend;
  if (!notes.empty()) out += "  # not in the line: " + notes;
  return out;
}

namespace {

// The problem line from its parameters (`head`, up to the script) and the case's
// commands: token by token, then canonical (consecutive decodes merge, d.d is d2).
ReproLine finish_line(const ReproScript& r, const std::string& head, std::uint64_t seed) {
  ReproLine out;
  for (std::size_t i = 0; i < r.notes.size(); ++i) out.notes += (i ? "; " : "") + r.notes[i];
  if (r.tokens.empty()) {
    out.notes = "no command of the case has a script verb" + (out.notes.empty() ? "" : "; " + out.notes);
    return out;
  }
  std::string text = head;
  try {
    cs::Script s;
    for (const std::string& t : r.tokens)
      for (cs::Command& cmd : cs::parse_script(t)) s.push_back(std::move(cmd));
    text += " script=" + cs::script_str(s) + " seed=" + std::to_string(seed);
    out.line = harness::parse_problem(text).line();
  } catch (const Error& e) {
    // A bug of this mapping, not of the cache: say so rather than print a line that fails.
    out.line.clear();
    out.notes = "the line '" + text + "' does not parse: " + e.what();
  }
  return out;
}

}  // namespace

namespace {

// Whether the case's commands convert its kind kv cache (`q`, or an `mN` it reaches): the
// line then needs the format, and rope=0 as for a packed kind. False for a token the
// grammar rejects (finish_line reports that).
bool converts(Kind kind, const ReproScript& r) {
  CacheSetup setup;
  setup.kind = kind;
  try {
    cs::Script s;
    for (const std::string& t : r.tokens)
      for (cs::Command& cmd : cs::parse_script(t)) s.push_back(std::move(cmd));
    return cs::script_quantizes(setup, s);
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

ReproLine repro_line(const Config& c, const ReproScript& script) {
  ReproScript r = script;
  // The case's options, as close as the cache op's parameters allow.
  const bool quantizes = converts(c.kind, r);
  const bool packed = cache_kind_info(c.kind).packed || quantizes;
  std::ostringstream os;
  os << "cache kind=" << cache_kind_info(c.kind).name << " B=" << c.batch << " Hq=" << c.q_heads()
     << " Hkv=" << c.kv_heads << " D=" << c.dk;
  if (c.dv != c.dk) r.note("Dv=" + std::to_string(c.dv) + " (D is both widths; Dk used)");
  int rope = c.rope_dims > 0 ? 1 : 0;
  if (rope && c.rope_dims != c.dk) r.note("rope dims " + std::to_string(c.rope_dims) + " of " + std::to_string(c.dk));
  if (rope && packed) {
    // Codes compare bit for bit in the harness, which needs unrotated (exact) inputs.
    r.note("RoPE (packed kinds run rope=0)");
    rope = 0;
  }
  os << " rope=" << rope << " window=" << c.window;
  if (c.kind == Kind::rotating) os << " max=" << c.max_size << " keep=" << c.keep;
  if (c.kind == Kind::chunked) os << " chunk=" << c.chunk_size;
  if (c.kind == Kind::quantized || quantizes) {
    os << " qmode=" << quant_mode_name(c.spec.mode) << " bits=" << c.spec.bits << " group=" << c.spec.group_size;
    if (c.rounding != Rounding::mlx_cpu) r.note("rounding=" + std::string(rounding_name(c.rounding)));
  }
  std::uint64_t seed = 1;
  if (c.kind == Kind::turboquant) {
    // The cache op seeds a TurboQuant cache with the problem's seed and has whole widths.
    seed = c.tq_seed;
    os << " bits=" << static_cast<int>(std::floor(c.tq_bits));
    if (c.tq_bits != std::floor(c.tq_bits)) {
      r.note("bits=" + std::to_string(c.tq_bits).substr(0, 3) + " (" + std::string(fractional_bits_name(c.tq_meaning)) + ")");
    }
    if (c.tq_key_bits) r.note("key bits " + std::to_string(*c.tq_key_bits).substr(0, 3));
    if (c.tq_value_bits) r.note("value bits " + std::to_string(*c.tq_value_bits).substr(0, 3));
  }
  return finish_line(r, os.str(), seed);
}

ReproLine batch_repro_line(const BatchCase& c, const ReproScript& script) {
  ReproScript r = script;
  std::ostringstream os;
  os << "cache kind=" << cache_kind_info(c.kind).name << " B=" << c.batch << " Hq=" << c.heads << " Hkv=" << c.heads
     << " D=" << c.dim << " rope=0 window=0";
  if (c.kind == Kind::batch_rotating || c.kind == Kind::rotating) os << " max=" << c.max_size;
  if (c.spec) {
    os << " qmode=" << quant_mode_name(c.spec->mode) << " bits=" << c.spec->bits << " group=" << c.spec->group_size;
    if (c.rounding != Rounding::mlx_cpu) r.note("rounding=" + std::string(rounding_name(c.rounding)));
  }
  os << " lpad=" << c.lpad << " rpad=" << c.rpad;
  if (c.lpad > 0 || c.rpad > 0) r.note("per-row paddings (the line spreads the largest by its rule)");
  return finish_line(r, os.str(), 1);
}

ReproOnFailure::ReproOnFailure(const BatchCase& c, const ReproScript& s)
    : case_(c), script_(s), exceptions_(std::uncaught_exceptions()) {}

ReproOnFailure::~ReproOnFailure() {
  if (std::uncaught_exceptions() > exceptions_) RC_LOG() << batch_repro_line(case_, script_).text(prop_backend_name()) << "\n";
}

const std::string& prop_backend_name() {
  static const std::string name = [] {
    const char* v = std::getenv("KVLAB_PROP_BACKEND");
    return std::string(v != nullptr && *v != '\0' ? v : "reference");
  }();
  return name;
}

std::unique_ptr<Backend> make_prop_backend() { return harness::make_backend(prop_backend_name()); }

std::string& last_failure_repro() {
  static std::string text;
  return text;
}

}  // namespace kvlab::prop

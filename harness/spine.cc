#include "harness/spine.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <unistd.h>
#include <exception>
#include <optional>

#include "kvlab/error.h"

namespace kvlab::harness {

namespace {

// 64 bytes keep the payload 64-byte aligned (host buffers are; place=odd shifts it on
// purpose) and catch the usual off-by-one-vector overruns of a SIMD tail or a shader's
// last workgroup.
constexpr std::size_t kGuard = 64;
constexpr std::byte kSentinel{0xA5};

struct Placed {
  BufferPtr buffer;
  DTensor tensor;
  std::vector<std::byte> image;  // what was uploaded: guards + payload
  std::size_t lead = kGuard;     // bytes before the payload: the front guard band
};

// place=odd moves every tensor one element further into its buffer: element offset
// 64/size + 1, odd for every element size up to 32 bytes, and a byte offset that is not
// a multiple of 8 (nor of 4 or 2 for narrower elements). The front guard band grows by
// that element, so it still covers at least kGuard bytes.
std::size_t lead_bytes(const Problem& p, DType dtype) {
  return p.word("place") == "odd" ? kGuard + dtype_size(dtype) : kGuard;
}

Placed place(Backend& b, DType dtype, const Shape& shape, const std::byte* content, std::size_t lead) {
  Placed p;
  p.lead = lead;
  const std::size_t payload = shape_nbytes(shape, dtype);
  p.image.assign(lead + payload + kGuard, kSentinel);
  // NaN poison: all-ones is a NaN in every float dtype and an out-of-range code elsewhere.
  // An empty tensor has no payload (and its data pointer may be null).
  if (payload > 0 && content != nullptr) {
    std::memcpy(p.image.data() + lead, content, payload);
  } else if (payload > 0) {
    std::memset(p.image.data() + lead, 0xFF, payload);
  }
  p.buffer = b.allocate(p.image.size());
  b.upload(DTensor{p.buffer, 0, DType::u8, {static_cast<std::int64_t>(p.image.size())}}, p.image.data());
  p.tensor = DTensor{p.buffer, lead, dtype, shape};
  return p;
}

std::vector<std::byte> read_back(Backend& b, const Placed& p) {
  std::vector<std::byte> out(p.image.size());
  b.download(DTensor{p.buffer, 0, DType::u8, {static_cast<std::int64_t>(out.size())}}, out.data());
  return out;
}

struct Run {
  std::vector<Placed> inputs, outputs;
  Bound in, out;
  std::string error;  // non-empty when the kernel threw
  std::optional<ErrorKind> kind;
};

Run execute(const OpInfo& op, const Problem& p, const Prepared& prep, Backend& b) {
  Run r;
  for (const Tensor& t : prep.inputs) {
    r.inputs.push_back(place(b, t.dtype(), t.shape(), t.data(), lead_bytes(p, t.dtype())));
  }
  for (const OutputSlot& s : prep.outputs) {
    r.outputs.push_back(
        place(b, s.dtype, s.shape, s.initial ? s.initial->data() : nullptr, lead_bytes(p, s.dtype)));
  }
  r.in.names = &prep.input_names;
  r.in.scalars = &prep.scalars;
  for (const Placed& pl : r.inputs) r.in.tensors.push_back(pl.tensor);
  for (const Placed& pl : r.outputs) r.out.tensors.push_back(pl.tensor);
  try {
    op.invoke(b, p, r.in, r.out);
    b.finish();
  } catch (const Error& e) {
    r.error = e.what();
    r.kind = e.kind();
  } catch (const std::exception& e) {
    r.error = cat("non-kvlab exception: ", e.what());
  }
  return r;
}

Tensor payload(const std::vector<std::byte>& image, std::size_t lead, DType dtype, const Shape& shape) {
  Tensor t(dtype, shape);
  if (t.nbytes() > 0) std::memcpy(t.data(), image.data() + lead, t.nbytes());
  return t;
}

// Names the first byte outside the payload that changed, or "" when the guards hold.
std::string guard_violation(const std::vector<std::byte>& image, std::size_t lead) {
  for (std::size_t i = 0; i < lead; ++i) {
    if (image[i] != kSentinel) return cat("guard band before the output overwritten at byte -", lead - i);
  }
  for (std::size_t i = image.size() - kGuard; i < image.size(); ++i) {
    if (image[i] != kSentinel) return cat("guard band after the output overwritten at byte +", i - (image.size() - kGuard));
  }
  return {};
}

std::string mib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

void set_failed(CaseResult& r, std::string reason) {
  if (r.status != Status::failed) {
    r.status = Status::failed;
    r.reason = std::move(reason);
  }
}

CaseResult new_result(const Problem& problem, std::string side) {
  CaseResult r;
  r.line = problem.line();
  r.op = problem.op();
  r.backend = std::move(side);
  return r;
}

// The caps, then prepare(): nullopt, with r's status and reason set, when the problem is
// SKIPPED (bounded before anything is allocated: footprint and work come from the
// parameters alone) or INVALID (the op cannot express it).
std::optional<Prepared> bounded_prepare(const OpInfo& op, const Problem& problem, const RunOptions& options,
                                        CaseResult& r) {
  try {
    const std::uint64_t footprint = op.footprint(problem);
    const std::uint64_t need = footprint > options.max_bytes / kRunCopies ? options.max_bytes + 1
                                                                          : footprint * kRunCopies;
    if (need > options.max_bytes) {
      r.status = Status::skipped;
      r.reason = cat("needs about ", mib(footprint), " MiB of tensors (", kRunCopies,
                     " copies in a run), over the memory cap of ", mib(options.max_bytes), " MiB (--max-memory)");
      return std::nullopt;
    }
    const std::uint64_t work = op.work(problem);
    if (work > options.max_work) {
      r.status = Status::skipped;
      r.reason = cat("needs about ", static_cast<double>(work), " operations, over the work cap of ",
                     static_cast<double>(options.max_work), " (--max-work)");
      return std::nullopt;
    }
    return op.prepare(problem);
  } catch (const Error& e) {
    r.status = Status::invalid;
    r.reason = e.what();
    return std::nullopt;
  }
}

// One side of a comparison after its run, read back: the outputs, or the error its
// kernel threw, and every byte it wrote where it must not. The device buffers are gone
// by then, so a case holds no more than two sides' outputs at once.
struct SideRun {
  std::string error;  // non-empty when the kernel threw
  std::optional<ErrorKind> kind;
  std::vector<Tensor> outputs;
  std::vector<std::vector<std::byte>> images;  // outputs with guard bands (kept for a rerun)
  std::vector<std::string> guard_faults;       // per output; "" when its guards hold
  std::vector<std::string> input_faults;
  // What the backend declares (Backend::accumulation); none for outputs an outside
  // engine recorded (kvlab check --vectors): they are held to the output budget alone,
  // the in-process backend of that engine to the ceiling and its known divergences.
  std::optional<DType> accumulation;
  Backend::AttentionRounding rounding;  // Backend::attention_rounding (all, for recorded outputs)
};

SideRun run_side(const OpInfo& op, const Problem& p, const Prepared& prep, Backend& b, bool keep_images) {
  const Run run = execute(op, p, prep, b);
  SideRun s;
  s.accumulation = b.accumulation();
  s.rounding = b.attention_rounding();
  s.error = run.error;
  s.kind = run.kind;
  if (!s.error.empty()) return s;
  for (std::size_t o = 0; o < prep.outputs.size(); ++o) {
    const OutputSlot& slot = prep.outputs[o];
    std::vector<std::byte> image = read_back(b, run.outputs[o]);
    s.outputs.push_back(payload(image, run.outputs[o].lead, slot.dtype, slot.shape));
    s.guard_faults.push_back(guard_violation(image, run.outputs[o].lead));
    if (keep_images) s.images.push_back(std::move(image));
  }
  for (std::size_t i = 0; i < run.inputs.size(); ++i) {
    if (read_back(b, run.inputs[i]) != run.inputs[i].image) {
      s.input_faults.push_back(cat("input '", prep.input_names[i], "' (or its guard band) was modified"));
    }
  }
  return s;
}

// A side that declares f32 arithmetic with no intermediate rounding to the output dtype.
bool f32_arithmetic(const SideRun& s) {
  const Backend::AttentionRounding& d = s.rounding;
  return s.accumulation == DType::f32 && !d.scaled_q && !d.dequantized_kv && !d.logits && !d.probabilities;
}

// Budget::expected_rounding_mismatches: the finite elements whose values differ (±0 alike)
// against the allowance 4·E + 8 (E what an f32 twin in the least favourable order
// measured; 4x and a constant for a kernel whose rounding errors happen to fall worse on
// these inputs, while one extra rounding to T per block of keys moves many times more).
void check_rounding_identity(Comparison& c, const Tensor& backend, const Tensor& reference, double expected) {
  const xt::xarray<float> b = backend.to_f32(), r = reference.to_f32();
  std::int64_t differ = 0, finite = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(b.data()[i]) || !std::isfinite(r.data()[i])) continue;
    ++finite;
    if (b.data()[i] != r.data()[i]) ++differ;
  }
  const double allowed = 4 * expected + 8;
  if (static_cast<double>(differ) <= allowed) return;
  c.ok = false;
  c.reason = cat("rounding identity: ", differ, " of ", finite, " ", dtype_name(reference.dtype()),
                 " elements differ from the oracle's rounding; f32 arithmetic allows at most ", allowed,
                 " (an f32 twin: ", expected, "): an intermediate rounding to ", dtype_name(reference.dtype()),
                 " the backend does not declare");
}

// Both sides ran: compare every output with the op's policy, then what either side broke.
// `judge` names the trusted side in reasons ("reference", "judge").
void compare_sides(CaseResult& r, const OpInfo& op, const Problem& problem, const Prepared& prep, const SideRun& got,
                   const SideRun& want, std::string_view judge) {
  double worst_rank = -1;
  for (std::size_t o = 0; o < prep.outputs.size(); ++o) {
    const OutputSlot& slot = prep.outputs[o];
    const Tensor& b = got.outputs[o];
    const Tensor& ref = want.outputs[o];
    if (!got.guard_faults[o].empty()) set_failed(r, cat(slot.name, ": ", got.guard_faults[o]));
    Comparison c;
    if (slot.bit_exact) {
      c = compare_bits(b, ref);
    } else {
      Budget budget = op.budget(problem, prep, o, ref);
      // The precision ceiling is derived for f32 accumulation: a backend that declares a
      // narrower one (or none) is held to the output dtype's budget alone.
      if (got.accumulation != DType::f32) budget.precision_nmse_max = -1;
      // ... and keeps the terms of the intermediate roundings it declares, only.
      if (budget.precision_nmse_max >= 0) {
        const Budget::RoundingTerms& t = budget.rounding_terms;
        const Backend::AttentionRounding& d = got.rounding;
        budget.precision_nmse_max -= (d.scaled_q ? 0 : t.scaled_q) + (d.dequantized_kv ? 0 : t.dequantized_kv) +
                                     (d.logits ? 0 : t.logits) + (d.probabilities ? 0 : t.probabilities);
      }
      c = compare_values(b, ref, budget);
      if (c.ok && f32_arithmetic(got) && budget.expected_rounding_mismatches >= 0) {
        check_rounding_identity(c, b, ref, budget.expected_rounding_mismatches);
      }
    }
    r.outputs.push_back({slot.name, slot.bit_exact, c});
    // Report the failing output, else the one with the largest relative error.
    const double rank = c.ok ? c.rel_err : 1e300 + static_cast<double>(c.mismatches);
    if (rank > worst_rank || (!c.ok && r.status != Status::failed)) {
      worst_rank = rank;
      r.output = slot.name;
      r.output_shape = slot.shape;
      r.cmp = c;
      r.worst_coords = c.worst_index >= 0 ? coords(slot.shape, c.worst_index) : "";
    }
    if (!c.ok) set_failed(r, cat(slot.name, ": ", c.reason));
    // Zero-trust: an output that is mostly zeros proves little when the reference is
    // too (a weak case), and is a defect when the reference is not (a kernel that
    // skipped its work can still pass a loose tolerance).
    if (b.numel() >= 16) {
      if (c.zero_fraction_backend >= 0.5 && c.zero_fraction_reference < 0.1) {
        set_failed(r, cat(slot.name, ": zero-trust: ", c.zero_fraction_backend * 100, "% zeros, ", judge, " ",
                          c.zero_fraction_reference * 100, "%"));
      } else if (c.zero_fraction_reference >= 0.9) {
        r.notes.push_back(cat(slot.name, ": zero-trust: ", judge, " output is ", c.zero_fraction_reference * 100,
                              "% zeros; the case proves little"));
      }
    }
  }
  for (const std::string& f : got.input_faults) set_failed(r, cat(f, " by the backend"));
  // The trusted side is checked too: a verdict against a judge that wrote out of bounds
  // means nothing.
  for (std::size_t o = 0; o < want.guard_faults.size(); ++o) {
    if (!want.guard_faults[o].empty()) set_failed(r, cat(judge, " ", prep.outputs[o].name, ": ", want.guard_faults[o]));
  }
  for (const std::string& f : want.input_faults) set_failed(r, cat(f, " by the ", judge));
}

// The backend's side of a case, judged against the reference's run `want` of the same
// prepared inputs.
CaseResult judge_backend(const OpInfo& op, const Problem& problem, const Prepared& prep, Backend& backend,
                         const SideRun& want, const RunOptions& options) {
  CaseResult r = new_result(problem, backend.name());
  (void)take_delegated();  // what earlier runs noted is not this side's
  const SideRun got = run_side(op, problem, prep, backend, options.rerun);
  const std::vector<std::string> delegated = take_delegated();
  if (!want.error.empty()) {
    if (!got.error.empty()) {
      r.status = Status::invalid;
      r.reason = want.error;
    } else {
      set_failed(r, cat("backend accepted a problem the reference rejects: ", want.error));
    }
    return r;
  }
  if (!got.error.empty()) {
    if (got.kind == ErrorKind::unsupported) {
      r.status = Status::unimplemented;
      r.reason = got.error;
    } else {
      set_failed(r, cat("backend rejected a valid problem: ", got.error));
    }
    return r;
  }
  compare_sides(r, op, problem, prep, got, want, "reference");
  if (options.rerun && r.status == Status::passed) {
    const SideRun again = run_side(op, problem, prep, backend, true);
    for (std::size_t o = 0; o < prep.outputs.size() && again.error.empty(); ++o) {
      if (again.images[o] != got.images[o]) {
        set_failed(r, cat(prep.outputs[o].name, ": bitwise rerun differs (the backend is not deterministic)"));
      }
    }
    if (!again.error.empty()) set_failed(r, cat("rerun threw: ", again.error));
  }
  // A pass that ran the oracle's own code on the backend's side proves nothing about the
  // backend (a failure still does: the rest of its side ran its own kernels).
  if (r.status == Status::passed && !delegated.empty()) {
    std::string ops;
    for (const std::string& o : delegated) ops += (ops.empty() ? "" : ", ") + o;
    r.status = Status::unimplemented;
    r.reason = cat("delegated to the reference: ", backend.name(), " has no kernel of its own for ", ops,
                   ", so its outputs would be the oracle's compared with themselves");
  }
  return r;
}

CaseResult run_case_timed(const Problem& problem, Backend& backend, Backend& reference, const RunOptions& options) {
  CaseResult r = new_result(problem, backend.name());
  const OpInfo& op = find_op(problem.op());
  const std::optional<Prepared> prep = bounded_prepare(op, problem, options, r);
  if (!prep) return r;
  const SideRun want = run_side(op, problem, *prep, reference, false);
  return judge_backend(op, problem, *prep, backend, want, options);
}

// The recorded tensors must be exactly what prepare() makes for the line: a file that
// does not match its own problem line is not evidence of anything.
void require_same_layouts(const std::vector<Tensor>& recorded, const std::vector<std::string>& names,
                          const std::vector<DType>& dtypes, const std::vector<Shape>& shapes, std::string_view what) {
  KVLAB_REQUIRE(recorded.size() == names.size(), invalid_argument, "recorded ", recorded.size(), " ", what,
                "s, the problem has ", names.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    KVLAB_REQUIRE(recorded[i].dtype() == dtypes[i] && recorded[i].shape() == shapes[i], invalid_argument, what,
                  " '", names[i], "' is recorded as ", dtype_name(recorded[i].dtype()), shape_str(recorded[i].shape()),
                  ", the problem has ", dtype_name(dtypes[i]), shape_str(shapes[i]));
  }
}

CaseResult run_recorded_case_timed(const Problem& problem, Recorded recorded, const std::string& engine,
                                   Backend& judge, const RunOptions& options) {
  CaseResult r = new_result(problem, engine);
  const OpInfo& op = find_op(problem.op());
  std::optional<Prepared> prep = bounded_prepare(op, problem, options, r);
  if (!prep) return r;
  try {
    std::vector<DType> dtypes;
    std::vector<Shape> shapes;
    for (const Tensor& t : prep->inputs) {
      dtypes.push_back(t.dtype());
      shapes.push_back(t.shape());
    }
    require_same_layouts(recorded.inputs, prep->input_names, dtypes, shapes, "input");
    std::vector<std::string> names;
    dtypes.clear();
    shapes.clear();
    for (const OutputSlot& s : prep->outputs) {
      names.push_back(s.name);
      dtypes.push_back(s.dtype);
      shapes.push_back(s.shape);
    }
    require_same_layouts(recorded.outputs, names, dtypes, shapes, "output");
  } catch (const Error& e) {
    r.status = Status::invalid;
    r.reason = e.what();
    return r;
  }
  prep->inputs = std::move(recorded.inputs);

  SideRun got;
  got.outputs = std::move(recorded.outputs);
  got.guard_faults.assign(got.outputs.size(), "");
  const SideRun want = run_side(op, problem, *prep, judge, false);
  // A judge without the kernel cannot say anything about the recorded outputs (a skip,
  // as for a backend in kvlab check); any other rejection makes the problem INVALID.
  if (!want.error.empty()) {
    r.status = want.kind == ErrorKind::unsupported ? Status::unimplemented : Status::invalid;
    r.reason = cat("the judge (", judge.name(), ") rejects the problem: ", want.error);
    return r;
  }
  compare_sides(r, op, problem, *prep, got, want, "judge");
  return r;
}

Produced produce_case_timed(const Problem& problem, Backend& backend, const RunOptions& options) {
  Produced p{new_result(problem, backend.name()), {}, {}};
  CaseResult& r = p.result;
  const OpInfo& op = find_op(problem.op());
  std::optional<Prepared> prep = bounded_prepare(op, problem, options, r);
  if (!prep) return p;
  SideRun run = run_side(op, problem, *prep, backend, false);
  if (!run.error.empty()) {
    r.status = run.kind == ErrorKind::unsupported ? Status::unimplemented : Status::invalid;
    r.reason = run.error;
    return p;
  }
  for (std::size_t o = 0; o < run.guard_faults.size(); ++o) {
    if (!run.guard_faults[o].empty()) set_failed(r, cat(prep->outputs[o].name, ": ", run.guard_faults[o]));
  }
  for (const std::string& f : run.input_faults) set_failed(r, cat(f, " by the backend"));
  p.prep = std::move(*prep);
  p.outputs = std::move(run.outputs);
  return p;
}

CaseResult invalid_case(const Problem& problem, const std::string& side, std::string reason) {
  CaseResult r = new_result(problem, side);
  r.status = Status::invalid;
  r.reason = std::move(reason);
  return r;
}

// Runs `body` and times it; whatever escapes (std::bad_alloc included) makes the case
// INVALID with the reason, so no case can end a run.
template <class Body>
CaseResult guarded(const Problem& problem, const std::string& side, Body body) {
  const auto start = std::chrono::steady_clock::now();
  CaseResult r;
  try {
    r = body();
  } catch (const std::bad_alloc&) {
    r = invalid_case(problem, side, "out of memory (std::bad_alloc) while running the case");
  } catch (const std::exception& e) {
    r = invalid_case(problem, side, cat("exception while running the case: ", e.what()));
  } catch (...) {
    r = invalid_case(problem, side, "unknown exception while running the case");
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace

std::string_view status_name(Status s) {
  switch (s) {
    case Status::passed: return "PASSED";
    case Status::skipped: return "SKIPPED";
    case Status::unimplemented: return "UNIMPLEMENTED";
    case Status::invalid: return "INVALID";
    case Status::failed: return "FAILED";
  }
  return "?";
}

std::uint64_t default_max_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::uint64_t{4} << 30;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 2;
}

CaseResult run_case(const Problem& problem, Backend& backend, Backend& reference, const RunOptions& options) {
  return guarded(problem, backend.name(), [&] { return run_case_timed(problem, backend, reference, options); });
}

std::vector<CaseResult> run_case_on_each(const Problem& problem, std::span<Backend* const> backends,
                                         Backend& reference, const RunOptions& options) {
  // The shared part: a SKIPPED or INVALID outcome of it (or an exception) is every
  // backend's result. Its time is added to each backend's own.
  std::optional<Prepared> prep;
  std::optional<SideRun> want;
  const CaseResult shared = guarded(problem, "", [&] {
    CaseResult r = new_result(problem, "");
    const OpInfo& op = find_op(problem.op());
    prep = bounded_prepare(op, problem, options, r);
    if (prep) want = run_side(op, problem, *prep, reference, false);
    return r;
  });
  std::vector<CaseResult> results;
  for (Backend* b : backends) {
    CaseResult r;
    if (!prep || !want) {
      r = shared;
      r.backend = b->name();
    } else {
      r = guarded(problem, b->name(), [&] {
        return judge_backend(find_op(problem.op()), problem, *prep, *b, *want, options);
      });
      r.seconds += shared.seconds;
    }
    results.push_back(std::move(r));
  }
  return results;
}

CaseResult run_recorded_case(const Problem& problem, Recorded recorded, const std::string& engine, Backend& judge,
                             const RunOptions& options) {
  return guarded(problem, engine, [&] {
    return run_recorded_case_timed(problem, std::move(recorded), engine, judge, options);
  });
}

Produced produce_case(const Problem& problem, Backend& backend, const RunOptions& options) {
  Produced p;
  p.result = guarded(problem, backend.name(), [&] {
    p = produce_case_timed(problem, backend, options);
    return p.result;
  });
  if (p.result.status != Status::passed) {
    p.prep = {};
    p.outputs.clear();
  }
  return p;
}

ShrinkResult shrink(const Problem& failing, Backend& backend, Backend& reference, const RunOptions& options,
                    int max_trials) {
  ShrinkResult s{failing, run_case(failing, backend, reference, options), 0};
  bool progress = true;
  while (progress && s.trials < max_trials) {
    progress = false;
    std::vector<Problem> candidates;
    try {
      candidates = find_op(failing.op()).shrink_candidates(s.smallest);
    } catch (const std::exception&) {
      break;
    }
    for (const Problem& candidate : candidates) {
      if (s.trials >= max_trials) break;
      ++s.trials;
      CaseResult r = run_case(candidate, backend, reference, options);
      if (r.status == Status::failed) {
        s.smallest = candidate;
        s.result = std::move(r);
        progress = true;
        break;
      }
    }
  }
  return s;
}

std::string describe(const CaseResult& r) {
  std::string out = cat(status_name(r.status), " [", r.backend, "] ", r.line, "\n");
  if (!r.reason.empty()) out += cat("  reason:   ", r.reason, "\n");
  if (r.status == Status::failed && !r.output.empty() && r.cmp.worst_index >= 0) {
    out += cat("  worst:    ", r.output, shape_str(r.output_shape), " at ", r.worst_coords, ": backend ",
               r.cmp.backend_value, ", reference ", r.cmp.reference_value, ", budget ", r.cmp.budget, "\n");
    out += cat("  metrics:  mismatches ", r.cmp.mismatches, ", max|err| ", r.cmp.max_abs_err, ", max|err|/|ref|inf ",
               r.cmp.rel_err, ", NMSE ", r.cmp.nmse, ", max ulps ", r.cmp.max_ulps, "\n");
  }
  for (const std::string& n : r.notes) out += cat("  note:     ", n, "\n");
  if (r.status == Status::failed && !r.repro.empty()) {
    out += cat("  repro:    ", r.repro, "\n");
  } else if (r.status == Status::failed) {
    out += cat("  repro:    kvlab repro --backend ", r.backend, " '", r.line, "'\n");
    if (!r.shrunk_line.empty()) {
      out += cat("  shrunk:   kvlab repro --backend ", r.backend, " '", r.shrunk_line, "'  (", r.shrink_trials,
                 " trials)\n");
    }
  }
  return out;
}

}  // namespace kvlab::harness

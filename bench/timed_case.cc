#include "bench/timed_case.h"

#include <algorithm>
#include <cmath>

#include "bench/memo_reference.h"
#include <filesystem>

#include "harness/backends.h"
#include "harness/check.h"
#include "harness/known_divergences.h"
#include "harness/spine.h"
#include "kvlab/error.h"

namespace kvlab::bench {

namespace {

std::unique_ptr<TimedCase>& live() {
  static std::unique_ptr<TimedCase> slot;
  return slot;
}

// The Vulkan backend of the last case, by backend name (timed_case.h).
struct KeptBackend {
  std::string name;
  std::shared_ptr<Backend> backend;
};
KeptBackend& kept_vulkan() {
  static KeptBackend k;
  return k;
}

std::shared_ptr<Backend> make_bench_backend(const std::string& name) {
  // ggml's quantized attention reads ggml's block structs, not kvlab's packed layout: its
  // static_kv variant lays the fixed K/V out once (on the verified call) and the timed calls
  // run ggml's kernel alone (kernels/ggml/ggml_backend.h).
  if (name == "ggml") return harness::make_backend("ggml:static_kv");
  // Vulkan kernels are timed on the device: the harness factory's backend has no
  // timestamp queries.
  if (!is_vulkan_backend(name)) return harness::make_backend(name);
  KeptBackend& kept = kept_vulkan();
  if (kept.name != name || !kept.backend) {
    kept.backend.reset();  // one Vulkan instance at a time
    kept = {name, make_timed_vulkan_backend(name)};
  }
  return kept.backend;
}

MemoReference& memo_reference() {
  static MemoReference m;
  return m;
}

// Uploads the prepared inputs once and allocates the outputs with their initial content
// (a kernel that must leave rows alone, kv_scatter, starts from it) or NaN poison.
void place(TimedCase& tc) {
  Backend& b = *tc.backend;
  for (const Tensor& t : tc.prep.inputs) tc.in.tensors.push_back(b.upload(t));
  tc.in.names = &tc.prep.input_names;
  tc.in.scalars = &tc.prep.scalars;
  for (const harness::OutputSlot& s : tc.prep.outputs) {
    tc.output_names.push_back(s.name);
    DTensor d = b.allocate(s.dtype, s.shape);
    if (s.initial) {
      b.upload(d, s.initial->data());
    } else {
      b.fill(d, harness::payload_nan_bits(s.dtype));
    }
    tc.out.tensors.push_back(d);
  }
  tc.out.names = &tc.output_names;
}

// The one verification against the reference; a verdict other than PASSED fills skip
// (nothing to compare yet) or failure (wrong).
void verify(TimedCase& tc) {
  MemoReference& reference = memo_reference();
  reference.expect(tc.problem.line());
  const harness::CaseResult r = harness::run_case(tc.problem, *tc.backend, reference, {});
  switch (r.status) {
    case harness::Status::passed: return;
    case harness::Status::unimplemented: tc.skip = r.reason; return;
    case harness::Status::skipped: tc.skip = cat("not verified: ", r.reason); return;
    case harness::Status::invalid: tc.failure = harness::describe(r); return;
    case harness::Status::failed: break;
  }
  // A peer engine's listed divergence is still timed (its speed is the point), labelled.
  const std::string backend = tc.backend->name();
  const std::filesystem::path own =
      harness::default_cases_dir().parent_path() / "known" / backend.substr(0, backend.find(':'));
  if (std::filesystem::is_regular_file(own)) {
    harness::KnownDivergences known({own});
    if (const harness::KnownDivergence* d = known.match(tc.problem, backend)) {
      tc.known = cat("known divergence (", d->klass, ", ", d->where, ")");
      return;
    }
  }
  tc.failure = harness::describe(r);
}

void build(TimedCase& tc, const std::string& backend) {
  try {
    tc.backend = make_bench_backend(backend);
  } catch (const Error& e) {
    (e.kind() == ErrorKind::unsupported ? tc.skip : tc.failure) = e.what();
    return;
  }
  tc.op = &harness::find_op(tc.problem.op());
  try {
    tc.prep = tc.op->prepare(tc.problem);
  } catch (const Error& e) {
    tc.failure = cat("INVALID problem: ", e.what());
    return;
  }
  place(tc);
  // The oracle is the reference for the others: comparing it with itself proves nothing,
  // and a warm-up call of it at perf shapes costs up to minutes.
  if (backend == "reference") return;
  try {
    tc.invoke();  // the warm-up call; an unsupported kernel stops here, before the oracle runs
  } catch (const Error& e) {
    (e.kind() == ErrorKind::unsupported ? tc.skip : tc.failure) = e.what();
    return;
  }
  verify(tc);
}

}  // namespace

void TimedCase::invoke() {
  op->invoke(*backend, problem, in, out);
  backend->finish();
}

TimedCase& acquire_timed_case(const std::string& key, const harness::Problem& problem, const std::string& backend) {
  std::unique_ptr<TimedCase>& slot = live();
  if (slot && slot->key == key) return *slot;
  slot.reset();  // drop the previous backend (and its target pin) before making the next
  slot = std::make_unique<TimedCase>();
  slot->key = key;
  slot->problem = problem;
  try {
    build(*slot, backend);
  } catch (const std::exception& e) {
    slot->failure = cat("setup threw: ", e.what());
  }
  if (!slot->failure.empty()) {
    record_failure(cat(key, ": ", slot->failure));
    kept_vulkan() = {};  // a backend that failed is not trusted with the next case
  }
  if (!slot->skip.empty()) record_skip(key, slot->skip);
  if (!slot->failure.empty() || !slot->skip.empty()) {
    // Keep the verdict, drop the memory.
    slot->prep = {};
    slot->in = {};
    slot->out = {};
    slot->clock.reset();
    slot->backend.reset();
  }
  return *slot;
}

void release_timed_case() {
  live().reset();
  kept_vulkan() = {};
}

int oracle_calls_computed() { return memo_reference().computed(); }

}  // namespace kvlab::bench

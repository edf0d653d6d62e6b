#include "harness/spine.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <unistd.h>
#include <exception>

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

CaseResult run_case_timed(const Problem& problem, Backend& backend, Backend& reference, const RunOptions& options) {
  CaseResult r;
  r.line = problem.line();
  r.op = problem.op();
  r.backend = backend.name();
  const OpInfo& op = find_op(problem.op());
  Prepared prep;
  try {
    // Bounded before allocated: the footprint comes from the parameters alone.
    const std::uint64_t footprint = op.footprint(problem);
    const std::uint64_t need = footprint > options.max_bytes / kRunCopies ? options.max_bytes + 1
                                                                          : footprint * kRunCopies;
    if (need > options.max_bytes) {
      r.status = Status::skipped;
      r.reason = cat("needs about ", mib(footprint), " MiB of tensors (", kRunCopies,
                     " copies in a run), over the memory cap of ", mib(options.max_bytes), " MiB (--max-memory)");
      return r;
    }
    const std::uint64_t work = op.work(problem);
    if (work > options.max_work) {
      r.status = Status::skipped;
      r.reason = cat("needs about ", static_cast<double>(work), " operations, over the work cap of ",
                     static_cast<double>(options.max_work), " (--max-work)");
      return r;
    }
    prep = op.prepare(problem);
  } catch (const Error& e) {
    r.status = Status::invalid;
    r.reason = e.what();
    return r;
  }

  Run got = execute(op, problem, prep, backend);
  Run want = execute(op, problem, prep, reference);
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

  std::vector<std::vector<std::byte>> got_images;
  double worst_rank = -1;
  for (std::size_t o = 0; o < prep.outputs.size(); ++o) {
    const OutputSlot& slot = prep.outputs[o];
    got_images.push_back(read_back(backend, got.outputs[o]));
    const std::vector<std::byte> want_image = read_back(reference, want.outputs[o]);
    const Tensor b = payload(got_images.back(), got.outputs[o].lead, slot.dtype, slot.shape);
    const Tensor ref = payload(want_image, want.outputs[o].lead, slot.dtype, slot.shape);
    if (const std::string g = guard_violation(got_images.back(), got.outputs[o].lead); !g.empty()) {
      set_failed(r, cat(slot.name, ": ", g));
    }
    const Comparison c = slot.bit_exact ? compare_bits(b, ref) : compare_values(b, ref, op.budget(problem, prep, o, ref));
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
        set_failed(r, cat(slot.name, ": zero-trust: ", c.zero_fraction_backend * 100, "% zeros, reference ",
                          c.zero_fraction_reference * 100, "%"));
      } else if (c.zero_fraction_reference >= 0.9) {
        r.notes.push_back(cat(slot.name, ": zero-trust: reference output is ", c.zero_fraction_reference * 100,
                              "% zeros; the case proves little"));
      }
    }
  }
  for (std::size_t i = 0; i < got.inputs.size(); ++i) {
    if (read_back(backend, got.inputs[i]) != got.inputs[i].image) {
      set_failed(r, cat("input '", prep.input_names[i], "' (or its guard band) was modified by the backend"));
    }
  }
  if (options.rerun && r.status == Status::passed) {
    Run again = execute(op, problem, prep, backend);
    for (std::size_t o = 0; o < prep.outputs.size() && again.error.empty(); ++o) {
      if (read_back(backend, again.outputs[o]) != got_images[o]) {
        set_failed(r, cat(prep.outputs[o].name, ": bitwise rerun differs (the backend is not deterministic)"));
      }
    }
    if (!again.error.empty()) set_failed(r, cat("rerun threw: ", again.error));
  }
  return r;
}

CaseResult invalid_case(const Problem& problem, const Backend& backend, std::string reason) {
  CaseResult r;
  r.line = problem.line();
  r.op = problem.op();
  r.backend = backend.name();
  r.status = Status::invalid;
  r.reason = std::move(reason);
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
  const auto start = std::chrono::steady_clock::now();
  CaseResult r;
  try {
    r = run_case_timed(problem, backend, reference, options);
  } catch (const std::bad_alloc&) {
    r = invalid_case(problem, backend, "out of memory (std::bad_alloc) while running the case");
  } catch (const std::exception& e) {
    r = invalid_case(problem, backend, cat("exception while running the case: ", e.what()));
  } catch (...) {
    r = invalid_case(problem, backend, "unknown exception while running the case");
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
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
               r.cmp.rel_err, ", NMSE ", r.cmp.nmse, "\n");
  }
  for (const std::string& n : r.notes) out += cat("  note:     ", n, "\n");
  if (r.status == Status::failed) {
    out += cat("  repro:    kvlab repro --backend ", r.backend, " '", r.line, "'\n");
    if (!r.shrunk_line.empty()) {
      out += cat("  shrunk:   kvlab repro --backend ", r.backend, " '", r.shrunk_line, "'  (", r.shrink_trials,
                 " trials)\n");
    }
  }
  return out;
}

}  // namespace kvlab::harness

#include "harness/op.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "harness/ops/ops.h"
#include "harness/rng.h"
#include "kvlab/error.h"
#include "kvlab/suggest.h"

namespace kvlab::harness {

const Tensor& Prepared::input(std::string_view name) const {
  for (std::size_t i = 0; i < input_names.size(); ++i) {
    if (input_names[i] == name) return inputs[i];
  }
  fail(ErrorKind::internal, cat("no prepared input '", name, "'"));
}

const DTensor* Bound::find(std::string_view name) const {
  for (std::size_t i = 0; i < names->size(); ++i) {
    if ((*names)[i] == name) return &tensors[i];
  }
  return nullptr;
}

std::optional<double> Bound::scalar(std::string_view name) const {
  if (scalars == nullptr) return std::nullopt;
  const auto it = scalars->find(name);
  if (it == scalars->end()) return std::nullopt;
  return it->second;
}

const DTensor& Bound::operator[](std::string_view name) const {
  const DTensor* t = find(name);
  KVLAB_REQUIRE(t != nullptr, internal, "no bound tensor '", name, "'");
  return *t;
}

Footprint& Footprint::add(DType dtype, std::initializer_list<std::int64_t> dims) {
  constexpr std::uint64_t kMax = std::uint64_t{1} << 63;
  std::uint64_t n = dtype_size(dtype);
  for (const std::int64_t d : dims) {
    if (d <= 0) return *this;
    const auto u = static_cast<std::uint64_t>(d);
    n = n > kMax / u ? kMax : n * u;
  }
  return add_bytes(n);
}

Footprint& Footprint::add_bytes(std::uint64_t bytes) {
  constexpr std::uint64_t kMax = std::uint64_t{1} << 63;
  bytes_ = bytes > kMax - std::min(bytes_, kMax) ? kMax : bytes_ + bytes;
  return *this;
}

const std::vector<ParamSpec>& OpInfo::params() const {
  if (params_.empty()) {
    params_ = declared_params();
    // Where the spine places every input and output inside its buffer (harness/spine.cc):
    // `aligned` at a 64-byte boundary, `odd` one element later, an odd element offset
    // that no vector load, binding offset or workgroup stride may assume away.
    ParamSpec place = word_param("place", {"aligned", "odd"});
    place.quiet_default = true;
    params_.push_back(std::move(place));
    params_.push_back(int_param("seed", 1));
  }
  return params_;
}

Budget OpInfo::budget(const Problem&, const Prepared&, std::size_t, const Tensor&) const {
  return {{0.0}, -1};  // an op that declares no tolerance compares values exactly
}

std::vector<Problem> OpInfo::shrink_candidates(const Problem& p) const {
  std::vector<Problem> out;
  auto push = [&](const ParamSpec& s, const std::string& v) {
    if (v != p.word(s.key)) out.push_back(p.with(s.key, v));
  };
  for (const ParamSpec& s : params()) {
    if (!s.shrink) continue;
    if (s.kind == ParamKind::word) {
      if (!s.choices.empty()) push(s, s.choices.front());  // free-form words: the op shrinks them
    } else if (s.kind == ParamKind::integer) {
      const std::int64_t v = p.integer(s.key);
      if (v <= s.shrink_min) continue;
      push(s, std::to_string(s.shrink_min));
      if (v / 2 > s.shrink_min) push(s, std::to_string(v / 2));
      if (v - 1 > s.shrink_min && v - 1 != v / 2) push(s, std::to_string(v - 1));
    }
  }
  return out;
}

std::vector<const OpInfo*> all_ops() {
#define KVLAB_HARNESS_OP_ADDRESS(name, ...) &ops::name(),
  return {KVLAB_HARNESS_OPS(KVLAB_HARNESS_OP_ADDRESS)};
#undef KVLAB_HARNESS_OP_ADDRESS
}

const OpInfo& find_op(std::string_view name) {
  std::string known;
  std::vector<std::string> names;
  for (const OpInfo* op : all_ops()) {
    if (op->name() == name) return *op;
    known += cat(known.empty() ? "" : ", ", op->name());
    names.emplace_back(op->name());
  }
  fail(ErrorKind::invalid_argument, cat("unknown op '", name, "'", did_you_mean(name, names), " (known: ", known, ")"));
}

ParamSpec int_param(std::string key, std::int64_t def, bool shrink, std::int64_t shrink_min) {
  return {std::move(key), ParamKind::integer, std::to_string(def), {}, shrink, shrink_min};
}
ParamSpec real_param(std::string key, std::string def) {
  return {std::move(key), ParamKind::real, std::move(def), {}, false, 1};
}
ParamSpec word_param(std::string key, std::vector<std::string> choices, bool shrink) {
  std::string def = choices.front();
  return {std::move(key), ParamKind::word, std::move(def), std::move(choices), shrink, 1};
}
ParamSpec dtype_param(std::string key, std::string def) {
  return {std::move(key), ParamKind::word, std::move(def), {"f32", "f16", "bf16"}, false, 1};
}

ParamSpec quiet(ParamSpec s) {
  s.quiet_default = true;
  return s;
}

namespace {

// body(begin, end) over [0, n) in contiguous ranges, on several threads when n is large.
// The fills below are counter-based (element i depends on i alone) and each element is
// its own bytes, so the values are the same on any number of threads. At perf shapes the
// fill was a third of kvlab_bench's host time per problem (Box–Muller's log and cos).
void for_ranges(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& body) {
  constexpr std::int64_t kMinPerThread = std::int64_t{1} << 18;
  const auto threads = std::clamp<std::int64_t>(n / kMinPerThread, 1, std::max(1u, std::thread::hardware_concurrency()));
  if (threads == 1) {
    body(0, n);
    return;
  }
  // An exception (a kvlab::Error from a store, a failed thread start) is rethrown here
  // once every started thread has finished: never std::terminate.
  const std::int64_t per = (n + threads - 1) / threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
  auto range = [&](std::int64_t t) {
    try {
      body(std::min(n, t * per), std::min(n, (t + 1) * per));
    } catch (...) {
      errors[static_cast<std::size_t>(t)] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  struct JoinAll {
    std::vector<std::thread>& pool;
    ~JoinAll() {
      for (std::thread& th : pool) th.join();
    }
  } join_all{pool};
  for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(range, t);
  range(0);
  for (std::thread& th : pool) th.join();
  pool.clear();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace

Tensor random_normal(const Problem& p, std::string_view name, DType dtype, Shape shape, double stddev) {
  Tensor t(dtype, std::move(shape));
  const CounterRng rng(p.line(), name);
  const TensorView v = t.view();
  for_ranges(t.numel(), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      v.store(i, static_cast<float>(stddev * rng.normal(static_cast<std::uint64_t>(i))));
    }
  });
  return t;
}

Tensor random_bits(const Problem& p, std::string_view name, DType dtype, Shape shape) {
  Tensor t(dtype, std::move(shape));
  const CounterRng rng(p.line(), name);
  for_ranges(t.numel(), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      store_bits(t, i, static_cast<std::uint32_t>(rng.bits(static_cast<std::uint64_t>(i))));
    }
  });
  return t;
}

std::uint32_t payload_nan_bits(DType dtype) {
  switch (dtype) {
    case DType::f32: return 0x7FC0DEADu;  // quiet NaN; the payload names the poison
    case DType::f16: return 0x7E5Au;
    case DType::bf16: return 0x7FDAu;
    default: return 0xFFFFFFFFu;
  }
}

void store_bits(Tensor& t, std::int64_t index, std::uint32_t bits) {
  const std::size_t size = dtype_size(t.dtype());
  // Little-endian host: the low `size` bytes of `bits` are the element.
  std::memcpy(t.data() + static_cast<std::size_t>(index) * size, &bits, size);
}

}  // namespace kvlab::harness

#include "bench/bench_suite.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "bench/bytes_model.h"
#include "bench/arith_baseline.h"
#include "bench/memory_baseline.h"
#include "bench/timed_case.h"
#include "bench/vulkan_bench.h"
#include "harness/check.h"
#include "harness/op.h"
#include "kernels/simd/parallel.h"
#include "kernels/simd/simd_backend.h"
#include "kernels/simd/simd_kernels.h"
#include "kvlab/error.h"

namespace kvlab::bench {

namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

SuiteOutcome& outcome() {
  static SuiteOutcome o;
  return o;
}

// ---- case lines ---------------------------------------------------------------------

struct BenchCase {
  harness::Problem problem;
  std::string shape;  // the parameters the case line writes, in declared order
};

// The keys a case line writes (`op k=v k=v1,v2 ...`), so a benchmark's name shows the
// shape as the case file states it rather than every parameter with its default.
std::set<std::string> written_keys(const std::string& line) {
  std::set<std::string> keys;
  std::stringstream in(line);
  std::string token;
  in >> token;  // the op
  while (in >> token) keys.insert(token.substr(0, token.find('=')));
  return keys;
}

std::string shape_of(const harness::Problem& p, const std::set<std::string>& keys) {
  std::string out;
  for (const auto& [key, value] : p.params()) {
    if (key != "seed" && keys.count(key)) out += cat(out.empty() ? "" : " ", key, "=", value);
  }
  return out;
}

// A case file read like harness::load_case_file (comments, product syntax), keeping
// each problem's written keys; errors name the file and line.
std::vector<BenchCase> read_cases(const std::filesystem::path& path) {
  std::ifstream in(path);
  KVLAB_REQUIRE(in.good(), io, "cannot read case file ", path.string());
  std::vector<BenchCase> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const std::size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const std::set<std::string> keys = written_keys(line);
      for (harness::Problem& p : harness::expand_line(line)) out.push_back({p, shape_of(p, keys)});
    } catch (const Error& e) {
      fail(e.kind(), cat(path.string(), ":", number, ": ", e.what()));
    }
  }
  return out;
}

std::vector<BenchCase> collect(const SuiteOptions& o, std::ostream& log) {
  std::vector<std::filesystem::path> files = o.case_files;
  if (files.empty()) {
    for (const harness::OpInfo* op : harness::all_ops()) {
      if (!has_traffic_model(std::string(op->name()))) {
        log << "note: " << op->name() << " is not a single kernel (no bytes model): not benchmarked\n";
        continue;
      }
      bool found = false;
      for (const std::string& role : tier_roles(o.tier)) {
        const std::filesystem::path f = harness::default_cases_dir() / op->name() / role;
        if (std::filesystem::exists(f)) {
          files.push_back(f);
          found = true;
        }
      }
      if (!found) {
        log << "note: no " << o.tier << " case file for " << op->name() << " ("
            << (harness::default_cases_dir() / op->name()).string() << ")\n";
      }
    }
  }
  const std::set<std::string> wanted(o.ops.begin(), o.ops.end());
  for (const std::string& name : wanted) harness::find_op(name);  // unknown op names fail loudly
  std::vector<BenchCase> out;
  std::set<std::string> seen;
  for (const auto& f : files) {
    for (BenchCase& c : read_cases(f)) {
      if (!wanted.empty() && !wanted.count(c.problem.op())) continue;
      KVLAB_REQUIRE(has_traffic_model(c.problem.op()), invalid_argument, f.string(), ": op '", c.problem.op(),
                    "' has no traffic model (OpInfo::traffic_model), so it cannot be benchmarked");
      if (seen.insert(c.problem.line()).second) out.push_back(std::move(c));
    }
  }
  return out;
}

// ---- baselines ----------------------------------------------------------------------

struct Baselines {
  std::unique_ptr<BigBuffer> src, dst, flush;
  std::map<std::string, std::unique_ptr<DeviceCopyBaseline>> device_copy;  // by device key
};
Baselines& baselines() {
  static Baselines b;
  return b;
}

BigBuffer& lazily(std::unique_ptr<BigBuffer>& slot, std::int64_t mib) {
  if (!slot) slot = std::make_unique<BigBuffer>(static_cast<std::size_t>(mib * kMiB));
  return *slot;
}

void register_baselines(const SuiteOptions& o) {
  const int threads = simd::worker_count();
  for (const bool pool : {true, false}) {
    const std::string where = pool ? "pool" : "single";
    const std::string shape = cat(o.baseline_mib, "MiB threads=", pool ? threads : 1);
    const std::int64_t bytes = o.baseline_mib * kMiB;
    auto* read = benchmark::RegisterBenchmark(
        cat("baseline_read/", where, "/", shape).c_str(), [=](benchmark::State& state) {
          release_timed_case();  // no SIMD target pin may be active: the baseline uses the best
          BigBuffer& buf = lazily(baselines().src, o.baseline_mib);
          for (auto _ : state) benchmark::DoNotOptimize(streaming_read(buf, pool));
          state.SetBytesProcessed(state.iterations() * bytes);
          state.counters["bytes_per_iter"] = static_cast<double>(bytes);
          state.counters["workers"] = pool ? threads : 1;
          state.SetLabel(cat("streaming read (f32 sum, Highway ", simd_current_target(), ")"));
        });
    // memcpy moves each byte twice (read + write): credited like a kernel's bytes model.
    auto* copy = benchmark::RegisterBenchmark(
        cat("baseline_memcpy/", where, "/", shape).c_str(), [=](benchmark::State& state) {
          release_timed_case();
          BigBuffer& src = lazily(baselines().src, o.baseline_mib);
          BigBuffer& dst = lazily(baselines().dst, o.baseline_mib);
          for (auto _ : state) {
            chunked_memcpy(src, dst, pool);
            benchmark::ClobberMemory();
          }
          state.SetBytesProcessed(state.iterations() * 2 * bytes);
          state.counters["copied_bytes_per_second"] =
              benchmark::Counter(static_cast<double>(bytes), benchmark::Counter::kIsIterationInvariantRate);
          state.counters["bytes_per_iter"] = static_cast<double>(2 * bytes);
          state.counters["workers"] = pool ? threads : 1;
          state.SetLabel("memcpy (bytes = read + written)");
        });
    // The arithmetic ceiling (arith_baseline.h): f32 FMA lanes per second, the roofline's
    // other bound; 2^22 rounds are ~10 ms a worker at 16 lanes and 4 GHz.
    auto* fma = benchmark::RegisterBenchmark(
        cat("baseline_fma/", where, "/threads=", pool ? threads : 1).c_str(), [=](benchmark::State& state) {
          release_timed_case();
          double lanes = 0;
          for (auto _ : state) lanes += fma_lanes(std::int64_t{1} << 22, pool);
          state.counters["fma_lanes_per_second"] = benchmark::Counter(lanes, benchmark::Counter::kIsRate);
          state.counters["workers"] = pool ? threads : 1;
          state.SetLabel(cat("f32 FMA chains (Highway ", simd_current_target(), ")"));
        });
    // The decode kernels' dot-product instructions (arith_baseline.h), for the floor of
    // rows that declare them; skipped with the reason where the CPU lacks one.
    const auto dot = [&](DotKind kind, const char* row, const char* counter, const char* what) {
      return benchmark::RegisterBenchmark(
          cat(row, where, "/threads=", pool ? threads : 1).c_str(), [=](benchmark::State& state) {
            release_timed_case();
            if (const std::string why = dot_unavailable(kind); !why.empty()) {
              state.SkipWithError(cat("skipped: ", why).c_str());
              return;
            }
            double lanes = 0;
            for (auto _ : state) lanes += dot_lanes(kind, std::int64_t{1} << 22, pool);
            state.counters[counter] = benchmark::Counter(lanes, benchmark::Counter::kIsRate);
            state.counters["workers"] = pool ? threads : 1;
            state.SetLabel(what);
          });
    };
    auto* bf16_dot = dot(DotKind::bf16, "baseline_bf16dot/", "bf16_dot_lanes_per_second", "vdpbf16ps chains (zmm)");
    auto* u8_dot = dot(DotKind::u8, "baseline_u8dot/", "u8_dot_lanes_per_second", "vpdpbusd chains (zmm)");
    auto* amx_int8 = dot(DotKind::amx_int8, "baseline_amxint8/", "amx_int8_lanes_per_second",
                         "tdpbsud into four C tiles (16 x 64-byte A rows)");
    auto* s16_dot = dot(DotKind::s16, "baseline_s16dot/", "s16_dot_lanes_per_second", "vpdpwssd chains (zmm)");
    auto* s16_madd = dot(DotKind::s16_madd, "baseline_s16madd/", "s16_madd_lanes_per_second",
                         "vpmaddwd + vpaddd chains (ymm)");
    for (auto* b : {read, copy, fma, bf16_dot, u8_dot, amx_int8, s16_dot, s16_madd}) {
      b->UseRealTime()->Unit(benchmark::kMillisecond);
      if (o.smoke) {
        b->Iterations(1)->Repetitions(1);
      } else {
        b->MinTime(o.min_time);
      }
    }
  }
}

// The device buffer copies of each Vulkan device the run uses (bench/vulkan_baseline.h),
// the copy command and the compute-shader copy, timed on the device like the Vulkan
// kernels; where the device is missing the rows are skipped with the reason, so the
// result file says why there are no Vulkan figures.
void register_device_copy(const SuiteOptions& o, const std::string& key, DeviceCopyMethod method) {
  const std::int64_t bytes = o.baseline_mib * kMiB;
  const std::string row = cat(method == DeviceCopyMethod::command ? "baseline_vkcopy/" : "baseline_vkshadercopy/", key);
  auto* b = benchmark::RegisterBenchmark(
      cat(row, "/", o.baseline_mib, "MiB").c_str(), [=](benchmark::State& state) {
        release_timed_case();  // one Vulkan instance at a time (kernels/vulkan/runtime/instance.h)
        std::unique_ptr<DeviceCopyBaseline>& copy = baselines().device_copy[key];
        try {
          if (!copy) copy = make_device_copy_baseline(key, bytes);
        } catch (const Error& e) {
          const std::string why = cat(e.kind() == ErrorKind::unsupported ? "skipped: " : "FAILED: ", e.what());
          if (e.kind() == ErrorKind::unsupported) {
            record_skip(row, e.what());
          } else {
            record_failure(cat(row, ": ", e.what()));
          }
          state.SkipWithError(why.c_str());
          return;
        }
        for (auto _ : state) state.SetIterationTime(copy->copy(method));
        state.SetBytesProcessed(state.iterations() * 2 * copy->bytes());
        state.counters["copied_bytes_per_second"] = benchmark::Counter(
            static_cast<double>(copy->bytes()), benchmark::Counter::kIsIterationInvariantRate);
        state.counters["bytes_per_iter"] = static_cast<double>(2 * copy->bytes());
        state.SetLabel(copy->describe(method));
      });
  b->UseManualTime()->Unit(benchmark::kMillisecond);
  if (o.smoke) {
    b->Iterations(1)->Repetitions(1);
  } else {
    b->MinTime(o.min_time);
  }
}

void register_device_copy_baselines(const SuiteOptions& o, const std::set<std::string>& device_keys) {
  for (const std::string& key : device_keys) {
    for (const DeviceCopyMethod method : {DeviceCopyMethod::command, DeviceCopyMethod::shader}) {
      register_device_copy(o, key, method);
    }
  }
}

// ---- adjacent baselines -------------------------------------------------------------
//
// This machine's bandwidth drifts severalfold within minutes
// (docs/benchmarks.md §How a row is measured), so a ratio over the run-start baseline rows
// says little about a kernel timed minutes later. Each host kernel's run
// therefore samples the read and memcpy baselines right before and right after its timed
// loop (outside it: Google Benchmark times only the loop) over the run-start rows'
// buffers, and records them as plain counters of that repetition; tools/bench_table.py
// divides the repetition's GB/s by them. Not in smoke runs, which must stay fast.
// The read lifts a SIMD backend's target pin for its duration only (sample_baselines), so
// the timed case, pin included, stays for the next repetition. The samples evict the
// caches as the flush does: harmless, each timed call is flushed (or evicts itself) anyway;
// only with --kvlab_flush_mib=0 (hot caches) does it make the first timed call of a run
// start cold, one call among the many a small hot-cache shape times.

BaselineSample sample_adjacent(const SuiteOptions& o) {
  return sample_baselines(lazily(baselines().src, o.baseline_mib), lazily(baselines().dst, o.baseline_mib));
}

// How far the baseline moved across the timed loop, relative to its mean.
double drift(double before, double after) { return std::abs(after - before) / ((before + after) / 2); }

void record_adjacent(benchmark::State& state, const BaselineSample& before, const BaselineSample& after) {
  state.counters["adj_read_gbps"] = (before.read_gbps + after.read_gbps) / 2;
  state.counters["adj_memcpy_gbps"] = (before.memcpy_gbps + after.memcpy_gbps) / 2;
  state.counters["adj_drift"] = std::max(drift(before.read_gbps, after.read_gbps),
                                         drift(before.memcpy_gbps, after.memcpy_gbps));
  // The lower of the two: a drop on either side of the loop may have reached into it.
  state.counters["adj_fma_glanes"] = std::min(before.fma_glanes, after.fma_glanes);
}

// ---- kernels ------------------------------------------------------------------------

std::vector<std::string> default_backends(std::ostream& log) {
  std::vector<std::string> out{"reference"};
  for (const SimdTarget& t : simd_compiled_targets()) {
    if (t.attainable) {
      out.push_back("simd:" + t.name);
    } else {
      log << "note: simd:" << t.name << " not benchmarked: " << t.reason << "\n";
    }
  }
  const VulkanDeviceProbe vulkan = probe_vulkan_device("vulkan");
  if (vulkan.unavailable.empty()) {
    out.push_back("vulkan");
  } else {
    log << "note: vulkan not benchmarked: " << vulkan.unavailable << "\n";
  }
  return out;
}

void run_kernel(benchmark::State& state, const BenchCase& c, const std::string& backend, const SuiteOptions& o) {
  const std::string name = cat(c.problem.op(), "/", backend, "/", c.shape);
  // The host baseline buffers stay alive for the adjacent samples (2 × baseline_mib). The
  // device copy goes: one Vulkan instance at a time, and its device memory would crowd
  // the perf problems (re-made on demand if a baseline runs again, e.g. with interleaving).
  baselines().device_copy.clear();
  TimedCase& tc = acquire_timed_case(name, c.problem, backend);
  if (!tc.failure.empty()) {
    state.SkipWithError(cat("FAILED: ", tc.failure).c_str());
    return;
  }
  if (!tc.skip.empty()) {
    state.SkipWithError(cat("skipped: ", tc.skip).c_str());
    return;
  }
  Traffic t;
  const bool device = is_vulkan_backend(backend);
  std::optional<BaselineSample> before, after;  // adjacent baselines (host rows, not smoke)
  try {
    t = traffic_of(c.problem);
    // A kernel that streams at least the flush size evicts its own data: no flush needed.
    const bool flush_first = o.flush_mib > 0 && t.bytes() < o.flush_mib * kMiB;
    if (device) {
      // Manual time: the device's own time for the call; the flush (a device copy that
      // evicts the device caches) and the host's submission work are not counted.
      if (!tc.clock) tc.clock = make_device_clock(*tc.backend, flush_first ? o.flush_mib * kMiB : 0);
      std::int64_t on_device = 0;
      std::map<std::string, double> pass_seconds;
      for (auto _ : state) {
        tc.clock->flush_caches();
        const DeviceTiming timing = tc.clock->time([&tc] { tc.invoke(); });
        state.SetIterationTime(timing.seconds);
        on_device += timing.on_device ? 1 : 0;
        for (const auto& [pass, seconds] : timing.passes) pass_seconds[pass] += seconds;
      }
      const auto iterations = static_cast<double>(state.iterations());
      state.counters["device_timed"] = static_cast<double>(on_device) / iterations;
      for (const auto& [pass, seconds] : pass_seconds) state.counters["us:" + pass] = seconds / iterations * 1e6;
    } else {
      BigBuffer* flush = flush_first ? &lazily(baselines().flush, o.flush_mib) : nullptr;
      if (!o.smoke) before = sample_adjacent(o);
      // Manual time, the call alone: Google Benchmark's ResumeTiming reads the thread's CPU
      // clock (a system call) inside the timed window, and after the flush that call runs
      // cold (docs/benchmarks.md §How a row is measured).
      for (auto _ : state) {
        if (flush != nullptr) benchmark::DoNotOptimize(streaming_read(*flush, true));
        const auto start = std::chrono::steady_clock::now();
        tc.invoke();
        state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      if (before) after = sample_adjacent(o);
    }
  } catch (const std::exception& e) {
    tc.failure = cat("threw while timed: ", e.what());
    record_failure(cat(name, ": ", tc.failure));
    state.SkipWithError(tc.failure.c_str());
    return;
  }
  if (after) record_adjacent(state, *before, *after);
  state.SetBytesProcessed(state.iterations() * t.bytes());
  state.counters["flops"] = benchmark::Counter(static_cast<double>(t.flops), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes_per_iter"] = static_cast<double>(t.bytes());
  if (!device) state.counters["workers"] = simd::worker_count();
  // What the SIMD decode kernel declared for its last call (simd::last_attention_mix): the
  // roofline's arithmetic floor divides each by the same run's rate (tools/bench_table.py).
  if (backend.rfind("simd", 0) == 0 && (c.problem.op() == "sdpa" || c.problem.op() == "quantized_sdpa")) {
    if (const simd::ArithmeticMix mix = simd::last_attention_mix(); !mix.empty()) {
      state.counters["mix_fma_lanes"] = static_cast<double>(mix.fma);
      state.counters["mix_bf16_dot_lanes"] = static_cast<double>(mix.bf16_dot);
      state.counters["mix_u8_dot_lanes"] = static_cast<double>(mix.u8_dot);
      state.counters["mix_amx_int8_lanes"] = static_cast<double>(mix.amx_int8);
      state.counters["mix_s16_dot_lanes"] = static_cast<double>(mix.s16_dot);
      state.counters["mix_s16_madd_lanes"] = static_cast<double>(mix.s16_madd);
    }
  }
  state.SetLabel(tc.known.empty() ? c.problem.line() : cat(c.problem.line(), " [", tc.known, "]"));
}

}  // namespace

int register_suite(const SuiteOptions& o, std::ostream& log) {
  register_baselines(o);
  const std::vector<std::string> backends = o.backends.empty() ? default_backends(log) : o.backends;
  // One copy baseline per Vulkan device in use; in a default run without a device, one
  // skipped row that records why.
  std::set<std::string> device_keys;
  for (const std::string& b : backends) {
    if (is_vulkan_backend(b)) device_keys.insert(vulkan_device_key(b));
  }
  if (o.backends.empty() && device_keys.empty()) device_keys.insert("vulkan");
  for (const std::string& key : device_keys) {
    const VulkanDeviceProbe probe = probe_vulkan_device(key);
    if (probe.unavailable.empty()) benchmark::AddCustomContext("kvlab_vulkan_device:" + key, probe.description);
  }
  if (!device_keys.empty()) benchmark::AddCustomContext("kvlab_vulkan_clock", vulkan_kernel_clock());
  register_device_copy_baselines(o, device_keys);
  int count = 0;
  // Owned for the program's lifetime: the registered lambdas refer to them.
  static std::vector<std::unique_ptr<BenchCase>> cases;
  for (BenchCase& c : collect(o, log)) {
    cases.push_back(std::make_unique<BenchCase>(std::move(c)));
    const BenchCase* bc = cases.back().get();
    for (const std::string& backend : backends) {
      auto* b = benchmark::RegisterBenchmark(cat(bc->problem.op(), "/", backend, "/", bc->shape).c_str(),
                                             [bc, backend, o](benchmark::State& s) { run_kernel(s, *bc, backend, o); });
      b->UseManualTime();  // the device's time, or the host call's alone (run_kernel)
      b->Unit(benchmark::kMicrosecond);
      if (o.smoke) {
        b->Iterations(1)->Repetitions(1);
      } else if (backend == "reference") {
        b->MinTime(o.reference_min_time);
        if (o.reference_repetitions > 0) b->Repetitions(o.reference_repetitions);
      } else {
        b->MinTime(o.min_time);
      }
      ++count;
    }
  }
  return count;
}

const SuiteOutcome& suite_outcome() { return outcome(); }

void record_failure(const std::string& what) { outcome().failures.push_back(what); }
void record_skip(const std::string& name, const std::string& reason) { outcome().skipped.emplace_back(name, reason); }

namespace {

// The CPU the run measured, for the result file's context ("kvlab_cpu"): the model name
// with its family and model numbers from the first processor of /proc/cpuinfo (Linux),
// since these machines change CPU between sessions and only same-CPU runs compare.
std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, family, model;
  const auto value = [&line] {  // "key<tabs>: value" -> "value"
    const auto at = line.find_first_not_of(" \t", line.find(':') + 1);
    return line.find(':') == std::string::npos || at == std::string::npos ? std::string() : line.substr(at);
  };
  for (int n = 0; n < 64 && std::getline(in, line) && !line.empty(); ++n) {
    if (line.rfind("model name", 0) == 0) name = value();
    else if (line.rfind("cpu family", 0) == 0) family = value();
    else if (line.rfind("model", 0) == 0 && line.find("name") == std::string::npos) model = value();
  }
  if (name.empty()) return "unknown (no model name in /proc/cpuinfo)";
  return family.empty() ? name : name + " (family " + family + ", model " + model + ")";
}

}  // namespace

int run_suite_main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help") std::cout << suite_flags_help() << "\n";
  }
  SuiteOptions o;
  try {
    o = parse_suite_flags(argc, argv);
  } catch (const Error& e) {
    std::cerr << "kvlab_bench: " << e.what() << "\n";
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::AddCustomContext("kvlab_threads", std::to_string(simd::worker_count()));
  benchmark::AddCustomContext("kvlab_tier", o.tier);
  benchmark::AddCustomContext("kvlab_flush_mib", std::to_string(o.flush_mib));
  benchmark::AddCustomContext("kvlab_baseline_mib", std::to_string(o.baseline_mib));
  benchmark::AddCustomContext("kvlab_simd_best_target", simd_current_target());
  benchmark::AddCustomContext("kvlab_cpu", cpu_description());
  try {
    const int n = register_suite(o, std::cerr);
    std::cerr << "kvlab_bench: " << n << " kernel benchmarks, " << simd::worker_count() << " threads, cache flush "
              << o.flush_mib << " MiB\n";
  } catch (const Error& e) {
    std::cerr << "kvlab_bench: " << e.what() << "\n";
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  release_timed_case();
  // Skips grouped by reason (an unwritten kernel skips on every target and shape).
  std::map<std::string, std::pair<int, std::string>> reasons;  // reason -> (count, first benchmark)
  for (const auto& [name, reason] : outcome().skipped) {
    auto& [count, first] = reasons[reason];
    if (count++ == 0) first = name;
  }
  for (const auto& [reason, seen] : reasons) {
    std::cerr << "skipped " << seen.first << "x: " << reason << " (e.g. " << seen.second << ")\n";
  }
  for (const std::string& f : outcome().failures) std::cerr << "FAILED: " << f << "\n";
  std::cerr << "kvlab_bench: " << outcome().failures.size() << " failed, " << outcome().skipped.size()
            << " skipped\n";
  return outcome().failures.empty() ? 0 : 1;
}

}  // namespace kvlab::bench

// kvlab_bench: Google Benchmark suites over the harness's case files.
//
// One benchmark per (perf case line, backend): the reference, the SIMD backend pinned
// to each attainable Highway target, and the Vulkan backend when a device is usable
// (timed on the device by timestamp queries, bench/vulkan_bench.h). Before a benchmark
// is timed its backend is verified once against the reference on the very problem timed
// (harness::run_case); a FAILED or INVALID verification reports an error (SkipWithError)
// and makes the run exit non-zero, a kernel the backend does not implement yet is
// reported as skipped with the reason.
// The memory baselines (streaming read, memcpy; and each Vulkan device's buffer copy) run
// first, in the same process. Outside smoke runs, each host kernel's run also samples the
// pool read and memcpy once right before and once right after its timed loop (untimed),
// because the machine's bandwidth drifts within minutes.
//
// Names are `<op>/<backend>/<shape>` (shape: the parameters the case line writes), the
// label is the full canonical problem line; counters: bytes_per_second (bytes model of
// bench/bytes_model.h), flops, bytes_per_iter, workers (host rows), device_timed (Vulkan
// rows: the fraction of calls timed on the device), and per repetition of a host row
// outside smoke runs adj_read_gbps / adj_memcpy_gbps (mean of the samples before and
// after, 1e9 bytes/s, memcpy credited read + written) and adj_drift (the larger of the two
// baselines' |after - before| / mean). tools/bench_table.py reads the JSON output (table
// of GB/s, % of the adjacent or run-start baselines, speed-up, targets; compare).
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace kvlab::bench {

struct SuiteOptions {
  std::string tier = "perf";                      // smoke | perf | full (tier_roles)
  std::vector<std::filesystem::path> case_files;  // when given, replace the tier's files
  std::vector<std::string> ops;                   // empty: every op with a case file
  std::vector<std::string> backends;              // empty: reference, simd:<each target>, vulkan
  // Streaming read / memcpy buffer size; default default_big_mib(256): twice the
  // largest cache, so the baselines stream from DRAM.
  std::int64_t baseline_mib = 256;
  // Cold caches: before every timed call, a read of this many MiB (untimed) evicts the
  // kernel's data from L1–L3, so the kernel streams from DRAM like the baselines do
  // (default default_big_mib(128)); 0 times hot calls instead (working sets below L3
  // then beat DRAM). A kernel whose bytes model reaches the flush size gets no flush: at
  // twice the last-level cache it evicts itself.
  std::int64_t flush_mib = 128;
  bool smoke = false;                   // one iteration, one repetition per benchmark
  double min_time = 0.2;                // seconds timed per benchmark (baselines, kernels)
  double reference_min_time = 0.05;     // seconds; the oracle is slow at perf shapes
  int reference_repetitions = 1;        // overrides --benchmark_repetitions for the oracle (0: not)
};

// The case-file roles (harness/cases/<op>/<role>) a tier reads: smoke -> smoke, perf ->
// perf, full -> perf + perf_gpu (shapes sized for a real GPU's memory and bandwidth).
// Throws Error(invalid_argument) naming an unknown tier.
std::vector<std::string> tier_roles(const std::string& tier);

// Reads and removes the --kvlab_* flags from argv (the rest is Google Benchmark's).
// Throws kvlab::Error naming an unknown --kvlab_ flag or a bad value.
SuiteOptions parse_suite_flags(int& argc, char** argv);
// max(floor_mib, 2 × the largest cache in MiB): a buffer that no cache level holds. A
// 128 MiB flush and a 256 MiB read left a 128 MiB decode and the baselines partly in the
// 480 MiB L3 of an Intel Xeon (bench/records/2026-11-30-intel-xeon-amx.md).
std::int64_t big_mib(std::int64_t floor_mib, std::int64_t largest_cache_bytes);
std::int64_t default_big_mib(std::int64_t floor_mib);  // this host's largest cache
// The largest CPU cache of this host from /sys/devices/system/cpu/cpu0/cache (0 if unknown).
std::int64_t largest_cache_bytes();
std::string suite_flags_help();

// Registers the baselines and the kernel benchmarks; prints notes (skipped backends,
// ops without case files) to `log`. Returns the number of kernel benchmarks.
int register_suite(const SuiteOptions& options, std::ostream& log);

// What happened to every kernel benchmark of the run.
struct SuiteOutcome {
  std::vector<std::string> failures;  // verification FAILED/INVALID or a kernel error
  std::vector<std::pair<std::string, std::string>> skipped;  // (benchmark, why): unsupported kernel, ...
};
const SuiteOutcome& suite_outcome();

// main(): flags, registration, the run, a summary of failures and skips; returns the
// process exit code (1 when any benchmark failed its verification or threw).
int run_suite_main(int argc, char** argv);

}  // namespace kvlab::bench

// The --kvlab_* flags of kvlab_bench (bench/bench_suite.h).
#include <algorithm>
#include <charconv>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "bench/bench_suite.h"
#include "bench/vulkan_bench.h"
#include "harness/backends.h"
#include "kvlab/error.h"

namespace kvlab::bench {

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The backend list: comma-separated names, where a Vulkan variant's own flags
// ("vulkan:<device>,words,staging", harness/backends.h) stay with it: an item that names
// no backend, after a "vulkan:" item, is one of its flags (a build without Vulkan still
// reads "vulkan..." items as names, so that their rows are skipped with the reason).
std::vector<std::string> split_backends(const std::string& s) {
  std::set<std::string> known;
  for (const harness::BackendEntry& e : harness::backend_entries()) known.insert(e.name);
  std::vector<std::string> out;
  for (std::string& item : split_commas(s)) {
    const bool names_a_backend = known.count(item.substr(0, item.find(':'))) != 0 || is_vulkan_backend(item);
    if (!names_a_backend && !out.empty() && out.back().rfind("vulkan:", 0) == 0) {
      out.back() += "," + item;
    } else {
      out.push_back(std::move(item));
    }
  }
  return out;
}

std::int64_t parse_int(const std::string& flag, const std::string& v, std::int64_t min) {
  std::size_t used = 0;
  std::int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVLAB_REQUIRE(used == v.size() && n >= min, invalid_argument, "--", flag, "=", v, ": expected an integer >= ", min);
  return n;
}

double parse_seconds(const std::string& flag, const std::string& v) {
  std::size_t used = 0;
  double x = -1;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVLAB_REQUIRE(used == v.size() && x > 0, invalid_argument, "--", flag, "=", v, ": expected seconds > 0");
  return x;
}

}  // namespace

std::vector<std::string> tier_roles(const std::string& tier) {
  if (tier == "smoke") return {"smoke"};
  if (tier == "perf") return {"perf"};
  if (tier == "full") return {"perf", "perf_gpu"};
  fail(ErrorKind::invalid_argument, cat("--kvlab_tier=", tier, ": smoke | perf | full"));
}

SuiteOptions parse_suite_flags(int& argc, char** argv) {
  SuiteOptions o;
  std::optional<std::int64_t> baseline, flush;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--kvlab_", 0) != 0) {
      argv[kept++] = argv[i];
      continue;
    }
    const std::size_t eq = arg.find('=');
    const std::string flag = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (flag == "kvlab_tier") {
      tier_roles(value);  // names the bad value
      o.tier = value;
    } else if (flag == "kvlab_cases") {
      for (const std::string& f : split_commas(value)) o.case_files.emplace_back(f);
    } else if (flag == "kvlab_ops") {
      o.ops = split_commas(value);
    } else if (flag == "kvlab_backends") {
      o.backends = split_backends(value);
    } else if (flag == "kvlab_baseline_mib") {
      baseline = parse_int(flag, value, 1);
    } else if (flag == "kvlab_flush_mib") {
      flush = parse_int(flag, value, 0);
    } else if (flag == "kvlab_min_time") {
      o.min_time = parse_seconds(flag, value);
    } else if (flag == "kvlab_reference_min_time") {
      o.reference_min_time = parse_seconds(flag, value);
    } else if (flag == "kvlab_reference_repetitions") {
      o.reference_repetitions = static_cast<int>(parse_int(flag, value, 0));
    } else {
      fail(ErrorKind::invalid_argument, cat("unknown flag --", flag, " (kvlab_bench --help lists them)"));
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  // The smoke tier proves the suites build, run and verify, in seconds: one iteration
  // of each benchmark, small baseline buffers, no cache flush (unless asked for).
  o.smoke = o.tier == "smoke";
  o.baseline_mib = baseline.value_or(o.smoke ? 16 : default_big_mib(256));
  o.flush_mib = flush.value_or(o.smoke ? 0 : default_big_mib(128));
  return o;
}

std::int64_t big_mib(std::int64_t floor_mib, std::int64_t largest_cache_bytes) {
  constexpr std::int64_t kMiB = 1 << 20;
  return std::max(floor_mib, 2 * ((largest_cache_bytes + kMiB - 1) / kMiB));
}

std::int64_t largest_cache_bytes() {
  std::int64_t largest = 0;
  for (int index = 0; index < 16; ++index) {
    std::ifstream in(cat("/sys/devices/system/cpu/cpu0/cache/index", index, "/size"));
    std::string text;
    if (!(in >> text) || text.empty()) continue;
    std::int64_t scale = 1;
    const char unit = text.back();
    if (unit == 'K') scale = std::int64_t{1} << 10;
    if (unit == 'M') scale = std::int64_t{1} << 20;
    if (unit == 'G') scale = std::int64_t{1} << 30;
    if (scale != 1) text.pop_back();
    std::int64_t value = 0;
    const char* end = text.data() + text.size();
    if (std::from_chars(text.data(), end, value).ptr != end || value < 0 || value > (std::int64_t{1} << 40) / scale)
      continue;  // unreadable: ignored, not trusted
    largest = std::max(largest, value * scale);
  }
  return largest;
}

std::int64_t default_big_mib(std::int64_t floor_mib) {
  static const std::int64_t cache = largest_cache_bytes();
  return big_mib(floor_mib, cache);
}

std::string suite_flags_help() {
  return "kvlab_bench flags (besides Google Benchmark's --benchmark_*):\n"
         "  --kvlab_tier=perf|smoke|full     case files to run (default perf; smoke: small shapes, 1 iteration;\n"
         "                                   full: perf plus the perf_gpu files, sized for real GPUs)\n"
         "  --kvlab_cases=FILE[,FILE]        case files instead of the tier's\n"
         "  --kvlab_ops=OP[,OP]              only these ops\n"
         "  --kvlab_backends=B[,B]           default: reference, simd:<each attainable target>, and vulkan\n"
         "                                   when a device is usable; vulkan[:[<device>][,words][,staging]\n"
         "                                   [,validate]] is timed on the device, against its buffer copy\n"
         "  --kvlab_baseline_mib=N           streaming read / memcpy buffers (default the larger of 256\n"
         "                                   and twice the largest CPU cache; smoke 16)\n"
         "  --kvlab_flush_mib=N              untimed read of N MiB before each timed call, evicting the\n"
         "                                   caches (default the larger of 128 and twice the largest CPU\n"
         "                                   cache; smoke 0; 0 = hot-cache timing); Vulkan\n"
         "                                   rows: an untimed device copy touching N MiB\n"
         "  --kvlab_min_time=S               min timed seconds of the baselines and kernels (default 0.2;\n"
         "                                   overrides --benchmark_min_time, whose 0.5 s, spent in\n"
         "                                   calls of ~100 us each with a flush before each, takes minutes)\n"
         "  --kvlab_reference_min_time=S     min time of the reference benchmarks (default 0.05 s)\n"
         "  --kvlab_reference_repetitions=N  repetitions of the reference (default 1; 0 = the flag's)\n"
         "Typical: kvlab_bench --benchmark_repetitions=5 --benchmark_out=r.json --benchmark_out_format=json\n"
         "         tools/bench_table.py table r.json\n"
         "A GPU:   kvlab_bench --kvlab_tier=full --kvlab_backends=vulkan --kvlab_ops=quantized_sdpa,rope \\\n"
         "             --benchmark_repetitions=5 --benchmark_out=gpu.json --benchmark_out_format=json\n";
}

}  // namespace kvlab::bench

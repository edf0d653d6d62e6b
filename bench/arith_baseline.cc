// Arithmetic baseline (arith_baseline.h). The chain kernel is compiled per Highway target
// (foreach_target) and dispatched to the best one, like the SIMD kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/arith_baseline.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvlab::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Twelve independent chains a = a·m + c: more than an FMA's latency (4-5 cycles) times
// the FMA pipes (2), so the loop is bound by FMA throughput, not by one chain's latency.
// Returns the lanes computed, and the chains' sum in `sink` so none is optimized away.
double FmaChains(std::int64_t rounds, float* sink) {
  const hn::ScalableTag<float> d;
  constexpr int kChains = 12;
  hn::Vec<decltype(d)> a[kChains];
  for (int k = 0; k < kChains; ++k) a[k] = hn::Set(d, 1.0f + static_cast<float>(k) * 1e-7f);
  const auto m = hn::Set(d, 0.9999999f), c = hn::Set(d, 1e-7f);
  for (std::int64_t i = 0; i < rounds; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kChains; ++k) a[k] = hn::MulAdd(a[k], m, c);
  }
  auto total = hn::Zero(d);
  for (int k = 0; k < kChains; ++k) total = hn::Add(total, a[k]);
  *sink += hn::GetLane(hn::SumOfLanes(d, total));
  return static_cast<double>(rounds) * kChains * static_cast<double>(hn::Lanes(d));
}

}  // namespace kvlab::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <atomic>
#include <vector>

#include "bench/arith_baseline.h"
#include "kernels/simd/parallel.h"

namespace kvlab::bench {

HWY_EXPORT(FmaChains);

double fma_lanes(std::int64_t rounds, bool use_pool) {
  if (!use_pool) {
    float sink = 0;
    const double lanes = HWY_DYNAMIC_DISPATCH(FmaChains)(rounds, &sink);
    return sink == 12345.0f ? lanes + 1 : lanes;  // the sink is read
  }
  const int workers = simd::worker_count();
  std::vector<float> sinks(static_cast<std::size_t>(workers), 0.0f);
  std::vector<double> lanes(static_cast<std::size_t>(workers), 0.0);
  simd::parallel_for(workers, [&](std::int64_t w) {
    const auto i = static_cast<std::size_t>(w);
    lanes[i] = HWY_DYNAMIC_DISPATCH(FmaChains)(rounds, &sinks[i]);
  });
  double total = 0;
  for (std::size_t i = 0; i < lanes.size(); ++i) total += sinks[i] == 12345.0f ? lanes[i] + 1 : lanes[i];
  return total;
}

}  // namespace kvlab::bench
#endif  // HWY_ONCE

// The traffic and work a kernel call is credited with, per op, written out by hand from
// the op's parameters (never measured, never taken from the buffers a backend happens to
// allocate): the numerator of every GB/s and flop/s figure the benchmarks report.
//
// Bytes are the logical bytes the kernel must read plus the bytes it must write, each
// counted once (a cache-line write-allocate or an extra pass a kernel chooses to make is
// not credited). The memory baselines count the same way (memcpy: read + written), so
// "% of memcpy" compares like with like.
#pragma once

#include <cstdint>
#include <string>

#include "harness/problem.h"

namespace kvlab::bench {

struct Traffic {
  std::int64_t read_bytes = 0;
  std::int64_t write_bytes = 0;
  std::int64_t flops = 0;  // arithmetic the op needs (comparisons, rounding, exp not counted)
  std::int64_t bytes() const { return read_bytes + write_bytes; }
};

// Throws kvlab::Error (invalid_argument) for an op without a model, naming it.
Traffic traffic_of(const harness::Problem& p);

// Whether `op` has a model: every kernel op does. Cache-level ops ("cache": a whole cache
// driven through a command script, many kernels per call) have no single traffic figure
// and are not benchmarked.
bool has_traffic_model(const std::string& op);

}  // namespace kvlab::bench

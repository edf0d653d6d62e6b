// The traffic and work a kernel call is credited with: each harness op's traffic model
// (OpInfo::traffic_model in harness/op.h, defined beside the op's footprint and work in
// harness/ops/<stem>_info.cc, with its derivation), looked up by the problem's op. The
// numerator of every GB/s and flop/s figure the benchmarks report.
#pragma once

#include <string>

#include "harness/op.h"
#include "harness/problem.h"

namespace kvlab::bench {

using Traffic = harness::Traffic;

// Throws kvlab::Error (invalid_argument) for an op without a model, naming it.
Traffic traffic_of(const harness::Problem& p);

// Whether `op` has a model: every kernel op does. Cache-level ops ("cache": a whole cache
// driven through a command script, many kernels per call) have no single traffic figure
// and are not benchmarked.
bool has_traffic_model(const std::string& op);

}  // namespace kvlab::bench

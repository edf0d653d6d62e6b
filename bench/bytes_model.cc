#include "bench/bytes_model.h"

#include "kvlab/error.h"

namespace kvlab::bench {

namespace {

// The model of the harness op named `op`; nullptr for no such op or one without a model.
harness::TrafficModel model_of(const std::string& op) {
  for (const harness::OpInfo* info : harness::all_ops())
    if (info->name() == op) return info->traffic_model();
  return nullptr;
}

}  // namespace

bool has_traffic_model(const std::string& op) { return model_of(op) != nullptr; }

Traffic traffic_of(const harness::Problem& p) {
  const harness::TrafficModel m = model_of(p.op());
  KVLAB_REQUIRE(m != nullptr, invalid_argument, "no traffic model for op '", p.op(),
                "' (OpInfo::traffic_model, harness/ops/)");
  return m(p);
}

}  // namespace kvlab::bench

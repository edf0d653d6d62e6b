// A downstream backend judged by kvlab's harness: kv_gather written here, every other
// kernel forwarded to the reference (kvlab::harness::ForwardingBackend). Prints the
// harness summary; exits non-zero when any case fails.
//   downstream [op ...]   (default: kv_gather rope; the smoke tier of each)
#include <algorithm>
#include <cstddef>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "harness/backends.h"
#include "harness/check.h"
#include "harness/forwarding_backend.h"
#include "kvlab/error.h"
#include "kvlab/host_buffer.h"
#include "reference/kv_move.h"

namespace {

int gathers = 0;  // calls of the override below: proof the harness ran it

class MyBackend final : public kvlab::harness::ForwardingBackend {
 public:
  std::string name() const override { return "downstream"; }

  // A dense (B, H, L, W) block per batch row: dst row i = src row batch_index[i].
  void kv_gather(const kvlab::KvGatherArgs& a) override {
    ++gathers;
    const kvlab::ConstTensorView src = kvlab::host_cview(a.src);
    const kvlab::TensorView dst = kvlab::host_view(a.dst);
    // The oracle's validation (shared by every backend): bad calls fail the same way.
    const kvlab::ref::KvMovePlan plan = kvlab::ref::validate_kv_gather(src, a.batch_index, dst);
    if (plan.src.bytes == 0) return;
    const std::size_t slab = plan.src.bytes / static_cast<std::size_t>(plan.src.B);
    for (std::size_t i = 0; i < plan.indices.size(); ++i) {
      const std::size_t from = static_cast<std::size_t>(plan.indices[i]) * slab;
      for (std::size_t b = 0; b < slab; ++b) dst.data[i * slab + b] = src.data[from + b];
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  kvlab::harness::register_backend({"downstream", "host, this example", "examples/downstream: kv_gather by hand",
                                    [](std::string_view) { return std::make_unique<MyBackend>(); }});
  kvlab::harness::CheckOptions options;
  options.backend = "downstream";
  options.tier = "smoke";
  options.cases_dir = KVLAB_DOWNSTREAM_CASES;
  for (int i = 1; i < argc; ++i) options.ops.emplace_back(argv[i]);
  if (options.ops.empty()) options.ops = {"kv_gather", "rope"};
  try {
    const kvlab::harness::CheckSummary summary = kvlab::harness::run_check(options, std::cout);
    std::cout << "downstream: " << summary.results.size() << " cases, kv_gather override called " << gathers
              << " times: " << (summary.ok ? "ok" : "FAILED") << "\n";
    const bool gathered = gathers > 0 || std::find(options.ops.begin(), options.ops.end(), "kv_gather") == options.ops.end();
    return summary.ok && gathered ? 0 : 1;
  } catch (const kvlab::Error& e) {
    std::cerr << "downstream: " << e.what() << "\n";
    return 2;
  }
}

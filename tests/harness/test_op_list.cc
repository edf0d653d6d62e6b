// The op list (kvlab/op_list.h) is complete: every listed op has its contract in
// reference/<stem>.h and is driven by at least one harness op over the smoke tier, where
// the reference runs it (a reference without the override would leave those cases
// UNIMPLEMENTED); every harness op has a cases folder with the tiers CI runs. A kernel
// added to the list without these fails here, naming what is missing.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <set>
#include <string>

#include "harness/check.h"
#include "harness/op.h"
#include "harness/ops/ops.h"
#include "harness/spine.h"
#include "harness/forwarding_backend.h"
#include "reference/reference_backend.h"

namespace kvlab::harness {
namespace {

namespace fs = std::filesystem;

struct ListedOp {
  const char* name;
  const char* stem;
};
constexpr ListedOp kListed[] = {
#define KVLAB_LISTED(op, Args, stem) {#op, stem},
    KVLAB_OPS(KVLAB_LISTED)
#undef KVLAB_LISTED
};

// Records which ops a run calls, then forwards them to the reference.
class RecordingBackend final : public ForwardingBackend {
 public:
  std::string name() const override { return "recording"; }
#define KVLAB_RECORD(op, Args, stem)   \
  void op(const Args& a) override {    \
    called.insert(#op);                \
    ref_.op(a);                        \
  }
  KVLAB_OPS(KVLAB_RECORD)
#undef KVLAB_RECORD
  std::set<std::string> called;
};

fs::path source_root() { return default_cases_dir().parent_path().parent_path(); }

TEST(OpList, EveryListedOpHasAReferenceContract) {
  for (const ListedOp& op : kListed) {
    const fs::path header = source_root() / "reference" / (std::string(op.stem) + ".h");
    EXPECT_TRUE(fs::is_regular_file(header)) << op.name << ": no reference contract " << header;
  }
}

TEST(OpList, AnUnimplementedOpNamesTheBackendAndTheOp) {
  class Bare final : public HostMemoryBackend {
   public:
    std::string name() const override { return "bare"; }
  } bare;
  const DTensor none;
  try {
    bare.kv_roll({none, {}, none});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::unsupported);
    EXPECT_NE(std::string(e.what()).find("bare does not implement the op kv_roll"), std::string::npos) << e.what();
  }
}

TEST(OpList, EveryHarnessOpHasCasesAndCallsTheKernelOpsItNames) {
  ReferenceBackend reference;
  std::set<std::string> called_by_any;
  for (const OpInfo* op : all_ops()) {
    const fs::path dir = default_cases_dir() / std::string(op->name());
    for (const char* tier : {"smoke", "ci"}) {
      EXPECT_TRUE(fs::is_regular_file(dir / tier)) << op->name() << ": no " << (dir / tier);
    }
    RecordingBackend recording;
    CheckOptions options;
    options.tier = "smoke";
    options.ops = {std::string(op->name())};
    for (const Problem& p : collect_cases(options)) {
      const CaseResult r = run_case(p, recording, reference, {});
      EXPECT_EQ(r.status, Status::passed) << describe(r);
    }
    called_by_any.insert(recording.called.begin(), recording.called.end());
    // The kernel ops KVLAB_HARNESS_OPS says this op drives (harness/ops/ops.h).
    const auto entry = std::find_if(std::begin(ops::kHarnessOps), std::end(ops::kHarnessOps),
                                    [&](const ops::HarnessOpEntry& e) { return e.name == op->name(); });
    ASSERT_NE(entry, std::end(ops::kHarnessOps)) << op->name();
    ops::for_each_named_op(entry->kernel_ops, [&](std::string_view kernel) {
      EXPECT_TRUE(recording.called.count(std::string(kernel)))
          << op->name() << " names " << kernel << " but its smoke cases never call it";
    });
  }
  for (const ListedOp& op : kListed) {
    EXPECT_TRUE(called_by_any.count(op.name)) << op.name << ": no harness op calls it in the smoke tier";
  }
}

}  // namespace
}  // namespace kvlab::harness

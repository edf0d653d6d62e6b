// Unit tests of the reference SDPA's validation (reference/sdpa.h): every invalid call
// throws kvlab::Error of the right kind, and its message names the bad value. The
// numerics are tested in test_sdpa.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kvlab/error.h"
#include "kvlab/ops.h"
#include "kvlab/tensor.h"
#include "reference/sdpa.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_sdpa_invalid {
namespace {

MaskSpec causal(int window = 0, std::vector<std::int32_t> left = {}, std::vector<std::int32_t> right = {}) {
  return MaskSpec{MaskKind::causal, window, std::move(left), std::move(right)};
}

Tensor f32(Shape s) { return Tensor(DType::f32, std::move(s)); }

struct Problem {  // valid as constructed: B 2, Hq 4, Hkv 2, Lq 3, Lk 5, Dk 8, Dv 6
  Tensor q = f32({2, 4, 3, 8}), k = f32({2, 2, 5, 8}), v = f32({2, 2, 5, 6}), out = f32({2, 4, 3, 6});
  AttentionParams params;
  std::optional<Tensor> mask, sinks;
  void run() {
    ConstTensorView m, s;
    if (mask) m = mask->view();
    if (sinks) s = sinks->view();
    ref::sdpa(q.view(), k.view(), v.view(), params, mask ? &m : nullptr, sinks ? &s : nullptr, out.view());
  }
  void mask_of(MaskKind kind, Shape shape, DType dtype = DType::u8) {
    params.mask.kind = kind;
    mask = Tensor(dtype, std::move(shape));
  }
};

struct BadCase {
  const char* what;
  std::function<void(Problem&)> edit;
  ErrorKind kind;
  std::vector<std::string> words;  // each must appear in the message
};

void expect_rejected(const BadCase& c, const std::function<void(Problem&)>& run) {
  SCOPED_TRACE(c.what);
  Problem p;
  c.edit(p);
  try {
    run(p);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), c.kind) << e.what();
    for (const std::string& w : c.words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

constexpr ErrorKind kShape = ErrorKind::shape_mismatch, kDtype = ErrorKind::dtype_mismatch,
                    kArg = ErrorKind::invalid_argument;
using P = Problem;
using M = MaskKind;
using D = DType;
const std::vector<BadCase> kBadCases = {
    {"q rank 3", [](P& p) { p.q = f32({4, 3, 8}); }, kShape, {"q", "rank 3"}},
    {"k rank 5", [](P& p) { p.k = f32({1, 2, 2, 5, 8}); }, kShape, {"k", "rank 5"}},
    {"v rank 2", [](P& p) { p.v = f32({5, 6}); }, kShape, {"v", "rank 2"}},
    {"out rank 3", [](P& p) { p.out = f32({4, 3, 6}); }, kShape, {"out", "rank 3"}},
    {"batch", [](P& p) { p.k = f32({3, 2, 5, 8}), p.v = f32({3, 2, 5, 6}); }, kShape, {"B = 2", "B = 3"}},
    {"Hq % Hkv", [](P& p) { p.k = f32({2, 3, 5, 8}), p.v = f32({2, 3, 5, 6}); }, kShape, {"Hq = 4", "Hkv = 3"}},
    {"k/v heads", [](P& p) { p.v = f32({2, 1, 5, 6}); }, kShape, {"Hkv = 2", "Hkv = 1"}},
    {"k/v keys", [](P& p) { p.v = f32({2, 2, 4, 6}); }, kShape, {"Lk = 5", "Lk = 4"}},
    {"Dk", [](P& p) { p.k = f32({2, 2, 5, 7}); }, kShape, {"Dk = 8", "Dk = 7"}},
    {"k dtype", [](P& p) { p.k = Tensor(D::f16, {2, 2, 5, 8}); }, kDtype, {"k", "f16", "f32"}},
    {"v dtype", [](P& p) { p.v = Tensor(D::bf16, {2, 2, 5, 6}); }, kDtype, {"v", "bf16"}},
    {"out dtype", [](P& p) { p.out = Tensor(D::f16, {2, 4, 3, 6}); }, kDtype, {"out", "f16"}},
    {"q not float", [](P& p) { p.q = Tensor(D::u32, {2, 4, 3, 8}); }, kDtype, {"q", "u32"}},
    {"out shape", [](P& p) { p.out = f32({2, 4, 3, 5}); }, kShape, {"(2, 4, 3, 5)", "(2, 4, 3, 6)"}},
    {"Lk 0", [](P& p) { p.k = f32({2, 2, 0, 8}), p.v = f32({2, 2, 0, 6}); }, kArg, {"Lk = 0"}},
    {"Lq 0", [](P& p) { p.q = f32({2, 4, 0, 8}), p.out = f32({2, 4, 0, 6}); }, kArg, {"Lq = 0"}},
    {"Dv 0", [](P& p) { p.v = f32({2, 2, 5, 0}), p.out = f32({2, 4, 3, 0}); }, kArg, {"Dv = 0"}},
    {"B 0", [](P& p) { p.q = f32({0, 4, 3, 8}); }, kArg, {"B = 0"}},
    {"boolean, no array", [](P& p) { p.params.mask.kind = M::boolean; }, kArg, {"boolean", "none was given"}},
    {"additive, no array", [](P& p) { p.params.mask.kind = M::additive; }, kArg, {"additive", "none was given"}},
    {"array, kind none", [](P& p) { p.mask_of(M::none, {1, 1, 3, 5}); }, kArg, {"kind none"}},
    {"array, kind causal", [](P& p) { p.mask_of(M::causal, {1, 1, 3, 5}); }, kArg, {"kind causal"}},
    {"mask rank 2", [](P& p) { p.mask_of(M::boolean, {3, 5}); }, kShape, {"mask", "rank 2"}},
    {"mask B 3", [](P& p) { p.mask_of(M::boolean, {3, 1, 3, 5}); }, kShape, {"(3, 1, 3, 5)"}},
    {"mask over Hkv", [](P& p) { p.mask_of(M::boolean, {1, 2, 3, 5}); }, kShape, {"(1, 2, 3, 5)"}},
    {"mask Lq", [](P& p) { p.mask_of(M::boolean, {1, 1, 2, 5}); }, kShape, {"(1, 1, 2, 5)"}},
    {"mask Lk", [](P& p) { p.mask_of(M::additive, {2, 4, 3, 6}, D::f32); }, kShape, {"(2, 4, 3, 6)"}},
    {"bool mask f32", [](P& p) { p.mask_of(M::boolean, {1, 1, 3, 5}, D::f32); }, kDtype, {"boolean mask", "f32", "u8"}},
    {"additive mask u8", [](P& p) { p.mask_of(M::additive, {1, 1, 3, 5}); }, kDtype, {"additive mask", "u8"}},
    {"left pads", [](P& p) { p.params.mask = causal(0, {0}); }, kShape, {"left_padding", "1 entries", "batch size 2"}},
    {"right pads", [](P& p) { p.params.mask = causal(0, {}, {0, 0, 0}); }, kShape, {"right_padding", "3 entries"}},
    {"negative padding", [](P& p) { p.params.mask = causal(0, {0, -1}); }, kArg, {"-1"}},
    {"negative window", [](P& p) { p.params.mask = causal(-2); }, kArg, {"window -2"}},
    {"window, kind none", [](P& p) { p.params.mask.window = 4; }, kArg, {"window 4"}},
    {"sinks length", [](P& p) { p.sinks = f32({2}); }, kShape, {"sinks", "(2,)", "(4,)"}},
    {"sinks rank 2", [](P& p) { p.sinks = f32({1, 4}); }, kShape, {"sinks", "(1, 4)"}},
    {"sinks dtype", [](P& p) { p.sinks = Tensor(D::u32, {4}); }, kDtype, {"sinks", "u32"}},
    {"softcap < 0", [](P& p) { p.params.softcap = -1.0f; }, kArg, {"softcap = -1"}},
    {"softcap nan", [](P& p) { p.params.softcap = NAN; }, kArg, {"softcap = nan"}},
    {"softcap inf", [](P& p) { p.params.softcap = INFINITY; }, kArg, {"softcap = inf"}},
    {"scale nan", [](P& p) { p.params.scale = NAN; }, kArg, {"scale = nan"}},
    {"scale -inf", [](P& p) { p.params.scale = -INFINITY; }, kArg, {"scale = -inf"}},
};

TEST(SdpaInvalid, EveryBadInputIsNamed) {
  Problem ok;
  EXPECT_NO_THROW(ok.run());
  for (const BadCase& c : kBadCases) expect_rejected(c, [](P& p) { p.run(); });
  for (const BadCase& c : kBadCases) {  // the Tensor overload, which allocates out itself
    if (std::string(c.what).starts_with("out")) continue;
    expect_rejected(c, [](P& p) {
      ref::sdpa(p.q, p.k, p.v, p.params, p.mask ? &*p.mask : nullptr, p.sinks ? &*p.sinks : nullptr);
    });
  }
}

TEST(SdpaInvalid, NegativeOrMissingViewDimensions) {
  Problem p;
  const ConstTensorView bad_q{p.q.data(), DType::f32, {2, 4, -3, 8}}, no_data{nullptr, DType::f32, p.k.shape()};
  using Case = std::tuple<ConstTensorView, ConstTensorView, const char*>;
  for (const auto& [q, k, word] : {Case{bad_q, p.k.view(), "Lq = -3"}, Case{p.q.view(), no_data, "no data"}}) {
    try {
      ref::sdpa(q, k, p.v.view(), p.params, nullptr, nullptr, p.out.view());
      ADD_FAILURE() << "no error for " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace test_sdpa_invalid
}  // namespace kvlab

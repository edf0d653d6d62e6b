// Unit tests of QuantSpec (MLX's validation table, docs/quantization.md §Format table, and the
// shapes it implies) and of kvlab::Error / KVLAB_REQUIRE, the error vocabulary every other check
// relies on.
//
// The validation table is re-typed here from docs/quantization.md §Format table rather than read
// from the code, and
// the whole (mode, bits, group) grid around it is probed, so a wrongly accepted entry
// (bits 7, group 48 — MLX rejects both) fails as surely as a wrongly rejected one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/dtype.h"
#include "kvlab/error.h"
#include "kvlab/quant_spec.h"
#include "tests/unit/test_util.h"

namespace kvlab {
// Its own namespace: the test files of one executable share a unity TU in the CI builds.
namespace test_core_quant_spec {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr QuantMode kModes[] = {QuantMode::affine, QuantMode::mxfp4, QuantMode::mxfp8, QuantMode::nvfp4, QuantMode::q8_0,
                                QuantMode::q4_0,   QuantMode::q4_1,  QuantMode::q5_0,  QuantMode::q5_1,  QuantMode::iq4_nl};

// docs/quantization.md §Format table, row by row, with MLX 0.32.4's 1-bit affine (the real library
// wins).
bool spec_allows(QuantMode m, int bits, int group) {
  switch (m) {
    case QuantMode::affine:
      return std::set<int>{32, 64, 128}.count(group) == 1 && std::set<int>{1, 2, 3, 4, 5, 6, 8}.count(bits) == 1;
    case QuantMode::mxfp4: return group == 32 && bits == 4;
    case QuantMode::mxfp8: return group == 32 && bits == 8;
    case QuantMode::nvfp4: return group == 16 && bits == 4;
    // ggml's blocks (docs/quantization.md §ggml block formats): 32 elements, one width each.
    case QuantMode::q8_0: return group == 32 && bits == 8;
    case QuantMode::q4_0:
    case QuantMode::q4_1:
    case QuantMode::iq4_nl: return group == 32 && bits == 4;
    case QuantMode::q5_0:
    case QuantMode::q5_1: return group == 32 && bits == 5;
  }
  return false;
}

using testing::error_message;

// The message names the number n as a whole word (so "bits 1" is not satisfied by "128").
std::string names(int n) { return ".*(^|[^0-9-])" + std::to_string(n) + "([^0-9]|$).*"; }

// ---- validation --------------------------------------------------------------------------

TEST(QuantSpecValidate, AcceptsExactlyTheSpecTable) {
  int accepted = 0;
  for (QuantMode m : kModes) {
    for (int bits = 1; bits <= 16; ++bits) {
      for (int group : {8, 16, 32, 48, 64, 96, 128, 256}) {
        SCOPED_TRACE(::testing::Message() << quant_mode_name(m) << " bits " << bits << " group " << group);
        const QuantSpec s{m, bits, group};
        if (spec_allows(m, bits, group)) {
          ++accepted;
          EXPECT_NO_THROW(s.validate());
          EXPECT_EQ(QuantSpec::make(m, bits, group), s);
        } else {
          EXPECT_THROW(s.validate(), Error);
          EXPECT_THROW(QuantSpec::make(m, bits, group), Error);
        }
      }
    }
  }
  EXPECT_EQ(accepted, 3 * 7 + 3 + 6);  // guards the grid itself: every table entry was visited
}

TEST(QuantSpecValidate, ZeroAndNegativeAreRejected) {
  for (QuantMode m : kModes) {
    for (int v : {0, -4, std::numeric_limits<int>::min()}) {
      EXPECT_THROW((QuantSpec{m, v, 32}.validate()), Error) << quant_mode_name(m) << " bits " << v;
      EXPECT_THROW((QuantSpec{m, 4, v}.validate()), Error) << quant_mode_name(m) << " group " << v;
    }
  }
}

TEST(QuantSpecValidate, DefaultsFromMakeAreMlxs) {
  EXPECT_EQ(QuantSpec::make(QuantMode::affine), (QuantSpec{QuantMode::affine, 4, 64}));
  EXPECT_EQ(QuantSpec::make(QuantMode::mxfp4), (QuantSpec{QuantMode::mxfp4, 4, 32}));
  EXPECT_EQ(QuantSpec::make(QuantMode::mxfp8), (QuantSpec{QuantMode::mxfp8, 8, 32}));
  EXPECT_EQ(QuantSpec::make(QuantMode::nvfp4), (QuantSpec{QuantMode::nvfp4, 4, 16}));
  // overrides replace only what they name
  EXPECT_EQ(QuantSpec::make(QuantMode::affine, 8), (QuantSpec{QuantMode::affine, 8, 64}));
  EXPECT_EQ(QuantSpec::make(QuantMode::affine, std::nullopt, 128), (QuantSpec{QuantMode::affine, 4, 128}));
  // the aggregate's own defaults are the affine defaults
  EXPECT_EQ(QuantSpec{}, QuantSpec::make(QuantMode::affine));
}

TEST(QuantSpecValidate, MessagesNameTheBadBitsOrGroup) {
  const auto msg = [](QuantMode m, std::optional<int> bits, std::optional<int> group) {
    return error_message([&] { QuantSpec::make(m, bits, group); }, ErrorKind::invalid_argument);
  };
  // bits 7, 0 and 16: MLX 0.32.4 rejects them (it accepts 1-bit affine, measured with
  // mx.quantize; MLX's older sources predate it: ml-explore/mlx#3161)
  EXPECT_NO_THROW(QuantSpec::make(QuantMode::affine, 1, 64));
  for (int bits : {0, 7, 16}) {
    const std::string m = msg(QuantMode::affine, bits, 64);
    EXPECT_THAT(m, HasSubstr("bits"));
    EXPECT_THAT(m, MatchesRegex(names(bits))) << m;
  }
  for (int group : {48, 16, 256}) {
    const std::string m = msg(QuantMode::affine, 4, group);
    EXPECT_THAT(m, HasSubstr("group"));
    EXPECT_THAT(m, MatchesRegex(names(group))) << m;
  }
  // fp modes: an override that is legal for affine is not legal for them
  EXPECT_THAT(msg(QuantMode::mxfp4, 8, std::nullopt), MatchesRegex(names(8)));
  EXPECT_THAT(msg(QuantMode::mxfp8, std::nullopt, 64), MatchesRegex(names(64)));
  EXPECT_THAT(msg(QuantMode::nvfp4, std::nullopt, 32), MatchesRegex(names(32)));
  // the mode is named too, since the same bits are legal in another mode
  EXPECT_THAT(msg(QuantMode::nvfp4, 8, std::nullopt), HasSubstr("nvfp4"));
}

TEST(QuantSpecValidate, ModeOutsideTheEnumIsAnError) {
  const auto bogus = static_cast<QuantMode>(42);  // e.g. a corrupt header byte
  EXPECT_THAT(error_message([&] { (QuantSpec{bogus, 4, 64}).validate(); }, ErrorKind::invalid_argument),
              MatchesRegex(names(42)));
}

// ---- shapes ------------------------------------------------------------------------------

// Every valid spec, every D = k·group for k in 1..9: packed words hold exactly D·bits bits
// (no padding, no remainder) and there are D/group scale groups.
TEST(QuantSpecShapes, PackedWordsAndGroupsForValidD) {
  for (QuantMode m : kModes) {
    for (int bits = 1; bits <= 8; ++bits) {
      for (int group : {16, 32, 64, 128}) {
        if (!spec_allows(m, bits, group)) continue;
        const QuantSpec s{m, bits, group};
        for (std::int64_t k = 1; k <= 9; ++k) {
          const std::int64_t d = k * group;
          SCOPED_TRACE(to_string(s) + " D=" + std::to_string(d));
          ASSERT_EQ(d * bits % 32, 0);  // docs/quantization.md §Format table shapes are exact for every table entry
          EXPECT_EQ(s.packed_words(d) * 32, d * bits);
          EXPECT_EQ(s.groups(d) * group, d);
          EXPECT_NO_THROW(s.validate_dim(d));
        }
      }
    }
  }
  // Llama-3-style head dim: 128 at 4 bits = 16 words, 2 groups of 64
  EXPECT_EQ(QuantSpec::make(QuantMode::affine).packed_words(128), 16);
  EXPECT_EQ(QuantSpec::make(QuantMode::affine).groups(128), 2);
  EXPECT_EQ(QuantSpec::make(QuantMode::affine, 3, 32).packed_words(96), 9);
}

TEST(QuantSpecShapes, DNotAMultipleOfTheGroupIsAnErrorNamingBoth) {
  for (QuantSpec s : {QuantSpec::make(QuantMode::affine), QuantSpec::make(QuantMode::nvfp4),
                      QuantSpec::make(QuantMode::affine, 3, 128)}) {
    for (std::int64_t d : {std::int64_t{s.group_size} / 2, std::int64_t{s.group_size} * 3 + 8, std::int64_t{1}}) {
      SCOPED_TRACE(to_string(s) + " D=" + std::to_string(d));
      for (auto call : {+[](const QuantSpec& q, std::int64_t x) { (void)q.packed_words(x); },
                        +[](const QuantSpec& q, std::int64_t x) { (void)q.groups(x); },
                        +[](const QuantSpec& q, std::int64_t x) { q.validate_dim(x); }}) {
        const std::string m = error_message([&] { call(s, d); }, ErrorKind::invalid_argument);
        EXPECT_THAT(m, MatchesRegex(names(static_cast<int>(d))));
        EXPECT_THAT(m, MatchesRegex(names(s.group_size)));
      }
    }
  }
}

TEST(QuantSpecShapes, NonPositiveDIsAnErrorNamingIt) {
  const QuantSpec s = QuantSpec::make(QuantMode::affine);
  for (std::int64_t d : {0, -64, -1}) {
    EXPECT_THAT(error_message([&] { (void)s.packed_words(d); }, ErrorKind::invalid_argument),
                MatchesRegex(names(static_cast<int>(d))));
    EXPECT_THAT(error_message([&] { (void)s.groups(d); }, ErrorKind::invalid_argument),
                MatchesRegex(names(static_cast<int>(d))));
  }
}

TEST(QuantSpecShapes, InvalidSpecIsRejectedBeforeTheShape) {
  const QuantSpec bad{QuantMode::affine, 7, 64};
  EXPECT_THAT(error_message([&] { (void)bad.packed_words(128); }, ErrorKind::invalid_argument), HasSubstr("7"));
  EXPECT_THAT(error_message([&] { (void)bad.bits_per_element(DType::f16); }, ErrorKind::invalid_argument),
              HasSubstr("7"));
}

// docs/design.md §Errors: never UB on user input. D = 2^62 is a multiple of every group size and
// its packed width 2^62·8/32 = 2^60 fits int64, but computing D·bits first overflows (signed
// overflow: UB; in practice the result wraps to 0). Expect the exact answer or an Error.
TEST(QuantSpecShapes, HugeDDoesNotOverflow) {
  const QuantSpec s = QuantSpec::make(QuantMode::affine, 8, 64);
  const std::int64_t d = std::int64_t{1} << 62;
  try {
    EXPECT_EQ(s.packed_words(d), std::int64_t{1} << 60);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::invalid_argument) << e.what();
  }
  EXPECT_EQ(s.groups(d), std::int64_t{1} << 56);
}

// bits + (bits of scale [+ bias]) / group: the storage cost that cache-size reports use.
TEST(QuantSpecShapes, BitsPerElement) {
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::affine, 4, 64).bits_per_element(DType::f16), 4.0 + 32.0 / 64);
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::affine, 4, 64).bits_per_element(DType::f16), 4.5);
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::affine, 4, 64).bits_per_element(DType::bf16), 4.5);
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::affine, 8, 64).bits_per_element(DType::f16), 8.5);
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::affine, 4, 64).bits_per_element(DType::f32), 5.0);  // 2·32/64
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::affine, 2, 32).bits_per_element(DType::f16), 3.0);  // 2·16/32
  // fp modes: one u8 scale per group whatever the input dtype, and no biases
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::mxfp4).bits_per_element(DType::f16), 4.25);
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::mxfp4).bits_per_element(DType::f32), 4.25);
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::mxfp8).bits_per_element(DType::bf16), 8.25);
  EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::nvfp4).bits_per_element(DType::f16), 4.5);  // 8/16
  // ggml: block bytes · 8 / 32 whatever the input dtype (34, 18, 20, 22, 24, 18 bytes)
  for (DType in : {DType::f32, DType::f16, DType::bf16}) {
    EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::q8_0).bits_per_element(in), 8.5);
    EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::q4_0).bits_per_element(in), 4.5);
    EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::q4_1).bits_per_element(in), 5.0);
    EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::q5_0).bits_per_element(in), 5.5);
    EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::q5_1).bits_per_element(in), 6.0);
    EXPECT_DOUBLE_EQ(QuantSpec::make(QuantMode::iq4_nl).bits_per_element(in), 4.5);
  }
}

TEST(QuantSpecShapes, ScalesAndBiasesFollowTheMode) {
  for (DType in : {DType::f32, DType::f16, DType::bf16}) {
    EXPECT_TRUE(QuantSpec::make(QuantMode::affine).has_biases());
    EXPECT_EQ(QuantSpec::make(QuantMode::affine).scale_dtype(in), in);  // scales in the input dtype
    for (QuantMode m : {QuantMode::mxfp4, QuantMode::mxfp8, QuantMode::nvfp4}) {
      EXPECT_FALSE(QuantSpec::make(m).has_biases());
      EXPECT_EQ(QuantSpec::make(m).scale_dtype(in), DType::u8);  // E8M0 / E4M3 bytes
    }
    for (QuantMode m : {QuantMode::q8_0, QuantMode::q4_0, QuantMode::q4_1, QuantMode::q5_0, QuantMode::q5_1,
                        QuantMode::iq4_nl}) {
      EXPECT_EQ(QuantSpec::make(m).scale_dtype(in), DType::f16);  // ggml's ggml_half d (and m)
      EXPECT_EQ(QuantSpec::make(m).has_biases(), m == QuantMode::q4_1 || m == QuantMode::q5_1);
    }
  }
}

// ---- names -------------------------------------------------------------------------------

TEST(QuantSpecNames, ToStringFormat) {
  EXPECT_EQ(to_string(QuantSpec::make(QuantMode::affine)), "affine:b4:g64");
  EXPECT_EQ(to_string(QuantSpec::make(QuantMode::affine, 3, 128)), "affine:b3:g128");
  EXPECT_EQ(to_string(QuantSpec::make(QuantMode::mxfp4)), "mxfp4:b4:g32");
  EXPECT_EQ(to_string(QuantSpec::make(QuantMode::mxfp8)), "mxfp8:b8:g32");
  EXPECT_EQ(to_string(QuantSpec::make(QuantMode::nvfp4)), "nvfp4:b4:g16");
}

TEST(QuantSpecNames, ModeAndRoundingNamesRoundTrip) {
  const std::pair<QuantMode, const char*> modes[] = {
      {QuantMode::affine, "affine"}, {QuantMode::mxfp4, "mxfp4"},
      {QuantMode::mxfp8, "mxfp8"},   {QuantMode::nvfp4, "nvfp4"}, {QuantMode::q8_0, "q8_0"},
      {QuantMode::q4_0, "q4_0"},     {QuantMode::q4_1, "q4_1"},   {QuantMode::q5_0, "q5_0"},
      {QuantMode::q5_1, "q5_1"},     {QuantMode::iq4_nl, "iq4_nl"}};
  for (const auto& [m, name] : modes) {
    EXPECT_EQ(quant_mode_name(m), name);
    EXPECT_EQ(quant_mode_from_name(name), m);
  }
  EXPECT_EQ(rounding_name(Rounding::mlx_cpu), "mlx_cpu");
  EXPECT_EQ(rounding_name(Rounding::mlx_gpu), "mlx_gpu");
  EXPECT_EQ(rounding_from_name("mlx_cpu"), Rounding::mlx_cpu);
  EXPECT_EQ(rounding_from_name("mlx_gpu"), Rounding::mlx_gpu);
}

TEST(QuantSpecNames, UnknownNamesAreErrorsNamingThem) {
  for (const char* name : {"int4", "Affine", "mxfp6", "nvfp8", "affine "}) {
    EXPECT_THAT(error_message([&] { quant_mode_from_name(name); }, ErrorKind::invalid_argument), HasSubstr(name));
  }
  for (const char* name : {"cpu", "MLX_CPU", "mlx_metal", "mlx_cuda"}) {
    EXPECT_THAT(error_message([&] { rounding_from_name(name); }, ErrorKind::invalid_argument), HasSubstr(name));
  }
  EXPECT_THROW(quant_mode_from_name(""), Error);
  EXPECT_THROW(rounding_from_name(""), Error);
}

// ---- Error -------------------------------------------------------------------------------

constexpr ErrorKind kKinds[] = {ErrorKind::invalid_argument, ErrorKind::shape_mismatch, ErrorKind::dtype_mismatch,
                                ErrorKind::unsupported,      ErrorKind::misuse,         ErrorKind::io,
                                ErrorKind::corrupt,          ErrorKind::device,         ErrorKind::internal};

TEST(ErrorType, KeepsKindAndPrefixesItsNameToTheMessage) {
  std::set<std::string> seen;
  for (ErrorKind k : kKinds) {
    const std::string name(error_kind_name(k));
    EXPECT_TRUE(seen.insert(name).second) << "duplicate kind name " << name;
    const Error e(k, "bits 7 is bad");
    EXPECT_EQ(e.kind(), k);
    EXPECT_THAT(e.what(), HasSubstr(name));
    EXPECT_THAT(e.what(), HasSubstr("bits 7 is bad"));
    const std::runtime_error& base = e;  // catchable as a standard exception
    EXPECT_STREQ(base.what(), e.what());
  }
  // the names a log reader greps for
  EXPECT_EQ(error_kind_name(ErrorKind::invalid_argument), "invalid_argument");
  EXPECT_EQ(error_kind_name(ErrorKind::shape_mismatch), "shape_mismatch");
  EXPECT_EQ(error_kind_name(ErrorKind::internal), "internal");
}

TEST(ErrorType, FailThrowsTheKind) {
  for (ErrorKind k : kKinds) {
    try {
      fail(k, "boom");
      ADD_FAILURE() << "fail() returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), k);
      EXPECT_THAT(e.what(), HasSubstr("boom"));
    }
  }
}

TEST(ErrorType, CatConcatenatesStreamables) {
  EXPECT_EQ(cat("D ", 100, " group ", 64, ' ', 2.5, std::string(" x")), "D 100 group 64 2.5 x");
}

TEST(ErrorType, RequireThrowsOnlyWhenFalseAndBuildsTheMessageLazily) {
  int evaluated = 0;
  const auto part = [&] {
    ++evaluated;
    return 42;
  };
  EXPECT_NO_THROW(KVLAB_REQUIRE(1 + 1 == 2, misuse, "value ", part()));
  EXPECT_EQ(evaluated, 0) << "message parts were built although the condition held";
  try {
    KVLAB_REQUIRE(1 + 1 == 3, corrupt, "value ", part(), " in ", "header");
    ADD_FAILURE() << "KVLAB_REQUIRE(false) did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::corrupt);
    EXPECT_THAT(e.what(), HasSubstr("value 42 in header"));
  }
  EXPECT_EQ(evaluated, 1);
  // the do/while(false) wrapper makes it a single statement: safe in an unbraced if/else
  bool took_else = false;
  if (false)
    KVLAB_REQUIRE(false, internal, "unreachable");
  else
    took_else = true;
  EXPECT_TRUE(took_else);
}

}  // namespace
}  // namespace test_core_quant_spec
}  // namespace kvlab

// Helpers of the SIMD backend tests: run a body once per attainable Highway target
// (forced with ScopedSimdTarget), printing each skipped target and why; and compare
// the error a call raises on two backends.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <iostream>
#include <cctype>
#include <string>

#include "kernels/simd/simd_backend.h"
#include "kvlab/error.h"

namespace kvlab::testing {

// Runs body(target) for every attainable target; returns how many ran (>= 1 expected).
inline int for_each_simd_target(const std::function<void(const std::string&)>& body) {
  int ran = 0;
  for (const SimdTarget& t : simd_compiled_targets()) {
    if (!t.attainable) {
      static bool printed = false;  // once per process is enough for the log
      if (!printed) std::cout << "[ skipped  ] SIMD target " << t.name << ": " << t.reason << "\n";
      continue;
    }
    ScopedSimdTarget force(t.name);
    SCOPED_TRACE("SIMD target " + t.name);
    EXPECT_EQ(SimdBackend().name(), "simd:" + t.name);  // the force really redirects dispatch
    body(t.name);
    ++ran;
  }
  EXPECT_GE(ran, 1);
  return ran;
}

struct Thrown {
  bool threw = false;
  ErrorKind kind = ErrorKind::internal;
  std::string message;
};

// Messages may name buffer addresses ("0x55…"), which differ between two allocations:
// each hex literal becomes "0x?". (Not std::regex: GCC 12 -O1 with sanitizers reports a
// false -Wmaybe-uninitialized inside <regex>.)
inline std::string without_addresses(const std::string& m) {
  std::string out;
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (m[i] == '0' && i + 1 < m.size() && m[i + 1] == 'x') {
      out += "0x?";
      i += 2;
      while (i < m.size() && std::isxdigit(static_cast<unsigned char>(m[i]))) ++i;
      --i;
      continue;
    }
    out += m[i];
  }
  return out;
}

inline Thrown thrown_by(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return {true, e.kind(), without_addresses(e.what())};
  }
  return {};
}

// Both calls must throw a kvlab::Error of the same kind with the same message.
inline void expect_same_error(const std::function<void()>& reference, const std::function<void()>& simd,
                              const std::string& what) {
  const Thrown a = thrown_by(reference), b = thrown_by(simd);
  EXPECT_TRUE(a.threw) << what << ": the reference accepted it";
  EXPECT_TRUE(b.threw) << what << ": the SIMD backend accepted it";
  EXPECT_EQ(error_kind_name(a.kind), error_kind_name(b.kind)) << what;
  EXPECT_EQ(a.message, b.message) << what;
}

}  // namespace kvlab::testing

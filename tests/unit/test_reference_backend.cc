#include <gtest/gtest.h>

// Placeholder until this stem's tests land.
TEST(Placeholder_reference_backend, Pending) { GTEST_SKIP() << "tests for reference_backend not written yet"; }

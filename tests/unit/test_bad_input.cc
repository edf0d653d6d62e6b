#include <gtest/gtest.h>

// Placeholder until this stem's tests land.
TEST(Placeholder_bad_input, Pending) { GTEST_SKIP() << "tests for bad_input not written yet"; }

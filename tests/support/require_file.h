#pragma once
// A test that needs a file made by the set-up (an exported model, a
// ../shared fixture) fails when it is missing, naming the file and what
// makes it: a skip would let a checkout without it pass vacuously, and hide
// the regression the test guards (issue #45). ctest runs the exporters as
// fixtures first (tests/CMakeLists.txt, FIXTURES_SETUP), so in the suite a
// missing file is itself a failure of the set-up.

#include <filesystem>

#include <gtest/gtest.h>

/// Fails the current test, and returns from it, when `path` (anything a
/// std::filesystem::path is made from) does not exist. Use at the top level
/// of a TEST body (gtest's FAIL() returns from the enclosing function).
#define OOMTUNE_REQUIRE_FILE(path)                                                                  \
  do {                                                                                              \
    if (!std::filesystem::exists(path))                                                             \
      FAIL() << (path) << " is missing: ./setup.sh exports the models (examples/export_models.py, " \
             << "tests/core/make_test_models.py) and ../shared holds the fixtures";                 \
  } while (0)

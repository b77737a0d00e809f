#pragma once
// The check of every gradient test: a strategy (activation checkpointing,
// a different thread for backward) must not change a parameter's gradient
// against an unmodified run of the same model with the same seed.

#include <map>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace oomtune::testing {

/// Parameter name to its gradient (undefined where it got none).
using Gradients = std::map<std::string, at::Tensor>;

/// Expects `actual` to name the parameters of `expected`, both to hold a
/// gradient for each, and those to agree at rtol = atol = `tolerance`
/// (at::allclose); a failure names the parameter and the largest absolute
/// difference.
inline void expect_same_gradients(const Gradients& expected, const Gradients& actual, double tolerance = 1e-5) {
  ASSERT_EQ(expected.size(), actual.size());
  for (const auto& [name, grad] : expected) {
    SCOPED_TRACE(name);
    const auto other = actual.find(name);
    ASSERT_NE(other, actual.end()) << "no such parameter in the second run";
    ASSERT_TRUE(grad.defined()) << "no gradient in the unmodified run";
    ASSERT_TRUE(other->second.defined()) << "no gradient in the modified run";
    EXPECT_TRUE(at::allclose(other->second, grad, tolerance, tolerance))
        << "max abs diff " << (other->second - grad).abs().max().item<double>();
  }
}

}  // namespace oomtune::testing

// Adafactor against a reference written here element by element in double
// precision from the paper's algorithm (Shazeer & Stern 2018, Algorithms 4
// and 5 with beta1 = 0, update clipping d = clip_threshold, and
// transformers' choices: beta2_t = 1 - t^-0.8, eps1 added to g^2,
// decoupled weight decay scaled by lr), and its state bytes against the
// shapes' arithmetic.

#include "strategies/adafactor.h"

#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune {
namespace {

// One parameter of shape [layers, rows, cols] (layers = 1 and rows = 1
// for a vector: then unfactored) and its reference state.
struct Reference {
  int64_t layers, rows, cols;
  bool factored;
  std::vector<double> p, row, col, v;

  Reference(int64_t l, int64_t r, int64_t c, bool f, const at::Tensor& init)
      : layers(l), rows(r), cols(c), factored(f), row(l * r), col(l * c), v(l * r * c) {
    const at::Tensor flat = init.to(at::kDouble).contiguous().view({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) p.push_back(flat[i].item<double>());
  }

  void step(const at::Tensor& grad_tensor, int64_t t, double lr, double weight_decay) {
    const at::Tensor flat = grad_tensor.to(at::kDouble).contiguous().view({-1});
    std::vector<double> g(p.size()), u(p.size()), update(p.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      g[i] = flat[static_cast<int64_t>(i)].item<double>();
      u[i] = g[i] * g[i] + 1e-30;
    }
    const double beta2 = 1 - std::pow(static_cast<double>(t), -0.8);
    const auto at_index = [&](int64_t l, int64_t r, int64_t c) { return (l * rows + r) * cols + c; };
    if (factored) {
      for (int64_t l = 0; l < layers; ++l) {
        for (int64_t r = 0; r < rows; ++r) {
          double mean = 0;
          for (int64_t c = 0; c < cols; ++c) mean += u[at_index(l, r, c)] / static_cast<double>(cols);
          row[l * rows + r] = beta2 * row[l * rows + r] + (1 - beta2) * mean;
        }
        for (int64_t c = 0; c < cols; ++c) {
          double mean = 0;
          for (int64_t r = 0; r < rows; ++r) mean += u[at_index(l, r, c)] / static_cast<double>(rows);
          col[l * cols + c] = beta2 * col[l * cols + c] + (1 - beta2) * mean;
        }
        double row_mean = 0;
        for (int64_t r = 0; r < rows; ++r) row_mean += row[l * rows + r] / static_cast<double>(rows);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            const double v_hat = row[l * rows + r] / row_mean * col[l * cols + c];
            update[at_index(l, r, c)] = g[at_index(l, r, c)] / std::sqrt(v_hat);
          }
      }
    } else {
      for (std::size_t i = 0; i < g.size(); ++i) {
        v[i] = beta2 * v[i] + (1 - beta2) * u[i];
        update[i] = g[i] / std::sqrt(v[i]);
      }
    }
    double squares = 0;
    for (double x : update) squares += x * x;
    const double scale = std::max(1.0, std::sqrt(squares / static_cast<double>(update.size())) / 1.0);
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] -= lr * weight_decay * p[i];
      p[i] -= lr * update[i] / scale;
    }
  }
};

void expect_close(const at::Tensor& actual, const Reference& expected) {
  const at::Tensor flat = actual.to(at::kDouble).contiguous().view({-1});
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(expected.p.size()));
  for (int64_t i = 0; i < flat.numel(); ++i)
    EXPECT_NEAR(flat[i].item<double>(), expected.p[static_cast<std::size_t>(i)], 1e-5) << "element " << i;
}

TEST(Adafactor, MatchesTheAlgorithmOnMatricesStacksAndVectors) {
  at::manual_seed(7);
  at::Tensor matrix = at::randn({3, 4}).set_requires_grad(true);
  at::Tensor stack = at::randn({2, 3, 5}).set_requires_grad(true);
  at::Tensor vector = at::randn({6}).set_requires_grad(true);
  Reference matrix_ref(1, 3, 4, true, matrix), stack_ref(2, 3, 5, true, stack), vector_ref(1, 1, 6, false, vector);
  const double lr = 0.01, weight_decay = 0.1;
  Adafactor opt({matrix, stack, vector}, AdafactorOptions(lr).weight_decay(weight_decay));
  for (int64_t t = 1; t <= 3; ++t) {
    // Gradients of different scales: large ones engage update clipping.
    const double scale = t == 2 ? 100.0 : 1.0;
    matrix.mutable_grad() = at::randn({3, 4}) * scale;
    stack.mutable_grad() = at::randn({2, 3, 5}) * scale;
    vector.mutable_grad() = at::randn({6}) * scale;
    matrix_ref.step(matrix.grad(), t, lr, weight_decay);
    stack_ref.step(stack.grad(), t, lr, weight_decay);
    vector_ref.step(vector.grad(), t, lr, weight_decay);
    opt.step();
  }
  expect_close(matrix, matrix_ref);
  expect_close(stack, stack_ref);
  expect_close(vector, vector_ref);
}

TEST(Adafactor, StateIsARowAndAColumnPerMatrix) {
  // Linear(1024 -> 512): weight [512, 1024], bias [512]; a [4, 8, 16] stack.
  at::Tensor weight = at::zeros({512, 1024}).set_requires_grad(true);
  at::Tensor bias = at::zeros({512}).set_requires_grad(true);
  at::Tensor stack = at::zeros({4, 8, 16}).set_requires_grad(true);
  const int64_t expected = 4 * (512 + 1024) + 4 * 512 + 4 * (4 * 8 + 4 * 16);
  EXPECT_EQ(Adafactor::expected_state_bytes({weight, bias, stack}), expected);
  Adafactor opt({weight, bias, stack});
  EXPECT_EQ(opt.state_bytes(), 0);  // state is made at the first step
  for (at::Tensor* p : {&weight, &bias, &stack}) p->mutable_grad() = at::ones_like(*p);
  opt.step();
  EXPECT_EQ(opt.state_bytes(), expected);
  // AdamW would hold 8 bytes per parameter: 4.2 MB here against 8.6 kB.
  EXPECT_LT(opt.state_bytes() * 400, 8 * (512 * 1024 + 512));
}

TEST(Adafactor, InvalidOptionsAndParametersAreConfigErrors) {
  const std::vector<at::Tensor> params = {at::zeros({2, 2}).set_requires_grad(true)};
  EXPECT_THROW(Adafactor(params, AdafactorOptions(-1)), ConfigError);
  EXPECT_THROW(Adafactor(params, AdafactorOptions().eps(-1)), ConfigError);
  EXPECT_THROW(Adafactor(params, AdafactorOptions().clip_threshold(0)), ConfigError);
  EXPECT_THROW(Adafactor(params, AdafactorOptions().decay_rate(0.5)), ConfigError);
  EXPECT_THROW(Adafactor(params, AdafactorOptions().weight_decay(-0.1)), ConfigError);
  at::Tensor wide = at::zeros({2, 2}, at::kDouble).set_requires_grad(true);
  wide.mutable_grad() = at::ones_like(wide);
  Adafactor opt({wide});
  EXPECT_THROW(opt.step(), ConfigError);
}

}  // namespace
}  // namespace oomtune

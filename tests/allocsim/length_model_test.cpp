// LengthModel (allocsim/length_model.h): the sizes of a step's requests as
// polynomials in the sequence length, fitted from hand-made steps whose
// formulas are known.

#include "allocsim/length_model.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune::allocsim {
namespace {

AllocEvent op(AllocEvent e, const char* name) {
  e.op = name;
  return e;
}

// A block of attention in miniature, at batch 2, hidden 64, 4 heads, fp32:
// the projection output 2·T·64·4 bytes, the scores 2·4·T²·4 bytes plus a
// 64-byte header, a gradient of a 4 KiB weight carried out to the next step,
// and the free of the previous step's gradient (id 999, made before it).
LengthSample attention_step(int64_t t, bool with_scores = true) {
  LengthSample s;
  s.length = t;
  s.events.push_back(op(alloc_event(1, 2 * t * 64 * 4), "aten::linear"));
  if (with_scores) s.events.push_back(op(alloc_event(2, 2 * 4 * t * t * 4 + 64), "aten::matmul"));
  s.events.push_back(free_event(999));
  s.events.push_back(op(alloc_event(3, 4096), "aten::mm"));
  if (with_scores) s.events.push_back(free_event(2));
  s.events.push_back(free_event(1));
  return s;
}

TEST(LengthModel, ThreeLengthsGiveEachRequestsFormula) {
  const LengthModel model = LengthModel::fit({attention_step(128), attention_step(256), attention_step(512)});
  EXPECT_EQ(model.coefficients(0), (std::array<double, 3>{0, 512, 0}));
  EXPECT_EQ(model.coefficients(1), (std::array<double, 3>{64, 0, 32}));
  EXPECT_EQ(model.coefficients(3), (std::array<double, 3>{4096, 0, 0}));
  EXPECT_TRUE(model.quadratic());
  ASSERT_EQ(model.quadratic_requests().size(), 1u);
  EXPECT_EQ(model.quadratic_requests()[0].second, "aten::matmul");
  // A length the fit did not see, against the formulas.
  const std::vector<AllocEvent> at1024 = model.at(1024);
  EXPECT_EQ(at1024[0].bytes, 2 * 1024 * 64 * 4);
  EXPECT_EQ(at1024[1].bytes, 2 * 4 * 1024 * 1024 * 4 + 64);
  EXPECT_EQ(at1024[3].bytes, 4096);
  EXPECT_EQ(model.carried_in(), 1u);
  EXPECT_EQ(model.carried_out(), 1u);
}

TEST(LengthModel, NoQuadraticTermWithoutAttention) {
  const LengthModel model =
      LengthModel::fit({attention_step(100, false), attention_step(300, false), attention_step(700, false)});
  EXPECT_FALSE(model.quadratic());
  EXPECT_TRUE(model.quadratic_requests().empty());
  EXPECT_EQ(model.at(2000)[0].bytes, 2 * 2000 * 64 * 4);
}

TEST(LengthModel, TwoLengthsFitALine) {
  const LengthModel model = LengthModel::fit({attention_step(64, false), attention_step(32, false)});
  EXPECT_EQ(model.at(48)[0].bytes, 2 * 48 * 64 * 4);
  EXPECT_EQ(model.lengths(), (std::vector<int64_t>{32, 64}));
}

TEST(LengthModel, AFourthLengthThatNoQuadraticFitsIsAnError) {
  LengthSample odd = attention_step(1024);
  odd.events[1].bytes += 4096;  // not 32·T² + 64 at T = 1024
  try {
    LengthModel::fit({attention_step(128), attention_step(256), attention_step(512), odd});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("event 1 (aten::matmul)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a polynomial of degree <= 2"), std::string::npos) << e.what();
  }
}

TEST(LengthModel, StepsThatDifferAreNotOneStep) {
  EXPECT_THROW(LengthModel::fit({attention_step(128), attention_step(256, false)}), InputError);
  LengthSample swapped = attention_step(256);
  std::swap(swapped.events[4], swapped.events[5]);  // the projection is freed before the scores
  try {
    LengthModel::fit({attention_step(128), swapped});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("event 0 (aten::linear) differs between T=128 and T=256 (freed elsewhere)"),
              std::string::npos)
        << e.what();
  }
}

TEST(LengthModel, OneLengthIsNotEnough) {
  EXPECT_THROW(LengthModel::fit({attention_step(128), attention_step(128)}), InputError);
  EXPECT_THROW(LengthModel::fit({}), InputError);
  EXPECT_THROW(LengthModel::fit({attention_step(0), attention_step(4)}), InputError);
  const LengthModel model = LengthModel::fit({attention_step(1), attention_step(2)});
  EXPECT_THROW(model.at(0), InputError);
}

}  // namespace
}  // namespace oomtune::allocsim

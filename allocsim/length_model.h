#pragma once
// One training step's allocations as functions of the sequence length T, fitted
// from the same step recorded at two or more lengths (issue #47, item 2).
//
// A language model's step makes the same allocations in the same order at
// every length; only their sizes change: embeddings, projections and MLP
// activations grow with B·T, eager attention's scores and softmax outputs
// with B·heads·T², weights, gradients and optimizer state not at all. So each
// request is bytes(T) = c0 + c1·T + c2·T², and three lengths fix the three
// coefficients of every request exactly; a fourth checks them.
//
// Rules:
// - The samples must have the same structure: the same number of events, the
//   same kind at each index, and each free naming the alloc at the same index
//   (or, for all of them, an allocation made before the step). A difference is
//   an InputError naming the first event that differs.
// - Fitted with two lengths: linear (c2 = 0). With three or more: quadratic,
//   then every sample must be reproduced to the byte; c2 is kept only where
//   it is not zero (quadratic() says whether any request needs it).
// - A free of an allocation made before the step ("carried in") and an
//   allocation the step does not free ("carried out": gradients kept for the
//   next step) are the step's carries; replay_lengths (length_replay.h) frees
//   step k's carried-out allocations at step k+1's carried-in frees, in order.
// No libtorch.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "allocsim/alloc_event.h"

namespace oomtune::allocsim {

/// One step's events recorded at one sequence length.
struct LengthSample {
  int64_t length = 0;              ///< COUNT: tokens per sequence (T)
  std::vector<AllocEvent> events;  ///< the step's allocs and frees, in order
};

/// A step whose request sizes are polynomials of degree <= 2 in T.
class LengthModel {
 public:
  /// Where a free's allocation was made: this step's alloc at `alloc_index`,
  /// or before the step (kCarriedIn).
  static constexpr std::size_t kCarriedIn = static_cast<std::size_t>(-1);

  /// Fits the model. `samples`: the same step at >= 2 distinct lengths, in
  /// any order. Throws InputError: fewer than two distinct lengths, a length
  /// < 1, structures that differ (names the event index and its operator), a
  /// free of an id neither made in the step nor carried in consistently, or,
  /// with >= 3 lengths, a request that no quadratic reproduces to the byte
  /// ("event I (OP): BYTES bytes at T=L, the fit gives F").
  static LengthModel fit(const std::vector<LengthSample>& samples);

  /// The step at length `length` (>= 1): the template's events, with each
  /// alloc's bytes = round(c0 + c1·T + c2·T²), at least 0. Ids, order, phase
  /// and operator are those of the first sample. Throws InputError for
  /// length < 1.
  std::vector<AllocEvent> at(int64_t length) const;

  /// Whether some request grows with T² (attention scores in eager
  /// attention; none in a model without attention).
  bool quadratic() const;

  /// The requests that grow with T², largest c2 first: (event index, operator).
  std::vector<std::pair<std::size_t, std::string>> quadratic_requests() const;

  /// BYTES: the coefficients {c0, c1, c2} of event `index` (zeros for a free).
  const std::array<double, 3>& coefficients(std::size_t index) const { return coefficients_.at(index); }

  /// For each event: the index of the alloc a free releases (kCarriedIn for
  /// one made before the step); for an alloc, the index of the free that
  /// releases it in the step, or kCarriedIn when it is carried out.
  const std::vector<std::size_t>& partners() const { return partners_; }

  /// The template's events (at the first sample's length).
  const std::vector<AllocEvent>& events() const { return events_; }

  /// COUNT: allocations carried out of each step (freed in the next).
  std::size_t carried_out() const;

  /// COUNT: frees of allocations made before the step.
  std::size_t carried_in() const;

  /// The distinct lengths the model was fitted from, ascending.
  const std::vector<int64_t>& lengths() const { return lengths_; }

 private:
  std::vector<AllocEvent> events_;
  std::vector<std::size_t> partners_;
  std::vector<std::array<double, 3>> coefficients_;
  std::vector<int64_t> lengths_;
};

}  // namespace oomtune::allocsim

#include "allocsim/interchangeable_allocations.h"

#include <vector>

#include <gtest/gtest.h>

#include "allocsim/caching_allocator_sim.h"

namespace oomtune::allocsim {
namespace {

std::vector<std::uint64_t> ids(const std::vector<AllocEvent>& events) {
  std::vector<std::uint64_t> out;
  for (const AllocEvent& e : events) out.push_back(e.id);
  return out;
}

// The ids of `events` after order_interchangeable_allocations.
std::vector<std::uint64_t> reordered_ids(std::vector<AllocEvent> events) {
  order_interchangeable_allocations(events);
  return ids(events);
}

std::vector<int64_t> orders(const std::vector<AllocEvent>& events) {
  std::vector<int64_t> out;
  for (const AllocEvent& e : events) out.push_back(e.order);
  return out;
}

// native_batch_norm_backward as two CPU kernels run it: grad_input (id 1)
// first, or grad_weight and grad_bias (2, 3) first; then a 2048-byte block
// of the next operator, and grad_input is freed before the other two.
std::vector<AllocEvent> batch_norm_backward(bool grad_input_first) {
  std::vector<AllocEvent> events;
  if (grad_input_first) {
    events = {alloc_event(1, 8192), alloc_event(2, 8192), alloc_event(3, 8192)};
  } else {
    events = {alloc_event(2, 8192), alloc_event(3, 8192), alloc_event(1, 8192)};
  }
  for (AllocEvent& e : events) e.call = 7;  // one kernel call made all three
  events.push_back(alloc_event(4, 2048));
  events.back().call = 8;
  events.push_back(free_event(1));
  events.push_back(free_event(3));
  events.push_back(free_event(2));
  for (std::size_t i = 0; i < events.size(); ++i) events[i].order = static_cast<int64_t>(10 * i);
  return events;
}

TEST(InterchangeableAllocations, EqualSizesMadeTogetherTakeTheOrderOfTheirFrees) {
  for (bool grad_input_first : {true, false}) {
    SCOPED_TRACE(grad_input_first);
    std::vector<AllocEvent> events = batch_norm_backward(grad_input_first);
    order_interchangeable_allocations(events);
    // Freed 1, then 3, then 2; the 2048-byte block and the frees stay.
    EXPECT_EQ(ids(events), (std::vector<std::uint64_t>{1, 3, 2, 4, 1, 3, 2}));
    EXPECT_EQ(orders(events), (std::vector<int64_t>{0, 10, 20, 30, 40, 50, 60}));
  }
}

// The allocations of `ids`, each of `bytes`, all made by kernel call `call`.
std::vector<AllocEvent> made_by(std::uint64_t call, const std::vector<std::uint64_t>& ids, int64_t bytes) {
  std::vector<AllocEvent> events;
  for (std::uint64_t id : ids) {
    events.push_back(alloc_event(id, bytes));
    events.back().call = call;
  }
  return events;
}

TEST(InterchangeableAllocations, AFreeBetweenTwoAllocationsSeparatesThem) {
  // 2 is made after 1's free: reusing its memory is open to 2 alone.
  std::vector<AllocEvent> events = made_by(5, {1, 9}, 4096);
  events.push_back(free_event(1));
  events.push_back(made_by(5, {2}, 4096).front());
  events.push_back(free_event(2));
  events.push_back(free_event(9));
  EXPECT_EQ(reordered_ids(events), ids(events));
}

TEST(InterchangeableAllocations, NeverFreedOnesFollowTheFreedInTheirOwnOrder) {
  std::vector<AllocEvent> events = made_by(5, {1, 2, 3}, 512);
  events.push_back(made_by(5, {4}, 1024).front());
  events.push_back(free_event(3));
  EXPECT_EQ(reordered_ids(events), (std::vector<std::uint64_t>{3, 1, 2, 4, 3}));
}

// Hugging Face GPT-2's bf16 forward on an H200: aten::add's 2 MiB output
// (kept for backward) and then aten::mul's (freed at once), no free between
// them. Two calls: the program made them in this order on every device.
TEST(InterchangeableAllocations, TwoCallsKeepTheProgramsOrder) {
  std::vector<AllocEvent> events = made_by(11, {1}, 2 << 20);
  events.push_back(made_by(12, {2}, 2 << 20).front());
  events.push_back(free_event(2));
  events.push_back(free_event(1));
  EXPECT_EQ(reordered_ids(events), ids(events));
}

TEST(InterchangeableAllocations, AllocationsOfAnUnknownCallStayWhereTheyAre) {
  std::vector<AllocEvent> events = {alloc_event(1, 512), alloc_event(2, 512), free_event(2), free_event(1)};
  EXPECT_EQ(reordered_ids(events), ids(events));
  // Within one call the same allocations swap.
  for (std::size_t i = 0; i < 2; ++i) events[i].call = 3;
  EXPECT_EQ(reordered_ids(events), (std::vector<std::uint64_t>{2, 1, 2, 1}));
}

TEST(InterchangeableAllocations, TheReplayNoLongerDependsOnTheKernelsOrder) {
  std::vector<AllocEvent> a = batch_norm_backward(true), b = batch_norm_backward(false);
  order_interchangeable_allocations(a);
  order_interchangeable_allocations(b);
  EXPECT_EQ(ids(a), ids(b));
  const SimResult ra = replay(a, SimOptions{}), rb = replay(b, SimOptions{});
  EXPECT_EQ(ra.peak_reserved_bytes, rb.peak_reserved_bytes);
  EXPECT_EQ(ra.num_device_alloc, rb.num_device_alloc);
}

}  // namespace
}  // namespace oomtune::allocsim

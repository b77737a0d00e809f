// The runs of a sequence repeating with a period (diagnose/period_runs.h),
// on strings whose runs are read off by hand: a run lists the positions j
// where s[j] == s[j - period].

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "diagnose/period_runs.h"

namespace oomtune::diagnose {
namespace {

struct Found {
  size_t begin;
  size_t end;
  bool operator==(const Found& o) const { return begin == o.begin && end == o.end; }
};

std::vector<Found> runs(const std::string& s, size_t period, size_t first = 0) {
  std::vector<Found> found;
  for_each_period_run(
      first, s.size(), period, [&](size_t a, size_t b) { return s[a] == s[b]; },
      [&](PeriodRun r) {
        found.push_back({r.begin, r.end});
      });
  return found;
}

Found ending(const std::string& s, size_t period, size_t first = 0) {
  const PeriodRun r = period_run_ending_at(first, s.size(), period, [&](size_t a, size_t b) { return s[a] == s[b]; });
  return {r.begin, r.end};
}

TEST(PeriodRuns, EachMaximalRunOnce) {
  // "abcabcab", "x", "abab": period 3 holds at 3..7 and at 9..10 (the "ab"
  // after x repeats the one at 6), period 2 at 11..12.
  const std::string s = "abcabcabxabab";
  EXPECT_EQ(runs(s, 3), (std::vector<Found>{{3, 8}, {9, 11}}));
  EXPECT_EQ(runs(s, 2), (std::vector<Found>{{11, 13}}));
  // Period 1: the two equal neighbours nowhere.
  EXPECT_TRUE(runs(s, 1).empty());
  EXPECT_EQ(runs("aaxaaa", 1), (std::vector<Found>{{1, 2}, {4, 6}}));
}

TEST(PeriodRuns, TheRepeatingElementsStartOnePeriodBeforeTheRun) {
  const std::string s = "xyzabcabcabc";
  const std::vector<Found> r = runs(s, 3);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].begin - 3, 3u);             // "abc" at 3 is the first period
  EXPECT_EQ(r[0].end - r[0].begin + 3, 9u);  // nine elements repeat
  EXPECT_EQ(s.substr(r[0].begin - 3), "abcabcabc");
}

TEST(PeriodRuns, PositionsBeforeFirstAreNotCompared) {
  // With first = 3 the comparisons start at 3 + 2 = 5: "ab" at 0..1 is not read.
  EXPECT_EQ(runs("ababxabab", 2), (std::vector<Found>{{2, 4}, {7, 9}}));
  EXPECT_EQ(runs("ababxabab", 2, 3), (std::vector<Found>{{7, 9}}));
  EXPECT_EQ(runs("ababxabab", 2, 5), (std::vector<Found>{{7, 9}}));
  EXPECT_TRUE(runs("ababxabab", 2, 7).empty());
}

TEST(PeriodRuns, NoneForAPeriodOfZeroOrLongerThanTheSequence) {
  EXPECT_TRUE(runs("aaaa", 0).empty());
  EXPECT_TRUE(runs("ab", 2).empty());
  EXPECT_TRUE(runs("ab", 5).empty());
  EXPECT_TRUE(runs("", 1).empty());
}

TEST(PeriodRuns, TheRunEndingAtTheEndIsTheLastOne) {
  const std::string s = "ababxcdcdcd";
  EXPECT_EQ(ending(s, 2), (Found{7, 11}));
  EXPECT_EQ(runs(s, 2).back(), ending(s, 2));
  // The last element differs from the one a period before: empty at the end.
  EXPECT_EQ(ending("ababx", 2), (Found{5, 5}));
  // first bounds it: comparisons at first + period and after only.
  EXPECT_EQ(ending(s, 2, 6), (Found{8, 11}));
  EXPECT_EQ(ending("aaaa", 1), (Found{1, 4}));
  EXPECT_EQ(ending("aaaa", 0), (Found{4, 4}));
}

}  // namespace
}  // namespace oomtune::diagnose

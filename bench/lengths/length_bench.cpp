// Variable sequence lengths through the caching-allocator simulator (issue
// #47, item 2): the reserved/allocated ratio of 100 steps at lengths drawn
// uniformly from 256–1024, against the same model at one fixed length (the
// baseline, in the same run), with expandable segments, and padded to
// buckets. The step is a GPT-2-small-shaped eager fp32 step at batch 8
// (gpt_step.h); its LengthModel is fitted from the generator at three lengths
// and checked at a fourth, as a probe at three lengths would be.
//
// Measured on an H100 (issue #47): a GPT of ~135 M parameters at batch 8,
// uniform 256–1024, reserved 15.8 GiB for 8.9 GiB allocated (1.77×); a
// fixed length near 1.05×. This reproduces the shape of that effect, not its
// numbers: the step here is synthetic.
//
// Usage: length_bench [STEPS] [SEED]; run.sh builds and runs it.

#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "allocsim/length_replay.h"
#include "common/byte_size.h"
#include "gpt_step.h"
#include "job/length_distribution.h"

namespace {

using namespace oomtune;
using namespace oomtune::allocsim;

void print_run(const std::string& name, const LengthRun& run, double padded, double baseline_ratio) {
  fmt::print("{:<30} {:>12} {:>12} {:>8.3f} {:>10.3f} {:>9} {:>8} {:>8.3f}\n", name,
             format_bytes(run.totals.peak_reserved_bytes), format_bytes(run.totals.peak_allocated_bytes),
             run.reserved_over_allocated(), run.reserved_over_allocated() / baseline_ratio, run.totals.num_device_alloc,
             run.totals.num_alloc_retries, padded);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 100;
  const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 47;
  const bench::GptShape shape;
  try {
    std::vector<LengthSample> samples;
    for (int64_t t : {256, 512, 1024}) samples.push_back({t, bench::gpt_step_events(shape, t)});
    const LengthModel model = LengthModel::fit(samples);
    const std::vector<AllocEvent> check = model.at(768), truth = bench::gpt_step_events(shape, 768);
    for (std::size_t i = 0; i < truth.size(); ++i)
      if (check[i].bytes != truth[i].bytes) {
        fmt::print(stderr, "length_bench: the model misses event {} at T=768\n", i);
        return 1;
      }
    const std::vector<int64_t> persistent = [&] {
      std::vector<int64_t> bytes = bench::gpt_parameter_bytes(shape);
      const std::size_t n = bytes.size();
      for (std::size_t k = 0; k < 2 * n; ++k) bytes.push_back(bytes[k % n]);  // AdamW exp_avg, exp_avg_sq
      return bytes;
    }();
    fmt::print("GPT step: batch {}, hidden {}, {} layers, {} heads, vocab {}; {} events per step, {} grow with T²\n",
               shape.batch, shape.hidden, shape.layers, shape.heads, shape.vocab, model.events().size(),
               model.quadratic_requests().size());
    const std::vector<int64_t> drawn = draw_lengths(LengthDistribution::uniform(256, 1024), steps, seed);
    double mean = 0;
    for (int64_t t : drawn) mean += static_cast<double>(t);
    mean /= static_cast<double>(drawn.size());
    fmt::print("{} steps, lengths uniform in [256, 1024] (seed {}), mean {:.0f}\n\n", steps, seed, mean);
    fmt::print("{:<30} {:>12} {:>12} {:>8} {:>10} {:>9} {:>8} {:>8}\n", "run", "reserved", "allocated", "res/all",
               "vs fixed", "cudaMalloc", "retries", "tokens");
    const LengthRun fixed = replay_lengths(model, persistent, std::vector<int64_t>(drawn.size(), 1024), {});
    const double baseline = fixed.reserved_over_allocated();
    print_run("fixed 1024 (baseline)", fixed, 1024.0 / mean, baseline);
    const std::vector<LengthPolicy> policies = compare_length_policies(model, persistent, drawn, {}, {64, 256});
    for (const LengthPolicy& p : policies) print_run(p.name, p.run, p.padded_tokens_ratio, baseline);
    fmt::print("\nrecommended: {}\n", recommended_policy(policies).name);
  } catch (const std::exception& e) {
    fmt::print(stderr, "length_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}

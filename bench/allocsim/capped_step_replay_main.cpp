// capped_step_replay: a validation tool, not a benchmark. Replays step-events
// files (`oomtune probe --step-events`, scripts/eager_peaks.py
// --step-events) through the caching-allocator simulator under caps, their
// transient requests (cuDNN's workspaces) giving way where the cap leaves no
// room, as PyTorch's convolutions do (allocsim/capped_step_replay.h).
//
// Usage:
//   capped_step_replay FILE... [--persistent-from FILE] [--cap BYTES]...
//                      [--granularity BYTES]
// Per file, one line each: its requests and transient requests; reserved
// without a cap, as recorded and without its transient requests; each --cap
// (e.g. 1700MiB), whether the step runs and what gave way; the smallest cap
// that runs it. --persistent-from takes the persistent allocations from
// another file (eager_peaks.py's files have none: an oomtune run of the same
// job holds the same weights and optimizer state). Exit 2 with one line on
// bad input. docs/validation.md, "cuDNN's workspaces under a cap".

#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "allocsim/capped_step_replay.h"
#include "allocsim/step_events_json.h"
#include "common/byte_size.h"
#include "common/error.h"

namespace {

using namespace oomtune;
using namespace oomtune::allocsim;

// MiB with two decimals: the figures docs/validation.md's tables give.
std::string mib(int64_t bytes) { return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / kMiB); }

int64_t bytes_option(const std::string& text) {
  const std::optional<int64_t> bytes = parse_byte_size(text);
  if (!bytes || *bytes < 0) throw InputError(fmt::format("'{}' is not a byte size (e.g. 1700MiB)", text));
  return *bytes;
}

void report(const std::string& path, StepEvents step, const std::vector<int64_t>& caps, int64_t granularity) {
  const std::vector<bool> transient = transient_requests(step.events);
  int64_t requests = 0, transients = 0;
  StepEvents lasting{{}, step.persistent_bytes};
  for (size_t i = 0; i < step.events.size(); ++i) {
    if (step.events[i].kind == AllocEventKind::kAlloc) ++requests;
    if (transient[i]) {
      ++transients;
      continue;
    }
    lasting.events.push_back(step.events[i]);
  }
  std::printf("%s: %lld requests (%lld transient), %zu persistent allocations\n", path.c_str(),
              static_cast<long long>(requests), static_cast<long long>(transients), step.persistent_bytes.size());
  std::printf("  no cap: %s reserved as recorded, %s without the transient requests\n",
              mib(replay_capped_step(step, 0).peak_reserved_bytes).c_str(),
              mib(replay_capped_step(lasting, 0).peak_reserved_bytes).c_str());
  for (const int64_t cap : caps) {
    const CappedStepReplay r = replay_capped_step(step, cap);
    std::printf("  cap %s: %s, %s reserved at most, %lld transient requests gave way (%s asked), %lld cache flushes\n",
                mib(cap).c_str(),
                r.ran ? "runs" : fmt::format("fails at a {} lasting request", mib(r.failed_request_bytes)).c_str(),
                mib(r.peak_reserved_bytes).c_str(), static_cast<long long>(r.given_way), mib(r.given_way_bytes).c_str(),
                static_cast<long long>(r.cache_flushes));
  }
  const int64_t smallest = smallest_running_cap(step, granularity);
  std::printf("  smallest cap that runs it: %s (%lld transient requests give way there)\n", mib(smallest).c_str(),
              static_cast<long long>(replay_capped_step(step, smallest).given_way));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Replays step-events files under allocator caps, transient requests giving way"};
  std::vector<std::string> files, cap_texts;
  std::string persistent_from, granularity_text = "2MiB";
  app.add_option("files", files, "step-events files")->required();
  app.add_option("--persistent-from", persistent_from, "take the persistent allocations from this file");
  app.add_option("--cap", cap_texts, "a cap to replay under (e.g. 1700MiB); repeatable");
  app.add_option("--granularity", granularity_text, "the smallest cap's step (default 2MiB)");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<int64_t> caps;
    for (const std::string& text : cap_texts) caps.push_back(bytes_option(text));
    const int64_t granularity = bytes_option(granularity_text);
    if (granularity == 0) throw InputError("--granularity must be above 0");
    std::vector<int64_t> persistent;
    if (!persistent_from.empty()) persistent = read_step_events(persistent_from).persistent_bytes;
    for (const std::string& path : files) {
      StepEvents step = read_step_events(path);
      if (!persistent_from.empty()) step.persistent_bytes = persistent;
      report(path, std::move(step), caps, granularity);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "capped_step_replay: %s\n", e.what());
    return 2;
  }
  return 0;
}

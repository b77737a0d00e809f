// `oomtune diagnose SNAPSHOT.pickle [--compare B.pickle] [--json] [--svg FILE] [--top N] [--group-by layer|call]
// [--device N]`:
// reads a PyTorch memory snapshot, explains the out-of-memory and what to
// change; with --compare, what changed from SNAPSHOT to B and why.
// Thin: the analysis is diagnose/ (a library), the output its renderers.

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "commands.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file_magic.h"
#include "common/gzip_file.h"
#include "common/toml_table.h"
#include "diagnose/compare.h"
#include "diagnose/diagnosis.h"
#include "diagnose/render.h"
#include "diagnose/snapshot.h"
#include "diagnose/snapshot_file.h"

namespace oomtune {
namespace {

struct DiagnoseArgs {
  std::string snapshot;
  bool json = false;
  std::string svg;
  int top = 10;
  std::string group_by = "layer";
  std::string compare;  // B.pickle: compare SNAPSHOT (A, before) with it (B, after)
  std::string device;   // "N" or "cuda:N"; empty: DiagnoseOptions::device's choice
};

// "1" or "cuda:1" -> 1; "" -> -1 (diagnose chooses); anything else: nullopt.
std::optional<int> device_index(const std::string& text) {
  if (text.empty()) return -1;
  const std::string_view digits = std::string_view(text).substr(text.rfind("cuda:", 0) == 0 ? 5 : 0);
  int index = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || index < 0) return std::nullopt;
  return index;
}

// A job spec or a plan given where a snapshot belongs: named for what it is,
// with the commands that read it, as probe and emit name theirs (a TOML
// file is no pickle; a text that is no TOML is left to the pickle reader).
void reject_oomtune_toml(const std::string& path, std::string_view head) {
  constexpr std::streamsize kLargestSpec = 1 << 20;  // job specs and plans are a few KiB
  if (head.empty() || head.front() == '\x80') return;
  std::ifstream file(path, std::ios::binary);
  std::string text(static_cast<std::size_t>(kLargestSpec), '\0');
  file.read(text.data(), kLargestSpec);
  if (file.gcount() >= kLargestSpec) return;
  text.resize(static_cast<std::size_t>(std::max<std::streamsize>(file.gcount(), 0)));
  toml::table root;
  try {
    root = parse_toml(text, path);
  } catch (const Error&) {
    return;
  }
  if (root.contains("model") && !root.contains("config"))
    throw InputError(
        fmt::format("{}: is a job spec, not a memory snapshot pickle; oomtune autotune {} tunes it, and "
                    "diagnose reads the snapshot of a run that ran out of memory "
                    "(torch.cuda.memory._dump_snapshot)",
                    path, path));
  if (root.contains("config") && root.contains("job"))
    throw InputError(
        fmt::format("{}: is a plan (autotune --emit writes one), not a memory snapshot pickle; "
                    "oomtune probe --plan {} runs it, oomtune emit {} writes its framework configs",
                    path, path, path));
}

// A gzip-compressed snapshot ("snapshot.pickle.gz") is read decompressed in
// memory; any other file as it is. Either is named for what it is when it
// is plainly not a pickle (snapshot_file.h).
diagnose::Snapshot load(const std::string& path) {
  char head[16] = {};
  std::streamsize got = 0;
  {
    std::ifstream file(path, std::ios::binary);
    file.read(head, sizeof head);
    got = std::max<std::streamsize>(file.gcount(), 0);
  }  // unreadable: load_snapshot names the reason
  const std::string_view first(head, static_cast<std::size_t>(got));
  if (is_gzip(first)) {
    const std::string bytes = read_gzip_file(path);
    diagnose::expect_a_snapshot_pickle(std::string_view(bytes).substr(0, sizeof head), path);
    return diagnose::load_snapshot_bytes(bytes, path);
  }
  diagnose::expect_a_snapshot_pickle(first, path);
  reject_oomtune_toml(path, first);
  return diagnose::load_snapshot(path);
}

// Both snapshots are diagnosed with every layer listed (--top applies to the
// comparison's list), then compared (diagnose/compare.h).
int run_compare(const DiagnoseArgs& args, diagnose::DiagnoseOptions options) {
  options.top = std::numeric_limits<int>::max();
  const diagnose::Diagnosis before = diagnose::diagnose(load(args.snapshot), args.snapshot, options);
  const diagnose::Diagnosis after = diagnose::diagnose(load(args.compare), args.compare, options);
  const diagnose::Comparison comparison = diagnose::compare(before, after, args.top);
  if (!args.svg.empty()) write_file_atomically(args.svg, diagnose::render_compare_svg(comparison));
  const std::string text =
      args.json ? diagnose::render_compare_json(comparison) : diagnose::render_compare_text(comparison);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return kExitOk;
}

int run_diagnose(const DiagnoseArgs& args) {
  diagnose::DiagnoseOptions options;
  options.top = args.top;
  options.group_by = args.group_by == "call" ? diagnose::GroupBy::kCall : diagnose::GroupBy::kLayer;
  options.device = *device_index(args.device);  // checked by the option's validator
  if (!args.svg.empty()) require_writable_output("--svg", args.svg, {args.snapshot, args.compare});
  if (!args.compare.empty()) return run_compare(args, options);
  const diagnose::Snapshot snapshot = load(args.snapshot);
  const diagnose::Diagnosis diagnosis = diagnose::diagnose(snapshot, args.snapshot, options);
  // Write the SVG first, so a failure to write it leaves stdout empty.
  if (!args.svg.empty()) write_file_atomically(args.svg, diagnose::render_svg(diagnosis));
  const std::string text = args.json ? diagnose::render_json(diagnosis) : diagnose::render_text(diagnosis);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void add_diagnose_command(CLI::App& app, const Command& self, int* exit_code) {
  auto args = std::make_shared<DiagnoseArgs>();
  CLI::App* sub = app.add_subcommand(self.name, self.help);
  sub->add_option("snapshot", args->snapshot,
                  "Pickle written by torch.cuda.memory._dump_snapshot() (PyTorch 1.13-2.11 layouts, protocols 2-5; "
                  "gzip-compressed too)")
      ->required();
  sub->add_option("--compare", args->compare,
                  "Compare SNAPSHOT (before) with this snapshot (after): what grew by layer and category, segments, "
                  "reserved bytes, the largest free block, and why");
  sub->add_flag("--json", args->json, "Print everything as JSON (units in key names: _bytes, _us)");
  sub->add_option("--svg", args->svg,
                  "Also write the timeline and segment map (with --compare: both snapshots side by side) as an SVG "
                  "file");
  sub->add_option("--top", args->top, "Allocation sites to list (default 10)")
      ->check(CLI::Validator(
          [](const std::string& value) {
            return !value.empty() && value[0] == '-' ? "must be >= 0, got " + value : std::string();
          },
          "N >= 0"));
  sub->add_option("--group-by", args->group_by,
                  "Group sites by 'layer' (innermost model-code frame, default) or 'call' (the training script's line)")
      ->check(CLI::IsMember({"layer", "call"}));
  sub->add_option("--device", args->device,
                  "CUDA device of the snapshot to diagnose, N or cuda:N (default: the one that ran out of memory, "
                  "else the one with the most trace events); with --compare, in both snapshots")
      ->check(CLI::Validator(
          [](const std::string& value) {
            return device_index(value) ? std::string() : "expected a device index such as 1 or cuda:1, got " + value;
          },
          "N"));
  sub->callback([args, exit_code]() { *exit_code = run_diagnose(*args); });
}

}  // namespace oomtune

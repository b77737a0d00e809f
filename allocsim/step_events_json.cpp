#include "allocsim/step_events_json.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "common/error.h"
#include "common/text_file.h"

namespace oomtune::allocsim {
namespace {

constexpr const char* kFormat = "oomtune step events";
constexpr int kVersion = 1;

}  // namespace

nlohmann::json step_events_json(const StepEvents& step) {
  nlohmann::json list = nlohmann::json::array();
  for (const AllocEvent& e : step.events)
    list.push_back({e.kind == AllocEventKind::kAlloc ? "alloc" : "free", e.id,
                    e.kind == AllocEventKind::kAlloc ? e.bytes : 0, std::string(phase_name(e.phase)), e.op});
  return {{"format", kFormat},
          {"version", kVersion},
          {"columns", {"kind", "id", "bytes", "phase", "op"}},
          {"events", std::move(list)},
          {"persistent", step.persistent_bytes}};
}

StepEvents read_step_events(const std::string& path) {
  const std::string text = read_text_file(path, "step-events file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(fmt::format("{}: not JSON ({})", path, e.what()));
  }
  if (!j.is_object() || j.value("format", "") != kFormat)
    throw InputError(fmt::format("{}: not a step-events file (no \"format\": \"{}\")", path, kFormat));
  if (j.value("version", 0) != kVersion)
    throw InputError(
        fmt::format("{}: step-events version {}, this oomtune reads {}", path, j.value("version", 0), kVersion));
  if (!j.contains("events") || !j["events"].is_array())
    throw InputError(fmt::format("{}: \"events\" is not a list", path));
  StepEvents step;
  std::vector<AllocEvent>& events = step.events;
  int64_t order = 0;
  for (const nlohmann::json& row : j["events"]) {
    const std::size_t index = events.size();
    auto bad = [&](const char* what) {
      return InputError(fmt::format("{}: event {}: {} (expected [kind, id, bytes, phase, op])", path, index, what));
    };
    if (!row.is_array() || row.size() != 5) throw bad("not a list of 5");
    if (!row[0].is_string() || (row[0] != "alloc" && row[0] != "free")) throw bad("kind is not \"alloc\" or \"free\"");
    if (!row[1].is_number_unsigned()) throw bad("id is not a non-negative integer");
    if (!row[2].is_number_integer() || row[2].get<int64_t>() < 0) throw bad("bytes is not a non-negative integer");
    if (!row[3].is_string()) throw bad("phase is not a string");
    const std::optional<Phase> phase = phase_from_name(row[3].get<std::string>());
    if (!phase) throw bad("unknown phase");
    if (!row[4].is_string()) throw bad("op is not a string");
    AllocEvent e = row[0] == "alloc" ? alloc_event(row[1].get<std::uint64_t>(), row[2].get<int64_t>(), order, *phase)
                                     : free_event(row[1].get<std::uint64_t>(), order, *phase);
    e.op = row[4].get<std::string>();
    events.push_back(std::move(e));
    ++order;
  }
  if (j.contains("persistent")) {
    const nlohmann::json& persistent = j["persistent"];
    if (!persistent.is_array()) throw InputError(fmt::format("{}: \"persistent\" is not a list", path));
    for (const nlohmann::json& bytes : persistent) {
      if (!bytes.is_number_integer() || bytes.get<int64_t>() < 0)
        throw InputError(
            fmt::format("{}: persistent {}: not a non-negative integer of bytes", path, step.persistent_bytes.size()));
      step.persistent_bytes.push_back(bytes.get<int64_t>());
    }
  }
  return step;
}

}  // namespace oomtune::allocsim

#pragma once
// Paths of the fixtures the diagnose tests read, and their diagnosis.

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "diagnose/diagnosis.h"
#include "diagnose/render.h"
#include "diagnose/snapshot.h"
#include "support/require_file.h"

namespace oomtune::diagnose::testing {

/// The real snapshots captured on an H100 (shared/, not in the repo).
inline std::string real_fixture(const std::string& name) {
  return std::string(OOMTUNE_SHARED_DIR) + "/fixtures/snapshots/" + name;
}

/// A trace event by hand: `size` bytes at `addr`; `stream` indexes the
/// snapshot's streams (Snapshot::streams).
inline TraceEvent trace_event(TraceAction action, int64_t addr, int64_t size, uint16_t stream = 0) {
  TraceEvent e;
  e.action = action;
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  return e;
}

/// The synthetic snapshots of scripts/make_snapshot_fixtures.py.
inline std::string synthetic_fixture(const std::string& name) {
  return std::string(OOMTUNE_SOURCE_DIR) + "/tests/fixtures/snapshots/" + name;
}

/// The bytes of category `c` alive at out-of-memory `o`.
inline int64_t alive_bytes(const OomReport& o, Category c) { return o.live_by_category[static_cast<size_t>(c)]; }

/// What `oomtune diagnose PATH` analyses: the snapshot file at `path`, with
/// `options` (the defaults: top 10 sites, grouped by layer). Throws as
/// load_snapshot() does.
inline Diagnosis diagnose_file(const std::string& path, const DiagnoseOptions& options = {}) {
  return diagnose(load_snapshot(path), path, options);
}

/// A snapshot holding only frames and one stack per listed stack (innermost
/// first); stack i + 1 is stacks[i] (stack 0 is the empty one).
inline Snapshot with_stacks(const std::vector<std::vector<Frame>>& stacks) {
  Snapshot s;
  s.stacks.push_back({});
  for (const auto& stack : stacks) {
    std::vector<uint32_t> ids;
    for (const Frame& f : stack) {
      ids.push_back(static_cast<uint32_t>(s.frames.size()));
      s.frames.push_back(f);
    }
    s.stacks.push_back(ids);
  }
  return s;
}

/// The parts one after the other: a stack made of pieces, innermost first.
inline std::vector<Frame> join_frames(const std::vector<std::vector<Frame>>& parts) {
  std::vector<Frame> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

/// The diagnosis's JSON without the file's name and size: two files whose
/// diagnoses must agree compare equal.
inline nlohmann::json json_without_file(const Diagnosis& d) {
  nlohmann::json j = nlohmann::json::parse(render_json(d));
  j.erase("file");
  j.erase("file_bytes");
  return j;
}

/// json_without_file of the synthetic fixture `name`.
inline nlohmann::json fixture_json(const std::string& name) {
  return json_without_file(diagnose_file(synthetic_fixture(name)));
}

/// Expects the fragmentation verdict and the phase's verdict `phase` as
/// the first two, fragmentation first when `fragmentation_first` (Note
/// [Fragmentation first]), and fragmentation's evidence to contain `evidence`.
inline void expect_fragmentation_order(const Diagnosis& d, VerdictId phase, bool fragmentation_first,
                                       const std::string& evidence) {
  ASSERT_GE(d.verdicts.size(), 2u);
  const Verdict& frag = d.verdicts[fragmentation_first ? 0 : 1];
  EXPECT_EQ(frag.id, VerdictId::kFragmentation);
  EXPECT_EQ(d.verdicts[fragmentation_first ? 1 : 0].id, phase);
  EXPECT_NE(frag.evidence.find(evidence), std::string::npos) << frag.evidence;
}

/// The recommendation of kind `id`, or nullptr.
inline const Recommendation* find_fix(const Diagnosis& d, FixId id) {
  for (const Recommendation& r : d.recommendations) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

/// True when a verdict of kind `id` was reached.
inline bool has_verdict(const Diagnosis& d, VerdictId id) {
  for (const Verdict& v : d.verdicts) {
    if (v.id == id) return true;
  }
  return false;
}

inline bool exists(const std::string& path) { return std::ifstream(path).good(); }

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Writes small protocol-4 pickles opcode by opcode, for shapes no fixture
/// has. Single-character opcodes go in as text: '}' EMPTY_DICT, ']'
/// EMPTY_LIST, '(' MARK, 'u' SETITEMS, 's' SETITEM, 'e' APPENDS, 'a' APPEND,
/// '0' POP, '2' DUP, 'N' None; done() adds STOP.
class PickleWriter {
 public:
  PickleWriter& ops(const std::string& opcodes) {
    out_ += opcodes;
    return *this;
  }
  /// SHORT_BINUNICODE.
  PickleWriter& str(const std::string& text) {
    out_ += '\x8c';
    out_ += static_cast<char>(text.size());
    out_ += text;
    return *this;
  }
  /// LONG1 of 8 bytes (any int64).
  PickleWriter& num(int64_t v) {
    out_ += "\x8a\x08";
    for (int i = 0; i < 8; ++i) out_ += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
    return *this;
  }
  /// LONG_BINPUT / LONG_BINGET of memo entry i.
  PickleWriter& put(uint32_t i) { return memo('r', i); }
  PickleWriter& get(uint32_t i) { return memo('j', i); }
  /// A string key, then an int value (a dict pair).
  PickleWriter& pair(const std::string& key, int64_t value) { return str(key).num(value); }
  std::string done() const { return "\x80\x04" + out_ + "."; }

 private:
  PickleWriter& memo(char op, uint32_t i) {
    out_ += op;
    for (int k = 0; k < 4; ++k) out_ += static_cast<char>((i >> (8 * k)) & 0xff);
    return *this;
  }
  std::string out_;
};

}  // namespace oomtune::diagnose::testing

// A missing fixture fails the test (support/require_file.h); the name
// stays, as the tests call it everywhere.
#define SKIP_IF_MISSING(path) OOMTUNE_REQUIRE_FILE(path)

#pragma once
// `oomtune diagnose A.pickle --compare B.pickle`: what changed from snapshot A
// (before) to snapshot B (after), with meaning.
//
// PyTorch's own `python -m torch.cuda._memory_viz compare A B`
// (torch/cuda/_memory_viz.py, compare()) keys the dumped segments by
// (address, total_size) and draws a flame graph of the blocks of the
// segments only in A or only in B: it says where memory is, not what it is
// for. Here each side is taken at the moment `diagnose` reports (the last
// out-of-memory, else the peak of allocated bytes), and compared by
// category, by layer, and by the allocator's state:
//   - categories (attribution.h) plus reserved-but-free (reserved -
//     allocated: the blocks torch/cuda/memory.py's _snapshot docstring calls
//     "inactive" and "active_pending_free");
//   - layers by their description ("modeling_llama.py:310 in forward"), so
//     two runs on different machines or ranks match;
//   - segments (cudaMalloc ranges), reserved bytes, the largest free block.
// A change is significant when it is at least max(1 MiB, 1% of the larger
// side's allocated bytes). Verdicts (the table below), largest change first:
//   - optimizer state appeared (A has less than 1% of B's): B is after the
//     first optimizer step; gone: the reverse;
//   - gradients appeared / gone likewise: after / before a backward pass;
//   - activations grew or shrank, named by the layer whose activations
//     changed most, with the ratio B/A of all activations ("x2.00: the
//     micro-batch or the sequence length doubled");
//   - parameters grew or shrank (another model, or weights copied twice);
//   - reserved-but-free grew or shrank (more or fewer holes: fragmentation);
//   - temporaries, unattributed bytes grew or shrank;
//   - nothing significant: no change.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "diagnose/diagnosis.h"

namespace oomtune::diagnose {

/// One side of a comparison at its moment.
struct CompareSide {
  std::string file;
  int device = 0;             ///< the CUDA device diagnosed (TraceSummary::device)
  int64_t other_devices = 0;  ///< COUNT: the snapshot's devices not compared
  std::string moment;         ///< "at the last out-of-memory" / "at the peak"
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t reserved_free_bytes = 0;       ///< reserved - allocated
  int64_t segments = 0;                  ///< COUNT: reserved ranges (segments) then
  int64_t largest_free_block_bytes = 0;  ///< either pool
  CategoryBytes by_category{};
  int64_t ooms = 0;  ///< COUNT: out-of-memory events in the trace
};

/// What a comparison's rows are keyed by: the six categories, then reserved-but-free.
constexpr int kNumCompareRows = kNumCategories + 1;

/// "parameters", ..., "unattributed", "reserved_free".
const char* compare_row_name(int row);

/// One layer's live bytes on both sides.
struct LayerChange {
  std::string layer;                            ///< "modeling_bert.py:466 in forward", or a "(...)" placeholder
  Category category = Category::kUnattributed;  ///< of the side where it holds more
  int64_t before_bytes = 0;
  int64_t after_bytes = 0;
  int64_t change_bytes() const { return after_bytes - before_bytes; }
};

/// A kind of conclusion about two snapshots (the table in compare.cpp).
enum class CompareVerdictId : uint8_t {
  kOptimizerStateAppeared,
  kOptimizerStateGone,
  kGradientsAppeared,
  kGradientsGone,
  kActivationsGrew,
  kActivationsShrank,
  kParametersGrew,
  kParametersShrank,
  kReservedFreeGrew,
  kReservedFreeShrank,
  kTemporariesChanged,
  kUnattributedChanged,
  kEvalOutputsChanged,
  kNoChange,
};

/// "optimizer_state_appeared", ..., "no_change".
const char* compare_verdict_name(CompareVerdictId id);

/// One conclusion, its sentence and the bytes it is about.
struct CompareVerdict {
  CompareVerdictId id = CompareVerdictId::kNoChange;
  std::string sentence;
  int64_t change_bytes = 0;  ///< B - A of what it is about
};

/// Everything a comparison found.
struct Comparison {
  CompareSide before;                                  ///< A
  CompareSide after;                                   ///< B
  std::array<int64_t, kNumCompareRows> before_rows{};  ///< bytes per row (categories, reserved_free)
  std::array<int64_t, kNumCompareRows> after_rows{};
  GroupBy group_by = GroupBy::kLayer;    ///< what `layers` are: layers or call sites
  std::vector<LayerChange> layers;       ///< largest |change| first, at most `top`
  int64_t significant_bytes = 0;         ///< the threshold used
  std::vector<CompareVerdict> verdicts;  ///< largest change first; never empty
};

/// Compares two diagnoses made with an unlimited --top (every layer listed)
/// and the same GroupBy. `top`: layers listed.
Comparison compare(const Diagnosis& before, const Diagnosis& after, int top);

}  // namespace oomtune::diagnose

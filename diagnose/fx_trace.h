#pragma once
// The model source behind a frame of FX-generated code.
//
// torch.compile's AOTAutograd runs a model's forward and backward as FX
// GraphModules. With torch.fx.experimental._config.enrich_profiler_metadata
// set, PyTorch 2.11 names each one's code "fx_generated__HASH.py" and keeps,
// per graph node, the stack of the model code the node was traced from;
// torch.cuda.memory._dump_snapshot(augment_with_fx_traces=True) then adds to
// every frame of such code the node's fields fx_node_op, fx_node_name,
// fx_node_target and that stack as fx_original_trace (torch/_utils.py,
// _augment_frames; torch/fx/graph_module.py, FX_GRAPH_MODULE_FILE_PREFIX).
// A backward node's stack is that of the forward code it differentiates.
// The stack is text as Python's traceback module writes it, outermost
// first, each frame a `  File "PATH", line N, in NAME` line followed by its
// source line (torch/fx/traceback.py, format_stack).

#include <string_view>
#include <vector>

#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Most frames taken from one fx_original_trace (a model's call depth is a
/// few dozen; the text is untrusted).
constexpr size_t kMaxFxTraceFrames = 128;

/// The frames of an fx_original_trace, innermost first (the order of a
/// snapshot's stacks). Lines that are not `File "PATH", line N, in NAME`
/// (source lines, anything malformed) are skipped, and so is a frame whose
/// line is not a number in [0, 2^31); past kMaxFxTraceFrames frames the
/// outermost ones are dropped. Never throws on bad text: empty when none
/// is found.
std::vector<Frame> frames_of_fx_trace(std::string_view text);

/// Whether `filename` is the code of an FX GraphModule that PyTorch named
/// for its FX registry ("fx_generated__HASH.py", no folder).
bool is_fx_generated_file(std::string_view filename);

}  // namespace oomtune::diagnose

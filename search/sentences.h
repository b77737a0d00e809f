#pragma once
// The words of the search's progress lines and notes that more than one of
// its files writes (search_state.h).

#include <string>

#include "probes/probe_report.h"
#include "strategies/training_config.h"

namespace oomtune::search_detail {

/// "micro-batch 8 x 4, ckpt all, adamw8bit, offload, bf16": a configuration
/// in a progress line or a note.
std::string describe(const TrainingConfig& c);

/// The note that bf16 autocast failed for `failed`'s reason and bf16 runs
/// as bf16 parameters with fp32 master weights (Note [bf16 fallback],
/// fit.cpp).
std::string bf16_fallback_note(const ProbeReport& failed);

}  // namespace oomtune::search_detail

#pragma once
// Internal to diagnose/: diagnose() (analysis.cpp) fills a Diagnosis's
// figures, then calls these to reach its verdicts (verdict_rules.cpp).

#include "diagnose/diagnosis.h"

namespace oomtune::diagnose {

/// Sets d.verdicts from d's out-of-memory reports (the last one judged),
/// peak, leak suspects, need and allocator-setting replays: the leak first
/// unless fragmentation is, the phase's verdict, the memory cap last.
/// Throws nothing beyond std::bad_alloc.
void add_verdicts(Diagnosis& d);

/// Note [Fragmentation first]: swaps fragmentation behind the failing
/// phase's verdict (or private_pools) unless defragmenting serves the phase's known need and a
/// fix for fragmentation leads d.recommendations. Call after those are
/// ranked.
void order_fragmentation_verdict(Diagnosis& d);

}  // namespace oomtune::diagnose

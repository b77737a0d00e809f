#pragma once
// PYTORCH_CUDA_ALLOC_CONF (PYTORCH_ALLOC_CONF in 2.9+) text <-> AllocatorConfig.
//
// Source: c10/cuda/CUDAAllocatorConfig.cpp and c10/core/AllocatorConfig.cpp
// (AcceleratorAllocatorConfig::parseArgs): "key:value" pairs separated by
// commas; roundup_power2_divisions takes one number or a list
// "[64:8,256:4,>:1]" of interval start (MiB) : divisions.

#include <string>
#include <string_view>

#include "allocsim/allocator_rules.h"

namespace oomtune::allocsim {

/// Parses an allocator-config string, e.g.
/// "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6".
/// Keys that change where memory goes are read (max_split_size_mb,
/// max_non_split_rounding_mb, roundup_power2_divisions,
/// garbage_collection_threshold, expandable_segments); keys that do not
/// (backend, release_lock_on_cudamalloc, pinned_*,
/// graph_capture_record_stream_reuse, per_process_memory_fraction: pass the
/// budget separately) are accepted and ignored. Throws oomtune::ConfigError,
/// naming the key, the expected form and the value received, on anything
/// PyTorch would reject, and on unknown keys (with the closest valid one).
alloc_rules::AllocatorConfig parse_alloc_conf(std::string_view text);

/// The config as PYTORCH_CUDA_ALLOC_CONF text; only non-default options
/// appear ("" for the defaults). parse_alloc_conf(format_alloc_conf(c)) == c
/// for any config whose sizes are whole MiB.
std::string format_alloc_conf(const alloc_rules::AllocatorConfig& config);

}  // namespace oomtune::allocsim

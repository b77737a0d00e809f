#pragma once
// The memory this machine lets a process hold: what a host budget defaults
// to for a job trained here (search/host_budget.cpp, Note [Host budget]).

#include <cstdint>
#include <optional>
#include <string>

namespace oomtune {

/// BYTES this machine lets a process hold: its physical memory (sysconf
/// _SC_PHYS_PAGES x _SC_PAGE_SIZE), or its control group's memory limit
/// where that is lower (a container's: cgroup v2 /sys/fs/cgroup/memory.max,
/// v1 /sys/fs/cgroup/memory/memory.limit_in_bytes; the kernel's
/// Documentation/admin-guide/cgroup-v2.rst, "memory.max"). nullopt when the
/// physical memory cannot be read. Throws nothing.
std::optional<int64_t> machine_memory_bytes();

/// The limit a cgroup memory file holds (BYTES): its whole-number text,
/// trailing whitespace allowed; nullopt for "max" (v2: no limit) or text
/// that is not such a number. v1 writes a number near 2^63 for no limit,
/// which the caller drops as above the physical memory.
std::optional<int64_t> parse_cgroup_memory_limit(const std::string& text);

}  // namespace oomtune

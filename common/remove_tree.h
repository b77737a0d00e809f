#pragma once
// Removing a folder and everything in it without std::filesystem::remove_all.
//
// PyTorch's wheels (2.5 on) export the std::filesystem functions they link
// statically (pytorch/pytorch#133437). A program linked to such a libtorch
// can bind its std::filesystem calls to those copies: libtorch comes first
// in its lookup scope, or, with a toolchain that links libstdc++ statically
// (the GPU machine's /opt/gcc, 2026-11-26), its references were resolved
// against libtorch at link time and carry no GLIBCXX version at all. There,
// libtorch.so's remove_all called through a null address and crashed every
// test process that removed a folder (docs/gpu_machine.md). Removing through
// POSIX nftw(3) uses no C++ library function that libtorch defines.

#include <cstdint>
#include <string>

namespace oomtune {

/// Removes `path` and, if it is a folder, everything under it, as `rm -rf`:
/// symbolic links are removed, never followed. Returns the number of entries
/// removed (files, links and folders, `path` included); 0 when `path` does
/// not exist. Best effort and never throws: an entry that cannot be removed
/// (permissions, a concurrent writer) is left, and so are the folders above
/// it; the count then says what went.
std::uintmax_t remove_tree(const std::string& path) noexcept;

}  // namespace oomtune

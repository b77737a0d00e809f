#pragma once
// The bytes of a TorchScript archive's tensor constants, read from the
// archive itself: an expectation independent of the loader and the tracker
// for what a trial counts as the model's constants (Note [Loader records]
// in trial/trial_runner.cpp).

#include <cstdint>
#include <string>

#include <caffe2/serialize/inline_container.h>

namespace oomtune::testing {

/// Sum of the sizes, in bytes, of the records under "constants/" in the
/// TorchScript archive at `path` (torch.jit.save writes one per tensor
/// constant of the graphs: torch/csrc/jit/serialization/export_module.cpp,
/// writeArchive("constants", ...)). 0 for a file without tensor constants.
/// Throws c10::Error when `path` is not a TorchScript archive.
inline int64_t archive_constant_bytes(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  int64_t bytes = 0;
  for (const std::string& name : reader.getAllRecords()) {
    if (name.rfind("constants/", 0) != 0) continue;
    bytes += static_cast<int64_t>(std::get<1>(reader.getRecord(name)));
  }
  return bytes;
}

}  // namespace oomtune::testing

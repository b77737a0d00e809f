#pragma once
// Paths and facts of the build a test executable belongs to (build/ or
// build-pypi/), defined in one file CMake generates for the build
// (tests/CMakeLists.txt, oomtune_test_build_values). Kept out of compile
// definitions on purpose: with them, every translation unit of a test
// executable compiled to another command line in each build, and ccache could
// not serve the PyPI build the tests the Debian build had just compiled
// (.ci/run builds both). Values that are the same in both builds (the source
// folder, shared/, the exporting Python) stay compile definitions.

namespace oomtune::testing {

/// The oomtune executable of this build ($<TARGET_FILE:oomtune>).
extern const char* const kOomtuneBinary;
/// tests/recipes' oomtune_emit_driver: main.cpp with only `emit`.
extern const char* const kEmitDriver;
/// Folder of the core test models (tests/core/make_test_models.py writes
/// them at test time; fixture core_models).
extern const char* const kTestModels;
/// Folder of the autotune acceptance models (gpt_small/, gpt_wide/; fixture
/// autotune_models).
extern const char* const kAutotuneModels;
/// tests/allocsim's build folder: the snapshot replay tests write there.
extern const char* const kAllocsimWorkDir;
/// Whether this libtorch counts the meta device (2.x; compat/torch_compat.h,
/// kMetaDeviceCounted): autotune then takes memory from meta.
extern const bool kMetaCounted;
/// Whether this libtorch has CUDA (libc10_cuda beside libtorch), found apart
/// from CMakeLists.txt's CAFFE2_USE_CUDA: what `oomtune --version` must say.
extern const bool kTorchHasCuda;

}  // namespace oomtune::testing

#pragma once
// Meta kernels that a libtorch process lacks. PyTorch 2.x registers many of
// its meta kernels from Python (torch/_meta_registrations.py, loaded by
// `import torch`); a C++ program that links libtorch has only the C++ ones
// (structured kernels, the ops with a Meta or CompositeExplicitAutograd
// entry in native_functions.yaml). Listed with
// torch._C._dispatch_dump("aten::OP") under PyTorch 2.11: a "Meta" line
// registered from _meta_registrations.py and no C++ one means a C++ program
// cannot run OP on meta tensors.
//
// Each kernel here makes the outputs the operator's CPU kernel makes, with
// the shapes, dtypes and memory formats of that kernel, so that a meta trial
// allocates what a CPU trial does (the outputs: what a CPU kernel makes and
// frees before returning is kernel scratch, which the CPU trial does not
// count either; probes/memory_tracker.cpp, Note [Kernel scratch]).

namespace oomtune {

/// Registers the kernels for DispatchKey::Meta with the dispatcher; once
/// per process, later calls do nothing. Call before running a model on the
/// meta device (the trial does, for device = "meta"). libtorch 2.x only:
/// on 1.13 the registration would clash with nothing but the meta device
/// is refused before (compat::kMetaDeviceCounted).
void install_meta_kernels();

}  // namespace oomtune

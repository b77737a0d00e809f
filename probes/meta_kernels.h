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
//
// Two replace ATen's own meta kernels where autograd calls them: `add`,
// where the engine sums two gradients of one tensor, and `index_put`, in
// indexing's backward. libtorch takes the out-of-place path there for
// "subclass-like" tensors, meta among them, and the in-place one on the
// CPU and CUDA; these make what the in-place path leaves (a meta run
// needs a MemoryTracker alive to tell where it is: memory_tracker.h,
// innermost_call_is; without one they are ATen's). Two more replace
// ATen's to refuse what the device refuses: `masked_fill_` and `fill_`
// with a value that does not fit the tensor's dtype (a traced fp32 minimum
// in a bf16 or fp16 mask), as the CPU and CUDA kernels do.

namespace oomtune {

/// Registers the kernels for DispatchKey::Meta with the dispatcher; once
/// per process, later calls do nothing. Call before running a model on the
/// meta device (the trial does, for device = "meta"). libtorch 2.x only:
/// on 1.13 the registration would clash with nothing but the meta device
/// is refused before (compat::kMetaDeviceCounted).
void install_meta_kernels();

}  // namespace oomtune

#pragma once
// The child side of a trial (the hidden `trial` subcommand): read the
// request, run the trial in this process, write the ProbeReport. It lives in
// the libtorch module (trial/trial_module.h), so the oomtune executable
// itself never loads libtorch.
//
// Test hook: the environment variable OOMTUNE_TEST_FAULT = "KIND:PHASE[:TEXT]"
// (KIND abort, segv, hang, oom (an out-of-memory error) or error (the
// c10::Error of a CUDA kernel launched past its grid's limits); PHASE
// forward, loss, backward or optimizer)
// makes a child whose "<config>,global_batch=<G>," contains TEXT (any child
// when TEXT is absent; "precision=bf16," names bf16 autocast only,
// "global_batch=16," the verification runs of a job with G = 16) fail that
// way when the phase begins.

#include <string>

namespace oomtune {

/// Reads the request (trial/trial_request.h), runs the trial, writes the
/// report atomically to `result_path`. Errors of the trial (a bad model, a
/// config that cannot apply, an exception from libtorch) become outcome
/// kError, with input_error set for the user's input. A crash by signal
/// writes the phase it happened in to crash_note_path(result_path) and dies
/// by the same signal. Throws InputError when the request cannot be read and
/// OutputError when the report cannot be written. Returns the exit code (0).
int serve_trial(const std::string& request_path, const std::string& result_path);

}  // namespace oomtune

"""The eval_accumulation_steps that `oomtune diagnose` recommends for
tests/fixtures/snapshots/hf_gpt2_eval_outputs_oom.pickle (3, asserted by
tests/diagnose/evaluation_test.cpp) runs the same evaluation to its end
under the same 512 MiB cap in the fixture generator's model of the caching
allocator (scripts/make_snapshot_fixtures.py), and the committed fixture is
what the generator writes. The estimate is conservative: 4 fits too, 5 does
not (it compares bytes, not free blocks).

Usage: eval_accumulation_fixture_test.py SOURCE_DIR
"""

from generator_check import MIB, check_committed, finish, fixtures, ooms


def steps_run(sim):
    """Evaluation steps whose forward reached the head (lm_head allocations)."""
    return sum(1 for e in sim.trace if e.get("action") == "alloc" and e["frames"]
               and e["frames"][0]["name"] == "forward" and e["frames"][0]["line"] == 134)


failures = []
without = fixtures.gpt2_eval_outputs_oom()
if len(ooms(without)) != 1 or ooms(without)[0]["size"] != 192 * MIB:
    failures.append(f"without eval_accumulation_steps: expected one 192 MiB out-of-memory, got {ooms(without)}")
for k, fits in ((3, True), (4, True), (5, False)):
    sim = fixtures.gpt2_eval_outputs_oom(accumulation_steps=k)
    if fits and (ooms(sim) or steps_run(sim) != 16):
        failures.append(f"eval_accumulation_steps={k}: {len(ooms(sim))} out-of-memory, {steps_run(sim)} of 16 steps")
    if not fits and not ooms(sim):
        failures.append(f"eval_accumulation_steps={k}: expected an out-of-memory, ran {steps_run(sim)} steps")

check_committed("hf_gpt2_eval_outputs_oom.pickle", without, failures)
finish(failures)

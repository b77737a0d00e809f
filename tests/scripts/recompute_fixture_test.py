"""tests/fixtures/snapshots/hf_bert_checkpointed_recompute_tied_oom.pickle,
run again in the fixture generator's model of the caching allocator
(scripts/make_snapshot_fixtures.py): the failure `oomtune diagnose` reads
(tests/diagnose/forward_frames_test.cpp: halving the micro-batch is "not
enough alone") is the recomputation's probabilities, and with the micro-batch
halved the run still runs out of memory, later, in the third block's
backward (hf_bert_checkpointed_backward_oom.pickle): what that backward
still needed is what the same run without the cap allocates past that point.
The committed fixtures are what the generator writes.

Usage: recompute_fixture_test.py SOURCE_DIR
"""

from generator_check import MIB, check_committed, finish, fixtures, ooms

TIED = 32 * MIB  # the word embeddings' gradient of the committed fixture


def recomputed_allocs(sim):
    """Allocations made inside torch.utils.checkpoint's unpack hook (the recomputation)."""
    return sum(1 for e in sim.trace if e.get("action") == "alloc"
               and any(f["name"] == "unpack_hook" for f in e["frames"]))


failures = []
tied = fixtures.bert_backward_oom(embedding_grad=TIED)
if len(ooms(tied)) != 1:
    failures.append(f"tied: expected one out-of-memory, got {len(ooms(tied))}")
else:
    e = ooms(tied)[0]
    lines = [f["line"] for f in e["frames"] if f["filename"].endswith("modeling_bert.py")]
    if e["size"] != 32 * MIB or lines[:1] != [360] or recomputed_allocs(tied) != 3:
        failures.append(f"tied: expected the probabilities (32 MiB, modeling_bert.py:360) to fail after q, k, v; "
                        f"got {e['size']} bytes at {lines[:1]} after {recomputed_allocs(tied)} recomputed")
halved = fixtures.bert_backward_oom(embedding_grad=TIED, micro_batch_divisor=2)
if not ooms(halved):
    failures.append("tied, micro-batch halved: expected it to run out of memory still, it ran to the end")
elif recomputed_allocs(halved) != 18 or ooms(halved)[0]["frames"]:
    failures.append(f"tied, micro-batch halved: expected the out-of-memory in the third block's backward (no "
                    f"frames), after 3 blocks' recomputation (18 allocations), got it after "
                    f"{recomputed_allocs(halved)} with frames {ooms(halved)[0]['frames'][:1]}")
# Past the fixture's cap, the last layer's recomputation completes (diagnose's need, 72 MiB, is what it lacked).
roomy = fixtures.bert_backward_oom(cap=(256 + 72) * MIB, embedding_grad=TIED)
if recomputed_allocs(roomy) < 6:
    failures.append(f"tied, 72 MiB more cap: the last layer's recomputation made {recomputed_allocs(roomy)} of 6")

check_committed("hf_bert_checkpointed_recompute_tied_oom.pickle", tied, failures)


def allocated_after_each(sim):
    """Bytes allocated after each alloc and free_requested, up to an out-of-memory."""
    allocated, out = 0, []
    for e in sim.trace:
        if e.get("action") == "oom":
            break
        if e.get("action") in ("alloc", "free_requested"):
            allocated += e["size"] if e["action"] == "alloc" else -e["size"]
            out.append(allocated)
    return out


# The halved run is hf_bert_checkpointed_backward_oom.pickle. What its
# backward still needed when it failed (diagnose: at least 44 MiB, asserted
# by tests/diagnose/forward_frames_test.cpp) is what the same run without
# the cap allocates beyond the 248 MiB allocated then: nothing follows the
# blocks in this run's backward.
check_committed("hf_bert_checkpointed_backward_oom.pickle", halved, failures)
capped = allocated_after_each(halved)
uncapped = allocated_after_each(fixtures.bert_backward_oom(cap=1 << 40, embedding_grad=TIED,
                                                                    micro_batch_divisor=2))
if capped[-1] != 248 * MIB or max(uncapped[len(capped):]) - capped[-1] != 44 * MIB:
    failures.append(f"halved: expected 248 MiB allocated at the out-of-memory and 44 MiB more at the uncapped "
                    f"run's peak after it, got {capped[-1] / MIB} and {(max(uncapped[len(capped):]) - capped[-1]) / MIB}")
# Without checkpointing, at an eighth of the micro-batch, under 208 MiB
# (hf_bert_backward_oom.pickle): out of memory at the first layer's
# backward, which then still needs 21 MiB (diagnose's need, asserted by
# forward_frames_test.cpp): what the uncapped run allocates past that point.
plain = fixtures.bert_backward_oom(208 * MIB, micro_batch_divisor=8, checkpointing=False)
check_committed("hf_bert_backward_oom.pickle", plain, failures)
capped = allocated_after_each(plain)
uncapped = allocated_after_each(fixtures.bert_backward_oom(1 << 40, micro_batch_divisor=8, checkpointing=False))
if recomputed_allocs(plain) != 0 or capped[-1] != 182 * MIB or max(uncapped[len(capped):]) - capped[-1] != 21 * MIB:
    failures.append(f"plain: expected no recomputation, 182 MiB allocated at the out-of-memory and 21 MiB more at "
                    f"the uncapped run's peak after it, got {recomputed_allocs(plain)}, {capped[-1] / MIB} and "
                    f"{(max(uncapped[len(capped):]) - capped[-1]) / MIB}")
# A quarter of the micro-batch (halving the halved run) runs out of memory too: diagnose's "not enough alone".
if not ooms(fixtures.bert_backward_oom(embedding_grad=TIED, micro_batch_divisor=4)):
    failures.append("tied, a quarter of the micro-batch: expected an out-of-memory still, it ran to the end")
finish(failures)

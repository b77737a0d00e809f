"""tests/fixtures/snapshots/hf_bert_checkpointed_recompute_tied_oom.pickle,
run again in the fixture generator's model of the caching allocator
(scripts/make_snapshot_fixtures.py): the failure `oomtune diagnose` reads
(tests/diagnose/forward_frames_test.cpp: halving the micro-batch is "not
enough alone") is the recomputation's probabilities, and with the micro-batch
halved the run still runs out of memory, later: the last layer's
recomputation then completes, its backward does not. The committed fixture
is what the generator writes.

Usage: recompute_fixture_test.py SOURCE_DIR
"""

from generator_check import MIB, check_committed, finish, fixtures, ooms

TIED = 32 * MIB  # the word embeddings' gradient of the committed fixture


def recomputed_allocs(sim):
    """Allocations made inside torch.utils.checkpoint's unpack hook (the recomputation)."""
    return sum(1 for e in sim.trace if e.get("action") == "alloc"
               and any(f["name"] == "unpack_hook" for f in e["frames"]))


failures = []
tied = fixtures.checkpointed_recompute_oom(embedding_grad=TIED)
if len(ooms(tied)) != 1:
    failures.append(f"tied: expected one out-of-memory, got {len(ooms(tied))}")
else:
    e = ooms(tied)[0]
    lines = [f["line"] for f in e["frames"] if f["filename"].endswith("modeling_bert.py")]
    if e["size"] != 32 * MIB or lines[:1] != [360] or recomputed_allocs(tied) != 3:
        failures.append(f"tied: expected the probabilities (32 MiB, modeling_bert.py:360) to fail after q, k, v; "
                        f"got {e['size']} bytes at {lines[:1]} after {recomputed_allocs(tied)} recomputed")
halved = fixtures.checkpointed_recompute_oom(embedding_grad=TIED, micro_batch_divisor=2)
if not ooms(halved):
    failures.append("tied, micro-batch halved: expected it to run out of memory still, it ran to the end")
elif recomputed_allocs(halved) < 6:
    failures.append(f"tied, micro-batch halved: expected the last layer's recomputation (6 allocations) to complete "
                    f"before the out-of-memory, got {recomputed_allocs(halved)}")
# Past the fixture's cap, the last layer's recomputation completes (diagnose's need, 72 MiB, is what it lacked).
roomy = fixtures.checkpointed_recompute_oom(cap=(256 + 72) * MIB, embedding_grad=TIED)
if recomputed_allocs(roomy) < 6:
    failures.append(f"tied, 72 MiB more cap: the last layer's recomputation made {recomputed_allocs(roomy)} of 6")

check_committed("hf_bert_checkpointed_recompute_tied_oom.pickle", tied, failures)
finish(failures)

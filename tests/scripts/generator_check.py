"""What the tests that rerun a snapshot fixture in its generator's model of
the caching allocator (scripts/make_snapshot_fixtures.py) share: the
generator imported from the source tree, its out-of-memory events, the
check that a committed fixture is what the generator writes, and the exit
status. Each test passes SOURCE_DIR as its only argument."""

import os
import pickle
import sys

SOURCE = sys.argv[1]
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
import make_snapshot_fixtures as fixtures  # noqa: E402,F401

MIB = fixtures.MIB


def ooms(sim):
    """The trace's out-of-memory events, in order."""
    return [e for e in sim.trace if e.get("action") == "oom"]


def check_committed(name, sim, failures):
    """Appends a failure unless tests/fixtures/snapshots/NAME holds what the
    generator writes for `sim` (layout v2_11, pickle protocol 4)."""
    committed = os.path.join(SOURCE, "tests", "fixtures", "snapshots", name)
    with open(committed, "rb") as f:
        if f.read() != pickle.dumps(sim.dump("v2_11"), protocol=4):
            failures.append(f"{committed}: not what scripts/make_snapshot_fixtures.py writes (regenerate it)")


def finish(failures):
    """Prints each failure and exits 1 if there is one, else 0."""
    for failure in failures:
        print("FAIL:", failure)
    sys.exit(1 if failures else 0)

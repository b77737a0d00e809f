"""scripts/record_hf_snapshot.py --checkpointing, the parts that run without
a GPU (the search itself runs in scripts/device_check.sh --snapshots):
oom_kind, which picks the snapshot, read on the synthetic checkpointed
fixtures whose out-of-memory is known by construction
(scripts/make_snapshot_fixtures.py, bert_backward_oom), and the
refused combination of arguments.

Usage: record_hf_checkpointing_test.py SOURCE_DIR
"""

import contextlib
import io
import os
import pickle
import sys

source = sys.argv[1]
sys.path.insert(0, os.path.join(source, "scripts"))
import record_hf_snapshot  # noqa: E402

failures = []
expected = {
    "hf_bert_checkpointed_recompute_oom.pickle": "recomputing",  # the last layer's intermediate
    "hf_bert_checkpointed_recompute_tied_oom.pickle": "recomputing",  # its probabilities
    "hf_bert_checkpointed_backward_oom.pickle": "after_recomputation",  # a gradient in the third layer's backward
    "hf_bert_forward_oom.pickle": "other",  # not checkpointed, in forward
    "hf_bert_backward_oom.pickle": "other",  # not checkpointed, in the first layer's backward
    "leak.pickle": None,  # no out-of-memory
}
for name, kind in expected.items():
    with open(os.path.join(source, "tests", "fixtures", "snapshots", name), "rb") as f:
        trace = pickle.load(f)["device_traces"][0]
    if record_hf_snapshot.oom_kind(trace) != kind:
        failures.append(f"{name}: oom_kind {record_hf_snapshot.oom_kind(trace)!r}, expected {kind!r}")

sys.argv = ["record_hf_snapshot.py", "--out", "/nonexistent.pickle", "--checkpointing", "--evaluate"]
stderr = io.StringIO()
with contextlib.redirect_stderr(stderr):
    status = record_hf_snapshot.main()
if status != 2 or "--checkpointing" not in stderr.getvalue():
    failures.append(f"--checkpointing --evaluate: exit {status}, {stderr.getvalue()!r}; expected exit 2 naming it")

for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)

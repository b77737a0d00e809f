"""scripts/record_hf_snapshot.py --evaluate, on the CPU (its GPU run is
scripts/device_check.sh --snapshots): Trainer.evaluate() with the
compute_metrics it passes runs to its end on a tiny GPT-2, keeping every
step's logits when no eval_accumulation_steps is given and moving them to
the host with one (the concatenations Note [Evaluation outputs] describes:
transformers/trainer_pt_utils.py nested_concat). Exit 77 (skipped) without
transformers.

Usage: record_hf_eval_test.py SOURCE_DIR
"""

import contextlib
import io
import os
import sys
import types

sys.path.insert(0, os.path.join(sys.argv[1], "scripts"))
try:
    import torch
    import transformers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)
import record_hf_snapshot  # noqa: E402

concatenated = []  # rows of each concatenation's result, in order
nested_concat = transformers.trainer_pt_utils.nested_concat


def counting_concat(tensors, new_tensors, padding_index=-100):
    joined = nested_concat(tensors, new_tensors, padding_index)
    if isinstance(joined, torch.Tensor) and joined.dim() == 3:  # the logits
        concatenated.append(joined.shape[0])
    return joined


transformers.trainer_pt_utils.nested_concat = counting_concat
config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=100)
failures = []
for k, expected in ((None, [4, 6, 8]), (2, [4, 4])):
    concatenated.clear()
    args = types.SimpleNamespace(steps=4, micro_batch=2, seq=16, eval_accumulation_steps=k, out="/nonexistent")
    result = {}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        status = record_hf_snapshot.evaluate(args, transformers, transformers.GPT2LMHeadModel(config), config, result)
    if status != 1 or result.get("phase", "") is not None or "eval_token_accuracy" not in result.get("metrics", {}):
        failures.append(f"eval_accumulation_steps={k}: exit {status}, {result}")
    if concatenated != expected:
        failures.append(f"eval_accumulation_steps={k}: logits concatenated to {concatenated} rows, not {expected}")
for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)

#!/usr/bin/env python3
"""What diagnose assumes of Hugging Face's Trainer (Note [Phase need] rule 2,
diagnose/optimizer_need.cpp): its default optimizer is torch's AdamW with
fused=True, and a transformers/trainer.py frame is on the stack of the
optimizer's step, so an out-of-memory in that step's _init_group (before any
frame shows the implementation) is read as fused. Runs one training step of
a tiny GPT-2 with the installed transformers and torch, on the CPU, and
records the stack _init_group is called with. A transformers or torch
upgrade that changes either fails here.
"""
import sys
import tempfile
import traceback

try:
    import torch
    import transformers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
config = GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=100, n_positions=32)
data = [{"input_ids": torch.randint(0, 100, (16,)), "labels": torch.randint(0, 100, (16,))} for _ in range(2)]
output_dir = tempfile.TemporaryDirectory()
args = TrainingArguments(output_dir=output_dir.name, per_device_train_batch_size=2, max_steps=1, report_to=[],
                         use_cpu=True, save_strategy="no", logging_strategy="no")
stacks = []
init_group = torch.optim.Adam._init_group


def spy(self, *a, **k):
    stacks.append([f.filename for f in traceback.extract_stack()])
    return init_group(self, *a, **k)


torch.optim.Adam._init_group = spy
trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data)
trainer.train()
optimizer = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
failures = []
if not isinstance(optimizer, torch.optim.AdamW) or optimizer.defaults.get("fused") is not True:
    failures.append(f"the Trainer's default optimizer is {type(optimizer).__name__} with fused="
                    f"{optimizer.defaults.get('fused')} (optim {args.optim}), not AdamW with fused=True")
if not stacks or not any(f.replace("\\", "/").endswith("transformers/trainer.py") for f in stacks[0]):
    failures.append(f"no transformers/trainer.py frame on the optimizer step's stack: {stacks[:1]}")
for f in failures:
    print("FAIL:", f)
print(f"transformers {transformers.__version__}, torch {torch.__version__}: optim {args.optim}, "
      f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)

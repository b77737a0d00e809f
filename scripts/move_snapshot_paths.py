#!/usr/bin/python3
"""Rewrite a PyTorch memory snapshot with every frame's file moved under a folder.

Usage: /usr/bin/python3 scripts/move_snapshot_paths.py IN.pickle OUT.pickle [PREFIX]
       (default PREFIX: /home/user/torch)

Every frame's `filename` that is an absolute path becomes PREFIX + filename, so
`/home/user/train.py` becomes `/home/user/torch/home/user/train.py` and the
torch package `/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py`
becomes `/home/user/torch/opt/venv/.../site-packages/torch/nn/modules/module.py`:
every path, the user's own files included, then contains "/torch/", as for a user
whose project or virtual environment sits in a folder named `torch` (issue #48).
`oomtune diagnose` must give the same report for both files.

The snapshot is read with an unpickler that refuses every global (a snapshot is
plain dicts, lists, strings and numbers) and written back with the same pickle
protocol 4; nothing else changes. Frames sit in trace entries, blocks, segments
and 2.0's block `history`, under the key "frames" (torch/cuda/memory.py,
_snapshot docstring).
"""

import io
import pickle
import sys


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused: a snapshot is plain data")


def move(value, prefix):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "filename" and isinstance(item, str) and item.startswith("/"):
                out[key] = prefix + item
            else:
                out[key] = move(item, prefix)
        return out
    if isinstance(value, list):
        return [move(item, prefix) for item in value]
    if isinstance(value, tuple):
        return tuple(move(item, prefix) for item in value)
    return value


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.split("\n\n")[1])
    prefix = sys.argv[3] if len(sys.argv) == 4 else "/home/user/torch"
    with open(sys.argv[1], "rb") as f:
        snapshot = PlainUnpickler(io.BytesIO(f.read())).load()
    with open(sys.argv[2], "wb") as f:
        pickle.dump(move(snapshot, prefix.rstrip("/")), f, protocol=4)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A recorder for tests/scripts/cpu_snapshot_test.py that records nothing:
it hands back a snapshot recorded before, on a GPU, and what its recorder
printed.

    replay_recorded.py DIR --out FOLDER/NAME.pickle [the recorder's options]

DIR holds NAME.pickle.gz for each case and manifest.json (made from
scripts/record_cuda_snapshot.py's runs on an H200, docs/gpu_machine.md):
per case the options it was recorded with, the phase it failed in, oom_at
and uncapped_growth_bytes (what the same run without the cap allocated from
the failing allocation on) and parameter_bytes; "default_device" says the
whole run was under `with torch.device("cuda"):`. The snapshot is written
to --out as record_cuda_snapshot.py writes it, and the same JSON printed.

Exit 0 with the snapshot; 78 where DIR holds no recording of NAME (the
reason printed: the test counts it as not recorded, not as a failure); 1
where it was recorded with other options than asked (a failure: the test's
case changed, and the recording must be made again); 2 on bad arguments.
"""

import gzip
import json
import os
import shutil
import sys


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--out":
        print(__doc__, file=sys.stderr)
        return 2
    folder, out, options = sys.argv[1], sys.argv[3], sys.argv[4:]
    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    name = os.path.basename(out).removesuffix(".pickle")
    case = manifest["cases"].get(name)
    if case is None:
        print(f"{name}: not recorded: {manifest.get('not_recorded', {}).get(name, 'no such case in ' + folder)}")
        return 78
    if case["args"] != options:  # the test changed its case: its recording no longer stands for it
        print(f"{name}: recorded with other options: {' '.join(case['args'])}", file=sys.stderr)
        return 1
    tmp = out + ".tmp"
    with gzip.open(os.path.join(folder, name + ".pickle.gz"), "rb") as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(tmp, out)
    print(json.dumps({"oom_at": case["oom_at"], "uncapped_growth_bytes": case["uncapped_growth_bytes"],
                      "parameter_bytes": case["parameter_bytes"], "default_device": manifest["default_device"],
                      "out": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

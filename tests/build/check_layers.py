#!/usr/bin/env python3
"""The folders are layers (issue #45, docs/architecture.md "Where things live").

A folder's C++ files include only from its own folder and the folders below
it in LAYERS; an include that runs back up (probes/ including search/, a
library including the commands in src/) is one line of output naming the file,
the line and the two folders, and a non-zero exit. tests/, bench/ and
examples/ sit above everything and are not checked. Includes are those
written in quotes from the project root ("job/job_spec.h"); a quoted include
without a folder is a file beside the includer.
"""
import pathlib
import re
import sys

# Bottom first. Folders on one line are peers: neither may include the other.
LAYERS = [
    ["common", "compat"],
    ["allocsim", "job"],
    ["probes"],
    ["session"],
    ["strategies"],
    ["search"],
    ["trial", "report", "recipes", "diagnose"],
    ["src"],
]
LEVEL = {folder: level for level, peers in enumerate(LAYERS) for folder in peers}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def violations(root):
    for folder, level in LEVEL.items():
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".h", ".cpp", ".cu"):
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                match = INCLUDE.match(line)
                if not match or "/" not in match.group(1):
                    continue
                target = match.group(1).split("/")[0]
                if target not in LEVEL or target == folder:
                    continue
                if LEVEL[target] >= level:
                    where = "beside" if LEVEL[target] == level else "above"
                    yield (f"{path.relative_to(root)}:{number}: {folder}/ includes {match.group(1)}, "
                           f"but {target}/ is {where} {folder}/ (tests/build/check_layers.py LAYERS)")


def main():
    root = pathlib.Path(__file__).resolve().parents[2]
    missing = [folder for folder in LEVEL if not (root / folder).is_dir()]
    if missing:
        print(f"check_layers: no folder {', '.join(missing)} in {root}: update LAYERS", file=sys.stderr)
        return 1
    found = list(violations(root))
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

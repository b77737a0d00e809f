#!/usr/bin/env python3
"""Compiles every translation unit of a build again, syntax only, under
another C++ standard or against another libtorch's headers.

- As C++20 (the ctest cxx20_syntax): a libtorch from PyTorch 2.14 on refuses
  C++17 (ATen/ATen.h), and CMakeLists.txt then builds every target as C++20.
  No machine here has such a libtorch, so this keeps that build working. fmt
  checks format strings at compile time in C++20, and C++20 deprecates or
  changes a few C++17 constructs.
- Against another libtorch's include tree (--torch-include DIR, by hand):
  the translation units that use libtorch are compiled with DIR and
  DIR/torch/csrc/api/include in place of the build's own libtorch headers;
  a header still taken from Debian's libtorch 1.13 (/usr/include/{ATen,c10,
  torch,caffe2}) counts as a failure.

Any error or warning fails. Usage:
  syntax_check.py BUILD_DIR [--std c++20] [--torch-include DIR] [--jobs N]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys

DEBIAN_TORCH_HEADER = re.compile(r"^\.+ /usr/include/(ATen|c10|torch|caffe2)/\S+", re.M)


def uses_torch(command):
    return "torch/csrc/api/include" in command


def syntax_command(command, std, torch_include):
    """The compile command with -fsyntax-only, no output file, the given
    -std, and (with torch_include) that libtorch's headers first."""
    args = shlex.split(command)
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out = [args[0]]
    if torch_include:
        out += ["-isystem", torch_include, "-isystem", os.path.join(torch_include, "torch/csrc/api/include")]
    skip_next = False
    for arg in args[1:]:
        if skip_next:
            skip_next = False
        elif arg == "-o" or (torch_include and arg == "-isystem"):
            skip_next = True  # the output, or the build's own libtorch headers
        elif arg == "-c":
            pass
        elif arg.startswith("-std=") and std:
            out.append("-std=" + std)
        else:
            out.append(arg)
    if std and ("-std=" + std) not in out:
        out.append("-std=" + std)
    out.append("-fsyntax-only")
    if torch_include:
        out.append("-H")  # lists every header opened, to find 1.13 ones
    return out


def check(entry, std, torch_include):
    result = subprocess.run(syntax_command(entry["command"], std, torch_include), cwd=entry["directory"],
                            capture_output=True, text=True)
    stderr = result.stderr
    problems = []
    if torch_include:
        problems += sorted(set(m.group(0).lstrip(". ") for m in DEBIAN_TORCH_HEADER.finditer(stderr)))[:5]
        stderr = "\n".join(line for line in stderr.splitlines()
                           if not line.startswith(".") and not line.startswith("Multiple include guards")
                           and not line.startswith("/"))
    if result.returncode != 0 or "warning:" in stderr:
        problems.append(stderr)
    return entry["file"], problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("--std", help="e.g. c++20 (default: the build's own)")
    parser.add_argument("--torch-include", help="another libtorch's include/ (checks only the libtorch users)")
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args()
    with open(os.path.join(options.build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    if options.torch_include:
        entries = [e for e in entries if uses_torch(e["command"])]
    if not entries:
        print(f"{options.build_dir}/compile_commands.json lists no translation units to check")
        return 1
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
        results = pool.map(lambda e: check(e, options.std, options.torch_include), entries)
        for path, problems in results:
            if problems:
                failed += 1
                print(f"FAIL {path}\n" + "\n".join(problems), flush=True)
    what = " ".join(filter(None, [options.std and "as " + options.std,
                                  options.torch_include and "against " + options.torch_include]))
    print(f"{len(entries)} translation units {what}: {failed} with errors or warnings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Compiles every translation unit of a build again as C++20, syntax only.

A libtorch from PyTorch 2.14 on refuses C++17 (ATen/ATen.h), and CMakeLists.txt
then builds every target as C++20. No machine here has such a libtorch, so
this check keeps that build working: each command of compile_commands.json
runs with -std=c++20 -fsyntax-only, and any error or warning fails it (fmt
checks format strings at compile time in C++20, and C++20 deprecates or
changes a few C++17 constructs).

Usage: cxx20_syntax.py BUILD_DIR [JOBS]
"""
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys


def cxx20_command(command):
    """The compile command with -std=c++20 -fsyntax-only and no output file."""
    args = shlex.split(command)
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out, skip_next = [], False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg == "-o":
            skip_next = True
        elif arg == "-c":
            pass
        elif arg.startswith("-std="):
            out.append("-std=c++20")
        else:
            out.append(arg)
    if not any(a == "-std=c++20" for a in out):
        out.append("-std=c++20")
    return out + ["-fsyntax-only"]


def check(entry):
    result = subprocess.run(cxx20_command(entry["command"]), cwd=entry["directory"],
                            capture_output=True, text=True)
    problems = result.returncode != 0 or "warning:" in result.stderr
    return entry["file"], problems, result.stderr


def main():
    build_dir = sys.argv[1]
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    with open(os.path.join(build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    if not entries:
        print(f"{build_dir}/compile_commands.json lists no translation units")
        return 1
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for path, problems, stderr in pool.map(check, entries):
            if problems:
                failed += 1
                print(f"FAIL {path}\n{stderr}", flush=True)
    print(f"{len(entries)} translation units as C++20: {failed} with errors or warnings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

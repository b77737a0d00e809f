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

With --pch (the ctest's), translation units compiled with the same flags
share a precompiled header of the umbrella headers many of them include
(ATen/ATen.h, gtest/gtest.h, ...; read from the sources and the project's
headers they include), built once per such group under the checked
standard: parsing libtorch's headers again for every unit was most of the
time of a unit that uses it (probes/memory_tracker.cpp alone: 12.3 s, with
the header precompiled 4.0 s; the whole check on 2 cores: 530 s, 458 s).
A unit is still compiled whole, so its own code is checked as before; it
may see a header it did not include, which the real build still catches.

A unity build (CMAKE_UNITY_BUILD, OOMTUNE_UNITY_BUILD) compiles the sources
of a target in batches, each batch one generated unity_N_cxx.cxx that
#includes them. The check compiles each of those sources alone with its
batch's command: a source must compile on its own (its own #includes, its
own helper names), which a batch no longer shows.

Any error or warning fails. Usage:
  syntax_check.py BUILD_DIR [--std c++20] [--pch] [--torch-include DIR] [--jobs N]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

DEBIAN_TORCH_HEADER = re.compile(r"^\.+ /usr/include/(ATen|c10|torch|caffe2)/\S+", re.M)

# Headers a group's precompiled header may hold: those written in #include
# lines of the sources, each of which compiles on its own. A group gets the
# ones a quarter of its units or more name (measured on probes/: with
# torch/script.h, which 8 of its 29 units name, beside ATen/ATen.h, the
# units took 5-7 s each instead of 6-12).
UMBRELLA_HEADERS = ["ATen/ATen.h", "torch/script.h", "torch/csrc/autograd/autograd.h", "gtest/gtest.h",
                    "nlohmann/json.hpp", "fmt/format.h", "CLI/CLI.hpp", "toml++/toml.h", "benchmark/benchmark.h"]
# Groups smaller than this compile without one: building it costs as much
# as it saves.
MIN_PCH_GROUP = 4
# The project's own macros, which no umbrella header reads: units differing
# only in these can share a precompiled header (GCC accepts one when each
# macro it depends on is defined alike; gcc.gnu.org/onlinedocs/gcc/Precompiled-Headers.html).
PROJECT_MACRO = re.compile(r"^-D(OOMTUNE_\w*|\w+_EXPORTS)(=.*)?$")


UNITY_SOURCE = re.compile(r"/Unity/unity_\d+_cxx\.cxx$")
UNITY_MEMBER = re.compile(r'^#include "([^"]+)"$', re.M)


def split_unity_batches(entries):
    """The entries with every unity batch replaced by one entry per source
    it includes, compiled with the batch's command."""
    out = []
    for entry in entries:
        if not UNITY_SOURCE.search(entry["file"]):
            out.append(entry)
            continue
        with open(entry["file"]) as f:
            members = UNITY_MEMBER.findall(f.read())
        args = shlex.split(entry["command"])
        for member in members:
            command = [member if arg == entry["file"] else arg for arg in args]
            out.append(dict(entry, file=member, command=shlex.join(command)))
    return out


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


def output_of(command):
    """The object file a compile command writes (as ninja names it)."""
    args = shlex.split(command)
    return args[args.index("-o") + 1] if "-o" in args else None


INCLUDE_LINE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def angle_includes(entry):
    """The <...> headers a unit names, in its source or in the project's
    headers it includes ("..." includes, found beside the including file or
    in the command's -I folders), transitively."""
    args = shlex.split(entry["command"])
    include_dirs = [a[2:] for a in args if a.startswith("-I") and len(a) > 2]
    include_dirs += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-I"]
    include_dirs = [os.path.join(entry["directory"], d) for d in include_dirs]
    found, seen, pending = set(), set(), [entry["file"]]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        for kind, name in INCLUDE_LINE.findall(text):
            if kind == "<":
                found.add(name)
                continue
            for folder in [os.path.dirname(path)] + include_dirs:
                candidate = os.path.normpath(os.path.join(folder, name))
                if os.path.isfile(candidate):
                    pending.append(candidate)
                    break
    return found


def pch_group_key(command):
    """The flags that decide whether a precompiled header built for one
    unit serves another: all but the files, the include folders and the
    project's own macros."""
    key, skip = [], False
    for arg in shlex.split(command)[1:]:
        if skip:
            skip = False
        elif arg in ("-o", "-I", "-isystem", "-include"):
            skip = True
        elif arg == "-c" or arg.startswith("-I") or PROJECT_MACRO.match(arg) or not arg.startswith("-"):
            pass
        else:
            key.append(arg)
    return tuple(key)


def unit_id(entry):
    """A unit: its source and object file (a source can be in two targets)."""
    return entry["file"], output_of(entry["command"])


def build_pchs(entries, std, workdir, jobs):
    """{unit_id: the header to -include} for the units of every group that
    got a precompiled header."""
    groups = {}
    for entry in entries:
        groups.setdefault(pch_group_key(entry["command"]), []).append(entry)
    plans = []
    for number, members in enumerate(g for g in groups.values() if len(g) >= MIN_PCH_GROUP):
        named = [angle_includes(e) for e in members]
        headers = [h for h in UMBRELLA_HEADERS if 4 * sum(h in n for n in named) >= len(members)]
        if headers:
            path = os.path.join(workdir, f"group{number}.h")
            with open(path, "w") as f:
                f.writelines(f"#include <{h}>\n" for h in headers)
            plans.append((path, members))

    def build(plan):
        path, members = plan
        args = syntax_command(members[0]["command"], std, None)
        args = [a for a in args if a != "-fsyntax-only" and a != members[0]["file"]]
        args += ["-x", "c++-header", path, "-o", path + ".gch"]
        # A header that does not compile leaves the group without one: its
        # units then report the error themselves.
        ok = subprocess.run(args, cwd=members[0]["directory"], capture_output=True).returncode == 0
        return path, members, ok

    include = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for path, members, ok in pool.map(build, plans):
            if ok:
                include.update((unit_id(e), path) for e in members)
    return include


def check(entry, std, torch_include, pch=None):
    command = syntax_command(entry["command"], std, torch_include)
    if pch:
        command[1:1] = ["-include", pch]
    result = subprocess.run(command, cwd=entry["directory"], capture_output=True, text=True)
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
    parser.add_argument("--pch", action="store_true",
                        help="share precompiled umbrella headers within groups of like units")
    parser.add_argument("--jobs", type=int, default=2)
    options = parser.parse_args()
    if options.pch and options.torch_include:
        parser.error("--pch and --torch-include: -H must list every header the unit opens")
    with open(os.path.join(options.build_dir, "compile_commands.json")) as f:
        entries = split_unity_batches(json.load(f))
    if options.torch_include:
        entries = [e for e in entries if uses_torch(e["command"])]
    if not entries:
        print(f"{options.build_dir}/compile_commands.json lists no translation units to check")
        return 1
    failed = 0
    with tempfile.TemporaryDirectory(prefix="oomtune-syntax-") as workdir:
        pchs = {}
        if options.pch:
            pchs = build_pchs(entries, options.std, workdir, options.jobs)
        with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
            results = pool.map(lambda e: check(e, options.std, options.torch_include, pchs.get(unit_id(e))), entries)
            for path, problems in results:
                if problems:
                    failed += 1
                    print(f"FAIL {path}\n" + "\n".join(problems), flush=True)
    what = " ".join(filter(None, [options.std and "as " + options.std,
                                  options.torch_include and "against " + options.torch_include]))
    shared = f" ({len(pchs)} with a precompiled header)" if options.pch else ""
    print(f"{len(entries)} translation units {what}{shared}: {failed} with errors or warnings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""diagnose's optimizer table (diagnose/optimizer_kind.cpp) against a
measurement of the installed torch (scripts/measure_optimizer_temporaries.py):
each optimizer's states per parameter and the temporaries of its foreach
and single-tensor arithmetic, as one first step on the CPU allocates them.
A torch upgrade that changes what an optimizer allocates fails here.

    optimizer_table_test.py SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys

source = sys.argv[1]
table_file = os.path.join(source, "diagnose", "optimizer_kind.cpp")
run = subprocess.run([sys.executable, os.path.join(source, "scripts", "measure_optimizer_temporaries.py"), "--json"],
                     capture_output=True, text=True)
if run.returncode == 77:
    print(run.stdout.strip())
    sys.exit(77)
if run.returncode != 0:
    print(f"FAIL: measure_optimizer_temporaries.py exited {run.returncode}: {run.stderr[-2000:]}")
    sys.exit(1)
measured = json.loads(run.stdout)

# Rows: {"optim/FILE.py", {"NAME", STATES, "...", "...", "...", FOREACH, SINGLE, FUSED, STATES_IN_ARITHMETIC}}
text = re.sub(r"//[^\n]*", "", open(table_file).read())
text = re.sub(r"\s+", " ", text)
rows = re.findall(r'\{"optim/(\w+)\.py", \{"([\w/]+)", (-?\d+), "[^"]*", "[^"]*", "[^"]*", (-?\d+), (-?\d+), '
                  r'(true|false), (?:true|false)\}\}', text)
if len(rows) < 10:
    print(f"FAIL: read {len(rows)} rows of the table in {table_file}")
    sys.exit(1)

failures = []
checked = 0
for file, name, states, foreach, single, fused in rows:
    # adam.py runs Adam and AdamW; the measurement names the class.
    classes = ["Adam", "AdamW"] if name == "Adam/AdamW" else [name]
    for cls in classes:
        for implementation, figure in (("foreach", int(foreach)), ("single_tensor", int(single))):
            m = measured.get(f"{cls} {implementation}")
            if m is None:
                continue
            checked += 1
            # Adagrad's state is made when it is built, before the measured step.
            expected_states = int(states)
            if m["states_per_parameter"] != expected_states:
                failures.append(f"{cls} {implementation}: the table says {expected_states} states per parameter, "
                                f"torch allocates {m['states_per_parameter']}")
            if figure < 0:
                continue  # not modelled
            if m["temporaries"] != figure:
                failures.append(f"{cls} {implementation}: the table says {figure} {m['temporaries_unit']} of "
                                f"temporaries, torch allocates {m['temporaries']}")
        if fused == "true" and f"{cls} fused" in measured and measured[f"{cls} fused"]["temporaries"] != 0:
            failures.append(f"{cls} fused: temporaries {measured[f'{cls} fused']['temporaries']}, the table says none")

if checked < 15:
    failures.append(f"only {checked} figures compared")
for f in failures:
    print("FAIL:", f)
print(f"{checked} figures compared, {len(failures)} differ")
sys.exit(1 if failures else 0)

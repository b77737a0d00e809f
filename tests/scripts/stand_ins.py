"""What the tests of scripts/*.py share: stand-in executables that print
known figures in place of oomtune or PyTorch, and checks that count their
failures."""

import os
import stat
import sys


def executable(folder, name, body):
    """A Python program at folder/name that runs `body`; its path."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\n{body}")
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


class Checks:
    """Named expectations: each prints ok or FAIL; exit_status() is 1 after any failure."""

    def __init__(self):
        self.failures = 0

    def expect_in(self, name, needle, text):
        if needle in text:
            print(f"ok   {name}")
        else:
            print(f"FAIL {name}: {needle!r} not in\n{text}", file=sys.stderr)
            self.failures += 1

    def exit_status(self):
        return 1 if self.failures else 0

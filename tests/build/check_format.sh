#!/bin/sh
# The C++ sources follow .clang-format (issue #45): clang-format --dry-run
# -Werror over every .cpp and .h under the project's code folders. One line
# per file that differs; run `clang-format -i FILE` to fix it. The version is
# Debian 12's clang-format 14 (setup.sh installs it): another version may
# format some constructs differently.
set -eu
cd "$(dirname "$0")/../.."
if ! command -v clang-format >/dev/null; then
  echo "check_format: clang-format is not installed (setup.sh installs Debian's clang-format)" >&2
  exit 1
fi
status=0
for f in $(find common compat allocsim job probes session strategies search trial report recipes diagnose src tests bench examples -name '*.cpp' -o -name '*.h' | sort); do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "check_format: $f is not clang-formatted (clang-format -i $f)"
    status=1
  fi
done
exit $status

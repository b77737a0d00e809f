#!/usr/bin/env bash
# setup.sh with OOMTUNE_TORCH=python refuses a PyTorch it cannot build
# against, with one line and exit 2, before it configures anything. Each
# case puts a fake python3 first on PATH whose torch answers as that case's
# PyTorch would; everything else goes to the real /usr/bin/python3.
# Usage: python_torch_checks.sh SOURCE_DIR
set -uo pipefail
source_dir="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

# fake_python NAME PREFIX ABI: a python3 whose torch has cmake_prefix_path
# PREFIX, compiled_with_cxx11_abi() ABI and version 2.5.1+cu124, printed in
# that order as setup.sh asks for them; PREFIX "none" means no torch.
fake_python() {
  mkdir -p "$work/$1"
  cat > "$work/$1/python3" <<SCRIPT
#!/bin/sh
if [ "$2" = none ]; then echo "ModuleNotFoundError: No module named 'torch'" >&2; exit 1; fi
case "\$2" in
  *cmake_prefix_path*compiled_with_cxx11_abi*__version__*) printf '%s\n' "$2" "$3" "2.5.1+cu124" ;;
  *) exec /usr/bin/python3 "\$@" ;;
esac
SCRIPT
  chmod +x "$work/$1/python3"
}

# expect CASE MESSAGE: setup.sh exits 2 with exactly MESSAGE on stderr and
# leaves no build directory behind.
expect() {
  local err status
  err="$(PATH="$work/$1:$PATH" OOMTUNE_TORCH=python OOMTUNE_BUILD_DIR="$work/build_$1" \
         "$source_dir/setup.sh" 2>&1 >/dev/null)"
  status=$?
  if [ "$status" -ne 2 ] || [ "$err" != "$2" ] || [ -e "$work/build_$1" ]; then
    echo "FAIL $1: exit $status, stderr:" >&2
    echo "  got:  $err" >&2
    echo "  want: $2" >&2
    failures=$((failures + 1))
  else
    echo "ok   $1"
  fi
}

fake_python no_torch none 1
expect no_torch "setup: OOMTUNE_TORCH=python, but $work/no_torch/python3 cannot import torch"

mkdir -p "$work/debian_like"  # like Debian's python3-torch: no share/cmake
fake_python no_config "$work/debian_like/share/cmake" 1
expect no_config "setup: OOMTUNE_TORCH=python, but the PyTorch of $work/no_config/python3 has no \
$work/debian_like/share/cmake/Torch/TorchConfig.cmake (Debian's python3-torch ships none; the wheels from \
pytorch.org and PyPI do); run without OOMTUNE_TORCH to build against Debian's libtorch-dev"

mkdir -p "$work/wheel/share/cmake/Torch" && touch "$work/wheel/share/cmake/Torch/TorchConfig.cmake"
fake_python old_abi "$work/wheel/share/cmake" 0
expect old_abi "setup: OOMTUNE_TORCH=python, but the PyTorch of $work/old_abi/python3 (2.5.1+cu124) uses the \
pre-C++11 libstdc++ ABI (_GLIBCXX_USE_CXX11_ABI=0), which Debian's libraries cannot link with; use PyTorch 2.7 \
or newer"

exit $((failures > 0))

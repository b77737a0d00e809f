#!/usr/bin/env bash
# setup.sh refuses what it cannot build with in one line and exit 2:
#   - an OOMTUNE_TORCH it does not know;
#   - OOMTUNE_TORCH=python with a PyTorch it cannot build against, before it
#     configures anything;
#   - a CUDA PyTorch with no CUDA toolkit for Torch's CMake config to find,
#     after CMake failed (its messages first, the advice last);
#   - OOMTUNE_DEPS that is no directory, or with no libtorch-dev installed;
#     and with OOMTUNE_DEPS it installs no package.
# Each case puts fake programs first on PATH: python3 answering as that
# case's PyTorch would (everything else goes to the real /usr/bin/python3),
# and apt-get, dpkg-query and dpkg that record a call and fail.
# The cases that reach the package check keep an OOMTUNE_DEPS that ctest sets
# (a build from a prefix, as on the GPU machine), so that they install nothing.
# Usage: setup_checks.sh SOURCE_DIR
set -uo pipefail
source_dir="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

# fake_python NAME PREFIX ABI: a python3 whose torch has cmake_prefix_path
# PREFIX, compiled_with_cxx11_abi() ABI, version 2.5.1+cu124 and CUDA 12.4,
# printed in that order as setup.sh asks for them; PREFIX "none" means no
# torch.
fake_python() {
  mkdir -p "$work/$1"
  cat > "$work/$1/python3" <<SCRIPT
#!/bin/sh
if [ "$2" = none ]; then echo "ModuleNotFoundError: No module named 'torch'" >&2; exit 1; fi
case "\$2" in
  *cmake_prefix_path*compiled_with_cxx11_abi*__version__*version.cuda*) printf '%s\n' "$2" "$3" "2.5.1+cu124" "12.4" ;;
  *) exec /usr/bin/python3 "\$@" ;;
esac
SCRIPT
  chmod +x "$work/$1/python3"
}

# fake_apt NAME: apt-get, dpkg-query and dpkg in $work/NAME that append
# their command line to $work/apt_calls and fail.
fake_apt() {
  mkdir -p "$work/$1"
  for program in apt-get dpkg-query dpkg; do
    printf '#!/bin/sh\necho "%s $*" >> "%s"\nexit 1\n' "$program" "$work/apt_calls" > "$work/$1/$program"
    chmod +x "$work/$1/$program"
  done
}

# expect CASE STATUS WHEN MESSAGE [ENV...]: setup.sh, run with
# OOMTUNE_TORCH=python and then the ENV assignments (env(1) arguments),
# under the command in the array `wrap` if set, exits STATUS. WHEN "before":
# MESSAGE is the whole stderr and no build directory was made. WHEN "after"
# (CMake ran): MESSAGE is the last line of stderr.
wrap=()
expect() {
  local case="$1" want_status="$2" when="$3" want="$4" err status got
  shift 4
  err="$("${wrap[@]}" env PATH="$work/$case:$PATH" OOMTUNE_TORCH=python OOMTUNE_BUILD_DIR="$work/build_$case" \
         "$@" "$source_dir/setup.sh" 2>&1 >/dev/null)"
  status=$?
  got="$err"
  if [ "$when" = after ]; then got="$(printf '%s\n' "$err" | tail -n 1)"; fi
  if [ "$status" -ne "$want_status" ] || [ "$got" != "$want" ] ||
     { [ "$when" = before ] && [ -e "$work/build_$case" ]; }; then
    echo "FAIL $case: exit $status (want $want_status), stderr:" >&2
    echo "  got:  $err" >&2
    echo "  want: $want" >&2
    failures=$((failures + 1))
  else
    echo "ok   $case"
  fi
}

expect unknown_torch 2 before "setup: OOMTUNE_TORCH=conda: expected debian, pypi or python" OOMTUNE_TORCH=conda

fake_python no_torch none 1
expect no_torch 2 before "setup: OOMTUNE_TORCH=python, but $work/no_torch/python3 cannot import torch"

mkdir -p "$work/debian_like"  # like Debian's python3-torch: no share/cmake
fake_python no_config "$work/debian_like/share/cmake" 1
expect no_config 2 before "setup: OOMTUNE_TORCH=python, but the PyTorch of $work/no_config/python3 has no \
$work/debian_like/share/cmake/Torch/TorchConfig.cmake (Debian's python3-torch ships none; the wheels from \
pytorch.org and PyPI do); run without OOMTUNE_TORCH to build against Debian's libtorch-dev"

mkdir -p "$work/wheel/share/cmake/Torch" && touch "$work/wheel/share/cmake/Torch/TorchConfig.cmake"
fake_python old_abi "$work/wheel/share/cmake" 0
expect old_abi 2 before "setup: OOMTUNE_TORCH=python, but the PyTorch of $work/old_abi/python3 (2.5.1+cu124) uses \
the pre-C++11 libstdc++ ABI (_GLIBCXX_USE_CXX11_ABI=0), which Debian's libraries cannot link with; use PyTorch 2.7 \
or newer"

# A CUDA wheel's TorchConfig.cmake looks for the CUDA toolkit again
# (cmake/Caffe2Config.cmake.in, cmake/public/cuda.cmake) and fails without
# one; this config fails as that one would.
mkdir -p "$work/cuda_wheel/share/cmake/Torch"
echo 'message(FATAL_ERROR "Your installed Caffe2 version uses CUDA but I cannot find the CUDA libraries.")' \
  > "$work/cuda_wheel/share/cmake/Torch/TorchConfig.cmake"
fake_python cuda_no_toolkit "$work/cuda_wheel/share/cmake" 1
no_nvcc_path=""  # PATH without the folders that hold an nvcc
IFS=: read -r -a path_dirs <<< "$PATH"
for dir in "${path_dirs[@]}"; do
  if [ ! -e "$dir/nvcc" ]; then no_nvcc_path="${no_nvcc_path:+$no_nvcc_path:}$dir"; fi
done
no_toolkit=(cuda_no_toolkit 2 after "setup: the PyTorch at $work/cuda_wheel/share/cmake (2.5.1+cu124) was built \
with CUDA 12.4, and CMake needs the CUDA toolkit to build against it, but no nvcc was found (CUDACXX, PATH, \
CUDA_HOME, CUDA_PATH, /usr/local/cuda); install the CUDA 12.4 toolkit or set CUDACXX to its nvcc"
            CUDACXX= CUDA_HOME= CUDA_PATH= PATH="$work/cuda_no_toolkit:$no_nvcc_path")
if [ ! -e /usr/local/cuda ]; then
  expect "${no_toolkit[@]}"
elif unshare -rm true 2>/dev/null; then
  # This machine has a toolkit at /usr/local/cuda: hide it from setup.sh.
  mkdir -p "$work/empty"
  wrap=(unshare -rm bash -c 'mount --bind "$0" /usr/local/cuda && exec "$@"' "$work/empty")
  expect "${no_toolkit[@]}"
  wrap=()
else
  echo "skip cuda_no_toolkit: /usr/local/cuda exists and cannot be hidden (no unshare -rm)"
fi
# With an nvcc the failure is CMake's own: no toolkit advice.
fake_python cuda_toolkit "$work/cuda_wheel/share/cmake" 1
printf '#!/bin/sh\nexit 0\n' > "$work/cuda_toolkit/nvcc" && chmod +x "$work/cuda_toolkit/nvcc"
expect cuda_toolkit 1 after "setup: configuring $work/build_cuda_toolkit failed (CMake's messages above)"

# OOMTUNE_DEPS installs nothing: the fakes record any apt-get or dpkg-query
# call (dpkg -L libtorch-dev fails as it does without the package).
fake_apt deps_missing
expect deps_missing 2 before "setup: OOMTUNE_DEPS=$work/nowhere is not a directory (make it with \
../shared/device/pack-deps: .device-deps/usr)" OOMTUNE_TORCH=debian OOMTUNE_DEPS="$work/nowhere"
fake_apt deps_no_libtorch
mkdir -p "$work/deps/usr"
expect deps_no_libtorch 2 before "setup: Debian's libtorch-dev is not installed (with OOMTUNE_DEPS nothing is \
installed); install it, or build against the PyTorch of python3: OOMTUNE_TORCH=python" \
  OOMTUNE_TORCH=debian OOMTUNE_DEPS="$work/deps/usr"
if grep -v '^dpkg -L' "$work/apt_calls" 2>/dev/null; then
  echo "FAIL deps_no_libtorch: with OOMTUNE_DEPS setup.sh still ran the package tools above" >&2
  failures=$((failures + 1))
fi

exit $((failures > 0))

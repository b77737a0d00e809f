#!/usr/bin/env bash
# oomtune set-up: installs the Debian packages it builds with (idempotent;
# as root or with sudo), configures and builds into build/, and exports the
# example models. Then, by the first argument:
#   ./setup.sh              set up only
#   ./setup.sh --example    set up what the example needs (the oomtune
#                           executable, its trial module, the example GPT),
#                           then run the main job on it
#   ./setup.sh --test       set up and run the whole test suite (ctest) in
#                           both configurations, Debian's libtorch 1.13 into
#                           build/, then PyPI's PyTorch into build-pypi/;
#                           with OOMTUNE_TORCH set, in that one only. The
#                           PyPI one also installs the training frameworks
#                           (DeepSpeed, transformers, Accelerate, Lightning,
#                           PEFT) into .venv-pypi/, and runs the tests in
#                           which they load and run what `oomtune emit`
#                           writes (tests/frameworks/)
#
# Which libtorch (OOMTUNE_TORCH):
#   debian  Debian's libtorch-dev 1.13, CPU only (the default)
#   pypi    the PyTorch wheel PyPI serves (2.x, built with CUDA), pinned with
#           its dependencies in scripts/pypi-constraints.txt and installed
#           into the project's own virtual environment .venv-pypi/ (made by
#           Debian's python3 -m venv); built into build-pypi/ with the CUDA
#           code compiled (nvcc and the CUDA headers from the toolkit in
#           /usr/local/cuda, CUDACXX or PATH). The build for people who train
#           on GPUs; trials run on the CPU where there is no GPU.
#   python  the PyTorch of `python3` on PATH (its
#           torch.utils.cmake_prefix_path): a PyTorch of one's own, such as
#           the GPU machine's.
# OOMTUNE_PYTHON (default /usr/bin/python3, Debian's, with python3-torch and
# python3-torchvision) exports the example and test models.
# OOMTUNE_DEPS=DIR installs no packages: the libraries are already under the
# prefix DIR (e.g. .device-deps/usr from ../shared/device/pack-deps on a
# machine without Debian's package registry).
# OOMTUNE_BUILD_DIR overrides build/; OOMTUNE_BUILD_TYPE overrides Release;
# OOMTUNE_BUILD_TARGETS builds only those targets (scripts/device_check.sh:
# "oomtune oomtune_trial_module" where no test runs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# Whether CMake can find a CUDA compiler: the places its CUDA language and
# FindCUDA/FindCUDAToolkit look by default.
cuda_compiler_found() {
  local candidate
  for candidate in "${CUDACXX:-}" "$(command -v nvcc || true)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" \
                   "${CUDA_PATH:+$CUDA_PATH/bin/nvcc}" /usr/local/cuda/bin/nvcc; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then return 0; fi
  done
  return 1
}

mode="${1:-}"
case "$mode" in
  ""|--example|--test) ;;
  *) echo "usage: ./setup.sh [--example|--test]" >&2; exit 2 ;;
esac

# The whole suite in both configurations, one after the other; both run
# whatever the first gave, and the exit status is the first failure's.
if [ "$mode" = --test ] && [ -z "${OOMTUNE_TORCH:-}" ]; then
  status=0
  for source in debian pypi; do
    echo "setup: the test suite against the $source libtorch" >&2
    build_override=()
    if [ -n "${OOMTUNE_BUILD_DIR:-}" ] && [ "$source" = pypi ]; then
      build_override=(OOMTUNE_BUILD_DIR="$OOMTUNE_BUILD_DIR-pypi")
    fi
    env "${build_override[@]}" OOMTUNE_TORCH="$source" ./setup.sh --test || { code=$?; [ "$status" -ne 0 ] || status=$code; }
  done
  exit "$status"
fi

torch_source="${OOMTUNE_TORCH:-debian}"
case "$torch_source" in
  debian|pypi|python) ;;
  *) echo "setup: OOMTUNE_TORCH=$torch_source: expected debian, pypi or python" >&2; exit 2 ;;
esac
default_build_dir=build
if [ "$torch_source" = pypi ]; then default_build_dir=build-pypi; fi
build_dir="${OOMTUNE_BUILD_DIR:-$default_build_dir}"
build_type="${OOMTUNE_BUILD_TYPE:-Release}"
python="${OOMTUNE_PYTHON:-/usr/bin/python3}"
python="$(command -v "$python" || echo "$python")"  # a path: the tests check that it exists
deps="${OOMTUNE_DEPS:-}"
if [ -n "$deps" ]; then
  if [ ! -d "$deps" ]; then
    echo "setup: OOMTUNE_DEPS=$deps is not a directory (make it with ../shared/device/pack-deps: .device-deps/usr)" >&2
    exit 2
  fi
  deps="$(cd "$deps" && pwd)"
fi

# The libtorch to build against, as the directory of its TorchConfig.cmake.
prefix_path=()
torch_cuda=""
# use_python_torch PYTHON: the PyTorch of PYTHON, or one line and exit 2 if
# it cannot be built against.
use_python_torch() {
  local torch_python="$1" torch_cxx11_abi
  # One import of torch (seconds for a CUDA wheel): its CMake prefix, ABI, version.
  if ! torch_facts="$("$torch_python" -c 'import torch; print(torch.utils.cmake_prefix_path);
print(int(torch.compiled_with_cxx11_abi())); print(torch.__version__); print(torch.version.cuda or "")' 2>/dev/null)"; then
    echo "setup: OOMTUNE_TORCH=$torch_source, but $torch_python cannot import torch" >&2
    exit 2
  fi
  { read -r torch_prefix; read -r torch_cxx11_abi; read -r torch_version; read -r torch_cuda; } <<< "$torch_facts"
  torch_dir="$torch_prefix/Torch"
  if [ ! -f "$torch_dir/TorchConfig.cmake" ]; then
    echo "setup: OOMTUNE_TORCH=$torch_source, but the PyTorch of $torch_python has no $torch_dir/TorchConfig.cmake" \
         "(Debian's python3-torch ships none; the wheels from pytorch.org and PyPI do); run without OOMTUNE_TORCH" \
         "to build against Debian's libtorch-dev" >&2
    exit 2
  fi
  # Every TU must use the libstdc++ ABI of libtorch, and Debian's compiled
  # GoogleTest, toml++ and Google Benchmark use the C++11 one. PyTorch wheels
  # do from 2.7 on (pytorch/pytorch #143962); older ones would fail to link.
  if [ "$torch_cxx11_abi" != 1 ]; then
    echo "setup: OOMTUNE_TORCH=$torch_source, but the PyTorch of $torch_python ($torch_version) uses the pre-C++11" \
         "libstdc++ ABI (_GLIBCXX_USE_CXX11_ABI=0), which Debian's libraries cannot link with; use PyTorch 2.7" \
         "or newer" >&2
    exit 2
  fi
  # Searched before /usr, so that Torch's own find_package(Caffe2) cannot
  # pick Debian's Caffe2 config when libtorch-dev is installed too, and the
  # torch package itself (torch/share/cmake/../..), so that TorchConfig's
  # find_library(TORCH_LIBRARY torch PATHS <torch>/lib), which searches the
  # system first, finds torch/lib/libtorch.so and not Debian's
  # /usr/lib/<arch>/libtorch.so (and likewise c10) where both are installed.
  prefix_path=("$torch_prefix" "$(dirname "$(dirname "$torch_prefix")")")
  echo "setup: building against the PyTorch at $torch_prefix ($torch_version)" >&2
}
# A PyTorch of one's own that cannot be built against is refused before
# anything is installed.
if [ "$torch_source" = python ]; then use_python_torch "$(command -v python3 || echo python3)"; fi

# libopenblas0-openmp: Debian's libtorch and python3-torch call BLAS through
# libblas.so.3, which without a BLAS package is the reference BLAS (libblas3):
# the example GPT's plain micro-batch 16 ran 9.3 samples/s with it and 97.8
# with OpenBLAS (same bytes; 2-core AMD EPYC, 2026-11-28), and its autotune
# took 267 s against 33 s. The OpenMP build shares libtorch's libgomp, so
# torch's thread count bounds it too (the pthread build starts threads of
# its own in every trial process).
packages=(build-essential cmake ninja-build ccache pkg-config
          libcli11-dev libtomlplusplus-dev libtomlplusplus3 libfmt-dev nlohmann-json3-dev
          zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev clang-format
          python3-torch python3-torchvision python3-yaml python3-venv libopenblas0-openmp)
if [ "$torch_source" = debian ]; then packages+=(libtorch-dev); fi

missing=()
if [ -n "$deps" ]; then
  prefix_path+=("$deps")
else
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# PyPI's PyTorch, as scripts/pypi-constraints.txt pins it (with every
# package it brings), in the project's own virtual environment; pip leaves
# what already matches as it is.
frameworks_args=()  # the Python of the framework tests, for CMake (--test only)
if [ "$torch_source" = pypi ]; then
  venv=.venv-pypi
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: making the virtual environment $venv" >&2
    /usr/bin/python3 -m venv "$venv"
  fi
  echo "setup: installing PyTorch from PyPI into $venv (scripts/pypi-constraints.txt)" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check --constraint scripts/pypi-constraints.txt torch
  use_python_torch "$PWD/$venv/bin/python"
  if [ "$mode" = --test ]; then
    # The frameworks of tests/frameworks, pinned in the same file, beside the
    # PyTorch above (nothing downloaded twice). DeepSpeed is a source
    # package built against that PyTorch (hence no build isolation), for
    # its CPU accelerator, with the CPU ops the tests use compiled now (CPU
    # Adam for offload, fused Adam, shared-memory communication): compiled
    # at the first test instead (JIT), they take minutes.
    # Only the tests need them, so they install while oomtune is configured
    # and built (wait_for_frameworks): DeepSpeed's build compiles one file
    # at a time, and pip unpacks on one core, which leaves the other to the
    # build. In a fresh-clone CI run here, install and build took 714 s
    # together against 313 s + 471 s one after the other.
    frameworks=(deepspeed transformers accelerate lightning peft)
    frameworks_log="$(mktemp "${TMPDIR:-/tmp}/oomtune-frameworks.XXXXXX")"
    echo "setup: installing ${frameworks[*]} into $venv for the framework tests (scripts/pypi-constraints.txt)," \
         "beside the build" >&2
    frameworks_start=$SECONDS
    # setsid: pip leads a process group of its own, so that an exit before
    # the tests (a failed build) stops it and the compilers it started.
    DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_CPU_ADAM=1 DS_BUILD_FUSED_ADAM=1 DS_BUILD_SHM_COMM=1 \
      setsid "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
        --constraint scripts/pypi-constraints.txt "${frameworks[@]}" >"$frameworks_log" 2>&1 &
    frameworks_pid=$!
    trap 'kill -- -"$frameworks_pid" 2>/dev/null; rm -f "$frameworks_log"' EXIT
    frameworks_args=(-DOOMTUNE_FRAMEWORKS_PYTHON:FILEPATH="$PWD/$venv/bin/python")
  fi
fi

# wait_for_frameworks: the framework install started above, if any, has
# finished; its output, and exit 1, if it failed.
wait_for_frameworks() {
  [ -n "${frameworks_pid:-}" ] || return 0
  if ! wait "$frameworks_pid"; then
    cat "$frameworks_log" >&2
    echo "setup: installing ${frameworks[*]} into $venv failed (pip's messages above)" >&2
    exit 1
  fi
  echo "setup: ${frameworks[*]} installed in $((SECONDS - frameworks_start)) s, beside the build" >&2
  trap - EXIT
  rm -f "$frameworks_log"
}

if [ "$torch_source" = debian ]; then
  if ! torch_config="$(dpkg -L libtorch-dev 2>/dev/null | grep '/TorchConfig\.cmake$')"; then
    echo "setup: Debian's libtorch-dev is not installed (with OOMTUNE_DEPS nothing is installed); install it," \
         "or build against the PyTorch of python3: OOMTUNE_TORCH=python" >&2
    exit 2
  fi
  torch_dir="$(dirname "$(head -n 1 <<< "$torch_config")")"
fi

# A build directory configured against the other libtorch keeps that one's
# cached paths (Caffe2_DIR, TORCH_LIBRARY, ...): headers of one version would
# be linked with the libraries of the other. Configure it afresh instead.
fresh_args=()
cached_torch_dir="$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build_dir/CMakeCache.txt" 2>/dev/null || true)"
if [ -f "$build_dir/CMakeCache.txt" ] && [ "$cached_torch_dir" != "$torch_dir" ]; then
  echo "setup: $build_dir was configured against another libtorch; configuring it afresh" >&2
  fresh_args=(--fresh)
fi

prefix_args=()
if [ "${#prefix_path[@]}" -gt 0 ]; then
  prefix_args=(-DCMAKE_PREFIX_PATH="$(IFS=';'; echo "${prefix_path[*]}")")
fi
if ! cmake "${fresh_args[@]}" -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" \
       -DTorch_DIR:PATH="$torch_dir" -DOOMTUNE_PYTHON:FILEPATH="$python" -DOOMTUNE_DEPS:PATH="$deps" \
       "${prefix_args[@]}" "${frameworks_args[@]}" >/dev/null; then
  # Torch's CMake config of a CUDA build finds the CUDA toolkit again
  # (cmake/public/cuda.cmake: find_package(CUDA), enable_language(CUDA)) and
  # fails with a page of CMake output when there is none.
  if [ -n "$torch_cuda" ] && ! cuda_compiler_found; then
    echo "setup: the PyTorch at $torch_prefix ($torch_version) was built with CUDA $torch_cuda, and CMake" \
         "needs the CUDA toolkit to build against it, but no nvcc was found (CUDACXX, PATH, CUDA_HOME," \
         "CUDA_PATH, /usr/local/cuda); install the CUDA $torch_cuda toolkit or set CUDACXX to its nvcc" >&2
    exit 2
  fi
  echo "setup: configuring $build_dir failed (CMake's messages above)" >&2
  exit 1
fi
# nproc answers OMP_NUM_THREADS when it is set (coreutils): a user who keeps
# OMP_NUM_THREADS=1 for training would build on one core.
cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
if [ "$mode" = --example ]; then
  # What the main job runs: the executable and the trial module it loads.
  cmake --build "$build_dir" -j"$cores" --target oomtune oomtune_trial_module
  "$python" examples/export_models.py --if-missing --only gpt
else
  # shellcheck disable=SC2086  # OOMTUNE_BUILD_TARGETS is a list of targets
  cmake --build "$build_dir" -j"$cores" ${OOMTUNE_BUILD_TARGETS:+--target $OOMTUNE_BUILD_TARGETS}
  "$python" examples/export_models.py --if-missing
fi

case "$mode" in
  --example)
    exec "$build_dir/oomtune" autotune examples/gpt.toml ;;
  --test)
    wait_for_frameworks
    exec ctest --test-dir "$build_dir" --output-on-failure -j"$cores" ;;
esac

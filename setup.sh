#!/usr/bin/env bash
# oomtune set-up: installs the Debian packages it builds with (idempotent;
# as root or with sudo), configures and builds into build/, and exports the
# example models. Then, by the first argument:
#   ./setup.sh              set up only
#   ./setup.sh --example    set up, then run the main job on the example GPT
#   ./setup.sh --test       set up, then run the whole test suite (ctest)
#
# OOMTUNE_TORCH=python builds against the PyTorch of `python3` (its
# torch.utils.cmake_prefix_path) instead of Debian's libtorch-dev: the way
# to read models exported by PyTorch 2.x that use newer operators.
# OOMTUNE_BUILD_DIR overrides build/; OOMTUNE_BUILD_TYPE overrides Release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

mode="${1:-}"
case "$mode" in
  ""|--example|--test) ;;
  *) echo "usage: ./setup.sh [--example|--test]" >&2; exit 2 ;;
esac

build_dir="${OOMTUNE_BUILD_DIR:-build}"
build_type="${OOMTUNE_BUILD_TYPE:-Release}"
torch_source="${OOMTUNE_TORCH:-debian}"

packages=(build-essential cmake ninja-build ccache pkg-config
          libcli11-dev libtomlplusplus-dev libtomlplusplus3 libfmt-dev nlohmann-json3-dev
          zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
          python3-torch python3-torchvision)
if [ "$torch_source" = debian ]; then packages+=(libtorch-dev); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

prefix_args=()
if [ "$torch_source" = python ]; then
  torch_prefix="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
  prefix_args=(-DCMAKE_PREFIX_PATH="$torch_prefix")
  echo "setup: building against the PyTorch at $torch_prefix" >&2
fi

cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "${prefix_args[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
/usr/bin/python3 examples/export_models.py --if-missing

case "$mode" in
  --example)
    exec "$build_dir/oomtune" autotune examples/gpt.toml ;;
  --test)
    exec ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" ;;
esac

#!/usr/bin/env bash
# Install the peer transducer losses that scripts/benchmark_transducer_loss.py compares
# against. Never needed for training.
#
#   bash scripts/install_bench_peers.sh        # from the repository, with .venv present
#
# - warprnnt-numba (NeMo's numba loss): from PyPI, the `bench` extra, into .venv.
# - optimized_transducer 1.4, fast_rnnt 1.3 (k2-fsa): only as source. Their CMake downloads
#   pybind11 from GitHub (swapped here for PyPI's pybind11) and asks for C++14 (raised to
#   17, which torch's headers need). With a CUDA toolkit (nvcc) they build into .venv with
#   CUDA. Without one, PyPI's torch (a CUDA build) cannot be built against: its
#   Caffe2Config.cmake insists on the CUDA libraries. So they go into a side venv,
#   .venv-peers, with the CPU build of torch 2.13.0 and CUDA turned off; the benchmark
#   runs their workers with that interpreter.
# - warp-rnnt: CUDA only, no CPU implementation; not installed.
# Idempotent: a peer that already imports is skipped. Build with two jobs (MAKEFLAGS).
set -euo pipefail
command -v cmake >/dev/null && command -v c++ >/dev/null || {
  echo "needs cmake and a C++ compiler (apt-get install cmake g++)" >&2; exit 1; }
cd "$(dirname "$0")/.."
repo=$PWD
.venv/bin/python -m pip install --quiet -e ".[bench]"

if command -v nvcc >/dev/null && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python="$repo/.venv/bin/python" with_cuda=ON
else
  python="$repo/.venv-peers/bin/python" with_cuda=OFF
  if [ ! -x "$python" ]; then
    python3.11 -m venv .venv-peers 2>/dev/null || python3 -m venv .venv-peers
  fi
  # The +cpu wheel: from a local find-links directory if pip has one, else PyTorch's index.
  "$python" -m pip install --quiet "torch==2.13.0+cpu" 2>/dev/null ||
    "$python" -m pip install --quiet "torch==2.13.0+cpu" \
      --extra-index-url https://download.pytorch.org/whl/cpu
  "$python" -m pip install --quiet numpy
fi
"$python" -m pip install --quiet pybind11==3.1.0 wheel==0.48.0 setuptools
echo "peers build with $python (CUDA $with_cuda)"

build_dir=${BUILD_DIR:-$(mktemp -d)}
pybind11_dir=$("$python" -m pybind11 --cmakedir)
export MAKEFLAGS=-j2

from_source() {  # package version env-prefix
  local package=$1 version=$2 prefix=$3
  if "$python" -c "import $package" 2>/dev/null; then echo "$package: already installed"; return; fi
  (
    cd "$build_dir"
    "$python" -m pip download --quiet --no-deps --no-binary :all: "$package==$version"
    tar xzf "$package-$version.tar.gz"
    cd "$package-$version"
    printf 'find_package(pybind11 CONFIG REQUIRED)\n' > cmake/pybind11.cmake
    sed -i 's/set(CMAKE_CXX_STANDARD 14/set(CMAKE_CXX_STANDARD 17/' CMakeLists.txt
    export "${prefix}_CMAKE_ARGS=-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
-D${prefix}_WITH_CUDA=$with_cuda -D${prefix}_BUILD_TESTS=OFF -Dpybind11_DIR=$pybind11_dir \
-DPYTHON_EXECUTABLE=$python"
    "$python" -m pip install --quiet --no-build-isolation --no-deps .
  ) && echo "$package: built and installed" || echo "$package: FAILED (see the output above)"
}

from_source optimized_transducer 1.4 OT
from_source fast_rnnt 1.3 FT
echo "warp_rnnt: skipped, it has no CPU implementation"

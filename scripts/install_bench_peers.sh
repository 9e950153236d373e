#!/usr/bin/env bash
# Install the peer transducer losses that scripts/benchmark_transducer_loss.py compares
# against, into the active venv. Never needed for training.
#
#   source .venv/bin/activate && bash scripts/install_bench_peers.sh
#
# - warprnnt-numba (NeMo's numba loss): from PyPI, the `bench` extra.
# - optimized_transducer, fast_rnnt (k2): only as source; their CMake downloads pybind11
#   from GitHub, so the pybind11 from PyPI is used instead (C++17 for torch 2.9 headers).
#   Against PyPI's torch (a CUDA build) their CMake configure stops in torch's
#   Caffe2Config.cmake unless a CUDA toolkit is installed: on a GPU machine they build;
#   on this CPU-only machine they fail with that message.
# - warp-rnnt: CUDA only, no CPU implementation; not installed.
# Idempotent: a peer that already imports is skipped.
set -euo pipefail
command -v cmake >/dev/null && command -v c++ >/dev/null || { echo "needs cmake and a C++ compiler (apt-get install cmake g++)" >&2; exit 1; }
cd "$(dirname "$0")/.."
python -m pip install --quiet -e ".[bench]" pybind11==3.1.0 wheel==0.48.0

build_dir=${BUILD_DIR:-$(mktemp -d)}
pybind11_dir=$(python -m pybind11 --cmakedir)
export MAKEFLAGS=-j2

from_source() {  # package version env-prefix
  local package=$1 version=$2 prefix=$3
  if python -c "import $package" 2>/dev/null; then echo "$package: already installed"; return; fi
  (
    cd "$build_dir"
    python -m pip download --quiet --no-deps --no-binary :all: "$package==$version"
    tar xzf "$package-$version.tar.gz"
    cd "$package-$version"
    printf 'find_package(pybind11 CONFIG REQUIRED)\n' > cmake/pybind11.cmake
    export "${prefix}_CMAKE_ARGS=-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
-D${prefix}_BUILD_TESTS=OFF -Dpybind11_DIR=$pybind11_dir -DPYTHON_EXECUTABLE=$(command -v python)"
    python -m pip install --quiet --no-build-isolation --no-deps .
  ) && echo "$package: built and installed" || echo "$package: FAILED (see the output above)"
}

from_source optimized_transducer 1.4 OT
from_source fast_rnnt 1.3 FT
echo "warp_rnnt: skipped, it has no CPU implementation"

#!/usr/bin/env bash
# Prepare, online, the wheels that scripts/gpu_check.sh installs offline on a GPU machine.
#
#   scripts/prepare_gpu_wheels.sh [DIR] [--python-version 3.12]
#
# The GPU machines reach no package registry. Their image's Python 3.12 already holds torch
# 2.11 (CUDA 13), torchaudio, Triton, Lightning, sentencepiece, numpy, matplotlib, onnx and
# onnxruntime (and what those need: packaging, PyYAML, tqdm, typing-extensions, setuptools
# through torch and Lightning). Everything else the GPU check imports travels as the wheels
# listed below, downloaded here for Linux x86-64 (manylinux) and the target CPython, each with
# --no-deps, so the set is exactly this list and nothing the image has is pulled in again.
# gpu_check.sh installs only those whose distribution the image lacks.
# espeakng-loader is here for the demo on the GPU (gpu_check.sh --demo synthesizes its corpus).
# Not here on purpose: wandb (neither uses it), torch and the rest of the image (large;
# already there).
#
# DIR (default .gpu-wheels, kept out of git) receives the wheels and MANIFEST.txt: a header
# naming the target Python, then one line per wheel with the reason it is there. Existing
# wheels in DIR are replaced, so the folder always matches this list. The total must stay
# within 64 MiB (what the device tool carries); the script fails above that.
#
# Environment: PYTHON (default python3) runs pip here; any version works, since pip downloads
# for the target given by --python-version.
set -euo pipefail

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; }

dir=.gpu-wheels
py_version=3.12
dir_given=0
while (($#)); do
    case "$1" in
        --python-version) py_version=${2:?--python-version needs a value, e.g. 3.12}; shift 2 ;;
        --python-version=*) py_version=${1#*=}; shift ;;
        -h | --help) usage; exit 0 ;;
        -*) echo "prepare_gpu_wheels.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *)
            if ((dir_given)); then echo "prepare_gpu_wheels.sh: one DIR only" >&2; exit 2; fi
            dir=$1; dir_given=1; shift ;;
    esac
done
if [[ ! $py_version =~ ^3\.[0-9]+$ ]]; then
    echo "prepare_gpu_wheels.sh: --python-version must look like 3.12, not '$py_version'" >&2
    exit 2
fi

PYTHON=${PYTHON:-python3}
limit_bytes=$((64 * 1024 * 1024))

# The version pyproject.toml pins for a package ("name==version"), so the two never differ.
pyproject=$(dirname "${BASH_SOURCE[0]}")/../pyproject.toml
pinned() {
    local spec
    spec=$(grep -oiE "\"$1==[^\";]+\"" "$pyproject" | sed -n 1p | tr -d '"')
    [[ -n $spec ]] || { echo "prepare_gpu_wheels.sh: $pyproject pins no $1" >&2; exit 1; }
    echo "$spec"
}

# spec|reason. Versions pinned in pyproject.toml are taken from there; the others are the
# newest releases (checked 2026-11) that satisfy every requirement below, as binary wheels for
# CPython 3.12 on manylinux x86-64.
wheels=(
    # --- pinned in pyproject.toml ---
    "$(pinned lhotse)|pyproject pin: data pipeline (cuts, DynamicBucketingSampler, Fbank)"
    "$(pinned lilcom)|pyproject pin: lhotse's compressed feature storage"
    "$(pinned hydra-core)|pyproject pin: configs of asr-train and asr-oomptimizer"
    "$(pinned omegaconf)|pyproject pin: Hydra's config objects"
    "$(pinned jiwer)|pyproject pin: WER in decoding and validation"
    "$(pinned soundfile)|pyproject pin: audio I/O (bundles libsndfile; lhotse reads audio with it)"
    "$(pinned rich)|pyproject pin: oomptimizer console and Lightning's rich progress bar"
    "$(pinned pyyaml)|pyproject pin: bins and batch-size files, omegaconf (image has it via Lightning: skipped there)"
    "$(pinned espeakng-loader)|pyproject pin: espeak-ng for the demo's corpus (gpu_check.sh --demo)"
    # --- what those need and the image lacks ---
    "rapidfuzz==3.14.6|jiwer 4 needs rapidfuzz>=3.9.7 (manylinux_2_28 wheel)"
    "click==8.5.1|jiwer needs click>=8.1.8, lhotse click>=7.1.1"
    "cffi==2.1.1|soundfile needs cffi>=1.0"
    "pycparser==3.12|cffi needs pycparser"
    "markdown-it-py==4.3.0|rich needs markdown-it-py>=2.2.0"
    "mdurl==0.1.2|markdown-it-py needs mdurl~=0.1"
    "pygments==2.21.0|rich needs pygments>=2.13,<3"
    "audioread==3.1.0|lhotse needs audioread>=2.1.9"
    "cytoolz==1.2.0|lhotse needs cytoolz>=0.10.1"
    "toolz==1.2.0|cytoolz needs toolz>=0.8.0"
    "intervaltree==3.2.1|lhotse needs intervaltree>=3.1.0 (3.2 ships a wheel)"
    "sortedcontainers==2.4.0|intervaltree needs sortedcontainers"
    "tabulate==0.10.0|lhotse needs tabulate>=0.8.1"
    "urllib3==2.8.0|lhotse 1.33 imports it on 'import lhotse' (lhotse/ais/batch_loader.py) without declaring it"
    # --- normally in the image already (gpu_check.sh skips them there); small safety net ---
    "packaging==26.4|lhotse, hydra-core need packaging (image has it via torch/Lightning)"
    "tqdm==4.70.1|lhotse needs tqdm (image has it via Lightning)"
    "typing-extensions==4.16.0|soundfile needs typing-extensions (image has it via torch)"
    # --- installing the project and bootstrapping pip ---
    "setuptools==81.0.0|build backend of the editable install (pyproject: >=68; 81 as torch 2.11 asks <82)"
    "pip==26.3|bootstraps pip in the venv if the image's Python has no ensurepip"
)
# Only as a source release on PyPI: built here with 'pip wheel'. Pure Python, so the wheel is
# py3-none-any and serves any target Python. omegaconf 2.3 and hydra-core 1.3 need ==4.9.*.
built=(
    "antlr4-python3-runtime==4.9.3|omegaconf 2.3 and hydra-core 1.3 need ==4.9.* (sdist only: built here)"
)

norm() { sed -E 's/[-_.]+/-/g' <<<"${1,,}"; }              # PEP 503 name normalization
dist_of_file() { norm "$(basename "$1" | cut -d- -f1)"; } # name part of a wheel file name

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

specs=()
for entry in "${wheels[@]}"; do specs+=("${entry%%|*}"); done
echo "prepare_gpu_wheels.sh: downloading ${#specs[@]} wheels for CPython $py_version, manylinux x86-64"
# manylinux2014 (= _2_17) covers most binary wheels; rapidfuzz and soundfile exist only as
# manylinux_2_27/_2_28 (glibc 2.28, which any CUDA 13 image exceeds).
"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    --python-version "$py_version" --implementation cp \
    --dest "$tmp" "${specs[@]}"

for entry in "${built[@]}"; do
    spec=${entry%%|*}
    echo "prepare_gpu_wheels.sh: building $spec from its source release"
    "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-binary "${spec%%==*}" \
        --wheel-dir "$tmp" "$spec"
done
for f in "$tmp"/antlr4_python3_runtime-*.whl; do
    [[ $f == *-py3-none-any.whl ]] || { echo "prepare_gpu_wheels.sh: $f is not py3-none-any" >&2; exit 1; }
done

# One wheel per spec, and its reason, matched by normalized distribution name.
declare -A reason=()
for entry in "${wheels[@]}" "${built[@]}"; do
    spec=${entry%%|*}
    reason[$(norm "${spec%%==*}")]=${entry#*|}
done
shopt -s nullglob
got=("$tmp"/*.whl)
if ((${#got[@]} != ${#reason[@]})); then
    echo "prepare_gpu_wheels.sh: expected ${#reason[@]} wheels, got ${#got[@]}:" >&2
    printf '  %s\n' "${got[@]##*/}" >&2
    exit 1
fi
for f in "${got[@]}"; do
    [[ -n ${reason[$(dist_of_file "$f")]:-} ]] || { echo "prepare_gpu_wheels.sh: unexpected wheel ${f##*/}" >&2; exit 1; }
done

mkdir -p "$dir"
rm -f "$dir"/*.whl "$dir/MANIFEST.txt"
mv "${got[@]}" "$dir"/
{
    echo "# Wheels for scripts/gpu_check.sh --system-python (offline install, --no-deps)."
    echo "# python-version: $py_version"
    echo "# platform: manylinux x86_64 (glibc >= 2.28), implementation: cp"
    echo "# prepared: $(date -u +%Y-%m-%dT%H:%MZ) by scripts/prepare_gpu_wheels.sh"
    for f in "$dir"/*.whl; do
        printf '%s  # %s\n' "${f##*/}" "${reason[$(dist_of_file "$f")]}"
    done
} >"$dir/MANIFEST.txt"

total=0
for f in "$dir"/*; do total=$((total + $(stat -c %s "$f"))); done
mib=$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')
n=$(find "$dir" -maxdepth 1 -name '*.whl' | wc -l)
echo "prepare_gpu_wheels.sh: $n wheels in $dir, $mib MiB in all (limit 64 MiB); list in $dir/MANIFEST.txt"
if ((total > limit_bytes)); then
    echo "prepare_gpu_wheels.sh: $dir is $mib MiB, over the 64 MiB limit" >&2
    exit 1
fi

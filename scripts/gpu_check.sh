#!/usr/bin/env bash
# Run scripts/gpu_check.py, the GPU bench or the demo recipe, on a GPU machine that reaches no
# package registry.
#
#   scripts/gpu_check.sh --system-python [--python PYTHON] WHEELS_DIR [ARGS...]
#   scripts/gpu_check.sh --system-python [--python PYTHON] WHEELS_DIR --bench [ARGS...]
#   scripts/gpu_check.sh --system-python [--python PYTHON] WHEELS_DIR --demo [RUN_SH_ARGS...]
#
# The machine's own Python (PYTHON, default python3; 3.12 on the GPU image) already holds torch,
# torchaudio, Triton, Lightning, sentencepiece, numpy, matplotlib, onnx and onnxruntime. This
# script makes a venv, .venv-gpu-check, that sees all of them (--system-site-packages), adds from
# WHEELS_DIR (made online by scripts/prepare_gpu_wheels.sh) only the distributions that are not
# installed yet, installs this checkout in editable mode, checks the imports the GPU check
# needs, and runs `python scripts/gpu_check.py ARGS...` in the venv, exiting with its code.
# With --bench it runs `python scripts/gpu_bench.py ARGS...` (make gpu-bench) there instead.
# With --demo it runs `recipes/demo/run.sh RUN_SH_ARGS...` there instead (make demo on the GPU:
# DEVICE=auto picks it; logger=csv is added, as the image has no W&B).
# Nothing is downloaded and nothing of the image is changed: pip runs with --no-index and
# --no-deps and writes into the venv only. A re-run reuses the venv and installs nothing new.
# With network access, `make gpu-check` (and `make gpu-bench`) is the ordinary path.
set -euo pipefail

me=gpu_check.sh
usage() {
    cat <<'EOF'
usage: scripts/gpu_check.sh --system-python [--python PYTHON] WHEELS_DIR [ARGS...]
       scripts/gpu_check.sh --system-python [--python PYTHON] WHEELS_DIR --bench [ARGS...]
       scripts/gpu_check.sh --system-python [--python PYTHON] WHEELS_DIR --demo [RUN_SH_ARGS...]
  Offline GPU check on the machine's own Python (default python3, 3.12 on the GPU image):
  a venv .venv-gpu-check with --system-site-packages, the missing packages from WHEELS_DIR
  (made online by scripts/prepare_gpu_wheels.sh), then scripts/gpu_check.py ARGS...; with
  --bench, scripts/gpu_bench.py ARGS... (the GPU bench); with --demo, recipes/demo/run.sh
  RUN_SH_ARGS... (the demo on the GPU, W&B off).
  With network access, use `make gpu-check` (`make gpu-bench`, `make demo`) instead.
EOF
}
die() { echo "$me: $*" >&2; exit 1; }

if [[ ${1:-} != --system-python ]]; then
    case ${1:-} in -h | --help) usage; exit 0 ;; esac
    usage >&2
    echo "$me: the offline path needs --system-python (online, run \`make gpu-check\`)" >&2
    exit 2
fi
shift
PYTHON=python3
if [[ ${1:-} == --python ]]; then
    PYTHON=${2:?--python needs an interpreter}
    shift 2
elif [[ ${1:-} == --python=* ]]; then
    PYTHON=${1#*=}
    shift
fi
(($#)) || { usage >&2; exit 2; }
wheels_arg=$1
shift
demo= script=gpu_check.py
if [[ ${1:-} == --demo ]]; then demo=1; shift
elif [[ ${1:-} == --bench ]]; then script=gpu_bench.py; shift; fi
wheels=$(cd "$wheels_arg" 2>/dev/null && pwd) \
    || die "wheel folder $wheels_arg not found (make it with scripts/prepare_gpu_wheels.sh $wheels_arg)"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
venv=$root/.venv-gpu-check
start=$SECONDS

# Offline, and only the named wheel files: no index, no machine pip config (mirrors,
# find-links, constraints), no version check.
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CONFIG_FILE=/dev/null
export PIP_NO_WARN_SCRIPT_LOCATION=1

shopt -s nullglob
all_wheels=("$wheels"/*.whl)
((${#all_wheels[@]})) || die "no wheels in $wheels (make them with scripts/prepare_gpu_wheels.sh $wheels_arg)"
want=3.12
if [[ -f $wheels/MANIFEST.txt ]]; then
    w=$(sed -n 's/^# python-version: *//p' "$wheels/MANIFEST.txt")
    want=${w:-$want}
fi

command -v "$PYTHON" >/dev/null || die "Python interpreter '$PYTHON' not found (give one with --python)"
have=$("$PYTHON" -c 'import platform, sys; print("%d.%d %s %s-%s" % (*sys.version_info[:2], sys.implementation.name, sys.platform, platform.machine()))') \
    || die "could not run '$PYTHON'"
[[ $have == "$want cpython linux-x86_64" ]] \
    || die "$PYTHON is Python ${have%% *} (${have#* }); the wheels in $wheels are for CPython $want on linux-x86_64: pass --python python$want, or prepare wheels with --python-version ${have%% *}"

# Reuse the venv when it was made from the same interpreter; otherwise make it anew.
base_id="$(command -v "$PYTHON") $("$PYTHON" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
if [[ -x $venv/bin/python && $(cat "$venv/.base-python" 2>/dev/null) == "$base_id" ]]; then
    echo "$me: reusing $venv"
else
    rm -rf "$venv"
    echo "$me: creating $venv (--system-site-packages) from $PYTHON ($("$PYTHON" -V 2>&1))"
    # A distribution Python may lack ensurepip (Debian without python3.X-venv): then make the
    # venv without pip and bootstrap pip from its wheel below.
    "$PYTHON" -m venv --system-site-packages "$venv" 2>/dev/null \
        || "$PYTHON" -m venv --system-site-packages --without-pip "$venv" \
        || die "could not create a venv with $PYTHON"
    echo "$base_id" >"$venv/.base-python"
fi
py=$venv/bin/python
if ! "$py" -m pip --version >/dev/null 2>&1; then
    pip_whl=("$wheels"/pip-*.whl)
    ((${#pip_whl[@]})) || die "no pip in $venv and no pip wheel in $wheels"
    echo "$me: bootstrapping pip from ${pip_whl[0]##*/}"
    "$py" "${pip_whl[0]}/pip" install --quiet --no-index --no-deps "${pip_whl[0]}"
fi

# The packages of PYTHON itself must be visible in the venv. For a real system Python,
# --system-site-packages already does that (its site-packages, /usr/local/lib/python3.X/
# dist-packages, the user site). When PYTHON is itself a venv (an image emulated by a venv),
# --system-site-packages exposes only its base interpreter, so each site dir of PYTHON missing
# from the venv's sys.path is added by a .pth file (site.addsitedir, which also runs that dir's
# own .pth files). For a real system Python the file stays empty.
purelib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
pth=$purelib/_gpu_check_base_site.pth
rm -f "$pth"
"$py" - "$pth" "$PYTHON" <<'EOF'
import os, subprocess, sys

pth, base = sys.argv[1], sys.argv[2]
code = (
    "import site; print('\\n'.join(site.getsitepackages()"
    " + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])))"
)
out = subprocess.run([base, "-c", code], check=True, capture_output=True, text=True).stdout
seen = {os.path.realpath(p) for p in sys.path if p}
with open(pth, "w") as f:
    for d in out.splitlines():
        if os.path.isdir(d) and os.path.realpath(d) not in seen:
            f.write(f"import site; site.addsitedir({d!r})\n")
EOF

# Install only the wheels whose distribution is not installed here (the image's or an earlier
# run's): nothing of the image is replaced or shadowed. One exception: setuptools older than
# 70.1 cannot build the editable install without the `wheel` package, so a newer one goes into
# the venv (the image's copy stays as it is).
mapfile -t status < <("$py" - "${all_wheels[@]}" <<'EOF'
import importlib.metadata as md, os, re, sys

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

installed = {}
for dist in md.distributions():  # in sys.path order: the first one found is the one imported
    name = dist.metadata["Name"]
    if name:
        installed.setdefault(norm(name), dist.version)

def release(version):
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])

for path in sys.argv[1:]:
    name = norm(os.path.basename(path).split("-")[0])
    version = installed.get(name)
    if version is not None and name == "setuptools" and release(version) < (70, 1):
        print(f"install\t{path}\t(shadows setuptools {version}: too old for the editable build)")
    elif version is not None:
        print(f"present\t{path}\t{version}")
    else:
        print(f"install\t{path}\t")
EOF
)
to_install=() installed_lines=()
for line in "${status[@]}"; do
    IFS=$'\t' read -r what path note <<<"$line"
    if [[ $what == present ]]; then
        echo "$me: already present ($note): ${path##*/}"
    else
        to_install+=("$path")
        installed_lines+=("$me: installed: ${path##*/}${note:+ $note}")
    fi
done
if ((${#to_install[@]})); then
    "$py" -m pip install --quiet --no-index --no-deps "${to_install[@]}"
    printf '%s\n' "${installed_lines[@]}"
    # Requirements the image's versions do not meet would show here (asr's own pins of torch
    # and wandb aside: the image's torch is the one to check, and wandb is not needed).
    "$py" -m pip check 2>&1 | grep -v '^asr ' | sed "s/^/$me: note: /" || true
fi

# This checkout, editable; again only when pyproject.toml changed or it is not installed.
stamp=$venv/.asr-installed-$(md5sum pyproject.toml | cut -c1-12)
if [[ -f $stamp ]] && "$py" -c 'import asr' 2>/dev/null; then
    echo "$me: asr already installed (editable, $root)"
else
    echo "$me: installing asr (editable, $root)"
    "$py" -m pip install --quiet --no-index --no-deps --no-build-isolation -e .
    rm -f "$venv"/.asr-installed-* && touch "$stamp"
fi

# The imports the GPU check needs; name the first missing module clearly.
"$py" - ${demo:+demo} <<'EOF' || die "imports failed (see above): the image lacks that package, or prepare_gpu_wheels.sh must add its wheel"
import importlib, sys, traceback

demo = sys.argv[1:] == ["demo"]  # the demo synthesizes its corpus with espeak-ng
for module in ("asr.training.train", "asr.training.oomptimizer", "asr.decoding.search",
               "lhotse", "hydra", "jiwer", *(["asr.demo.synth", "espeakng_loader"] if demo else [])):
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        print(f"gpu_check.sh: import {module}: missing module {e.name!r}", file=sys.stderr)
        sys.exit(1)
    except Exception:
        traceback.print_exc()
        print(f"gpu_check.sh: import {module} failed (error above)", file=sys.stderr)
        sys.exit(1)
EOF
echo "$me: environment ready in $((SECONDS - start)) s"

export VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH
if [[ -n $demo ]]; then
    args=("$@")
    for i in "${!args[@]}"; do [[ ${args[$i]} == -- ]] && { args+=(logger=csv); break; }; done
    [[ " ${args[*]} " == *" logger=csv "* ]] || args+=(-- logger=csv)
    exec bash recipes/demo/run.sh "${args[@]}"
fi
[[ -f scripts/$script ]] || die "scripts/$script not found in $root"
exec "$py" "scripts/$script" "$@"
